"""``rlf train --env android`` then ``rlf eval --env android --model RUN_DIR`` on the simulated
phone (hf backend; the default recipe's warm-up on 2 demonstrations, then one step of 2 tasks
x 2 trajectories, the env's defaults otherwise: the ``pythonic`` parser, no worked examples,
screens without coordinates): metrics with the reward's components, samples, a checkpoint, an
evaluation report. The run's mechanics, not learning: a tiny random model with the embedded
model's tokenizer (``tiny_model_dir``); ``test_android_env.py`` runs scripted actions on the
phone through the run's task. Three turns, so that a settings task's demonstration (open the
app, tap its row, "Done.") fits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_rlf_train_and_eval_android_end_to_end(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    common = ["backend=hf", f"model.name={tiny_model_dir}", "data.eval_size=2", "logging.live=off", "rollout.max_turns=3",
              "rollout.max_tokens_per_turn=48"]
    log = tmp_path / "train.log"
    with open(log, "w") as out:
        code = subprocess.call([sys.executable, "-m", "rlfactory_cli", "train", "--env", "android",
                                "--run-dir", str(run_dir), *common, "train.steps=1", "grpo.prompts_per_step=2",
                                "grpo.group_size=2", "eval.every=1", "eval.save_samples=2", "cold_start.examples=2"],
                               stdout=out, stderr=subprocess.STDOUT, timeout=1200, env=dict(os.environ))
    assert code == 0, log.read_text()[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 0, 1]  # the eval before training, the cold start's, the step
    cold = records[1]
    assert cold["cold_start/examples/demonstrations"] == cold["cold_start/examples"] == 2
    assert "cold_start/eval/reward/accuracy" in cold
    step = records[2]
    for key in ("reward/android_task", "reward/android_task/success", "reward/android_task/actions",
                "reward/accuracy", "eval/reward/accuracy", "tools/calls_per_trajectory", "reward/errors"):
        assert key in step, key
    assert step["reward/errors"] == 0.0  # every episode's check was read from its phone
    assert (run_dir / "checkpoints" / "latest").exists()
    samples = [json.loads(line) for line in (run_dir / "samples" / "step-000001.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and all(s["expected"] for s in samples)  # the check, described
    assert "Screen: com.android" in samples[0]["text"]
    text = samples[0]["text"]  # the default's short contexts: signature lines, no screen size
    assert "tap(element: int = None" in text and "(1080x2400)" not in text and "<tool_call>" not in text

    report_dir = tmp_path / "report"
    eval_log = tmp_path / "eval.log"
    with open(eval_log, "w") as out:
        code = subprocess.call([sys.executable, "-m", "rlfactory_cli", "eval", "--env", "android", "--model",
                                str(run_dir), "--size", "2", "--report", str(report_dir), *common],
                               stdout=out, stderr=subprocess.STDOUT, timeout=1200, env=dict(os.environ))
    assert code == 0, eval_log.read_text()[-3000:]
    report = json.loads((report_dir / "report.json").read_text())
    assert report["env"] == "android" and report["split"] == "test" and report["samples"] == 2
    assert "eval/reward/android_task/success" in report["metrics"]
