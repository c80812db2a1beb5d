"""Oldest step first (rlfactory_core.rollout.priority, ``train.generation_order``): the gate's
rule on hand-made requests, then in a real asynchronous run whose steps' rollouts overlap."""

from __future__ import annotations

import asyncio

import pytest

from rlfactory_core.config import load_config
from rlfactory_core.rollout.priority import OldestFirstGate, gated
from rlfactory_core.testing import ScriptedBackend

from test_async_mode import TINY, SeededPolicy


def test_a_turn_waits_for_older_steps_only_and_never_stops_one_generating():
    async def scenario():
        gate, events, release = OldestFirstGate(), [], {}

        async def request(name, priority):
            release[name] = asyncio.Event()
            async with gate.slot(priority):
                events.append(f"+{name}")
                await release[name].wait()
                events.append(f"-{name}")

        def start(name, priority):
            task = asyncio.ensure_future(request(name, priority))
            return task

        async def settle():
            for _ in range(5):
                await asyncio.sleep(0)

        tasks = {"b2": start("b2", 2)}
        await settle()
        tasks["a1"] = start("a1", 1)  # older than one generating: starts at once, b2 goes on
        await settle()
        tasks["c2"] = start("c2", 2)  # a1 (older) generates: held
        tasks["e3"] = start("e3", 3)  # held by a1, and then by c2 waiting
        tasks["n"] = start("n", None)  # no priority: passes, holds no one
        await settle()
        assert events == ["+b2", "+a1", "+n"]
        release["a1"].set()
        await settle()
        assert events == ["+b2", "+a1", "+n", "-a1", "+c2"]  # e3 still held: b2 and c2 (older) generate
        release["n"].set()
        release["b2"].set()
        await settle()
        assert "+e3" not in events
        release["c2"].set()
        await settle()
        assert events[-1] == "+e3"
        release["e3"].set()
        await asyncio.gather(*tasks.values())
        assert gate.held_s > 0

        # a request cancelled while held leaves nothing behind: a later one is not held by it
        events.clear()
        tasks = {"f1": start("f1", 1)}
        await settle()
        tasks["g2"] = start("g2", 2)
        await settle()
        tasks["g2"].cancel()
        await settle()
        release["f1"].set()
        await settle()
        tasks["h3"] = start("h3", 3)
        await settle()
        assert events == ["+f1", "-f1", "+h3"]
        release["h3"].set()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        assert not gate._older_than(10**9)

    asyncio.run(scenario())


def test_a_gated_backend_is_the_backend_for_everything_but_the_order():
    class Backend:
        max_model_len, weight_version = 123, 7

        async def generate(self, prompt_ids, sampling, **options):
            return (list(prompt_ids), sampling, options)

    backend, gate = Backend(), OldestFirstGate()
    assert gated(backend, None, 3) is backend and gated(backend, gate, None) is backend
    proxy = gated(backend, gate, 3)
    assert (proxy.max_model_len, proxy.weight_version) == (123, 7)
    assert asyncio.run(proxy.generate([1], "s", images=["i"])) == ([1], "s", {"images": ["i"]})


def test_the_order_applies_where_rollouts_overlap_on_a_cpu(monkeypatch):
    import torch

    from rlfactory_core.engines.local import oldest_first

    def config(*overrides):
        return load_config([], ["grpo.tis_cap=2.0", *overrides])

    assert not oldest_first(config("train.mode=sync", "train.generation_order=oldest_first"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert oldest_first(config("train.mode=async")) and oldest_first(config("train.mode=one_step_off"))
    assert not oldest_first(config("train.mode=async", "train.generation_order=backend"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU batches more nearly for free
    assert not oldest_first(config("train.mode=async"))
    assert oldest_first(config("train.mode=async", "train.generation_order=oldest_first"))


class TimedPolicy(SeededPolicy):
    """:class:`SeededPolicy`, noting which step each call is for (the sampling seed says:
    ``rollout_config_for`` adds 10,007 a step to seeds smaller than that) while it generates,
    and every call that started while an older step's call was generating."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.generating: list[int] = []
        self.overtaken: list[tuple[int, list[int]]] = []
        self.steps: set[int] = set()

    async def generate(self, prompt_ids, sampling, **options):
        step = sampling.seed // 10_007
        self.steps.add(step)
        if any(s < step for s in self.generating):
            self.overtaken.append((step, list(self.generating)))
        self.generating.append(step)
        try:
            await asyncio.sleep(0.02)
            return await super().generate(prompt_ids, sampling, **options)
        finally:
            self.generating.remove(step)


@pytest.mark.parametrize("order", ["oldest_first", "backend"])
def test_in_an_async_run_no_turn_of_a_later_step_starts_while_an_older_one_generates(tmp_path, tiny_model_dir,
                                                                                      order):
    """``max_staleness: 2``: steps 1 to 3 roll out at once from the start. Oldest first, no
    later step's turn starts while an older step's generates; left to the backend (the
    control), they do, so the run is one where the order matters."""
    from rlfactory_core.models import load_tokenizer
    from rlfactory_core.testing import scripted_backend, train

    policies = []

    def policy(path):
        policies.append(TimedPolicy(load_tokenizer(path)))
        return policies[-1]

    with scripted_backend(policy):
        train(load_config([], [*TINY, "train.max_staleness=2", "train.steps=4", f"train.generation_order={order}",
                               "grpo.group_size=3", f"model.name={tiny_model_dir}", f"run_dir={tmp_path / 'run'}"]))
    (timed,) = policies
    assert timed.steps == {-1, 1, 2, 3, 4}  # -1: the evaluations' seeds (before and after training)
    if order == "oldest_first":
        assert timed.overtaken == []
    else:
        assert timed.overtaken
