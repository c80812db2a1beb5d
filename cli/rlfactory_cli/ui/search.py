"""Full-text search over a run's recorded trajectories (`rlf ui`): the messages (the model's
turns, the prompts, the observations), the tool calls' arguments and results, and the final
answers, case-insensitive, every step of every kind (or one kind).

Each step's file is read for those columns only, and matched with Arrow's compute functions
(no row is turned into Python unless it matches), so a search over a run of 100,000
trajectories reads the text once and is done (bench/ui_records.py). A hit says where the text
is (the kind, step and trajectory, and the message or tool call) and carries the matched text
with some context on either side, as text: the page marks it without parsing it as HTML.
Text-only records of runs made before token records are not searched (said in ``errors``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .runs_data import RunsData

__all__ = ["search", "CONTEXT", "MAX_HITS"]

#: Characters shown on either side of a match.
CONTEXT = 80
#: Hits returned at most (``total`` counts them all).
MAX_HITS = 200
_COLUMNS = ["index", "sample_id", "policy_version", "outcome", "outcome_side", "sequence_turns", "messages", "tool_calls",
            "final_answer"]


def search(data: RunsData, name: str, query: str, kind: str | None = None,
           limit: int = MAX_HITS, outcome: str | None = None) -> dict[str, Any]:
    """``query``'s occurrences in ``name``'s recorded trajectories (``kind``: one kind only;
    ``outcome``: trajectories of that outcome class, or of every class on that side, as the
    trajectory list filters them).

    Returns ``{"query", "total": matches, "hits": [hit], "truncated": bool, "errors"}``; a hit
    is ``{"kind", "step", "index", "sample_id", "policy_version", "outcome", "outcome_side", "where",
    "before", "match", "after"}`` (the outcome None in records that predate it) with
    ``where`` like ``message 3 (tool)``, ``tool call 0 (search) result`` or ``final answer``, and, in a
    trajectory of several token sequences, ``sequence`` (1, 2, ...: the one the hit's turn is in;
    none for the prompt's messages) and ``num_sequences``."""
    query = query.strip()
    errors: dict[str, str] = {}
    if not query:
        return {"query": query, "total": 0, "hits": [], "truncated": False, "errors": errors}
    files = data.recorded_files(name, errors)
    hits: list[dict[str, Any]] = []
    total = 0
    for each, steps in files.items():
        if kind is not None and each != kind:
            continue
        for step, path in steps.items():
            if path.suffix != ".parquet":
                errors[f"{each} step {step}"] = "recorded before token records (text only): not searched"
                continue
            try:
                found = _search_file(path, query, outcome or None)
            except Exception as exc:  # noqa: BLE001 - a damaged file is that step's error
                errors[f"{each} step {step}"] = f"{type(exc).__name__}: {exc}"[:300]
                continue
            total += len(found)
            hits += [{"kind": each, "step": step, **hit} for hit in found[:max(0, limit - len(hits))]]
    return {"query": query, "total": total, "hits": hits, "truncated": total > len(hits), "errors": errors}


def _search_file(path: Path, query: str, outcome: str | None = None) -> list[dict[str, Any]]:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    file = pq.ParquetFile(path)
    table = file.read(columns=[c for c in _COLUMNS if c in file.schema_arrow.names])  # version 3: no sequence_turns
    index, sample, version = (table[c].to_pylist() for c in ("index", "sample_id", "policy_version"))
    starts = table["sequence_turns"].to_pylist() if "sequence_turns" in table.column_names else [None] * len(index)
    classes, sides = (table[c].to_pylist() if c in table.column_names else [None] * len(index)
                      for c in ("outcome", "outcome_side"))
    found: list[tuple[int, tuple[int, ...], str, str, int | None]] = []  # (row, order in the row, where, text, turn)
    for rank, (column, fields) in enumerate((("messages", ("content",)), ("tool_calls", ("arguments", "result")))):
        lists = table[column]
        flat = pc.list_flatten(lists)
        if len(flat) == 0:
            continue
        parents = pc.list_parent_indices(lists).to_pylist()
        offsets, previous = [], None  # the position of each flattened item within its row's list
        for parent in parents:
            offsets.append(offsets[-1] + 1 if parent == previous else 0)
            previous = parent
        for field in fields:
            values = pc.struct_field(flat, field)
            matched = pc.indices_nonzero(pc.fill_null(pc.match_substring(values, query, ignore_case=True), False))
            for position in matched.to_pylist():
                item = flat[position].as_py()
                number = offsets[position]
                where = (f"message {number} ({item.get('role')})" if column == "messages"
                         else f"tool call {number} ({item.get('name')}) {field}")
                found.append((parents[position], (rank, number, fields.index(field)), where, item[field],
                              item.get("turn")))
    answers = pc.indices_nonzero(pc.fill_null(pc.match_substring(table["final_answer"], query, ignore_case=True),
                                              False))
    for row in answers.to_pylist():
        found.append((row, (2,), "final answer", table["final_answer"][row].as_py(), 1 << 14))
    found.sort(key=lambda hit: (hit[0], hit[1]))
    return [{"index": index[row], "sample_id": sample[row], "policy_version": version[row], "outcome": classes[row],
             "outcome_side": sides[row], "where": where, **_sequence_of(starts[row], turn), **_snippet(text, query)}
            for row, _, where, text, turn in found if outcome is None or outcome in (classes[row], sides[row])]


def _sequence_of(starts: list[int] | None, turn: int | None) -> dict[str, int]:
    """``{"sequence": k, "num_sequences": n}`` for a hit at model turn ``turn`` of a trajectory whose
    ``n > 1`` sequences start at the turns ``starts``; empty for one sequence or the prompt."""
    if not starts or len(starts) < 2 or turn is None or turn < 0:
        return {}
    return {"sequence": sum(start <= turn for start in starts), "num_sequences": len(starts)}


def _snippet(text: str, query: str) -> dict[str, str]:
    at = text.casefold().find(query.casefold())
    if at < 0:  # casefold changed a length (ß -> ss): show the start
        at = 0
    end = at + len(query)
    return {"before": ("…" if at > CONTEXT else "") + text[max(0, at - CONTEXT):at], "match": text[at:end],
            "after": text[end:end + CONTEXT] + ("…" if len(text) > end + CONTEXT else "")}
