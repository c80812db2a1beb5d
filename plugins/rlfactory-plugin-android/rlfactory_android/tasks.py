"""Android tasks: what to do, the device state to start from, and the success check.

A task file is JSONL, one task a line::

    {"id": "wifi-off-0", "goal": "Turn off Wi-Fi.",
     "start": {"settings": {"global/wifi_on": "1"}, "app": null},
     "check": {"kind": "setting", "name": "global/wifi_on", "value": "0"}}

``start`` (optional) is a :class:`~rlfactory_android.device.StartState`: ``settings``
(``<namespace>/<key>`` -> value), ``contacts`` (``[{"name", "phone"}]``, exactly these exist),
``notes`` (texts), ``app`` (an app name of the env's ``apps``, or null for the home screen)
and ``layout`` (the order of the simulated phone's Settings rows and launcher icons,
:class:`~rlfactory_android.layout.Layout`). ``check`` is a
:class:`~rlfactory_android.device.Check` (kinds ``setting``, ``contact_exists``,
``contact_absent``, ``note_exists``, ``text_field``). Every problem in a file is reported at
once, with its line number.

The built-in tasks (``tasks/<split>.jsonl`` in this package, :data:`BUILTIN_SPLITS`) are made
by :func:`builtin_tasks` for the simulated phone's apps. ``validation`` and ``test`` use other
names, numbers and note texts than training and each other, in the usual layout; ``train``
varies every task's layout, other settings and list lengths (seeded by the task's id);
``test_layouts`` puts the test names and notes in layouts and lists no training task has, so
a training episode's element numbers are wrong on every one of them. No held-out task equals
a training task after :func:`normalised`. ``python -m rlfactory_android.tasks`` rewrites the
files (they are checked in; a test checks they are what :func:`builtin_tasks` makes).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .device import Check, StartState
from .layout import APPS, SETTINGS_TITLES, TOGGLES
from .simulated import DEFAULT_SETTINGS

__all__ = ["Task", "load_tasks", "read_task", "builtin_tasks", "BUILTIN_DIR", "BUILTIN_SPLITS", "check_text",
           "normalised"]

BUILTIN_DIR = Path(__file__).parent / "tasks"
#: The built-in splits, each a file ``tasks/<split>.jsonl``.
BUILTIN_SPLITS = ("train", "validation", "test", "test_layouts")


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


def normalised(task: Task) -> tuple[Any, ...]:
    """What makes two tasks the same episode: the goal (case and spacing ignored) and the start
    as the simulated phone shows it (settings over the phone's defaults, the contacts as the
    sorted list the app shows, the notes in order, the app, the rows' and icons' order)."""
    start = task.start
    return (" ".join(task.goal.split()).casefold(), tuple(sorted({**DEFAULT_SETTINGS, **start.settings}.items())),
            tuple(sorted(start.contacts, key=lambda c: (c[0].lower(), c))), start.notes, start.app,
            start.layout.settings, start.layout.home)


# --------------------------------------------------------------------------- built-in tasks

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
#: Contacts and notes that are no task's target, added to start states so that lists differ in
#: length (and element numbers with them). The test fillers all sort before every test name.
_FILLER_NAMES = {
    "train": ["Nina Patel", "Omar Reed", "Paula Diaz", "Ray Cooper", "Sam Bell", "Yusuf Ali", "Zoe Park"],
    "test": ["Aaron Price", "Abby Ford", "Amir Haddad", "Ben Ortiz", "Bella Cruz", "Chloe Reyes", "Dan Foster",
             "Eli Brooks", "Fay Morgan", "Gus Ward", "Hana Kim", "Ivan Petrov", "Jade Chen", "Kurt Hayes"],
}
_FILLER_NOTES = {
    "train": ["Gym at six", "Dentist on Tuesday", "Plan the trip"],
    "test": ["Oil change", "Birthday gift for Dad", "Recycle bottles", "Order printer ink", "Fix the fence",
             "Check tyre pressure", "Clean the garage", "Buy stamps"],
}
_ROWS_ON_SCREEN = 12  # contacts the simulated phone's list shows without scrolling


def _phone(split: str, i: int) -> str:
    return f"555-{_PHONE_BASE[split] + 101 * (i + 1):04d}"


def _filler_contacts(split: str, count: int, rng: random.Random) -> list[dict[str, str]]:
    names = sorted(rng.sample(_FILLER_NAMES[split], count))
    return [{"name": n, "phone": f"555-{7000 + 37 * _FILLER_NAMES[split].index(n):04d}"} for n in names]


def _layout(rng: random.Random, title: str | None = None, position: int | None = None) -> dict[str, list[str]]:
    """A shuffled layout (never the usual one); with ``title``, its row at ``position``."""
    while True:
        rows, apps = list(SETTINGS_TITLES), list(APPS)
        rng.shuffle(rows)
        rng.shuffle(apps)
        if title is not None and position is not None:
            rows.remove(title)
            rows.insert(position, title)
        if rows != list(SETTINGS_TITLES) or apps != list(APPS):
            return {"settings_order": rows, "home_order": apps}


def _other_settings(rng: random.Random, name: str) -> dict[str, str]:
    """The settings other than ``name``, each on or off at random."""
    return {other: rng.choice((on, off)) for _, other, on, off in TOGGLES if other != name}


def _classic(split: str) -> list[dict[str, Any]]:
    """The tasks of issue 21 (the usual layout): settings both ways, contacts and notes."""
    names, notes = _NAMES[split], _NOTES[split]
    rows: list[dict[str, Any]] = []
    # settings, both ways: train starts "on" tasks inside Settings (one right tap succeeds, a
    # reward a small model can find) and "off" tasks on the home screen; validation and test
    # start all inside
    for title, name, on, off in TOGGLES:
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


def _varied_train() -> list[dict[str, Any]]:
    """The training tasks of :func:`_classic`, each varied (seeded by its id): a shuffled
    layout (a setting's row never where the usual layout has it), the other settings at
    random, 0-2 more contacts and 0-1 more note."""
    rows = _classic("train")
    for row in rows:
        rng, start, check = random.Random(row["id"]), row["start"], row["check"]
        if check["kind"] == "setting":
            title = next(t for t, name, _, _ in TOGGLES if name == check["name"])
            usual = SETTINGS_TITLES.index(title)
            position = rng.choice([p for p in range(len(SETTINGS_TITLES)) if p != usual])
            start["settings"] = {**_other_settings(rng, check["name"]), **start["settings"]}
            start["layout"] = _layout(rng, title, position)
            continue
        if check["kind"] == "note_exists":
            start["notes"] = start["notes"] + rng.sample(_FILLER_NOTES["train"], rng.randint(0, 1))
        else:
            start["contacts"] = start.get("contacts", []) + _filler_contacts("train", rng.randint(0, 2), rng)
        start["layout"] = _layout(rng)
    return rows


def _test_layouts(train: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Unseen layouts and longer lists: every target's element number differs from the
    numbers the training tasks' demonstrations act on (see the README)."""
    rows: list[dict[str, Any]] = []
    trained_at = {row["goal"]: row["start"]["layout"]["settings_order"] for row in train
                  if row["check"]["kind"] == "setting"}
    # settings: each goal at three rows other than the one training shows it at
    for title, name, on, off in TOGGLES:
        for verb, want, other in (("on", on, off), ("off", off, on)):
            goal = f"Turn {verb} {title}."
            rng = random.Random(f"test_layouts-{goal}")
            positions = rng.sample([p for p in range(len(SETTINGS_TITLES)) if trained_at[goal][p] != title], 3)
            for j, position in enumerate(positions):
                rows.append({"id": f"test_layouts-setting-{name.split('/')[1]}-{verb}-{j}", "goal": goal,
                             "start": {"settings": {**_other_settings(rng, name), name: other},
                                       "app": "Settings" if j % 2 == 0 else None,
                                       "layout": _layout(rng, title, position)},
                             "check": {"kind": "setting", "name": name, "value": want}})
    names, notes = _NAMES["test"], _NOTES["test"]
    for i, person in enumerate(names):
        rng = random.Random(f"test_layouts-contact-{person}")
        phone, other = _phone("test", i), rng.choice([n for n in names if n != person])
        extra = {"name": other, "phone": _phone("test", names.index(other))}
        # delete: 5-8 contacts before it on the list (no training list is that long), or 12-14
        # (below the screen's 12 rows: swipe first)
        for variant, count in (("a", 5 + i % 4), ("b", _ROWS_ON_SCREEN + i % 3)):
            contacts = _filler_contacts("test", count, rng) + [extra, {"name": person, "phone": phone}]
            rows.append({"id": f"test_layouts-contact-delete-{i}{variant}", "goal": f"Delete the contact {person}.",
                         "start": {"contacts": contacts, "app": "Contacts" if (i + (variant == "b")) % 2 else None,
                                   "layout": _layout(rng)},
                         "check": {"kind": "contact_absent", "name": person}})
        rows.append({"id": f"test_layouts-contact-add-{i}",
                     "goal": f"Add a contact named {person} with the phone number {phone}.",
                     "start": {"contacts": _filler_contacts("test", 5 + (i * 3) % 5, rng) + [extra],
                               "app": "Contacts" if i % 2 else None, "layout": _layout(rng)},
                     "check": {"kind": "contact_exists", "name": person, "value": phone}})
        rows.append({"id": f"test_layouts-contact-type-{i}",
                     "goal": f"Open the form to create a new contact and type the name {person} (do not save it).",
                     "start": {"contacts": _filler_contacts("test", 5 + (i * 2) % 5, rng),
                               "app": "Contacts" if i % 2 == 0 else None, "layout": _layout(rng)},
                     "check": {"kind": "text_field", "name": "name_field", "value": person}})
    for i, text in enumerate(notes):
        rng = random.Random(f"test_layouts-note-{text}")
        for j in range(3):
            rows.append({"id": f"test_layouts-note-add-{i}{'abc'[j]}", "goal": f"Create a note that says: {text}",
                         "start": {"notes": rng.sample(_FILLER_NOTES["test"], 4 + (i + 2 * j) % 5),
                                   "app": "Notes" if (i + j) % 2 else None, "layout": _layout(rng)},
                         "check": {"kind": "note_exists", "value": text}})
    return rows


def builtin_tasks(split: str) -> list[dict[str, Any]]:
    """The built-in tasks of ``split`` (one of :data:`BUILTIN_SPLITS`) as JSON rows, in a fixed
    order: ``validation`` and ``test`` in the usual layout, with names, numbers and notes of
    their own; ``train`` with shuffled layouts, other settings and longer lists, seeded by each
    task's id; ``test_layouts`` with the test names and notes in layouts and lists no training
    task has."""
    if split not in BUILTIN_SPLITS:
        raise ValueError(f"no built-in split {split!r} (splits: {', '.join(BUILTIN_SPLITS)})")
    if split == "train":
        return _varied_train()
    if split == "test_layouts":
        return _test_layouts(_varied_train())
    return _classic(split)


def _write_builtin(out_dir: Path = BUILTIN_DIR) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for split in BUILTIN_SPLITS:
        with open(out_dir / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for row in builtin_tasks(split):
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    _write_builtin()
    print(f"wrote {', '.join(f'{split}.jsonl' for split in BUILTIN_SPLITS)} in {BUILTIN_DIR}")
