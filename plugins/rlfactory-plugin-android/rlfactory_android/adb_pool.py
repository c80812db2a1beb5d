"""The adb backend's device pool: :class:`AdbDevicePool` leases devices one per trajectory.

:class:`AdbDevicePool` hands out devices one per trajectory: ``await pool.lease()`` returns a
free device that has just passed :meth:`AdbDevice.healthy` (checked in a thread, so the event
loop keeps running), and ``await pool.release(device)`` gives it back. With more concurrent
trajectories than devices, the extra ``lease`` calls wait until one is released. A device
that fails its health check is logged (``logging.warning``), set aside and tried again once
``retry_after_s`` has passed since its check; while every device is set aside and none is due
for another try, ``lease`` raises ``DeviceError``.

Split from :mod:`rlfactory_android.adb` (which imports it, so ``rlfactory_android.adb.AdbDevicePool``
still works); it logs under that module's logger, ``rlfactory_android.adb``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from typing import Sequence

from .adb import AdbDevice, list_devices
from .device import DeviceError

__all__ = ["AdbDevicePool"]

logger = logging.getLogger("rlfactory_android.adb")


class AdbDevicePool:
    """Devices leased one per trajectory (see the module docstring).

    :param serials: the devices to use; None: every device ``adb devices`` lists as ready.
    :param adb_path: the ``adb`` binary.
    :param timeout_s: the time limit of one adb command.
    :param retry_after_s: how long a device that failed its health check is set aside.
    """

    def __init__(self, serials: Sequence[str] | None = None, adb_path: str = "adb", timeout_s: float = 15.0,
                 retry_after_s: float = 30.0):
        if serials is None:
            serials = list_devices(adb_path, timeout_s)
            if not serials:
                raise DeviceError("no Android device is connected (adb devices lists none as ready); start an "
                                  "emulator or connect a device with USB debugging on and authorized")
        elif isinstance(serials, str) or not serials:
            raise DeviceError(f"the adb backend needs a list of device serials (adb devices), got {serials!r}")
        if len(set(serials)) != len(serials):
            raise DeviceError(f"device serials are listed twice: {', '.join(serials)}")
        self.devices = [AdbDevice(serial, adb_path=adb_path, timeout_s=timeout_s) for serial in serials]
        self.retry_after_s = float(retry_after_s)
        # State changes happen under a threading lock (never held across an await), so release
        # works from any thread and event loop; waiting leases are woken through their loop.
        self._lock = threading.Lock()
        self._free: deque[AdbDevice] = deque(self.devices)
        self._leased: set[str] = set()
        self._checking: set[str] = set()
        self._set_aside: dict[str, float] = {}  # serial -> when it failed its health check
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def serials(self) -> list[str]:
        return [device.serial for device in self.devices]

    def _take(self) -> tuple[AdbDevice | None, float | None]:
        """A free device, else a set-aside one that is due for another try; else None and the
        seconds until the next one is due (None: none is set aside)."""
        if self._free:
            return self._free.popleft(), None
        now = time.monotonic()
        due_in = None
        for device in self.devices:
            failed_at = self._set_aside.get(device.serial)
            if failed_at is None:
                continue
            wait = failed_at + self.retry_after_s - now
            if wait <= 0:
                del self._set_aside[device.serial]
                return device, None
            due_in = wait if due_in is None else min(due_in, wait)
        return None, due_in

    def _wake_all(self) -> None:
        waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_resolve, future)

    async def lease(self) -> AdbDevice:
        """A healthy device for one trajectory; waits while every device is leased."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                device, due_in = self._take()
                if device is None:
                    if not self._leased and not self._checking and len(self._set_aside) == len(self.devices):
                        raise DeviceError(f"every Android device failed its health check ({', '.join(self.serials)}); "
                                          "check `adb devices` and restart the emulators")
                    waiter: asyncio.Future[None] = loop.create_future()
                    self._waiters.append((loop, waiter))
                else:
                    self._checking.add(device.serial)
            if device is None:
                try:
                    await asyncio.wait({waiter}, timeout=due_in)
                finally:
                    with self._lock:
                        self._waiters = [(l, w) for l, w in self._waiters if w is not waiter]
                continue
            try:
                ok = await asyncio.to_thread(device.healthy)
            except BaseException:
                with self._lock:  # cancelled while checking: the device is not ours, give it back
                    self._checking.discard(device.serial)
                    self._free.appendleft(device)
                    self._wake_all()
                raise
            with self._lock:
                self._checking.discard(device.serial)
                if ok:
                    self._leased.add(device.serial)
                    return device
                self._set_aside[device.serial] = time.monotonic()
                self._wake_all()  # a waiting lease may now find every device set aside
            logger.warning("Android device %s failed its health check (adb -s %s get-state); trying another, "
                           "and this one again in %gs", device.serial, device.serial, self.retry_after_s)

    async def release(self, device: AdbDevice) -> None:
        """Give a leased device back (a waiting ``lease`` gets it)."""
        with self._lock:
            if device.serial not in self._leased:
                raise ValueError(f"device {device.serial} is not leased from this pool")
            self._leased.discard(device.serial)
            self._free.append(device)
            self._wake_all()

    def __repr__(self) -> str:
        return f"AdbDevicePool({self.serials})"


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
