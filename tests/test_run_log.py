"""Third-party output goes to the run's log, not the terminal (rlfactory_core.logs and
rlfactory_cli.quiet), checked in real processes: capturing descriptors 1 and 2 cannot be
seen from inside pytest, which replaces the streams itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

ENV = {k: v for k, v in os.environ.items() if k != "RLFACTORY_DEBUG"}


def _python(script: str, *args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True,
                          env=ENV, cwd=cwd, timeout=120)


def test_the_capture_buffers_until_the_run_has_a_directory_and_follows_child_processes(tmp_path):
    log = tmp_path / "run" / "log.txt"
    log.parent.mkdir()
    result = _python("""
        import os, subprocess, sys, warnings
        from rlfactory_core.logs import capture_output, log_to

        with capture_output() as capture:
            print("1 python stdout", flush=True)
            warnings.warn("2 a python warning")
            subprocess.run(["sh", "-c", "echo 3 a child >&2"], check=True)
            # started before the log has its place, writes after: its lines must not be lost
            early = subprocess.Popen(["sh", "-c", "read go; echo 5 an early child, late >&2"], stdin=subprocess.PIPE)
            print("for the user", file=capture.stderr, flush=True)
            log_to(sys.argv[1])
            os.write(2, b"4 a C-level write\\n")
            early.communicate(b"go\\n")
        print("after the capture", file=sys.stderr)
    """, str(log))
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert result.stderr == "for the user\nafter the capture\n"
    lines = log.read_text().splitlines()
    ordered = [m.group(1) for line in lines if (m := re.search(r"\b([1-5]) (?:python|a|an) ", line))]
    assert ordered == ["1", "2", "3", "4", "5"], lines


def test_a_failed_command_shows_the_logs_last_lines_and_keeps_it(tmp_path):
    result = _python("""
        import subprocess
        from rlfactory_cli.console import err, out
        from rlfactory_cli.quiet import engine_output_to_log

        try:
            with engine_output_to_log():
                out.print("progress for the user")
                subprocess.run(["sh", "-c", "echo engine noise >&2; echo engine crashed: out of memory >&2"])
                raise RuntimeError("the engine died")
        except RuntimeError:
            err.print("Error: the engine died")
    """, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "progress for the user\n"
    header, *tail, error = result.stderr.splitlines()
    kept = re.fullmatch(r"the last lines of the log \((.+\.log)\):", header)
    assert kept, result.stderr
    assert tail == ["engine noise", "engine crashed: out of memory"]
    assert error == "Error: the engine died"
    assert open(kept.group(1)).read() == "engine noise\nengine crashed: out of memory\n"
    os.unlink(kept.group(1))



def test_a_crash_of_the_process_still_reaches_the_terminal(tmp_path):
    result = _python("""
        import ctypes
        from rlfactory_cli.quiet import engine_output_to_log

        with engine_output_to_log():
            ctypes.string_at(0)  # a segfault, as a broken C extension would cause
    """, cwd=tmp_path)
    assert result.returncode != 0
    assert "Fatal Python error: Segmentation fault" in result.stderr

# `rlf train` on vLLM, its engine-core processes included, is checked by the learning test
# (tests/test_learning.py), which pays for the engine's start anyway.
