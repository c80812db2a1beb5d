"""The `rlf ui` API over a real run directory (a short training run with a tiny model), through
the real app and its access guard: runs and their states, metrics, recorded trajectories and
their filters, pre-records runs, damaged files, traversal attempts, and the new-run form."""

import gzip
import json
import os
import shutil
import socket
import time

import pytest
from fastapi.testclient import TestClient

from rlfactory_cli.ui.app import create_app
from rlfactory_core.records import RunRecords


TOKEN = "test-token-0123456789abcdef"
PORT = 8765


@pytest.fixture(scope="module")
def runs_dir(ui_runs_dir, tmp_path_factory):
    copy = tmp_path_factory.mktemp("ui-api") / "runs"
    shutil.copytree(ui_runs_dir, copy, symlinks=True)
    return copy


@pytest.fixture(scope="module")
def client(runs_dir):
    app = create_app(runs_dir, token=TOKEN, port=PORT)
    with TestClient(app, base_url=f"http://127.0.0.1:{PORT}", headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c


def test_the_runs_list_says_how_each_run_stands(client):
    runs = {r["name"]: r for r in client.get("/api/runs").json()["runs"]}
    assert set(runs) == {"tiny", "old", "broken", "killed"}
    tiny = runs["tiny"]
    assert tiny["state"] == "finished" and tiny["step"] == 2 and tiny["steps"] == 2 and tiny["env"] == "arithmetic"
    assert tiny["held_out"]["key"] == "eval/reward/accuracy" and tiny["held_out"]["step"] == 2
    assert runs["killed"]["state"] == "died" and "heartbeat" in runs["killed"]["message"]  # not "running" forever
    assert runs["old"]["state"] == "finished" and runs["old"]["held_out"]["value"] == 0.5
    broken = runs["broken"]
    assert broken["state"] == "unknown" and "config.yaml" in broken["errors"] and "metrics.jsonl" in broken["errors"]
    assert broken["step"] == 1  # the records around the damaged line still count


def test_a_run_page_has_its_metrics_config_plugins_and_records(client):
    run = client.get("/api/runs/tiny").json()
    assert run["recorded"] == {"train": [1, 2], "eval": [0, 1, 2]}
    assert "arithmetic" in run["config_text"] and run["plugins"]
    series = client.get("/api/runs/tiny/metrics").json()["series"]
    for key in ("reward/mean", "eval/reward/accuracy", "train/entropy", "train/clip_fraction",
                "train/sampler_logprob_diff", "time/rollout", "time/train", "tools/calls_per_trajectory"):
        assert key in series, key
    assert [step for step, _ in series["reward/mean"]] == [1, 2]
    broken = client.get("/api/runs/broken/metrics")  # one damaged line: the rest still plotted
    assert broken.status_code == 200 and broken.json()["errors"]["metrics.jsonl"] == "line(s) 2 not JSON objects: skipped"


def test_trajectories_list_filter_and_open_token_by_token(client, runs_dir):
    listed = client.get("/api/runs/tiny/trajectories", params={"kind": "train", "step": 1}).json()
    assert listed["total"] == 4 and {r["group"] for r in listed["rows"]} == {0, 1}
    everything = client.get("/api/runs/tiny/trajectories", params={"kind": "eval"}).json()
    assert everything["total"] == 12 and everything["steps"] == [0, 1, 2]
    reason = everything["rows"][0]["stop_reason"]
    only = client.get("/api/runs/tiny/trajectories", params={"kind": "eval", "stop_reason": reason}).json()
    assert only["total"] == sum(r["stop_reason"] == reason for r in everything["rows"])
    assert client.get("/api/runs/tiny/trajectories", params={"kind": "eval", "min_reward": 5}).json()["total"] == 0
    sample = everything["rows"][0]["sample_id"]
    by_id = client.get("/api/runs/tiny/trajectories", params={"kind": "eval", "sample_id": sample}).json()
    assert by_id["total"] == 3  # the same question at steps 0, 1 and 2

    record = client.get("/api/runs/tiny/trajectories/train/1/0").json()
    expected = RunRecords(runs_dir / "tiny").trajectory("train", 1, 0)
    assert record["sequences"][0]["loss_mask"] == expected["sequences"][0]["loss_mask"]
    assert record["sequences"][0]["token_ids"] == expected["sequences"][0]["token_ids"]
    same = client.get("/api/runs/tiny/same-sample", params={"kind": "eval", "sample_id": sample}).json()
    assert [t["step"] for t in same["trajectories"]] == [0, 1, 2]


def test_the_records_of_an_eval_split_list_and_open(client, runs_dir):
    """eval.splits records each split as kind eval-<split> (and cold_start_eval-<split>)."""
    run = runs_dir / "splits"
    shutil.copytree(runs_dir / "tiny", run, symlinks=True)
    shutil.copytree(run / "trajectories" / "eval", run / "trajectories" / "eval-test_wordings")
    listed = client.get("/api/runs/splits/trajectories", params={"kind": "eval-test_wordings"}).json()
    assert listed["total"] == 12
    opened = client.get("/api/runs/splits/trajectories/eval-test_wordings/1/0").json()
    assert opened["sequences"][0]["token_ids"] == RunRecords(run).trajectory("eval", 1, 0)["sequences"][0]["token_ids"]
    for kind in ("eval-", "eval-../x", "training-x", "eval-a b"):
        assert client.get("/api/runs/splits/trajectories", params={"kind": kind}).status_code in (400, 404, 422)


def test_a_run_made_before_records_opens_as_text(client):
    assert client.get("/api/runs/old").json()["recorded"] == {"eval": [0, 1]}
    record = client.get("/api/runs/old/trajectories/eval/1/0").json()
    assert record["text_only"] and "What is 3*4?" in record["text"] and record["sample_id"] == "q7"


def test_a_damaged_file_is_an_error_for_that_part_only(client):
    listed = client.get("/api/runs/broken/trajectories", params={"kind": "eval"})
    assert listed.status_code == 200
    assert "not a readable trajectory record" in listed.json()["errors"]["eval step 1"]
    one = client.get("/api/runs/broken/trajectories/eval/1/0")
    assert one.status_code == 404 and "not a readable trajectory record" in one.json()["error"]
    assert client.get("/api/runs/broken").status_code == 200
    assert client.get("/api/runs/tiny/trajectories/eval/99/0").status_code == 404
    assert client.get("/api/runs/tiny/trajectories/bogus/1/0").status_code == 404


@pytest.mark.parametrize("path", ["/api/runs/..", "/api/runs/%2e%2e", "/api/runs/..%5c..%5cetc",
                                  "/api/runs/%2e%2e/metrics", "/api/runs/..%2F..%2Fetc%2Fpasswd",
                                  "/api/runs/%2Fetc/metrics", "/api/runs/tiny%2F..%2F..%2Fx/trajectories",
                                  "/api/runs/outside/metrics", "/api/runs/missing/metrics"])
def test_paths_never_leave_the_runs_directory(client, runs_dir, tmp_path_factory, path):
    outside = tmp_path_factory.mktemp("outside")
    (outside / "metrics.jsonl").write_text('{"step": 0, "secret": 1}\n')
    link = runs_dir / "outside"
    if not link.is_symlink():
        os.symlink(outside, link)
    response = client.get(path)
    assert response.status_code in (400, 404) and "secret" not in response.text


def test_every_request_needs_the_token_and_a_local_host(runs_dir, client):
    app = create_app(runs_dir, token=TOKEN, port=PORT)
    with TestClient(app, base_url=f"http://127.0.0.1:{PORT}") as bare:
        assert bare.get("/api/runs").status_code == 401
        assert bare.get("/").status_code == 401
        opened = bare.get(f"/?token={TOKEN}", headers={"Accept": "text/html"}, follow_redirects=False)
        assert opened.status_code == 303 and TOKEN not in opened.headers["location"]
        assert bare.get("/api/runs").status_code == 200  # the cookie it set
    assert client.get("/api/runs", headers={"Host": f"rebound.example:{PORT}"}).status_code == 400
    cross = client.post("/api/runs/tiny/stop", headers={"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
    assert cross.status_code == 403


def test_the_page_and_plotly_are_served_locally(client):
    page = client.get("/")
    assert page.status_code == 200 and "/vendor/plotly.min.js" in page.text and "http" not in page.text.split("<body>")[0]
    assert "default-src 'self'" in page.headers["content-security-policy"]
    js = client.get("/vendor/plotly.min.js", headers={"Accept-Encoding": "gzip"})
    assert js.status_code == 200 and js.headers["content-encoding"] == "gzip" and len(js.content) > 1_000_000
    assert b"plotly.js" in js.content[:500] or b"plotly" in gzip.compress(js.content[:100])
    for asset in ("/static/app.js", "/static/common.js", "/static/runs.js", "/static/run.js", "/static/trajectory.js",
                  "/static/app.css", "/static/new_run.js"):
        assert client.get(asset).status_code == 200, asset


def test_stop_and_resume_refuse_what_cannot_be_done(client):
    stopped = client.post("/api/runs/tiny/stop")
    assert stopped.status_code == 409 and "not running" in stopped.json()["error"]
    resumed = client.post("/api/runs/killed/resume")
    assert resumed.status_code == 409 and "checkpoint" in resumed.json()["error"]


def test_a_resume_waits_for_the_last_child_to_end_not_for_its_interpreter_to_exit(client, runs_dir):
    """This UI's last child for a run: while it has not written its end (starting, its
    status.json still the last process's; or training) a resume is refused; once it has written
    its end and let go of the run's lock, only its interpreter is exiting (seconds on a busy
    machine: the browser test's resume was refused so), and the resume starts."""
    import json
    import socket
    import subprocess
    import sys
    import time

    launcher = client.app.state.launcher
    run = runs_dir / "exiting"
    shutil.copytree(runs_dir / "tiny", run)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    launcher.children["exiting"] = child

    def status(state, pid):
        (run / "status.json").write_text(json.dumps({
            "version": 1, "state": state, "pid": pid, "host": socket.gethostname(), "started_at": time.time(),
            "updated_at": time.time(), "step": 2, "steps": 2, "message": ""}))

    resumed = None
    try:
        status("interrupted", os.getpid())  # the last process's end: the child has not started yet
        refused = client.post("/api/runs/exiting/resume")
        assert refused.json()["error"] == f"exiting was just launched (pid {child.pid}) and is starting"
        status("running", child.pid)
        refused = client.post("/api/runs/exiting/resume")
        assert refused.status_code == 409 and "stop it first" in refused.json()["error"]
        status("interrupted", child.pid)  # its end written, the lock let go; the process still there
        assert client.post("/api/runs/exiting/resume").json() == {"resumed": "exiting"}
        resumed = launcher.children["exiting"]
        assert resumed is not child and "--resume" in resumed.args
    finally:
        for process in (child, resumed):
            if process is not None:
                process.kill()
                process.wait()
        shutil.rmtree(run)


def test_a_failed_run_shows_its_reason_and_offers_resume_only_from_a_checkpoint(client, runs_dir):
    """A run that ended `failed` (failures.abort: one line naming the class) shows that line on
    its page; Resume is offered where a checkpoint was saved (`--resume` continues once the
    service is back) and refused, saying why, where none was."""
    reason = "tool_unavailable ended 0.75 of step 2's trajectories (over failures.abort_share 0.5)"
    made = []
    try:
        for name, saved in (("failed-saved", True), ("failed-early", False)):
            run = runs_dir / name
            shutil.copytree(runs_dir / "tiny", run)
            made.append(run)
            shutil.rmtree(run / "checkpoints", ignore_errors=True)
            if saved:
                (run / "checkpoints" / "step-000001").mkdir(parents=True)
            (run / "status.json").write_text(json.dumps({
                "version": 1, "state": "failed", "pid": os.getpid(), "host": socket.gethostname(),
                "started_at": time.time(), "updated_at": time.time(), "step": 1, "steps": 2, "message": reason}))
        saved_page = client.get("/api/runs/failed-saved").json()
        assert saved_page["state"] == "failed" and saved_page["message"] == reason
        assert saved_page["can_resume"] is True and saved_page["can_stop"] is False
        early = client.get("/api/runs/failed-early").json()
        assert early["state"] == "failed" and early["can_resume"] is False and early["can_stop"] is False
        assert early["message"] == f"{reason}; no checkpoint to resume from"
        refused = client.post("/api/runs/failed-early/resume")
        assert refused.status_code == 409 and "no checkpoint" in refused.json()["error"]
        listed = {r["name"]: r for r in client.get("/api/runs").json()["runs"]}
        assert listed["failed-saved"]["state"] == "failed"
    finally:
        for run in made:
            shutil.rmtree(run)


def test_stop_signals_only_the_process_that_holds_the_run(client, runs_dir):
    """A status.json naming a live process that is not the run's trainer (a reused pid, a
    process that only looks like `rlf train`): refused, nothing signalled."""
    import json
    import socket
    import subprocess
    import time

    impostor = subprocess.Popen(["bash", "-c", "sleep 60; :", "rlf", "train"])
    run = runs_dir / "impostor"
    run.mkdir()
    (run / "status.json").write_text(json.dumps({
        "version": 1, "state": "running", "pid": impostor.pid, "host": socket.gethostname(),
        "started_at": time.time(), "updated_at": time.time(), "step": 1, "steps": 5, "message": ""}))
    try:
        refused = client.post("/api/runs/impostor/stop")
        assert refused.status_code == 409 and "does not hold" in refused.json()["error"]
        assert impostor.poll() is None  # not signalled
        assert client.post("/api/runs/impostor/resume").status_code == 409  # it says running
    finally:
        impostor.kill()
        impostor.wait()
        import shutil

        shutil.rmtree(run)


def test_every_file_symlinked_out_of_the_runs_directory_is_refused_with_the_reason(ui_runs_dir, tmp_path_factory):
    """README: a file symlinked out of the runs directory is not read, whichever file it is,
    and the run page says why (before, metrics, plugins and trajectories were read and shown
    while config.yaml and log.txt were refused silently)."""
    outside = tmp_path_factory.mktemp("elsewhere")
    runs_dir = tmp_path_factory.mktemp("ui-links") / "runs"
    run = runs_dir / "linked"
    shutil.copytree(ui_runs_dir / "tiny", run, symlinks=True)
    (run / "log.txt").write_text("the run's own log\n")
    for name in ("metrics.jsonl", "plugins.yaml", "config.yaml", "log.txt"):
        shutil.copy(run / name, outside / name)
        (outside / name).write_text((outside / name).read_text() + "\n# secret-outside\n"
                                    if name.endswith(".yaml") or name == "log.txt" else (outside / name).read_text())
        (run / name).unlink()
        (run / name).symlink_to(outside / name)
    shutil.move(str(run / "trajectories"), str(outside / "trajectories"))
    (run / "trajectories").symlink_to(outside / "trajectories", target_is_directory=True)
    client = TestClient(create_app(runs_dir, token=TOKEN, port=PORT), base_url=f"http://127.0.0.1:{PORT}",
                        headers={"Authorization": f"Bearer {TOKEN}"})
    page = client.get("/api/runs/linked").json()
    refused = "a symlink out of the runs directory: not read"
    for name in ("config.yaml", "metrics.jsonl", "plugins.yaml", "trajectories"):
        assert page["errors"].get(name) == refused, (name, page["errors"])
    assert page["config"] is None and page["config_text"] is None and page["plugins"] is None
    assert page["recorded"] == {} and page["held_out"] is None
    metrics = client.get("/api/runs/linked/metrics").json()
    assert metrics["series"] == {} and metrics["errors"] == {"metrics.jsonl": refused}
    console = client.get("/api/runs/linked/console").json()
    assert console == {"log.txt": f"({refused})"}
    listed = client.get("/api/runs/linked/trajectories", params={"kind": "eval"}).json()
    assert listed["rows"] == [] and listed["errors"] == {"trajectories": refused}
    assert "secret-outside" not in str(page) + str(console)


def test_one_step_file_symlinked_out_is_refused_and_one_linked_inside_is_read(ui_runs_dir, tmp_path_factory):
    """A step's file is checked on its own (the directory holding it stays inside): one that
    leads out is refused by name, in the list and when opened; one linking to another file of
    the runs directory is read."""
    outside = tmp_path_factory.mktemp("elsewhere-step")
    runs_dir = tmp_path_factory.mktemp("ui-step-links") / "runs"
    run = runs_dir / "linked"
    shutil.copytree(ui_runs_dir / "tiny", run, symlinks=True)
    train = run / "trajectories" / "train"
    steps = sorted(train.glob("step-*.parquet"))
    assert len(steps) >= 2
    shutil.move(str(steps[0]), str(outside / steps[0].name))
    steps[0].symlink_to(outside / steps[0].name)
    shutil.copy(steps[1], run / "kept.parquet")
    steps[1].unlink()
    steps[1].symlink_to(run / "kept.parquet")
    out_step, in_step = (int(p.name[5:11]) for p in steps[:2])
    client = TestClient(create_app(runs_dir, token=TOKEN, port=PORT), base_url=f"http://127.0.0.1:{PORT}",
                        headers={"Authorization": f"Bearer {TOKEN}"})
    refused = "a symlink out of the runs directory: not read"
    page = client.get("/api/runs/linked").json()
    assert page["errors"].get(f"train step {out_step}") == refused
    assert out_step not in page["recorded"]["train"] and in_step in page["recorded"]["train"]
    listed = client.get("/api/runs/linked/trajectories", params={"kind": "train"}).json()
    assert {row["step"] for row in listed["rows"]} >= {in_step} and out_step not in {row["step"] for row in listed["rows"]}
    opened = client.get(f"/api/runs/linked/trajectories/train/{out_step}/0")
    assert opened.status_code >= 400 and refused in opened.text
    assert client.get(f"/api/runs/linked/trajectories/train/{in_step}/0").status_code == 200


def test_the_same_sample_view_has_every_evaluation_in_order_and_its_shared_prompt_once(ui_runs_dir, tmp_path_factory):
    runs_dir = tmp_path_factory.mktemp("ui-same") / "runs"
    shutil.copytree(ui_runs_dir / "tiny", runs_dir / "warm", symlinks=True)
    records = runs_dir / "warm" / "trajectories"
    (records / "cold_start_eval").mkdir()
    shutil.copy(records / "eval" / "step-000000.parquet", records / "cold_start_eval" / "step-000000.parquet")
    client = TestClient(create_app(runs_dir, token=TOKEN, port=PORT), base_url=f"http://127.0.0.1:{PORT}",
                        headers={"Authorization": f"Bearer {TOKEN}"})
    sample = RunRecords(runs_dir / "warm").list("eval", 1)[0]["sample_id"]
    same = client.get("/api/runs/warm/same-sample", params={"kind": "eval", "sample_id": sample}).json()
    shown = [(t["kind"], t["step"], t["phase"]) for t in same["trajectories"]]
    assert shown == [("eval", 0, "base model"), ("cold_start_eval", 0, "after the warm-up"),
                     ("eval", 1, "step 1"), ("eval", 2, "step 2")]
    assert same["title"] == f"{sample} at every evaluation"
    # the prompt every column shares (system, question) is sent once, not once per column
    base = next(r for r in RunRecords(runs_dir / "warm").list("eval", 0) if r["sample_id"] == sample)
    whole = RunRecords(runs_dir / "warm").trajectory("eval", 0, base["index"])["messages"]
    assert same["shared"] >= 1 and same["shared_messages"] == whole[:same["shared"]]
    assert same["trajectories"][0]["messages"] == whole[same["shared"]:]
    member = RunRecords(runs_dir / "warm").list("train", 1)[0]["sample_id"]
    group = client.get("/api/runs/warm/same-sample", params={"kind": "train", "sample_id": member}).json()
    steps = sorted({t["step"] for t in group["trajectories"]})
    assert steps and group["title"] == (f"{member} in train step {steps[0]}'s group" if len(steps) == 1
                                        else f"{member} across train steps")


def test_exports_are_the_records_the_pages_show(client, runs_dir):
    import csv
    import io
    import json as json_module

    from rlfactory_core.metrics import read_metrics

    # metrics: one CSV row per record of metrics.jsonl, every key a column
    response = client.get("/api/runs/tiny/export/metrics.csv")
    assert response.status_code == 200 and "attachment" in response.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(response.text)))
    records = read_metrics(runs_dir / "tiny")
    assert len(rows) == len(records) and [int(r["step"]) for r in rows] == [r["step"] for r in records]
    assert float(rows[-1]["eval/reward/accuracy"]) == records[-1]["eval/reward/accuracy"]
    # trajectories: the list's filter, each record whole, one JSON line each
    params = {"kind": "train", "step": 1, "outcome": "policy"}
    listed = client.get("/api/runs/tiny/trajectories", params=params).json()
    exported = client.get("/api/runs/tiny/export/trajectories.jsonl", params=params)
    assert exported.status_code == 200 and exported.headers["content-type"].startswith("application/x-ndjson")
    lines = [json_module.loads(line) for line in exported.text.splitlines()]
    whole = RunRecords(runs_dir / "tiny")
    assert len(lines) == listed["total"] > 0
    assert lines == [json_module.loads(json_module.dumps(whole.trajectory("train", 1, r["index"])))
                     for r in listed["rows"]]
    assert lines[0]["sequences"][0]["token_ids"]  # the token arrays too
    everything = client.get("/api/runs/tiny/export/trajectories.jsonl", params={"kind": "eval"}).text.splitlines()
    assert len(everything) == client.get("/api/runs/tiny/trajectories", params={"kind": "eval"}).json()["total"]
    # the config as it is on disk; a run without one, and an unknown run, are errors
    assert client.get("/api/runs/tiny/export/config.yaml").content == (runs_dir / "tiny" / "config.yaml").read_bytes()
    assert client.get("/api/runs/killed/export/metrics.csv").text == "step,time\n"
    assert client.get("/api/runs/no-such-run/export/trajectories.jsonl").status_code == 404
    assert client.get("/api/runs/..%2F..%2Fetc/export/config.yaml").status_code in (400, 404)


def test_search_finds_text_in_messages_tool_results_and_answers_with_where_it_is(ui_runs_dir, tmp_path_factory):
    from rlfactory_core.records import write_records

    runs_dir = tmp_path_factory.mktemp("ui-search") / "runs"
    shutil.copytree(ui_runs_dir / "tiny", runs_dir / "tiny", symlinks=True)
    base = {"kind": "eval", "group": -1, "reward": 0.0, "stop_reason": "no_tool_call"}
    write_records(runs_dir / "found", "eval", 3, [
        {**base, "step": 3, "index": 0, "sample_id": "q0", "final_answer": "Nairobi",
         "outcome": "answered", "outcome_side": "policy",
         "messages": [{"role": "user", "content": "What is the capital of Kenya?"},
                      {"role": "assistant", "content": "<search>Kenya capital</search>", "turn": 0},
                      {"role": "tool", "content": "Doc 1: the capital is Nairobi. Unique-Needle-42 sits here."}],
         "tool_calls": [{"name": "search", "arguments": '{"query": "Kenya capital"}', "turn": 0,
                         "result": "Doc 1: the capital is Nairobi. Unique-Needle-42 sits here."}]},
        {**base, "step": 3, "index": 1, "sample_id": "q1", "final_answer": "Lima",
         "outcome": "tool_timeout", "outcome_side": "infrastructure",
         "messages": [{"role": "user", "content": "What is the capital of Peru?"}]}])
    client = TestClient(create_app(runs_dir, token=TOKEN, port=PORT), base_url=f"http://127.0.0.1:{PORT}",
                        headers={"Authorization": f"Bearer {TOKEN}"})
    found = client.get("/api/runs/found/search", params={"q": "unique-needle-42"}).json()
    assert found["total"] == 2 and not found["truncated"] and found["errors"] == {}
    assert [(h["kind"], h["step"], h["index"], h["where"]) for h in found["hits"]] == [
        ("eval", 3, 0, "message 2 (tool)"), ("eval", 3, 0, "tool call 0 (search) result")]
    hit = found["hits"][1]
    assert hit["match"] == "Unique-Needle-42" and hit["before"].endswith("Nairobi. ") and hit["after"] == " sits here."
    answers = client.get("/api/runs/found/search", params={"q": "lima"}).json()["hits"]
    assert [(h["index"], h["where"]) for h in answers] == [(1, "final answer")]
    arguments = client.get("/api/runs/found/search", params={"q": '"query"', "kind": "eval"}).json()["hits"]
    assert [h["where"] for h in arguments] == ["tool call 0 (search) arguments"]
    assert client.get("/api/runs/found/search", params={"q": "Kenya", "kind": "train"}).json()["total"] == 0
    assert client.get("/api/runs/found/search", params={"q": "  "}).json()["hits"] == []
    # each hit says its trajectory's outcome; a class or a side narrows the search as it does the list
    assert {(h["outcome"], h["outcome_side"]) for h in found["hits"]} == {("answered", "policy")}
    everywhere = client.get("/api/runs/found/search", params={"q": "capital of"}).json()
    assert [(h["index"], h["outcome"]) for h in everywhere["hits"]] == [(0, "answered"), (1, "tool_timeout")]
    for outcome, indices in (("infrastructure", [1]), ("tool_timeout", [1]), ("policy", [0]), ("answered", [0]),
                             ("reward_error", [])):
        narrowed = client.get("/api/runs/found/search", params={"q": "capital of", "outcome": outcome}).json()
        assert [h["index"] for h in narrowed["hits"]] == indices and narrowed["total"] == len(indices), outcome
    # the real run: its prompts hold the question of every trajectory
    tiny = client.get("/api/runs/tiny/search", params={"q": "user"}).json()
    assert tiny["total"] > 0 and len(tiny["hits"]) <= 200
    assert client.get("/api/runs/no-such/search", params={"q": "x"}).status_code == 404


def test_the_trajectory_list_sorts_every_page_by_a_column(client):
    rows = client.get("/api/runs/tiny/trajectories", params={"kind": "train", "sort": "reward", "order": "desc"}).json()
    rewards = [r["reward"] for r in rows["rows"]]
    present = [r for r in rewards if r is not None]
    assert present == sorted(present, reverse=True) and rewards[:len(present)] == present  # no reward last
    by_step = client.get("/api/runs/tiny/trajectories", params={"kind": "eval", "sort": "step", "order": "desc"}).json()
    assert [r["step"] for r in by_step["rows"]] == sorted((r["step"] for r in by_step["rows"]), reverse=True)
    wrong = client.get("/api/runs/tiny/trajectories", params={"kind": "eval", "sort": "messages"})
    assert wrong.status_code in (400, 422)


def test_runs_are_tagged_and_deleted_safely(ui_runs_dir, tmp_path_factory):
    runs_dir = tmp_path_factory.mktemp("ui-delete") / "runs"
    runs_dir.mkdir()
    for name in ("tiny", "killed"):
        shutil.copytree(ui_runs_dir / name, runs_dir / name, symlinks=True)
    elsewhere = tmp_path_factory.mktemp("kept") / "target"
    shutil.copytree(ui_runs_dir / "tiny", elsewhere, symlinks=True)
    (runs_dir / "tiny" / "checkpoints").mkdir(exist_ok=True)
    (runs_dir / "tiny" / "checkpoints" / "outside-link").symlink_to(elsewhere, target_is_directory=True)
    inside_target = runs_dir / ".hidden-target"
    shutil.copytree(ui_runs_dir / "tiny", inside_target, symlinks=True)
    (runs_dir / "linked").symlink_to(inside_target, target_is_directory=True)
    client = TestClient(create_app(runs_dir, token=TOKEN, port=PORT), base_url=f"http://127.0.0.1:{PORT}",
                        headers={"Authorization": f"Bearer {TOKEN}"})
    # tags: kept beside the runs, shown in the list, checked
    assert client.put("/api/runs/tiny/tags", json={"tags": ["baseline", " lr-1e-5 ", "baseline"]}).json()["tags"] == \
        ["baseline", "lr-1e-5"]
    runs = {r["name"]: r for r in client.get("/api/runs").json()["runs"]}
    assert runs["tiny"]["tags"] == ["baseline", "lr-1e-5"] and runs["killed"]["tags"] == []
    for bad in ("baseline", ["x" * 41], ["a\nb"], [1], ["t"] * 21):
        response = client.put("/api/runs/tiny/tags", json={"tags": bad})
        assert response.status_code == 400 and "tags must be a list" in response.json()["error"]
    assert client.put("/api/runs/no-such/tags", json={"tags": ["x"]}).status_code == 404
    # delete: never from another site, never a running run
    cross = client.delete("/api/runs/tiny", headers={"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
    assert cross.status_code == 403 and (runs_dir / "tiny").is_dir()
    status = json.loads((runs_dir / "killed" / "status.json").read_text())
    (runs_dir / "killed" / "status.json").write_text(json.dumps({**status, "host": socket.gethostname(),
                                                                 "pid": os.getpid(), "updated_at": time.time()}))
    refused = client.delete("/api/runs/killed")
    assert refused.status_code == 409 and "is running" in refused.json()["error"] and (runs_dir / "killed").is_dir()
    # a run's own directory goes; a link inside it goes without its target
    assert client.delete("/api/runs/tiny").json() == {"deleted": "tiny"}
    assert not (runs_dir / "tiny").exists() and (elsewhere / "config.yaml").is_file()
    # a run that is a symlink: the link goes, its target stays
    assert client.delete("/api/runs/linked").status_code == 200
    assert not (runs_dir / "linked").is_symlink() and (inside_target / "config.yaml").is_file()
    assert client.get("/api/runs").json()["runs"][0]["name"] == "killed"
    for path in ("/api/runs/..", "/api/runs/%2e%2e", "/api/runs/.hidden-target%2F..", "/api/runs/no-such"):
        assert client.delete(path).status_code in (400, 404, 405)
    assert (runs_dir / ".hidden-target").is_dir() and runs_dir.is_dir()


def test_a_group_is_its_members_side_by_side_with_the_prompt_they_share_once(client, runs_dir):
    records = RunRecords(runs_dir / "tiny")
    rows = records.list("train", 1)
    number = rows[0]["group"]
    members = sorted(r["index"] for r in rows if r["group"] == number)
    body = client.get("/api/runs/tiny/group", params={"kind": "train", "step": 1, "group": number}).json()
    assert [m["index"] for m in body["members"]] == members and len(members) >= 2
    assert body["groups"] == sorted({r["group"] for r in rows}) and body["errors"] == {}
    whole = records.trajectory("train", 1, members[0])
    first = body["members"][0]
    assert first["advantage"] == whole["advantage"] and first["reward"] == whole["reward"]
    assert body["shared_messages"] + first["messages"] == whole["messages"] and body["shared"] >= 1
    assert first["token_ids"] == [s["token_ids"] for s in whole["sequences"]] and first["sequences"] == []
    missing = client.get("/api/runs/tiny/group", params={"kind": "train", "step": 1, "group": 99}).json()
    assert missing["members"] == [] and "no group 99" in missing["errors"]["train step 1"]


def test_trajectories_filter_by_the_policy_version_that_sampled_them(client, runs_dir):
    listed = client.get("/api/runs/tiny/trajectories", params={"kind": "train"}).json()
    versions = listed["facets"]["policy_versions"]
    assert versions and versions == sorted(set(versions))
    one = client.get("/api/runs/tiny/trajectories", params={"kind": "train", "policy_version": versions[0]}).json()
    assert one["total"] >= 1 and {r["policy_version"] for r in one["rows"]} == {versions[0]}
    exported = client.get("/api/runs/tiny/export/trajectories.jsonl",
                          params={"kind": "train", "policy_version": versions[0]}).text.splitlines()
    assert len(exported) == one["total"]
    found = client.get("/api/runs/tiny/search", params={"q": "user", "kind": "train"}).json()["hits"]
    assert found and all("policy_version" in h for h in found)


def test_trajectories_of_several_sequences_are_filtered_exported_and_found_by_sequence(tmp_path, default_model_dir):
    """A model family that rewrote earlier turns (gpt-oss's follow-up) records a trajectory of two
    token sequences: the list filters by the number of sequences (a facet), the export follows
    the filter, and a search hit in the second sequence's turn says "sequence 2 of 2"."""
    from ui_runs import write_two_sequence_run

    write_two_sequence_run(tmp_path / "runs" / "multi", default_model_dir)
    app = create_app(tmp_path / "runs", token=TOKEN, port=PORT)
    with TestClient(app, base_url=f"http://127.0.0.1:{PORT}", headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        listed = c.get("/api/runs/multi/trajectories", params={"kind": "eval"}).json()
        assert listed["facets"]["sequence_counts"] == [1, 2]
        assert [r["num_sequences"] for r in listed["rows"]] == [1, 2, 1]
        two = c.get("/api/runs/multi/trajectories", params={"kind": "eval", "sequences": 2}).json()
        assert two["total"] == 1 and two["rows"][0]["sample_id"] == "q1"
        exported = c.get("/api/runs/multi/export/trajectories.jsonl",
                         params={"kind": "eval", "sequences": 2}).text.splitlines()
        assert [json.loads(line)["sequence_turns"] for line in exported] == [[0, 1]]
        hits = c.get("/api/runs/multi/search", params={"q": "zebra"}).json()["hits"]
        assert [(h["index"], h["sequence"], h["num_sequences"]) for h in hits] == [(1, 2, 2)]
        first = c.get("/api/runs/multi/search", params={"q": "first answer"}).json()["hits"]
        # the single-sequence trajectories' hits name no sequence; q1's is in its first
        assert [(h["index"], h.get("sequence")) for h in first] == [(0, None), (1, 1), (2, None)]
