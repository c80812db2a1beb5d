"""What the env needs of a phone: the :class:`Device` protocol, and the task state types
(:class:`StartState`, :class:`Check`) both backends understand.

Two backends implement it: :class:`rlfactory_android.adb.AdbDevice` (a real device or an
emulator through the ``adb`` binary) and :class:`rlfactory_android.simulated.SimulatedPhone`
(a deterministic simulated phone, for tests and CPU runs without a device). Methods are
synchronous and may block (adb runs a subprocess); the env calls them in the core's tool
thread pool. A method that cannot do what it is asked raises :class:`DeviceError` with a
one-line message, which the env turns into an error observation.

A device may also have ``linked_settings`` (setting -> the settings the system switches with
it), which the side-effect rule of :mod:`rlfactory_android.checks` reads; none when absent.

Settings are named the way Android stores them: ``"<namespace>/<key>"`` with namespace
``global``, ``secure`` or ``system`` (e.g. ``global/wifi_on``, ``global/bluetooth_on``,
``global/airplane_mode_on``), values as the text ``adb shell settings get`` prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .layout import Layout

__all__ = ["Device", "DeviceError", "StartState", "Check", "CHECK_KINDS", "KEYS", "SETTING_NAMESPACES",
           "split_setting"]

#: Keys ``press_key`` accepts, and their Android key codes.
KEYS: dict[str, str] = {"back": "KEYCODE_BACK", "home": "KEYCODE_HOME", "enter": "KEYCODE_ENTER"}
SETTING_NAMESPACES = ("global", "secure", "system")
#: The kinds of success check a task may have (see :class:`Check`).
CHECK_KINDS = ("setting", "contact_exists", "contact_absent", "note_exists", "text_field")


class DeviceError(RuntimeError):
    """A device operation failed; the message is one line, written for the model or the user."""


def split_setting(name: str) -> tuple[str, str]:
    """``"global/wifi_on"`` -> ``("global", "wifi_on")``; ``ValueError`` for a malformed name."""
    namespace, sep, key = str(name).partition("/")
    if not sep or namespace not in SETTING_NAMESPACES or not key or not key.replace("_", "").replace(".", "").isalnum():
        raise ValueError(f"setting {name!r}: write it as <namespace>/<key> with namespace "
                         f"{', '.join(SETTING_NAMESPACES)} (e.g. global/wifi_on)")
    return namespace, key


@dataclass(frozen=True)
class StartState:
    """The device state an episode starts from: settings to set, the contacts and notes that
    exist (exactly these), the app in the foreground (``None``: the home screen), and the
    :class:`~rlfactory_android.layout.Layout` of the screens (simulated phone only)."""

    settings: dict[str, str] = field(default_factory=dict)
    contacts: tuple[tuple[str, str], ...] = ()  # (name, phone)
    notes: tuple[str, ...] = ()
    app: str | None = None
    layout: Layout = field(default_factory=Layout)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "StartState":
        """Read a task's ``start`` mapping; ``ValueError`` naming ``where`` and the problem."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ValueError(f"{where}: 'start' must be a mapping, got {type(data).__name__}")
        unknown = sorted(set(data) - {"settings", "contacts", "notes", "app", "layout"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) in 'start': {', '.join(unknown)} "
                             "(it takes settings, contacts, notes, app, layout)")
        settings = data.get("settings") or {}
        if not isinstance(settings, dict):
            raise ValueError(f"{where}: start.settings must map <namespace>/<key> to a value")
        for name in settings:
            try:
                split_setting(name)
            except ValueError as exc:
                raise ValueError(f"{where}: start.settings: {exc}") from None
        contacts = []
        for contact in data.get("contacts") or []:
            if not isinstance(contact, dict) or not isinstance(contact.get("name"), str) or not contact["name"].strip():
                raise ValueError(f"{where}: each of start.contacts needs a 'name' (and an optional 'phone'), "
                                 f"got {contact!r}")
            contacts.append((contact["name"].strip(), str(contact.get("phone", "")).strip()))
        notes = data.get("notes") or []
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            raise ValueError(f"{where}: start.notes must be a list of texts")
        app = data.get("app")
        if app is not None and (not isinstance(app, str) or not app.strip()):
            raise ValueError(f"{where}: start.app must be an app name, got {app!r}")
        return cls(settings={k: str(v) for k, v in settings.items()}, contacts=tuple(contacts),
                   notes=tuple(notes), app=app, layout=Layout.from_dict(data.get("layout"), where))


@dataclass(frozen=True)
class Check:
    """A task's success check, read from device state after the episode.

    * ``setting``: setting ``name`` equals ``value``;
    * ``contact_exists``: a contact named ``name`` exists (with phone ``value`` when given;
      phones compare by their digits);
    * ``contact_absent``: no contact named ``name`` exists;
    * ``note_exists``: a note whose text equals ``value`` (case and surrounding space ignored);
    * ``text_field``: the UI element with resource id ``name`` shows the text ``value``.
    """

    kind: str
    name: str = ""
    value: str | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "Check":
        if not isinstance(data, dict):
            raise ValueError(f"{where}: 'check' must be a mapping with a 'kind', got {type(data).__name__}")
        kind = data.get("kind")
        if kind not in CHECK_KINDS:
            raise ValueError(f"{where}: check.kind must be one of {', '.join(CHECK_KINDS)}, got {kind!r}")
        unknown = sorted(set(data) - {"kind", "name", "value"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) in 'check': {', '.join(unknown)} (it takes kind, name, value)")
        name, value = data.get("name", ""), data.get("value")
        if kind != "note_exists" and (not isinstance(name, str) or not name.strip()):
            raise ValueError(f"{where}: a {kind} check needs a 'name'")
        if kind == "setting":
            try:
                split_setting(name)
            except ValueError as exc:
                raise ValueError(f"{where}: check: {exc}") from None
        if kind in ("setting", "note_exists", "text_field") and value is None:
            raise ValueError(f"{where}: a {kind} check needs a 'value'")
        return cls(kind=kind, name=str(name).strip(), value=None if value is None else str(value))


@runtime_checkable
class Device(Protocol):
    """One phone. Coordinates are screen pixels; ``screen_size`` is (width, height)."""

    serial: str
    screen_size: tuple[int, int]

    def dump_ui(self) -> str:
        """The current screen's UI hierarchy as uiautomator XML (``uiautomator dump``)."""

    def screenshot(self) -> bytes:
        """The current screen as PNG bytes (``screencap -p``)."""

    def tap(self, x: int, y: int) -> None: ...

    def long_press(self, x: int, y: int, duration_ms: int = 800) -> None: ...

    def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int = 300) -> None: ...

    def input_text(self, text: str) -> None:
        """Type ``text`` into the focused field."""

    def press_key(self, key: str) -> None:
        """Press one of :data:`KEYS`."""

    def open_app(self, package: str) -> None:
        """Bring the app with this package name to the foreground, on its start screen."""

    def get_setting(self, name: str) -> str | None:
        """The value of setting ``<namespace>/<key>`` (None when unset)."""

    def list_contacts(self) -> list[tuple[str, str]]:
        """Every contact as (name, phone)."""

    def list_notes(self) -> list[str]:
        """Every note's text; ``DeviceError`` where the backend has no notes app."""

    def reset(self, start: StartState, apps: dict[str, str]) -> None:
        """Put the device into ``start`` (``apps`` maps app names to package names);
        ``DeviceError`` for a start the backend cannot make (notes or a layout on adb)."""

    def healthy(self) -> bool:
        """Whether the device answers (a cheap round trip)."""
