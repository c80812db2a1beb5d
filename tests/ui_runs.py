"""A runs directory for the UI tests: a real short training run (tiny model) next to a run
made before token records, a damaged run, and a run killed with -9 (a stale heartbeat); and a
run whose trajectories are of one or two token sequences."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rlfactory_core.config import load_config
from rlfactory_core.testing import train

#: A real run's mechanics in seconds (tests/test_trainer.py's small run).
SMALL_RUN = ["backend=hf", "grpo.prompts_per_step=2", "grpo.group_size=2", "data.eval_size=4", "eval.every=1",
             "eval.save_samples=2", "checkpoint.every=1", "rollout.max_turns=2", "rollout.max_tokens_per_turn=40",
             "rollout.sampling.temperature=0.7", "logging.live=off", "logging.tensorboard=false"]


def make_runs(root: Path, tiny_model_dir: Path) -> Path:
    runs = root / "runs"
    runs.mkdir()
    train(load_config([], [*SMALL_RUN, f"model.name={tiny_model_dir}", "train.steps=2", f"run_dir={runs / 'tiny'}"]))

    old = runs / "old"  # before records and status.json: text samples only
    (old / "samples").mkdir(parents=True)
    (old / "config.yaml").write_text("env: arithmetic\nmodel: {name: smollm2-135m}\ntrain: {steps: 1, seed: 0}\n")
    (old / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/reward/accuracy": 0.25}) + "\n"
                                       + json.dumps({"step": 1, "reward/mean": 0.5, "eval/reward/accuracy": 0.5}) + "\n")
    sample = {"sample_id": "q7", "reward": 1.0, "rewards": {"exact_match": 1.0}, "final_answer": "12",
              "expected": "12", "stop_reason": "no_tool_call", "turns": 1, "tool_calls": [],
              "text": "<|im_start|>user\nWhat is 3*4?<|im_end|>"}
    for step in (0, 1):
        (old / "samples" / f"step-{step:06d}.jsonl").write_text(json.dumps(sample) + "\n")

    broken = runs / "broken"  # torn and malformed files: errors for those parts, not a crash
    (broken / "trajectories" / "eval").mkdir(parents=True)
    (broken / "config.yaml").write_text("env: [unclosed\n")
    (broken / "metrics.jsonl").write_text('{"step": 0}\nnot json\n{"step": 1}\n')
    (broken / "trajectories" / "eval" / "step-000001.parquet").write_bytes(b"PAR1 torn")
    (broken / "status.json").write_text('{"state": "runn')

    killed = runs / "killed"  # SIGKILL: its status still says running, its heartbeat went stale
    killed.mkdir()
    (killed / "config.yaml").write_text("env: arithmetic\ntrain: {steps: 5}\n")
    (killed / "status.json").write_text(json.dumps({
        "version": 1, "state": "running", "pid": 2 ** 22 + 17, "host": "elsewhere", "started_at": time.time() - 900,
        "updated_at": time.time() - 600, "step": 3, "steps": 5, "message": ""}))
    return runs


def write_two_sequence_run(run_dir: Path, tokenizer_dir: Path) -> Path:
    """An eval step of three trajectories recorded through the real records code: q0 and q2 of
    one token sequence, q1 of two (a follow-up question after its first answer started a new
    sequence, as gpt-oss's format does; its second answer is "a zebra")."""
    from rlfactory_core.models import load_tokenizer
    from rlfactory_core.records import trajectory_records, write_records
    from rlfactory_core.rewards import ScoredBatch
    from rlfactory_core.types import Message, Segment, TokenSequence, Trajectory

    tokenizer = load_tokenizer(tokenizer_dir)
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731

    def episode(number: int, follow_up: bool) -> Trajectory:
        t = Trajectory(sample_id=f"q{number}", prompt_ids=ids("Question?"), group=0, stop_reason="no_tool_call")
        first = Segment("model", ids("first answer"), [-0.1] * len(ids("first answer")), num_messages=1)
        t.messages = [Message("user", "Question?"), Message("assistant", "first answer")]
        if not follow_up:
            t.segments = [first]
            return t
        asked = Segment("observation", ids("And then?"), num_messages=1)
        t.earlier_sequences = [TokenSequence(ids("Question?"), [first, asked])]
        t.prompt_ids = ids("Question? first answer And then?")  # the rewritten conversation
        t.segments = [Segment("model", ids("a zebra"), [-0.2] * len(ids("a zebra")), num_messages=1)]
        t.messages += [Message("user", "And then?"), Message("assistant", "a zebra")]
        return t

    trajectories = [episode(0, False), episode(1, True), episode(2, False)]
    scored = ScoredBatch(totals=[0.0] * 3, components=[{}] * 3, correct=[None] * 3, errors={}, applied={})
    write_records(run_dir, "eval", 1, trajectory_records(trajectories, step=1, kind="eval", scored=scored,
                                                         tokenizer=tokenizer, row_samples=[None] * 3))
    return run_dir
