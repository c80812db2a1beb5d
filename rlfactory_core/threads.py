"""Daemon threads for sync work: the tool thread pool and the pools rewards and engines use.

Sync functions (function tools and every qwen-agent tool) run in a dedicated pool of
:data:`TOOL_THREADS` daemon threads, never in asyncio's small default executor, so a few
hanging tools cannot starve the others or block ``asyncio.run``'s shutdown. A thread
running a hung sync function cannot be killed: the tool manager's timeout frees the
trajectory, not the thread, which stays busy until the function returns (and enough hung
threads exhaust the pool). Write tools that may block for long as ``async def``, where a
timeout really cancels the work.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import os
import queue
import threading
from typing import Any, Callable

__all__ = ["DaemonThreadPool", "run_in_tool_thread", "TOOL_THREADS"]

#: Worker threads of the pool that runs sync tools (shared by the whole process).
TOOL_THREADS = 64


class DaemonThreadPool(concurrent.futures.Executor):
    """A minimal thread pool whose workers are daemon threads.

    ``ThreadPoolExecutor`` joins its workers at interpreter exit, so a single hung tool
    would keep a finished training run from exiting; a daemon worker does not. Threads are
    started on demand, up to ``max_workers``, and reused.
    """

    def __init__(self, max_workers: int, thread_name_prefix: str):
        self.max_workers = max_workers
        self._prefix = thread_name_prefix
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._started = 0
        self._shutdown = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        with self._lock:
            if self._pid != os.getpid():
                self._reset()  # a forked child inherits the queue but none of the threads
            if self._shutdown:
                raise RuntimeError("cannot run a tool after the tool thread pool was shut down")
            future: concurrent.futures.Future = concurrent.futures.Future()
            self._work.put((future, fn, args, kwargs))
            # Like ThreadPoolExecutor: start a thread only when none is idle to take the work.
            if not self._idle.acquire(blocking=False) and self._started < self.max_workers:
                self._started += 1
                threading.Thread(target=self._worker, name=f"{self._prefix}_{self._started}", daemon=True).start()
            return future

    def _worker(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            del item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - delivered to the awaiting coroutine
                    future.set_exception(exc)
            # Drop references before idling so an idle worker keeps no arguments alive.
            del future, fn, args, kwargs
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            for _ in range(self._started):
                self._work.put(None)


_TOOL_POOL = DaemonThreadPool(TOOL_THREADS, thread_name_prefix="rlf-tool")


async def run_in_tool_thread(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Run the sync ``fn(*args, **kwargs)`` in the tool thread pool and await its result.

    The caller's context variables are visible in the thread, as with ``asyncio.to_thread``.
    Cancelling the await does not stop a function that is already running.
    """
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    return await loop.run_in_executor(_TOOL_POOL, functools.partial(context.run, fn, *args, **kwargs))
