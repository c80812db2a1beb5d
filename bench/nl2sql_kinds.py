"""Per-question-kind execution accuracy of an nl2sql evaluation.

Reads the trajectories an evaluation saved (``eval.save_samples`` at least the number of
questions evaluated, e.g. ``RUN_DIR/samples/step-000010.jsonl`` of a run, or
``REPORT_DIR/samples/step-000000.jsonl`` of ``rlf eval --report``) and prints execution
accuracy and ``run_query`` use by the shape of the gold query (parsed with sqlglot): an
aggregate (COUNT, SUM, AVG, MIN, MAX or GROUP BY), else single table, one join or two joins;
then by the dataset's own kinds.

    .venv/bin/python bench/nl2sql_kinds.py RUN_DIR/samples/step-000010.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import sqlglot
from sqlglot import expressions as exp

SHAPES = ("single table", "one join", "two joins", "aggregate")


def shape(sql: str) -> str:
    """The shape of a gold query: ``aggregate`` when it aggregates, else by its joins."""
    tree = sqlglot.parse_one(sql, read="sqlite")
    if tree.find(exp.AggFunc) is not None or tree.find(exp.Group) is not None:
        return "aggregate"
    joins = len(list(tree.find_all(exp.Join)))
    return SHAPES[min(joins, 2)]


def kind_of(sample_id: str) -> str:
    """The dataset's kind, from the built-in sample id ``nl2sql-<kind>-<hash>``."""
    parts = sample_id.split("-")
    return "-".join(parts[1:-1]) if len(parts) >= 3 else "?"


def table(rows: list[dict], key) -> list[str]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        groups[key(row)].append(row)
    lines = ["| kind | questions | execution accuracy | run_query before answering |", "|---|---|---|---|"]
    for name in sorted(groups, key=lambda n: (SHAPES.index(n) if n in SHAPES else len(SHAPES), n)):
        members = groups[name]
        right = sum(bool(r["rewards"].get("sql_execution/execution_match", r["reward"])) for r in members)
        queried = sum(any(c["name"] == "run_query" for c in r["tool_calls"]) for r in members)
        lines.append(f"| {name} | {len(members)} | {right}/{len(members)} ({right / len(members):.2f}) | "
                     f"{queried / len(members):.2f} |")
    right = sum(bool(r["rewards"].get("sql_execution/execution_match", r["reward"])) for r in rows)
    lines.append(f"| **all** | {len(rows)} | **{right / len(rows):.3f}** | |")
    return lines


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples_file", type=Path)
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in args.samples_file.read_text().splitlines() if line.strip()]
    if not rows:
        sys.exit(f"{args.samples_file}: no saved trajectories")
    print("\n".join(table(rows, lambda r: shape(r["expected"]))))
    print()
    print("\n".join(table(rows, lambda r: kind_of(r["sample_id"]))))


if __name__ == "__main__":
    main(sys.argv[1:])
