"""The per-question-kind tables of bench/ (bench/nl2sql_kinds.py, bench/deepsearch_kinds.py), on
hand-written saved trajectories: the records in bench/README.md are made with them."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def saved(sample_id, correct, expected, calls):
    return {"sample_id": sample_id, "reward": float(correct),
            "rewards": {"sql_execution": float(correct), "sql_execution/execution_match": float(correct)},
            "expected": expected, "tool_calls": [{"name": name, "arguments": {}} for name in calls]}


def test_nl2sql_kinds_groups_by_the_gold_querys_shape(tmp_path):
    kinds = load("nl2sql_kinds")
    assert kinds.shape("SELECT area FROM countries WHERE name = 'Peru'") == "single table"
    assert kinds.shape("SELECT c.name FROM countries AS c JOIN capitals AS k ON k.country_code = c.code "
                       "WHERE k.name = 'Lima'") == "one join"
    assert kinds.shape("SELECT l.name FROM countries c JOIN country_languages cl ON cl.country_code = c.code "
                       "JOIN languages l ON l.code = cl.language_code") == "two joins"
    assert kinds.shape("SELECT COUNT(*) FROM countries c JOIN country_currencies x ON x.country_code = c.code") == \
        "aggregate"
    assert kinds.shape("SELECT region FROM countries GROUP BY region") == "aggregate"
    assert kinds.kind_of("nl2sql-count_neighbours-0123abcd") == "count_neighbours"
    rows = [saved("nl2sql-area-1", True, "SELECT area FROM countries", ["run_query"]),
            saved("nl2sql-area-2", False, "SELECT area FROM countries", []),
            saved("nl2sql-total_population-3", True, "SELECT SUM(population) FROM countries", ["run_query"])]
    lines = kinds.table(rows, lambda r: kinds.shape(r["expected"]))
    assert lines[2] == "| single table | 2 | 1/2 (0.50) | 0.50 |"
    assert lines[3] == "| aggregate | 1 | 1/1 (1.00) | 1.00 |"
    assert lines[-1] == "| **all** | 3 | **0.667** | |"
    path = tmp_path / "step-000000.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = subprocess.run([sys.executable, str(BENCH / "nl2sql_kinds.py"), str(path)], capture_output=True,
                         text=True, check=True).stdout
    assert "| total_population | 1 | 1/1 (1.00) | 1.00 |" in out


def test_deepsearch_kinds_counts_a_two_hop_answer_only_after_two_distinct_searches():
    kinds = load("deepsearch_kinds")
    samples = {"a": {"kind": "capital", "hops": 1}, "b": {"kind": "region_via_capital", "hops": 2},
               "c": {"kind": "region_via_capital", "hops": 2}}

    def row(sample_id, correct, queries):
        return {"sample_id": sample_id, "reward": float(correct), "rewards": {"exact_match": float(correct)},
                "tool_calls": [{"name": "search", "arguments": {"query": q}} for q in queries]}

    rows = [row("a", True, ["Peru capital"]), row("b", True, ["Lima capital", "Peru region"]),
            row("c", True, ["Lima capital", "lima capital "])]  # the same search twice is one
    lines, totals = kinds.kind_table(rows, samples)
    assert totals == {"exact_match": 1.0, "strict_exact_match": 2 / 3, "two_hop_strict": 0.5}
    assert "| region_via_capital | 2 | 2 | 2/2 | 1/2 | 1.50 |" in lines
