"""A runs directory for the UI tests: a real short training run (tiny model) next to a run
made before token records, a damaged run, and a run killed with -9 (a stale heartbeat)."""

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
