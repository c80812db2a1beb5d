"""A run's ``status.json`` (rlfactory_core.run_status): the heartbeat a live run keeps, how it
ended, and a run killed without a word told apart from a running one. The writer and reader on
their own here; through real runs: finished and failed here, interrupted by Ctrl-C and killed
with SIGKILL in tests/test_stopping.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from rlfactory_core.config import load_config
from rlfactory_core.run_status import STALE_AFTER_S, STATUS_FILE, StatusWriter, read_status
from rlfactory_core.testing import train


def _wait_until(condition, hang_guard_s: float = 30.0) -> None:
    """Poll until ``condition``; the bound only turns a hang into a failure (no speed is asserted)."""
    deadline = time.time() + hang_guard_s
    while not condition():
        if time.time() > deadline:
            pytest.fail("the condition never held: the heartbeat thread hangs or never writes")
        time.sleep(0.02)


def test_a_live_run_beats_records_its_steps_and_its_end_is_final(tmp_path):
    writer = StatusWriter(tmp_path, steps=8, heartbeat_s=0.05).start()
    first = read_status(tmp_path)
    assert (first.state, first.step, first.steps, first.host) == ("running", 0, 8, socket.gethostname())
    _wait_until(lambda: read_status(tmp_path).updated_at > first.updated_at)  # the heartbeat rewrites it
    writer.step(3)
    assert read_status(tmp_path).step == 3
    writer.end("interrupted", "step 3 is saved; continue with `rlf train --resume RUN`")
    ended = json.loads((tmp_path / STATUS_FILE).read_text())
    time.sleep(0.2)  # four heartbeats' time: none may overwrite the end
    assert json.loads((tmp_path / STATUS_FILE).read_text()) == ended
    status = read_status(tmp_path, now=ended["updated_at"] + 10 * STALE_AFTER_S)  # an end never goes stale
    assert (status.state, status.step, status.message) == ("interrupted", 3, ended["message"])
    writer.step(4)  # after the end: ignored
    assert read_status(tmp_path).step == 3


def _status_file(path, **fields):
    record = {"version": 1, "state": "running", "pid": 1, "host": "elsewhere", "started_at": 100.0,
              "updated_at": 1000.0, "step": 5, "steps": 8, "message": "", **fields}
    (path / STATUS_FILE).write_text(json.dumps(record))


def test_running_until_the_heartbeat_is_stale_or_the_process_is_gone(tmp_path):
    _status_file(tmp_path)  # another host's run: only its heartbeat says whether it lives
    assert read_status(tmp_path, now=1000.0 + STALE_AFTER_S - 1).state == "running"
    died = read_status(tmp_path, now=1000.0 + STALE_AFTER_S + 1)
    assert died.state == "died" and died.step == 5
    assert died.message == ("stopped without a word (its last heartbeat was 61 s ago: killed or out of memory?); "
                            "step 5 is the last finished")

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process now
    _status_file(tmp_path, host=socket.gethostname(), pid=gone.pid, updated_at=time.time())
    died = read_status(tmp_path)  # on this host the heartbeat need not go stale first
    assert died.state == "died" and f"its process {gone.pid} is gone" in died.message


@pytest.mark.parametrize("text, reason", [
    ('{"version": 1, "state": "runn', "malformed (JSONDecodeError"),  # torn
    ("[1, 2]", "malformed (TypeError"),
    ('{"version": 1}', "malformed (KeyError"),
    ('{"state": "running", "step": "three"}', "malformed (ValueError"),
    ('{"state": "paused"}', "unknown state 'paused'"),
])
def test_a_torn_or_malformed_file_is_unknown_with_the_reason(tmp_path, text, reason):
    (tmp_path / STATUS_FILE).write_text(text)
    status = read_status(tmp_path)
    assert status.state == "unknown" and status.message.startswith(f"{STATUS_FILE}: {reason}")


def test_a_run_from_before_the_file_is_judged_by_its_metrics(tmp_path):
    (tmp_path / "config.yaml").write_text("train:\n  steps: 3\n")
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"st')
    unfinished = read_status(tmp_path)
    assert unfinished.state == "unknown" and (unfinished.step, unfinished.steps) == (1, 3)
    assert "still running at step 1" in unfinished.message
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 3}\n')
    assert read_status(tmp_path).state == "finished"
    assert read_status(tmp_path / "nothing").state == "unknown"  # no files at all: no exception


def _tiny_run(tmp_path, tiny_model_dir, *extra):
    return load_config([], ["backend=hf", f"model.name={tiny_model_dir}", "train.steps=2", "grpo.prompts_per_step=1",
                            "grpo.group_size=2", "data.eval_size=1", "eval.every=0", "eval.save_samples=0",
                            "rollout.max_turns=1", "rollout.max_tokens_per_turn=4", "logging.live=off",
                            "logging.tensorboard=false", f"run_dir={tmp_path / 'run'}", *extra])


def test_a_finished_run_says_so_with_its_last_step(tmp_path, tiny_model_dir):
    run_dir = train(_tiny_run(tmp_path, tiny_model_dir))
    status = read_status(run_dir)
    assert (status.state, status.step, status.steps, status.message) == ("finished", 2, 2, "")


def test_a_failed_run_says_why(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "samples").write_text("a file where the directory of evaluation samples goes")
    with pytest.raises(OSError):
        train(_tiny_run(tmp_path, tiny_model_dir, "train.steps=1", "eval.save_samples=1"))
    status = read_status(run_dir)
    assert status.state == "failed" and status.step == 0
    assert status.message.startswith(("FileExistsError", "NotADirectoryError")), status.message


def test_one_trainer_holds_a_run_and_only_it_counts_as_its_process(tmp_path):
    """hold_run: a second trainer on the same run is refused; holds_run tells the run's trainer
    from a process that merely claims its pid (a reused pid, another run's trainer)."""
    import subprocess
    import sys

    from rlfactory_core.run_status import RunInUse, hold_run, holds_run

    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from rlfactory_core.run_status import hold_run\n"
                               f"lock = hold_run({str(tmp_path)!r}); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    impostor = subprocess.Popen(["sleep", "60"])
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunInUse, match=f"in use by another rlf train \\(pid {holder.pid}\\)"):
            hold_run(tmp_path)
        assert holds_run(holder.pid, tmp_path) and not holds_run(impostor.pid, tmp_path)
        assert not holds_run(holder.pid, tmp_path / "elsewhere")
    finally:
        holder.kill()
        impostor.kill()
        holder.wait()
        impostor.wait()
    with hold_run(tmp_path):  # released with the process, however it ended
        assert holds_run(os.getpid(), tmp_path)
    assert not holds_run(os.getpid(), tmp_path)


def test_a_run_that_wrote_its_end_but_still_holds_the_run_is_exiting_and_not_resumed(tmp_path):
    """Between its end in status.json and its exit a run closes its engines (seconds, minutes
    on a loaded machine): a resume then would find the run in use. still_exiting says so, the
    UI's summary carries it (its Resume button waits) and the launcher's refusal says why."""
    from rlfactory_cli.ui.launcher import LaunchError, Launcher
    from rlfactory_cli.ui.runs_data import RunsData

    from rlfactory_core.run_status import still_exiting

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("env: arithmetic\ntrain: {steps: 8}\n")
    (run_dir / "checkpoints" / "step-000003").mkdir(parents=True)
    exiting = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                                "from pathlib import Path\n"
                                "from rlfactory_core.run_status import StatusWriter, hold_run\n"
                                f"lock = hold_run({str(run_dir)!r})\n"
                                f"status = StatusWriter(Path({str(run_dir)!r}), steps=8).start()\n"
                                "status.end('interrupted', 'stopped; step 3 is saved')\n"
                                "print('ended', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert exiting.stdout.readline().strip() == "ended"
        status = read_status(run_dir)
        assert status.state == "interrupted" and still_exiting(run_dir, status)
        assert RunsData(tmp_path).summary(run_dir)["exiting"] is True
        with pytest.raises(LaunchError, match=f"run has interrupted but its process \\(pid {exiting.pid}\\) is "
                                              f"still exiting: resume once it has"):
            Launcher(tmp_path).resume("run")
    finally:
        exiting.kill()
        exiting.wait()
    status = read_status(run_dir)
    assert status.state == "interrupted" and not still_exiting(run_dir, status)
    assert RunsData(tmp_path).summary(run_dir)["exiting"] is False
