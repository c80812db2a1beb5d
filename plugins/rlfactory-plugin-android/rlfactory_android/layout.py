"""How the simulated phone arranges its screens: the Settings rows, the apps, and a task's
:class:`Layout` (the order of the Settings rows and of the launcher's icons).

A task's ``start.layout`` lets the same goal start from screens whose element numbers differ,
so a model cannot solve a task by replaying the numbers it saw in training (issue 40)::

    "layout": {"settings_order": ["Dark theme", "Wi-Fi"], "home_order": ["Notes", "Settings"]}

``settings_order`` names Settings rows by title and ``home_order`` launcher icons by app
name: the ones named come first, in that order, the rest follow in their usual order. A name
the phone does not have, a name given twice or an unknown key is a ``ValueError`` naming the
problem. Only the simulated phone draws layouts: adb cannot reorder a real phone's Settings
rows or launcher icons, so :class:`~rlfactory_android.adb.AdbDevice` refuses a task with one.

This module imports nothing of the package, so :mod:`~rlfactory_android.device` (the task
state types) and :mod:`~rlfactory_android.simulated` (the phone) both build on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Layout", "TOGGLES", "APPS", "SETTINGS_TITLES"]

#: The Settings rows of the simulated phone in their usual order: (title, setting, value when
#: on, value when off). Tapping a row toggles its setting.
TOGGLES: tuple[tuple[str, str, str, str], ...] = (
    ("Wi-Fi", "global/wifi_on", "1", "0"), ("Bluetooth", "global/bluetooth_on", "1", "0"),
    ("Airplane mode", "global/airplane_mode_on", "1", "0"), ("Do not disturb", "global/zen_mode", "1", "0"),
    ("Dark theme", "secure/ui_night_mode", "2", "1"))
SETTINGS_TITLES: tuple[str, ...] = tuple(title for title, _, _, _ in TOGGLES)
#: App name -> package, for the apps the simulated phone has, in the launcher's usual order.
APPS: dict[str, str] = {"Settings": "com.android.settings", "Contacts": "com.android.contacts",
                        "Notes": "com.rlfactory.notes"}
_KEYS = {"settings_order": SETTINGS_TITLES, "home_order": tuple(APPS)}


def _ordered(usual: tuple[str, ...], first: tuple[str, ...]) -> tuple[str, ...]:
    return (*first, *(name for name in usual if name not in first))


@dataclass(frozen=True)
class Layout:
    """The order of the Settings rows (titles) and of the launcher's icons (app names); each
    names some or all, the rest follow in their usual order."""

    settings_order: tuple[str, ...] = ()
    home_order: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "Layout":
        """Read a ``start.layout`` mapping; ``ValueError`` naming ``where`` and the problem."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ValueError(f"{where}: start.layout must be a mapping (settings_order, home_order), "
                             f"got {type(data).__name__}")
        unknown = sorted(set(data) - set(_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) in start.layout: {', '.join(map(str, unknown))} "
                             "(it takes settings_order, home_order)")
        orders = {}
        for key, known in _KEYS.items():
            names = data.get(key) or []
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ValueError(f"{where}: start.layout.{key} must be a list of names ({', '.join(known)})")
            strange = [n for n in names if n not in known]
            if strange:
                raise ValueError(f"{where}: start.layout.{key}: the simulated phone has no {strange[0]!r} "
                                 f"(it has {', '.join(known)})")
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ValueError(f"{where}: start.layout.{key} names {', '.join(twice)} twice")
            orders[key] = tuple(names)
        return cls(**orders)

    @property
    def settings(self) -> tuple[str, ...]:
        """Every Settings row's title, in the order drawn."""
        return _ordered(SETTINGS_TITLES, self.settings_order)

    @property
    def home(self) -> tuple[str, ...]:
        """Every app's name, in the launcher's order."""
        return _ordered(tuple(APPS), self.home_order)

    @property
    def is_default(self) -> bool:
        """Whether this is the usual arrangement (a device without layouts shows that one)."""
        return self.settings == SETTINGS_TITLES and self.home == tuple(APPS)

    def to_dict(self) -> dict[str, list[str]] | None:
        """The JSON form (None for the usual arrangement)."""
        if self.is_default:
            return None
        return {key: list(names) for key, names in (("settings_order", self.settings_order),
                                                    ("home_order", self.home_order)) if names}
