"""Training algorithms as pure functions (advantages, losses)."""
