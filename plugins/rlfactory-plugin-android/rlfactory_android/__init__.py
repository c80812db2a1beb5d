"""RLFactory plugin: the ``android`` env and the ``android_task`` reward.

Installing this distribution (``make install`` does by default) registers:

* the env ``android`` (:mod:`rlfactory_android.env`): operate a phone through tools (tap,
  long press, swipe, type, keys, open app, wait) to reach a goal, seeing the screen as a
  numbered list of UI elements read from uiautomator XML (:mod:`rlfactory_android.ui`); on a
  simulated phone (:mod:`rlfactory_android.simulated`, the default) or on real devices and
  emulators through adb (:mod:`rlfactory_android.adb`): ``rlf train --env android``;
* the reward ``android_task`` (:mod:`rlfactory_android.reward`): 1 when the task's success
  check on the device state passed;
* the parser ``pythonic`` (:mod:`rlfactory_android.parser`): tool calls written as Python
  calls on their own lines (``tap(element=3)``), the tools shown as signatures, for the
  android env (its default since issue 21) or any other (``parser=pythonic``).
"""

from __future__ import annotations

from rlfactory_core import hookimpl

from .device import Check, Device, DeviceError, StartState
from .env import AndroidEnv, evaluate_check
from .layout import Layout
from .parser import PythonicParser
from .reward import AndroidTaskReward
from .simulated import SimulatedPhone
from .tasks import Task, load_tasks
from .ui import Screen, UIElement, parse_ui, render_screen

#: the plugin API versions this plugin works with (checked when rlfactory loads it)
rlfactory_api = ">=1.3,<2"  # ToolResult.infrastructure came in 1.3

__all__ = [
    "AndroidEnv",
    "AndroidTaskReward",
    "PythonicParser",
    "Device",
    "DeviceError",
    "StartState",
    "Layout",
    "Check",
    "Task",
    "load_tasks",
    "SimulatedPhone",
    "Screen",
    "UIElement",
    "parse_ui",
    "render_screen",
    "evaluate_check",
    "rlfactory_register_envs",
    "rlfactory_register_rewards",
    "rlfactory_register_parsers",
]


@hookimpl
def rlfactory_register_envs(register):
    register(AndroidEnv)


@hookimpl
def rlfactory_register_rewards(register):
    register(AndroidTaskReward)


@hookimpl
def rlfactory_register_parsers(register):
    register(PythonicParser())
