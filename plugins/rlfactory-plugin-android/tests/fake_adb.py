#!/usr/bin/env python3
"""FAKE: a fake adb for tests; there is no Android device on CI.

It appends its arguments (without the program name) as one JSON line to the file named by
``FAKE_ADB_LOG`` and answers from canned outputs shaped like real adb's:

* ``devices``: the daemon's start-up lines, the header, and one ``device``, one ``offline``
  and one ``unauthorized`` row (only the header when ``FAKE_ADB_NO_DEVICES`` is set);
* a serial listed in ``FAKE_ADB_HANG`` (comma-separated) sleeps 30 s, whatever the command;
* a serial listed in ``FAKE_ADB_DEAD``: ``error: device '...' not found``, exit 1;
* ``get-state``: ``device``;
* ``shell wm size``: a ``Physical size`` and an ``Override size`` line;
* ``shell uiautomator dump /sdcard/window_dump.xml``: the success line, or uiautomator's
  idle-state error (exit 0, like the real one) when ``FAKE_ADB_DUMP`` is unset;
* ``exec-out cat /sdcard/window_dump.xml``: the file named by ``FAKE_ADB_DUMP``;
* ``exec-out screencap -p``: a 1x1 PNG (``FAKE_ADB_BAD_PNG`` set: text instead);
* ``shell settings get global wifi_on``: ``0``; any other ``settings get``: ``null``;
* ``shell content query`` of contacts, phones and raw contacts: rows in ``content``'s
  format (raw contacts: one per ``raw_contacts`` insert logged since the last ``pm clear``),
  or ``No result found.`` when ``FAKE_ADB_NO_CONTACTS`` is set;
  with ``FAKE_ADB_PROVIDER_ERROR`` set, every ``content`` command prints the provider error
  ``content`` prints (on stderr, exit 0, like the real one);
* ``shell pm clear PKG``: ``Success``;
* ``shell monkey -p com.example.missing ...``: monkey's abort message (exit 0, like monkey);
* anything else: no output, exit 0.
"""

import json
import os
import struct
import sys
import time
import zlib


def tiny_png() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # 1x1, 8-bit RGB
    pixels = zlib.compress(b"\x00\xff\xff\xff")  # filter byte, one white pixel
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


DEVICES = ("* daemon not running; starting now at tcp:5037\n"
           "* daemon started successfully\n"
           "List of devices attached\n"
           "emulator-5554\tdevice\n"
           "emulator-5556\toffline\n"
           "R58M123ABCD\tunauthorized\n"
           "\n")
CONTACTS = "Row: 0 _id=1, display_name=Alice Smith\nRow: 1 _id=2, display_name=Bob\n"
PHONES = "Row: 0 contact_id=1, data1=+1 555-0100\nRow: 1 contact_id=1, data1=NULL\n"


def serials(name: str) -> set:
    return {s for s in os.environ.get(name, "").split(",") if s}


def raw_contacts_since_clear(log_path: str, serial: str) -> int:
    count = 0
    with open(log_path) as log:
        for line in log:
            argv = json.loads(line)
            if argv[:2] != ["-s", serial]:
                continue
            command = " ".join(argv[2:])
            if command.startswith("shell pm clear com.android.providers.contacts"):
                count = 0
            elif command.startswith("shell content insert --uri content://com.android.contacts/raw_contacts"):
                count += 1
    return count


def main(argv: list) -> int:
    log_path = os.environ["FAKE_ADB_LOG"]
    with open(log_path, "a") as log:
        log.write(json.dumps(argv) + "\n")
    serial = None
    if argv[:1] == ["-s"]:
        serial, argv = argv[1], argv[2:]
    out = sys.stdout
    if argv == ["devices"]:
        out.write("List of devices attached\n\n" if os.environ.get("FAKE_ADB_NO_DEVICES") else DEVICES)
        return 0
    if serial in serials("FAKE_ADB_HANG"):
        time.sleep(30)
        return 0
    if serial in serials("FAKE_ADB_DEAD"):
        sys.stderr.write(f"error: device '{serial}' not found\n")
        return 1
    command = " ".join(argv)
    if command == "get-state":
        out.write("device\n")
    elif command == "shell wm size":
        out.write("Physical size: 1440x3120\nOverride size: 1080x2400\n")
    elif command == "shell uiautomator dump /sdcard/window_dump.xml":
        if os.environ.get("FAKE_ADB_DUMP"):
            out.write("UI hierchary dumped to: /sdcard/window_dump.xml\n")
        else:
            sys.stderr.write("ERROR: could not get idle state.\n")
    elif command == "exec-out cat /sdcard/window_dump.xml":
        with open(os.environ["FAKE_ADB_DUMP"], "rb") as dump:
            sys.stdout.buffer.write(dump.read())
    elif command == "exec-out screencap -p":
        sys.stdout.buffer.write(b"screencap: no display\n" if os.environ.get("FAKE_ADB_BAD_PNG") else tiny_png())
    elif command == "shell settings get global wifi_on":
        out.write("0\n")
    elif command.startswith("shell settings get "):
        out.write("null\n")
    elif command.startswith("shell content ") and os.environ.get("FAKE_ADB_PROVIDER_ERROR"):
        sys.stderr.write("Error while accessing provider:com.android.contacts\n"
                         "java.lang.SecurityException: Permission Denial: reading ContactsProvider2\n")
    elif command.startswith("shell content query "):
        if os.environ.get("FAKE_ADB_NO_CONTACTS"):
            out.write("No result found.\n")
        elif "content://com.android.contacts/contacts " in command:
            out.write(CONTACTS)
        elif "content://com.android.contacts/data/phones " in command:
            out.write(PHONES)
        elif "content://com.android.contacts/raw_contacts " in command:
            count = raw_contacts_since_clear(log_path, serial)
            out.write("".join(f"Row: {i} _id={i + 1}\n" for i in range(count)) or "No result found.\n")
    elif command.startswith("shell pm clear "):
        out.write("Success\n")
    elif command.startswith("shell monkey -p com.example.missing "):
        sys.stderr.write("** No activities found to run, monkey aborted.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
