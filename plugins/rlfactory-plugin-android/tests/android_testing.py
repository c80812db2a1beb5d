"""Helpers of the android plugin's tests (a module of its own: pytest imports test
directories' modules by basename, so the name is unique)."""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent
DUMPS = HERE / "dumps"
SERIAL = "emulator-5554"  # the one ready device the fake adb lists


class FakeAdb:
    """The fake adb as an executable, and what it was asked."""

    def __init__(self, path: Path, log: Path):
        self.path = str(path)
        self.log = log

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def commands(self, serial: str = SERIAL) -> list[list[str]]:
        """The commands sent to ``serial``, without ``-s SERIAL``."""
        return [call[2:] for call in self.calls() if call[:2] == ["-s", serial]]

    def clear(self) -> None:
        self.log.write_text("")
