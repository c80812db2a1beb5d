"""The android env on the simulated phone: its apps, the screen text, every tool through the
real tool manager (bad actions become error observations), whole episodes through the agent
loop with a scripted model, the success check, the reward, the task files and the env's
config errors."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from rlfactory_core import ConfigError, ParsedTurn, RewardContext, ToolCall, Trajectory, get_component
from rlfactory_core.testing import ConcurrentToolManager, ScriptedBackend
from rlfactory_android import AndroidEnv, AndroidTaskReward, SimulatedPhone, StartState, parse_ui, render_screen
from rlfactory_android.device import Check, DeviceError
from rlfactory_android.env import evaluate_check
from rlfactory_android.tasks import BUILTIN_DIR, BUILTIN_SPLITS, builtin_tasks, load_tasks

APPS = {"Settings": "com.android.settings", "Contacts": "com.android.contacts", "Notes": "com.rlfactory.notes"}


def screen_of(phone):
    return parse_ui(phone.dump_ui(), phone.screen_size)


def tap_label(phone, label):
    element = next(e for e in screen_of(phone).elements if e.label == label)
    phone.tap(*element.center)


# --------------------------------------------------------------------------- the simulated phone


def test_the_dump_is_uiautomator_xml_and_the_screen_lists_what_can_be_acted_on():
    phone = SimulatedPhone()
    phone.reset(StartState(), APPS)
    xml = phone.dump_ui()
    assert xml.startswith("<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><hierarchy rotation=\"0\"><node ")
    assert 'bounds="[0,0][1080,2400]"' in xml and 'package="com.android.systemui"' in xml
    text = render_screen(screen_of(phone))
    assert text.splitlines()[0] == "Screen: com.android.launcher3 (1080x2400)"
    assert '[2] TextView "Settings" id=icon clickable long-clickable at (210,2025)' in text
    assert '[6] ImageView desc="Home" id=home clickable at (540,2337)' in text
    # without coordinates: the same elements and flags, no size and no points
    short = render_screen(screen_of(phone), coordinates=False)
    assert short.splitlines()[0] == "Screen: com.android.launcher3"
    assert short.splitlines()[1:] == [line.split(" at (")[0] for line in text.splitlines()[1:]]


async def test_without_coordinates_every_screen_the_model_sees_leaves_out_the_points():
    env = AndroidEnv(few_shot=False, coordinates=False)
    reset = await env.reset(env.dataset(None, "train")[0])
    try:
        assert "Screen: com.android.settings\n" in reset.messages[-1].content
        tap = next(tool for tool in reset.tools if tool.name == "tap")
        result = await tap.call({"element": 3}, {"state": reset.state})
        assert result.ok and "Screen: com.android.settings\n" in result.content and " at (" not in result.content
    finally:
        await env.close(reset.state)
    example = AndroidEnv(coordinates=False)._example_messages()
    assert not any(" at (" in str(m.content) for m in example)


def test_settings_rows_toggle_their_setting_and_show_its_state():
    phone = SimulatedPhone()
    phone.reset(StartState(settings={"global/bluetooth_on": "0"}), APPS)
    tap_label(phone, "Settings")
    row = next(e for e in screen_of(phone).elements if e.label == "Bluetooth")
    assert row.checkable and not row.checked  # the row's switch is folded into the row
    phone.tap(*row.center)
    assert phone.get_setting("global/bluetooth_on") == "1"
    assert next(e for e in screen_of(phone).elements if e.label == "Bluetooth").checked
    tap_label(phone, "Dark theme")
    assert phone.get_setting("secure/ui_night_mode") == "2"


def test_a_contact_is_created_through_the_form_and_deleted_by_long_press():
    phone = SimulatedPhone()
    phone.reset(StartState(contacts=(("Bob Jones", "555-0202"),), app="Contacts"), APPS)
    tap_label(phone, "Create contact")
    form = screen_of(phone)
    phone.input_text("ignored")  # nothing is focused yet: the text goes nowhere, as on a phone
    assert form.find("name_field").text == "" and screen_of(phone).find("name_field").text == ""
    tap_label(phone, "Save")  # an empty name is refused with a message
    assert "Name is required" in render_screen(screen_of(phone)) and len(phone.contacts) == 1
    phone.tap(*form.find("name_field").center)
    phone.input_text("Alice Smith")
    phone.tap(*form.find("phone_field").center)
    phone.input_text("555-0101")
    tap_label(phone, "Save")
    assert ("Alice Smith", "555-0101") in phone.list_contacts()
    assert screen_of(phone).elements[1].text == "Alice Smith"  # the new contact's page
    phone.press_key("back")
    rows = [e for e in screen_of(phone).elements if e.long_clickable]
    assert [r.label for r in rows] == ["Alice Smith", "Bob Jones"]  # sorted by name
    phone.long_press(*rows[1].center)
    assert "Delete contact?" in render_screen(screen_of(phone))
    phone.tap(5, 300)  # a touch outside the dialog dismisses it
    assert "Delete contact?" not in render_screen(screen_of(phone))
    phone.long_press(*rows[1].center)
    tap_label(phone, "Delete")
    assert phone.list_contacts() == [("Alice Smith", "555-0101")]


def test_notes_are_written_edited_and_long_lists_scroll():
    phone = SimulatedPhone()
    phone.reset(StartState(notes=tuple(f"note {i}" for i in range(20))), APPS)
    phone.open_app(APPS["Notes"])
    listed = [e.label for e in screen_of(phone).elements if e.long_clickable]
    assert listed[0] == "note 0" and "note 19" not in listed
    the_list = next(e for e in screen_of(phone).elements if e.scrollable)
    x, y = the_list.center
    phone.swipe(x, y + 600, x, y - 600)  # the finger moves up: further down the list
    phone.swipe(x, y + 600, x, y - 600)  # as far as it goes
    listed = [e.label for e in screen_of(phone).elements if e.long_clickable]
    assert listed[-1] == "note 19" and "note 0" not in listed
    phone.press_key("home")
    phone.open_app(APPS["Notes"])
    tap_label(phone, "New note")
    phone.input_text("Buy milk")  # the editor's field is focused when it opens
    tap_label(phone, "Save")
    assert phone.list_notes()[-1] == "Buy milk"
    tap_label(phone, "note 0")
    phone.input_text(" and eggs")
    tap_label(phone, "Save")
    assert phone.list_notes()[0] == "note 0 and eggs"


def test_the_simulated_phone_refuses_what_a_phone_cannot_do():
    phone = SimulatedPhone()
    with pytest.raises(DeviceError, match=r"\(2000,10\) is off the screen, which is 1080x2400"):
        phone.tap(2000, 10)
    with pytest.raises(DeviceError, match="no app 'com.example.mail'"):
        phone.open_app("com.example.mail")
    with pytest.raises(DeviceError, match="unknown key 'volume_up'"):
        phone.press_key("volume_up")
    assert phone.screenshot().startswith(b"\x89PNG\r\n\x1a\n")


# --------------------------------------------------------------------------- the env's tools


async def start(env, task_row):
    reset = await env.reset(task_row)
    manager = ConcurrentToolManager(env.tools)
    ctx = {"sample": task_row, "state": reset.state, "trajectory": None, "tool_names": None}

    async def call(name, **arguments):
        [result] = await manager.call([ToolCall(name, arguments, id="1")], ctx)
        return result
    return reset, manager, call


def task(goal="Turn off Wi-Fi.", check=None, **start_state):
    return {"id": "t", "goal": goal, "start": start_state,
            "check": check or {"kind": "setting", "name": "global/wifi_on", "value": "0"}}


async def test_an_episode_reaches_its_goal_through_the_tools_and_the_reward_scores_it():
    env = AndroidEnv(few_shot=False)
    reset, manager, call = await start(env, task(settings={"global/wifi_on": "1"}))
    assert reset.messages[-1].content.startswith("Task: Turn off Wi-Fi.\n\nScreen: com.android.launcher3")
    assert {t.name for t in reset.tools} == {"tap", "long_press", "swipe", "type_text", "press_key", "open_app", "wait"}
    result = await call("open_app", app="Settings")
    assert result.ok and result.content.startswith("Opened Settings.\nScreen: com.android.settings")
    wifi = next(e for e in reset.state["screen"].elements if e.label == "Wi-Fi")
    result = await call("tap", element=wifi.number)
    assert result.content.startswith(f'Tapped element {wifi.number} (LinearLayout "Wi-Fi").')
    assert '"Wi-Fi" unchecked' in result.content
    step = await env.step(reset.state, ParsedTurn(text="Done.", content="Done."), [])
    assert step.done and step.final_answer == "Done."
    await env.close(reset.state)
    await manager.close()
    assert reset.state["success"] is True and reset.state["actions"] == 2
    reward = AndroidTaskReward()
    context = RewardContext(state=reset.state, tool_names=frozenset(), _tool_manager=manager, _sample={},
                            _trajectory=Trajectory(sample_id="t", prompt_ids=[]))
    out = reward.score(None, {}, context)
    assert out.value == 1.0 and out.correct is True and out.components == {"success": 1.0, "actions": 2.0}


async def test_bad_actions_are_error_observations_never_crashes():
    env = AndroidEnv(few_shot=False)
    reset, manager, call = await start(env, task(app="Contacts"))
    shown = len(reset.state["screen"].elements)
    cases = [
        (dict(name="tap", element=99), f"tap: there is no element 99 on the screen (the elements shown are 1-{shown})"),
        (dict(name="tap", x=5000, y=10), "tap: (5000,10) is off the screen, which is 1080x2400"),
        (dict(name="tap"), "tap: give the number of an element on the screen"),
        (dict(name="long_press", element=1, x=3, y=3), "give an element number or x and y, not both"),
        (dict(name="type_text", text="hi", element=2), 'type_text: element 2 (TextView "Contacts") is not a text field'),
        (dict(name="type_text", text="hi"), "type_text: no text field is focused"),
        (dict(name="press_key", key="volume_up"), "invalid arguments for press_key"),
        (dict(name="open_app", app="Mail"), "invalid arguments for open_app"),
        (dict(name="swipe", direction="sideways"), "invalid arguments for swipe"),
        (dict(name="tap", element="3"), "invalid arguments for tap"),
    ]
    for arguments, message in cases:
        name = arguments.pop("name")
        result = await call(name, **arguments)
        assert result.error == "invalid_arguments", (name, arguments, result)
        assert message in result.content, (message, result.content)
        assert "\n" not in result.content  # one line
    assert reset.state["actions"] == 0  # nothing reached the device
    # and the episode goes on: a good action still works
    fab = next(e for e in reset.state["screen"].elements if e.label == "Create contact")
    assert (await call("tap", element=fab.number)).ok
    name_field = reset.state["screen"].find("name_field")
    result = await call("type_text", text="Rosa Allen", element=name_field.number)
    assert result.ok and 'EditText "Rosa Allen"' in result.content
    assert (await call("type_text", text=" Jr")).ok  # the tapped field kept the focus
    assert reset.state["screen"].find("name_field").text == "Rosa Allen Jr"
    await env.close(reset.state)
    await manager.close()


async def test_tap_at_a_point_taps_what_is_there():
    env = AndroidEnv(few_shot=False)
    reset, manager, call = await start(env, task(settings={"global/wifi_on": "1"}))
    result = await call("tap", x=210, y=2025)  # inside the launcher's Settings icon (60-360, 1900-2150)
    assert result.ok and result.content.startswith("Tapped (210,2025).\nScreen: com.android.settings")
    result = await call("tap", x=100, y=336)  # a point of the Wi-Fi row (252-420), left of its switch
    assert result.ok and '"Wi-Fi" unchecked' in result.content
    assert reset.state["device"].get_setting("global/wifi_on") == "0"
    result = await call("tap", x=1079, y=2399)  # the screen's last pixel: on it, nothing there to tap
    assert result.ok and result.content.startswith("Tapped (1079,2399).\nScreen: com.android.settings")
    result = await call("tap", x=1080, y=2399)  # one past it
    assert result.error == "invalid_arguments" and "(1080,2399) is off the screen" in result.content
    assert reset.state["actions"] == 3
    await env.close(reset.state)
    await manager.close()
    assert reset.state["success"] is True


async def test_swipe_moves_the_finger_across_3_4_of_the_screen_or_element_and_scrolls_lists():
    env = AndroidEnv(few_shot=False)
    reset, manager, call = await start(env, task(notes=[f"note {i}" for i in range(30)], app="Notes"))
    phone = reset.state["device"]
    swipes = []
    real_swipe = phone.swipe

    def recorded(x1, y1, x2, y2, *rest):
        swipes.append((x1, y1, x2, y2))
        real_swipe(x1, y1, x2, y2, *rest)
    phone.swipe = recorded

    def listed():
        return [e.label for e in reset.state["screen"].elements if e.long_clickable]
    assert listed()[0] == "note 0" and len(listed()) == 12
    the_list = next(e for e in reset.state["screen"].elements if e.scrollable)
    assert the_list.bounds == (0, 252, 1080, 2274)
    # across the list: its center (540,1263), 3/8 of its 2022 px height (758) either side
    result = await call("swipe", direction="up", element=the_list.number)
    assert result.ok and result.content.startswith("Swiped up.\nScreen: com.rlfactory.notes")
    assert swipes[-1] == (540, 2021, 540, 505)
    assert listed()[0] == "note 9"  # 1516 px up: 9 rows of 168 px further down the list
    result = await call("swipe", direction="down", element=the_list.number)
    assert swipes[-1] == (540, 505, 540, 2021) and listed()[0] == "note 0"
    # across the screen: its center (540,1200), 3/8 of 2400 (900) and of 1080 (405) either side
    await call("swipe", direction="up")
    assert swipes[-1] == (540, 2100, 540, 300) and listed()[0] == "note 11"  # 1800 px: 11 rows
    await call("swipe", direction="up")
    assert listed()[0] == "note 18" and listed()[-1] == "note 29"  # as far as the list goes
    shown = render_screen(reset.state["screen"])
    result = await call("swipe", direction="left")
    assert swipes[-1] == (945, 1200, 135, 1200)
    assert result.content == "Swiped left.\n" + shown  # a sideways swipe does not scroll the list
    await call("swipe", direction="right")
    assert swipes[-1] == (135, 1200, 945, 1200)
    assert reset.state["actions"] == 6 and len(swipes) == 6
    await env.close(reset.state)
    await manager.close()


async def test_press_key_back_home_and_enter():
    env = AndroidEnv(few_shot=False)
    reset, manager, call = await start(env, task(app="Contacts", contacts=[{"name": "Ann Lee", "phone": "555-0101"}]))
    fab = next(e for e in reset.state["screen"].elements if e.label == "Create contact")
    await call("tap", element=fab.number)
    name_field = reset.state["screen"].find("name_field")
    await call("type_text", text="Zoe", element=name_field.number)
    form = render_screen(reset.state["screen"])
    result = await call("press_key", key="enter")  # the form's fields are one line: enter changes nothing
    assert result.ok and result.content == "Pressed enter.\n" + form
    result = await call("press_key", key="back")  # back leaves the form for the list, saving nothing
    assert result.ok and result.content.startswith("Pressed back.\nScreen: com.android.contacts")
    assert reset.state["screen"].find("name_field") is None and "Ann Lee" in result.content
    row = next(e for e in reset.state["screen"].elements if e.label == "Ann Lee")
    await call("long_press", element=row.number)
    assert "Delete contact?" in render_screen(reset.state["screen"])
    result = await call("press_key", key="back")  # back closes a dialog, and only the dialog
    assert "Delete contact?" not in result.content and "Ann Lee" in result.content
    result = await call("press_key", key="home")
    assert result.ok and result.content.startswith("Pressed home.\nScreen: com.android.launcher3")
    assert reset.state["device"].list_contacts() == [("Ann Lee", "555-0101")]
    assert reset.state["actions"] == 7
    await env.close(reset.state)
    await manager.close()


async def test_wait_shows_the_screen_and_refuses_more_than_10_seconds():
    env = AndroidEnv(few_shot=False)
    reset, manager, call = await start(env, task(app="Settings"))
    shown = render_screen(reset.state["screen"])
    for seconds, said in ((2, "2"), (0.5, "0.5"), (10, "10")):
        result = await call("wait", seconds=seconds)
        assert result.ok and result.content == f"Waited {said} s.\n{shown}"
    for seconds in (10.5, 60, -1, "2"):
        result = await call("wait", seconds=seconds)
        assert result.error == "invalid_arguments" and "invalid arguments for wait" in result.content, seconds
    result = await call("wait")
    assert result.error == "invalid_arguments" and "invalid arguments for wait" in result.content
    assert reset.state["actions"] == 3  # the waits done count as actions; the refused ones do not
    await env.close(reset.state)
    await manager.close()


async def test_a_device_failure_is_a_device_error_observation():
    env = AndroidEnv(few_shot=False)
    reset, manager, call = await start(env, task())

    def broken(*args, **kwargs):
        raise DeviceError("the device went away")
    reset.state["device"].press_key = broken
    result = await call("press_key", key="back")
    assert result.error == "tool_error" and result.metadata["tool_error"] == "device_error"
    assert result.content == "Error: the device went away"
    await env.close(reset.state)
    await manager.close()


async def test_devices_are_leased_one_per_trajectory_and_reused():
    env = AndroidEnv(few_shot=False, devices=2)
    resets = await asyncio.gather(*(env.reset(task()) for _ in range(2)))
    devices = [r.state["device"] for r in resets]
    assert devices[0] is not devices[1]
    third = asyncio.ensure_future(env.reset(task()))
    await asyncio.sleep(0.05)
    assert not third.done()  # both phones are in use: the third trajectory waits
    await env.close(resets[0].state)
    reset = await asyncio.wait_for(third, 5)
    assert reset.state["device"] is devices[0]
    await env.close(reset.state)
    await env.close(resets[1].state)


def test_success_checks_read_the_device_state():
    phone = SimulatedPhone()
    phone.reset(StartState(contacts=(("Ann Lee", "+1 (555) 0101"),), notes=("Buy milk",), app="Contacts"), APPS)
    assert evaluate_check(phone, Check("contact_exists", "ann lee", "15550101"))[0]
    assert not evaluate_check(phone, Check("contact_exists", "Ann Lee", "555-9999"))[0]
    assert not evaluate_check(phone, Check("contact_absent", "Ann Lee"))[0]
    assert evaluate_check(phone, Check("note_exists", "", " buy MILK "))[0]
    assert evaluate_check(phone, Check("setting", "global/wifi_on", "1")) == (True, "global/wifi_on = 1")
    tap_label(phone, "Create contact")
    phone.tap(*screen_of(phone).find("name_field").center)
    phone.input_text("Zoe")
    assert evaluate_check(phone, Check("text_field", "name_field", "Zoe"))[0]


def test_the_reward_counts_an_unreadable_check_and_skips_other_episodes():
    reward = AndroidTaskReward()

    def context(state):
        return RewardContext(state=state, tool_names=frozenset(), _tool_manager=None, _sample={},
                             _trajectory=Trajectory(sample_id="t", prompt_ids=[]))
    assert reward.score(None, {}, context({"db_path": "x"})) is None
    from rlfactory_android.tasks import read_task
    state = {"task": read_task(task(), "t"), "success": None, "check_error": "no notes app", "actions": 0}
    with pytest.raises(RuntimeError, match="could not be read: no notes app"):
        reward.score(None, {}, context(state))
    state.update(success=False, check_error=None)
    assert reward.score(None, {}, context(state)).value == 0.0


# --------------------------------------------------------------------------- whole episodes


def scripted_moves(parser, moves):
    """A stand-in policy for the rollout engine (the reply of a ScriptedBackend): per goal,
    its moves, each a tool call written in ``parser``'s format or a final answer. It reads the
    screen it was last shown: a call's ``"element": "Wi-Fi"`` becomes that element's number
    on it."""

    def reply(prompt):
        episode = prompt.rsplit("Task: ", 1)[1]  # after the worked examples
        goal = episode.split("\n", 1)[0]
        # the turns the model took in this episode: the role lines of the template (its markup
        # tokens are left out of the text), less the one of the turn to write
        move = moves[goal][len(re.findall(r"^assistant$", episode, re.M)) - 1]
        if isinstance(move, str):
            return move
        name, arguments = move
        if isinstance(arguments.get("element"), str):
            screen = episode.rsplit("Screen: ", 1)[1]
            number = re.search(r'^\[(\d+)\] \S+ "%s"' % re.escape(arguments["element"]), screen, re.M).group(1)
            arguments = {**arguments, "element": int(number)}
        return parser.format_tool_call(ToolCall(name=name, arguments=arguments))

    return reply


async def test_episodes_through_the_agent_loop_and_the_reward_layer():
    """Two built-in tasks through the rollout engine as `rlf train --env android` builds it (the
    env's defaults: the pythonic parser, no worked examples, screens without coordinates, the
    tool manager, the reward layer of `android_task`; the embedded model's chat template) with a scripted model: open
    Settings, tap a row by its number on the screen, answer "Done.". The right row passes the
    task's check and scores 1; the wrong row scores 0."""
    from rlfactory_core import ChatTemplate, TemplateFamily, load_tokenizer
    from rlfactory_core.testing import (DEFAULT_MODEL, RolloutConfig, build_task, load_config, prepare_model,
                                        rollout)

    config = load_config([], [], flags={"env": "android"})
    built = build_task(config)
    env = built.env
    assert not env.few_shot and not env.coordinates and built.parser.name == "pythonic"
    samples = {s["id"]: s for s in env.dataset(None, "train")}
    samples = [samples["train-setting-wifi_on-off"], samples["train-setting-zen_mode-off"]]
    assert [s["goal"] for s in samples] == ["Turn off Wi-Fi.", "Turn off Do not disturb."]
    chat = ChatTemplate(load_tokenizer(prepare_model(DEFAULT_MODEL)))
    model = ScriptedBackend(chat.tokenizer, scripted_moves(built.parser, {
        "Turn off Wi-Fi.": [("open_app", {"app": "Settings"}), ("tap", {"element": "Wi-Fi"}), "Done."],
        "Turn off Do not disturb.": [("open_app", {"app": "Settings"}), ("tap", {"element": "Wi-Fi"}), "Done."],
    }), end_token_id=chat.turn_end_id)
    try:
        trajectories = await rollout(samples, env=env, family=TemplateFamily(chat, built.parser),
                                     tool_manager=built.tool_manager, backend=model,
                                     config=RolloutConfig(**config.rollout.model_dump()))
        for trajectory in trajectories:
            assert trajectory.stop_reason == "env_done" and trajectory.num_turns == 3, trajectory.metadata
            assert [c.name for c in trajectory.tool_calls] == ["open_app", "tap"]
            assert all(r.ok for r in trajectory.tool_results) and trajectory.final_answer == "Done."
            opened, tapped = trajectory.tool_results
            assert opened.content.startswith("Opened Settings.\nScreen: com.android.settings")
            assert re.match(r'Tapped element \d+ \(LinearLayout "Wi-Fi"\)\.\n', tapped.content)
        assert '"Wi-Fi" unchecked' in trajectories[0].tool_results[1].content
        right, wrong = (t.env_state for t in trajectories)
        assert (right["success"], right["check"]) == (True, "global/wifi_on = 0")
        # the wrong row leaves Do not disturb on, and switching Wi-Fi is a side effect, named
        wifi_before = samples[1]["start"]["settings"]["global/wifi_on"]
        assert (wrong["success"], wrong["check"]) == (
            False, f"global/zen_mode = 1; also changed: global/wifi_on {wifi_before} -> {1 - int(wifi_before)}")
        assert right["released"] and wrong["released"]  # closed by the loop: checked, phone given back
        scored = await built.rewards.score(trajectories, samples)
        assert scored.totals == [1.0, 0.0] and scored.correct == [True, False]
        metrics = scored.metrics("reward")
        assert metrics["reward/accuracy"] == 0.5 and metrics["reward/android_task/success"] == 0.5
        assert metrics["reward/android_task/actions"] == 2.0 and metrics["reward/errors"] == 0.0
    finally:
        await built.close()


# --------------------------------------------------------------------------- tasks and config


def test_the_built_in_task_files_are_what_builtin_tasks_makes():
    assert BUILTIN_SPLITS == ("train", "validation", "test", "test_layouts")
    for split in BUILTIN_SPLITS:
        lines = (BUILTIN_DIR / f"{split}.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in lines] == builtin_tasks(split)
    train, validation, test, layouts = (load_tasks(BUILTIN_DIR / f"{split}.jsonl") for split in BUILTIN_SPLITS)
    kinds = {"setting", "contact_exists", "contact_absent", "text_field", "note_exists"}
    assert {t.check.kind for t in train} == {t.check.kind for t in validation} == kinds
    assert len(validation) == len(test) == 28
    names = lambda tasks: {t.check.name for t in tasks if t.check.kind.startswith("contact")}  # noqa: E731
    notes = lambda tasks: {t.check.value for t in tasks if t.check.kind == "note_exists"}  # noqa: E731
    assert len(layouts) >= 60 and {t.check.kind for t in layouts} == kinds
    for one, other in ((train, test), (train, validation), (validation, test), (train, layouts)):  # unseen
        assert not names(one) & names(other) and not notes(one) & notes(other)
    assert AndroidEnv(few_shot=False).dataset(None, "validation")[0]["id"] == "validation-setting-wifi_on-on"


async def test_every_built_in_task_is_solvable_on_the_simulated_phone_and_fails_untouched():
    """A scripted agent solves every task through the env's tools; doing nothing fails every one
    (the start state never already satisfies the check)."""
    env = AndroidEnv(few_shot=False)
    for row in env.dataset(None, "train") + env.dataset(None, "validation") + env.dataset(None, "test"):
        reset, manager, call = await start(env, row)
        await env.close(reset.state)
        assert reset.state["success"] is False, row["id"]
        reset, manager, call = await start(env, row)
        await solve(row, reset.state, call)
        await env.close(reset.state)
        await manager.close()
        assert reset.state["success"] is True, (row["id"], reset.state["check"])


async def solve(row, state, call):
    """A scripted solution of a built-in task, through the tools."""
    def number(label):
        return next(e.number for e in state["screen"].elements if e.label == label)
    check, goal = row["check"], row["goal"]
    if check["kind"] == "setting":
        await call("open_app", app="Settings")
        title = goal.removeprefix("Turn on ").removeprefix("Turn off ").rstrip(".")
        await call("tap", element=number(title))
    elif check["kind"] == "contact_exists":
        await call("open_app", app="Contacts")
        await call("tap", element=number("Create contact"))
        await call("type_text", text=check["name"], element=state["screen"].find("name_field").number)
        await call("type_text", text=check["value"], element=state["screen"].find("phone_field").number)
        await call("tap", element=number("Save"))
    elif check["kind"] == "contact_absent":
        await call("open_app", app="Contacts")
        await call("long_press", element=number(check["name"]))
        await call("tap", element=number("Delete"))
    elif check["kind"] == "text_field":
        await call("tap", element=number("Create contact"))
        await call("type_text", text=check["value"], element=state["screen"].find("name_field").number)
    else:
        await call("open_app", app="Notes")
        await call("tap", element=number("New note"))
        await call("type_text", text=check["value"])
        await call("tap", element=number("Save"))


def test_bad_options_and_task_files_are_reported_all_at_once(tmp_path):
    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"goal": "x", "check": {"kind": "setting", "name": "wifi", "value": "0"}}\n'
                   "not json\n"
                   '{"goal": "y", "check": {"kind": "teleport"}}\n'
                   '{"goal": "z", "start": {"app": "Mail"}, "check": {"kind": "contact_absent", "name": "A"}}\n')
    with pytest.raises(ConfigError) as info:
        AndroidEnv(backend="ios", devices=0, colour="blue", splits={"test": str(tmp_path / "missing.jsonl")},
                   coordinates="no")
    text = str(info.value)
    for part in ("env_options.colour: unknown option", "env_options.backend: must be one of simulated, adb",
                 "env_options.devices", "env_options.splits.test: no task file",
                 "env_options.coordinates: must be true or false, got 'no'"):
        assert part in text, part
    env = AndroidEnv(splits={"test": str(bad)})
    with pytest.raises(ConfigError) as info:
        env.dataset(None, "test")
    text = str(info.value)
    assert "tasks.jsonl:1: check: setting 'wifi': write it as <namespace>/<key>" in text
    assert "tasks.jsonl:2: not JSON" in text and "tasks.jsonl:3: check.kind must be one of" in text
    bad.write_text('{"goal": "z", "start": {"app": "Mail"}, "check": {"kind": "contact_absent", "name": "A"}}\n')
    with pytest.raises(ConfigError, match=r"start.app 'Mail' is not one of the apps \(Settings, Contacts, Notes\)"):
        env.dataset(None, "test")


def test_registered_through_the_plugin_manager_with_a_worked_example_in_the_runs_parser():
    from rlfactory_core.testing import build_task, load_config

    assert get_component("env", "android") is AndroidEnv
    assert get_component("reward", "android_task") is AndroidTaskReward
    built = build_task(load_config([], ["parser=qwen3", "env_options={few_shot: true}"], flags={"env": "android"}))
    assert isinstance(built.env, AndroidEnv) and built.parser.name == "qwen3"
    example = built.env._example_messages()
    assert '<tool_call>\n{"name": "open_app", "arguments": {"app": "Settings"}}\n</tool_call>' in example[1].content
    assert "Done." in [m.content for m in example if m.role == "assistant"]  # one task done to the end
    assert [m.role for m in example[-2:]] == ["user", "assistant"]  # then first steps, each after its screen
    assert example[-2].content.startswith("Task: Add a contact") and '"open_app"' in example[-1].content
