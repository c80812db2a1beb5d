"""Each vLLM engine's IPC socket files live in a directory of its own, which goes with the
engine (tests/test_vllm_backend.py's lifecycle test checks that on a real engine) or, when a
run was killed outright, with the next engine start."""

import os
import socket
import subprocess
import sys
import tempfile

import pytest

from rlfactory_core.rollout.backends.vllm_sockets import private_socket_directory, remove_socket_directory


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    return tmp_path


def a_dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_killed_runs_directory_goes_at_the_next_start_and_live_ones_stay(temp_dir):
    killed = temp_dir / f"rlf-vllm-{a_dead_pid()}-abcd1234"
    killed.mkdir()
    with socket.socket(socket.AF_UNIX) as left_behind:
        left_behind.bind(str(killed / "s"))  # vLLM names them by UUID; short here: tmp_path is long
    running = temp_dir / f"rlf-vllm-{os.getppid()}-efgh5678"  # the process that started pytest: alive
    running.mkdir()
    unrelated = temp_dir / "rlf-vllm-notes"
    unrelated.mkdir()

    made = private_socket_directory()
    assert os.path.dirname(made) == str(temp_dir) and os.path.basename(made).startswith(f"rlf-vllm-{os.getpid()}-")
    assert sorted(p.name for p in temp_dir.iterdir()) == sorted([os.path.basename(made), running.name, unrelated.name])

    remove_socket_directory(made)
    remove_socket_directory(None)
    assert not os.path.exists(made)


def test_a_users_own_socket_path_is_left_to_them(temp_dir, monkeypatch):
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(temp_dir / "mine"))
    assert private_socket_directory() is None
    assert list(temp_dir.iterdir()) == []
