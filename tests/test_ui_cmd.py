"""`rlf ui` as a user starts it: the URL with its token printed, the token required, bad
options refused with one line."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

#: A hang guard, not a timing: how long the server may take to print its URL.
START_S = 60


def _start(*args):
    return subprocess.Popen([sys.executable, "-m", "rlfactory_cli", "ui", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"})


def _url(process):
    deadline = time.monotonic() + START_S
    lines = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        match = re.search(r"open\s+(http://\S+)", line)
        if match:
            return match.group(1)
    raise AssertionError("rlf ui printed no URL:\n" + "".join(lines))


def _get(url, **headers):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_rlf_ui_prints_a_url_with_a_fresh_token_and_needs_it(tmp_path):
    process = _start(str(tmp_path / "runs"), "--port", "0")
    try:
        url = _url(process)
        base, token = re.match(r"(http://127\.0\.0\.1:\d+)/\?token=([A-Za-z0-9_-]{32})$", url).groups()
        assert _get(f"{base}/api/runs")[0] == 401
        assert _get(f"{base}/api/runs", Authorization="Bearer wrong-token-0123456789")[0] == 401
        status, body = _get(f"{base}/api/runs", Authorization=f"Bearer {token}")
        assert status == 200 and json.loads(body)["runs"] == []
        assert (tmp_path / "runs").is_dir()
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=START_S)


def test_bad_options_are_one_line_errors(tmp_path):
    short = subprocess.run([sys.executable, "-m", "rlfactory_cli", "ui", str(tmp_path), "--token", "abc"],
                           capture_output=True, text=True, timeout=START_S)
    assert short.returncode == 2 and "--token" in short.stderr and "16 characters" in short.stderr
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        taken = subprocess.run([sys.executable, "-m", "rlfactory_cli", "ui", str(tmp_path), "--port",
                                str(busy.getsockname()[1])], capture_output=True, text=True, timeout=START_S)
    finally:
        busy.close()
    assert taken.returncode == 1 and "cannot listen" in taken.stderr and "--port" in taken.stderr
