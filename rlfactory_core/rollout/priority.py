"""Oldest step first: a gate in front of one generation backend for the schedules that overlap
rollouts (``train.mode`` one_step_off and async, ``train.generation_order``).

Each generation request carries the step it is for (its *priority*: lower is older). A request
starts only when no request of an older step is generating or waiting to; requests already
generating are never stopped. So the step the trainer waits for gets the backend to itself
while it has turns to generate, and a later step's turns fill the gaps: while the older
step's trajectories wait for tools, and after its last turn. Nothing is dropped or reordered
inside a step, and a step never waits for a later one, so the gate cannot deadlock.

Why: on a CPU a decode step costs about in proportion to the sequences in it, so a later
step's turns batched with the older step's slow the older step down by their share, and the
trainer waits for the older step (``bench/async_modes.py``: async 0.88x of sync without it on
the compute-bound workload, where ``one_step_off``, whose next rollout starts only when the
step's is in, reached 1.02x). On a GPU a bigger batch is nearly free, so ``auto`` leaves the
order to the backend there.

A request without a priority (the cold start, ``rlf eval``) passes the gate and holds no one up.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Any, AsyncIterator, Sequence

__all__ = ["OldestFirstGate", "gated"]


class OldestFirstGate:
    """Admission of one backend's requests by priority (see the module docstring); also the
    seconds requests spent held at it (``held_s``), a later step's cost of the order."""

    def __init__(self) -> None:
        self._generating: collections.Counter[int] = collections.Counter()
        self._waiting: collections.Counter[int] = collections.Counter()
        self._changed: asyncio.Condition | None = None  # made in the loop that first uses it
        self.held_s = 0.0

    def _older_than(self, priority: int) -> bool:
        return any(p < priority for p in (*self._generating, *self._waiting))

    @contextlib.asynccontextmanager
    async def slot(self, priority: int | None) -> AsyncIterator[None]:
        """Held while one request generates; entered once no older request generates or waits."""
        if priority is None:
            yield
            return
        if self._changed is None:
            self._changed = asyncio.Condition()
        changed = self._changed
        loop = asyncio.get_running_loop()
        async with changed:
            self._waiting[priority] += 1
            held_from = loop.time()
            try:
                await changed.wait_for(lambda: not self._older_than(priority))
            finally:
                _take(self._waiting, priority)
                self.held_s += loop.time() - held_from
                changed.notify_all()  # a later step may wait on this one's waiting, not only its generating
            self._generating[priority] += 1
        try:
            yield
        finally:
            async with changed:
                _take(self._generating, priority)
                changed.notify_all()


def _take(counter: collections.Counter[int], key: int) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


class _GatedBackend:
    """``backend`` whose ``generate`` passes ``gate`` at ``priority``; everything else is the
    backend's own (its context length, weight version)."""

    def __init__(self, backend: Any, gate: OldestFirstGate, priority: int):
        self._backend, self._gate, self._priority = backend, gate, priority

    async def generate(self, prompt_ids: Sequence[int], sampling: Any, **kwargs: Any) -> Any:
        async with self._gate.slot(self._priority):
            return await self._backend.generate(prompt_ids, sampling, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


def gated(backend: Any, gate: OldestFirstGate | None, priority: int | None) -> Any:
    """``backend`` behind ``gate`` at ``priority``; the backend itself when either is None."""
    if gate is None or priority is None:
        return backend
    return _GatedBackend(backend, gate, priority)
