"""The `rlf ui` reading layer (cli/rlfactory_cli/ui/runs_data.py) over hand-made records: the
trajectory filters over every step against a plain Python filter, nulls included, a run made
before records mixed in, a step added while the page is open, the same sample across steps
without token arrays, the background prefetch, metrics with NaN. (Its speed on a run of 1,000
steps is bench/ui_records.py's.)"""

import json
import os

import pytest

from rlfactory_cli.ui.runs_data import RunsData
from rlfactory_core.records import RunRecords, SCALAR_COLUMNS, scalar_schema, write_records

STOPS = ["no_tool_call", "max_turns", None, "env_error"]
ERRORS = [[], ["timeout"], ["timeout", "parse_error"], []]
OUTCOMES = [("answered", "policy"), ("tool_timeout", "infrastructure"), (None, None), ("malformed_call", "policy"),
            ("env_error", "infrastructure")]


def row(step, index):
    return {"step": step, "kind": "eval", "index": index, "sample_id": f"q{index % 5}", "group": -1,
            "policy_version": step, "reward": None if index % 7 == 3 else (index % 4) / 3,
            "stop_reason": STOPS[index % 4], "tool_error_kinds": ERRORS[(index + step) % 4],
            "outcome": OUTCOMES[index % 5][0], "outcome_side": OUTCOMES[index % 5][1],
            "final_answer": f"a{index}", "messages": [{"role": "user", "content": f"question {index % 5}"}],
            "num_sequences": 2 if index % 3 == 0 else 1,
            "sequences": [{"token_ids": [1, 2, 3], "segment": [0, 1, 1], "loss_mask": [0, 1, 1]}]}


@pytest.fixture
def runs(tmp_path):
    run = tmp_path / "run"
    for step in (1, 2, 3):
        write_records(run, "eval", step, [row(step, i) for i in range(12)])
    (run / "samples").mkdir()  # step 0: text samples of a run made before records
    (run / "samples" / "step-000000.jsonl").write_text("".join(json.dumps(
        {"sample_id": f"q{i}", "reward": float(i % 2), "stop_reason": "no_tool_call", "turns": 1, "text": "t"}) + "\n"
        for i in range(3)))
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": NaN, "reward": 0.5}\n{"step": 2, "loss": 1.0}\n')
    return tmp_path


def reference(rows, min_reward=None, max_reward=None, stop_reason=None, tool_error=None, sample_id=None,
              outcome=None, sequences=None):
    def keep(r):
        reward = r["reward"]
        return ((min_reward is None or (reward is not None and reward >= min_reward))
                and (max_reward is None or (reward is not None and reward <= max_reward))
                and (not stop_reason or r["stop_reason"] == stop_reason)
                and (not tool_error or tool_error in (r["tool_error_kinds"] or ()))
                and (not sample_id or sample_id in str(r["sample_id"]))
                and (not outcome or outcome in (r["outcome"], r["outcome_side"]))
                and (sequences is None or r["num_sequences"] == sequences))
    return [r for r in rows if keep(r)]


@pytest.mark.parametrize("filters", [{}, {"min_reward": 0.5}, {"max_reward": 0.4},
                                     {"min_reward": 0.1, "max_reward": 0.7}, {"stop_reason": "max_turns"},
                                     {"tool_error": "timeout"},
                                     {"tool_error": "parse_error", "min_reward": 0.0}, {"sample_id": "q3"},
                                     {"sample_id": "nothing"}, {"stop_reason": "no_tool_call", "sample_id": "q"},
                                     {"outcome": "tool_timeout"}, {"outcome": "infrastructure"},
                                     {"outcome": "policy", "min_reward": 0.3}, {"sequences": 2},
                                     {"sequences": 1, "outcome": "policy"}])
def test_filters_over_every_step_keep_what_a_python_filter_keeps(runs, filters):
    records = RunRecords(runs / "run")
    every = [r for step in records.steps("eval") for r in records.list("eval", step)]
    expected = reference(every, **filters)
    listed = RunsData(runs).trajectories("run", "eval", limit=1000, **filters)
    assert listed["total"] == len(expected) and listed["errors"] == {}
    assert listed["rows"] == expected  # in step order, then row order; every scalar column
    assert set(listed["rows"][0] if expected else SCALAR_COLUMNS) == set(SCALAR_COLUMNS)
    assert listed["facets"] == {"stop_reasons": ["env_error", "max_turns", "no_tool_call"],
                                "tool_errors": ["parse_error", "timeout"],
                                "outcomes": ["answered", "env_error", "malformed_call", "tool_timeout",
                                             "infrastructure", "policy"],
                                "policy_versions": [0, 1, 2, 3], "sequence_counts": [1, 2]}
    page = RunsData(runs).trajectories("run", "eval", offset=5, limit=4, **filters)
    assert page["rows"] == expected[5:9] and page["total"] == len(expected)


def test_a_step_added_while_the_page_is_open_is_listed(runs):
    data = RunsData(runs)
    assert data.trajectories("run", "eval")["total"] == 3 + 36
    write_records(runs / "run", "eval", 4, [row(4, i) for i in range(5)])
    again = data.trajectories("run", "eval", limit=1000)
    assert again["total"] == 3 + 36 + 5 and again["steps"] == [0, 1, 2, 3, 4]
    assert [r["step"] for r in again["rows"][-5:]] == [4] * 5
    path = runs / "run" / "trajectories" / "eval" / "step-000002.parquet"
    write_records(runs / "run", "eval", 2, [row(2, i) for i in range(2)])  # rewritten (a resumed run)
    os.utime(path, ns=(1, 1))  # a new mtime even on a coarse clock
    assert data.trajectories("run", "eval")["total"] == 3 + 12 + 2 + 12 + 5


def test_a_damaged_step_is_that_steps_error(runs):
    (runs / "run" / "trajectories" / "eval" / "step-000002.parquet").write_bytes(b"PAR1 torn")
    listed = RunsData(runs).trajectories("run", "eval")
    assert listed["total"] == 3 + 24 and "not a readable trajectory record" in listed["errors"]["eval step 2"]
    (runs / "run" / "samples" / "step-000000.jsonl").write_text('{"sample_id": "q", "reward": "high"}\n')
    listed = RunsData(runs).trajectories("run", "eval")
    assert listed["total"] == 24 and "wrong type" in listed["errors"]["eval step 0"]


def test_scalars_have_one_schema_for_records_and_text_samples(runs):
    records = RunRecords(runs / "run")
    assert records.scalars("eval", 1).schema == scalar_schema() == records.scalars("eval", 0).schema
    assert records.scalars("eval", 1).to_pylist() == records.list("eval", 1)


def test_same_sample_across_steps_without_token_arrays(runs):
    same = RunsData(runs).same_sample("run", "eval", "q2")
    steps = [(t["step"], t["index"]) for t in same["trajectories"]]
    assert steps == [(0, 2)] + [(step, i) for step in (1, 2, 3) for i in (2, 7)]
    opened = same["trajectories"][1]
    assert opened["sequences"] == [] and not opened["text_only"]
    assert (opened["kind"], opened["phase"]) == ("eval", "step 1")
    # the question every column shares comes once, before them
    assert same["shared_messages"][0]["content"] == "question 2"
    whole = RunRecords(runs / "run").trajectory("eval", 1, 2)
    assert whole["sequences"][0]["token_ids"] == [1, 2, 3]
    assert whole["messages"] == same["shared_messages"] + opened["messages"]
    assert {k: v for k, v in whole.items() if k not in ("sequences", "messages")} == \
        {k: v for k, v in opened.items() if k not in ("sequences", "messages", "phase")}


def test_a_trajectory_is_found_by_its_index_whatever_its_row(tmp_path):
    write_records(tmp_path, "eval", 1, [row(1, i) for i in (4, 0, 9)])  # indices that are not rows
    records = RunRecords(tmp_path)
    assert records.trajectory("eval", 1, 9)["final_answer"] == "a9"
    assert records.trajectory("eval", 1, 0, tokens=False)["final_answer"] == "a0"
    with pytest.raises(Exception, match="no trajectory 1 .it has 3"):
        records.trajectory("eval", 1, 1)


def test_the_prefetch_reads_every_steps_list_before_it_is_asked_for(runs, monkeypatch):
    data = RunsData(runs)
    data.prefetch("run").result()
    write_records(runs / "run", "eval", 4, [row(4, i) for i in range(5)])  # a step more: read by the next one
    data.prefetch("run").result()

    def unread(*_):
        raise AssertionError("read again")

    monkeypatch.setattr(RunRecords, "scalars", unread)
    assert data.trajectories("run", "eval")["total"] == 3 + 36 + 5  # from the cache
    calls = []
    monkeypatch.setattr(data, "trajectories", lambda *args, **kwargs: calls.append(args))
    data.prefetch("run").result()
    assert calls == []  # the same steps as last time: nothing read again
    assert data.prefetch("run", data.run("run")["recorded"]).done()  # nor even listed


def test_metrics_encode_nan_as_null_and_the_json_equals_the_dict(runs):
    data = RunsData(runs)
    metrics = data.metrics("run")
    assert metrics["series"]["loss"] == [[1, None], [2, 1.0]] and metrics["series"]["reward"] == [[1, 0.5]]
    assert json.loads(data.metrics_json("run")) == metrics
    (runs / "run" / "metrics.jsonl").write_text('{"step": 1}\n[2]\n{"step": 3}\n')
    broken = json.loads(data.metrics_json("run"))
    # the damaged line named and skipped, the rest of the run still plotted
    assert broken["series"] == {} and broken["errors"]["metrics.jsonl"] == "line(s) 2 not JSON objects: skipped"
    (runs / "run" / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\nnot json\n{"step": 3, "loss": 1.0}\n')
    assert json.loads(data.metrics_json("run"))["series"]["loss"] == [[1, 2.0], [3, 1.0]]


def test_a_trajectory_is_sent_as_json_with_nan_and_infinities_as_null(tmp_path):
    record = row(1, 0)
    record["reward"] = float("nan")
    record["sequences"][0]["advantage"] = [None, float("inf"), -0.5]
    write_records(tmp_path / "run", "eval", 1, [record])
    sent = json.loads(RunsData(tmp_path).trajectory_json("run", "eval", 1, 0))
    assert sent["reward"] is None and sent["sequences"][0]["advantage"] == [None, None, -0.5]
    assert sent["sequences"][0]["token_ids"] == [1, 2, 3] and sent["messages"][0]["content"] == "question 0"
