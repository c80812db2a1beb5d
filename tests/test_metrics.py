"""Metrics output: the JSONL record, TensorBoard, W&B and the terminal view.

Everything runs for real: TensorBoard's event files are read back with TensorBoard's own
reader, and W&B runs in offline mode inside tmp_path. The only stand-in is a spy on
``os.fsync`` that counts the calls and then does the real thing.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time

import numpy as np
import pytest
from rich.console import Console

from rlfactory_core.errors import ConfigError
from rlfactory_core.metrics import METRICS_FILE, LiveView, MetricsLogger, read_metrics


# --- metrics.jsonl ---------------------------------------------------------------------------

def test_log_appends_one_fsynced_json_line_per_step(tmp_path, monkeypatch):
    path = tmp_path / METRICS_FILE
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd):
        if path.exists() and os.path.samestat(os.fstat(fd), os.stat(path)):
            synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    start = time.time()
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(1, {"reward/mean": 0.5, "train/loss": float("nan"), "tools/errors/timeout": 2,
                       "eval/done": True, "hist": [1.0, float("inf"), 3], "tools/names": ["search", "calc"]})
        assert len(synced) == 1
        # On disk already, before close: read through another handle.
        assert len(path.read_text().splitlines()) == 1
        logger.log(2, {"reward/mean": np.float32(0.25), "train/kl": float("-inf")})
        assert len(synced) == 2
        assert len(path.read_text().splitlines()) == 2

    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert first == {"step": 1, "time": first["time"], "reward/mean": 0.5, "train/loss": None,
                     "tools/errors/timeout": 2, "eval/done": True, "hist": [1.0, None, 3],
                     "tools/names": ["search", "calc"]}
    assert start <= first["time"] <= second["time"] <= time.time()
    assert second["reward/mean"] == 0.25 and second["train/kl"] is None
    assert read_metrics(tmp_path) == [first, second]


def test_log_rejects_reserved_keys_and_other_types(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        with pytest.raises(ValueError, match="'step' is reserved"):
            logger.log(1, {"step": 3})
        with pytest.raises(TypeError, match="'reward/by_source'"):
            logger.log(1, {"reward/by_source": {"gsm8k": 0.5}})
    assert read_metrics(tmp_path) == []
    with pytest.raises(ValueError, match="closed"):
        logger.log(2, {"reward/mean": 0.5})


def test_resume_drops_the_records_after_the_checkpoint_step(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        for step in range(1, 6):
            logger.log(step, {"reward/mean": step / 10})
    with MetricsLogger(tmp_path, tensorboard=False, resume_step=3) as logger:
        assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
        logger.log(4, {"reward/mean": 0.9})
    records = read_metrics(tmp_path)
    assert [(r["step"], r["reward/mean"]) for r in records] == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.9)]
    assert [p.name for p in tmp_path.iterdir()] == [METRICS_FILE]  # no temp file left behind


def test_read_metrics_skips_a_torn_last_line_and_the_logger_cuts_it_off(tmp_path):
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 1, "time": 0.0, "reward/mean": 0.5}\n{"step": 2, "time": 0.0, "rew')
    assert read_metrics(tmp_path) == [{"step": 1, "time": 0.0, "reward/mean": 0.5}]
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(2, {"reward/mean": 0.6})
    assert [(r["step"], r["reward/mean"]) for r in read_metrics(tmp_path)] == [(1, 0.5), (2, 0.6)]


def test_a_whole_last_record_missing_its_newline_is_kept(tmp_path):
    (tmp_path / METRICS_FILE).write_text('{"step": 1, "time": 0.0, "reward/mean": 0.5}')
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(2, {"reward/mean": 0.6})
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_read_metrics_rejects_a_damaged_line_before_the_last(tmp_path):
    (tmp_path / METRICS_FILE).write_text('{"step": 1, "ti\n{"step": 2, "time": 0.0}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:1"):
        read_metrics(tmp_path)


def test_read_metrics_of_a_run_without_metrics(tmp_path):
    assert read_metrics(tmp_path) == []


# --- TensorBoard -----------------------------------------------------------------------------

def _scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir / "tensorboard"))
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def test_tensorboard_gets_every_finite_number(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        logger.log(1, {"reward/mean": 0.5, "tools/errors/timeout": 2, "eval/done": True,
                       "train/loss": float("nan"), "note": "warmup", "hist": [1.0, 2.0]})
        logger.log(2, {"reward/mean": 0.75, "tools/errors/timeout": 0})
    assert _scalars(tmp_path) == {
        "reward/mean": [(1, 0.5), (2, 0.75)],
        "tools/errors/timeout": [(1, 2.0), (2, 0.0)],
        "eval/done": [(1, 1.0)],
    }


def test_tensorboard_purges_the_steps_after_the_checkpoint_on_resume(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        for step, reward in [(1, 0.25), (2, 0.5), (3, 0.75)]:
            logger.log(step, {"reward/mean": reward})
    # TensorBoard reads event files in name order, and the name's timestamp is in seconds:
    # a resumed run is a later process in practice, and must be a later second here.
    time.sleep(max(0.0, int(time.time()) + 1.05 - time.time()))
    with MetricsLogger(tmp_path, resume_step=1) as logger:
        logger.log(2, {"reward/mean": 1.0})
    assert _scalars(tmp_path) == {"reward/mean": [(1, 0.25), (2, 1.0)]}


# --- Weights & Biases --------------------------------------------------------------------------

@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    """W&B in offline mode, with its config, cache and data directories inside tmp_path."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    monkeypatch.delenv("WANDB_RESUME", raising=False)


def test_wandb_offline_run_is_continued_on_resume(tmp_path, wandb_offline):
    run_dir = tmp_path / "run"
    options = dict(tensorboard=False, wandb_project="rlfactory-test", run_name="smoke", config={"lr": 1e-6})
    with MetricsLogger(run_dir, **options) as logger:
        run_id = logger.wandb_run.id
        logger.log(1, {"reward/mean": 0.5, "note": "not numeric"})
    assert (run_dir / "wandb_id.txt").read_text().strip() == run_id
    with MetricsLogger(run_dir, resume_step=1, **options) as logger:
        assert logger.wandb_run.id == run_id
        logger.log(2, {"reward/mean": 0.75})

    offline_runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert offline_runs and all(p.name.endswith("-" + run_id) for p in offline_runs)
    assert all((p / f"run-{run_id}.wandb").stat().st_size > 0 for p in offline_runs)
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]


def test_missing_wandb_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now raises ImportError
    with pytest.raises(ConfigError) as info:
        MetricsLogger(tmp_path / "run", tensorboard=False, wandb_project="rlfactory-test")
    assert info.value.errors == ["logging.wandb_project: Weights & Biases is not installed"]
    assert info.value.hint == "pip install wandb, or set logging.wandb_project=null"
    assert not (tmp_path / "run").exists()


def test_missing_tensorboard_and_wandb_are_reported_together(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ConfigError) as info:
        MetricsLogger(tmp_path, wandb_project="rlfactory-test")
    assert info.value.errors == ["logging.tensorboard: TensorBoard is not installed",
                                 "logging.wandb_project: Weights & Biases is not installed"]
    assert "pip install tensorboard, or set logging.tensorboard=false" in info.value.hint
    assert "pip install wandb, or set logging.wandb_project=null" in info.value.hint


# --- LiveView --------------------------------------------------------------------------------

STEP_METRICS = {
    "reward/mean": 0.41, "reward/accuracy": 0.38, "train/loss": 0.0123, "train/kl": 0.0,
    "train/entropy": 0.8, "train/clip_fraction": 0.02, "tools/calls_per_trajectory": 0.94,
    "tools/error_rate": 0.05, "time/step": 3.2, "throughput/train_tokens_per_s": 1234.5, "other/key": 7,
}


def test_liveview_prints_one_plain_line_per_step_without_a_terminal():
    out = io.StringIO()
    with LiveView(20, start_step=2, console=Console(file=out, force_terminal=False)) as view:
        assert not view.enabled
        view.phase("rollout")
        view.update(3, STEP_METRICS)
        view.message("eval [gsm8k]: accuracy 0.50")
        view.update(4, {"reward/mean": float("nan"), "time/step": 2.96})
        view.update(5, {})
    assert out.getvalue().splitlines() == [
        "step 3/20  reward 0.41  acc 0.38  loss 0.012  kl 0.000  tools/traj 0.9  3.2 s/step",
        "eval [gsm8k]: accuracy 0.50",
        "step 4/20  reward nan  3.0 s/step",
        "step 5/20",
    ]


def test_liveview_draws_in_a_terminal():
    out = io.StringIO()
    with LiveView(3, console=Console(file=out, force_terminal=True, width=100)) as view:
        assert view.enabled
        for step in range(1, 4):
            for phase in ("rollout", "train"):
                view.phase(phase)
            view.update(step, STEP_METRICS)
        view.message("eval [gsm8k]: accuracy 0.50")
    text = out.getvalue()
    assert "eval [gsm8k]: accuracy 0.50" in text
    assert "3/3" in text and "train" in text
    for shown in ("reward", "0.410", "tool error rate", "5.0%", "1,234", "3.2 s"):
        assert shown in text
