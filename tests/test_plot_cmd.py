"""``rlf plot RUN_DIR``: the real command, in-process through the ``rlf`` fixture (the error
boundary users see) and once through typer's CliRunner, on metrics.jsonl files written here in
the shape a real run writes them (a base-model eval and a cold start at step 0, then steps)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest
from PIL import Image
from typer.testing import CliRunner

from rlfactory_cli.app import build_app
from rlfactory_cli.plot_cmd import draw_figure, panels_for, series

@pytest.fixture(autouse=True)
def matplotlib_config(tmp_path_factory, monkeypatch):
    """A config directory for matplotlib, as the command makes one: the tests leave neither the
    home nor the environment of the other tests changed."""
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path_factory.mktemp("matplotlib")))


CONFIG = "env: deepsearch\nmodel:\n  name: smollm2-135m-instruct\ndata:\n  eval_split: test\n"


def eval_metrics(prefix: str, accuracy: float) -> dict:
    return {f"{prefix}eval/reward/mean": accuracy, f"{prefix}eval/reward/accuracy": accuracy,
            f"{prefix}eval/tools/calls_per_trajectory": 1.2, f"{prefix}eval/tools/error_rate": 0.05,
            f"{prefix}eval/outcome/infrastructure": 0.0}


def step_metrics(step: int) -> dict:
    return {"step": step, "time": 1_800_000_000.0 + step, "reward/mean": 0.5 + step / 100,
            "reward/accuracy": 0.4 + step / 100, "tools/calls_per_trajectory": 1.1, "tools/error_rate": 0.1,
            "outcome/infrastructure": 0.05,
            "train/loss": 0.01, "train/entropy": 0.05, "train/kl": 0.0, "train/clip_fraction": 0.01,
            "train/sampler_logprob_diff": 1e-6, "train/sampler_kl": None,  # a NaN is logged as null
            "time/rollout": 8.0, "time/reward": 0.01, "time/train": 15.0, "time/weight_sync": 0.7,
            "time/step": 23.7, "samples": ["<a trajectory as text>"]}


def records(steps: int = 4) -> list[dict]:
    """A cold-started run: base eval and cold start at step 0, ``steps`` RL steps, eval at the last."""
    rows = [{"step": 0, "time": 1_800_000_000.0, **eval_metrics("", 0.1)},
            {"step": 0, "time": 1_800_000_000.0, "cold_start/examples": 64.0, "time/cold_start_train": 199.0,
             **eval_metrics("cold_start/", 0.85)}]
    rows += [step_metrics(step) for step in range(1, steps + 1)]
    rows[-1].update(eval_metrics("", 0.9), **{"time/eval": 60.0, "time/checkpoint": 2.0})
    return rows


def write_run(run_dir, rows=None, *, config: str | None = CONFIG, tail: str = ""):
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(row) + "\n" for row in (records() if rows is None else rows))
    (run_dir / "metrics.jsonl").write_text(lines + tail, encoding="utf-8")
    if config is not None:
        (run_dir / "config.yaml").write_text(config, encoding="utf-8")
    return run_dir


def png_size(path) -> tuple[int, int]:
    with Image.open(path) as image:
        assert image.format == "PNG"
        image.load()  # a truncated file fails here, not only its header
        return image.size


def test_plots_every_panel_of_a_run_into_run_dir_curves_png(rlf, tmp_path):
    run = write_run(tmp_path / "deepsearch-run")
    code, out, err = rlf("plot", str(run))
    assert (code, err) == (0, "")
    assert out.strip() == str(run / "curves.png")
    # 9 panels: 3 columns x 3 rows of 4 x 3 inches, plus a 0.5 inch title band, at 100 dpi
    assert png_size(run / "curves.png") == (1200, 950)


def test_out_and_dpi(rlf, tmp_path):
    run = write_run(tmp_path / "run")
    target = tmp_path / "figures" / "curve.png"
    target.parent.mkdir()
    code, out, _ = rlf("plot", str(run), "--out", str(target), "--dpi", "50")
    assert code == 0 and out.strip() == str(target)
    assert png_size(target) == (600, 475)
    assert not (run / "curves.png").exists()
    assert list(target.parent.iterdir()) == [target]  # no temporary file left beside it


def test_through_typers_cli_runner(tmp_path):
    run = write_run(tmp_path / "run")
    result = CliRunner().invoke(build_app(with_plugin_commands=False), ["plot", str(run), "--out",
                                                                        str(tmp_path / "c.png")])
    assert result.exit_code == 0, result.output
    assert png_size(tmp_path / "c.png") == (1200, 950)


def test_a_torn_last_line_still_plots(rlf, tmp_path):
    run = write_run(tmp_path / "run", tail='{"step": 5, "time": 18000000')  # killed mid-write
    code, out, err = rlf("plot", str(run))
    assert (code, err) == (0, "")
    assert png_size(run / "curves.png") == (1200, 950)


def test_a_run_without_config_or_cold_start_plots_the_panels_it_has(rlf, tmp_path):
    rows = [{"step": step, "reward/mean": 0.1 * step, "train/entropy": 0.2} for step in (1, 2, 3)]
    run = write_run(tmp_path / "run", rows, config=None)
    code, _, err = rlf("plot", str(run))
    assert (code, err) == (0, "")
    assert png_size(run / "curves.png") == (800, 350)  # two panels in one row


def test_panels_are_those_the_run_logged():
    assert [p.title for p in panels_for(records(), "test")] == [
        "held-out accuracy", "training reward", "tool calls per trajectory", "tool error rate",
        "infrastructure failures", "entropy", "KL and clip fraction", "sampler vs trainer mismatch",
        "step time by phase (s)"]
    # null everywhere (a NaN) is no series: the mismatch panel keeps only the logprob difference
    mismatch = panels_for(records())[7]
    assert mismatch.series == (("train/sampler_logprob_diff", "|logp diff| per token"),)
    # no accuracy reward: the mean reward is the held-out curve, on a free y-axis
    rows = [{"step": 0, "eval/reward/mean": -0.1}, {"step": 2, "eval/reward/mean": 0.4}]
    (panel,) = panels_for(rows)
    assert (panel.title, panel.series, panel.share) == ("held-out reward", (("eval/reward/mean", "eval"),), False)


def test_series_skips_what_is_not_a_number_at_a_step():
    rows = [{"step": 0, "x": 1}, {"x": 5.0}, {"step": "3", "x": 2.0}, {"step": 1, "x": None},
            {"step": 2, "x": True}, {"step": 2, "x": [1, 2]}, {"step": 4, "x": float("nan")}, {"step": 5, "x": 0.5}]
    assert series(rows, "x") == [(0, 1.0), (5, 0.5)]


def test_the_cold_start_eval_is_a_star_at_step_0_and_the_curve_starts_there():
    figure = draw_figure(panels_for(records()), records(), title="t")
    accuracy = figure.axes[0]
    lines = {line.get_label(): line for line in accuracy.get_lines()}
    assert lines["after cold start"].get_xydata().tolist() == [[0.0, 0.85]]
    assert lines["base model"].get_xydata().tolist() == [[0.0, 0.1]]
    assert lines["eval"].get_xydata().tolist() == [[0.0, 0.85], [4.0, 0.9]]
    assert [text.get_text() for text in accuracy.texts] == ["0.100", "0.850", "0.900"]


def a_file(tmp):
    (tmp / "file.txt").write_text("x")
    return tmp / "file.txt"


def an_empty_dir(tmp):
    (tmp / "empty").mkdir()
    return tmp / "empty"


@pytest.mark.parametrize("make, message", [
    (lambda tmp: tmp / "nope", "run directory not found: {tmp}/nope"),
    (a_file, "{tmp}/file.txt is not a directory"),
    (an_empty_dir, "{tmp}/empty is not a run: it has no metrics.jsonl"),
    (lambda tmp: write_run(tmp / "r", []), "{tmp}/r/metrics.jsonl has 0 record(s) but no step with a metric"),
    (lambda tmp: write_run(tmp / "r", [{"step": 0, "time": 1.0}, {"reward/mean": 0.5}]),
     "{tmp}/r/metrics.jsonl has 2 record(s) but no step with a metric"),
])
def test_errors_are_one_line_with_a_hint(rlf, tmp_path, make, message):
    code, out, err = rlf("plot", str(make(tmp_path)))
    assert code == 1 and out == ""
    assert err.startswith("Error: " + message.format(tmp=tmp_path))
    assert err.count("\n") == 2 and "hint: " in err
    assert not list(tmp_path.rglob("curves.png"))


def test_a_damaged_middle_line_is_skipped_and_named_as_the_ui_does(rlf, tmp_path):
    run = write_run(tmp_path / "r", tail='garbage\n{"step": 9}\n')  # line 7 of 8: not a torn tail
    code, out, err = rlf("plot", str(run))
    assert code == 0 and out.strip() == str(run / "curves.png")
    assert err.strip() == f"Warning: skipped line 7 of {run / 'metrics.jsonl'}: not a JSON object"
    assert png_size(run / "curves.png") == (1200, 950)


@pytest.mark.parametrize("target, message", [
    ("missing/curve.png", "cannot write {out}: the directory {tmp}/missing does not exist"),
    ("a-directory", "cannot write {out}: it is a directory"),
])
def test_an_unwritable_out_path_is_an_error_before_drawing(rlf, tmp_path, target, message):
    run = write_run(tmp_path / "run")
    (tmp_path / "a-directory").mkdir()
    out_path = tmp_path / target
    code, out, err = rlf("plot", str(run), "--out", str(out_path))
    assert code == 1 and out == ""
    assert err.startswith("Error: " + message.format(out=out_path, tmp=tmp_path))


def test_without_matplotlib_the_error_names_the_extra(rlf, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    code, out, err = rlf("plot", str(write_run(tmp_path / "run")))
    assert code == 1 and out == ""
    assert err.startswith("Error: rlf plot needs matplotlib, which is not installed")
    assert "hint: pip install 'rlfactory[ui]'" in err


def test_matplotlib_gets_a_temporary_config_dir_not_the_home(rlf, tmp_path, monkeypatch):
    monkeypatch.delenv("MPLCONFIGDIR")  # monkeypatch restores the environment after
    assert rlf("plot", str(write_run(tmp_path / "run")))[0] == 0
    assert os.environ["MPLCONFIGDIR"].startswith(tempfile.gettempdir())


def test_the_cli_does_not_import_matplotlib_until_plot_runs():
    code = "import sys, rlfactory_cli.app, rlfactory_cli.plot_cmd; print('matplotlib' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
