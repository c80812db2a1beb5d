"""``rlf train --env nl2sql`` then ``rlf eval --env nl2sql --model RUN_DIR`` (hf backend, two
steps of 2 prompts x 2 trajectories, the env's embedded defaults otherwise): metrics with the
reward's components and execution accuracy, samples, a checkpoint, an evaluation report.
The run's mechanics, not learning: a tiny random model with the embedded model's tokenizer
(``tiny_model_dir``); ``test_nl2sql_env.py`` scores scripted SQL through ``rlf eval``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_rlf_train_and_eval_nl2sql_end_to_end(built, tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    common = [f"env_options={{data_dir: {built}}}", "backend=hf", f"model.name={tiny_model_dir}", "data.eval_size=4", "logging.live=off",
              "rollout.max_turns=2", "rollout.max_tokens_per_turn=64"]
    log = tmp_path / "train.log"
    with open(log, "w") as out:
        code = subprocess.call([sys.executable, "-m", "rlfactory_cli", "train", "--env", "nl2sql",
                                "--run-dir", str(run_dir), *common, "train.steps=2", "grpo.prompts_per_step=2",
                                "grpo.group_size=2", "eval.every=2", "eval.save_samples=4", "cold_start.examples=4"],
                               stdout=out, stderr=subprocess.STDOUT, timeout=1200, env=dict(os.environ))
    assert code == 0, log.read_text()[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 0, 1, 2]  # the eval before training, the cold start's, steps
    cold = records[1]  # the env's default recipe warms up on demonstrations first, then evaluates
    assert cold["cold_start/examples/demonstrations"] == cold["cold_start/examples"] == 4
    assert "cold_start/eval/reward/accuracy" in cold
    step = records[3]
    for key in ("reward/sql_execution", "reward/sql_execution/execution_match", "reward/sql_execution/format",
                "reward/sql_execution/no_answer", "reward/sql_execution/execution_error",
                "reward/sql_execution/timeout", "reward/accuracy", "eval/reward/accuracy",
                "eval/reward/sql_execution/execution_match", "tools/calls_per_trajectory"):
        assert key in step, key
    assert 0.0 <= step["eval/reward/accuracy"] <= 1.0
    assert step["eval/reward/mean"] == pytest.approx(step["eval/reward/accuracy"])  # format_score 0 in eval
    assert (run_dir / "checkpoints" / "latest").exists()
    samples = [json.loads(line) for line in (run_dir / "samples" / "step-000002.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and all(s["expected"].startswith("SELECT") for s in samples)
    assert "MAX(area)\n17124442" in samples[0]["text"]  # the worked example, with its real result

    report_dir = tmp_path / "report"
    eval_log = tmp_path / "eval.log"
    with open(eval_log, "w") as out:
        code = subprocess.call([sys.executable, "-m", "rlfactory_cli", "eval", "--env", "nl2sql", "--model",
                                str(run_dir), "--size", "4", "--report", str(report_dir), *common],
                               stdout=out, stderr=subprocess.STDOUT, timeout=1200, env=dict(os.environ))
    assert code == 0, eval_log.read_text()[-3000:]
    report = json.loads((report_dir / "report.json").read_text())
    assert report["env"] == "nl2sql" and report["split"] == "test" and report["samples"] == 4
    assert "eval/reward/accuracy" in report["metrics"]
    assert "eval/reward/sql_execution/execution_error" in report["metrics"]
    assert "reward/accuracy" in eval_log.read_text()  # the printed table leads with execution accuracy
