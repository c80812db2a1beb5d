"""Stopping `rlf train` with Ctrl-C (rlfactory_core.stopping) and where the engines' own
output goes (rlfactory_core.logs), through real `rlf train` processes on a tiny model.

The runs train on ``stalling``, a test plugin put on PYTHONPATH: the arithmetic env, whose
episodes past a given number hang in ``env.step`` (a tool or a phone that never answers)
until they are cancelled, and which writes third-party-like output on every channel when it
is built (a Python warning, a ``vllm`` logger record, a child process and a C-level write to
descriptor 2). No assertion is about time: the subprocess timeouts only guard against hangs.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from rlfactory_core.training.checkpoint import latest_checkpoint
from rlfactory_core.metrics import read_metrics
from rlfactory_core.run_status import read_status

PLUGIN = '''
"""The env ``stalling`` (tests of rlf train's stopping and output)."""

import asyncio
import logging
import os
import subprocess
import warnings

from rlfactory_arithmetic import ArithmeticEnv
from rlfactory_core import hookimpl


class StallingEnv(ArithmeticEnv):
    name = "stalling"
    description = "The arithmetic env, hanging in env.step after stall_after episodes (tests)."

    def __init__(self, marker: str, stall_after: int = -1, slow_close: bool = False, **options):
        super().__init__(**options)
        self.marker, self.stall_after, self.slow_close, self.episodes = marker, stall_after, slow_close, 0
        warnings.warn("rlf-test-noise: a Python warning")
        logging.getLogger("vllm").warning("rlf-test-noise: a vllm log record")
        subprocess.run(["sh", "-c", "echo rlf-test-noise: a child process >&2"], check=True)
        os.write(2, b"rlf-test-noise: a C-level write\\n")

    async def reset(self, sample):
        self.episodes += 1
        reset = await super().reset(sample)
        reset.state["stalls"] = 0 <= self.stall_after < self.episodes
        return reset

    async def step(self, state, turn, results):
        if state["stalls"]:
            self._note("stalled")
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self._note("cancelled")
                raise
        return await super().step(state, turn, results)

    async def close(self, state):
        if state["stalls"] and self.slow_close:  # a cancelled episode that takes an hour to clean up
            self._note("closing")
            await asyncio.sleep(3600)

    def _note(self, what):
        with open(f"{self.marker}.{what}", "a") as f:
            f.write("x\\n")


@hookimpl
def rlfactory_register_envs(register):
    register(StallingEnv)
'''

# 2 eval episodes before training, then 2 prompts x 2 per step: step 2's episodes stall.
STALL_IN_STEP_2 = 2 + 2 * 2
RUN = ["backend=hf", "grpo.prompts_per_step=2", "grpo.group_size=2", "data.eval_size=2", "eval.every=0",
       "rollout.max_turns=2", "rollout.max_tokens_per_turn=8", "logging.tensorboard=false"]
NOISE = "rlf-test-noise"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


@pytest.fixture
def plugin_env(tmp_path):
    """The environment of a process that has the ``stalling`` plugin."""
    from rlfactory_core.testing import write_distribution

    site = write_distribution(tmp_path / "site", "rlf-test-stalling", "stalling", "rlf_test_stalling", PLUGIN)
    env = {k: v for k, v in os.environ.items() if k not in ("RLFACTORY_DEBUG", "FORCE_COLOR", "TTY_COMPATIBLE")}
    return {**env, "PYTHONPATH": str(site)}


class Terminal:
    """A process on a pseudo-terminal (its stdin, stdout and stderr), its output collected."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path):
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 240, 0, 0))  # no wrapped lines
        self.process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd)
        os.close(slave)
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, args=(master,), daemon=True)
        self._reader.start()

    def _read(self, master: int) -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the process closed the terminal
                break
            if not data:
                break
            self._chunks.append(data)
        os.close(master)

    @property
    def text(self) -> str:
        return ANSI.sub("", b"".join(self._chunks).decode("utf-8", errors="replace"))

    def wait_for(self, condition, timeout: float = 600) -> None:
        deadline = time.time() + timeout
        while not condition() and self.process.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert condition(), self.text[-3000:]

    def finish(self, timeout: float) -> int:
        try:
            code = self.process.wait(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        self._reader.join(10)
        return code


def _count(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _train_argv(run_dir: Path, marker: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "rlfactory_cli", "train", "--env", "stalling", "--run-dir", str(run_dir),
            f"env_options.marker={marker}", *RUN, *args]


@pytest.mark.slow
def test_ctrl_c_drops_the_step_in_flight_saves_the_last_one_and_resume_redoes_it(tmp_path, plugin_env,
                                                                                tiny_model_dir):
    run_dir, marker = tmp_path / "run", tmp_path / "marker"
    terminal = Terminal(_train_argv(run_dir, marker, f"model.name={tiny_model_dir}", "train.steps=2",
                                    f"env_options.stall_after={STALL_IN_STEP_2}", "checkpoint.every=1000"),
                        plugin_env, tmp_path)
    terminal.wait_for(lambda: _count(Path(f"{marker}.stalled")) == 4)  # all of step 2's episodes hang
    terminal.process.send_signal(signal.SIGINT)
    terminal.wait_for(lambda: "stopping:" in terminal.text, timeout=60)
    code = terminal.finish(timeout=120)  # the rollout would hang for an hour: only cancelling ends it
    text = terminal.text
    assert code == 130, text[-3000:]
    assert ("stopping: step 2 in progress is dropped (redone on resume), step 1 is saved; Ctrl-C again to stop "
            "without saving") in text
    assert f"stopped: step 1 is saved; continue with `rlf train --resume {run_dir}`" in text
    assert _count(Path(f"{marker}.cancelled")) == 4  # the cancellation reached every hanging episode
    status = read_status(run_dir)
    assert (status.state, status.step) == ("interrupted", 1) and "step 1 is saved" in status.message

    # Step 1 saved although checkpoint.every is larger; nothing of step 2 is written.
    newest = latest_checkpoint(run_dir)
    assert newest.name == "step-000001"
    assert json.loads((newest / "state.json").read_text())["position"] == 2
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1]
    assert sorted(p.name for p in (run_dir / "samples").iterdir()) == ["step-000000.jsonl"]

    # On a terminal, with the live view: the engines' output is in the run's log only.
    log = (run_dir / "log.txt").read_text()
    for channel in ("a Python warning", "a vllm log record", "a child process", "a C-level write"):
        assert f"{NOISE}: {channel}" in log
    assert NOISE not in text

    # Resumed (with --verbose: the engines' output is shown too), step 2 is redone with the
    # prompts an uninterrupted run gives it.
    resumed = subprocess.run([sys.executable, "-m", "rlfactory_cli", "train", "--verbose", "--resume", str(run_dir),
                              "env_options.stall_after=-1"], capture_output=True, text=True, env=plugin_env,
                             cwd=tmp_path, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert f"{NOISE}: a child process" in resumed.stderr and f"{NOISE}: a Python warning" in resumed.stderr
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert (read_status(run_dir).state, read_status(run_dir).step) == ("finished", 2)
    import yaml
    from rlfactory_arithmetic import ArithmeticEnv

    from rlfactory_core.data import batch_indices

    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    train_ids = [s["id"] for s in ArithmeticEnv().dataset(split="train")]
    expected = batch_indices(len(train_ids), 4, seed=saved["train"]["seed"], position=0)
    assert records[1]["samples"] + records[2]["samples"] == [train_ids[i] for i in expected]
    saved = json.loads((latest_checkpoint(run_dir) / "state.json").read_text())
    assert {k: v for k, v in saved.items() if k not in ("metrics", "tokenizer_sha256")} == {
        "step": 2, "position": 4, "policy_version": 2, "family": "template"}
    assert saved["metrics"]["samples"]  # the step's metrics travel with its checkpoint


@pytest.mark.slow
def test_a_run_killed_with_sigkill_is_told_dead_not_running(tmp_path, plugin_env, tiny_model_dir):
    run_dir, marker = tmp_path / "run", tmp_path / "marker"
    terminal = Terminal(_train_argv(run_dir, marker, f"model.name={tiny_model_dir}", "train.steps=2",
                                    f"env_options.stall_after={STALL_IN_STEP_2}"), plugin_env, tmp_path)
    terminal.wait_for(lambda: _count(Path(f"{marker}.stalled")) == 4)  # step 1 is done, step 2 hangs
    status = read_status(run_dir)
    assert (status.state, status.step, status.pid) == ("running", 1, terminal.process.pid)
    terminal.process.kill()  # SIGKILL: no handler runs, nothing more is written
    terminal.finish(timeout=60)
    died = read_status(run_dir)
    assert (died.state, died.step) == ("died", 1)
    assert f"its process {terminal.process.pid} is gone" in died.message


@pytest.mark.slow
def test_a_second_ctrl_c_stops_without_saving(tmp_path, plugin_env, tiny_model_dir):
    # The cancelled episodes take an hour to close, so only the second signal ends the run.
    run_dir, marker = tmp_path / "run", tmp_path / "marker"
    args = _train_argv(run_dir, marker, f"model.name={tiny_model_dir}", "train.steps=2", "checkpoint.every=1000",
                       f"env_options.stall_after={STALL_IN_STEP_2}", "env_options.slow_close=true", "logging.live=off")
    log = tmp_path / "out.txt"
    with open(log, "w") as out:  # a file, not a pipe: a full pipe nobody reads would block the run
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=plugin_env, cwd=tmp_path)
    try:
        deadline = time.time() + 600
        while _count(Path(f"{marker}.stalled")) < 4 and process.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        while _count(Path(f"{marker}.closing")) < 4 and process.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert process.poll() is None, log.read_text()[-3000:]  # held up by the closing episodes
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text()
    assert code == 130, output[-3000:]
    assert "stopping now, without saving" in output
    assert "stopped: without saving: the run has no checkpoint" in output
    # Step 1 finished but was not saved; no checkpoint, not even a half-written one.
    assert not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").iterdir())


def test_ctrl_c_during_an_update_finishes_and_saves_that_step(tmp_path, tiny_model_dir, monkeypatch):
    # In this process: the signal arrives while step 1's update runs (it cannot be undone half-way).
    from rlfactory_core.testing import TrainingInterrupted, train
    from rlfactory_core.config import load_config
    from rlfactory_core.engines import local as local_engine
    from rlfactory_core.training.update import update_policy

    update = update_policy

    def interrupted_update(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the main thread takes the signal while the update runs (the outcome is the same if not)
        return update(*args, **kwargs)

    monkeypatch.setattr(local_engine, "update_policy", interrupted_update)
    run_dir = tmp_path / "run"
    config = load_config([], ["env=arithmetic", *RUN, "eval.every=1", "train.steps=3", "checkpoint.every=1000",
                              "logging.live=off", f"model.name={tiny_model_dir}", f"run_dir={run_dir}"])
    with pytest.raises(TrainingInterrupted) as stopped:
        train(config)
    assert stopped.value.exit_code == 130
    assert stopped.value.message.startswith("step 1 is saved")
    assert latest_checkpoint(run_dir).name == "step-000001"
    assert json.loads((latest_checkpoint(run_dir) / "state.json").read_text())["position"] == 2
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [0, 1]
    # finished without its eval and without a weight sync: nothing generates after it
    assert "eval/reward/mean" not in records[1] and "time/weight_sync" not in records[1]
    assert "train/loss" in records[1]


@pytest.mark.slow
def test_ctrl_c_during_rlf_eval_says_it_stopped_and_writes_no_report(tmp_path, plugin_env, tiny_model_dir):
    marker, report = tmp_path / "marker", tmp_path / "report"
    argv = [sys.executable, "-m", "rlfactory_cli", "eval", "--env", "stalling", "--model", str(tiny_model_dir),
            "--size", "2", "--report", str(report), f"env_options.marker={marker}", "env_options.stall_after=0",
            *RUN]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=plugin_env,
                               cwd=tmp_path)
    deadline = time.monotonic() + 300
    while _count(Path(f"{marker}.stalled")) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)  # both episodes hang in env.step: only a stop ends the evaluation
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, out[-2000:] + err[-2000:]
    assert "stopped: the evaluation was stopped before its end; no report was written" in err
    assert not (report / "report.json").exists()
    assert _count(Path(f"{marker}.cancelled")) == 2  # the cancellation reached the hanging episodes


@pytest.mark.parametrize("first_signal_during", ["update", "rollout"])
def test_a_second_ctrl_c_during_a_save_lets_the_checkpoint_finish(tmp_path, tiny_model_dir, monkeypatch,
                                                                  first_signal_during):
    """The first Ctrl-C during step 1's update (the step is finished and saved) or during
    step 2's rollout (step 2 is dropped, step 1 saved); the second while that checkpoint is
    being written, on the engine's training thread. The checkpoint is finished, whole, and
    the run ends as a stopped run (exit code 130) that names it."""
    from rlfactory_core.config import load_config
    from rlfactory_core.engines import local as local_engine
    from rlfactory_core.testing import TrainingInterrupted, train
    from rlfactory_core.training import checkpoint as checkpoints

    real_update, real_rollout, real_save = local_engine.update_policy, local_engine.LocalRollout.rollout, \
        checkpoints.save_checkpoint
    rollouts = []

    def update(*args, **kwargs):
        if first_signal_during == "update":
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
        return real_update(*args, **kwargs)

    async def rollout(self, *args, **kwargs):
        rollouts.append(1)  # the eval before training, step 1, step 2
        if first_signal_during == "rollout" and len(rollouts) == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return await real_rollout(self, *args, **kwargs)

    def slow_save(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # the second signal: the main thread takes it now
        time.sleep(1.0)
        return real_save(*args, **kwargs)

    monkeypatch.setattr(local_engine, "update_policy", update)
    monkeypatch.setattr(local_engine.LocalRollout, "rollout", rollout)
    monkeypatch.setattr(checkpoints, "save_checkpoint", slow_save)
    run_dir = tmp_path / "run"
    config = load_config([], ["env=arithmetic", *RUN, "train.steps=3", "checkpoint.every=1000", "logging.live=off",
                              f"model.name={tiny_model_dir}", f"run_dir={run_dir}"])
    with pytest.raises(TrainingInterrupted) as stopped:
        train(config)
    assert stopped.value.exit_code == 130
    assert stopped.value.message.startswith("without saving: the newest checkpoint is step 1"), stopped.value.message
    assert latest_checkpoint(run_dir).name == "step-000001"
    saved = json.loads((latest_checkpoint(run_dir) / "state.json").read_text())
    assert {k: v for k, v in saved.items() if k not in ("metrics", "tokenizer_sha256")} == {
        "step": 1, "position": 2, "policy_version": 1, "family": "template"}
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest", "step-000001"]  # no leftovers


def test_a_signal_while_the_run_closes_its_engines_does_not_cut_that_short():
    """vLLM's shutdown takes seconds: a Ctrl-C then says what is happening and leaves the
    closing alone; only the one after it acts as if rlfactory were not there."""
    import asyncio

    from rlfactory_core.stopping import RunStopper

    said: list[str] = []

    async def close_the_run() -> str:
        stop = RunStopper(said.append).install()
        stop.closing()
        os.kill(os.getpid(), signal.SIGINT)
        while not said:  # the handler hands the signal to this loop
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # a cancellation of this task would land here
        handler = signal.getsignal(signal.SIGINT)
        return "ours" if getattr(handler, "__self__", None) is stop else "previous"

    assert asyncio.run(close_the_run()) == "previous"
    assert len(said) == 1 and said[0].startswith("closing the engines and tool servers first")
