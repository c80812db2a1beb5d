"""Tests of the adb backend (:mod:`rlfactory_android.adb`).

There is no Android device on CI. ``fake_adb.py`` (next to this file) is a FAKE adb: it logs
its arguments and answers from canned outputs shaped like real adb's, so these tests check
the exact commands sent, how outputs are parsed, and how failures (timeouts, a missing
binary, a dead device) become ``DeviceError``. They cannot show that a real device accepts
the commands.

The dumps in ``dumps/`` are written by hand in uiautomator's format, not captured from a
device: ``settings_main.xml`` as the ``uiautomator dump`` shell command writes it (one line,
the classic attributes), ``contacts_new.xml`` and ``launcher_home.xml`` as the newer AndroidX
dumper writes them (indented, with ``drawing-order``, ``hint`` and ``display-id``; the
launcher dump holds two windows, the launcher's and the status bar's). Details follow real
behaviour: an empty EditText reports its hint as its text, AOSP spells "Wi‑Fi" with a
non-breaking hyphen (U+2011), a row cut off by the list's edge has clipped bounds.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import shlex
import string
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlfactory_android import adb, adb_pool
from rlfactory_android.adb import (AdbDevice, AdbDevicePool, escape_input_text, input_text_commands, key_command,
                                   list_devices, long_press_command, parse_devices, parse_screen_size, swipe_command,
                                   tap_command)
from rlfactory_android.device import KEYS, Device, DeviceError, StartState
from rlfactory_android.ui import parse_ui, render_screen


from android_testing import DUMPS, HERE, SERIAL  # noqa: E402
APPS = {"Settings": "com.android.settings", "Contacts": "com.android.contacts"}




@pytest.fixture
def device(fake) -> AdbDevice:
    return AdbDevice(SERIAL, adb_path=fake.path, timeout_s=10)


def typed_on_device(commands: list[list[str]]) -> str:
    """What a device types for these commands: ``adb shell`` joins the arguments with spaces,
    the device shell splits them (POSIX rules), and ``input text`` turns ``%s`` into a space
    exactly as Android's ``InputShellCommand.sendText`` does."""
    typed = ""
    for command in commands:
        assert command[:3] == ["shell", "input", "text"]
        words = shlex.split(" ".join(command[1:]))
        assert words[:2] == ["input", "text"] and len(words) == 3, words
        buff, escape, i = list(words[2]), False, 0
        while i < len(buff):
            if escape:
                escape = False
                if buff[i] == "s":
                    buff[i] = " "
                    i -= 1
                    del buff[i]
            if buff[i] == "%":
                escape = True
            i += 1
        typed += "".join(buff)
    return typed


# --------------------------------------------------------------------------- command construction


def test_tap_long_press_swipe_and_key_commands():
    assert tap_command(5, 7) == ["shell", "input", "tap", "5", "7"]
    assert long_press_command(540, 1200) == ["shell", "input", "swipe", "540", "1200", "540", "1200", "800"]
    assert long_press_command(1, 2, 1500) == ["shell", "input", "swipe", "1", "2", "1", "2", "1500"]
    assert swipe_command(540, 1800, 540, 600) == ["shell", "input", "swipe", "540", "1800", "540", "600", "300"]
    assert swipe_command(0, 1, 2, 3, 50) == ["shell", "input", "swipe", "0", "1", "2", "3", "50"]
    assert key_command("back") == ["shell", "input", "keyevent", "KEYCODE_BACK"]
    assert key_command("home") == ["shell", "input", "keyevent", "KEYCODE_HOME"]
    assert key_command("enter") == ["shell", "input", "keyevent", "KEYCODE_ENTER"]
    assert [key_command(key)[-1] for key in KEYS] == list(KEYS.values())


def test_bad_arguments_are_device_errors():
    with pytest.raises(DeviceError, match="unknown key 'menu'; keys: back, home, enter"):
        key_command("menu")
    with pytest.raises(DeviceError, match="x must be a whole number"):
        tap_command("5; reboot", 7)  # type: ignore[arg-type]
    with pytest.raises(DeviceError, match="whole number"):
        swipe_command(1, 2, 3, 4.5)  # type: ignore[arg-type]
    with pytest.raises(DeviceError, match="not an Android package name"):
        adb.open_app_command("com.android.settings; reboot")


@pytest.mark.parametrize("text, argument", [
    ("hello", "hello"),
    ("hello world", "hello%sworld"),
    ("two  spaces", "two%s%sspaces"),
    ("it's", "'it'\"'\"'s'"),
    ('say "hi"', "'say%s\"hi\"'"),
    ("a&b", "'a&b'"),
    ("a;b", "'a;b'"),
    ("$HOME", "'$HOME'"),
    ("`id`", "'`id`'"),
    ("a|b>c<d", "'a|b>c<d'"),
    ("(x)*?#~!", "'(x)*?#~!'"),
    ("back\\slash", "'back\\slash'"),
    ("50% off", "50%%soff"),
    ("user@example.com", "user@example.com"),
])
def test_input_text_escaping(text, argument):
    assert escape_input_text(text) == argument
    assert input_text_commands(text) == [["shell", "input", "text", argument]]
    assert typed_on_device(input_text_commands(text)) == text


def test_a_literal_percent_s_is_typed_in_two_calls():
    # `input text` reads any %s as a space, so "%" and "s" must go in separate calls
    assert input_text_commands("100%sure") == [["shell", "input", "text", "100%"], ["shell", "input", "text", "sure"]]
    assert typed_on_device(input_text_commands("100%sure")) == "100%sure"
    assert typed_on_device(input_text_commands("a %s b %%s")) == "a %s b %%s"
    assert input_text_commands("") == []


@given(st.text(alphabet=string.printable.replace("\n", "").replace("\r", "").replace("\t", "")
               .replace("\x0b", "").replace("\x0c", ""), max_size=40))
def test_any_printable_ascii_text_reaches_the_device_unchanged(text):
    assert typed_on_device(input_text_commands(text)) == text


@pytest.mark.parametrize("text, message", [
    ("café", "only types ASCII"),
    ("你好", "only types ASCII"),
    ("Wi\u2011Fi", "only types ASCII"),
    ("line\nbreak", "control character"),
    ("tab\there", "control character"),
])
def test_input_text_refuses_what_input_text_cannot_type(text, message):
    with pytest.raises(DeviceError, match=message):
        input_text_commands(text)


def test_setting_commands():
    assert adb.get_setting_command("global/wifi_on") == ["shell", "settings", "get", "global", "wifi_on"]
    assert adb.put_setting_commands("global/wifi_on", "1") == [["shell", "svc", "wifi", "enable"]]
    assert adb.put_setting_commands("global/wifi_on", "0") == [["shell", "svc", "wifi", "disable"]]
    assert adb.put_setting_commands("global/bluetooth_on", "1") == [["shell", "svc", "bluetooth", "enable"]]
    assert adb.put_setting_commands("global/airplane_mode_on", "1") == [
        ["shell", "cmd", "connectivity", "airplane-mode", "enable"]]
    assert adb.put_setting_commands("system/screen_off_timeout", "600000") == [
        ["shell", "settings", "put", "system", "screen_off_timeout", "600000"]]
    assert adb.put_setting_commands("secure/some_text", "a b;c") == [
        ["shell", "settings", "put", "secure", "some_text", "'a b;c'"]]
    with pytest.raises(DeviceError, match="takes 1 \\(on\\) or 0 \\(off\\)"):
        adb.put_setting_commands("global/wifi_on", "on")
    with pytest.raises(DeviceError, match="<namespace>/<key>"):
        adb.get_setting_command("wifi_on")


def test_parse_screen_size():
    assert parse_screen_size("Physical size: 1080x2400\n") == (1080, 2400)
    assert parse_screen_size("Physical size: 1440x3120\r\nOverride size: 1080x2400\r\n") == (1080, 2400)
    with pytest.raises(DeviceError, match="printed no screen size"):
        parse_screen_size("cmd: Can't find service: window\n")


def test_parse_devices():
    output = ("* daemon not running; starting now at tcp:5037\n* daemon started successfully\n"
              "List of devices attached\nemulator-5554\tdevice\nemulator-5556\toffline\n"
              "R58M123ABCD\tunauthorized\n192.168.1.20:5555\tdevice\n0123456789ABCDEF\tno permissions\n\n")
    assert parse_devices(output) == ["emulator-5554", "192.168.1.20:5555"]
    # `adb devices -l` adds columns after the state
    assert parse_devices("List of devices attached\nemulator-5554 device product:sdk_gphone64 model:Pixel_6\n") == [
        "emulator-5554"]
    assert parse_devices("List of devices attached\n\n") == []


# --------------------------------------------------------------------------- a device, through the fake adb


def test_adb_device_implements_the_device_protocol(device):
    assert isinstance(device, Device)
    for name, member in vars(Device).items():
        if callable(member) and not name.startswith("_"):
            assert inspect.signature(getattr(AdbDevice, name)) == inspect.signature(member), name


def test_input_operations_send_these_commands(device, fake):
    device.tap(5, 7)
    device.long_press(100, 200)
    device.swipe(540, 1800, 540, 600, 250)
    device.press_key("back")
    device.input_text("Alice Smith & co")
    device.open_app("com.android.settings")
    assert fake.calls() == [
        ["-s", SERIAL, "shell", "input", "tap", "5", "7"],
        ["-s", SERIAL, "shell", "input", "swipe", "100", "200", "100", "200", "800"],
        ["-s", SERIAL, "shell", "input", "swipe", "540", "1800", "540", "600", "250"],
        ["-s", SERIAL, "shell", "input", "keyevent", "KEYCODE_BACK"],
        ["-s", SERIAL, "shell", "input", "text", "'Alice%sSmith%s&%sco'"],
        ["-s", SERIAL, "shell", "monkey", "-p", "com.android.settings", "-c", "android.intent.category.LAUNCHER", "1"],
    ]


def test_input_text_refused_sends_nothing(device, fake):
    with pytest.raises(DeviceError, match="ASCII"):
        device.input_text("naïve")
    assert fake.calls() == []


def test_open_app_of_a_package_without_launcher_activity(device):
    with pytest.raises(DeviceError, match="cannot open com.example.missing: it is not installed"):
        device.open_app("com.example.missing")


def test_screen_size_is_read_once_and_the_override_wins(device, fake):
    assert device.screen_size == (1080, 2400)
    assert device.screen_size == (1080, 2400)
    assert fake.commands() == [["shell", "wm", "size"]]


def test_dump_ui_dumps_to_a_file_and_reads_it(device, fake, monkeypatch):
    monkeypatch.setenv("FAKE_ADB_DUMP", str(DUMPS / "settings_main.xml"))
    assert device.dump_ui() == (DUMPS / "settings_main.xml").read_text(encoding="utf-8")
    assert fake.commands() == [["shell", "uiautomator", "dump", "/sdcard/window_dump.xml"],
                               ["exec-out", "cat", "/sdcard/window_dump.xml"]]


def test_a_failed_dump_is_an_error_not_a_stale_file(device, fake):
    # uiautomator exits 0 when it cannot dump; the file on the device is then the previous screen
    with pytest.raises(DeviceError, match="uiautomator could not dump the screen \\(ERROR: could not get idle"):
        device.dump_ui()
    assert fake.commands() == [["shell", "uiautomator", "dump", "/sdcard/window_dump.xml"]]


def test_the_screen_as_the_env_reads_it(device, monkeypatch):
    monkeypatch.setenv("FAKE_ADB_DUMP", str(DUMPS / "contacts_new.xml"))
    screen = parse_ui(device.dump_ui(), device.screen_size)
    assert screen.package == "com.android.contacts" and screen.size == (1080, 2400)
    assert screen.find("editor_menu_save_button").label == "Save"


def test_screenshot_is_png(device, fake, monkeypatch):
    data = device.screenshot()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and b"IHDR" in data and data.endswith(b"IEND\xaeB`\x82")
    assert fake.commands() == [["exec-out", "screencap", "-p"]]
    monkeypatch.setenv("FAKE_ADB_BAD_PNG", "1")
    with pytest.raises(DeviceError, match="did not return a PNG image"):
        device.screenshot()


def test_get_setting(device, fake):
    assert device.get_setting("global/wifi_on") == "0"
    assert device.get_setting("secure/ui_night_mode") is None  # `settings get` prints "null" when unset
    assert fake.commands() == [["shell", "settings", "get", "global", "wifi_on"],
                               ["shell", "settings", "get", "secure", "ui_night_mode"]]
    with pytest.raises(DeviceError, match="namespace"):
        device.get_setting("bogus/wifi_on")


def test_list_contacts_joins_names_and_phones(device, fake, monkeypatch):
    # Alice has a phone and a phone row whose number is NULL; Bob has no phone at all
    assert device.list_contacts() == [("Alice Smith", "+1 555-0100"), ("Bob", "")]
    assert fake.commands() == [
        ["shell", "content", "query", "--uri", "content://com.android.contacts/contacts", "--projection",
         "_id:display_name"],
        ["shell", "content", "query", "--uri", "content://com.android.contacts/data/phones", "--projection",
         "contact_id:data1"]]
    monkeypatch.setenv("FAKE_ADB_NO_CONTACTS", "1")
    assert device.list_contacts() == []


def test_a_provider_error_is_a_device_error(device, fake, monkeypatch):
    # `content` prints provider errors and exits 0: its output is read
    monkeypatch.setenv("FAKE_ADB_PROVIDER_ERROR", "1")
    with pytest.raises(DeviceError, match="`content query` on content://com.android.contacts/contacts failed "
                                          "\\(Error while accessing provider:com.android.contacts\\)"):
        device.list_contacts()
    with pytest.raises(DeviceError, match="`content insert` on content://com.android.contacts/raw_contacts failed"):
        device.reset(StartState(contacts=(("Bob", ""),)), APPS)


def test_parse_content_rows():
    rows = adb.parse_content_rows("Row: 0 _id=1, display_name=Smith, Alice\nRow: 1 _id=7, display_name=NULL\n",
                                  adb._CONTACT_ROW)
    assert rows == [("1", "Smith, Alice"), ("7", "NULL")]
    assert adb.parse_content_rows("No result found.\n", adb._CONTACT_ROW) == []
    # a display name with a line break continues on a line of its own
    assert adb.parse_content_rows("Row: 0 _id=1, display_name=Two\nlines\n", adb._CONTACT_ROW) == [("1", "Two")]
    with pytest.raises(DeviceError, match="unexpected row"):
        adb.parse_content_rows("Row: 0 name=x\n", adb._CONTACT_ROW)


def test_list_notes_has_no_real_device_app(device, fake):
    with pytest.raises(DeviceError, match="a real device has no standard notes app; note tasks need the simulated"):
        device.list_notes()
    assert fake.calls() == []


def test_reset_sends_this_sequence(device, fake):
    start = StartState(settings={"global/wifi_on": "1", "global/bluetooth_on": "0", "global/airplane_mode_on": "0",
                                 "system/screen_off_timeout": "600000"},
                       contacts=(("Alice Smith", "+1 555-0100"), ("Bob", "")), app="Contacts")
    device.reset(start, APPS)
    contacts = "content://com.android.contacts"
    new_raw_contact = ["shell", "content", "insert", "--uri", f"{contacts}/raw_contacts",
                       "--bind", "account_type:s:", "--bind", "account_name:s:"]
    raw_contact_ids = ["shell", "content", "query", "--uri", f"{contacts}/raw_contacts", "--projection", "_id"]

    def data_row(raw_id, mimetype, *bindings):
        command = ["shell", "content", "insert", "--uri", f"{contacts}/data", "--bind", f"raw_contact_id:i:{raw_id}",
                   "--bind", f"mimetype:s:vnd.android.cursor.item/{mimetype}"]
        for binding in bindings:
            command += ["--bind", binding]
        return command

    assert fake.commands() == [
        ["shell", "am", "force-stop", "com.android.settings"],
        ["shell", "am", "force-stop", "com.android.contacts"],
        ["shell", "input", "keyevent", "KEYCODE_HOME"],
        ["shell", "svc", "wifi", "enable"],
        ["shell", "svc", "bluetooth", "disable"],
        ["shell", "cmd", "connectivity", "airplane-mode", "disable"],
        ["shell", "settings", "put", "system", "screen_off_timeout", "600000"],
        ["shell", "pm", "clear", "com.android.providers.contacts"],
        new_raw_contact,
        raw_contact_ids,  # the fake answers _id=1
        data_row(1, "name", "'data1:s:Alice Smith'"),
        data_row(1, "phone_v2", "'data1:s:+1 555-0100'", "data2:i:2"),
        new_raw_contact,
        raw_contact_ids,  # _id=1 and _id=2: the new one is the highest
        data_row(2, "name", "data1:s:Bob"),
        ["shell", "monkey", "-p", "com.android.contacts", "-c", "android.intent.category.LAUNCHER", "1"],
    ]
    # the device shell sees each binding as one word
    assert shlex.split(" ".join(fake.commands()[10]))[-1] == "data1:s:Alice Smith"


def test_reset_to_the_home_screen_without_contacts(device, fake):
    device.reset(StartState(), {"Settings": "com.android.settings"})
    assert fake.commands() == [["shell", "am", "force-stop", "com.android.settings"],
                               ["shell", "input", "keyevent", "KEYCODE_HOME"],
                               ["shell", "pm", "clear", "com.android.providers.contacts"]]


@pytest.mark.parametrize("start, message", [
    (StartState(notes=("buy milk",)), "a real device has no standard notes app"),
    (StartState(app="Notes"), "unknown app 'Notes'; apps: Settings, Contacts"),
    (StartState(contacts=(("Dr: Who", "1"),)), "cannot write ':'"),
    (StartState(settings={"global/wifi_on": "yes"}), "takes 1 \\(on\\) or 0 \\(off\\)"),
])
def test_reset_refuses_before_touching_the_device(device, fake, start, message):
    with pytest.raises(DeviceError, match=message):
        device.reset(start, APPS)
    assert fake.calls() == []


def test_healthy(fake, monkeypatch):
    assert AdbDevice(SERIAL, adb_path=fake.path).healthy() is True
    assert fake.calls() == [["-s", SERIAL, "get-state"]]
    monkeypatch.setenv("FAKE_ADB_DEAD", "dead-1")
    assert AdbDevice("dead-1", adb_path=fake.path).healthy() is False
    monkeypatch.setenv("FAKE_ADB_HANG", "hung-1")
    assert AdbDevice("hung-1", adb_path=fake.path, timeout_s=0.5).healthy() is False
    assert AdbDevice(SERIAL, adb_path=str(Path(fake.path).parent / "no-such-adb")).healthy() is False


def test_a_command_past_its_time_limit_is_a_device_error(fake, monkeypatch):
    monkeypatch.setenv("FAKE_ADB_HANG", "hung-1")
    with pytest.raises(DeviceError) as caught:
        AdbDevice("hung-1", adb_path=fake.path, timeout_s=0.5).tap(5, 5)
    assert str(caught.value) == ("adb -s hung-1 shell input tap 5 5 timed out after 0.5s; "
                                 "is the device connected and responsive? (adb devices)")


def test_a_failing_command_is_a_one_line_device_error(fake, monkeypatch):
    monkeypatch.setenv("FAKE_ADB_DEAD", "dead-1")
    with pytest.raises(DeviceError) as caught:
        AdbDevice("dead-1", adb_path=fake.path).press_key("home")
    assert str(caught.value) == ("adb -s dead-1 shell input keyevent KEYCODE_HOME failed (exit 1: error: device "
                                 "'dead-1' not found); is the device connected and responsive? (adb devices)")


def test_a_missing_adb_binary_says_how_to_get_one(tmp_path):
    with pytest.raises(DeviceError) as caught:
        AdbDevice(SERIAL, adb_path=str(tmp_path / "adb")).tap(1, 1)
    message = str(caught.value)
    assert "was not found" in message and "platform-tools" in message and "`adb`" in message and "adb_path" in message
    assert "\n" not in message
    with pytest.raises(DeviceError, match="platform-tools"):
        list_devices(str(tmp_path / "adb"))


def test_list_devices_keeps_ready_devices_only(fake):
    assert list_devices(fake.path) == [SERIAL]
    assert fake.calls() == [["devices"]]


# --------------------------------------------------------------------------- the pool


def test_pool_of_every_connected_device(fake):
    pool = AdbDevicePool(None, adb_path=fake.path, timeout_s=5)
    assert pool.serials == [SERIAL]
    assert pool.devices[0].adb_path == fake.path and pool.devices[0].timeout_s == 5


def test_pool_without_devices(fake, monkeypatch):
    monkeypatch.setenv("FAKE_ADB_NO_DEVICES", "1")
    with pytest.raises(DeviceError, match="no Android device is connected"):
        AdbDevicePool(None, adb_path=fake.path, timeout_s=5)
    with pytest.raises(DeviceError, match="list of device serials"):
        AdbDevicePool([], adb_path=fake.path, timeout_s=5)
    with pytest.raises(DeviceError, match="listed twice"):
        AdbDevicePool([SERIAL, SERIAL], adb_path=fake.path, timeout_s=5)


async def test_a_second_lease_waits_for_the_release(fake):
    pool = AdbDevicePool([SERIAL], adb_path=fake.path, timeout_s=5)
    first = await pool.lease()
    assert first.serial == SERIAL
    second = asyncio.create_task(pool.lease())
    await asyncio.sleep(0.3)
    assert not second.done()
    await pool.release(first)
    assert await asyncio.wait_for(second, 10) is first
    await pool.release(first)
    assert [call for call in fake.calls()] == [["-s", SERIAL, "get-state"]] * 2  # checked at each lease


async def test_concurrent_trajectories_each_get_their_own_device(fake):
    pool = AdbDevicePool([SERIAL, "emulator-5556"], adb_path=fake.path, timeout_s=5)
    devices = await asyncio.gather(pool.lease(), pool.lease())
    assert sorted(d.serial for d in devices) == [SERIAL, "emulator-5556"]
    third = asyncio.create_task(pool.lease())
    await asyncio.sleep(0.3)
    assert not third.done()
    await pool.release(devices[1])
    assert await asyncio.wait_for(third, 10) is devices[1]


async def test_an_unhealthy_device_is_skipped_and_reported(fake, monkeypatch, caplog):
    monkeypatch.setenv("FAKE_ADB_DEAD", "dead-1")
    pool = AdbDevicePool(["dead-1", SERIAL], adb_path=fake.path, timeout_s=5)
    with caplog.at_level(logging.WARNING, logger="rlfactory_android.adb"):
        device = await pool.lease()
    assert device.serial == SERIAL
    assert any("dead-1 failed its health check" in record.getMessage() for record in caplog.records)
    # the only healthy device is leased and the other is set aside: the next lease waits
    waiting = asyncio.create_task(pool.lease())
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await pool.release(device)
    assert (await asyncio.wait_for(waiting, 10)).serial == SERIAL


async def test_every_device_unhealthy_is_an_error_and_they_are_retried_later(fake, monkeypatch):
    # the pool's own clock, moved by hand: on a loaded machine the health checks (a process
    # each) may take longer than any short real retry delay
    now = [1000.0]
    monkeypatch.setattr(adb_pool, "time", type("clock", (), {"monotonic": staticmethod(lambda: now[0])}))
    monkeypatch.setenv("FAKE_ADB_DEAD", "dead-1,dead-2")
    pool = AdbDevicePool(["dead-1", "dead-2"], adb_path=fake.path, timeout_s=5, retry_after_s=30)
    with pytest.raises(DeviceError, match="every Android device failed its health check \\(dead-1, dead-2\\)"):
        await pool.lease()
    monkeypatch.setenv("FAKE_ADB_DEAD", "dead-2")  # dead-1 comes back
    now[0] += 29.9
    with pytest.raises(DeviceError, match="every Android device failed"):
        await pool.lease()  # not yet due for another check
    now[0] += 0.2
    assert (await pool.lease()).serial == "dead-1"


async def test_releasing_a_device_that_is_not_leased(fake):
    pool = AdbDevicePool([SERIAL], adb_path=fake.path, timeout_s=5)
    with pytest.raises(ValueError, match="not leased"):
        await pool.release(pool.devices[0])


async def test_a_cancelled_lease_gives_its_device_back(fake):
    pool = AdbDevicePool([SERIAL], adb_path=fake.path, timeout_s=5)
    first = await pool.lease()
    waiting = asyncio.create_task(pool.lease())
    await asyncio.sleep(0.1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await pool.release(first)
    assert await asyncio.wait_for(pool.lease(), 10) is first


# --------------------------------------------------------------------------- uiautomator dumps


def read_dump(name: str):
    return parse_ui((DUMPS / name).read_text(encoding="utf-8"), (1080, 2400))


def test_settings_main_screen():
    screen = read_dump("settings_main.xml")
    assert screen.package == "com.android.settings"
    by_label = {e.label: e for e in screen.elements}
    search = by_label["Search settings"]
    assert (search.number, search.short_class, search.clickable, search.center) == (2, "Toolbar", True, (540, 477))
    network = by_label["Network & internet / Mobile, Wi\u2011Fi, hotspot"]
    assert (network.number, network.clickable, network.checkable, network.center) == (5, True, False, (540, 708))
    # the Wi-Fi row's switch is not clickable itself: the row carries its state
    wifi = by_label["Wi\u2011Fi / AndroidWifi"]
    assert (wifi.number, wifi.checkable, wifi.checked, wifi.center) == (6, True, True, (540, 939))
    assert not any(e.short_class == "Switch" for e in screen.elements)
    recycler = screen.find("recycler_view")
    assert (recycler.number, recycler.scrollable, recycler.label) == (4, True, "")
    # the last row is clipped by the list's edge; it is still listed, by its visible part
    assert screen.elements[-1].label.startswith("Sound & vibration") and screen.elements[-1].center == (540, 2273)
    assert len(screen.elements) == 12
    assert render_screen(screen) == "\n".join([
        "Screen: com.android.settings (1080x2400)",
        '[1] TextView "Settings" id=homepage_title',
        '[2] Toolbar "Search settings" id=search_action_bar clickable at (540,477)',
        '[3] ImageView desc="Account" id=account_avatar clickable at (964,477)',
        "[4] RecyclerView id=recycler_view scrollable at (540,1465)",
        '[5] LinearLayout "Network & internet / Mobile, Wi\u2011Fi, hotspot" clickable at (540,708)',
        '[6] LinearLayout "Wi\u2011Fi / AndroidWifi" checked clickable at (540,939)',
        '[7] LinearLayout "Connected devices / Bluetooth, pairing" clickable at (540,1170)',
        '[8] LinearLayout "Apps / Recent apps, default apps" clickable at (540,1401)',
        '[9] LinearLayout "Notifications / Notification history, conversations" clickable at (540,1632)',
        '[10] LinearLayout "Battery / 100%" clickable at (540,1863)',
        '[11] LinearLayout "Storage / 34% used - 5.28 GB free" clickable at (540,2094)',
        '[12] LinearLayout "Sound & vibration / Volume, haptics, Do Not Disturb" clickable at (540,2273)',
    ])


def test_contacts_create_contact_form():
    screen = read_dump("contacts_new.xml")
    assert screen.package == "com.android.contacts"
    save = screen.find("com.android.contacts:id/editor_menu_save_button")
    assert (save.number, save.short_class, save.label, save.clickable, save.center) == (3, "Button", "Save", True,
                                                                                          (937, 201))
    cancel = screen.element(1)
    assert (cancel.short_class, cancel.desc, cancel.center) == ("ImageButton", "Cancel", (73, 201))
    first = screen.find("first_name")
    assert (first.number, first.text, first.hint, first.editable, first.focused, first.center) == (
        9, "Alice", "First name", True, True, (624, 1116))
    phone = screen.find("phone")
    assert (phone.number, phone.hint, phone.editable, phone.center) == (12, "Phone", True, (472, 1442))
    spinner = screen.find("spinner")
    assert (spinner.desc, spinner.clickable) == ("Mobile Phone", True)
    assert screen.find("editors") is None  # a layout without text or action is not listed
    assert screen.find("contact_editor_fragment").scrollable
    assert [e.hint for e in screen.elements if e.editable] == ["First name", "Last name", "Phone", "Email"]
    assert len(screen.elements) == 17
    assert 'EditText "Alice" hint="First name" id=first_name clickable long-clickable editable focused at (624,1116)' \
        in render_screen(screen)


def test_an_empty_field_showing_its_hint_is_empty():
    """On a device an empty EditText reports its hint as its text (TextView's text for
    accessibility); parse_ui reads it as empty, as the simulated phone writes it."""
    last = read_dump("contacts_new.xml").find("last_name")
    assert (last.text, last.hint) == ("", "Last name")


def test_launcher_home_screen_with_the_status_bar_window():
    screen = read_dump("launcher_home.xml")
    assert screen.package == "com.google.android.apps.nexuslauncher"  # the active window comes first
    icons = [e for e in screen.elements if e.short_class == "TextView" and e.desc and not e.text]
    assert [(e.number, e.desc, e.center) for e in icons] == [
        (3, "Settings", (157, 1701)), (4, "Contacts", (415, 1701)), (5, "Files", (673, 1701)),
        (6, "Camera", (931, 1701)), (7, "Phone", (157, 2017)), (8, "Messages", (415, 2017)),
        (9, "Chrome", (673, 2017)), (10, "Gmail", (931, 2017))]
    assert all(e.clickable and e.long_clickable and e.label == e.desc for e in icons)
    search = screen.find("search_container_hotseat")
    assert (search.desc, search.center) == ("Search", (540, 2231))
    status = [e for e in screen.elements if e.package == "com.android.systemui"]
    assert [(e.label, e.interactive) for e in status] == [("12:30", False), ("Wifi signal full.", False),
                                                          ("Battery 100 percent.", False)]
    assert screen.find("workspace").scrollable
    assert len(screen.elements) == 16


# --------------------------------------------------------------------------- the env on adb


async def test_an_android_episode_on_the_adb_backend(fake, monkeypatch):
    """The env over the fake adb: reset sends the start state, a tap on an element of the
    dumped screen reaches ``input tap`` at its center, close reads the check with ``settings get``."""
    from rlfactory_core import ToolCall
    from rlfactory_core.testing import ConcurrentToolManager
    from rlfactory_android import AndroidEnv

    monkeypatch.setenv("FAKE_ADB_DUMP", str(DUMPS / "settings_main.xml"))
    env = AndroidEnv(backend="adb", adb_path=fake.path)
    assert env.few_shot is False and env.apps == APPS
    row = {"id": "a", "goal": "Turn off Wi-Fi.", "start": {"settings": {"global/wifi_on": "1"}, "app": "Settings"},
           "check": {"kind": "setting", "name": "global/wifi_on", "value": "0"}}
    reset = await env.reset(row)
    assert reset.messages[-1].content.startswith("Task: Turn off Wi-Fi.\n\nScreen: com.android.settings")
    assert ["shell", "svc", "wifi", "enable"] in fake.commands()
    target = next(e for e in reset.state["screen"].elements if e.clickable)
    manager = ConcurrentToolManager(env.tools)
    ctx = {"sample": row, "state": reset.state, "trajectory": None, "tool_names": None}
    [result] = await manager.call([ToolCall("tap", {"element": target.number}, id="1")], ctx)
    assert result.ok, result.content
    assert ["shell", "input", "tap", str(target.center[0]), str(target.center[1])] in fake.commands()
    await env.close(reset.state)
    await manager.close()
    assert ["shell", "settings", "get", "global", "wifi_on"] in fake.commands()
    assert reset.state["success"] is True  # the fake answers 0


def test_no_connected_device_is_a_config_error_up_front(fake, monkeypatch):
    from rlfactory_core import ConfigError
    from rlfactory_android import AndroidEnv

    monkeypatch.setenv("FAKE_ADB_NO_DEVICES", "1")
    with pytest.raises(ConfigError, match="env_options.devices: no Android device"):
        AndroidEnv(backend="adb", adb_path=fake.path)
    with pytest.raises(ConfigError, match="adb"):
        AndroidEnv(backend="adb", adb_path="/nonexistent/adb")


def test_only_the_simulated_phone_lets_an_untrained_eval_be_reused(fake):
    # eval.reuse_untrained (rlfactory_core.eval_reuse): a device's state is not in any key
    from rlfactory_android import AndroidEnv

    tasks = [{"id": "a", "goal": "Turn off Wi-Fi."}]
    assert AndroidEnv().data_fingerprint(tasks) == ""
    assert AndroidEnv(backend="adb", adb_path=fake.path).data_fingerprint(tasks) is None
