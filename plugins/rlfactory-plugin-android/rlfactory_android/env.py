"""The env ``android``: operate a phone through tools to reach a goal.

An episode is one task (:mod:`rlfactory_android.tasks`). ``reset`` leases a device from the
backend's pool (one device per trajectory), puts it into the task's start state and shows
the model the goal and the screen: the UI hierarchy as a numbered list of elements
(:mod:`rlfactory_android.ui`). The model acts through tools, each answering with what it did
and the screen after it:

* ``tap(element | x, y)``, ``long_press(element | x, y)``: an element's number from the last
  screen shown, or a point in screen pixels;
* ``swipe(direction, element?)``: the finger moves up/down/left/right across the element (a
  list) or the middle of the screen; swiping up shows what is further down a list;
* ``type_text(text, element?)``: types into the element (tapped first to focus it), or into
  the focused field;
* ``press_key(key)``: ``back``, ``home`` or ``enter``;
* ``open_app(app)``: one of the env's ``apps``;
* ``wait(seconds)``: lets the device settle (the simulated phone does not need it).

Bad actions never crash the episode: an element that is not on the screen, a point off the
screen, text into something that is not a text field, an unknown key or app, or a tool
without its required arguments come back to the model as one-line errors
(``invalid_arguments``); a device that fails an operation comes back as its one-line error,
counted as a ``tool_error`` whose ``metadata["tool_error"]`` is ``device_error``.
Actions are not retried (a tap is not idempotent); several actions in one turn run one
after another, in the order they reach the device.

A turn without a tool call ends the episode (the model says it is done). ``close`` then
reads the task's success check from the device state (a setting's value, a contact, a note,
a field's text), before the device is released, and keeps the verdict in the episode's
state, where the ``android_task`` reward (:mod:`rlfactory_android.reward`) reads it. The
check also fails on side effects: ``reset`` keeps a snapshot of the settings, contacts and
notes right after the start state is made, and anything else that changed by the end fails
the task (:mod:`rlfactory_android.checks`).

Backends (``backend``): ``simulated`` (default), the deterministic simulated phone of
:mod:`rlfactory_android.simulated`, one per concurrent trajectory; ``adb``, real devices or
emulators through ``adb`` (:mod:`rlfactory_android.adb`), leased one per trajectory from
``devices`` (serials; all connected devices by default).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Sequence

from rlfactory_core import (ConfigError, EnvReset, EnvStep, Message, ParsedTurn, RLFactoryError, Sample, ToolCall,
                            ToolResult, get_component, member, run_in_tool_thread)

from .checks import evaluate_check, read_snapshot
from .device import Device, DeviceError, StartState
from .simulated import APPS as SIMULATED_APPS
from .simulated import SimulatedPhone
from .tasks import BUILTIN_DIR, BUILTIN_SPLITS, Task, check_text, load_tasks, read_task
from .tools import TOOLS
from .ui import Screen, parse_ui, render_screen

__all__ = ["AndroidEnv", "SimulatedPool", "evaluate_check", "INSTRUCTION", "OPTIONS", "BACKENDS", "ADB_APPS"]

INSTRUCTION = (
    "You operate an Android phone to complete a task. You see the screen as a numbered list of its elements. "
    "Act with one tool call at a time: tap or long_press an element by its number, type_text into a text field, "
    "swipe to scroll, press_key (back, home, enter), or open_app. Each tool shows the screen after the action. "
    "When the task is complete, reply without a tool call, saying Done."
)
BACKENDS = ("simulated", "adb")
#: The apps of the ``adb`` backend unless ``apps`` says otherwise: AOSP's Settings and Contacts.
ADB_APPS = {"Settings": "com.android.settings", "Contacts": "com.android.contacts"}
OPTIONS = ("backend", "splits", "devices", "adb_path", "device_timeout_s", "apps", "few_shot", "parser", "screenshot",
           "coordinates")


class SimulatedPool:
    """Simulated phones, one per trajectory: a free one, or a new one up to ``size`` (None:
    no limit; more trajectories than ``size`` wait for a phone)."""

    def __init__(self, size: int | None = None):
        self.size = size
        self.phones: list[SimulatedPhone] = []
        self._free: list[SimulatedPhone] = []
        self._released: asyncio.Condition | None = None  # made on first use, in the running loop

    async def lease(self) -> SimulatedPhone:
        if self._released is None:
            self._released = asyncio.Condition()
        async with self._released:
            while not self._free and self.size is not None and len(self.phones) >= self.size:
                await self._released.wait()
            if self._free:
                return self._free.pop()
            phone = SimulatedPhone(serial=f"simulated-{len(self.phones)}")
            self.phones.append(phone)
            return phone

    async def release(self, phone: SimulatedPhone) -> None:
        if self._released is None:
            self._released = asyncio.Condition()
        async with self._released:
            self._free.append(phone)
            self._released.notify()


# --------------------------------------------------------------------------- the env


class AndroidEnv:
    """Operate an Android phone through tools (see the module docstring).

    :param backend: ``simulated`` (default) or ``adb``.
    :param splits: split name -> task file (JSONL, absolute or relative to the working
        directory), merged over the built-in ``train``, ``validation``, ``test`` and
        ``test_layouts`` (for the simulated phone); ``null`` drops a split.
    :param devices: simulated: how many phones at most (default one per concurrent
        trajectory); adb: the serials to use (default every connected device).
    :param adb_path: the ``adb`` binary (adb backend).
    :param device_timeout_s: the time limit of one adb command.
    :param apps: app name -> package, what ``open_app`` and a task's ``start.app`` may name;
        default the simulated phone's Settings, Contacts and Notes, or AOSP's Settings and
        Contacts on a device.
    :param few_shot: show worked examples (tasks done on simulated phones, their tool calls
        written by the run's parser) before the task; default on for the simulated backend only.
    :param parser: the parser that writes the example's tool calls (the run's; set by the trainer).
    :param coordinates: show the screen's size and each element's centre point (default); off,
        the screen text is a third shorter and elements are acted on by number only.
    :param screenshot: also show the model a screenshot (PNG) of the screen with the task
        and after every turn with actions, as an image part of a message (vision-language
        models; the trainer refuses a text-only model).
    """

    name = "android"
    description = ("Android GUI agent: operate a phone through tap/swipe/type/key/app tools to reach a goal, "
                   "rewarded by a success check on the device state (simulated phone or adb devices).")

    #: The config this env runs with unless the user sets otherwise (issue 21; bench/README.md
    #: has the measurements): short contexts (the ``pythonic`` parser's one-line tool
    #: signatures, no worked examples, screens without coordinates: a demonstration is ~1,050
    #: tokens instead of ~3,500), a warm-up on every training task's demonstration (the base
    #: model succeeds in 0 of 28 validation tasks, 8 of 28 after it), then 3 RL steps at a
    #: low LR (1e-5 took the warmed-up model from 0.250 to 0.107 in 3 steps; 3e-6 kept it).
    config_defaults: dict[str, Any] = {
        "parser": "pythonic",
        "env_options": {"few_shot": False, "coordinates": False},
        "rewards": [{"name": "android_task"}],
        "eval": {"every": 3, "temperature": 0.0, "reuse_untrained": True},
        "rollout": {"max_turns": 6, "max_tokens_per_turn": 64, "max_trajectory_tokens": 4096,
                    "sampling": {"temperature": 0.8}},
        "grpo": {"group_size": 4, "prompts_per_step": 4, "dynamic_sampling": True},
        "cold_start": {"source": "demonstrations", "examples": 46, "lr": 5e-5},
        "train": {"steps": 3, "lr": 3e-6},
        "data": {"eval_size": 28},
        "checkpoint": {"every": 3},
    }

    def __init__(self, backend: str = "simulated", splits: dict[str, str | None] | None = None,
                 devices: int | list[str] | None = None, adb_path: str = "adb", device_timeout_s: float = 15.0,
                 apps: dict[str, str] | None = None, few_shot: bool | None = None, parser: str = "qwen3",
                 screenshot: bool = False, coordinates: bool = True, **unknown: Any):
        problems = [f"env_options.{key}: unknown option (options: {', '.join(OPTIONS)})" for key in unknown]
        if backend not in BACKENDS:
            problems.append(f"env_options.backend: must be one of {', '.join(BACKENDS)}, got {backend!r}")
            backend = "simulated"
        self.backend = backend
        if backend == "simulated":
            if devices is not None and (isinstance(devices, bool) or not isinstance(devices, int) or devices < 1):
                problems.append(f"env_options.devices: with the simulated backend, the most phones at once "
                                f"(a whole number >= 1), got {devices!r}")
        elif devices is not None and (not isinstance(devices, list) or not all(isinstance(s, str) for s in devices)
                                      or not devices):
            problems.append(f"env_options.devices: with the adb backend, a list of device serials (adb devices), "
                            f"got {devices!r}")
        if not isinstance(adb_path, str) or not adb_path:
            problems.append(f"env_options.adb_path: must be the adb binary's path, got {adb_path!r}")
        if isinstance(device_timeout_s, bool) or not isinstance(device_timeout_s, (int, float)) \
                or not 0 < device_timeout_s <= 600:
            problems.append(f"env_options.device_timeout_s: must be seconds in (0, 600], got {device_timeout_s!r}")
        default_apps = SIMULATED_APPS if backend == "simulated" else ADB_APPS
        if apps is not None and (not isinstance(apps, dict) or not apps
                                 or not all(isinstance(k, str) and isinstance(v, str) and v for k, v in apps.items())):
            problems.append(f"env_options.apps: must map app names to package names, got {apps!r}")
            apps = None
        self.apps: dict[str, str] = dict(apps or default_apps)
        if few_shot is not None and not isinstance(few_shot, bool):
            problems.append(f"env_options.few_shot: must be true or false, got {few_shot!r}")
        self.few_shot = (backend == "simulated") if few_shot is None else bool(few_shot)
        if not isinstance(screenshot, bool):
            problems.append(f"env_options.screenshot: must be true or false, got {screenshot!r}")
        if not isinstance(coordinates, bool):
            problems.append(f"env_options.coordinates: must be true or false, got {coordinates!r}")
        self.coordinates = coordinates is not False
        #: the trainer checks the model takes images when this is set (rlfactory_core.interfaces.Env)
        self.shows_images = screenshot is True
        self.split_files = self._split_files(splits, problems)
        self.parser: Any = None
        if self.few_shot:
            try:
                self.parser = get_component("parser", parser)
            except RLFactoryError as exc:
                problems.append(f"env_options.parser: {exc}")
            else:
                if not callable(member("parser", self.parser, "format_tool_call")):
                    problems.append(f"env_options.few_shot: the {parser!r} parser cannot write the example's tool "
                                    "calls (it has no format_tool_call); set few_shot: false")
        if self.few_shot and not set(SIMULATED_APPS) <= set(self.apps):
            problems.append("env_options.few_shot: the worked examples open Settings and Contacts; with apps "
                            "without them, set few_shot: false")
        if problems:
            raise ConfigError(problems, hint="see the options table in the rlfactory-plugin-android README")
        self.devices, self.adb_path, self.device_timeout_s = devices, adb_path, float(device_timeout_s)
        self.tools = [tool(self) for tool in TOOLS]
        self._pool: Any = None
        if backend == "adb":  # no device, or no adb, is a config error now, not a failed trajectory each
            try:
                self._get_pool()
            except DeviceError as exc:
                raise ConfigError([f"env_options.devices: {exc}"],
                                  hint="connect a device or start an emulator (adb devices), or use "
                                       "backend: simulated") from None
        self._example: list[Message] | None = None

    def _split_files(self, splits: Any, problems: list[str]) -> dict[str, Path]:
        if splits is not None and not isinstance(splits, dict):
            problems.append(f"env_options.splits: must map split names to task files, got {splits!r}")
            splits = None
        defaults = {split: str(BUILTIN_DIR / f"{split}.jsonl") for split in BUILTIN_SPLITS}
        files: dict[str, Path] = {}
        for split, name in {**defaults, **(splits or {})}.items():
            if name is None:
                continue
            path = Path(str(name)).expanduser()
            if not isinstance(name, str) or not path.is_file():
                problems.append(f"env_options.splits.{split}: no task file {name!r}; give a JSONL file of tasks "
                                f"(see the README) or {{{split}: null}} to drop it")
                continue
            files[split] = path
        return files

    # ------------------------------------------------------------------ data

    def data_fingerprint(self, samples: Sequence[Any]) -> str | None:
        """``""`` on the simulated phone (a task starts from its sample alone: its layout is
        seeded by the task); None on a real device, whose state no key can capture
        (``eval.reuse_untrained`` then evaluates every run)."""
        return "" if self.backend == "simulated" else None

    def dataset(self, size: int | None = None, split: str = "train") -> list[dict[str, Any]]:
        """The first ``size`` tasks of ``split`` (all when None) as samples: the task's JSON
        fields plus ``answer``, a description of the success check (shown in saved samples)."""
        if split not in self.split_files:
            raise ConfigError([f"env_options.splits: the android env has no {split!r} split "
                               f"(splits: {', '.join(self.split_files) or 'none'})"])
        path = self.split_files[split]
        try:
            tasks = load_tasks(path)
        except ValueError as exc:
            raise ConfigError([f"env_options.splits.{split}: {exc}"]) from None
        problems = [f"env_options.splits.{split}: task {t.id}: start.app {t.start.app!r} is not one of the apps "
                    f"({', '.join(self.apps)})" for t in tasks if t.start.app is not None and t.start.app not in self.apps]
        laid_out = [t.id for t in tasks if not t.start.layout.is_default]
        if self.backend == "adb" and laid_out:
            problems.append(f"env_options.splits.{split}: {len(laid_out)} task(s) have a start.layout "
                            f"({', '.join(laid_out[:3])}{', ...' if len(laid_out) > 3 else ''}), which only the "
                            "simulated phone can draw (adb cannot reorder a real phone's Settings rows or launcher "
                            "icons); give the adb backend task files without layouts (env_options.splits)")
        if problems:
            raise ConfigError(problems)
        rows = [json_row for json_row in (_task_row(t) for t in tasks)]
        return rows if size is None else rows[:size]

    # ------------------------------------------------------------------ devices

    def _get_pool(self) -> Any:
        if self._pool is None:
            if self.backend == "simulated":
                self._pool = SimulatedPool(self.devices)  # type: ignore[arg-type]
            else:
                from .adb import AdbDevicePool
                self._pool = AdbDevicePool(self.devices, adb_path=self.adb_path,  # type: ignore[arg-type]
                                           timeout_s=self.device_timeout_s)
        return self._pool

    def read_screen(self, device: Device) -> Screen:
        return parse_ui(device.dump_ui(), device.screen_size)

    def render(self, screen: Screen) -> str:
        """``screen`` as the model sees it (with or without ``coordinates``)."""
        return render_screen(screen, coordinates=self.coordinates)

    # ------------------------------------------------------------------ episodes

    def _example_messages(self) -> list[Message]:
        """Worked examples on simulated phones, their calls in the run parser's format: one
        task done to the end (turn Bluetooth on: ``open_app``, ``tap``, "Done."), then the first
        action of three more tasks, each right after its screen. The embedded 135M model
        imitates them: with only the first, it made a tool call in 1 of 96 samples (it answered
        "Done." or wrote a tool response); with all four, in 72 of 96 (12 train tasks x 8, at
        temperature 0.8). It copies the last example most, so the last is the first step of
        most tasks: opening an app from the home screen."""
        if self._example is None:
            messages: list[Message] = []

            def user(phone: SimulatedPhone, goal: str) -> None:
                messages.append(Message(role="user", content=f"Task: {goal}\n\n{self.render(self.read_screen(phone))}"))

            def call(name: str, arguments: dict[str, Any]) -> ToolCall:
                tool_call = ToolCall(name=name, arguments=arguments, id=f"example-{len(messages)}")
                messages.append(Message(role="assistant", content=self.parser.format_tool_call(tool_call)))
                return tool_call

            def result(phone: SimulatedPhone, tool_call: ToolCall, done: str) -> None:
                content = f"{done}\n{self.render(self.read_screen(phone))}"
                messages.extend(self.parser.render_tool_results([ToolResult(name=tool_call.name, content=content,
                                                                            call_id=tool_call.id)]))

            def element(phone: SimulatedPhone, label: str) -> Any:
                return next(e for e in self.read_screen(phone).elements if e.label == label)

            phone = SimulatedPhone(serial="example")
            phone.reset(StartState(settings={"global/bluetooth_on": "0"}), SIMULATED_APPS)
            user(phone, "Turn on Bluetooth.")
            opened = call("open_app", {"app": "Settings"})
            phone.open_app(SIMULATED_APPS["Settings"])
            result(phone, opened, "Opened Settings.")
            row = element(phone, "Bluetooth")
            tapped = call("tap", {"element": row.number})
            phone.tap(*row.center)
            result(phone, tapped, f'Tapped element {row.number} ({row.short_class} "Bluetooth").')
            messages.append(Message(role="assistant", content="Done."))

            phone.reset(StartState(contacts=(("Ann Lee", "555-0101"), ("Tom Ray", "555-0102")), app="Contacts"),
                        SIMULATED_APPS)
            user(phone, "Delete the contact Tom Ray.")
            call("long_press", {"element": element(phone, "Tom Ray").number})

            phone.reset(StartState(app="Notes"), SIMULATED_APPS)
            phone.tap(*element(phone, "New note").center)  # the editor opens with its field focused
            user(phone, "Create a note that says: Call Sam")
            call("type_text", {"text": "Call Sam"})

            phone.reset(StartState(), SIMULATED_APPS)
            user(phone, "Add a contact named Sam Hill with the phone number 555-0199.")
            call("open_app", {"app": "Contacts"})
            self._example = messages
        return list(self._example)

    async def reset(self, sample: Sample) -> EnvReset:
        task = read_task({k: v for k, v in dict(sample).items() if k != "answer"},
                         f"android sample {sample.get('id', '?') if hasattr(sample, 'get') else '?'}") \
            if hasattr(sample, "get") else read_task(sample, "android sample")
        if task.start.app is not None and task.start.app not in self.apps:
            raise ValueError(f"android task {task.id}: start.app {task.start.app!r} is not one of the apps "
                             f"({', '.join(self.apps)})")
        pool = self._get_pool()
        device = await pool.lease()
        try:
            await run_in_tool_thread(device.reset, task.start, self.apps)
            # what the side-effect rule compares the end with: the state as the device shows it now
            before = await run_in_tool_thread(read_snapshot, device, task.start, task.check)
            screen = await run_in_tool_thread(self.read_screen, device)
        except BaseException:
            await pool.release(device)
            raise
        messages = [Message(role="system", content=INSTRUCTION)]
        if self.few_shot:
            messages += self._example_messages()
        goal = f"Task: {task.goal}\n\n{self.render(screen)}"
        if self.shows_images:
            try:
                shown = await self._screenshot_message(device, goal)
            except BaseException:
                await pool.release(device)
                raise
            messages.append(shown)
        else:
            messages.append(Message(role="user", content=goal))
        state = {"task": task, "device": device, "screen": screen, "lock": asyncio.Lock(), "actions": 0,
                 "before": before, "success": None, "check": None, "check_error": None, "released": False}
        return EnvReset(messages=messages, tools=list(self.tools), state=state)

    async def demonstration(self, sample: Sample, parser: Any) -> list[str] | None:
        """A solved episode for the cold start: a scripted solver's actions on a simulated
        phone in the task's start state (:mod:`rlfactory_android.demonstrations`), then
        "Done."; None with the adb backend or when the solver cannot do the task."""
        from .demonstrations import solve  # it imports this module

        if self.backend != "simulated" or not callable(member("parser", parser, "format_tool_call")):
            return None
        task = read_task({k: v for k, v in dict(sample).items() if k != "answer"},
                         f"android sample {sample.get('id', '?')}") if hasattr(sample, "get") else None
        return None if task is None else await solve(self, task, parser)

    async def step(self, state: Any, turn: ParsedTurn, results: Sequence[ToolResult]) -> EnvStep:
        if turn.tool_calls and self.shows_images:
            async with state["lock"]:  # after the turn's actions
                return EnvStep(observation=[await self._screenshot_message(state["device"], "Screenshot:")])
        if turn.tool_calls or turn.errors:
            return EnvStep()  # the rollout shows the results (or the parse errors)
        return EnvStep(done=True, final_answer=turn.content.strip())

    async def _screenshot_message(self, device: Device, text: str) -> Message:
        """``text`` with a screenshot of the screen; a failed screenshot is said in words."""
        try:
            png = await run_in_tool_thread(lambda: square_screenshot(device.screenshot()))
        except DeviceError as exc:
            return Message(role="user", content=f"{text}\n(No screenshot: {exc})".lstrip())
        return Message(role="user", content=text, images=[png])

    async def close(self, state: Any) -> None:
        """Read the success check from the device, then give the device back."""
        if not isinstance(state, dict) or state.get("released"):
            return
        state["released"] = True
        device = state["device"]
        try:
            async with state["lock"]:
                success, found = await run_in_tool_thread(evaluate_check, device, state["task"].check,
                                                          state.get("before"))
            state["success"], state["check"] = success, found
        except DeviceError as exc:
            state["check_error"] = str(exc)
        finally:
            await self._get_pool().release(device)

    def __repr__(self) -> str:
        return f"AndroidEnv(backend={self.backend!r}, splits={sorted(self.split_files)})"


def square_screenshot(png: bytes) -> bytes:
    """The screenshot centred on a black square (a PNG). LLaVA-style image processors
    resize the short side and crop the middle square: a portrait phone screen (9:20) would
    lose its top and bottom thirds, status and title bars and bottom rows included.
    Raises :class:`DeviceError` for bytes that are not an image."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(png)) as opened:
            screen = opened.convert("RGB")
    except Exception as exc:  # noqa: BLE001 - PIL raises several kinds
        raise DeviceError(f"the screenshot is not a readable image ({exc})") from None
    side = max(screen.size)
    square = Image.new("RGB", (side, side), "black")
    square.paste(screen, ((side - screen.width) // 2, (side - screen.height) // 2))
    out = io.BytesIO()
    square.save(out, format="PNG")
    return out.getvalue()


def _task_row(task: Task) -> dict[str, Any]:
    start = task.start
    return {"id": task.id, "goal": task.goal,
            "start": {"settings": dict(start.settings), "contacts": [{"name": n, "phone": p} for n, p in start.contacts],
                      "notes": list(start.notes), "app": start.app, "layout": start.layout.to_dict()},
            "check": {"kind": task.check.kind, "name": task.check.name, "value": task.check.value},
            "answer": check_text(task.check)}
