"""`rlf train --engine ray` answers SIGTERM (`rlf ui`'s Stop) as any run does
(rlfactory_core.stopping): Ray's core installs a fatal SIGTERM handler in the driver at
``ray.init``, which killed such a run unsaved ("*** SIGTERM received") until the engine put
Python's handlers back. In a process of its own: the engine starts its own cluster there, after
the stop handlers are installed, as in a user's run."""

import json
import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("ray")

pytestmark = pytest.mark.slow


def test_sigterm_stops_a_ray_run_through_the_stop_handler(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "rlfactory_cli", "train", "--env", "arithmetic", "--run-dir", str(run_dir),
            f"model.name={tiny_model_dir}", "engine=ray", "backend=hf", "train.bf16=false", "train.steps=500",
            "grpo.prompts_per_step=2", "grpo.group_size=2", "data.eval_size=2", "eval.every=0",
            "rollout.max_turns=2", "rollout.max_tokens_per_turn=16", "logging.live=off", "logging.tensorboard=false"]
    env = {**os.environ, "RAY_ADDRESS": ""}  # its own cluster, started after the stop handlers
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                           cwd=tmp_path)
    try:
        for line in run.stdout:  # the run is training: the cluster is up, ray.init long done
            if line.startswith("step 1/500"):
                break
        else:
            pytest.fail(f"the run ended before step 1 (exit {run.wait()})")
        run.send_signal(signal.SIGTERM)
        rest = run.stdout.read()
        assert run.wait(timeout=300) != -signal.SIGTERM, rest
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert "SIGTERM received" not in rest
    assert "stopped: step" in rest and "is saved" in rest, rest[-2000:]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "interrupted"
    assert any((run_dir / "checkpoints").iterdir())
