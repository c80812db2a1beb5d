"""What the built-in test splits measure (issue 40): no test task is a training task; a
training episode replayed from memory (its tool calls, element numbers included) fails on the
``test_layouts`` tasks; doing anything besides the task fails the check; layouts are the
simulated phone's alone (adb refuses them in one line)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from rlfactory_core import ConfigError, ToolCall
from rlfactory_android import AndroidEnv, SimulatedPhone, StartState
from rlfactory_android.checks import Snapshot, evaluate_check, read_snapshot
from rlfactory_android.demonstrations import replay, solve_calls
from rlfactory_android.device import Check, DeviceError
from rlfactory_android.layout import APPS, SETTINGS_TITLES, TOGGLES, Layout
from rlfactory_android.tasks import BUILTIN_DIR, load_tasks, normalised, read_task

from android_testing import SERIAL


def tasks(split):
    return load_tasks(BUILTIN_DIR / f"{split}.jsonl")


def labels(phone):
    from rlfactory_android import parse_ui

    return [e.label for e in parse_ui(phone.dump_ui(), phone.screen_size).elements]


@pytest.fixture(scope="module")
def demonstrations():
    """Every built-in task's scripted demonstration (its tool calls), by task id."""
    env = AndroidEnv(few_shot=False)

    async def solve_all():
        return {t.id: await solve_calls(env, t) for split in ("train", "test", "test_layouts") for t in tasks(split)}

    return env, asyncio.run(solve_all())


# --------------------------------------------------------------------------- the splits


@pytest.mark.parametrize("split", ["validation", "test", "test_layouts"])
def test_no_test_task_is_a_training_task(split):
    """Goal and start state as the phone shows them (settings over the defaults, the contact
    list as sorted on screen, the notes, the app, the rows' and icons' order)."""
    train = {normalised(t): t.id for t in tasks("train")}
    held_out = tasks(split)
    assert len({normalised(t) for t in held_out}) == len(held_out)  # no task twice either
    assert [t.id for t in held_out if normalised(t) in train] == []
    # the normalisation sees through what does not change the episode: list order, an explicit default
    task = tasks("test")[0]
    same = read_task({"goal": f"  {task.goal.upper()} ", "check": {"kind": "setting", "name": "global/wifi_on",
                                                                     "value": "1"},
                      "start": {"settings": {"global/wifi_on": "0", "global/zen_mode": "0"}, "app": "Settings",
                                "layout": {"settings_order": list(SETTINGS_TITLES)}}}, "here")
    assert normalised(same) == normalised(task)


def test_test_layouts_is_an_env_split_the_core_evaluates():
    from rlfactory_core.testing import build_task, load_config, load_samples

    config = load_config([], ["eval.splits=[test_layouts]"], flags={"env": "android"})
    built = build_task(config)
    try:
        samples = load_samples(config, built.env, "test_layouts", None, files=False)
    finally:
        asyncio.run(built.close())
    assert len(samples) == len(tasks("test_layouts")) >= 60
    assert samples[0]["id"] == "test_layouts-setting-wifi_on-on-0" and samples[0]["start"]["layout"]
    assert read_task({k: v for k, v in samples[0].items() if k != "answer"}, "sample") == tasks("test_layouts")[0]


def test_every_training_and_test_layouts_start_shows_a_layout_of_its_own():
    """Training layouts are seeded by the task id: never the usual one, and a setting's row is
    never where the usual layout (the validation and test splits') has it."""
    for task in tasks("train"):
        layout = task.start.layout
        assert not layout.is_default, task.id
        if task.check.kind == "setting":
            row = next(title for title, name, _, _ in TOGGLES if name == task.check.name)
            assert layout.settings.index(row) != SETTINGS_TITLES.index(row), task.id
    assert all(t.start.layout.is_default for t in tasks("test") + tasks("validation"))
    assert all(not t.start.layout.is_default for t in tasks("test_layouts"))


# --------------------------------------------------------------------------- replaying from memory


def _first_element_action(calls):
    """The first call acting on an element by number: (tool, number)."""
    return next((c.name, c.arguments["element"]) for c in calls if "element" in c.arguments)


def _memorised(task, train):
    """The training tasks a memorising model would replay for ``task``: those with the same
    goal, else (another name, number or note) every one with the same kind of check."""
    same = [t for t in train if t.goal == task.goal]
    return same or [t for t in train if t.check.kind == task.check.kind]


def test_replaying_a_training_demonstration_fails_on_every_test_layouts_task(demonstrations):
    """By construction, the first element a test_layouts task's demonstration acts on (the
    setting's row, the contact's row or the swipe to it, "Create contact", "New note") has
    another number (or tool) than in every demonstration a memorising model would replay: the
    same goal's row is drawn elsewhere; contact and note lists are longer than any in training.
    So the bound is all of them: every replay fails."""
    env, demos = demonstrations
    train = tasks("train")
    pairs = failed = 0
    for task in tasks("test_layouts"):
        own = _first_element_action(demos[task.id])
        for memory in _memorised(task, train):
            assert _first_element_action(demos[memory.id]) != own, (task.id, memory.id)
            pairs += 1
            ok, found = asyncio.run(replay(env, task, demos[memory.id]))
            failed += not ok
    assert pairs >= len(tasks("test_layouts")) and failed == pairs


def test_the_test_split_is_replayed_from_memory_only_by_chance(demonstrations):
    """The test split keeps the usual layout (comparable with earlier runs); training now shows
    every setting's row elsewhere, so no settings task is solved by replaying the training
    task with its goal (all 10 were, with the old training files)."""
    env, demos = demonstrations
    train = tasks("train")
    solved = [t.id for t in tasks("test") if any(asyncio.run(replay(env, t, demos[m.id]))[0]
                                                for m in _memorised(t, train) if t.goal == m.goal)]
    assert solved == []  # same goal: only the settings tasks have one


def test_doing_nothing_and_the_own_demonstration(demonstrations):
    env, demos = demonstrations
    for task in tasks("test") + tasks("test_layouts"):
        assert asyncio.run(replay(env, task, []))[0] is False, task.id
        assert asyncio.run(replay(env, task, demos[task.id]))[0] is True, task.id


# --------------------------------------------------------------------------- side effects


def _phone(start):
    phone = SimulatedPhone()
    phone.reset(start, APPS)
    return phone


def _tap(phone, label, long=False):
    from rlfactory_android import parse_ui

    element = next(e for e in parse_ui(phone.dump_ui(), phone.screen_size).elements if e.label == label)
    (phone.long_press if long else phone.tap)(*element.center)


def test_an_extra_toggle_fails_the_check_and_is_named():
    start = StartState(settings={"global/wifi_on": "0"}, app="Settings")
    check = Check(kind="setting", name="global/wifi_on", value="1")
    phone = _phone(start)
    before = read_snapshot(phone, start, check)
    _tap(phone, "Wi-Fi")
    assert evaluate_check(phone, check, before) == (True, "global/wifi_on = 1")
    _tap(phone, "Bluetooth")
    assert evaluate_check(phone, check, before) == (
        False, "global/wifi_on = 1; also changed: global/bluetooth_on 0 -> 1")
    assert evaluate_check(phone, check) == (True, "global/wifi_on = 1")  # without a snapshot: the task's own check


def test_an_extra_deleted_contact_fails_the_check_and_is_named():
    start = StartState(contacts=(("Ann Lee", "555-0101"), ("Tom Ray", "555-0102"), ("Zed Obi", "")), app="Contacts")
    check = Check(kind="contact_absent", name="Tom Ray")
    phone = _phone(start)
    before = read_snapshot(phone, start, check)
    for name in ("Tom Ray", "Ann Lee", "Zed Obi"):
        _tap(phone, name, long=True)
        _tap(phone, "Delete")
        if name == "Tom Ray":
            assert evaluate_check(phone, check, before) == (True, "0 contact(s) named 'Tom Ray'")
    assert evaluate_check(phone, check, before) == (
        False, "0 contact(s) named 'Tom Ray'; also changed: contact 'Ann Lee' (555-0101) deleted, "
               "contact 'Zed Obi' deleted")


def test_a_saved_form_and_a_changed_note_are_side_effects():
    # "type the name (do not save it)": saving adds a contact
    start = StartState(app="Contacts")
    check = Check(kind="text_field", name="name_field", value="Ann Lee")
    phone = _phone(start)
    before = read_snapshot(phone, start, check)
    _tap(phone, "Create contact")
    phone.tap(540, 370)  # the name field
    phone.input_text("Ann Lee")
    assert evaluate_check(phone, check, before)[0] is True
    _tap(phone, "Save")  # the contact's page shows: the form is gone too
    assert evaluate_check(phone, check, before) == (
        False, "no element name_field on the screen; also changed: contact 'Ann Lee' added")
    # a note task that also deletes another note
    start = StartState(notes=("Buy milk", "Call mom"), app="Notes")
    check = Check(kind="note_exists", value="Pay rent")
    phone = _phone(start)
    before = read_snapshot(phone, start, check)
    _tap(phone, "New note")
    phone.input_text("Pay rent")
    _tap(phone, "Save")
    assert evaluate_check(phone, check, before)[0] is True
    _tap(phone, "Buy milk", long=True)
    _tap(phone, "Delete")
    ok, found = evaluate_check(phone, check, before)
    assert not ok and found.endswith("; also changed: note 'Buy milk' deleted")


def test_side_effects_through_an_episode_of_the_env():
    """The env keeps the snapshot at reset and names what else changed when it closes."""
    from rlfactory_core.testing import ConcurrentToolManager

    env = AndroidEnv(few_shot=False)
    row = env.dataset(None, "test_layouts")[0]  # turn Wi-Fi on, in a shuffled layout

    async def episode(titles):
        reset = await env.reset(row)
        manager = ConcurrentToolManager(env.tools)
        ctx = {"sample": row, "state": reset.state, "trajectory": None, "tool_names": None}
        for title in titles:
            number = next(e.number for e in reset.state["screen"].elements if e.label == title)
            [result] = await manager.call([ToolCall("tap", {"element": number}, id=title)], ctx)
            assert result.ok, result.content
        await env.close(reset.state)
        await manager.close()
        return reset.state

    right, extra = asyncio.run(episode(["Wi-Fi"])), asyncio.run(episode(["Wi-Fi", "Dark theme"]))
    assert (right["success"], right["check"]) == (True, "global/wifi_on = 1")
    dark = row["start"]["settings"]["secure/ui_night_mode"]
    assert extra["success"] is False
    assert extra["check"] == f"global/wifi_on = 1; also changed: secure/ui_night_mode {dark} -> {3 - int(dark)}"


class _RealPhone:
    """A device whose system switches the radios with airplane mode, as Android does."""

    linked_settings = {"global/airplane_mode_on": ("global/wifi_on", "global/bluetooth_on")}
    screen_size = (1080, 2400)

    def __init__(self):
        self.settings = {"global/wifi_on": "1", "global/bluetooth_on": "1", "global/airplane_mode_on": "0"}

    def get_setting(self, name):
        return self.settings.get(name)

    def list_contacts(self):
        return [("Ann Lee", "555-0101")]

    def list_notes(self):
        raise DeviceError("a real device has no standard notes app")


def test_settings_the_system_links_are_not_side_effects_of_that_setting():
    phone = _RealPhone()
    airplane = Check(kind="setting", name="global/airplane_mode_on", value="1")
    before = read_snapshot(phone, StartState(), airplane)
    assert before.notes is None  # not readable there: not compared
    phone.settings.update({"global/airplane_mode_on": "1", "global/wifi_on": "0", "global/bluetooth_on": "0"})
    assert evaluate_check(phone, airplane, before) == (True, "global/airplane_mode_on = 1")
    wifi = Check(kind="setting", name="global/wifi_on", value="0")  # but for another check, they count
    ok, found = evaluate_check(phone, wifi, read_snapshot(_RealPhone(), StartState(), wifi))
    assert not ok and "also changed: global/bluetooth_on 1 -> 0, global/airplane_mode_on 0 -> 1" in found
    assert isinstance(before, Snapshot)


# --------------------------------------------------------------------------- layouts


def test_a_layout_orders_the_settings_rows_and_the_launcher_icons():
    layout = Layout(settings_order=("Dark theme", "Bluetooth"), home_order=("Notes",))
    phone = _phone(StartState(layout=layout))
    assert [x for x in labels(phone) if x in APPS] == ["Notes", "Settings", "Contacts"]
    phone.open_app(APPS["Settings"])
    assert [x for x in labels(phone) if x in SETTINGS_TITLES] == [
        "Dark theme", "Bluetooth", "Wi-Fi", "Airplane mode", "Do not disturb"]
    assert layout.to_dict() == {"settings_order": ["Dark theme", "Bluetooth"], "home_order": ["Notes"]}
    assert Layout(settings_order=SETTINGS_TITLES).is_default and Layout().to_dict() is None


@pytest.mark.parametrize("layout, message", [
    ({"settings_order": ["Wi-Fi"], "colour": "blue"}, "unknown key(s) in start.layout: colour"),
    ({"settings_order": ["Wi-Fi", "Battery"]}, "start.layout.settings_order: the simulated phone has no 'Battery'"),
    ({"home_order": ["Notes", "Notes"]}, "start.layout.home_order names Notes twice"),
    ({"home_order": "Notes"}, "start.layout.home_order must be a list of names (Settings, Contacts, Notes)"),
    (["Wi-Fi"], "start.layout must be a mapping (settings_order, home_order), got list"),
])
def test_a_bad_layout_is_a_one_line_error_naming_it(layout, message, tmp_path):
    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"goal": "x", "start": {"layout": %s}, "check": {"kind": "contact_absent", "name": "A"}}\n'
                   % json.dumps(layout))
    with pytest.raises(ValueError) as info:
        load_tasks(bad)
    assert str(info.value).startswith(f"tasks.jsonl:1: {message}") and "\n" not in str(info.value)


def test_a_layout_on_the_adb_backend_is_a_one_line_device_error(fake):
    from rlfactory_android.adb import AdbDevice

    device = AdbDevice(SERIAL, adb_path=fake.path)
    with pytest.raises(DeviceError) as info:
        device.reset(StartState(layout=Layout(settings_order=("Dark theme",))), {"Settings": APPS["Settings"]})
    assert "\n" not in str(info.value) and re.match(r"a start.layout .* needs the simulated backend", str(info.value))
    assert fake.commands() == []  # refused before touching the device
    env = AndroidEnv(backend="adb", adb_path=fake.path)
    with pytest.raises(ConfigError, match=r"env_options.splits.train: 46 task\(s\) have a start.layout "
                                          r"\(train-setting-wifi_on-on, .*only the simulated phone can draw"):
        env.dataset(None, "train")
    assert len(env.dataset(None, "test")) == 28  # the usual layout: a real phone's own
