"""RLFactory plugin: the ``arithmetic`` env, offline questions answered with the calculator.

Installing this distribution registers the env ``arithmetic`` (``rlf train --env
arithmetic``), the task of the ``cpu-smoke`` preset, the tests and the benchmarks, and the
tool-verified reward ``arithmetic_verified`` (:mod:`rlfactory_arithmetic.reward`);
``make install`` installs it by default. The ``calculator`` tool it offers and the
``exact_match`` reward that scores it by default are built into the core. The task itself
is described in :mod:`rlfactory_arithmetic.env`.
"""

from __future__ import annotations

from rlfactory_core import hookimpl

from .env import NO_TOOLS_PROMPT, SYSTEM_PROMPT, ArithmeticEnv
from .reward import ArithmeticVerifiedReward

#: the plugin API versions this plugin works with (checked when rlfactory loads it)
rlfactory_api = ">=1.0,<2"

__all__ = ["ArithmeticEnv", "ArithmeticVerifiedReward", "SYSTEM_PROMPT", "NO_TOOLS_PROMPT",
           "rlfactory_register_envs", "rlfactory_register_rewards"]


@hookimpl
def rlfactory_register_envs(register):
    register(ArithmeticEnv)


@hookimpl
def rlfactory_register_rewards(register):
    register(ArithmeticVerifiedReward)
