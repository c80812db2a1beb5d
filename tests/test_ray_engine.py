"""The ray engine (``engine: ray``) on a real local Ray cluster: an FSDP2 trainer group over
gloo, rollout workers with their own backends, tool actors and a judge pool.

One Ray cluster serves the module (started here with 2 CPUs, as on this machine); the
engines join it, so the tests do not each pay a cluster start.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import signal
import time

import pytest

pytest.importorskip("ray")

import ray  # noqa: E402
import torch  # noqa: E402
from float32_bounds import compare_tensors, tensor_stats  # noqa: E402
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

from rlfactory_core.engines import rollout_config_for  # noqa: E402
from rlfactory_core.engines.local import LocalEngine  # noqa: E402
from rlfactory_core.training.batch import build_batch, micro_batches  # noqa: E402
from rlfactory_core.training.checkpoint import latest_checkpoint  # noqa: E402
from rlfactory_core.config import load_config  # noqa: E402
from rlfactory_core.data import batch_indices  # noqa: E402
from rlfactory_core.errors import ConfigError, RLFactoryError  # noqa: E402
from rlfactory_core.metrics import read_metrics  # noqa: E402
from rlfactory_core.outcomes import result_outcome  # noqa: E402
from rlfactory_core.records import RunRecords  # noqa: E402
from rlfactory_core.engines.ray import RayEngine  # noqa: E402
from rlfactory_core.engines.ray.actors import SharedTool, ToolActor  # noqa: E402
from rlfactory_core.engines.ray.engine import chunks, remote  # noqa: E402
from rlfactory_core.task import build_task  # noqa: E402
from rlfactory_core.resampling import resample_rollout  # noqa: E402
from rlfactory_core.testing import train  # noqa: E402
from rlfactory_core.types import ToolCall  # noqa: E402

pytestmark = pytest.mark.slow

# Two trainer ranks and up to two rollout workers in 2 CPUs: half a CPU each, one torch thread.
RAY_ROLES = ["engine=ray", "ray.trainer.workers=2", "ray.trainer.cpus=0.5", "ray.rollout.cpus=0.5",
             "train.threads=1"]


@pytest.fixture(scope="module")
def ray_cluster():
    # as the engine starts its own (engine.py): workers at nice 0, or `make test`'s other worker starves them
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning", _system_config={"worker_niceness": 0})
    yield
    ray.shutdown()


def tiny_overrides(model_dir, *overrides) -> list[str]:
    return [f"model.name={model_dir}", "backend=hf", "train.bf16=false", "logging.live=off", "grpo.prompts_per_step=4",
            "grpo.group_size=2", "rollout.max_turns=2", "rollout.max_tokens_per_turn=24",
            "rollout.sampling.temperature=1.0", "rollout.sampling.seed=7", *RAY_ROLES, *overrides]


def tiny_config(model_dir, *overrides):
    return load_config([], tiny_overrides(model_dir, *overrides))


def weights_match(ray_weights, local_weights, base, config, lr, optimizer_steps) -> bool:
    """The ranks' update of every tensor within float32's bounds of the local engine's
    (``tests/float32_bounds.py``: checksums per tensor, not single weights, which AdamW's
    division by tiny gradients makes as far apart as their last bits say). Raises naming
    every tensor past its bound."""
    assert set(ray_weights) == set(local_weights) == set(base)
    stats = {name: tensor_stats(local_weights[name], base[name]) for name in base}
    problems = compare_tensors({name: tensor_stats(ray_weights[name], base[name]) for name in base}, stats,
                               [lr] * int(optimizer_steps), label="ray vs local", betas=config.train.betas,
                               weight_decay=config.train.weight_decay, vocab=base["model.embed_tokens.weight"].shape[0])
    assert not problems, "\n".join(problems)
    return True


def model_tokens(trajectory) -> list[list[int]]:
    return [s.token_ids for s in trajectory.segments if s.kind == "model"]


def test_prompts_split_into_contiguous_near_equal_chunks():
    assert chunks(5, 2) == [(0, 3), (3, 5)]
    assert chunks(4, 2) == [(0, 2), (2, 4)]
    assert chunks(1, 3) == [(0, 1)]  # never an empty chunk


def model_turns(trajectory):
    """``(token ids, sampler logprobs)`` of each model turn."""
    return [(s.token_ids, s.logprobs) for s in trajectory.segments if s.kind == "model"]


def same_turns(a, b, tol=1e-4):
    """The same tokens, and logprobs within ``tol`` (float sums in another order, other batches)."""
    turns_a, turns_b = model_turns(a), model_turns(b)
    return [ids for ids, _ in turns_a] == [ids for ids, _ in turns_b] and all(
        abs(x - y) <= tol for (_, la), (_, lb) in zip(turns_a, turns_b) for x, y in zip(la, lb))


async def test_a_rollout_workers_pause_is_undone_by_a_resume_that_overtakes_it_and_by_close():
    """The rollout worker's side of taking turns (no Ray needed: its methods are plain
    coroutines): a second pause while paused does nothing; a resume that arrives while the
    pause is still taking effect (the driver's update cut short) undoes it when it lands;
    closing a paused worker resumes it first (vLLM's close waits for a pause to end)."""
    import types

    from rlfactory_core.engines.ray.actors import RolloutWorker
    from rlfactory_core.rollout import SamplingParams
    from rlfactory_core.rollout.backends.hf import HFBackend

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                                         bos_token_id=None, eos_token_id=None, pad_token_id=None))
    backend = HFBackend(model)
    worker = RolloutWorker.__new__(RolloutWorker)  # not __init__: it sets this process's torch threads
    worker.pause, worker.finished = None, 0
    worker.generation = types.SimpleNamespace(backend=backend, close=backend.close)
    long_turn = SamplingParams(temperature=1.0, max_tokens=400, seed=0)

    assert await worker.pause_generation() >= 0
    assert await worker.pause_generation() is None  # already paused
    await worker.resume_generation()
    running = asyncio.create_task(backend.generate([1, 2, 3], long_turn))
    while backend.stats()["decode_steps"] < 2:
        await asyncio.sleep(0.001)
    pausing = asyncio.create_task(worker.pause_generation())
    await asyncio.sleep(0)  # the pause waits for the decode step under way
    await worker.resume_generation()  # overtakes it
    assert await pausing is None
    assert (await asyncio.wait_for(running, 60)).finish_reason == "length"  # not left paused

    assert await worker.pause_generation() >= 0
    await asyncio.wait_for(worker.close(), 30)
    assert worker.pause is None


def test_one_update_gives_the_local_engines_weights_and_the_rollout_workers_load_them(ray_cluster, tiny_model_dir,
                                                                                      tmp_path):
    """Parity: the same batch, one update (two optimizer steps, KL on a reference model,
    clipping), on the local engine and on 2 FSDP2 ranks over gloo: every tensor's update
    within float32's bounds of the local one (:func:`weights_match`).

    Then the pushed weights are the ones the rollout workers sample from: worker 0 loads
    them in place, worker 1 dies before the push and its replacement starts from them; at
    the next step's seeds both give the local engine's updated trajectories, not the base
    weights' ones. Last, with ``ray.max_restarts=1`` a second lost worker in a step ends it."""
    overrides = ["train.lr=1e-3", "train.max_grad_norm=0.5", "grpo.kl_coef=0.1", "grpo.mini_batches=2",
                 "grpo.micro_batch_tokens=200",  # several micro-batches: uneven rounds between the ranks
                 "ray.rollout.workers=2", "ray.max_restarts=1"]
    config = tiny_config(tiny_model_dir, *overrides)
    local_config = config.model_copy(update={"engine": "local"})
    task = build_task(local_config)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    samples = list(task.env.dataset(size=4, split="train"))

    async def run():
        local = LocalEngine(local_config, task, tokenizer, base_path=tiny_model_dir, checkpoint=None)
        await local.start()
        remote = RayEngine(config, base_path=tiny_model_dir, checkpoint=None)
        try:
            await remote.start()
            rollout_config, next_config = rollout_config_for(config, 1), rollout_config_for(config, 2)
            trajectories, _, _ = await local.rollout(samples, rollout_config, group_size=2)
            ray_trajectories, _, _ = await remote.rollout(samples, rollout_config, group_size=2)
            # same weights, same per-trajectory seeds: the same tokens on both engines
            assert [t.segments[0].token_ids for t in ray_trajectories] == [t.segments[0].token_ids
                                                                          for t in trajectories]
            # each worker numbers its chunk's groups from 0; the driver's are the batch's
            groups = [0, 0, 1, 1, 2, 2, 3, 3]
            assert [t.group for t in ray_trajectories] == [t.group for t in trajectories] == groups
            # resampling (rlfactory_core.resampling; every class resampled here, once): each member again,
            # alone, with its (step, position, member, attempt) seed: the same tokens on both engines
            again = config.model_copy(update={"failures": config.failures.model_copy(
                update={"policy": "resample", "max_resamples": 1})})
            local_scored, ray_scored = (await local.rollout(samples, rollout_config, group_size=2))[1], \
                (await remote.rollout(samples, rollout_config, group_size=2))[1]
            done_before = [await w.rollouts_done.remote() for w in remote.rollout_workers]
            resampled = [await resample_rollout(engine, again, 1, samples, [10, 11, 12, 13], list(t), scored)
                         for engine, t, scored in ((local, trajectories, local_scored),
                                                   (remote, ray_trajectories, ray_scored))]
            (local_members, _, local_replaced), (ray_members, _, ray_replaced) = resampled
            assert len(local_replaced) == len(ray_replaced) == 8
            # the one-prompt rollouts go round the workers (RayEngine._workers_for): 4 each
            assert [await w.rollouts_done.remote() - before
                    for w, before in zip(remote.rollout_workers, done_before)] == [4, 4]
            assert [model_tokens(t) for t in ray_members] == [model_tokens(t) for t in local_members]
            assert [r.trajectory for r in local_replaced] == trajectories  # what each replaced
            assert [t.group for t in local_members] == groups and all(t.metadata["attempt"] == 1 for t in ray_members)
            assert [model_tokens(t) for t in local_members] != [model_tokens(t) for t in trajectories]  # new seeds
            base_next, _, _ = await local.rollout(samples, next_config, group_size=2)  # the base weights' step 2
            rewards = [1.0, 0.0, 0.5, 0.2, 0.0, 1.0, 0.3, 0.3]
            batch = build_batch(trajectories, rewards, config, tokenizer.pad_token_id)
            assert len(micro_batches(list(range(8)), batch["lengths"], 200)) > 2
            # rows 0-3 recorded (rlfactory_core.records): both engines leave their logprobs before the update
            batch["recorded"] = torch.tensor([True] * 4 + [False] * 4)
            local_batch, ray_batch = batch.clone(), batch.clone()
            local_stats = await local.update(local_batch, 1)
            ray_stats = await remote.update(ray_batch, 1)
            recorded = (local_batch["trainer_logprobs"], ray_batch["trainer_logprobs"], batch["loss_mask"])
            await local.sync_weights()
            os.kill(await remote.rollout_workers[1].pid.remote(), signal.SIGKILL)
            await remote.sync_weights()  # worker 0 loads the weights; worker 1 is replaced, from them
            assert remote.restarts == 1
            ray_weights = dict(ray.get(remote.weights))
            local_next, _, _ = await local.rollout(samples, next_config, group_size=2)
            ray_next, _, _ = await remote.rollout(samples, next_config, group_size=2)
            # both workers lost, one replacement allowed: the step fails, saying so
            for worker in remote.rollout_workers:
                os.kill(await worker.pid.remote(), signal.SIGKILL)
            with pytest.raises(RLFactoryError) as used_up:
                await remote.rollout(samples, next_config, group_size=1)
            return (local_stats, ray_stats, dict(local.policy.state_dict()), ray_weights, base_next, local_next,
                    ray_next, used_up.value, recorded)
        finally:
            await remote.close()
            await local.close()

    (local_stats, ray_stats, local_weights, ray_weights, base_next, local_next, ray_next, used_up,
     (local_logprobs, ray_logprobs, mask)) = asyncio.run(run())
    trained = mask[:4].bool()
    assert local_logprobs[:4][trained].abs().sum() > 0 and not ray_logprobs[4:].any()
    assert torch.allclose(ray_logprobs[:4][trained], local_logprobs[:4][trained], atol=1e-5)
    base = LlamaForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert set(ray_weights) == set(local_weights)
    moved = max(float((local_weights[k] - base[k]).abs().max()) for k in base)
    assert moved > 1e-4  # the update did change the weights
    assert weights_match(ray_weights, local_weights, base, config, local_stats["train/lr"],
                         local_stats["train/optimizer_steps"])
    for key in ("train/loss", "train/grad_norm", "train/kl", "train/entropy", "train/trained_tokens",
                "train/optimizer_steps", "train/lr"):
        assert ray_stats[key] == pytest.approx(local_stats[key], rel=1e-5, abs=1e-7), key

    # trajectories 0-3 come from worker 0 (weights loaded in place), 4-7 from worker 1's replacement:
    # each is the updated local policy's (logprobs within 1e-6, measured) and none is the base
    # weights' (other tokens, or logprobs 0.05 or more apart, measured)
    assert all(same_turns(r, t) for r, t in zip(ray_next, local_next, strict=True))
    assert not any(same_turns(t, b) for t, b in zip(local_next, base_next, strict=True))
    # and each says so: sampled by version 1 (one update), the replacement worker's too
    assert {s.policy_version for t in ray_next + local_next for s in t.segments if s.kind == "model"} == {1}
    assert {s.policy_version for t in base_next for s in t.segments if s.kind == "model"} == {0}
    assert re.match(r"rollout worker [01] died and the 1 replacement\(s\) a step that ray.max_restarts allows "
                    r"are used up \(\w+Error", used_up.message), used_up.message
    assert "raise ray.max_restarts" in used_up.hint


def test_the_cold_start_warm_up_on_two_ranks_gives_the_local_engines_weights(ray_cluster, tiny_model_dir):
    """Parity of ``supervised_update`` (the cold start's warm-up, rlfactory_core.training.cold_start):
    the same examples, two passes of two optimizer steps, on the local engine and on 2 FSDP2
    ranks over gloo (uneven micro-batch rounds), within the update test's tolerance."""
    from rlfactory_core.training.cold_start import example_batch

    config = tiny_config(tiny_model_dir, "cold_start.lr=1e-3", "cold_start.epochs=2", "cold_start.batch_size=2",
                         "grpo.micro_batch_tokens=200", "train.max_grad_norm=0.5")
    local_config = config.model_copy(update={"engine": "local"})
    task = build_task(local_config)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    samples = list(task.env.dataset(size=2, split="train"))

    async def run():
        local = LocalEngine(local_config, task, tokenizer, base_path=tiny_model_dir, checkpoint=None)
        await local.start()
        remote = RayEngine(config, base_path=tiny_model_dir, checkpoint=None)
        try:
            await remote.start()
            trajectories, _, _ = await local.rollout(samples, rollout_config_for(config, 1), group_size=2)
            batch = example_batch(trajectories, tokenizer.pad_token_id)
            assert len(micro_batches(list(range(4)), batch["lengths"], 200)) > 2
            local_stats = await local.supervised_update(batch.clone())
            ray_stats = await remote.supervised_update(batch.clone())
            await remote.sync_weights()
            return local_stats, ray_stats, dict(local.policy.state_dict()), dict(ray.get(remote.weights))
        finally:
            await remote.close()
            await local.close()

    local_stats, ray_stats, local_weights, ray_weights = asyncio.run(run())
    base = LlamaForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert max(float((local_weights[k] - base[k]).abs().max()) for k in base) > 1e-4
    assert local_stats["cold_start/optimizer_steps"] == ray_stats["cold_start/optimizer_steps"] == 4
    assert weights_match(ray_weights, local_weights, base, config, config.cold_start.lr, 4)
    for key in ("cold_start/loss_start", "cold_start/loss_last_epoch", "cold_start/grad_norm",
                "cold_start/trained_tokens"):
        assert ray_stats[key] == pytest.approx(local_stats[key], rel=1e-5, abs=1e-7), key


def test_a_killed_rollout_worker_is_replaced_and_its_prompts_run_again_or_it_gets_the_new_weights(ray_cluster, tiny_model_dir):
    config = tiny_config(tiny_model_dir, "ray.rollout.workers=2", "ray.trainer.workers=1")
    task = build_task(config.model_copy(update={"engine": "local"}))
    samples = list(task.env.dataset(size=6, split="train"))

    async def run():
        engine = RayEngine(config, base_path=tiny_model_dir, checkpoint=None)
        try:
            await engine.start()
            await engine.sync_weights()  # a replacement must start from the synced weights
            victim = await engine.rollout_workers[0].pid.remote()
            # frozen before the step: it holds its chunk until killed, however fast the rollout is
            os.kill(victim, signal.SIGSTOP)
            step = asyncio.ensure_future(engine.rollout(samples, rollout_config_for(config, 1), group_size=2))
            for _ in range(2400):  # until worker 1 is done: worker 0's chunk is all the step waits for
                if await engine.rollout_workers[1].rollouts_done.remote() == 1:
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("rollout worker 1 did not finish its chunk within 120 s")
            assert not step.done()
            os.kill(victim, signal.SIGKILL)
            trajectories, scored, times = await step
            replacement = await engine.rollout_workers[0].pid.remote()
            restarts = engine.restarts
            # a worker lost between its rollout and the weight push is replaced by the push
            idle = await engine.rollout_workers[1].pid.remote()
            os.kill(idle, signal.SIGKILL)
            await asyncio.sleep(0.5)
            sync = await engine.sync_weights()
            assert engine.restarts == restarts + 1 and sync["weight_sync/mb"] > 0
            # worker 0 took the push in place (its generation held meanwhile); worker 1's replacement started on it
            assert sync["weight_sync/pause_s"] > 0
            assert await engine.rollout_workers[1].pid.remote() != idle
            again, _, _ = await engine.rollout(samples[-2:], rollout_config_for(config, 1), group_size=1)
            assert len(again) == 2
            return trajectories, scored, times, victim, replacement, restarts
        finally:
            await engine.close()

    trajectories, scored, times, victim, replacement, restarts = asyncio.run(run())
    assert restarts == 1 and replacement != victim
    assert times["ray/rollout_worker_restarts"] == 1
    assert len(trajectories) == len(scored.totals) == 12
    assert [t.sample_id for t in trajectories] == [s["id"] for s in samples for _ in range(2)]


def test_a_streamed_rollout_outlives_a_killed_worker_and_sends_each_group_once(ray_cluster, tiny_model_dir):
    """rollout_groups (the async schedule's): each worker streams its chunk's groups back; a
    worker killed mid-stream is replaced and its chunk runs again, no group sent twice, and
    the groups are those rollout() gives."""
    config = tiny_config(tiny_model_dir, "ray.rollout.workers=2", "ray.trainer.workers=1")
    task = build_task(config.model_copy(update={"engine": "local"}))
    samples = list(task.env.dataset(size=6, split="train"))

    async def run():
        engine = RayEngine(config, base_path=tiny_model_dir, checkpoint=None)
        try:
            await engine.start()
            await engine.sync_weights()
            whole, _, _ = await engine.rollout(samples, rollout_config_for(config, 1), group_size=2)
            victim = await engine.rollout_workers[0].pid.remote()
            os.kill(victim, signal.SIGSTOP)  # holds its chunk (groups 0-2) until killed
            groups = []
            async for group in engine.rollout_groups(samples, rollout_config_for(config, 1), group_size=2):
                groups.append(group)
                if len(groups) == 3:  # worker 1's chunk is in: only the frozen worker's is left
                    os.kill(victim, signal.SIGKILL)
            assert engine.restarts == 1
            # two streams at once, as an async schedule's overlapping chunks, each with a chunk on a
            # frozen worker: its death is one replacement (a second would wait forever for the
            # bundle the first holds), both streams finish, and the next push reaches the new worker
            victim = await engine.rollout_workers[0].pid.remote()
            os.kill(victim, signal.SIGSTOP)

            async def collect(chunk):
                return [group async for group in engine.rollout_groups(chunk, rollout_config_for(config, 2),
                                                                      group_size=2)]

            both = asyncio.gather(collect(samples), collect(samples[:4]))
            await asyncio.sleep(1.0)  # both streams' calls are queued on the frozen worker
            os.kill(victim, signal.SIGKILL)
            overlapping = await asyncio.wait_for(both, 120)
            pushed = await asyncio.wait_for(engine.sync_weights(), 120)
            return whole, groups, engine.restarts, overlapping, pushed
        finally:
            await engine.close()

    whole, groups, restarts, overlapping, pushed = asyncio.run(run())
    assert restarts == 2  # one for each death
    assert [sorted(g.index for g in stream) for stream in overlapping] == [list(range(6)), list(range(4))]
    assert pushed["weight_sync/pause_s"] > 0  # both workers took it in place, the replacement too
    assert sorted(group.index for group in groups) == list(range(6))  # each once
    assert {group.index for group in groups[:3]} == {3, 4, 5}  # the live worker's came first
    for group in groups:
        assert [t.group for t in group.trajectories] == [group.index] * 2
        assert len(group.scored.totals) == 2
        expected = whole[2 * group.index:2 * group.index + 2]
        assert all(same_turns(a, b) for a, b in zip(group.trajectories, expected))


def test_roles_the_cluster_cannot_hold_are_refused_with_what_it_has(ray_cluster, tiny_model_dir):
    config = tiny_config(tiny_model_dir, "ray.trainer.cpus=4", "ray.rollout.gpus=1")

    async def run():
        engine = RayEngine(config, base_path=tiny_model_dir, checkpoint=None)
        try:
            await engine.start()
        finally:
            await engine.close()

    with pytest.raises(ConfigError) as info:
        asyncio.run(run())
    text = str(info.value)
    assert "CPU: the roles need 9, the cluster has 2" in text
    assert "GPU: the roles need 2, the cluster has 0" in text


def test_a_shared_tool_serves_calls_and_its_failures_become_tool_errors(ray_cluster):
    from rlfactory_core.default_plugins.tool_managers import ConcurrentToolManager

    config = load_config([], ["env=arithmetic", *RAY_ROLES, "ray.tool_actors.names=[calculator]"])
    actor = remote(ToolActor).options(max_restarts=-1, num_cpus=0.1).remote(config.model_dump(mode="json"),
                                                                               "calculator")

    async def run():
        name, description, parameters = await actor.describe.remote()
        manager = ConcurrentToolManager([SharedTool(name, description, parameters, actor)])
        call = ToolCall(name="calculator", arguments={"expression": "6 * 7"}, id="1")
        first = await manager.call([call])
        ray.kill(actor, no_restart=False)  # a crash: Ray restarts the actor
        for _ in range(100):  # calls meanwhile are transient errors (retried, then shown to the model)
            after_restart = await manager.call([call])
            if after_restart[0].ok:
                break
            await asyncio.sleep(0.2)
        ray.kill(actor, no_restart=True)  # gone for good, once the kill lands (it is asynchronous)
        for _ in range(100):
            try:
                await actor.describe.remote()
            except ray.exceptions.RayActorError:
                break
            await asyncio.sleep(0.1)
        gone = await manager.call([call])
        return first, after_restart, gone

    first, after_restart, gone = asyncio.run(run())
    assert first[0].ok and "42" in first[0].content
    assert after_restart[0].ok and "42" in after_restart[0].content
    assert not gone[0].ok and "actor is unavailable" in gone[0].content  # what the model reads
    assert gone[0].metadata["attempts"] == 3  # the manager's retries (max_retries=2) were used
    assert result_outcome(gone[0]) == "tool_unavailable"  # the infrastructure's, not the model's call's


def test_rlf_train_engine_ray_trains_with_tools_a_judge_pool_and_resumes_locally(ray_cluster, default_model_dir,
                                                                                  tmp_path):
    """The embedded model on the arithmetic tool task: a step on 2 FSDP2 ranks, 2 rollout
    workers, the calculator on a tool actor, exact_match on the judge pool, the held-out
    evaluation after the weight push; then one more step on the local engine from the ray run's
    checkpoint. (One step on ray: the 135M model's steps cost ~40 s each here, and the tiny
    model's tests below take the ray engine through many steps.)"""
    run_dir = tmp_path / "run"
    config = load_config([], ["env=arithmetic", "backend=hf", "grpo.prompts_per_step=2", "grpo.group_size=2",
                              "data.eval_size=2", "eval.every=0", "eval.save_samples=2", "rollout.max_turns=2",
                              "rollout.max_tokens_per_turn=40", "rollout.sampling.temperature=0.7",
                              "logging.live=off", "logging.tensorboard=false", "train.steps=1",
                              f"run_dir={run_dir}", *RAY_ROLES, "ray.rollout.workers=2", "ray.trainer.cpus=0.45",
                              "ray.rollout.cpus=0.45",
                              "ray.tool_actors.names=[calculator]", "ray.tool_actors.cpus=0.01",
                              "ray.judge.rewards=[exact_match]", "ray.judge.cpus=0.01"])
    train(config)
    metrics = read_metrics(run_dir)
    steps = [m for m in metrics if m.get("train/optimizer_steps")]
    assert [m["step"] for m in steps] == [1]
    # the model used the shared calculator (in training or in the evaluations, on the workers)
    assert sum(m.get("rollout/tool_calls", 0) + m.get("eval/tools/trajectories_with_calls", 0) for m in metrics) > 0
    assert all(m["tools/errors"] == 0 for m in steps if "tools/errors" in m)
    assert all("reward/exact_match" in m and m["reward/errors"] == 0 for m in steps)  # scored on the pool
    assert all(m["weight_sync/mb"] > 100 for m in steps)
    # each trajectory classified on the rollout workers (rlfactory_core.outcomes): nothing of the services failed
    assert all(m["outcome/infrastructure"] == 0.0 for m in steps)
    evaluated = [m for m in metrics if m["step"] == 1 and "eval/reward/exact_match" in m]
    assert evaluated and evaluated[0]["eval/reward/errors"] == 0  # on the workers, after the push
    assert latest_checkpoint(run_dir).name == "step-000001"
    saved = json.loads((latest_checkpoint(run_dir) / "state.json").read_text())
    assert saved["position"] == 2

    local = copy.deepcopy(config).model_copy(update={"engine": "local"})
    local.train.steps = 2
    train(local, resume=run_dir)
    assert latest_checkpoint(run_dir).name == "step-000002"
    assert [m["step"] for m in read_metrics(run_dir) if m.get("train/optimizer_steps")] == [1, 2]


def test_a_local_checkpoint_resumes_on_the_ray_engine_with_separate_placement(ray_cluster, tiny_model_dir, tmp_path,
                                                                             capsys):
    """Steps of the ray engine with ``ray.placement=separate`` (2 trainer ranks and the
    rollout worker in placement groups of their own), resumed from a local checkpoint, in
    ``one_step_off``: step 3 rolls out on the worker while step 2 trains on the ranks. (``async``
    takes the colocated path, generation paused for each update, in the next test, through a
    kill and a stop.)"""
    run_dir = tmp_path / "run"
    config = tiny_config(tiny_model_dir, "engine=local", "train.steps=1", "data.eval_size=2", "eval.every=0",
                         f"run_dir={run_dir}", "logging.tensorboard=false", "train.lr=1e-3",
                         "ray.placement=separate", "logging.record_train_groups=4")
    train(config)
    on_ray = config.model_copy(update={"engine": "ray"})
    on_ray.train.steps, on_ray.train.mode, on_ray.grpo.tis_cap = 3, "one_step_off", 2.0
    train(on_ray, resume=run_dir)
    assert "2 trainer rank(s), 1 rollout worker(s), placement separate" in capsys.readouterr().out
    assert latest_checkpoint(run_dir).name == "step-000003"
    # each step trained, with an optimizer step or not (a zero gradient takes none)
    resumed = [m for m in read_metrics(run_dir) if "train/loss" in m]
    assert [m["step"] for m in resumed] == [1, 2, 3] and "weight_sync/mb" in resumed[-1]
    assert resumed[-1]["train/trained_tokens"] > 0
    # every prompt once, in the synchronous order
    from rlfactory_arithmetic import ArithmeticEnv

    ids = [s["id"] for s in ArithmeticEnv().dataset(split="train")]
    assert [s for m in resumed for s in m["samples"]] == [ids[i] for i in batch_indices(len(ids), 12, seed=0,
                                                                                           position=0)]
    # the rollout worker started from the checkpoint's weights (version 1) and took the next push's;
    # step 3 rolled out during step 2's update: its tokens one version old at most
    recorded = RunRecords(run_dir)
    assert {r["policy_version"] for r in recorded.list("train", 2)} == {1}
    assert {r["policy_version"] for r in recorded.list("train", 3)} <= {1, 2}
    assert resumed[-1]["train/stale_token_fraction"] >= 0
    assert {r["policy_version"] for r in recorded.list("eval", 3)} == {3}
    assert json.loads((latest_checkpoint(run_dir) / "state.json").read_text())["policy_version"] == 3


_KILLED_ON_RAY = """
import os, signal, sys
from rlfactory_core.config import load_config
from rlfactory_core.engines.ray import engine as ray_engine
from rlfactory_core.testing import train

real, calls = ray_engine.RayEngine.update, []

async def update(self, batch, step):
    calls.append(step)
    if len(calls) == 1:  # a rollout worker dies while later steps' chunks are on it or queued for it
        os.kill(await self.rollout_workers[0].pid.remote(), signal.SIGKILL)
    else:  # the whole run dies in the next update, steps in flight, nothing saved
        os.kill(os.getpid(), signal.SIGKILL)
    return await real(self, batch, step)

ray_engine.RayEngine.update = update
train(load_config([], sys.argv[2:]), resume=sys.argv[1])
"""


def test_async_on_ray_trains_every_prompt_once_across_a_killed_worker_a_sigkill_a_stop_and_resumes(
        ray_cluster, tiny_model_dir, tmp_path, monkeypatch, capsys):
    """``train.mode=async`` on the ray engine (colocated: the rollout worker's generation paused
    for each update; 2 trainer ranks, a rollout worker streaming its groups, 2 steps rolled out
    ahead) from a local checkpoint: in step 2's update the paused rollout worker is killed
    (replaced, its chunks run again); in step 3's the
    driver is SIGKILLed (nothing saved); the resume is stopped by SIGINT in step 4's update (step
    4 saved, steps 5-6 in flight dropped); the last resume finishes. Every step is logged and
    recorded once, each prompt trained once in the synchronous order, no token over the bound."""
    import subprocess
    import sys

    from rlfactory_arithmetic import ArithmeticEnv

    from rlfactory_core.engines.ray import engine as ray_engine
    from rlfactory_core.testing import TrainingInterrupted

    run_dir = tmp_path / "run"
    overrides = [f"run_dir={run_dir}", "train.steps=6", "data.eval_size=2", "eval.every=0", "train.lr=1e-3",
                 "logging.tensorboard=false", "logging.record_train_groups=4", "checkpoint.every=1"]
    train(tiny_config(tiny_model_dir, *overrides, "engine=local", "train.steps=1"))
    on_ray = [*overrides, "train.mode=async", "train.max_staleness=2", "grpo.tis_cap=2.0"]
    argv = [str(run_dir), *tiny_overrides(tiny_model_dir, *on_ray)]
    killed = subprocess.run([sys.executable, "-c", _KILLED_ON_RAY, *argv], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address})
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-3000:] + killed.stderr[-3000:]
    assert "rollout worker 0 died" in killed.stdout + killed.stderr
    state = json.loads((latest_checkpoint(run_dir) / "state.json").read_text())
    assert (state["step"], state["position"]) == (2, 8)  # steps 3-4's prompts were in flight: not counted
    for _ in range(600):  # the killed driver's actors and placement groups are gone once Ray sees it dead
        if ray.available_resources().get("CPU", 0) >= 2:
            break
        time.sleep(0.1)

    real, calls = ray_engine.RayEngine.update, []

    async def stopped_in_the_second_update(self, batch, step):
        calls.append(step)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(0.2)
        return await real(self, batch, step)

    config = tiny_config(tiny_model_dir, *on_ray)
    monkeypatch.setattr(ray_engine.RayEngine, "update", stopped_in_the_second_update)
    with pytest.raises(TrainingInterrupted) as stopped:
        train(config, resume=run_dir)
    assert stopped.value.message.startswith("step 4 is saved")
    monkeypatch.setattr(ray_engine.RayEngine, "update", real)
    train(config, resume=run_dir)
    assert "placement colocated (generation pauses while the ranks update)" in capsys.readouterr().out

    steps = [m for m in read_metrics(run_dir) if m["step"] >= 1]
    assert [m["step"] for m in steps] == [1, 2, 3, 4, 5, 6]
    # each update on ray took its turn, but step 2's: its worker was killed just before
    assert [m["step"] for m in steps if m.get("time/pause_generation", -1) >= 0] == [3, 4, 5, 6]
    ids = [s["id"] for s in ArithmeticEnv().dataset(split="train")]
    assert [s for m in steps for s in m["samples"]] == [ids[i] for i in batch_indices(len(ids), 24, seed=0,
                                                                                         position=0)]
    recorded = RunRecords(run_dir)
    for m in steps:  # recorded once: each step's groups, none from the killed or the dropped steps
        rows = recorded.list("train", m["step"])
        assert sorted(r["sample_id"] for r in rows) == sorted(m["samples"] * 2), m["step"]
        versions = {r["policy_version"] for r in rows}
        assert max(m["step"] - 1 - v for v in versions) <= (0 if m["step"] == 1 else 2), (m["step"], versions)
    assert json.loads((latest_checkpoint(run_dir) / "state.json").read_text())["policy_version"] == 6


def test_async_with_no_staleness_on_ray_is_the_synchronous_run(ray_cluster, tiny_model_dir, tmp_path):
    """``max_staleness: 0`` through the async loop on the ray engine (the rollout worker
    streams its groups): the synchronous run's prompts, trajectories and updates, bit for bit."""
    from safetensors.torch import load_file

    runs = {}
    for name, extra in (("sync", []), ("async", ["train.mode=async", "train.max_staleness=0"])):
        runs[name] = tmp_path / name
        train(tiny_config(tiny_model_dir, "train.steps=2", "data.eval_size=2", "eval.every=0", "train.lr=1e-3",
                          "logging.tensorboard=false", "logging.record_train_groups=4", f"run_dir={runs[name]}",
                          *extra))
    metrics = {name: {r["step"]: r for r in read_metrics(run)} for name, run in runs.items()}
    records = {name: RunRecords(run) for name, run in runs.items()}
    for step in (1, 2):
        sync, asynchronous = metrics["sync"][step], metrics["async"][step]
        for key in ("samples", "reward/mean", "train/trained_tokens", "train/loss", "train/grad_norm"):
            assert sync[key] == asynchronous[key], (step, key)
        for row in records["sync"].list("train", step):
            a, b = (records[name].trajectory("train", step, row["index"]) for name in ("sync", "async"))
            assert a["sample_id"] == b["sample_id"]
            assert [s["token_ids"] for s in a["sequences"]] == [s["token_ids"] for s in b["sequences"]]
    weights = {name: load_file(latest_checkpoint(run) / "model" / "model.safetensors") for name, run in runs.items()}
    assert all(torch.equal(weights["sync"][key], weights["async"][key]) for key in weights["sync"])


JOIN = """
import json, sys
import ray
from rlfactory_core.config import load_config
from rlfactory_core.errors import RLFactoryError
from rlfactory_core.engines.ray import RayEngine

out = {}
try:  # ray.address wins over RAY_ADDRESS
    RayEngine(load_config([], ["engine=ray", "ray.address=" + sys.argv[1]]), base_path=".", checkpoint=None)._connect()
except RLFactoryError as exc:
    out["refused"] = [exc.message, exc.hint]
engine = RayEngine(load_config([], ["engine=ray"]), base_path=".", checkpoint=None)
engine._connect()  # RAY_ADDRESS
out["joined"] = [ray.get_runtime_context().gcs_address, engine.started_ray, ray.cluster_resources().get("CPU")]
print(json.dumps(out))
"""


def test_a_run_joins_the_cluster_at_ray_address_and_a_dead_address_is_refused_at_once(ray_cluster):
    """In another process, as ``RAY_ADDRESS=... rlf train`` would: the module's cluster is
    joined, not a new one started; an address where nothing listens is refused in seconds
    (ray.init alone retries it for many minutes)."""
    import socket
    import subprocess
    import sys

    address = ray.get_runtime_context().gcs_address
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    result = subprocess.run([sys.executable, "-c", JOIN, dead], capture_output=True, text=True, timeout=240,
                            env={**os.environ, "RAY_ADDRESS": address})
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["joined"] == [address, False, 2.0]  # this cluster, not one the engine started
    message, hint = out["refused"]
    assert message.startswith(f"cannot join the Ray cluster at {dead}: nothing answers at {dead}"), message
    assert "ray start --head" in hint  # fast: a hang in ray.init would hit the subprocess timeout


def test_a_family_other_than_the_template_trains_on_ray(ray_cluster, tmp_path):
    """The rollout workers build the run's family (auto: qwen3, from a Qwen3 tokenizer) in
    their own processes; the trainer ranks' checkpoint records it."""
    from rlfactory_core.families import tokenizer_sha256
    from rlfactory_core.models import load_tokenizer
    from rlfactory_core.records import RunRecords
    from rlfactory_core.testing import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny-qwen3", "qwen3", architecture="qwen3")
    run_dir = tmp_path / "run"
    train(tiny_config(model, "train.steps=1", "data.eval_size=2", "eval.every=0", "checkpoint.every=1",
                      "env_options={few_shot: false}", "cold_start.source=off", f"run_dir={run_dir}"))
    tokenizer = load_tokenizer(model)
    recorded = RunRecords(run_dir)
    for row in recorded.list("train", 1):
        [sequence] = recorded.trajectory("train", 1, row["index"])["sequences"]
        text = tokenizer.decode(sequence["token_ids"])
        assert text.startswith("<|im_start|>system\n") and "<tools>" in text  # the qwen3 family's prompt
    state = json.loads((latest_checkpoint(run_dir) / "state.json").read_text())
    assert state["family"] == "qwen3" and state["tokenizer_sha256"] == tokenizer_sha256(tokenizer)
