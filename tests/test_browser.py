"""The browser tests' own machinery (tests/browser.py, the `browser` fixture): headless Chromium
loads a page from a local server, runs JavaScript, clicks, reads a computed colour (as the UI
tests read token colours), saves a screenshot, and leaves no browser process behind."""

from __future__ import annotations

import functools
import http.server
import threading
import time
from pathlib import Path

import pytest
from browser import CHROMEDRIVER_ENV, CHROMIUM_ENV, SCREENSHOTS, chromium, save_screenshot
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

PAGE = """<!doctype html>
<html><head><title>browser smoke</title><style>
  :root { --token-reward: rgb(214, 39, 40); }
  .token { color: var(--token-reward); font-family: monospace; }
</style></head>
<body>
  <h1>browser smoke</h1>
  <button id="add" onclick="add()">add a token</button>
  <div id="tokens"></div>
  <script>
    function add() {
      const span = document.createElement("span");
      span.className = "token";
      span.textContent = "tok" + document.querySelectorAll(".token").length;
      document.getElementById("tokens").appendChild(span);
    }
  </script>
</body></html>
"""


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def page_url(tmp_path):
    """PAGE served from tmp_path by a local HTTP server on 127.0.0.1."""
    (tmp_path / "index.html").write_text(PAGE)
    handler = functools.partial(_QuietHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/index.html"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_page_script_click_colour_and_screenshot(browser, page_url):
    browser.get(page_url)
    assert browser.title == "browser smoke"
    assert browser.execute_script("return document.querySelectorAll('.token').length + 40") == 40

    browser.find_element(By.ID, "add").click()
    token = WebDriverWait(browser, 10).until(lambda d: d.find_element(By.CSS_SELECTOR, "#tokens .token"))
    assert token.text == "tok0"
    # A token's colour as the UI tests read it: the computed style, CSS variables resolved.
    assert browser.execute_script("return getComputedStyle(arguments[0]).color", token) == "rgb(214, 39, 40)"
    assert token.value_of_css_property("color") == "rgba(214, 39, 40, 1)"
    # The window is the size asked for (the viewport a little smaller: no scrollbars headless).
    assert browser.execute_script("return [window.outerWidth, window.outerHeight]") == [1400, 1000]

    path = save_screenshot(browser, "browser smoke")
    assert path == SCREENSHOTS / "browser_smoke.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


def _processes_using(profile: Path) -> list[str]:
    """The live processes started with ``profile`` as their profile: the browser and its children
    (zygotes, GPU, network, renderers; these rewrite their command line into one string)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # it exited meanwhile
            continue
        if f"--user-data-dir={profile} " in text + " ":
            found.append(f"{cmdline.parent.name}: {text[:120]}")
    return found


def test_quit_leaves_no_browser_process(tmp_path):
    profile = tmp_path / "profile"
    with chromium(profile) as driver:
        driver.get("about:blank")
        chromedriver = driver.service.process
        assert len(_processes_using(profile)) > 1, "the browser's processes were not found by their profile"
    assert chromedriver.poll() is not None, "chromedriver still runs after quit"
    deadline = time.monotonic() + 10
    while (left := _processes_using(profile)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes left after quit: {left}"


def _failure(tmp_path) -> str:
    with pytest.raises(pytest.fail.Exception) as failed:
        with chromium(tmp_path / "profile"):
            pass
    message = str(failed.value)
    assert "make install" in message and "apt-get install chromium chromium-driver" in message
    assert "\n" not in message
    return message


@pytest.mark.parametrize("env", [CHROMIUM_ENV, CHROMEDRIVER_ENV])
def test_a_missing_browser_or_driver_fails_and_says_what_to_run(env, tmp_path, monkeypatch):
    monkeypatch.setenv(env, str(tmp_path / "missing"))
    assert f"{env}={tmp_path / 'missing'} is not an executable" in _failure(tmp_path)


def test_neither_installed_names_both(tmp_path, monkeypatch):
    monkeypatch.delenv(CHROMIUM_ENV, raising=False)
    monkeypatch.delenv(CHROMEDRIVER_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    message = _failure(tmp_path)
    assert "no `chromium` on PATH; no `chromedriver` on PATH" in message
