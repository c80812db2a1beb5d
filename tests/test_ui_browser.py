"""`rlf ui` in a real browser (headless Chromium from Debian, tests/browser.py), served by
uvicorn from a runs directory made by a real short training run: from the runs list to a
trajectory whose token colours match the recorded loss mask; a bad config's errors inline; a
run launched from the form reaching step 1 on the live page, and stop checkpointing it.
Screenshots of each page land in screenshots/ (ignored by git)."""

import json
import re
import shutil
import socket
import threading
import time
import urllib.request

import pytest
import uvicorn
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from browser import save_screenshot
from rlfactory_cli.ui.app import create_app
from rlfactory_core import OUTCOMES
from rlfactory_core.records import RunRecords

TOKEN = "browser-test-token-0123456789"
#: Hang guards, not timings: how long a wait may take before the test calls it stuck.
PAGE_S = 30
LAUNCH_S = 300


@pytest.fixture(scope="module")
def served(ui_runs_dir, tmp_path_factory):
    runs = tmp_path_factory.mktemp("ui-browser") / "runs"
    shutil.copytree(ui_runs_dir, runs, symlinks=True)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(runs, token=TOKEN, port=port)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + PAGE_S
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield {"base": f"http://127.0.0.1:{port}", "runs": runs, "app": app}
    for child in app.state.launcher.children.values():  # a run the test left going
        if child.poll() is None:
            child.kill()
            child.wait()
    server.should_exit = True
    thread.join(PAGE_S)


def api(served, path):
    request = urllib.request.Request(served["base"] + path, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request) as response:
        return json.load(response)


def wait(driver, condition, seconds=PAGE_S, message=""):
    # the pages redraw every few seconds: an element found in one poll may be gone in the next
    return WebDriverWait(driver, seconds, poll_frequency=0.2, ignored_exceptions=[StaleElementReferenceException]
                         ).until(lambda d: condition(d), message)


def page_text(driver, selector):
    """The text of the first element matching ``selector``, read in one step (no stale element)."""
    return driver.execute_script("const e = document.querySelector(arguments[0]); return e ? e.innerText : '';",
                                 selector)


def test_from_the_runs_list_to_a_trajectory_whose_token_colours_are_its_loss_mask(browser, served):
    browser.get(f"{served['base']}/?token={TOKEN}")  # the cookie is set, the token leaves the URL
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr.run")) == 4, message="the runs list")
    assert TOKEN not in browser.current_url
    states = browser.execute_script("return Object.fromEntries([...document.querySelectorAll('tr.run')].map("
                                    "r => [r.dataset.run, r.querySelector('.state').innerText]))")
    assert states == {"tiny": "finished", "old": "finished", "killed": "died", "broken": "unknown"}
    for run in ("tiny", "old"):  # two runs' curves on one plot
        browser.find_element(By.CSS_SELECTOR, f"tr.run[data-run='{run}'] input[type=checkbox]").click()
    browser.find_element(By.ID, "compare").click()
    wait(browser, lambda d: d.execute_script(
        "const p = document.querySelector('#compare-plot .plot'); return p && p.data && p.data.length === 2"), message="compare")
    names = browser.execute_script("return document.querySelector('#compare-plot .plot').data.map(t => t.name)")
    assert sorted(names) == ["old", "tiny"]
    save_screenshot(browser, "ui-runs")

    browser.find_element(By.LINK_TEXT, "tiny").click()
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".plot .main-svg")) >= 8, message="the run's plots")
    panels = {el.get_attribute("data-panel") for el in browser.find_elements(By.CSS_SELECTOR, ".plot")}
    assert {"Reward (training)", "Held-out", "Entropy", "Sampler vs trainer", "Step time by phase (s)",
            "Outcomes (training)"} <= panels
    outcome_traces = browser.execute_script(
        "return document.querySelector(\"[data-panel='Outcomes (training)']\").data.map(t => t.name)")
    assert outcome_traces and set(outcome_traces) <= set(OUTCOMES)  # classes only, stacked
    save_screenshot(browser, "ui-run")

    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "tr.trajectory-row"), message="the trajectory list")
    Select(browser.find_element(By.ID, "kind")).select_by_value("train")
    Select(browser.find_element(By.ID, "step")).select_by_value("1")
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr.trajectory-row")) == 4, message="step 1's rows")
    # the outcome filter offers the step's classes and sides; the tiny model's are the policy's
    options = [o.get_attribute("value") for o in browser.find_elements(By.CSS_SELECTOR, "#outcome option")]
    assert "policy" in options and set(options) - {"", "policy"} <= set(OUTCOMES)
    Select(browser.find_element(By.ID, "outcome")).select_by_value("policy")
    wait(browser, lambda d: d.find_element(By.ID, "outcome").get_attribute("value") == "policy"
         and len(d.find_elements(By.CSS_SELECTOR, "tr.trajectory-row")) == 4, message="the policy's rows")
    browser.find_elements(By.CSS_SELECTOR, "tr.trajectory-row")[0].click()
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#tokens .tok"), message="the token view")

    recorded = RunRecords(served["runs"] / "tiny").trajectory("train", 1, 0)["sequences"][0]
    shown = browser.execute_script(
        "return [...document.querySelectorAll('#tokens .tok')].map(t => [Number(t.dataset.mask), "
        "getComputedStyle(t).backgroundColor, t.textContent])")
    assert [mask for mask, _, _ in shown] == recorded["loss_mask"]
    assert [text for _, _, text in shown] == recorded["pieces"]
    colours = {1: "rgb(170, 222, 170)", 0: "rgb(236, 236, 236)"}
    assert all(colour == colours[mask] for mask, colour, _ in shown)
    assert 0 < sum(recorded["loss_mask"]) < len(recorded["loss_mask"])  # both colours are really checked

    trained = recorded["loss_mask"].index(1)
    token = browser.find_elements(By.CSS_SELECTOR, "#tokens .tok")[trained]
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", token)
    ActionChains(browser).move_to_element(token).perform()
    tip = browser.find_element(By.ID, "tooltip")
    wait(browser, lambda d: tip.is_displayed(), message="the token's tooltip")
    assert f"id {recorded['token_ids'][trained]}" in tip.text and "sampler logprob" in tip.text
    assert "advantage" in tip.text and "trainer logprob" in tip.text
    save_screenshot(browser, "ui-trajectory")

    Select(browser.find_element(By.ID, "colour-mode")).select_by_value("drift")
    after = browser.execute_script(
        "return [...document.querySelectorAll('#tokens .tok')].map(t => getComputedStyle(t).backgroundColor)")
    assert after[0] == "rgb(248, 248, 248)"  # a prompt token: no logprobs to compare
    assert not set(after) & set(colours.values())

    # the policy-version colour: each sampled token by how many versions older than the sequence's
    # newest it is (an asynchronous run's stale tokens); this run's tokens are all of one version
    Select(browser.find_element(By.ID, "colour-mode")).select_by_value("version")
    by_version = browser.execute_script(
        "return [...document.querySelectorAll('#tokens .tok')].map(t => getComputedStyle(t).backgroundColor)")
    newest, none = "rgb(190, 215, 245)", "rgb(248, 248, 248)"
    assert [c for c, v in zip(by_version, recorded["policy_version"]) if v >= 0] == [newest] * sum(
        v >= 0 for v in recorded["policy_version"]) and by_version[0] == none
    assert "1 version older" in page_text(browser, "#legend")
    ages = browser.execute_script(
        "const s = {token_ids: [1, 2, 3, 4, 5], pieces: ['a', 'b', 'c', 'd', 'e'], segment: [0, 1, 1, 1, 1],"
        " loss_mask: [0, 1, 1, 1, 1], policy_version: [-1, 7, 6, 5, 2]};"
        "const box = tokenView(s, 'version'); document.body.append(box);"
        "const out = [...box.querySelectorAll('.tok')].map(t => getComputedStyle(t).backgroundColor);"
        "box.remove(); return out;")
    assert ages == [none, newest, "rgb(250, 215, 160)", "rgb(240, 165, 120)", "rgb(215, 120, 120)"]


def test_a_run_made_before_records_and_a_damaged_run_still_open(browser, served):
    browser.get(f"{served['base']}/?token={TOKEN}")
    browser.get(f"{served['base']}/#/run/old/t/eval/1/0")
    wait(browser, lambda d: d.find_elements(By.ID, "text"), message="the text-only view")
    assert "What is 3*4?" in browser.find_element(By.ID, "text").text
    browser.get(f"{served['base']}/#/run/broken")
    wait(browser, lambda d: "config.yaml" in page_text(d, "#main"), message="the damaged run's page")
    assert "metrics.jsonl" in page_text(browser, "#main")


def test_base_cold_start_and_rl_evals_are_one_series_in_order_marked_by_phase(browser, served):
    run = served["runs"] / "warmed"
    run.mkdir()
    rows = [{"step": 0, "eval/reward/accuracy": 0.1, "eval/tools/calls_per_trajectory": 1.0},
            {"step": 0, "cold_start/examples": 64, "cold_start/eval/reward/accuracy": 0.851,
             "cold_start/eval/tools/calls_per_trajectory": 1.9},
            {"step": 1, "reward/mean": 0.5, "warnings/no_tool_call": 1.0},
            {"step": 4, "eval/reward/accuracy": 0.88, "eval/tools/calls_per_trajectory": 2.0, "reward/mean": 0.6,
             "reward/errors": 2.0},
            {"step": 8, "eval/reward/accuracy": 0.912, "eval/tools/calls_per_trajectory": 2.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    browser.get(f"{served['base']}/?token={TOKEN}")
    browser.get(f"{served['base']}/#/run/warmed")
    traces = "return (document.querySelector(`[data-panel='${arguments[0]}']`) || {}).data || null"
    wait(browser, lambda d: d.execute_script(traces, "Held-out"), message="the held-out panel")
    held_out = browser.execute_script(traces, "Held-out")
    assert [t["name"] for t in held_out] == ["eval/reward/accuracy"]  # no lone cold-start dot
    (one,) = held_out
    assert one["x"] == [0, 0, 4, 8] and one["y"] == [0.1, 0.851, 0.88, 0.912]
    assert one["text"] == ["base model", "after the warm-up", "RL step 4", "RL step 8"]
    assert one["marker"]["symbol"] == ["circle-open", "star", "circle", "circle"]
    calls = browser.execute_script(traces, "Tool calls per trajectory")
    (evals,) = [t for t in calls if t["name"].startswith("eval/")]
    assert evals["y"] == [1.0, 1.9, 2.0, 2.0] and len(calls) == 1  # the training series has no points here
    # the run's warnings: listed as events, their steps marked on the curves
    events = [(e.get_attribute("data-step"), e.get_attribute("data-kind")) for e in
              browser.find_elements(By.CSS_SELECTOR, "#events li.event")]
    assert events == [("1", "no_tool_call"), ("4", "reward_errors")]
    assert "2 reward errors" in page_text(browser, "#events")
    shapes = browser.execute_script("return document.querySelector(\"[data-panel='Reward (training)']\").layout.shapes")
    assert sorted(shape["x0"] for shape in shapes) == [1, 4]
    shutil.rmtree(run)  # the other tests count the runs


def test_drift_colours_use_a_fixed_shown_scale_and_tooltips_show_small_drifts(browser, served):
    browser.get(f"{served['base']}/?token={TOKEN}")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "tr.run"), message="the runs list")
    shown = browser.execute_script(
        "const s = {token_ids: [1, 2, 3, 4], pieces: ['a', 'b', 'c', 'd'], segment: [0, 1, 1, 1],"
        " loss_mask: [0, 1, 1, 1], sampler_logprob: [null, -1.0, -1.0, -1.0],"
        " trainer_logprob: [null, -1.0 + 4e-5, -0.9375, -1.2]};"
        "const box = tokenView(s, 'drift'); document.body.append(box);"
        "const colours = [...box.querySelectorAll('.tok')].map(t => getComputedStyle(t).backgroundColor);"
        "box.querySelectorAll('.tok')[1].dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));"
        "const tip = document.getElementById('tooltip').textContent; box.remove();"
        "return [colours, tip, COLOUR_MODES.drift.legend.map(l => l[1]).join(' | ')];")
    colours, tip, legend = shown
    # a drift of 4e-5 nat is as good as none: white, not full blue; 0.0625 at 5/8; -0.2 past the scale: full red
    assert colours == ["rgb(248, 248, 248)", "rgb(255, 255, 255)", "rgb(139, 177, 239)", "rgb(220, 60, 60)"]
    assert "drift 4.00e-5" in tip and "-0.0000" not in tip
    assert "0.1 nat" in legend


def test_every_kind_opens_on_its_latest_step_and_same_sample_reads_as_it_is(browser, served):
    browser.get(f"{served['base']}/?token={TOKEN}")
    browser.get(f"{served['base']}/#/run/tiny")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "tr.trajectory-row"), message="the trajectory list")
    recorded = api(served, "/api/runs/tiny")["recorded"]
    assert browser.find_element(By.ID, "kind").get_attribute("value") == "eval"
    assert browser.find_element(By.ID, "step").get_attribute("value") == str(recorded["eval"][-1])
    Select(browser.find_element(By.ID, "kind")).select_by_value("train")
    assert browser.find_element(By.ID, "step").get_attribute("value") == str(recorded["train"][-1])
    sample = RunRecords(served["runs"] / "tiny").list("eval", 0)[0]["sample_id"]
    browser.get(f"{served['base']}/#/run/tiny/same/eval/{sample}")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#same-sample-columns > div"), message="the columns")
    assert page_text(browser, "h1") == f"{sample} at every evaluation"
    headings = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "#same-sample-columns h3")]
    assert headings[0].startswith("base model") and headings[1].startswith("step 1")
    shared = browser.find_element(By.ID, "shared-prompt")  # once, folded, above the columns
    assert shared.tag_name == "details" and shared.get_attribute("open") is None
    assert not browser.find_elements(By.CSS_SELECTOR, "#same-sample-columns .msg.system")


def test_long_unbroken_text_wraps_tool_names_do_not_and_the_console_shows_its_tail(browser, served):
    from rlfactory_core.records import write_records

    run = served["runs"] / "wide"
    long_answer, huge_result = "y" * 400, "z" * 5_000_000
    record = {"step": 1, "kind": "eval", "index": 0, "sample_id": "q0", "group": -1, "reward": 0.0,
              "final_answer": long_answer, "stop_reason": "no_tool_call",
              "messages": [{"role": "user", "content": "Question: " + "w" * 300},
                           {"role": "assistant", "content": "<search>x</search>", "turn": 0},
                           {"role": "tool", "content": huge_result}],
              "tool_calls": [{"turn": 0, "name": "search", "arguments": '{"query": "x"}', "result": huge_result}]}
    write_records(run, "eval", 1, [record])
    (run / "config.yaml").write_text("env: arithmetic\n")
    (run / "log.txt").write_text("start\n" + "".join(f"train {p}%\r" for p in range(100)) + "train 100%\nend\n")
    try:
        browser.get(f"{served['base']}/?token={TOKEN}")
        browser.get(f"{served['base']}/#/run/wide/t/eval/1/0")
        wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#conversation .msg"), message="the trajectory")
        fits = "return document.documentElement.scrollWidth <= document.documentElement.clientWidth"
        assert browser.execute_script(fits), "an unbroken string made the page scroll sideways"
        lines = browser.execute_script(  # the tool's name on one line, not "searc/h"
            "const td = [...document.querySelectorAll('td')].find(t => t.textContent === 'search');"
            "td.closest('table').style.width = '30px';"  # as narrow as a phone's column
            "const r = document.createRange(); r.selectNodeContents(td); return r.getClientRects().length")
        assert lines == 1
        browser.find_element(By.XPATH, "//button[starts-with(., 'show all 5,000,000')]").click()
        height = browser.execute_script(
            "const b = [...document.querySelectorAll('.msg.tool .body')].pop();"
            "return [b.textContent.length, b.getBoundingClientRect().height]")
        assert height[0] == 5_000_000 and height[1] > 1000  # wrapped lines, not one blank line
        assert browser.execute_script(fits)
        browser.get(f"{served['base']}/#/run/wide")
        wait(browser, lambda d: d.find_elements(By.ID, "console"), message="the run page")
        config, table = browser.execute_script(
            "return [document.getElementById('config').closest('details').getBoundingClientRect().top,"
            " document.getElementById('trajectories').getBoundingClientRect().top]")
        assert config < table  # config and console above the trajectory list, not under 200 rows
        browser.execute_script("document.getElementById('console').closest('details').open = true")
        wait(browser, lambda d: "end" in page_text(d, "#console"), message="the console")
        assert page_text(browser, "#console").endswith("start\ntrain 100%\nend")  # one line per update folded
        at_bottom = browser.execute_script(
            "const c = document.getElementById('console'); return c.scrollTop + c.clientHeight >= c.scrollHeight - 2")
        assert at_bottom
    finally:
        shutil.rmtree(run)


TOKENS_SCRIPT = """
const n = arguments[0];
const s = {token_ids: [], pieces: [], segment: [], turn: [], loss_mask: [], sampler_logprob: [], trainer_logprob: [],
           advantage: [], policy_version: []};
for (let i = 0; i < n; i++) {
  const model = i >= 2000;
  s.token_ids.push(i % 50000); s.pieces.push(i % 17 === 0 ? "\\n" : ` t${i}`); s.segment.push(model ? 1 : 0);
  s.turn.push(model ? 0 : -1); s.loss_mask.push(model ? 1 : 0); s.sampler_logprob.push(model ? -0.5 : null);
  s.trainer_logprob.push(model ? -0.5 + (i % 7) * 1e-3 : null); s.advantage.push(model ? (i % 3) - 1 : null);
  s.policy_version.push(model ? 3 : -1);
}
s.pieces[n - 1] = " the-last-token";
window.bigView = tokenView(s, "mask");
document.getElementById("main").replaceChildren(window.bigView);
return document.querySelectorAll("#tokens .tok").length;
"""


def test_a_trajectory_of_a_million_tokens_opens_recolours_and_scrolls_to_its_last_token(browser, served):
    browser.get(f"{served['base']}/?token={TOKEN}")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "tr.run"), message="the runs list")
    n = 1_000_000
    drawn = browser.execute_script(TOKENS_SCRIPT, n)
    assert 0 < drawn < 20_000  # what is near the view, not a million spans
    first_model = browser.execute_script("return Number(document.querySelector('#tokens .tok.seg-1').dataset.i)")
    assert first_model == 2000
    browser.execute_script("setColourMode(window.bigView, 'advantage')")  # recolours what is drawn, and later chunks
    colours = browser.execute_script("return [...document.querySelectorAll('#tokens .tok.seg-1')].slice(0, 3)"
                                     ".map(t => getComputedStyle(t).backgroundColor)")
    assert colours == ["rgb(70, 130, 230)", "rgb(220, 60, 60)", "rgb(255, 255, 255)"]  # advantage +1, -1, 0 (i = 2000..)
    for _ in range(200):  # scroll to the end: every chunk on the way is drawn when it comes near
        browser.execute_script("const b = document.getElementById('tokens'); b.scrollTop = b.scrollHeight;")
        last = browser.execute_script("const t = document.querySelector(`#tokens .tok[data-i='${arguments[0]}']`);"
                                      "return t ? [t.textContent, getComputedStyle(t).backgroundColor] : null", n - 1)
        if last:
            break
        time.sleep(0.05)
    assert last == [" the-last-token", "rgb(220, 60, 60)"]  # drawn after the switch: in its colour mode too


def test_the_views_state_is_in_the_url_back_reload_and_links_restore_it(browser, served):
    base = served["base"]
    browser.get(f"{base}/?token={TOKEN}")
    browser.get(f"{base}/#/run/tiny")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "tr.trajectory-row"), message="the trajectory list")
    Select(browser.find_element(By.ID, "kind")).select_by_value("train")
    Select(browser.find_element(By.ID, "step")).select_by_value("1")
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr.trajectory-row")) == 4, message="step 1's rows")
    Select(browser.find_element(By.ID, "outcome")).select_by_value("policy")
    wait(browser, lambda d: "outcome=policy" in d.current_url, message="the filters in the URL")
    assert "kind=train" in browser.current_url and "step=1" in browser.current_url
    listed = browser.current_url
    # "export these" downloads the list as filtered: every row of it, each whole
    exported = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(document.getElementById('export-trajectories').href).then(r => r.text())"
        ".then(t => done(t.trim().split('\\n').map(l => JSON.parse(l))))")
    shown = [int(r.get_attribute("data-index")) for r in browser.find_elements(By.CSS_SELECTOR, "tr.trajectory-row")]
    assert [t["index"] for t in exported] == shown and all(t["kind"] == "train" and t["step"] == 1 for t in exported)

    def restored(d):
        return (d.find_elements(By.CSS_SELECTOR, "tr.trajectory-row")
                and d.find_element(By.ID, "kind").get_attribute("value") == "train"
                and d.find_element(By.ID, "step").get_attribute("value") == "1"
                and d.find_element(By.ID, "outcome").get_attribute("value") == "policy")

    # rows are links: a new tab (or a copied link) opens the trajectory
    link = browser.find_element(By.CSS_SELECTOR, "tr.trajectory-row a")
    assert "#/run/tiny/t/train/1/" in link.get_attribute("href")
    link.click()
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#tokens .tok"), message="the trajectory")
    browser.back()  # Back: the same kind, step and filters
    wait(browser, restored, message="the list as it was, after Back")
    assert browser.current_url == listed
    browser.forward()  # Forward: the trajectory again, then Back to the list as it was
    wait(browser, lambda d: "/t/train/1/" in d.current_url and d.find_elements(By.CSS_SELECTOR, "#tokens .tok"),
         message="the trajectory, after Forward")
    browser.back()
    wait(browser, restored, message="the list as it was, after Forward and Back")
    browser.refresh()  # a reload, or the link pasted elsewhere
    wait(browser, restored, message="the list as it was, after a reload")
    # the page of the list is in the URL too: a link with an offset opens there
    rows = "return [...document.querySelectorAll('tr.trajectory-row')].map(r => r.dataset.step + '/' + r.dataset.index)"
    browser.get(f"{base}/#/run/tiny?kind=eval&step=all")
    wait(browser, lambda d: len(d.execute_script(rows)) > 4, message="every eval step's rows")
    whole = browser.execute_script(rows)
    browser.get(f"{base}/#/run/tiny?kind=eval&step=all&offset=2")
    wait(browser, lambda d: d.execute_script(rows) == whole[2:], message="the list from its third row")
    browser.get(f"{base}/#/?compare=tiny,old&metric=eval%2Freward%2Faccuracy")
    wait(browser, lambda d: d.execute_script("const c = document.querySelector('#compare-plot .plot');"
                                             "return c && c.data && c.data.length === 2"),
         message="the comparison from its link")
    assert browser.find_element(By.ID, "compare-metric").get_attribute("value") == "eval/reward/accuracy"
    # a run or a step that is not there: a message, not a blank page
    browser.get(f"{base}/#/run/no-such-run")
    wait(browser, lambda d: "no-such-run" in page_text(d, "#main") and page_text(d, "#main .error"),
         message="the unknown run's message")
    browser.get(f"{base}/#/run/tiny/t/eval/99/0")
    wait(browser, lambda d: page_text(d, "#main .error"), message="the unknown step's message")


def test_search_finds_text_only_one_tool_result_holds_and_opens_it_marked(browser, served):
    from rlfactory_core.records import write_records

    run = served["runs"] / "searched"
    base = {"kind": "eval", "group": -1, "reward": 0.0, "stop_reason": "no_tool_call", "step": 2}
    padding = "x " * 15_000  # the match lies past the 20,000 characters a long text first shows
    write_records(run, "eval", 2, [
        {**base, "index": i, "sample_id": f"q{i}", "final_answer": "Nairobi",
         "messages": [{"role": "user", "content": "What is the capital of Kenya?"},
                      {"role": "assistant", "content": "<search>Kenya capital</search>", "turn": 0},
                      {"role": "tool", "content": padding + ("Only-Here-7 " if i == 2 else "") + "Nairobi"}],
         "tool_calls": [{"name": "search", "arguments": '{"query": "Kenya capital"}', "turn": 0,
                         "result": padding + ("Only-Here-7 " if i == 2 else "") + "Nairobi"}]}
        for i in range(4)])
    try:
        browser.get(f"{served['base']}/?token={TOKEN}")
        browser.get(f"{served['base']}/#/run/searched")
        wait(browser, lambda d: d.find_elements(By.ID, "search"), message="the search box")
        box = browser.find_element(By.ID, "search")
        box.send_keys("only-here-7\n")
        wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#search-results li.hit"), message="the hits")
        hits = browser.find_elements(By.CSS_SELECTOR, "#search-results li.hit")
        assert [h.find_element(By.TAG_NAME, "mark").text for h in hits] == ["Only-Here-7", "Only-Here-7"]
        assert all("trajectory 2" in h.text for h in hits) and "tool call 0 (search) result" in hits[1].text
        hits[1].find_element(By.TAG_NAME, "a").click()
        wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "mark.found"), message="the trajectory, marked")
        marks = browser.find_elements(By.CSS_SELECTOR, "mark.found")
        assert {m.text for m in marks} == {"Only-Here-7"} and len(marks) >= 2  # the message and the tool call
        assert browser.execute_script(  # scrolled to the first
            "const r = document.querySelector('mark.found').getBoundingClientRect();"
            "return r.top >= 0 && r.bottom <= window.innerHeight")
    finally:
        shutil.rmtree(run)


def test_a_trajectory_of_two_sequences_is_filtered_by_them_and_found_in_its_second(browser, served,
                                                                                   default_model_dir):
    from ui_runs import write_two_sequence_run

    run = write_two_sequence_run(served["runs"] / "followed-up", default_model_dir)
    try:
        browser.get(f"{served['base']}/?token={TOKEN}")
        browser.get(f"{served['base']}/#/run/followed-up")
        wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr.trajectory-row")) == 3, message="3 rows")
        assert "2 · 2 sequences" in page_text(browser, "tr.trajectory-row[data-index='1']")  # its 2 turns
        Select(browser.find_element(By.ID, "sequence-count")).select_by_value("2")
        wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr.trajectory-row")) == 1, message="q1 alone")
        assert "sequences=2" in browser.current_url and "sequences=2" in browser.find_element(
            By.ID, "export-trajectories").get_attribute("href")
        box = browser.find_element(By.ID, "search")
        box.send_keys("zebra\n")
        wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#search-results li.hit"), message="the hit")
        assert "sequence 2 of 2" in page_text(browser, "#search-results li.hit")
        browser.find_element(By.CSS_SELECTOR, "#search-results li.hit a").click()
        wait(browser, lambda d: "sequence 2 of 2" in page_text(d, "body"), message="the token view's second sequence")
    finally:
        shutil.rmtree(run)


def test_columns_sort_rows_answer_the_keyboard_and_the_page_follows_a_dark_system_setting(browser, served):
    browser.get(f"{served['base']}/?token={TOKEN}")
    browser.get(f"{served['base']}/#/run/tiny?kind=eval&step=all")
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr.trajectory-row")) > 4, message="every step's rows")
    header = browser.find_element(By.CSS_SELECTOR, "th.sortable[data-sort='step']")
    header.click()  # ascending
    header = browser.find_element(By.CSS_SELECTOR, "th.sortable[data-sort='step']")
    header.click()  # descending
    order = "return [...document.querySelectorAll('tr.trajectory-row')].map(r => r.dataset.step + '/' + r.dataset.index)"
    wait(browser, lambda d: "order=desc" in d.current_url and [int(x.split("/")[0]) for x in d.execute_script(order)]
         == sorted((int(x.split("/")[0]) for x in d.execute_script(order)), reverse=True), message="the rows sorted")
    shown = browser.execute_script(order)
    assert int(shown[0].split("/")[0]) > int(shown[-1].split("/")[0])
    # the plots' toolbars are out of the Tab order, so Tab reaches the filters without them
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".plot .modebar-btn"), message="the plots' toolbars")
    assert browser.execute_script("const b = [...document.querySelectorAll('.plot .modebar-btn, .plot a')];"
                                  "return b.length > 0 && b.every(e => e.tabIndex === -1)")
    # the keyboard: rows take the focus, j and k move it, Enter opens the row
    browser.execute_script("document.querySelector('tr.trajectory-row').focus()")
    focused = "return document.activeElement.dataset.step + '/' + document.activeElement.dataset.index"
    for key in ("j", "j", "k"):
        browser.switch_to.active_element.send_keys(key)
    assert browser.execute_script(focused) == shown[1]
    browser.switch_to.active_element.send_keys("\n")
    wait(browser, lambda d: "/t/eval/" in d.current_url, message="Enter opening the focused row")
    assert browser.current_url.split("/t/eval/")[1].split("?")[0] == shown[1]
    # a dark system setting: the page in dark colours, its plots too
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
    try:
        browser.get(f"{served['base']}/#/run/tiny")
        wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".plot .main-svg"), message="the plots")
        background = browser.execute_script("return getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(13, 17, 23)"
        assert browser.execute_script("return document.querySelector('.plot').data !== undefined")
    finally:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})


def test_the_runs_list_finds_tags_and_deletes_runs_asking_first(browser, served):
    shutil.copytree(served["runs"] / "old", served["runs"] / "spare", symlinks=True)
    browser.get(f"{served['base']}/?token={TOKEN}")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "tr.run[data-run='spare']"), message="the runs list")
    row = "tr.run[data-run='spare']"
    browser.find_element(By.CSS_SELECTOR, f"{row} button.edit-tags").click()
    browser.switch_to.alert.send_keys("to-delete, sweep 3")
    browser.switch_to.alert.accept()
    wait(browser, lambda d: [t.text for t in d.find_elements(By.CSS_SELECTOR, f"{row} .tag")] == ["to-delete", "sweep 3"],
         message="the tags")
    browser.find_element(By.ID, "run-search").send_keys("sweep")
    wait(browser, lambda d: [r.get_attribute("data-run") for r in d.find_elements(By.CSS_SELECTOR, "tr.run")] == ["spare"],
         message="the runs the words find")
    assert "find=sweep" in browser.current_url
    browser.find_element(By.CSS_SELECTOR, f"{row} button.delete").click()
    browser.switch_to.alert.dismiss()  # asked first: no, keep it
    time.sleep(0.5)
    assert (served["runs"] / "spare").is_dir()
    browser.find_element(By.CSS_SELECTOR, f"{row} button.delete").click()
    assert "spare" in browser.switch_to.alert.text
    browser.switch_to.alert.accept()
    wait(browser, lambda d: not (served["runs"] / "spare").exists() and not d.find_elements(By.CSS_SELECTOR, row),
         message="the run deleted")
    browser.find_element(By.ID, "run-search").clear()


def test_plots_smooth_take_a_log_axis_or_wall_time_and_compare_any_metrics_at_once(browser, served):
    browser.get(f"{served['base']}/?token={TOKEN}")
    browser.get(f"{served['base']}/#/run/tiny")
    panel = "return (document.querySelector(\"[data-panel='Reward (training)']\") || {}).data || null"
    wait(browser, lambda d: d.execute_script(panel), message="the training reward panel")
    raw = api(served, "/api/runs/tiny/metrics")["series"]
    values = [v for _, v in raw["reward/mean"]]
    browser.execute_script("const s = document.getElementById('smoothing'); s.value = 0.5;"
                           "s.dispatchEvent(new Event('input'))")
    expected, last = [], None
    for v in values:  # the exponential moving average, weight 0.5
        last = v if last is None else last * 0.5 + v * 0.5
        expected.append(last)
    wait(browser, lambda d: [round(y, 9) for y in d.execute_script(panel)[0]["y"]] == [round(y, 9) for y in expected],
         message="the smoothed curve")
    browser.find_element(By.ID, "log-y").click()
    Select(browser.find_element(By.ID, "x-axis")).select_by_value("time")
    layout = "return document.querySelector(\"[data-panel='Reward (training)']\").layout"
    wait(browser, lambda d: d.execute_script(layout)["yaxis"]["type"] == "log", message="the log axis")
    xs = browser.execute_script(panel)[0]["x"]
    assert xs == sorted(xs) and 0 <= xs[0] and xs[-1] < 60  # minutes since the run's first record
    browser.execute_script("for (const id of ['smoothing']) { const s = document.getElementById(id); s.value = 0;"
                           " s.dispatchEvent(new Event('input')); }")
    browser.find_element(By.ID, "log-y").click()
    Select(browser.find_element(By.ID, "x-axis")).select_by_value("step")
    # the comparison: any metric the runs logged, several at once
    browser.get(f"{served['base']}/#/?compare=tiny,old&metric=eval%2Freward%2Faccuracy,reward%2Fmean")
    charts = "return [...document.querySelectorAll('#compare-plot .plot')].map(p => [p.dataset.metric, (p.data || []).length])"
    wait(browser, lambda d: d.execute_script(charts) == [["eval/reward/accuracy", 2], ["reward/mean", 2]],
         message="two comparisons")
    offered = [o.get_attribute("value") for o in browser.find_elements(By.CSS_SELECTOR, "#compare-metric option")]
    assert "train/loss" in offered or any(k.startswith("train/") for k in offered)  # not a fixed list of 8


def test_a_trajectory_leads_to_its_neighbours_and_its_group_where_two_members_diff(browser, served):
    rows = RunRecords(served["runs"] / "tiny").list("train", 1)
    first = min(rows, key=lambda r: r["index"])
    browser.get(f"{served['base']}/?token={TOKEN}")
    browser.get(f"{served['base']}/#/run/tiny/t/train/1/{first['index']}")
    wait(browser, lambda d: d.find_elements(By.ID, "its-group"), message="the trajectory's links")
    assert not browser.find_elements(By.ID, "previous-trajectory")  # the first has none
    assert browser.find_element(By.ID, "next-trajectory").get_attribute("href").endswith(
        f"/t/train/1/{sorted(r['index'] for r in rows)[1]}")
    browser.find_element(By.ID, "its-group").click()
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#group-columns > div")) >= 2, message="the group")
    members = browser.find_elements(By.CSS_SELECTOR, "#group-columns > div")
    assert [int(m.get_attribute("data-index")) for m in members] == sorted(
        r["index"] for r in rows if r["group"] == first["group"])
    assert "advantage" in members[0].text and browser.find_element(By.ID, "shared-prompt")
    assert first["outcome"] and "outcome" in members[0].text and first["outcome"] in members[0].text
    # previous and next group: the step's groups in order, the ends not links
    groups = sorted({r["group"] for r in rows if r["group"] >= 0})
    at = groups.index(first["group"])
    for link_id, target in (("previous-group", at - 1), ("next-group", at + 1)):
        if 0 <= target < len(groups):
            href = browser.find_element(By.ID, link_id).get_attribute("href")
            assert href.endswith(f"#/run/tiny/group/train/1/{groups[target]}"), (link_id, href)
        else:
            assert not browser.find_elements(By.ID, link_id), link_id
    members = browser.find_elements(By.CSS_SELECTOR, "#group-columns > div")
    for member in members[:2]:
        member.find_element(By.CSS_SELECTOR, "input[type=checkbox]").click()
    browser.find_element(By.ID, "diff-button").click()
    wait(browser, lambda d: d.find_elements(By.ID, "token-diff"), message="the diff")
    assert "tokens are the same" in browser.find_element(By.ID, "token-diff").text
    assert browser.find_elements(By.CSS_SELECTOR, "#text-diff > div")
    assert len(groups) >= 2  # the tiny run records two groups a step: next group leads to the other
    other = groups[1] if at == 0 else groups[0]
    browser.find_element(By.ID, "next-group" if at == 0 else "previous-group").click()
    wanted = sorted(r["index"] for r in rows if r["group"] == other)
    wait(browser, lambda d: [int(m.get_attribute("data-index")) for m in
                             d.find_elements(By.CSS_SELECTOR, "#group-columns > div")] == wanted, message="the other group")


def click_when_enabled(driver, button_id):
    """Click the button once it is enabled, in one step: the run page redraws its buttons every
    few seconds, so a found element can go stale before a later click."""
    return driver.execute_script("const b = document.getElementById(arguments[0]);"
                                 "if (b && !b.disabled) { b.click(); return true; } return false;", button_id)


def _set(driver, key, value):
    driver.execute_script(
        "const el = document.querySelector(`[data-key='${arguments[0]}']`);"
        "if (el.type === 'checkbox') el.checked = arguments[1]; else el.value = arguments[1];"
        "el.dispatchEvent(new Event('change', {bubbles: true}));", key, value)


def test_a_bad_config_shows_every_error_beside_its_field(browser, served):
    browser.get(f"{served['base']}/?token={TOKEN}")
    browser.get(f"{served['base']}/#/new")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-key='train.steps']"), message="the form")
    # a field's errors and a check across settings (its field in a collapsed section), in one pass
    for key, value in (("train.steps", "-1"), ("train.lr", "fast"), ("grpo.group_size", "0"),
                       ("rollout.sampling.temperature", "-2"), ("rollout.max_trajectory_tokens", "8")):
        _set(browser, key, value)
    browser.find_element(By.ID, "validate").click()
    errors = {}

    def shown(d):
        errors.update({el.get_attribute("data-error-for"): el.text
                       for el in d.find_elements(By.CSS_SELECTOR, ".field-error") if el.text})
        return len(errors) >= 5

    wait(browser, shown, message="the inline errors")
    assert set(errors) == {"train.steps", "train.lr", "grpo.group_size", "rollout.sampling.temperature",
                           "rollout.max_trajectory_tokens"}
    assert "at least rollout.max_tokens_per_turn" in errors["rollout.max_trajectory_tokens"]
    assert browser.execute_script("return document.querySelector(\"[data-key='rollout.max_trajectory_tokens']\")"
                                  ".closest('details').open")  # its section opened to show it
    assert not page_text(browser, "#form-errors")  # nothing left at the top, away from its field
    assert "greater than" in errors["train.steps"] and "number" in errors["train.lr"]
    assert browser.find_element(By.CSS_SELECTOR, "[data-key='train.lr']").get_attribute("class") == "invalid"
    save_screenshot(browser, "ui-new-run-errors")


def controls(driver):
    """The run page's state badge, buttons and message, read in one step."""
    return driver.execute_script(
        "const q = s => document.querySelector(s);"
        "return {state: q('h1 .state') ? q('h1 .state').innerText : '', stop: q('#stop') ? !q('#stop').disabled : null,"
        " resume: q('#resume') ? !q('#resume').disabled : null, message: q('#run-message') ? q('#run-message').innerText : '',"
        " errors: q('#main .errors') ? q('#main .errors').innerText : ''}")


def watch_until(driver, done, check, seconds, message):
    """Poll the run page until ``done(controls)``, asserting ``check(controls)`` at every poll
    before it (what the page shows in between, across its 3-second refreshes)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        shown = controls(driver)
        if done(shown):
            return shown
        assert check(shown), shown
        time.sleep(0.2)
    raise AssertionError(f"{message}: still {controls(driver)}")


def test_a_run_launched_from_the_form_reaches_step_1_live_stop_checkpoints_it_and_resume_continues_it(
        browser, served, tiny_model_dir):
    browser.get(f"{served['base']}/?token={TOKEN}")  # each test signs in: it may run alone
    browser.get(f"{served['base']}/#/new")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-key='train.steps']"), message="the form")
    settings = {"model.name": str(tiny_model_dir), "backend": "hf", "train.steps": "500", "grpo.prompts_per_step": "2",
                "grpo.group_size": "2", "data.eval_size": "4", "eval.every": "0", "checkpoint.every": "400",
                "rollout.max_turns": "2", "rollout.max_tokens_per_turn": "24", "logging.live": "off",
                "logging.tensorboard": False}
    for key, value in settings.items():
        _set(browser, key, value)
    save_screenshot(browser, "ui-new-run")
    browser.find_element(By.ID, "launch").click()
    wait(browser, lambda d: d.current_url.split("#")[-1].startswith("/run/arithmetic-"), message="the new run's page")
    name = browser.current_url.split("#/run/")[-1]
    # from the moment of launch it is starting, not "unknown" with missing files as errors
    watch_until(browser, lambda c: c["state"] == "running", lambda c: c["state"] in ("", "starting") and not c["errors"]
                and c["resume"] is not True, LAUNCH_S, "the launched run's start")

    def step_shown(d):
        match = re.search(r"step\s+(\d+) / 500", page_text(d, "#main"))
        return match and int(match.group(1)) >= 1

    try:
        wait(browser, step_shown, LAUNCH_S, "step 1 on the live page")
    finally:
        print((served["runs"] / name / "console.txt").read_text()[-3000:])
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".plot .main-svg"), message="its live plots")
    save_screenshot(browser, "ui-run-live")

    wait(browser, lambda d: click_when_enabled(d, "stop"), message="the stop button")
    # until it has stopped: it says so, across refreshes, and Stop is not offered again
    watch_until(browser, lambda c: c["state"] == "interrupted",
                lambda c: c["state"] in ("running", "stopping") and ("stop sent" in c["message"] or c["message"] ==
                                                                   "sending stop…") and c["stop"] is False
                and c["resume"] is False, LAUNCH_S, "the stopped run's state")
    status = api(served, f"/api/runs/{name}")
    assert status["state"] == "interrupted" and "saved" in status["message"]
    checkpoints = sorted(p.name for p in (served["runs"] / name / "checkpoints").iterdir())
    assert checkpoints and checkpoints[-1].startswith("step-")
    saved = int(checkpoints[-1].split("-")[1])

    # Resume continues it from that checkpoint (rlf train --resume), live again
    wait(browser, lambda d: click_when_enabled(d, "resume"), message="the resume button")
    watch_until(browser, lambda c: c["state"] == "running",
                lambda c: c["state"] in ("interrupted", "starting") and "saved" not in c["message"]
                and c["resume"] is False, LAUNCH_S, "the resumed run's start")

    def past_saved(d):
        match = re.search(r"step\s+(\d+) / 500", page_text(d, "#main"))
        return page_text(d, "h1 .state") == "running" and match and int(match.group(1)) > saved

    wait(browser, past_saved, LAUNCH_S, "the resumed run's next step")
    wait(browser, lambda d: click_when_enabled(d, "stop"), message="the stop button")
    wait(browser, lambda d: page_text(d, "h1 .state") == "interrupted", LAUNCH_S,
         "the resumed run stopped again")
    # a finished run and a run with no checkpoint offer no Resume, and say why for as long as they are shown
    for run, why in (("tiny", "finished"), ("killed", "no checkpoint to resume from")):
        browser.get(f"{served['base']}/#/run/{run}")
        wait(browser, lambda d: controls(d)["resume"] is not None, message=f"{run}'s page")
        time.sleep(3.5)  # a refresh
        shown = controls(browser)
        assert shown["resume"] is False and shown["stop"] is False and why in shown["message"], (run, shown)
