"""Preflight: every problem of a run reported at once, one line each, before anything is
announced, loaded or written (rlfactory_core.preflight, through the real CLI)."""

import io
import sys

import pytest
import yaml
from rich.console import Console

from rlfactory_core import hookimpl
from rlfactory_core.runs import new_run_dir
from rlfactory_core.data import load_samples
from rlfactory_core.task import build_env
from rlfactory_core.config import load_config
from rlfactory_core.errors import ConfigError
from rlfactory_core.preflight import preflight
from rlfactory_core.testing import registered_plugin, train


def _problem_lines(err: str) -> list[str]:
    """The problems the CLI printed: the indented lines under the red ``Error:`` line."""
    lines = err.splitlines()
    assert lines[0].startswith("Error: invalid config: ") and lines[0].endswith(" problems"), err
    problems = [line.strip() for line in lines[1:] if line.startswith("  ")]
    assert lines[0] == f"Error: invalid config: {len(problems)} problems"
    assert lines[-1].startswith("hint: ")
    return problems


def test_rlf_train_reports_every_mistake_at_once_one_per_line_and_writes_nothing(rlf, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = rlf("train", "--env", "nope", "--model", str(tmp_path / "no-model"), "train.stepz=3",
                         "train.lr=-1", "rewards=[{name: nah}]", "parser=zz")
    assert code == 1
    assert out == ""  # nothing announced
    problems = _problem_lines(err)
    assert [p.split(":")[0] for p in problems] == ["train.lr", "train.stepz", "env", "parser", "rewards[0]",
                                                   "model.name"]
    assert "env: no env named 'nope' (available: " in err and "arithmetic" in err
    assert "parser: no parser named 'zz'" in err and "rewards[0]: no reward named 'nah'" in err
    assert f"model.name: model directory '{tmp_path / 'no-model'}' does not exist" in err
    assert list(tmp_path.iterdir()) == []  # no runs/ directory, no config.yaml


def test_options_data_and_logging_are_checked_with_the_config(rlf, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails as if it were not installed
    code, out, err = rlf("train", "--env", "arithmetic", "--preset", "cpu-smock", "env_options.colour=red",
                         "rewards=[{name: exact_match, options: {answer_kee: x}}]", "tool_manager.options.speed=2",
                         "data.eval_file=missing.jsonl", "logging.wandb_project=p", "grpo.group_size=1")
    assert code == 1 and out == ""
    assert _problem_lines(err) == [
        "preset: unknown preset 'cpu-smock'; choose one of cpu-smoke, gpu",
        "grpo.group_size: Input should be greater than or equal to 2 (got 1)",
        "tool_manager.options.speed: the 'concurrent' tool manager has no option 'speed' (its options: timeout_s, "
        "max_concurrency, tool_concurrency, max_retries, retry_backoff_s, max_retry_backoff_s, retry_timeouts, "
        "cache, cache_size)",
        "rewards[0].options.answer_kee: the 'exact_match' reward has no option 'answer_kee' (its options: "
        "answer_key)",
        "env_options.colour: the 'arithmetic' env has no option 'colour' (its options: questions_per_episode, "
        "few_shot, seed, use_tools)",
        "data.eval_file: no file at missing.jsonl",
        "logging.wandb_project: Weights & Biases is not installed; pip install wandb, or set "
        "logging.wandb_project=null",
    ]
    assert list(tmp_path.iterdir()) == []


def test_resume_and_run_dir_problems_come_with_the_others(rlf, tmp_path):
    old = tmp_path / "old"
    (old / "checkpoints" / "step-3").mkdir(parents=True)  # unfinished: no state.json
    (old / "config.yaml").write_text(yaml.safe_dump({"env": "arithmetic"}))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    code, out, err = rlf("train", "--resume", str(old), "train.steps=x")
    assert code == 1 and out == ""
    assert _problem_lines(err) == [
        "train.steps: Input should be a valid integer, unable to parse string as an integer (got 'x')",
        f"--resume: {old} has no checkpoint to resume from; start a new run, or point --resume at a run "
        "directory with checkpoints/",
    ]
    code, _, err = rlf("train", "--resume", str(tmp_path / "gone"), "--run-dir", str(old))
    assert code == 1 and err.startswith(f"Error: invalid config: --resume: no run directory at {tmp_path / 'gone'}")
    code, _, err = rlf("train", "--resume", str(tmp_path), "parser=zz")
    assert code == 1 and f"--resume: {tmp_path} is not a run directory (no config.yaml)" in err
    assert "parser: no parser named 'zz'" in err
    code, _, err = rlf("train", "--run-dir", str(old), "parser=zz")
    assert code == 1 and f"run_dir: {old} already holds a run; continue it with `rlf train --resume {old}`" in err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_rlf_eval_is_checked_the_same_way(rlf, tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"env": "arithmetic"}))
    code, out, err = rlf("eval", "--env", "nope", "--model", str(run), "bogus.key=1")
    assert code == 1 and out == ""
    assert _problem_lines(err) == [
        "bogus: unknown key (see `rlf train --help-config` for the keys)",
        "env: no env named 'nope' (available: android, arithmetic, deepsearch, mcp, nl2sql)",
        f"--model: run {run} has no checkpoint yet (evaluate a model directory instead)",
    ]
    assert not (run / "eval").exists()
    code, _, err = rlf("eval", "--env", "arithmetic", "--model", "smollm2-135m-instruct", "--size", "0")
    assert code == 2 and "--size" in err  # typer's own usage error


def test_a_problem_only_the_built_task_shows_still_comes_before_anything_is_written_or_announced(rlf, tmp_path):
    run = tmp_path / "run"
    # The arithmetic env refuses this value in its constructor, which preflight does not run.
    code, out, err = rlf("train", "--env", "arithmetic", "--run-dir", str(run), "env_options.questions_per_episode=0")
    assert code == 1 and out == ""
    assert err.splitlines()[0] == ("Error: invalid config: env_options: the 'arithmetic' env refused its options "
                                   "(ValueError: questions_per_episode must be >= 1, got 0)")
    assert not run.exists()


class _EmptyData:
    name = "empty_data"
    description = "an env whose training set is empty"

    def __init__(self):
        self.tools = []

    def dataset(self, size=None, split="train"):
        return []

    async def reset(self, sample): ...

    async def step(self, state, turn, results): ...

    async def close(self, state): ...


class _RecordingToolManager:
    name = "recording"
    description = "remembers that it was closed"
    closed = 0

    def __init__(self, tools):
        self.tools = tools

    async def call(self, calls, ctx=None):
        return []

    async def close(self):
        type(self).closed += 1


def test_library_train_checks_first_and_closes_a_task_it_cannot_use(tmp_path):
    with pytest.raises(ConfigError) as info:
        train(load_config([], [f"model.name={tmp_path / 'none'}", f"run_dir={tmp_path / 'run'}",
                                 "rewards=[{name: nah}]"]))
    assert [e.split(":")[0] for e in info.value.errors] == ["rewards[0]", "model.name"]

    class Plugin:
        @hookimpl
        def rlfactory_register_envs(self, register):
            register(_EmptyData)

        @hookimpl
        def rlfactory_register_tool_managers(self, register):
            register(_RecordingToolManager)

    console = Console(file=io.StringIO())
    with registered_plugin(Plugin()):
        with pytest.raises(ConfigError, match="data: the training set is empty"):
            train(load_config([], ["env=empty_data", "tool_manager.name=recording", f"run_dir={tmp_path / 'run'}"]),
                    console=console)
    assert _RecordingToolManager.closed == 1  # an env's servers (MCP) do not outlive a run that never started
    assert console.file.getvalue() == "" and not (tmp_path / "run").exists()


def test_preflight_checks_what_the_config_names_even_when_the_config_itself_is_invalid():
    config, problems = preflight([], ["grpo.group_size=1", "eval.rewards=[{name: nah}]", "env_options={seed: 1}",
                                      "tool_manager=7"])
    assert config is None
    assert sorted(p.split(":")[0] for p in problems) == ["eval.rewards[0]", "grpo.group_size", "tool_manager"]
    assert ("eval.rewards[0]: no reward named 'nah' (available: android_task, arithmetic_verified, exact_match, f1, "
            "format, qwq_judge, search_r1, sql_execution)") in problems
    config, problems = preflight([], ["train.steps=2"])
    assert problems == [] and config is not None and config.train.steps == 2


def test_error_lines_are_single_lines_printed_literally(rlf):
    error = ConfigError(["a: first\nsecond", "b: x", "a: first second"])
    assert error.errors == ["a: first second", "b: x"]
    code, _, err = rlf("train", "[/bold]=1", "[red]x=2")
    assert code == 1
    assert "  [/bold]: unknown key" in err and "  [red]x: unknown key" in err


def test_default_run_directories_are_never_shared(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config([], ["env=rlfactory-plugin-arithmetic:arithmetic"])
    first, second = new_run_dir(config), new_run_dir(config)  # e.g. two runs started in one second
    assert first != second and first.is_dir() and second.is_dir()
    assert first.parent.absolute() == second.parent.absolute() == tmp_path / "runs"
    assert first.name.startswith("rlfactory-plugin-arithmetic_arithmetic-")  # one directory, not dist:env


def test_a_split_the_env_does_not_have_is_a_config_error():
    config = load_config([], [])
    env = build_env(config)
    with pytest.raises(ConfigError, match=r"data: the 'arithmetic' env cannot give its 'dev' split \(ValueError: "
                                          r"the arithmetic env has splits 'train' and 'test', not 'dev'\)"):
        load_samples(config, env, "dev", 4)


def test_hf_backend_options_are_checked_up_front():
    _, problems = preflight([], ["backend=hf", "backend_options={max_batch_size: 4, batch: 2, processor: x}"])
    assert problems == [
        f"backend_options.{key}: the 'hf' backend has no option {key!r} (its options: dtype, device, max_batch_size, "
        "max_model_len)" for key in ("batch", "processor")]  # the processor is the run's, not an option


def test_optional_packages_the_config_asks_for_are_checked_before_the_model_loads(monkeypatch):
    for module in ("peft", "flash_attn", "ray", "tensorboard"):
        monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    _, problems = preflight([], ["model.lora.enabled=true", "model.attn_implementation=flash_attention_2"])
    assert problems == [
        "model.lora.enabled: peft is not installed; pip install peft, or set model.lora.enabled=false",
        "model.attn_implementation: flash_attention_2 needs flash-attn (a GPU and pip install flash-attn, the gpu "
        "extra); or use auto or sdpa",
        "logging.tensorboard: TensorBoard is not installed; pip install tensorboard, or set logging.tensorboard=false",
    ]
    _, problems = preflight([], ["engine=ray", "logging.tensorboard=false"])
    assert problems == ["engine: ray is not installed; pip install 'ray[default]', or use engine=local"]
