"""The engine protocol: every engine implements it whole and async; the local engine keeps
its updates on one thread with flat memory; the ray engine refuses what it cannot do before
it starts Ray."""

import asyncio
import inspect
import threading

import pytest

from rlfactory_core.config import load_config
from rlfactory_core.engines import build_driver_task, make_engine, rollout_config_for
from rlfactory_core.engines.base import Engine, RolloutResult
from rlfactory_core.engines.local import LocalEngine
from rlfactory_core.errors import ConfigError
from rlfactory_core.hookspecs import hookimpl
from rlfactory_core.preflight import run_problems
from rlfactory_core.testing import registered_plugin
from rlfactory_core.training.batch import build_batch


def _engine_classes():
    from rlfactory_core.engines.ray import RayEngine

    return [LocalEngine, RayEngine]


def _protocol_methods():
    return {name: member for name, member in vars(Engine).items()
            if inspect.isfunction(member) and not name.startswith("_")}


@pytest.mark.parametrize("engine_cls", _engine_classes(), ids=lambda cls: cls.__name__)
def test_every_engine_implements_the_whole_protocol_with_coroutines(engine_cls):
    methods = _protocol_methods()
    assert set(methods) == {"start", "rollout", "rollout_groups", "update", "supervised_update", "sync_weights",
                            "save", "close"}
    for name, spec in methods.items():
        implementation = getattr(engine_cls, name, None)
        assert implementation is not None, f"{engine_cls.__name__} has no {name}()"
        if name == "rollout_groups":  # a stream: an async generator
            assert inspect.isasyncgenfunction(implementation), f"{engine_cls.__name__}.{name} is not an async generator"
        else:
            assert inspect.iscoroutinefunction(implementation), f"{engine_cls.__name__}.{name} is not async"
        expected = [(p.name, p.kind) for p in inspect.signature(spec).parameters.values()]
        actual = [(p.name, p.kind) for p in inspect.signature(implementation).parameters.values()]
        assert actual == expected, f"{engine_cls.__name__}.{name}{inspect.signature(implementation)}"


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.slow
def test_the_local_engine_updates_on_one_dedicated_thread_with_flat_memory(tiny_model_dir, monkeypatch):
    """Per-thread malloc arenas once grew a run by ~3 GB a step when updates moved between
    executor threads. The invariant that prevents it is checked exactly: every update runs on
    the engine's one training thread. The resident-memory bound is a backstop for gross
    growth only: a tiny model's update allocates too little for a wandering arena to show."""
    from rlfactory_core.engines import local
    from rlfactory_core.models import load_tokenizer

    threads, real_update = [], local.update_policy

    def recording_update(*args, **kwargs):
        threads.append(threading.current_thread())
        return real_update(*args, **kwargs)

    monkeypatch.setattr(local, "update_policy", recording_update)
    config = load_config([], ["env=arithmetic", "backend=hf", f"model.name={tiny_model_dir}", "train.bf16=false",
                              "grpo.prompts_per_step=2", "grpo.group_size=2", "rollout.max_turns=1",
                              "rollout.max_tokens_per_turn=16", "rollout.sampling.temperature=1.0"])
    task = build_driver_task(config)
    tokenizer = load_tokenizer(tiny_model_dir)
    samples = list(task.env.dataset(size=2, split="train"))

    async def run() -> list[int]:
        engine = make_engine(config, task, tokenizer, base_path=tiny_model_dir, checkpoint=None)
        assert isinstance(engine, LocalEngine)
        rss = []
        try:
            assert await engine.start() is None
            for step in range(1, 9):
                result = await engine.rollout(samples, rollout_config_for(config, step), group_size=2)
                assert isinstance(result, RolloutResult)
                assert [t.group for t in result.trajectories] == [0, 0, 1, 1]
                batch = build_batch(result.trajectories, result.scored.totals, config, tokenizer.pad_token_id)
                await engine.update(batch, step)
                await engine.sync_weights()
                rss.append(_rss_bytes())
        finally:
            await engine.close()
        return rss

    rss = asyncio.run(run())
    assert len(threads) == 8 and len(set(threads)) == 1, threads
    assert threads[0] is not threading.main_thread() and threads[0].name.startswith("rlf-train")
    growth = rss[-1] - rss[2]  # after two warm-up steps
    assert growth < 64 * 2**20, f"resident memory grew {growth / 2**20:.0f} MB over 5 steps: {rss}"


def test_the_ray_engine_refuses_roles_a_local_cluster_cannot_hold_before_starting_ray(tiny_model_dir):
    import ray

    from rlfactory_core.engines.ray import RayEngine

    if ray.is_initialized():
        pytest.skip("a Ray cluster is already running in this process")  # never in `make test` order
    config = load_config([], ["engine=ray", "ray.num_cpus=1", "ray.trainer.cpus=2", "ray.rollout.cpus=1",
                              f"model.name={tiny_model_dir}"])

    async def run():
        engine = RayEngine(config, base_path=tiny_model_dir, checkpoint=None)
        try:
            await engine.start()
        finally:
            await engine.close()

    with pytest.raises(ConfigError) as info:
        asyncio.run(run())
    assert "CPU: the roles need 3, the local cluster this run would start has 1" in str(info.value)
    assert not ray.is_initialized()


class ReadsTheEnvState:
    name, description = "reads_state", "a reward that needs the rollout's state"

    def score(self, trajectory, sample, context):
        return 0.0


class Registers:
    @hookimpl
    def rlfactory_register_rewards(self, register):
        register(ReadsTheEnvState)


def test_a_judge_pool_reward_that_needs_the_rollouts_state_is_refused_before_the_run():
    with registered_plugin(Registers()):
        config = load_config([], ["engine=ray", 'rewards=[{"name": "reads_state"}]', "ray.judge.rewards=[reads_state]"])
        problems = run_problems(config, purpose="train")
        assert any("ray.judge.rewards: 'reads_state' reads the env state" in p for p in problems), problems
        local = run_problems(config.model_copy(update={"engine": "local"}), purpose="train")
        assert not any("ray.judge.rewards" in p for p in local)
