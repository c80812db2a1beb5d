"""The real Android backend: a device or an emulator driven through the ``adb`` binary.

:class:`AdbDevice` implements :class:`~rlfactory_android.device.Device` with one
``subprocess.run`` of ``[adb_path, "-s", serial, ...]`` per operation (no Python dependency
beyond the standard library). Each command is built by a small pure function
(:func:`tap_command`, :func:`input_text_commands` ...), so the tests check the exact argv.
A command that exits non-zero, runs past ``timeout_s`` or cannot start (no ``adb`` binary)
raises :class:`~rlfactory_android.device.DeviceError` with a one-line message naming the
command and what to check.

The commands, with the device shell's view of them:

* ``dump_ui``: ``shell uiautomator dump /sdcard/window_dump.xml``, then ``exec-out cat
  /sdcard/window_dump.xml``. Two round trips rather than ``exec-out uiautomator dump
  /dev/tty``: writing to ``/dev/tty`` fails on devices where the shell has no terminal and
  mixes uiautomator's status line into the XML, while the file works on every Android
  version. ``uiautomator dump`` exits 0 even when it fails ("ERROR: could not get idle
  state."), so its output is read too, and a failure is an error rather than a stale file.
* ``screenshot``: ``exec-out screencap -p`` (``exec-out``: raw bytes, no line-ending
  translation), checked for the PNG signature.
* ``screen_size``: ``shell wm size``, read once; an ``Override size:`` line wins over
  ``Physical size:`` (dump bounds are in the override's pixels). It is the natural
  (portrait) size: rotation is not accounted for.
* ``tap``: ``shell input tap X Y``; ``long_press``: ``shell input swipe X Y X Y MS`` (a swipe
  that does not move); ``swipe``: ``shell input swipe X1 Y1 X2 Y2 MS``; ``press_key``:
  ``shell input keyevent KEYCODE_...`` (:data:`~rlfactory_android.device.KEYS`).
* ``input_text``: ``shell input text ARG``. ``adb shell`` joins its arguments with spaces
  and the device shell splits them again, so ``ARG`` is quoted for that shell (single
  quotes, as :func:`shlex.quote`; mksh follows POSIX here). ``input text`` itself turns
  ``%s`` into a space, so spaces are sent as ``%s``; a literal ``%s`` in the text cannot be
  sent in one call and is typed as two (``...%`` then ``s...``). ``input text`` types ASCII
  only: other characters and control characters are refused with a ``DeviceError``.
* ``open_app``: ``shell monkey -p PKG -c android.intent.category.LAUNCHER 1`` (the app's
  launcher activity); monkey exits 0 when the package has none, so its output is read.
* ``get_setting``: ``shell settings get NS KEY`` (``null``: unset, None).
* ``list_contacts``: ``shell content query --uri content://com.android.contacts/contacts
  --projection _id:display_name`` and ``... /data/phones --projection contact_id:data1``,
  joined by contact id: one ``(name, phone)`` per phone number, ``(name, "")`` for a contact
  without one (a single query of ``data/phones`` would miss contacts that have no phone).
* ``list_notes``: a ``DeviceError``: a real device has no standard notes app.
* ``reset(start, apps)``, in this order: refuse ``start.notes``, a ``start.layout`` (the
  order of Settings rows and launcher icons is the phone's own: adb has no command that
  reorders them, and pretending would let a task believe its screens differ when they do
  not) and an unknown ``start.app`` before touching the device; ``shell am force-stop PKG`` for every app;
  ``shell input keyevent KEYCODE_HOME``; each setting: ``global/wifi_on`` through ``shell
  svc wifi enable|disable``, ``global/bluetooth_on`` through ``shell svc bluetooth
  enable|disable``, ``global/airplane_mode_on`` through ``shell cmd connectivity
  airplane-mode enable|disable`` (writing these settings does not switch the radios),
  anything else through ``shell settings put NS KEY VALUE``; then the contacts, made exactly
  ``start.contacts``: ``shell pm clear com.android.providers.contacts`` (empties the
  contacts database, call log included), and for each contact ``content insert --uri
  content://com.android.contacts/raw_contacts --bind account_type:s: --bind
  account_name:s:`` (a local contact, in no account), ``content query --uri
  content://com.android.contacts/raw_contacts --projection _id`` (``content insert`` prints
  no id; the new row has the highest), ``content insert --uri
  content://com.android.contacts/data --bind raw_contact_id:i:ID --bind
  mimetype:s:vnd.android.cursor.item/name --bind data1:s:NAME`` and, with a phone, the same
  with ``mimetype:s:vnd.android.cursor.item/phone_v2 --bind data1:s:PHONE --bind
  data2:i:2`` (type mobile); last, ``open_app`` of ``apps[start.app]``. ``content`` splits a
  binding at ``:`` (and older versions do not read ``\\:``), so contact names and phones
  with ``:`` or ``\\`` are refused.
* ``healthy``: ``get-state`` prints ``device`` within ``min(timeout_s, 5)`` seconds.

:func:`list_devices` reads ``adb devices`` (rows in state ``device`` only).

:class:`AdbDevicePool` (:mod:`rlfactory_android.adb_pool`, imported here) hands out the
devices one per trajectory.

None of this has run against a real device in this repository's tests: they drive a fake
``adb`` (``tests/fake_adb.py``) that answers with canned outputs.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from typing import Sequence

from .device import KEYS, DeviceError, StartState, split_setting

__all__ = [
    "AdbDevice",
    "AdbDevicePool",
    "list_devices",
    "tap_command",
    "long_press_command",
    "swipe_command",
    "key_command",
    "input_text_commands",
    "escape_input_text",
    "open_app_command",
    "force_stop_command",
    "get_setting_command",
    "put_setting_commands",
    "raw_contact_insert_command",
    "raw_contact_ids_command",
    "insert_contact_commands",
    "contacts_query_command",
    "phones_query_command",
    "parse_screen_size",
    "parse_content_rows",
    "parse_devices",
    "DUMP_PATH",
    "CONTACTS_PACKAGE",
]

#: Where ``uiautomator dump`` writes the UI hierarchy on the device.
DUMP_PATH = "/sdcard/window_dump.xml"
#: The package holding the contacts database (``pm clear`` empties it).
CONTACTS_PACKAGE = "com.android.providers.contacts"
_CONTACTS_URI = "content://com.android.contacts"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PACKAGE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)+$")
_SCREEN_SIZE = re.compile(r"^(Physical|Override) size:\s*(\d+)x(\d+)\s*$")
_CONTACT_ROW = re.compile(r"^Row: \d+ _id=(\d+), display_name=(.*)$")
_PHONE_ROW = re.compile(r"^Row: \d+ contact_id=(\d+), data1=(.*)$")
_RAW_CONTACT_ROW = re.compile(r"^Row: \d+ _id=(\d+)$")
_HEALTH_TIMEOUT_S = 5.0
# Settings whose value is a radio's state: writing the setting does not switch the radio,
# these commands do (and update the setting).
_RADIO_SETTINGS = {
    "global/wifi_on": ("svc", "wifi"),
    "global/bluetooth_on": ("svc", "bluetooth"),
    "global/airplane_mode_on": ("cmd", "connectivity", "airplane-mode"),
}
_NO_NOTES = "a real device has no standard notes app; note tasks need the simulated backend"
_NO_LAYOUT = ("a start.layout (the order of Settings rows and launcher icons) needs the simulated backend: adb "
              "cannot reorder a real phone's screens; drop the task's layout or use backend: simulated")
_INSTALL_HINT = ("install Android platform-tools (Debian/Ubuntu package `adb`) or set the env option adb_path "
                 "to the adb binary")


# --------------------------------------------------------------------------- commands


def _int(value: int, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int):
        raise DeviceError(f"{what} must be a whole number of pixels or milliseconds, got {value!r}")
    return str(value)


def tap_command(x: int, y: int) -> list[str]:
    """``shell input tap X Y``."""
    return ["shell", "input", "tap", _int(x, "x"), _int(y, "y")]


def long_press_command(x: int, y: int, duration_ms: int = 800) -> list[str]:
    """A swipe that stays in place for ``duration_ms``: ``input`` has no long press of its own."""
    return ["shell", "input", "swipe", _int(x, "x"), _int(y, "y"), _int(x, "x"), _int(y, "y"),
            _int(duration_ms, "duration_ms")]


def swipe_command(x1: int, y1: int, x2: int, y2: int, duration_ms: int = 300) -> list[str]:
    """``shell input swipe X1 Y1 X2 Y2 MS``."""
    return ["shell", "input", "swipe", _int(x1, "x1"), _int(y1, "y1"), _int(x2, "x2"), _int(y2, "y2"),
            _int(duration_ms, "duration_ms")]


def key_command(key: str) -> list[str]:
    """``shell input keyevent KEYCODE_...`` for one of :data:`KEYS`."""
    if key not in KEYS:
        raise DeviceError(f"unknown key {key!r}; keys: {', '.join(KEYS)}")
    return ["shell", "input", "keyevent", KEYS[key]]


def escape_input_text(text: str) -> str:
    """One ``input text`` argument as the device shell must receive it: spaces as ``%s``
    (which ``input text`` turns back into spaces), quoted for the shell. ``text`` must not
    hold a literal ``%s`` (:func:`input_text_commands` splits there)."""
    return shlex.quote(text.replace(" ", "%s"))


def _check_typeable(text: str) -> None:
    for char in text:
        if not char.isascii():
            raise DeviceError(f"cannot type {char!r}: adb's `input text` only types ASCII characters")
        if not char.isprintable():
            raise DeviceError(f"cannot type the control character {char!r}: type_text types one line of "
                              "printable ASCII (press the enter key for a new line)")


def input_text_commands(text: str) -> list[list[str]]:
    """The ``shell input text ...`` commands that type ``text``: one, or one more for each
    literal ``%s`` (``input text`` would read it as a space, so the ``%`` and the ``s`` go in
    separate calls); none for empty text. ``DeviceError`` for text ``input text`` cannot type."""
    _check_typeable(text)
    if not text:
        return []
    pieces = text.split("%s")
    chunks = [pieces[0]] + ["s" + piece for piece in pieces[1:]]
    chunks = [chunk + "%" for chunk in chunks[:-1]] + [chunks[-1]]
    return [["shell", "input", "text", escape_input_text(chunk)] for chunk in chunks if chunk]


def _check_package(package: str) -> str:
    if not isinstance(package, str) or not _PACKAGE_NAME.match(package):
        raise DeviceError(f"{package!r} is not an Android package name (like com.android.settings)")
    return package


def open_app_command(package: str) -> list[str]:
    """Start the launcher activity of ``package`` (what tapping its icon does)."""
    return ["shell", "monkey", "-p", _check_package(package), "-c", "android.intent.category.LAUNCHER", "1"]


def force_stop_command(package: str) -> list[str]:
    return ["shell", "am", "force-stop", _check_package(package)]


def _setting(name: str) -> tuple[str, str]:
    try:
        return split_setting(name)
    except ValueError as exc:
        raise DeviceError(str(exc)) from None


def get_setting_command(name: str) -> list[str]:
    """``shell settings get NS KEY`` for setting ``<namespace>/<key>``."""
    namespace, key = _setting(name)
    return ["shell", "settings", "get", namespace, key]


def put_setting_commands(name: str, value: str) -> list[list[str]]:
    """The commands that give setting ``name`` the value ``value``: the radio's own command
    for Wi-Fi, Bluetooth and airplane mode (``1``/``0``), ``settings put`` for the rest."""
    namespace, key = _setting(name)
    value = str(value)
    radio = _RADIO_SETTINGS.get(f"{namespace}/{key}")
    if radio is not None:
        if value not in ("0", "1"):
            raise DeviceError(f"setting {namespace}/{key} takes 1 (on) or 0 (off), got {value!r}")
        return [["shell", *radio, "enable" if value == "1" else "disable"]]
    return [["shell", "settings", "put", namespace, key, shlex.quote(value)]]


def _binding(column: str, kind: str, value: str) -> str:
    """A ``content --bind`` argument, quoted for the device shell."""
    return shlex.quote(f"{column}:{kind}:{value}")


def raw_contact_insert_command() -> list[str]:
    return ["shell", "content", "insert", "--uri", f"{_CONTACTS_URI}/raw_contacts",
            "--bind", _binding("account_type", "s", ""), "--bind", _binding("account_name", "s", "")]


def raw_contact_ids_command() -> list[str]:
    return ["shell", "content", "query", "--uri", f"{_CONTACTS_URI}/raw_contacts", "--projection", "_id"]


def insert_contact_commands(raw_contact_id: int, name: str, phone: str) -> list[list[str]]:
    """The ``content insert`` commands writing the name (and the phone, when not empty) of
    raw contact ``raw_contact_id``."""
    for what, value in (("name", name), ("phone", phone)):
        if ":" in value or "\\" in value:
            raise DeviceError(f"contact {what} {value!r}: the adb backend cannot write ':' or '\\' "
                              "through `content insert`")
        if not value.isprintable():
            raise DeviceError(f"contact {what} {value!r}: control characters cannot be written")
    rows = [("vnd.android.cursor.item/name", [_binding("data1", "s", name)])]
    if phone:
        rows.append(("vnd.android.cursor.item/phone_v2", [_binding("data1", "s", phone), _binding("data2", "i", "2")]))
    commands = []
    for mimetype, bindings in rows:
        command = ["shell", "content", "insert", "--uri", f"{_CONTACTS_URI}/data",
                   "--bind", _binding("raw_contact_id", "i", _int(raw_contact_id, "raw_contact_id")),
                   "--bind", _binding("mimetype", "s", mimetype)]
        for binding in bindings:
            command += ["--bind", binding]
        commands.append(command)
    return commands


def contacts_query_command() -> list[str]:
    return ["shell", "content", "query", "--uri", f"{_CONTACTS_URI}/contacts", "--projection", "_id:display_name"]


def phones_query_command() -> list[str]:
    return ["shell", "content", "query", "--uri", f"{_CONTACTS_URI}/data/phones", "--projection", "contact_id:data1"]


# --------------------------------------------------------------------------- parsing


def parse_screen_size(output: str) -> tuple[int, int]:
    """``wm size`` output -> (width, height); an ``Override size:`` line wins."""
    sizes = {}
    for line in output.splitlines():
        match = _SCREEN_SIZE.match(line.strip())
        if match:
            sizes[match.group(1)] = (int(match.group(2)), int(match.group(3)))
    if not sizes:
        raise DeviceError(f"`wm size` printed no screen size ({_first_line(output) or 'nothing'})")
    return sizes.get("Override", sizes.get("Physical"))  # type: ignore[return-value]


def parse_content_rows(output: str, row: re.Pattern[str]) -> list[tuple[str, ...]]:
    """The groups of each ``content query`` row matching ``row``; ``No result found.`` (or
    nothing) is no rows. A value holding a line break continues on lines of its own, which
    are skipped. ``DeviceError`` for a row of another shape (an unexpected projection)."""
    rows = []
    for line in output.splitlines():
        line = line.rstrip("\r")
        if not line.startswith("Row: "):
            continue
        match = row.match(line)
        if match is None:
            raise DeviceError(f"`content query` printed an unexpected row {line[:200]!r}")
        rows.append(match.groups())
    return rows


def parse_devices(output: str) -> list[str]:
    """The serials ``adb devices`` lists in state ``device`` (not ``offline``, ``unauthorized``
    ...), skipping its header and the daemon's start-up lines."""
    serials = []
    for line in output.splitlines():
        if not line.strip() or line.startswith("*") or line.startswith("List of devices"):
            continue
        fields = line.split()
        if len(fields) >= 2 and fields[1] == "device":
            serials.append(fields[0])
    return serials


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0][:200] if lines else ""


# --------------------------------------------------------------------------- running adb


def _run(argv: list[str], timeout_s: float, shown: str, hint: str) -> subprocess.CompletedProcess[bytes]:
    """Run ``argv``; ``DeviceError`` naming ``shown`` (the command as a user would type it)
    when it cannot start, runs too long or exits non-zero."""
    try:
        # stdin from /dev/null: with a terminal on stdin, `adb shell` would open a pty on the device
        # (and rewrite line endings); this way output comes back as the command wrote it.
        result = subprocess.run(argv, capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise DeviceError(f"the adb binary {argv[0]!r} was not found; {_INSTALL_HINT}") from None
    except PermissionError:
        raise DeviceError(f"the adb binary {argv[0]!r} cannot be run (permission denied); {_INSTALL_HINT}") from None
    except subprocess.TimeoutExpired:
        raise DeviceError(f"{shown} timed out after {timeout_s:g}s; {hint}") from None
    if result.returncode != 0:
        said = _first_line(result.stderr.decode("utf-8", "replace")) or _first_line(
            result.stdout.decode("utf-8", "replace"))
        raise DeviceError(f"{shown} failed (exit {result.returncode}{': ' + said if said else ''}); {hint}")
    return result


def list_devices(adb_path: str = "adb", timeout_s: float = 15.0) -> list[str]:
    """The serials of the connected devices ``adb devices`` lists as ready (state ``device``)."""
    result = _run([adb_path, "devices"], timeout_s, "adb devices", "is the adb server working? (adb kill-server)")
    return parse_devices(result.stdout.decode("utf-8", "replace"))


class AdbDevice:
    """One device or emulator, by its ``adb devices`` serial (see the module docstring)."""

    #: Settings the system switches when another changes, which the side-effect rule
    #: (:mod:`rlfactory_android.checks`) does not count for a check of that other: turning
    #: airplane mode on may turn the Wi-Fi and Bluetooth radios off (and off restores them),
    #: depending on the Android version and the user's earlier choices.
    linked_settings: dict[str, tuple[str, ...]] = {
        "global/airplane_mode_on": ("global/wifi_on", "global/bluetooth_on")}

    def __init__(self, serial: str, adb_path: str = "adb", timeout_s: float = 15.0):
        if not isinstance(serial, str) or not serial.strip():
            raise DeviceError(f"a device serial is the name `adb devices` lists (e.g. emulator-5554), got {serial!r}")
        self.serial = serial
        self.adb_path = adb_path
        self.timeout_s = float(timeout_s)
        self._screen_size: tuple[int, int] | None = None

    def __repr__(self) -> str:
        return f"AdbDevice({self.serial!r})"

    def _call(self, command: Sequence[str], timeout_s: float | None = None) -> subprocess.CompletedProcess[bytes]:
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        shown = " ".join(["adb", "-s", self.serial, *command])
        if len(shown) > 160:
            shown = shown[:157] + "..."
        hint = "is the device connected and responsive? (adb devices)"
        return _run([self.adb_path, "-s", self.serial, *command], timeout_s, shown, hint)

    def adb(self, command: Sequence[str], timeout_s: float | None = None) -> bytes:
        """Run ``adb -s SERIAL COMMAND...`` and return its standard output."""
        return self._call(command, timeout_s).stdout

    def _text(self, command: Sequence[str]) -> str:
        return self.adb(command).decode("utf-8", "replace")

    def _said(self, command: Sequence[str]) -> str:
        """Standard output and error together: for tools that report failure in what they print
        and exit 0 (uiautomator, monkey, content, pm)."""
        result = self._call(command)
        return (result.stdout + b"\n" + result.stderr).decode("utf-8", "replace")

    def _content(self, command: Sequence[str]) -> str:
        """Run a ``content`` command: its output, ``DeviceError`` when it printed an error (it
        prints its usage and ``[ERROR] ...``, or ``Error while accessing provider``, and exits 0)."""
        said = self._said(command)
        for line in said.splitlines():
            if line.startswith("[ERROR]") or line.startswith("Error while accessing provider"):
                uri = command[command.index("--uri") + 1] if "--uri" in command else "?"
                raise DeviceError(f"`content {command[2]}` on {uri} failed ({line.strip()[:200]}); is the "
                                  "contacts provider installed and working?")
        return said

    # ------------------------------------------------------------------ screen

    @property
    def screen_size(self) -> tuple[int, int]:
        """(width, height) in pixels, from ``wm size``, read on first use (before Python 3.12,
        ``isinstance(device, Device)`` reads it too: protocol checks use ``hasattr``)."""
        if self._screen_size is None:
            self._screen_size = parse_screen_size(self._text(["shell", "wm", "size"]))
        return self._screen_size

    def dump_ui(self) -> str:
        said = self._said(["shell", "uiautomator", "dump", DUMP_PATH])
        # Success prints "UI hierarchy dumped to: PATH" (older versions: "hierchary"); a failure
        # ("ERROR: could not get idle state.") exits 0 and would leave the previous dump in place.
        if "ERROR" in said or "dumped to" not in said:
            raise DeviceError(f"uiautomator could not dump the screen ({_first_line(said) or 'no output'}); "
                              "the screen may still be changing: try again")
        return self._text(["exec-out", "cat", DUMP_PATH])

    def screenshot(self) -> bytes:
        data = self.adb(["exec-out", "screencap", "-p"])
        if not data.startswith(_PNG_SIGNATURE):
            raise DeviceError(f"`screencap -p` did not return a PNG image (got {data[:40]!r}); "
                              "is the screen on and unlocked?")
        return data

    # ------------------------------------------------------------------ input

    def tap(self, x: int, y: int) -> None:
        self.adb(tap_command(x, y))

    def long_press(self, x: int, y: int, duration_ms: int = 800) -> None:
        self.adb(long_press_command(x, y, duration_ms))

    def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int = 300) -> None:
        self.adb(swipe_command(x1, y1, x2, y2, duration_ms))

    def input_text(self, text: str) -> None:
        for command in input_text_commands(text):
            self.adb(command)

    def press_key(self, key: str) -> None:
        self.adb(key_command(key))

    def open_app(self, package: str) -> None:
        said = self._said(open_app_command(package))
        if "monkey aborted" in said or "No activities found" in said:
            raise DeviceError(f"cannot open {package}: it is not installed or has no launcher activity on "
                              f"{self.serial}")

    # ------------------------------------------------------------------ state

    def get_setting(self, name: str) -> str | None:
        value = self._text(get_setting_command(name)).strip()
        return None if value == "null" else value

    def list_contacts(self) -> list[tuple[str, str]]:
        names = dict(parse_content_rows(self._content(contacts_query_command()), _CONTACT_ROW))
        phones: dict[str, list[str]] = {}
        for contact_id, phone in parse_content_rows(self._content(phones_query_command()), _PHONE_ROW):
            if phone != "NULL":
                phones.setdefault(contact_id, []).append(phone)
        contacts = []
        for contact_id, name in names.items():
            if name == "NULL":
                continue  # a contact without a name cannot be asked for by name
            contacts += [(name, phone) for phone in phones.get(contact_id, [""])]
        return contacts

    def list_notes(self) -> list[str]:
        raise DeviceError(_NO_NOTES)

    def reset(self, start: StartState, apps: dict[str, str]) -> None:
        if start.notes:
            raise DeviceError(_NO_NOTES)
        if not start.layout.is_default:
            raise DeviceError(_NO_LAYOUT)
        if start.app is not None and start.app not in apps:
            raise DeviceError(f"unknown app {start.app!r}; apps: {', '.join(apps) or 'none'}")
        setting_commands = [c for name, value in start.settings.items() for c in put_setting_commands(name, value)]
        for name, phone in start.contacts:  # what cannot be written is refused before the device changes
            insert_contact_commands(0, name, phone)
        for package in apps.values():
            self.adb(force_stop_command(package))
        self.adb(key_command("home"))
        for command in setting_commands:
            self.adb(command)
        self._set_contacts(start.contacts)
        if start.app is not None:
            self.open_app(apps[start.app])

    def _set_contacts(self, contacts: Sequence[tuple[str, str]]) -> None:
        said = self._said(["shell", "pm", "clear", CONTACTS_PACKAGE])
        if "Success" not in said:
            raise DeviceError(f"pm clear {CONTACTS_PACKAGE} did not succeed ({_first_line(said) or 'no output'}); "
                              "the contacts could not be reset")
        for name, phone in contacts:
            self._content(raw_contact_insert_command())
            ids = [int(row[0]) for row in parse_content_rows(self._content(raw_contact_ids_command()),
                                                             _RAW_CONTACT_ROW)]
            if not ids:
                raise DeviceError(f"inserting contact {name!r} made no raw contact; is the contacts provider working?")
            for command in insert_contact_commands(max(ids), name, phone):
                self._content(command)

    def healthy(self) -> bool:
        try:
            state = self.adb(["get-state"], timeout_s=min(self.timeout_s, _HEALTH_TIMEOUT_S))
        except Exception:  # noqa: BLE001 - a health check answers, it never raises
            return False
        return state.decode("utf-8", "replace").strip() == "device"


from .adb_pool import AdbDevicePool  # noqa: E402 - the pool builds on AdbDevice above (a module of its own)
