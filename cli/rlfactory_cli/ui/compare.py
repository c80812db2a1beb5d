"""Trajectories side by side (`rlf ui`): the members of one prompt's group, with their rewards and
advantages, and what every column shares (the prompt) said once.

A group is what GRPO compares: the trajectories of one prompt in one training step, their
advantages their rewards against the group's. The view reads them through
:class:`~rlfactory_cli.ui.runs_data.RunsData` (the same rules: names resolved inside the runs
directory, files that lead out of it refused), each whole but for its token arrays, of which
the token ids are kept (the page diffs two members token by token).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .runs_data import RunsData

__all__ = ["group", "shared_prefix"]


def shared_prefix(conversations: list[list[Any]]) -> int:
    """How many leading messages every conversation has alike (0 for fewer than two)."""
    if len(conversations) < 2:
        return 0
    count = 0
    for messages in zip(*conversations):
        if any(m != messages[0] for m in messages[1:]):
            break
        count += 1
    return count


def group(data: "RunsData", name: str, kind: str, step: int, number: int) -> dict[str, Any]:
    """Group ``number`` of ``kind`` at ``step``: its members in index order, each whole but for
    its token arrays (``token_ids`` kept, one list per sequence), the messages they share once
    (``shared_messages``, their number ``shared``; each member's ``messages`` start after
    them), and every group of the step (``groups``: for previous and next)."""
    listed = data.trajectories(name, kind, step=step, limit=1000, sort="group")
    groups = sorted({row["group"] for row in listed["rows"] if row.get("group") is not None and row["group"] >= 0})
    members = []
    for row in sorted((r for r in listed["rows"] if r.get("group") == number), key=lambda r: r["index"]):
        record = data.trajectory(name, kind, step, row["index"])
        record["token_ids"] = [list(s.get("token_ids") or []) for s in record.get("sequences") or []]
        record["sequences"] = []
        members.append(record)
    talks = [m for m in members if m.get("messages")]
    shared = shared_prefix([m["messages"] for m in talks])
    shared_messages = talks[0]["messages"][:shared] if talks else []
    for member in talks:
        member["messages"] = member["messages"][shared:]
    errors = dict(listed["errors"])
    if not members:
        errors[f"{kind} step {step}"] = f"no group {number} recorded at {kind} step {step} (groups: {groups or 'none'})"
    return {"kind": kind, "step": step, "group": number, "groups": groups, "members": members, "shared": shared,
            "shared_messages": shared_messages, "errors": errors,
            "title": f"{kind} step {step} · group {number} ({len(members)} members)"}
