"""Recorded trajectories (rlfactory_core.records): the update's logprobs of recorded rows,
the Parquet round trip with a real tokenizer, runs made before records, damaged files."""

import json
import math

import pyarrow.parquet as pq
import pytest
import torch

from rlfactory_core.config import load_config
from rlfactory_core.records import (MODEL, OBSERVATION, PROMPT, SCALAR_COLUMNS, SCHEMA_VERSION, RecordError,
                                    RunRecords, trajectory_records, write_records)
from rlfactory_core.rewards import ScoredBatch
from rlfactory_core.training.batch import build_batch
from rlfactory_core.training.update import batch_logprobs, update_policy
from rlfactory_core.types import Message, Segment, ToolCall, ToolResult, Trajectory

from test_trainer import _batch_for, tiny_model


@pytest.mark.parametrize("extra", [[], ["grpo.epochs=2", "grpo.mini_batches=2"]], ids=["on-policy", "off-policy"])
def test_the_update_leaves_the_recorded_rows_logprobs_from_before_it(extra):
    config = load_config([], ["grpo.group_size=2", "train.bf16=false", "train.lr=0.05", *extra])
    model = tiny_model()
    batch = _batch_for(model, config)
    before = batch_logprobs(model, batch, [0, 1, 2, 3], config, packed=False)
    batch["recorded"] = torch.tensor([True, True, False, False])
    update_policy(model, None, torch.optim.AdamW(model.parameters(), lr=0.05), batch, config)
    mask = batch["loss_mask"].bool()
    kept = batch["trainer_logprobs"]
    assert torch.allclose(kept[:2][mask[:2]], before[:2][mask[:2]], atol=1e-5)
    assert not kept[2:].any()  # rows not recorded: nothing kept
    after = batch_logprobs(model, batch, [0, 1], config, packed=False)
    assert not torch.allclose(after[:2][mask[:2]], before[:2][mask[:2]], atol=1e-4)  # it did update


def _trajectory(group, tokenizer):
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    t = Trajectory(sample_id=f"q{group}", prompt_ids=ids("What is 2+3?"), group=group)
    call = ToolCall(name="calc", arguments={"expr": "2+3"}, id="c1")
    t.messages = [Message("user", "What is 2+3?"), Message("assistant", "", tool_calls=[call]),
                  Message("tool", "5", name="calc", tool_call_id="c1"), Message("assistant", "5 é")]
    first, second = ids('calc("2+3")'), ids("5 é")
    # the second turn was sampled after a weight update: version 3, the first 2
    t.segments = [Segment("model", first, [-0.1] * len(first), policy_version=2),
                  Segment("observation", ids("result: 5")),
                  Segment("model", second, [-0.2] * len(second), policy_version=3)]
    t.tool_calls = [call]
    t.tool_results = [ToolResult("calc", "5", call_id="c1", error="timeout", latency_s=0.25)]
    t.turn_rewards, t.final_answer, t.stop_reason = [0.0, 0.5], "5 é", "no_tool_call"
    t.metadata = {"tool_errors": {"timeout": 1}}
    return t


def test_a_step_round_trips_token_by_token_with_a_real_tokenizer(tmp_path, default_model_dir):
    from rlfactory_core.models import load_tokenizer

    tokenizer = load_tokenizer(default_model_dir)
    trajectories = [_trajectory(g, tokenizer) for g in (0, 0, 1, 1)]
    config = load_config([], ["grpo.group_size=2"])
    batch = build_batch(trajectories, [1.0, 0.0, 0.5, 0.5], config, pad_id=0)
    scored = ScoredBatch(totals=[1.0, 0.0, 0.5, 0.5], components=[{"exact_match": 1.0}] * 4,
                         correct=[True, False, None, None], errors={}, applied={},
                         reward_errors=[[], ["judge: timed out"], [], []],
                         outcomes=["answered", "reward_error", None, None])
    fake_trainer = torch.full(batch["loss_mask"].shape, -0.3)
    records = trajectory_records(trajectories, step=3, kind="train", scored=scored, tokenizer=tokenizer,
                                 row_samples=[{"answer": "5"}] * 4, rows=[0, 1],
                                 advantages=batch["sequence_advantages"], token_advantages=batch["advantages"],
                                 trainer_logprobs=fake_trainer)
    path = write_records(tmp_path, "train", 3, records)
    assert path == tmp_path / "trajectories" / "train" / "step-000003.parquet"
    assert pq.ParquetFile(path).schema_arrow.metadata[b"rlfactory.schema_version"] == str(SCHEMA_VERSION).encode()
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temporary left

    run = RunRecords(tmp_path)
    assert run.kinds() == ["train"] and run.steps("train") == [3]
    listed = run.list("train", 3)
    assert [r["index"] for r in listed] == [0, 1] and set(listed[0]) == set(SCALAR_COLUMNS)
    assert [r["reward"] for r in listed] == [1.0, 0.0] and listed[0]["correct"] is True
    assert listed[0]["tool_error_kinds"] == ["timeout"] and listed[1]["advantage"] < 0 < listed[0]["advantage"]
    assert [(r["outcome"], r["outcome_side"]) for r in listed] == [("answered", "policy"),
                                                                    ("reward_error", "infrastructure")]

    record = run.trajectory("train", 3, 1)
    sequence, t = record["sequences"][0], trajectories[1]
    all_ids = t.prompt_ids + [i for s in t.segments for i in s.token_ids]
    assert sequence["token_ids"] == all_ids  # token-exact
    assert "".join(sequence["pieces"]) == tokenizer.decode(all_ids)  # every piece decoded, in order
    n_prompt, n_first, n_obs = len(t.prompt_ids), len(t.segments[0].token_ids), len(t.segments[1].token_ids)
    assert sequence["segment"] == ([PROMPT] * n_prompt + [MODEL] * n_first + [OBSERVATION] * n_obs
                                   + [MODEL] * len(t.segments[2].token_ids))
    assert sequence["loss_mask"] == [int(s == MODEL) for s in sequence["segment"]]
    assert sequence["loss_mask"] == batch["loss_mask"][1][:len(all_ids)].tolist()
    assert sequence["turn"][:n_prompt] == [-1] * n_prompt and sequence["turn"][-1] == 1
    model_at = [i for i, s in enumerate(sequence["segment"]) if s == MODEL]
    assert all(sequence["sampler_logprob"][i] == pytest.approx(-0.1 if i < n_prompt + n_first else -0.2)
               for i in model_at)
    assert all(sequence["trainer_logprob"][i] == pytest.approx(-0.3) for i in model_at)
    assert sequence["advantage"][model_at[0]] == pytest.approx(float(batch["advantages"][1][model_at[0]]))
    assert sequence["sampler_logprob"][0] is None and sequence["trainer_logprob"][0] is None
    assert [sequence["policy_version"][i] for i in model_at] == [2] * n_first + [3] * len(t.segments[2].token_ids)
    assert sequence["policy_version"][0] == -1 and set(sequence["policy_version"][n_prompt + n_first:][:n_obs]) == {-1}
    assert record["policy_version"] == 2  # the trajectory's oldest
    assert record["reward_errors"] == ["judge: timed out"] and json.loads(record["expected"]) == "5"
    assert record["tool_calls"] == [{"name": "calc", "arguments": '{"expr": "2+3"}', "id": "c1", "turn": 0,
                                     "result": "5", "error": "timeout", "infrastructure": None, "latency_s": 0.25}]
    assert [m["role"] for m in record["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert [m["turn"] for m in record["messages"]] == [-1, 0, 0, 1]  # the prompt's, then each turn's
    assert json.loads(record["messages"][1]["tool_calls"])[0]["arguments"] == {"expr": "2+3"}
    assert record["rewards"] == {"exact_match": 1.0}
    assert record["turn_rewards"] == [0.0, 0.5] and record["group"] == 0 and not record["text_only"]

    # a version 1 file (before outcomes: outcome "ok"/"error", no outcome_side, calls without
    # their infrastructure mark) still reads, the new columns null
    import pyarrow as pa

    from rlfactory_core import records as records_module

    now = records_module._schema()
    call_v1 = pa.struct([f for f in now.field("tool_calls").type.value_type if f.name != "infrastructure"])
    added = {"outcome_side", "num_sequences", "sequence_turns"}  # versions 2 and 4 added them
    v1 = pa.schema([pa.field("tool_calls", pa.list_(call_v1)) if f.name == "tool_calls" else f
                    for f in now if f.name not in added], metadata={"rlfactory.schema_version": "1"})
    rows = [{**{k: v for k, v in r.items() if k not in added}, "outcome": "ok",
             "tool_calls": [{k: v for k, v in c.items() if k != "infrastructure"} for c in r["tool_calls"]]}
            for r in records]
    pq.write_table(pa.Table.from_pylist(rows, schema=v1), path.with_name("step-000004.parquet"))
    old = run.list("train", 4)
    assert [(r["outcome"], r["outcome_side"]) for r in old] == [("ok", None), ("ok", None)]
    assert run.scalars("train", 4).column("outcome_side").null_count == 2
    assert [r["num_sequences"] for r in old] == [None, None] and [r["num_sequences"] for r in listed] == [1, 1]
    whole = run.trajectory("train", 4, 1)
    assert whole["outcome_side"] is None and whole["tool_calls"][0]["infrastructure"] is None
    assert whole["sequences"][0]["token_ids"] == all_ids
    with pytest.raises(RecordError, match="no trajectory 7"):
        run.trajectory("train", 3, 7)
    with pytest.raises(RecordError, match="no eval trajectories recorded at step 3"):
        run.list("eval", 3)


def test_a_run_made_before_records_opens_its_text_samples(tmp_path):
    samples = tmp_path / "samples"
    (samples / "cold_start").mkdir(parents=True)
    line = {"sample_id": "q1", "reward": 1.0, "rewards": {"exact_match": 1.0}, "reward_errors": [],
            "final_answer": "5", "expected": "5", "stop_reason": "no_tool_call", "turns": 2,
            "tool_calls": [{"name": "calc", "arguments": {"expr": "2+3"}}], "text": "<|im_start|>user ..."}
    (samples / "step-000000.jsonl").write_text(json.dumps(line) + "\n" + json.dumps({**line, "sample_id": "q2"})
                                               + "\n{\"torn")  # killed while writing its last line
    (samples / "cold_start" / "step-000000.jsonl").write_text(json.dumps(line) + "\n")
    run = RunRecords(tmp_path)
    assert run.kinds() == ["eval", "cold_start_eval"] and run.steps("eval") == [0]
    assert [r["sample_id"] for r in run.list("eval", 0)] == ["q1", "q2"]
    record = run.trajectory("eval", 0, 1)
    assert record["text_only"] and record["text"].startswith("<|im_start|>") and record["sequences"] == []
    assert record["tool_calls"][0]["name"] == "calc"


def test_damaged_files_are_an_error_for_that_file_only(tmp_path):
    bad = tmp_path / "trajectories" / "eval"
    bad.mkdir(parents=True)
    (bad / "step-000001.parquet").write_bytes(b"PAR1 torn by a kill")
    (bad / "step-000002.parquet").write_bytes(b"")
    (bad / "notes.txt").write_text("ignored")
    (tmp_path / "samples").mkdir()
    (tmp_path / "samples" / "step-000003.jsonl").write_text("[1]\n{}\n")
    import pyarrow as pa

    pq.write_table(pa.table({"step": [1]}), bad / "step-000004.parquet")  # not ours: no schema version
    run = RunRecords(tmp_path)
    assert run.steps("eval") == [1, 2, 3, 4]
    for step, message in ((1, "not a readable trajectory record"), (2, "not a readable trajectory record"),
                          (3, "step-000003.jsonl:1: not a JSON object"), (4, "schema version \\?")):
        with pytest.raises(RecordError, match=message):
            run.list("eval", step)
    assert RunRecords(tmp_path / "missing").kinds() == []


def test_each_sampled_token_has_its_staleness_and_the_sampler_gap_is_split_by_it(default_model_dir):
    """The batch carries each model token's age in versions (its segment's policy_version
    against the trainer's); the update measures the sampler gap apart for fresh and stale
    tokens, so an asynchronous schedule's drift does not read as a numerics mismatch."""
    from rlfactory_core.models import load_tokenizer

    tokenizer = load_tokenizer(default_model_dir)
    trajectories = [_trajectory(g, tokenizer) for g in (0, 0, 1, 1)]
    config = load_config([], ["grpo.group_size=2", "train.bf16=false"])
    batch = build_batch(trajectories, [1.0, 0.0, 0.5, 0.5], config, pad_id=0, policy_version=3)
    mask = batch["loss_mask"].bool()
    first = len(trajectories[0].segments[0].token_ids)
    start = len(trajectories[0].prompt_ids)
    staleness = batch["staleness"][0]
    assert staleness[start:start + first].tolist() == [1] * first  # sampled by version 2, trained at 3
    assert not staleness[~mask[0]].any() and not staleness[start + first:].any()  # the second turn: fresh
    assert "staleness" not in build_batch(trajectories, [1.0, 0.0, 0.5, 0.5], config, pad_id=0).keys()

    model = tiny_model()
    batch = _batch_for(model, config)
    batch["staleness"] = torch.zeros_like(batch["loss_mask"])
    fresh = update_policy(model, None, torch.optim.SGD(model.parameters(), lr=0.0), batch, config)
    assert fresh["train/stale_token_fraction"] == 0 and "train/stale_sampler_kl" not in fresh
    batch["staleness"][:2] = batch["loss_mask"][:2]  # the first two rows sampled one version ago
    split = update_policy(model, None, torch.optim.SGD(model.parameters(), lr=0.0), batch, config)
    rows = batch["loss_mask"].sum(-1).float()
    assert abs(split["train/stale_token_fraction"] - float(rows[:2].sum() / rows.sum())) < 1e-6
    assert split["train/stale_sampler_kl"] >= 0 and split["train/sampler_kl"] >= 0
    # by hand: a token the sampler drew at 0.9 that the trainer gives 0.1, k3 = r - 1 - log r with
    # r = trainer / sampler (the tokens are the sampler's draws): 1/9 - 1 + log 9 = 1.3083, not 9 - 1 - log 9
    from rlfactory_core.training.update import _record_sampler_gap

    recorded = {}
    _record_sampler_gap(lambda key, value, weight: recorded.__setitem__(key, float(value)),
                        torch.log(torch.tensor([[0.1, 0.5]])), torch.log(torch.tensor([[0.9, 0.5]])),
                        torch.tensor([[1.0, 0.0]]), None)
    assert abs(recorded["train/sampler_kl"] - (1 / 9 - 1 + math.log(9))) < 1e-5
    assert abs(recorded["train/sampler_logprob_diff"] - math.log(9)) < 1e-5
    # the fresh and stale parts weigh in by their tokens: together they are the whole
    share = split["train/stale_token_fraction"]
    for gap in ("kl", "logprob_diff"):
        whole = (1 - share) * split[f"train/sampler_{gap}"] + share * split[f"train/stale_sampler_{gap}"]
        assert abs(whole - fresh[f"train/sampler_{gap}"]) < 1e-5
