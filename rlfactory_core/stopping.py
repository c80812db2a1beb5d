"""Stopping a training run on SIGINT / SIGTERM: within seconds, never with half a step.

The first signal is answered at once with a line saying what will happen, and then:

* during a **droppable** phase (a rollout with its rewards, an eval), the phase is
  cancelled, and the cancellation reaches every trajectory in flight: the agent loop, the
  tool calls (an async tool is cancelled; a sync tool's thread is left to finish on its
  own, as with a timeout), and the backend (vLLM aborts the request, the hf backend drops
  it at its next step). The step is dropped: its data position is not advanced and nothing
  of it is written, so a resumed run redoes exactly that step. The run then saves its last
  finished step and stops;
* during the rest of a step (the update, which cannot be undone half-way, the weight sync,
  the checkpoint), the step is finished and saved, and the run stops before the next one;
* before the first step (models loading), the start is cancelled: there is nothing to save.

A second signal stops without saving: the run's task is cancelled wherever it is, and only
the clean-up runs (backends and tool servers are closed, so no process is left behind). A
checkpoint being written when it arrives is finished first: checkpoints are renamed into
place complete (:mod:`rlfactory_core.training.checkpoint`), never left half-written. After the second
signal the previous handlers are back, so a third acts as if rlfactory were not there.

While the run closes its engines and tool servers (:meth:`RunStopper.closing`; vLLM's
shutdown takes seconds), a signal does not cut that short: it says what is happening, and
only the one after it acts as if rlfactory were not there.

Signals are turned into callbacks on the event loop (``call_soon_threadsafe``), so nothing
is interrupted between two bytecodes: a cancellation arrives at an ``await``, where every
component expects one.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any, Awaitable, Callable, TypeVar

__all__ = ["RunStopper", "PhaseDropped"]

T = TypeVar("T")


class PhaseDropped(Exception):
    """A droppable phase was cancelled by a stop request."""


class RunStopper:
    """The stop requests of one run (see the module docstring).

    ``say`` prints a line for the user. The loop tells it where the run is with
    :meth:`at`, runs droppable phases through :meth:`droppable` and checks :attr:`requested`
    between phases."""

    def __init__(self, say: Callable[[str], None]):
        self.signum: int | None = None  # the first signal received
        self.hard = False  # a second signal: stop without saving
        self._say = say
        self._previous: dict[int, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task | None = None
        self._phase: asyncio.Future | None = None
        self._step = 0  # the step in progress (0: none yet)
        self._finished = 0  # the last finished step
        self._updated = False  # the step in progress has its update: it is finished, not dropped
        self._closing = False  # the run is closing its engines: a signal must not cut that short

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def install(self) -> RunStopper:
        """Handle SIGINT and SIGTERM (in the main thread; elsewhere the caller does) until
        :meth:`remove`; call it from the task the second signal should cancel."""
        self._loop = asyncio.get_running_loop()
        self._main = asyncio.current_task()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: the caller handles signals
                pass
        return self

    def remove(self) -> None:
        """Give the signals back to their previous handlers. Idempotent."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def __enter__(self) -> RunStopper:
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def closing(self) -> None:
        """The run is closing its backends and tool servers: a signal now only says so (and
        gives the next one back to the previous handler), so that no process is left behind
        by a user pressing Ctrl-C again while vLLM shuts down."""
        self._closing = True

    def at(self, step: int, *, finished: int) -> None:
        """Step ``step`` is in progress (0: none yet); ``finished`` is the last finished one."""
        self._step, self._finished, self._updated = step, finished, False

    def updated(self) -> None:
        """The step in progress has its update: a stop request finishes and saves it."""
        self._updated = True

    async def droppable(self, phase: Awaitable[T]) -> T:
        """Await ``phase``; raise :class:`PhaseDropped` if a stop request cancels it (or
        came before it started)."""
        if self.requested:
            if asyncio.iscoroutine(phase):
                phase.close()  # never started: no "never awaited" warning
            raise PhaseDropped
        task = asyncio.ensure_future(phase)
        self._phase = task
        try:
            return await task
        except asyncio.CancelledError:
            main = asyncio.current_task()
            if self.requested and not self.hard and main is not None and not main.cancelling():
                raise PhaseDropped from None  # only the phase was cancelled, by the stop request
            raise
        finally:
            self._phase = None

    # -- signals ----------------------------------------------------------------------------

    def _handle(self, signum: int, frame: Any) -> None:
        # Runs between two bytecodes of the main thread: hand the work to the event loop.
        if self._loop is None or self._loop.is_closed():  # left installed by mistake: act as Python would
            self.remove()
            raise KeyboardInterrupt
        self._loop.call_soon_threadsafe(self._on_signal, signum)

    def _on_signal(self, signum: int) -> None:
        again = "Ctrl-C again" if signum == signal.SIGINT else "signal again"
        if self._closing:
            self.remove()
            self._say(f"closing the engines and tool servers first, so that no process is left behind; {again} "
                      "to stop without closing them")
            return
        if self.signum is None:
            self.signum = signum
            if self._updated:
                if self._phase is not None:
                    self._phase.cancel()
                self._say(f"stopping: step {self._step} is saved{' without its eval' if self._phase else ''}; "
                          f"{again} to stop without saving")
            elif self._phase is not None:
                self._phase.cancel()
                if self._step == 0:
                    self._say(f"stopping: no step has finished, nothing to save; {again} to stop at once")
                else:
                    saved = (f"step {self._finished} is saved" if self._finished else "no step has finished, "
                             "nothing to save")
                    self._say(f"stopping: step {self._step} in progress is dropped (redone on resume), {saved}; "
                              f"{again} to stop without saving")
            elif self._step == 0:  # loading: cancel the start, nothing is lost
                self._say("stopping: no step has finished, nothing to save")
                self._stop_now()
            else:
                self._say(f"stopping: step {self._step} finishes its update and is saved; "
                          f"{again} to stop without saving")
            return
        if not self.hard:
            self.hard = True
            self._say("stopping now, without saving")
            self._stop_now()
            self.remove()

    def _stop_now(self) -> None:
        if self._main is not None:
            self._main.cancel()
