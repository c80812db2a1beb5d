"""`rlf ui`: the local web UI (the app, its security layer, the new-run form, the launcher)."""
