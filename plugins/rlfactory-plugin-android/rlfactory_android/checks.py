"""The success check of a task, side effects included.

:func:`evaluate_check` reads the task's own check from the device (a setting's value, a
contact, a note, a field's text). Given the :class:`Snapshot` taken when the episode started
(:func:`read_snapshot`, right after the device was put into the start state), it also fails
the check when anything else changed (issue 40: a model that switches every toggle, or
deletes every contact, must not pass):

* **settings**: every setting of the simulated phone's Settings rows (Wi-Fi, Bluetooth,
  Airplane mode, Do not disturb, Dark theme) and every setting the start state sets, apart
  from the one a ``setting`` check asks for; on a device whose system switches some
  settings when another changes (:attr:`AdbDevice.linked_settings
  <rlfactory_android.adb.AdbDevice.linked_settings>`: airplane mode may turn the Wi-Fi and
  Bluetooth radios off and back on), those are not counted for that check;
* **contacts**: the (name, phone) pairs, as a multiset, apart from those named as the
  ``contact_exists`` / ``contact_absent`` check's contact (names compared case- and
  space-insensitively); a ``text_field`` task ("do not save it") may change none;
* **notes**: the note texts, as a multiset, apart from those equal to a ``note_exists``
  check's text; where the device cannot read notes (adb), they are not compared.

What changed is said in the check's ``found`` text: ``global/zen_mode = 1; also changed:
global/wifi_on 1 -> 0, contact 'Ann Lee' (555-0101) deleted``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from .device import Check, Device, DeviceError, StartState
from .layout import TOGGLES
from .ui import parse_ui

__all__ = ["Snapshot", "read_snapshot", "side_effects", "evaluate_check", "WATCHED_SETTINGS"]

#: The settings every episode watches for side effects: the simulated phone's Settings rows.
WATCHED_SETTINGS: tuple[str, ...] = tuple(name for _, name, _, _ in TOGGLES)


@dataclass(frozen=True)
class Snapshot:
    """The device state a side effect is measured against: the watched settings' values
    (None: unset), the contacts as (name, phone), the notes (None: the device has none to read)."""

    settings: dict[str, str | None]
    contacts: tuple[tuple[str, str], ...]
    notes: tuple[str, ...] | None


def read_snapshot(device: Device, start: StartState, check: Check, settings: Any = None) -> Snapshot:
    """The watched state of ``device`` now: :data:`WATCHED_SETTINGS`, the start state's
    settings and the check's (or the names in ``settings`` when given), the contacts, and the
    notes where the device can read them. ``DeviceError`` when the device cannot answer."""
    if settings is None:
        settings = [*WATCHED_SETTINGS, *start.settings, *([check.name] if check.kind == "setting" else [])]
    values = {name: device.get_setting(name) for name in dict.fromkeys(settings)}
    try:
        notes: tuple[str, ...] | None = tuple(device.list_notes())
    except DeviceError:
        notes = None  # a real device has no notes app: notes are not compared there
    return Snapshot(settings=values, contacts=tuple(device.list_contacts()), notes=notes)


def _name(name: str) -> str:
    return " ".join(name.split()).casefold()


def _changed(before: Counter, after: Counter, what: str) -> list[str]:
    return ([f"{what(item)} deleted" for item in sorted((before - after).elements())]
            + [f"{what(item)} added" for item in sorted((after - before).elements())])


def side_effects(before: Snapshot, after: Snapshot, check: Check, linked: dict[str, Any] | None = None) -> list[str]:
    """What changed between ``before`` and ``after`` apart from what ``check`` asks for, one
    phrase each (``global/wifi_on 1 -> 0``, ``contact 'Ann Lee' (555-0101) deleted``, ``note
    'Buy milk' added``); ``linked`` maps a setting to the settings the system switches with it."""
    allowed = {check.name, *(linked or {}).get(check.name, ())} if check.kind == "setting" else set()
    changes = [f"{name} {value} -> {after.settings.get(name)}" for name, value in before.settings.items()
               if name not in allowed and after.settings.get(name) != value]
    target = _name(check.name) if check.kind in ("contact_exists", "contact_absent") else None
    changes += _changed(Counter(c for c in before.contacts if _name(c[0]) != target),
                        Counter(c for c in after.contacts if _name(c[0]) != target),
                        lambda c: f"contact {c[0]!r}" + (f" ({c[1]})" if c[1] else ""))
    if before.notes is not None and after.notes is not None:
        text = (check.value or "").strip().casefold() if check.kind == "note_exists" else None
        changes += _changed(Counter(n for n in before.notes if n.strip().casefold() != text),
                            Counter(n for n in after.notes if n.strip().casefold() != text),
                            lambda n: f"note {n!r}")
    return changes


def _own_check(device: Device, check: Check) -> tuple[bool, str]:
    if check.kind == "setting":
        value = device.get_setting(check.name)
        return value == check.value, f"{check.name} = {value}"
    if check.kind in ("contact_exists", "contact_absent"):
        contacts = device.list_contacts()
        wanted = _name(check.name)
        matches = [phone for name, phone in contacts if _name(name) == wanted]
        if check.kind == "contact_absent":
            return not matches, f"{len(matches)} contact(s) named {check.name!r}"
        if check.value:
            digits = "".join(ch for ch in check.value if ch.isdigit())
            ok = any("".join(ch for ch in phone if ch.isdigit()) == digits for phone in matches)
            return ok, f"contacts named {check.name!r} have phones {matches}"
        return bool(matches), f"{len(matches)} contact(s) named {check.name!r}"
    if check.kind == "note_exists":
        notes = device.list_notes()
        wanted = (check.value or "").strip().casefold()
        return any(note.strip().casefold() == wanted for note in notes), f"notes: {notes}"
    screen = parse_ui(device.dump_ui(), device.screen_size)
    element = screen.find(check.name)
    if element is None:
        return False, f"no element {check.name} on the screen"
    return element.text.strip() == (check.value or "").strip(), f"{check.name} shows {element.text!r}"


def evaluate_check(device: Device, check: Check, before: Snapshot | None = None) -> tuple[bool, str]:
    """Read ``check`` from ``device``: (success, what was found). With ``before`` (the
    :class:`Snapshot` of the start), anything else that changed fails it too and is named in
    what was found (``...; also changed: global/wifi_on 1 -> 0``). ``DeviceError`` when the
    device cannot tell (e.g. a note check on a real device)."""
    ok, found = _own_check(device, check)
    if before is None:
        return ok, found
    after = read_snapshot(device, StartState(), check, settings=before.settings)
    changes = side_effects(before, after, check, getattr(device, "linked_settings", None))
    if changes:
        return False, f"{found}; also changed: {', '.join(changes)}"
    return ok, found
