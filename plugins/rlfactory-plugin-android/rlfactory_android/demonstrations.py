"""Demonstrations for the cold start (``cold_start.source: demonstrations``): a scripted solver
over the simulated phone.

The built-in tasks have a goal and a success check but no gold action sequence. The solver
plays a task on a private :class:`~rlfactory_android.simulated.SimulatedPhone` put into the
task's start state, acting through the env's own tools (so every action, its element number
and its result are exactly what the model would get), reading each screen as the model sees
it to find the element to act on:

* ``setting``: open Settings (unless shown), tap the setting's row when its value is not the
  one asked for;
* ``note_exists``: open Notes, tap "New note", type the text (the editor's field is focused),
  tap "Save";
* ``contact_exists``: open Contacts, tap "Create contact", type the name and the phone into
  their fields, tap "Save";
* ``text_field``: open the contact form and type the value into the field (not saved);
* ``contact_absent``: open Contacts, swipe the list up until the contact's row shows, long-press
  it, tap "Delete" in the dialog;

then answer "Done.". Elements are found by their text or resource id on the screen shown, never
by a fixed number, so the solver works in any layout and with lists of any length. The phone is
deterministic, so replaying these turns in a fresh episode (what the core does) shows the same
screens; a demonstration is returned only when the task's success check (side effects
included) holds on the solver's phone, and the core keeps it only when the ``android_task``
reward agrees. Only the simulated backend has demonstrations (a real
device's screens are not known in advance).

:func:`replay` plays recorded tool calls unchanged on a fresh phone in another task's start
state and reads that task's check: what a model that memorised a demonstration would score
(the honesty tests and ``bench/android_baselines.py`` use it).
"""

from __future__ import annotations

import asyncio
from typing import Any

from rlfactory_core import ToolCall

from .checks import evaluate_check, read_snapshot
from .simulated import TOGGLES, SimulatedPhone

__all__ = ["solve", "solve_calls", "replay"]

_TITLES = {name: title for title, name, _, _ in TOGGLES}
_MAX_SWIPES = 8


class _Unsolved(Exception):
    """The solver met a screen it does not know: no demonstration."""


def _episode(env: Any, task: Any) -> tuple[SimulatedPhone, dict[str, Any], Any]:
    """A private simulated phone in ``task``'s start state, the tools' episode state over it,
    and the snapshot the side-effect rule compares the end with."""
    phone = SimulatedPhone(serial="demonstration")
    phone.reset(task.start, env.apps)
    state = {"device": phone, "screen": env.read_screen(phone), "lock": asyncio.Lock(), "actions": 0}
    return phone, state, read_snapshot(phone, task.start, task.check)


async def solve(env: Any, task: Any, parser: Any) -> list[str] | None:
    """The assistant turns that complete ``task`` on the simulated phone (tool calls written
    by ``parser``, then "Done."), or None when the solver cannot do it."""
    calls = await solve_calls(env, task)
    return None if calls is None else [*(parser.format_tool_call(call) for call in calls), "Done."]


async def replay(env: Any, task: Any, calls: list[ToolCall]) -> tuple[bool, str]:
    """Play ``calls`` unchanged through the env's tools on a simulated phone in ``task``'s
    start state (a call the tools refuse is an error observation, as in an episode, and the
    next one runs), then read ``task``'s check, side effects included: (success, found)."""
    phone, state, before = _episode(env, task)
    tools = {tool.name: tool for tool in env.tools}
    for call in calls:
        try:
            await tools[call.name].call(dict(call.arguments), {"state": state})
        except Exception:  # noqa: BLE001 - ToolArgumentsError: the model would see it and go on
            continue
    return evaluate_check(phone, task.check, before)


async def solve_calls(env: Any, task: Any) -> list[ToolCall] | None:
    """The tool calls that complete ``task`` on the simulated phone, or None when the solver
    cannot do it (see the module docstring)."""
    phone, state, before = _episode(env, task)
    tools = {tool.name: tool for tool in env.tools}
    calls: list[ToolCall] = []

    async def act(name: str, **arguments: Any) -> None:
        try:
            result = await tools[name].call(arguments, {"state": state})
        except Exception as exc:  # noqa: BLE001 - e.g. ToolArgumentsError: the solver misread the screen
            raise _Unsolved(str(exc)) from None
        if not result.ok:
            raise _Unsolved(result.content)
        calls.append(ToolCall(name=name, arguments=arguments))

    def element(label: str = "", resource_id: str = "") -> Any:
        screen = state["screen"]
        found = screen.find(resource_id) if resource_id else next(
            (e for e in screen.elements if e.label == label), None)
        if found is None:
            raise _Unsolved(f"no element {label or resource_id} on the screen")
        return found

    async def open_app(app: str) -> None:
        if app not in env.apps:
            raise _Unsolved(f"no app {app}")
        if state["screen"].package != env.apps[app]:  # a task may start in the app
            await act("open_app", app=app)

    check = task.check
    try:
        if check.kind == "setting" and check.name in _TITLES:
            await open_app("Settings")
            if phone.get_setting(check.name) != check.value:
                await act("tap", element=element(_TITLES[check.name]).number)
        elif check.kind == "note_exists" and check.value:
            await open_app("Notes")
            await act("tap", element=element(resource_id="new_note").number)
            await act("type_text", text=check.value)
            await act("tap", element=element(resource_id="save_button").number)
        elif check.kind in ("contact_exists", "text_field"):
            await open_app("Contacts")
            await act("tap", element=element("Create contact").number)
            if check.kind == "text_field":
                await act("type_text", text=check.value or "", element=element(resource_id=check.name).number)
            else:
                await act("type_text", text=check.name, element=element(resource_id="name_field").number)
                if check.value:
                    await act("type_text", text=check.value, element=element(resource_id="phone_field").number)
                await act("tap", element=element(resource_id="save_button").number)
        elif check.kind == "contact_absent":
            await open_app("Contacts")
            for _ in range(_MAX_SWIPES):
                if any(e.label == check.name for e in state["screen"].elements):
                    break
                await act("swipe", direction="up", element=element(resource_id="list").number)
            await act("long_press", element=element(check.name).number)
            await act("tap", element=element(resource_id="button1").number)
        else:
            return None
    except _Unsolved:
        return None
    if not evaluate_check(phone, check, before)[0]:
        return None
    return calls
