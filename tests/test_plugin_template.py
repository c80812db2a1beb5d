"""The plugin template is a product: ``rlf plugins new`` renders it, and what it renders installs,
loads and passes its own tests (the model: llm-plugin's tests/test_cookiecutter_template.py).

Nothing here is mocked: the CLI runs in-process through the ``rlf`` fixture, the rendered
package is installed with pip into a temporary directory, and ``rlf plugins list`` and the
generated tests run in subprocesses that see it there. Everything works offline.
"""

from __future__ import annotations

import ast
import json
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rlfactory_cli.plugin_template import TEMPLATE_DIR
from rlfactory_cli.scaffold import DEFAULT_DESCRIPTION, DEFAULT_KINDS, TEMPLATE_KINDS

REPO_ROOT = Path(__file__).resolve().parents[1]
ALL_KINDS = ",".join(TEMPLATE_KINDS)

#: kind -> (registration hook, module holding the component, component name for plugin "demo")
KIND_DETAILS = {
    "tool": ("rlfactory_register_tools", "tools.py", "demo_word_count"),
    "reward": ("rlfactory_register_rewards", "rewards.py", "demo_length"),
    "env": ("rlfactory_register_envs", "envs.py", "demo"),
    "parser": ("rlfactory_register_parsers", "parsers.py", "demo"),
}


def rendered_files(root: Path) -> set[str]:
    return {path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file()}


def registration_hooks(init_file: Path) -> set[str]:
    """The names of the ``@hookimpl`` functions defined in a generated ``__init__.py``."""
    tree = ast.parse(init_file.read_text())
    return {
        node.name for node in tree.body
        if isinstance(node, ast.FunctionDef) and any(getattr(d, "id", None) == "hookimpl" for d in node.decorator_list)
    }


def assert_one_error_line(stderr: str, *fragments: str) -> None:
    """A user error is one ``Error:`` line naming the problem, optionally followed by a hint."""
    lines = stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2, stderr
    assert lines[0].startswith("Error: "), stderr
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in lines[0], stderr
    if len(lines) == 2:
        assert lines[1].startswith("hint: "), stderr


def next_steps(stderr: str) -> dict[str, list[str]]:
    """The commands ``rlf plugins new`` tells the user to run, split as a POSIX shell would,
    by program name (``pip``, ``rlf``, ``pytest``)."""
    commands = [shlex.split(line, comments=True) for line in stderr.splitlines() if line.startswith("  ")]
    return {command[0]: command for command in commands}


def subprocess_env(site: Path) -> dict[str, str]:
    """This environment, seeing the packages installed into ``site`` and loading all plugins."""
    env = {key: value for key, value in os.environ.items()
           if key not in {"RLFACTORY_LOAD_PLUGINS", "RLFACTORY_STRICT_PLUGINS"}}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return env


def run_python(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300, check=False)


def pip_install(source: Path | str, site: Path, cwd: Path) -> None:
    """Install ``source`` (a directory or a wheel, optionally with extras: ``DIR[test]``) into
    ``site``: no dependencies, no index, no isolation, offline."""
    result = run_python("-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                        "--disable-pip-version-check", "--target", str(site), str(source),
                        env=dict(os.environ), cwd=cwd)
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------------------------------
# Rendering through `rlf plugins new`
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kinds",
    [None, ("tool",), ("reward",), ("env",), ("parser",), ("env", "parser"), TEMPLATE_KINDS],
    ids=lambda kinds: "default" if kinds is None else "+".join(kinds),
)
def test_new_renders_only_the_chosen_kinds(rlf, tmp_path, kinds):
    args = ["plugins", "new", "demo", "--output-dir", str(tmp_path), "--description", 'Counts "words" \\ fast']
    if kinds is not None:
        args += ["--kinds", ",".join(reversed(kinds))]  # order does not matter
    code, stdout, stderr = rlf(*args)
    assert code == 0, stderr

    chosen = set(DEFAULT_KINDS if kinds is None else kinds)
    root = tmp_path / "rlfactory-plugin-demo"
    assert stdout.strip() == str(root)
    assert next_steps(stderr) == {"pip": ["pip", "install", "-e", f"{root}[test]"],
                                  "rlf": ["rlf", "plugins", "list"], "pytest": ["pytest", str(root)]}

    modules = {KIND_DETAILS[kind][1] for kind in chosen} | ({"tools.py"} if "env" in chosen else set())
    assert rendered_files(root) == {
        ".gitignore", "README.md", "pyproject.toml", "tests/test_demo.py", "rlfactory_plugin_demo/__init__.py",
        *(f"rlfactory_plugin_demo/{module}" for module in modules),
    }
    assert registration_hooks(root / "rlfactory_plugin_demo" / "__init__.py") == {
        KIND_DETAILS[kind][0] for kind in chosen
    }
    for path in root.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert "{{" not in text and "{%" not in text, f"unrendered template syntax in {path}"
            if path.suffix == ".py":
                compile(text, str(path), "exec")

    pyproject = (root / "pyproject.toml").read_text()
    assert 'name = "rlfactory-plugin-demo"' in pyproject
    assert 'description = "Counts \\"words\\" \\\\ fast"' in pyproject  # escaped for TOML
    assert '[project.entry-points.rlfactory]\ndemo = "rlfactory_plugin_demo"' in pyproject
    # the test extra holds what the generated tests and their pytest config need
    assert '"rlfactory>=0.1"' in pyproject and 'test = ["pytest>=8", "pytest-asyncio>=0.24"]' in pyproject
    assert 'asyncio_default_fixture_loop_scope = "function"' in pyproject
    readme = (root / "README.md").read_text()
    for kind, (_, _, component) in KIND_DETAILS.items():
        assert (f"| {kind} | `{component}` |" in readme) == (kind in chosen)


def test_new_derives_module_and_component_names_from_a_dashed_name(rlf, tmp_path):
    code, stdout, stderr = rlf("plugins", "new", "web-search", "--output-dir", str(tmp_path), "--kinds", ALL_KINDS)
    assert code == 0, stderr
    root = Path(stdout.strip())
    assert root == tmp_path / "rlfactory-plugin-web-search"
    package = root / "rlfactory_plugin_web_search"
    assert '\nweb-search = "rlfactory_plugin_web_search"\n' in (root / "pyproject.toml").read_text()
    assert "def web_search_word_count(text: str) -> int:" in (package / "tools.py").read_text()
    assert 'name = "web_search_length"' in (package / "rewards.py").read_text()
    assert 'name = "web_search"' in (package / "envs.py").read_text()
    assert (root / "tests" / "test_web_search.py").is_file()


@pytest.mark.parametrize("name", ["Demo", "my plugin", "-demo", "demo-", "de--mo", "d_-x", "démo", "a/b", ""])
def test_new_rejects_an_invalid_name(rlf, tmp_path, name):
    code, stdout, stderr = rlf("plugins", "new", "--output-dir", str(tmp_path), "--", name)  # "--": "-demo" is no option
    assert code == 1
    assert_one_error_line(stderr, "invalid plugin name", repr(name))
    assert stdout == "" and list(tmp_path.iterdir()) == []


def test_new_rejects_the_distribution_prefix_in_the_name(rlf, tmp_path):
    code, _, stderr = rlf("plugins", "new", "rlfactory-plugin-demo", "--output-dir", str(tmp_path))
    assert code == 1
    assert_one_error_line(stderr, "'rlfactory-plugin-demo'")
    assert "pass 'demo'" in stderr and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kinds, bad", [("tool,foo", "'foo'"), ("tool_manager", "'tool_manager'"), (",", "no component kinds")])
def test_new_rejects_unknown_kinds_and_lists_the_valid_ones(rlf, tmp_path, kinds, bad):
    code, stdout, stderr = rlf("plugins", "new", "demo", "--output-dir", str(tmp_path), "--kinds", kinds)
    assert code == 1
    assert_one_error_line(stderr, bad, "tool, reward, env, parser")
    assert stdout == "" and list(tmp_path.iterdir()) == []


def test_new_rejects_a_multi_line_description(rlf, tmp_path):
    code, _, stderr = rlf("plugins", "new", "demo", "--output-dir", str(tmp_path), "--description", "one\ntwo")
    assert code == 1
    assert_one_error_line(stderr, "single line")
    assert list(tmp_path.iterdir()) == []


def test_new_refuses_to_overwrite_an_existing_directory(rlf, tmp_path):
    existing = tmp_path / "rlfactory-plugin-demo"
    existing.mkdir()
    (existing / "mine.txt").write_text("keep me")
    code, stdout, stderr = rlf("plugins", "new", "demo", "--output-dir", str(tmp_path))
    assert code == 1
    assert_one_error_line(stderr, str(existing), "already exists")
    assert stdout == ""
    assert rendered_files(existing) == {"mine.txt"} and (existing / "mine.txt").read_text() == "keep me"


def test_new_leaves_no_cookiecutter_state_in_the_home_or_temp_directory(rlf, tmp_path, monkeypatch):
    import tempfile

    home, temp = tmp_path / "home", tmp_path / "temp"
    home.mkdir()
    temp.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    (home / ".cookiecutterrc").write_text("default_context:\n  kinds: parser\n")  # must not leak in
    code, _, stderr = rlf("plugins", "new", "demo", "--output-dir", str(tmp_path / "out"))
    assert code == 0, stderr
    assert sorted(path.name for path in home.iterdir()) == [".cookiecutterrc"]  # no ~/.cookiecutter_replay
    assert list(temp.iterdir()) == [] and tempfile.tempdir == str(temp)  # no rendered hook scripts left
    assert registration_hooks(tmp_path / "out/rlfactory-plugin-demo/rlfactory_plugin_demo/__init__.py") == {
        "rlfactory_register_tools", "rlfactory_register_rewards",
    }


# ---------------------------------------------------------------------------------------
# The template used directly with cookiecutter
# ---------------------------------------------------------------------------------------


def cookiecutter_config(tmp_path: Path, monkeypatch) -> str:
    """A throw-away cookiecutter config, so tests neither read nor write the user's, and a
    temp directory of the test's (cookiecutter leaves its rendered hook scripts there)."""
    import tempfile

    (tmp_path / "temp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temp"))
    config = tmp_path / "cookiecutter.yaml"
    config.write_text(f"replay_dir: {tmp_path / 'replay'}\ncookiecutters_dir: {tmp_path / 'cookiecutters'}\n")
    return str(config)


def test_template_defaults_match_the_cli():
    context = json.loads((TEMPLATE_DIR / "cookiecutter.json").read_text())
    assert context["plugin_name"] == "demo"
    assert context["description"] == DEFAULT_DESCRIPTION
    assert context["kinds"] == ",".join(DEFAULT_KINDS)
    for kind in TEMPLATE_KINDS:
        assert kind in context["__prompts__"]["kinds"]


def test_template_renders_with_cookiecutter_defaults(tmp_path, monkeypatch):
    from cookiecutter.main import cookiecutter

    created = Path(cookiecutter(str(TEMPLATE_DIR), no_input=True, output_dir=str(tmp_path / "out"),
                                config_file=cookiecutter_config(tmp_path, monkeypatch)))
    assert created == tmp_path / "out" / "rlfactory-plugin-demo"
    assert registration_hooks(created / "rlfactory_plugin_demo" / "__init__.py") == {
        "rlfactory_register_tools", "rlfactory_register_rewards",
    }


@pytest.mark.parametrize("context", [{"plugin_name": "Not Valid"}, {"kinds": "tool,tools"}])
def test_template_hook_rejects_what_rlf_rejects(tmp_path, context, monkeypatch):
    from cookiecutter.exceptions import FailedHookException
    from cookiecutter.main import cookiecutter

    with pytest.raises(FailedHookException):
        cookiecutter(str(TEMPLATE_DIR), no_input=True, extra_context=context, output_dir=str(tmp_path / "out"),
                     config_file=cookiecutter_config(tmp_path, monkeypatch))
    assert not any((tmp_path / "out").iterdir())  # the half-made project was removed


# ---------------------------------------------------------------------------------------
# Installed: RLFactory loads the generated plugin, and its own tests pass
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_generated_plugin_installs_loads_and_passes_its_tests(rlf, tmp_path):
    """Installed and tested the way ``rlf plugins new`` says (its commands, from a directory
    whose name needs quoting), but into a temporary directory, without dependencies."""
    code, stdout, stderr = rlf("plugins", "new", "demo", "--output-dir", str(tmp_path / "my plugins"),
                               "--kinds", ALL_KINDS)
    assert code == 0, stderr
    root = Path(stdout.strip())
    steps = next_steps(stderr)
    site = tmp_path / "site"
    pip_install(steps["pip"][-1], site, cwd=tmp_path)  # "DIR[test]": the extra that brings pytest
    env = subprocess_env(site)

    listed = run_python("-m", "rlfactory_cli", "plugins", "list", "--json", env=env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    demo = {info["name"]: info for info in json.loads(listed.stdout)}["demo"]
    assert demo["status"] == "ok", demo["problems"]
    assert (demo["distribution"], demo["version"], demo["builtin"]) == ("rlfactory-plugin-demo", "0.1.0", False)
    assert sorted(demo["hooks"]) == sorted(hook for hook, _, _ in KIND_DETAILS.values())
    assert demo["components"] == {kind: [component] for kind, (_, _, component) in KIND_DETAILS.items()}

    # Warnings are errors: pytest-asyncio's "asyncio_default_fixture_loop_scope is unset" among them.
    tests = run_python("-m", *steps["pytest"], "-q", "-p", "no:cacheprovider", "-W", "error", env=env, cwd=tmp_path)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert " passed" in tests.stdout and "skipped" not in tests.stdout and "warning" not in tests.stdout.lower()


@pytest.mark.slow
def test_wheel_ships_the_template(tmp_path):
    """A normal (non-editable) install has the template too: it is package data of the wheel."""
    source = tmp_path / "source"
    # What the build reads: pyproject.toml, the README it names and the package roots.
    for name in ("pyproject.toml", "README.md", "LICENSE", "rlfactory_core", "cli", "contrib"):
        path = REPO_ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif path.is_file():
            source.mkdir(exist_ok=True)
            shutil.copy2(path, source / name)
    built = run_python("-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                       "--disable-pip-version-check", "--wheel-dir", str(tmp_path / "dist"), str(source),
                       env=dict(os.environ), cwd=tmp_path)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "dist").glob("rlfactory-*.whl")

    prefix = "rlfactory_cli/plugin_template/"
    shipped = {name[len(prefix):] for name in zipfile.ZipFile(wheel).namelist() if name.startswith(prefix)}
    template_files = {file for file in rendered_files(TEMPLATE_DIR) if "__pycache__" not in file and not file.endswith(".pyc")}
    assert shipped == template_files

    # Installed from the wheel (first on the path), `rlf plugins new` renders from the installed copy.
    site = tmp_path / "site"
    pip_install(wheel, site, cwd=tmp_path)
    script = ("import sys; from rlfactory_cli.scaffold import create_plugin; "
              "from rlfactory_cli.plugin_template import TEMPLATE_DIR; "
              "print(TEMPLATE_DIR); print(create_plugin('demo', kinds='env', output_dir=sys.argv[1]))")
    rendered = run_python("-c", script, str(tmp_path / "out"), env=subprocess_env(site), cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    template_dir, created = rendered.stdout.split()
    assert Path(template_dir) == site / "rlfactory_cli" / "plugin_template"
    assert (Path(created) / "rlfactory_plugin_demo" / "envs.py").is_file()


# ---------------------------------------------------------------------------------------
# The generated env trains: `rlf train`, then `rlf eval`, with its tool and its reward
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_generated_env_trains_and_evaluates_with_its_tool_and_reward(rlf, tmp_path, tiny_model_dir,
                                                                          monkeypatch):
    """``rlf plugins new demo --kinds env,tool,reward``, installed outside the environment:
    the run's tool manager, built as ``rlf train`` builds it, serves the generated tool (the
    env's ``tools``; with ``self.tool`` every call was ``unknown_tool``), and ``rlf train``
    then ``rlf eval`` run on its ``train`` and ``test`` splits, scored by the generated reward.
    (A tiny random model makes no tool call: the calls are made through the tool manager.)"""
    import asyncio

    from rlfactory_core import plugins
    from rlfactory_core.config import load_config
    from rlfactory_core.task import build_task
    from rlfactory_core.data import load_samples
    from rlfactory_core.types import ToolCall

    code, stdout, stderr = rlf("plugins", "new", "demo", "--output-dir", str(tmp_path), "--kinds", "env,tool,reward")
    assert code == 0, stderr
    site = tmp_path / "site"
    pip_install(Path(stdout.strip()), site, cwd=tmp_path)
    rewards = "rewards=[{name: exact_match}, {name: demo_length}]"

    monkeypatch.syspath_prepend(str(site))  # entry points are found on sys.path when loaded
    plugins.reset_plugins()
    try:
        config = load_config([], ["env=demo", rewards])
        task = build_task(config)
        assert [tool.name for tool in task.env.tools] == ["demo_word_count"] and task.offers_tools
        train, test = load_samples(config, task.env, "train", 3), load_samples(config, task.env, "test", 3)
        assert len(train) == len(test) == 3 and not {s["text"] for s in train} & {s["text"] for s in test}

        async def calls():
            try:
                return await task.tool_manager.call([ToolCall("demo_word_count", {"text": s["text"]}, id=str(i))
                                                     for i, s in enumerate(train)])
            finally:
                await task.tool_manager.close()

        results = asyncio.run(calls())
        assert [(r.error, r.content) for r in results] == [(None, s["answer"]) for s in train]
    finally:
        plugins.reset_plugins()
        for name in [name for name in sys.modules if name.startswith("rlfactory_plugin_demo")]:
            del sys.modules[name]

    run_dir, report = tmp_path / "run", tmp_path / "report"
    settings = ["backend=hf", "rollout.max_turns=2", "rollout.max_tokens_per_turn=8", "logging.live=off",
                "logging.tensorboard=false", "data.eval_size=2", rewards]
    env_vars = subprocess_env(site)
    trained = run_python("-m", "rlfactory_cli", "train", "--env", "demo", "--model", str(tiny_model_dir), "--run-dir",
                         str(run_dir), "train.steps=1", "grpo.prompts_per_step=1", "grpo.group_size=2", "eval.every=0",
                         *settings, env=env_vars, cwd=tmp_path)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    step = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    assert step["step"] == 1 and {"reward/exact_match", "reward/demo_length", "reward/demo_length/words"} <= set(step)

    evaluated = run_python("-m", "rlfactory_cli", "eval", "--env", "demo", "--model", str(run_dir), "--size", "2",
                           "--report", str(report), *settings, env=env_vars, cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    data = json.loads((report / "report.json").read_text())
    assert data["split"] == "test" and data["samples"] == 2
    assert {"eval/reward/exact_match", "eval/reward/demo_length"} <= set(data["metrics"])
