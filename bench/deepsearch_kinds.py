"""Per-question-kind exact match of a deepsearch evaluation, with the two-hop rule.

Reads the trajectories an evaluation saved (``eval.save_samples`` at least the split's size,
e.g. ``RUN_DIR/samples/step-000020.jsonl`` of a run, or ``REPORT_DIR/samples/step-000000.jsonl``
of ``rlf eval --report``) and the built countryinfo split they came from, and prints, per
question kind: questions, exact match, searches per question, and for two-hop kinds the
*strict* exact match, which counts a correct answer only when at least two distinct searches
preceded it (a two-hop question answered after one search was a guess or came from memory).

    .venv/bin/python bench/deepsearch_kinds.py RUN_DIR/samples/step-000020.jsonl [--split test]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from rlfactory_deepsearch.data import load_split


def distinct_searches(row: dict) -> int:
    return len({str(call["arguments"].get("query", "")).strip().lower() for call in row["tool_calls"]
                if call["name"] == "search"})


def kind_table(rows: list[dict], samples: dict[str, dict]) -> tuple[list[str], dict[str, float]]:
    """Markdown lines of the per-kind table, and the totals (``exact_match``,
    ``strict_exact_match``, ``two_hop_strict``)."""
    by_kind: dict[str, list[tuple[bool, int, int]]] = defaultdict(list)
    for row in rows:
        sample = samples[row["sample_id"]]
        correct = bool(row["rewards"].get("exact_match", row["reward"]))
        by_kind[sample["kind"]].append((correct, distinct_searches(row), int(sample.get("hops", 1))))
    lines = ["| kind | hops | questions | exact match | strict (2-hop: >= 2 distinct searches) | searches / question |",
             "|---|---|---|---|---|---|"]
    total = strict_total = two_hop = two_hop_strict = 0
    for kind, marks in sorted(by_kind.items(), key=lambda item: (item[1][0][2], item[0])):
        hops = marks[0][2]
        right = sum(c for c, _, _ in marks)
        strict = sum(c and (hops < 2 or searches >= 2) for c, searches, _ in marks)
        searches = sum(s for _, s, _ in marks) / len(marks)
        total, strict_total = total + right, strict_total + strict
        if hops >= 2:
            two_hop, two_hop_strict = two_hop + len(marks), two_hop_strict + strict
        lines.append(f"| {kind} | {hops} | {len(marks)} | {right}/{len(marks)} | {strict}/{len(marks)} | "
                     f"{searches:.2f} |")
    n = len(rows)
    lines.append(f"| **all** | | {n} | **{total / n:.3f}** | **{strict_total / n:.3f}** | |")
    return lines, {"exact_match": total / n, "strict_exact_match": strict_total / n,
                   "two_hop_strict": two_hop_strict / two_hop if two_hop else 0.0}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples_file", type=Path)
    parser.add_argument("--split", default="test")
    args = parser.parse_args(argv)
    samples = {sample["id"]: sample for sample in load_split(args.split)}
    rows = [json.loads(line) for line in args.samples_file.read_text().splitlines() if line.strip()]
    missing = [row["sample_id"] for row in rows if row["sample_id"] not in samples]
    if missing:
        sys.exit(f"{len(missing)} saved trajectories are not questions of the {args.split!r} split "
                 f"(e.g. {missing[0]}); pass --split")
    if len(rows) < len(samples):
        print(f"note: {len(rows)} of the split's {len(samples)} questions were saved (eval.save_samples)")
    lines, totals = kind_table(rows, samples)
    print("\n".join(lines))
    print(f"\ntwo-hop questions answered after >= 2 distinct searches: {totals['two_hop_strict']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
