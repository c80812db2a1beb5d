"""The README's four `rlf ui` pictures (docs/images/ui-*.png), taken from real runs.

Serves RUNS_DIR with `rlf ui`'s own app and drives Debian's headless Chromium through the
browser tests' setup (tests/browser.py): the runs list with a comparison, a run's page, one
trajectory with a trained token hovered, and the new-run form after Check with two mistakes.
Every page is reached through its URL (the UI keeps its state there), so a picture shows what a
pasted link shows. It needs `make install` (Chromium, chromedriver, selenium).

    .venv/bin/python scripts/ui_screenshots.py --runs RUNS_DIR --run NAME \
        --compare NAME1,NAME2 --metric reward/mean,tools/calls_per_trajectory --out docs/images

The trajectory shown is the training member with the highest advantage at the run's last
recorded training step (or --trajectory KIND/STEP/INDEX).
"""

from __future__ import annotations

import argparse
import secrets
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

PAGE_S = 60  # a hang guard: how long one page may take to draw before the script gives up


def serve(runs: Path):
    """`rlf ui`'s app on a free local port, in a thread; returns (base URL, token, server)."""
    import uvicorn

    from rlfactory_cli.ui.app import create_app

    token = secrets.token_urlsafe(16)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(runs, token=token, port=port), log_level="warning"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    deadline = time.monotonic() + PAGE_S
    while not server.started:
        if time.monotonic() > deadline:
            raise SystemExit(f"error: rlf ui did not start on port {port} within {PAGE_S} s")
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", token, server


def wait(driver, condition, what: str) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        WebDriverWait(driver, PAGE_S, poll_frequency=0.2, ignored_exceptions=[StaleElementReferenceException]
                      ).until(lambda d: condition(d))
    except Exception as err:  # a timeout or the page's own failure: say which page
        raise SystemExit(f"error: {what} did not show within {PAGE_S} s ({type(err).__name__}); "
                         f"is the run recorded (logging.record_train_groups) and the name right?") from None


def best_trajectory(runs: Path, run: str) -> str:
    """KIND/STEP/INDEX of the last recorded training step's member with the highest advantage."""
    from rlfactory_core.records import RunRecords

    records = RunRecords(runs / run)
    steps = records.steps("train")
    if not steps:
        raise SystemExit(f"error: {runs / run} has no recorded training step; pass --trajectory KIND/STEP/INDEX")
    rows = records.list("train", steps[-1])
    index = max(range(len(rows)), key=lambda i: rows[i].get("advantage") or float("-inf"))
    return f"train/{steps[-1]}/{rows[index]['index']}"


def shoot(driver, out: Path, name: str) -> None:
    path = out / f"{name}.png"
    if not driver.save_screenshot(str(path)):
        raise SystemExit(f"error: Chromium could not save {path}")
    print(f"  {path}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, required=True, help="the runs directory to serve")
    parser.add_argument("--run", required=True, help="the run whose page and trajectory are shown")
    parser.add_argument("--compare", default="", help="runs compared on the runs list, NAME1,NAME2 (default: none)")
    parser.add_argument("--metric", default="eval/reward/accuracy", help="the compared metrics, comma-separated")
    parser.add_argument("--trajectory", default="", help="KIND/STEP/INDEX (default: the best-advantage member)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args()
    for name in [args.run, *filter(None, args.compare.split(","))]:
        if not (args.runs / name).is_dir():
            parser.error(f"--runs {args.runs} has no run {name!r}")
    args.out.mkdir(parents=True, exist_ok=True)

    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    from browser import chromium

    trajectory = args.trajectory or best_trajectory(args.runs, args.run)
    base, token, server = serve(args.runs)
    with tempfile.TemporaryDirectory() as profile, chromium(Path(profile) / "profile") as driver:
        driver.get(f"{base}/?token={token}")  # signs in: the cookie is set
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "tr.run"), "the runs list")
        if args.compare:
            driver.get(f"{base}/#/?compare={quote(args.compare)}&metric={quote(args.metric)}")
            wait(driver, lambda d: d.execute_script(
                "const p = document.querySelector('#compare-plot .plot .main-svg'); return !!p"), "the comparison")
        time.sleep(1)  # plotly's transitions
        shoot(driver, args.out, "ui-runs")

        driver.get(f"{base}/#/run/{quote(args.run)}")
        wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".plot .main-svg")) >= 6, "the run's plots")
        time.sleep(1)
        shoot(driver, args.out, "ui-run")

        driver.get(f"{base}/#/run/{quote(args.run)}/t/{trajectory}")
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#tokens .tok[data-mask='1']"), "the token view")
        token_el = driver.find_elements(By.CSS_SELECTOR, "#tokens .tok[data-mask='1']")[0]
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", token_el)
        ActionChains(driver).move_to_element(token_el).perform()
        wait(driver, lambda d: d.find_element(By.ID, "tooltip").is_displayed(), "the token's tooltip")
        shoot(driver, args.out, "ui-trajectory")

        driver.get(f"{base}/#/new")
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-key='train.steps']"), "the new-run form")
        for key, value in (("train.steps", "-1"), ("train.lr", "fast")):
            driver.execute_script(
                "const el = document.querySelector(`[data-key='${arguments[0]}']`); el.value = arguments[1];"
                "el.dispatchEvent(new Event('change', {bubbles: true}));", key, value)
        driver.find_element(By.ID, "validate").click()
        wait(driver, lambda d: len([e for e in d.find_elements(By.CSS_SELECTOR, ".field-error") if e.text]) >= 2,
             "the form's errors")
        driver.execute_script("window.scrollTo(0, 0)")
        shoot(driver, args.out, "ui-new-run")
    server.should_exit = True


if __name__ == "__main__":
    main()
