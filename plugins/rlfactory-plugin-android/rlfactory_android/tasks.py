"""Android tasks: what to do, the device state to start from, and the success check.

A task file is JSONL, one task a line::

    {"id": "wifi-off-0", "goal": "Turn off Wi-Fi.",
     "start": {"settings": {"global/wifi_on": "1"}, "app": null},
     "check": {"kind": "setting", "name": "global/wifi_on", "value": "0"}}

``start`` (optional) is a :class:`~rlfactory_android.device.StartState`: ``settings``
(``<namespace>/<key>`` -> value), ``contacts`` (``[{"name", "phone"}]``, exactly these exist),
``notes`` (texts) and ``app`` (an app name of the env's ``apps``, or null for the home
screen). ``check`` is a :class:`~rlfactory_android.device.Check` (kinds ``setting``,
``contact_exists``, ``contact_absent``, ``note_exists``, ``text_field``). Every problem in a
file is reported at once, with its line number.

The built-in tasks (``tasks/train.jsonl``, ``tasks/validation.jsonl`` and ``tasks/test.jsonl``
in this package) are made by :func:`builtin_tasks` for the simulated phone's apps; the
validation and test splits each use other names, numbers and note texts than the others, so
their contact and note tasks are unseen in training, and validation (for tuning) says nothing
of test. ``python -m rlfactory_android.tasks`` rewrites the files (they are checked in; a test
checks they are what :func:`builtin_tasks` makes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .device import Check, StartState

__all__ = ["Task", "load_tasks", "read_task", "builtin_tasks", "BUILTIN_DIR", "check_text"]

BUILTIN_DIR = Path(__file__).parent / "tasks"


@dataclass(frozen=True)
class Task:
    id: str
    goal: str
    start: StartState
    check: Check


def read_task(row: Any, where: str) -> Task:
    """A task from one JSON object; ``ValueError`` naming ``where`` and the problem."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a task must be a JSON object with id, goal, check (and start)")
    unknown = sorted(set(row) - {"id", "goal", "start", "check", "answer"})
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} (a task has id, goal, start, check)")
    goal = row.get("goal")
    if not isinstance(goal, str) or not goal.strip():
        raise ValueError(f"{where}: needs a 'goal' (the instruction, text)")
    if "check" not in row:
        raise ValueError(f"{where}: needs a 'check' (how success is read from the device)")
    task_id = str(row.get("id") or where)
    return Task(id=task_id, goal=goal.strip(), start=StartState.from_dict(row.get("start"), where),
                check=Check.from_dict(row["check"], where))


def load_tasks(path: str | Path) -> list[Task]:
    """Every task of a JSONL file; ``ValueError`` listing every bad line at once."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"cannot read the task file {path}: {exc.strerror or exc}") from None
    tasks, problems = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path.name}:{number}"
        try:
            tasks.append(read_task(json.loads(line), where))
        except json.JSONDecodeError as exc:
            problems.append(f"{where}: not JSON ({exc.msg})")
        except ValueError as exc:
            problems.append(str(exc))
    if problems:
        raise ValueError("; ".join(problems))
    return tasks


def check_text(check: Check) -> str:
    """A short description of what success means (shown as a sample's expected answer)."""
    if check.kind == "setting":
        return f"{check.name} = {check.value}"
    if check.kind == "contact_exists":
        return f"contact {check.name!r}" + (f" with phone {check.value}" if check.value else "") + " exists"
    if check.kind == "contact_absent":
        return f"no contact {check.name!r}"
    if check.kind == "note_exists":
        return f"a note {check.value!r} exists"
    return f"field {check.name} shows {check.value!r}"


# --------------------------------------------------------------------------- built-in tasks

_TOGGLES = (("Wi-Fi", "global/wifi_on", "1", "0"), ("Bluetooth", "global/bluetooth_on", "1", "0"),
            ("Airplane mode", "global/airplane_mode_on", "1", "0"), ("Do not disturb", "global/zen_mode", "1", "0"),
            ("Dark theme", "secure/ui_night_mode", "2", "1"))
_NAMES = {
    "train": ["Alice Smith", "Bob Jones", "Carol White", "David Brown", "Emma Davis", "Frank Miller", "Grace Wilson",
              "Henry Moore", "Irene Taylor", "Jack Anderson", "Karen Thomas", "Liam Jackson"],
    "test": ["Maria Garcia", "Noah Martin", "Olivia Lee", "Peter Walker", "Quinn Hall", "Rosa Allen"],
    "validation": ["Sofia Young", "Tom King", "Uma Wright", "Victor Scott", "Wendy Green", "Xavier Baker"],
}
_NOTES = {
    "train": ["Buy milk", "Call mom", "Pay rent", "Book flights", "Water the plants", "Return library books"],
    "test": ["Renew passport", "Fix the bike", "Send invoice"],
    "validation": ["Pick up laundry", "Email the landlord", "Cancel the gym"],
}
_PHONE_BASE = {"train": 0, "test": 5000, "validation": 3000}


def _phone(split: str, i: int) -> str:
    return f"555-{_PHONE_BASE[split] + 101 * (i + 1):04d}"


def builtin_tasks(split: str) -> list[dict[str, Any]]:
    """The built-in tasks of ``split`` (``train``, ``validation`` or ``test``) as JSON rows, in a
    fixed order."""
    names, notes = _NAMES[split], _NOTES[split]
    rows: list[dict[str, Any]] = []
    # settings, both ways: train starts "on" tasks inside Settings (one right tap succeeds, a
    # reward a small model can find) and "off" tasks on the home screen; validation and test
    # start all inside
    for title, name, on, off in _TOGGLES:
        for turn_on in (True, False):
            verb, want, other = ("on", on, off) if turn_on else ("off", off, on)
            inside = split != "train" or turn_on
            rows.append({"id": f"{split}-setting-{name.split('/')[1]}-{verb}", "goal": f"Turn {verb} {title}.",
                         "start": {"settings": {name: other}, "app": "Settings" if inside else None},
                         "check": {"kind": "setting", "name": name, "value": want}})
    # contacts: add one, delete one (among others)
    for i, person in enumerate(names):
        others = [{"name": n, "phone": _phone(split, j)} for j, n in enumerate(names) if n != person][:2]
        rows.append({"id": f"{split}-contact-add-{i}",
                     "goal": f"Add a contact named {person} with the phone number {_phone(split, i)}.",
                     "start": {"contacts": others},
                     "check": {"kind": "contact_exists", "name": person, "value": _phone(split, i)}})
        rows.append({"id": f"{split}-contact-delete-{i}", "goal": f"Delete the contact {person}.",
                     "start": {"contacts": [*others[:1], {"name": person, "phone": _phone(split, i)}, *others[1:]],
                               "app": "Contacts" if i % 2 else None},
                     "check": {"kind": "contact_absent", "name": person}})
    for i, person in enumerate(names[: len(names) // 2]):
        rows.append({"id": f"{split}-contact-type-{i}",
                     "goal": f"Open the form to create a new contact and type the name {person} (do not save it).",
                     "start": {"app": "Contacts"},
                     "check": {"kind": "text_field", "name": "name_field", "value": person}})
    # notes: write one, delete one
    for i, text in enumerate(notes):
        rows.append({"id": f"{split}-note-add-{i}", "goal": f"Create a note that says: {text}",
                     "start": {"notes": [n for n in notes if n != text][:2]},
                     "check": {"kind": "note_exists", "value": text}})
    return rows


def _write_builtin(out_dir: Path = BUILTIN_DIR) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for split in ("train", "validation", "test"):
        with open(out_dir / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for row in builtin_tasks(split):
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    _write_builtin()
    print(f"wrote {BUILTIN_DIR}/train.jsonl, validation.jsonl and test.jsonl")
