"""Headless Chromium for the browser tests (the `browser` fixture in tests/conftest.py).

Debian's `chromium` and `chromium-driver` packages driven by Selenium, offline: the driver's
path is given, so Selenium Manager never runs, and SE_OFFLINE=true forbids it to download a
browser or a driver if it ever did. `make install` (and so `make test`) installs both packages.
A missing browser or driver FAILS the test, never skips it: a skipped UI test would hide a UI
that no longer works. RLFACTORY_CHROMIUM / RLFACTORY_CHROMEDRIVER point at other executables.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM_ENV = "RLFACTORY_CHROMIUM"
CHROMEDRIVER_ENV = "RLFACTORY_CHROMEDRIVER"
INSTALL_HINT = "run `make install` (or `apt-get install chromium chromium-driver` as root)"
# Kept between runs and ignored by git (.gitignore): the UI tests' pictures of the main pages.
SCREENSHOTS = Path(__file__).resolve().parents[1] / "screenshots"
PAGE_LOAD_TIMEOUT_S = 30
SCRIPT_TIMEOUT_S = 30
WINDOW_SIZE = (1400, 1000)

os.environ["SE_OFFLINE"] = "true"  # before selenium is imported, and inherited by the driver


def executables() -> tuple[str, str]:
    """The paths of chromium and chromedriver (or $RLFACTORY_CHROMIUM's, $RLFACTORY_CHROMEDRIVER's);
    the test fails, saying what to run, when either is missing."""
    found, missing = [], []
    for env, name in ((CHROMIUM_ENV, "chromium"), (CHROMEDRIVER_ENV, "chromedriver")):
        configured = os.environ.get(env)
        path = configured or shutil.which(name)
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            found.append(path)
        else:
            missing.append(f"{env}={configured} is not an executable" if configured else f"no `{name}` on PATH")
    if missing:
        pytest.fail(f"browser tests need Debian's chromium and chromium-driver: {'; '.join(missing)}; "
                    f"{INSTALL_HINT}", pytrace=False)
    return found[0], found[1]


@contextlib.contextmanager
def chromium(profile_dir: Path) -> Iterator:
    """A headless Chromium WebDriver with its profile in ``profile_dir``; quit on exit, always."""
    from selenium import webdriver
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.service import Service

    browser_path, driver_path = executables()
    options = webdriver.ChromeOptions()
    options.binary_location = browser_path
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--user-data-dir={profile_dir}",
                 "--window-size={},{}".format(*WINDOW_SIZE)):
        options.add_argument(flag)
    log = profile_dir.parent / f"{profile_dir.name}-chromedriver.log"
    service = Service(executable_path=driver_path, log_output=str(log))
    started = time.perf_counter()
    try:
        driver = webdriver.Chrome(options=options, service=service)
    except WebDriverException as err:  # the driver ran but the browser did not start
        error = err.msg
    else:
        error = None
    if error is not None:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-12:]) if log.exists() else ""
        pytest.fail(f"headless Chromium did not start ({browser_path} via {driver_path}): {error}\n"
                    f"the end of the chromedriver log {log}:\n{tail}", pytrace=False)
    try:
        driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT_S)
        driver.set_script_timeout(SCRIPT_TIMEOUT_S)
        print(f"headless Chromium {driver.capabilities.get('browserVersion')} started in "
              f"{time.perf_counter() - started:.2f} s")
        yield driver
    finally:
        driver.quit()


def save_screenshot(driver, name: str) -> Path:
    """Save the window as screenshots/<name>.png (replacing an older one) and return its path."""
    SCREENSHOTS.mkdir(exist_ok=True)
    path = SCREENSHOTS / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', name)}.png"
    if not driver.save_screenshot(str(path)):
        raise AssertionError(f"Chromium could not save a screenshot to {path}")
    return path
