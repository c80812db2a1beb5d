"""Names that several plugins claim: refused under the plain name, reported on every plugin
involved whatever order they load in, and reachable as ``QUALIFIER:name``.

Through the real plugin manager, real entry-point discovery (distributions written into a
temporary directory on ``sys.path``, the way ``pip install --target`` leaves them) and the
real CLI, in process and in a subprocess."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlfactory_core import hookimpl, plugins
from rlfactory_core.errors import DuplicateComponentError, PluginError, RegistrationError, UnknownComponentError
from rlfactory_core.testing import registered_plugin, write_distribution

# A stray package that registers names first-party plugins have (the parser `qwen3`, the
# env `arithmetic`, the built-in tool `calculator`), one name nobody else has, and a
# reward named like the parser (another kind: no conflict).
INTRUDER = '''
from rlfactory_core import hookimpl
from rlfactory_core.types import EnvStep, ParsedTurn, RewardOutput


class Parser:
    name = "qwen3"

    def render_system_prompt(self, system_prompt, tools):
        return system_prompt

    def parse(self, text):
        return ParsedTurn(text=text, content="the intruder's parse")

    def render_tool_results(self, results):
        return []


class Env:
    name = "arithmetic"
    description = "not the arithmetic env"

    async def reset(self, sample):
        raise NotImplementedError

    async def step(self, state, turn, results):
        return EnvStep(done=True)

    async def close(self, state):
        pass


class Reward:
    name = "qwen3"
    description = "a reward named like a parser"

    async def score(self, trajectory, sample):
        return RewardOutput(value=0.0)


def calculator(expression: str) -> str:
    """Not the calculator."""
    return "0"


def intruder_echo(text: str) -> str:
    """Echo the text."""
    return text


@hookimpl
def rlfactory_register_parsers(register):
    register(Parser())


@hookimpl
def rlfactory_register_envs(register):
    register(Env)


@hookimpl
def rlfactory_register_tools(register):
    register(calculator)
    register(intruder_echo)


@hookimpl
def rlfactory_register_rewards(register):
    register(Reward)
'''

INTRUDER_DIST = "rlfactory-plugin-intruder"


@pytest.fixture
def intruder_dir(tmp_path, monkeypatch, plugin_manager):
    root = write_distribution(tmp_path / "intruder", INTRUDER_DIST, "intruder", "rlf_test_intruder", INTRUDER)
    monkeypatch.delitem(sys.modules, "rlf_test_intruder", raising=False)
    return root


def _load(monkeypatch, root: Path, first: bool) -> list[dict]:
    """Every plugin's row with ``root`` at the front or at the end of ``sys.path``."""
    base = [p for p in sys.path if p != str(root)]
    monkeypatch.setattr(sys, "path", [str(root), *base] if first else [*base, str(root)])
    names = [d.metadata["Name"] for d in importlib.metadata.distributions()]
    # the premise: the two orders really load the intruder before / after the first-party plugins
    assert (names.index(INTRUDER_DIST) < names.index("rlfactory-plugin-qwen3")) is first
    plugins.reset_plugins()
    return [info.to_dict() for info in plugins.plugin_infos()]


def test_a_name_two_plugins_register_is_reported_on_both_in_either_load_order(intruder_dir, monkeypatch):
    rows = _load(monkeypatch, intruder_dir, first=True)
    assert rows == _load(monkeypatch, intruder_dir, first=False)
    by_name = {row["name"]: row for row in rows}
    intruder, qwen3, arithmetic, tools = (by_name[n] for n in ("intruder", "qwen3", "arithmetic", "rlfactory.tools"))
    assert {row["status"] for row in (intruder, qwen3, arithmetic, tools)} == {"conflict"}
    assert [(c["kind"], c["name"], c["use"]) for c in intruder["conflicts"]] == [
        ("env", "arithmetic", "rlfactory-plugin-intruder:arithmetic"),
        ("parser", "qwen3", "rlfactory-plugin-intruder:qwen3"),
        ("tool", "calculator", "rlfactory-plugin-intruder:calculator")]
    [conflict] = qwen3["conflicts"]
    assert conflict["plugins"] == ["intruder", "qwen3"] and conflict["use"] == "rlfactory-plugin-qwen3:qwen3"
    assert "also registered by plugin 'intruder' (rlfactory-plugin-intruder)" in conflict["message"]
    assert [c["use"] for c in arithmetic["conflicts"]] == ["rlfactory-plugin-arithmetic:arithmetic"]
    assert [c["use"] for c in tools["conflicts"]] == ["rlfactory:calculator"]
    # the conflicting names stay listed as each plugin's components; nobody is "broken"
    assert qwen3["components"] == {"parser": ["qwen3"]} and not qwen3["problems"] and not intruder["problems"]
    assert intruder["components"] == {"env": ["arithmetic"], "parser": ["qwen3"], "reward": ["qwen3"],
                                      "tool": ["calculator", "intruder_echo"]}


def test_the_plain_name_is_refused_and_the_qualified_names_reach_each_one(intruder_dir, monkeypatch, rlf):
    from rlfactory_arithmetic import ArithmeticEnv
    from rlfactory_plugin_qwen3 import Qwen3Parser

    _load(monkeypatch, intruder_dir, first=True)
    with pytest.raises(DuplicateComponentError) as error:
        plugins.get_component("parser", "qwen3")
    text = str(error.value)
    assert "\n" not in text
    assert ("parser 'qwen3' is registered by plugin 'intruder' (rlfactory-plugin-intruder) and plugin 'qwen3' "
            "(rlfactory-plugin-qwen3); refusing to pick one" in text)
    assert "'rlfactory-plugin-intruder:qwen3' or 'rlfactory-plugin-qwen3:qwen3'" in error.value.hint
    assert "qwen3" not in plugins.components("parser") and "arithmetic" not in plugins.components("env")

    # the way out the error names: distribution (any spelling pip accepts) or plugin name
    for name in ("rlfactory-plugin-qwen3:qwen3", "rlfactory_plugin_qwen3:qwen3", "qwen3:qwen3"):
        assert isinstance(plugins.get_component("parser", name), Qwen3Parser)
    assert plugins.get_component("parser", "intruder:qwen3").parse("x").content == "the intruder's parse"
    assert plugins.get_component("env", "rlfactory-plugin-arithmetic:arithmetic") is ArithmeticEnv
    assert plugins.get_component("tool", "rlfactory:calculator").name == "calculator"

    # everything else of both plugins keeps working under its plain name
    assert plugins.get_component("tool", "intruder_echo").name == "intruder_echo"
    assert plugins.get_component("reward", "qwen3").name == "qwen3"  # another kind: no conflict
    assert plugins.get_component("reward", "arithmetic_verified")
    assert plugins.get_component("tool", "rlfactory-plugin-intruder:intruder_echo").name == "intruder_echo"

    with pytest.raises(UnknownComponentError, match=r"no parser 'qwen3' from 'nobody': it comes from plugin "
                                                    r"'intruder' .* and plugin 'qwen3' .*; write "):
        plugins.get_component("parser", "nobody:qwen3")
    # `rlf envs list` shows both envs, each under the name that reaches it
    code, out, _ = rlf("envs", "list", "--json")
    rows = [(row["name"], row["plugin"]) for row in json.loads(out) if "arithmetic" in row["name"]]
    assert code == 0 and rows == [("rlfactory-plugin-arithmetic:arithmetic", "arithmetic"),
                                  ("rlfactory-plugin-intruder:arithmetic", "intruder")]

    with pytest.raises(UnknownComponentError, match=r"no env named 'chess' \(available: .*"
                                                    r"rlfactory-plugin-arithmetic:arithmetic"):
        plugins.get_component("env", "chess")


def test_the_cli_shows_the_conflict_on_both_rows_the_same_in_either_order(intruder_dir):
    """`rlf plugins list` (table and --json) in subprocesses, the intruder's directory first
    on sys.path (PYTHONPATH) or last."""
    def rlf(*args: str, first: bool) -> str:
        where = "insert(0, d)" if first else "append(d)"
        code = f"import sys; d = sys.argv.pop(1); sys.path.{where}; from rlfactory_cli.app import main; main()"
        env = {k: v for k, v in os.environ.items() if k not in (plugins.LOAD_ENV, plugins.STRICT_ENV)}
        done = subprocess.run([sys.executable, "-c", code, str(intruder_dir), *args], capture_output=True, text=True,
                              env={**env, "COLUMNS": "200"}, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    table = rlf("plugins", "list", first=True)
    assert table == rlf("plugins", "list", first=False)
    rows = json.loads(rlf("plugins", "list", "--json", first=True))
    assert rows == json.loads(rlf("plugins", "list", "--json", first=False))
    assert {row["name"]: row["status"] for row in rows}["qwen3"] == "conflict"
    assert "parser: qwen3 (conflict)" in table
    assert ("conflict qwen3: parser 'qwen3' is also registered by plugin 'intruder' (rlfactory-plugin-intruder): "
            "neither is used under that name; this one is 'rlfactory-plugin-qwen3:qwen3'") in table
    assert ("conflict intruder: parser 'qwen3' is also registered by plugin 'qwen3' (rlfactory-plugin-qwen3): "
            "neither is used under that name; this one is 'rlfactory-plugin-intruder:qwen3'") in table


def test_rlf_train_names_the_way_out_and_accepts_it(intruder_dir, monkeypatch, rlf, tmp_path):
    from rlfactory_core.config import load_config
    from rlfactory_core.task import build_task

    monkeypatch.syspath_prepend(str(intruder_dir))
    code, out, err = rlf("train", "--env", "arithmetic", "--run-dir", str(tmp_path / "run"), "train.steps=1")
    assert code == 1 and not (tmp_path / "run").exists()
    assert "'rlfactory-plugin-arithmetic:arithmetic'" in err and "'rlfactory-plugin-qwen3:qwen3'" in err

    # qualified names in every place a component name goes, through a saved config.yaml and back
    # (what `rlf train --resume` reads)
    config = load_config([], ["env=rlfactory-plugin-arithmetic:arithmetic", "parser=rlfactory-plugin-qwen3:qwen3",
                              "rewards=[{name: 'rlfactory:exact_match'}]", "tool_manager.name=rlfactory:concurrent"])
    saved = tmp_path / "config.yaml"
    saved.write_text(__import__("yaml").safe_dump(config.model_dump(mode="json")))
    resumed = load_config([saved], ["train.steps=2"])
    assert (resumed.env, resumed.parser) == ("rlfactory-plugin-arithmetic:arithmetic", "rlfactory-plugin-qwen3:qwen3")
    task = build_task(resumed)
    assert type(task.env).__module__.startswith("rlfactory_arithmetic")
    assert type(task.parser).__name__ == "Qwen3Parser"
    assert [t.name for t in task.env.tools] == ["calculator"]


def test_two_distributions_with_one_entry_point_name_both_load(tmp_path, monkeypatch, plugin_manager):
    """An entry point named like a first-party one (`qwen3`) used to hide whichever came
    second on sys.path; now both load, named after their distributions, both marked."""
    root = write_distribution(tmp_path / "fake", "rlfactory-plugin-fakeqwen", "qwen3", "rlf_test_fakeqwen", """
        from rlfactory_core import hookimpl

        def fake_tool(text: str) -> str:
            \"\"\"Echo.\"\"\"
            return text

        @hookimpl
        def rlfactory_register_tools(register):
            register(fake_tool)
    """)
    monkeypatch.delitem(sys.modules, "rlf_test_fakeqwen", raising=False)
    rows = _load_fake(monkeypatch, root, first=True)
    assert rows == _load_fake(monkeypatch, root, first=False)
    real, fake = rows["rlfactory-plugin-qwen3:qwen3"], rows["rlfactory-plugin-fakeqwen:qwen3"]
    assert "qwen3" not in rows
    assert (real["status"], fake["status"]) == ("conflict", "conflict")
    assert real["components"] == {"parser": ["qwen3"]} and fake["components"] == {"tool": ["fake_tool"]}
    assert real["conflicts"][0]["message"] == (
        "entry point 'qwen3' is also declared by rlfactory-plugin-fakeqwen (loaded as plugin "
        "'rlfactory-plugin-fakeqwen:qwen3'); this one is loaded as plugin 'rlfactory-plugin-qwen3:qwen3'")
    assert plugins.get_component("parser", "qwen3").name == "qwen3"  # no component name is shared
    assert plugins.components("tool")["fake_tool"].plugin == "rlfactory-plugin-fakeqwen:qwen3"

    # the new name selects one, which, alone, keeps its entry point's name
    monkeypatch.setenv(plugins.LOAD_ENV, "rlfactory-plugin-fakeqwen:qwen3")
    plugins.reset_plugins()
    [info] = [i for i in plugins.plugin_infos() if not i.builtin]
    assert (info.name, info.distribution, info.status) == ("qwen3", "rlfactory-plugin-fakeqwen", "ok")


def test_an_entry_point_named_like_a_built_in_and_one_module_under_two_distributions(tmp_path, monkeypatch,
                                                                                      plugin_manager):
    root = write_distribution(tmp_path / "dists", "rlfactory-plugin-bbb", "rlfactory.tools", "rlf_test_shared", """
        from rlfactory_core import hookimpl

        def shared_tool(text: str) -> str:
            \"\"\"Echo.\"\"\"
            return text

        @hookimpl
        def rlfactory_register_tools(register):
            register(shared_tool)
    """)
    # the same module again, under another distribution (a renamed package's stale dist-info)
    write_distribution(root, "rlfactory-plugin-aaa", "shared", "rlf_test_shared_alias", "")
    (root / "rlf_test_shared_alias.py").unlink()
    (root / "rlfactory_plugin_aaa-0.1.0.dist-info" / "entry_points.txt").write_text("[rlfactory]\nshared = rlf_test_shared\n")
    monkeypatch.delitem(sys.modules, "rlf_test_shared", raising=False)
    rows = _load_fake(monkeypatch, root, first=True)
    assert rows == _load_fake(monkeypatch, root, first=False)
    # the built-in keeps its name; the entry point loads under its distribution's
    assert rows["rlfactory.tools"]["status"] == "ok" and rows["rlfactory.tools"]["builtin"]
    # one module is one plugin: the distribution first in name order has it, the other is told why
    assert rows["shared"]["components"] == {"tool": ["shared_tool"]} and rows["shared"]["status"] == "ok"
    other = rows["rlfactory-plugin-bbb:rlfactory.tools"]
    assert other["status"] == "broken" and other["conflicts"][0]["kind"] == "entry point"
    assert ("is the same module as plugin 'shared' (rlfactory-plugin-aaa): one package installed under two "
            "distribution names? uninstall one") in other["problems"][0]
    assert plugins.components("tool")["shared_tool"].plugin == "shared"


def test_a_qualifier_must_name_something(plugin_manager):
    class Echo:
        @hookimpl
        def rlfactory_register_tools(self, register):
            register(echo)

    with registered_plugin(Echo(), name="echoes"):
        assert plugins.get_component("tool", "echoes:echo").name == "echo"
        for name in (":echo", "rlfactory:echo"):
            with pytest.raises(UnknownComponentError, match="no tool 'echo' from"):
                plugins.get_component("tool", name)


def _load_fake(monkeypatch, root, first):
    base = [p for p in sys.path if p != str(root)]
    monkeypatch.setattr(sys, "path", [str(root), *base] if first else [*base, str(root)])
    plugins.reset_plugins()
    return {info.name: info.to_dict() for info in plugins.plugin_infos()}


def test_strict_mode_makes_a_conflict_fatal_naming_both(intruder_dir, monkeypatch, rlf):
    monkeypatch.syspath_prepend(str(intruder_dir))
    monkeypatch.setenv(plugins.STRICT_ENV, "1")
    monkeypatch.setenv(plugins.LOAD_ENV, "intruder,qwen3")
    plugins.reset_plugins()
    with pytest.raises(PluginError, match=r"parser 'qwen3' is registered by plugin 'intruder' .* and plugin 'qwen3'"):
        plugins.components("tool")
    code, out, err = rlf("plugins", "list")
    assert code == 1 and out == "" and "parser 'qwen3' is registered by" in err and "Traceback" not in err

    monkeypatch.setenv(plugins.LOAD_ENV, "qwen3")  # the same strict load without the intruder is clean
    plugins.reset_plugins()
    assert plugins.get_component("parser", "qwen3").name == "qwen3"


# -- one plugin's own mistakes -------------------------------------------------------------------


def echo(text: str) -> str:
    """Echo the text."""
    return text


class TwiceEcho:
    @hookimpl
    def rlfactory_register_tools(self, register):
        register(echo)
        register(echo)

    @hookimpl
    def rlfactory_register_rewards(self, register):
        class Never:
            name = "never"
            description = "0 always"

            def score(self, trajectory, sample):
                return 0.0

        register(Never)


def test_a_plugin_registering_a_name_twice_is_broken_and_lands_nothing(plugin_manager):
    with registered_plugin(TwiceEcho(), name="twice"):
        info = {i.name: i for i in plugins.plugin_infos()}["twice"]
        assert info.status == "broken" and not info.conflicts
        assert "DuplicateComponentError: plugin 'twice' registers tool 'echo' twice" in info.problems[0]
        assert "echo" not in plugins.components("tool") and "never" not in plugins.components("reward")
        assert info.components == {}


def test_a_hook_raising_after_some_registrations_lands_none_of_the_plugins_components(plugin_manager):
    class HalfBroken:
        @hookimpl
        def rlfactory_register_tools(self, register):
            register(echo)

        @hookimpl
        def rlfactory_register_parsers(self, register):
            raise RuntimeError("model family table not found")

        @hookimpl
        def rlfactory_on_train_start(self, config):
            return "shaped by a half-initialised plugin"

    with registered_plugin(HalfBroken(), name="half"):
        # its observers are never called either, even before any registry was used
        assert plugins.notify("rlfactory_on_train_start", config={}) == []
        info = {i.name: i for i in plugins.plugin_infos()}["half"]
        assert "RuntimeError: model family table not found" in info.problems[0]
        # the tool hook ran fine, but a plugin is skipped whole, as when it fails to import
        assert "echo" not in plugins.components("tool") and info.components == {}


def test_a_broken_plugin_takes_no_part_in_conflicts(plugin_manager):
    class BrokenShadow:
        @hookimpl
        def rlfactory_register_tools(self, register):
            def calculator(expression: str) -> str:
                """Not the calculator."""
                return "0"

            register(calculator)
            raise RuntimeError("half-initialised")

    with registered_plugin(BrokenShadow(), name="broken-shadow"):
        assert plugins.components("tool")["calculator"].plugin == "rlfactory.tools"
        assert {i.name: i for i in plugins.plugin_infos()}["rlfactory.tools"].status == "ok"


def test_component_names_cannot_hold_the_qualifier_separator(plugin_manager):
    class Colon:
        @hookimpl
        def rlfactory_register_tools(self, register):
            def tool(text: str) -> str:
                """Echo."""
                return text

            tool.__name__ = "server:tool"
            with pytest.raises(RegistrationError, match="contains ':'"):
                register(tool)
            register(echo)

    with registered_plugin(Colon(), name="colon"):
        assert plugins.components("tool")["echo"].plugin == "colon"


def test_a_run_time_plugin_cannot_take_a_loaded_plugins_name(plugin_manager):
    with pytest.raises(PluginError, match="a plugin named 'qwen3' is already loaded"):
        plugins.add_plugin(TwiceEcho(), "qwen3")
    [info] = [i for i in plugins.plugin_infos() if i.name == "qwen3"]
    assert info.status == "ok" and info.components == {"parser": ["qwen3"]}


def test_a_run_time_plugin_in_conflict_is_named_by_its_plugin_name(plugin_manager):
    class Shadow:
        @hookimpl
        def rlfactory_register_rewards(self, register):
            class ExactMatch:
                name = "exact_match"
                description = "a second exact_match"

                def score(self, trajectory, sample):
                    return 1.0

            register(ExactMatch)

    with registered_plugin(Shadow(), name="shadow"):
        with pytest.raises(DuplicateComponentError) as error:
            plugins.get_component("reward", "exact_match")
        assert "'rlfactory:exact_match' or 'shadow:exact_match'" in error.value.hint
        assert plugins.get_component("reward", "shadow:exact_match").description == "a second exact_match"
        assert plugins.get_component("reward", "rlfactory:exact_match").name == "exact_match"


@pytest.mark.slow
def test_a_run_with_qualified_names_trains_and_resumes(tmp_path, intruder_dir, monkeypatch, tiny_model_dir):
    """The intruder takes the names a default arithmetic run uses; the run names the ones it
    means, and its saved config.yaml carries them into the resumed run."""
    from rlfactory_core.config import load_config
    from rlfactory_core.testing import train

    monkeypatch.syspath_prepend(str(intruder_dir))
    plugins.reset_plugins()
    run_dir = tmp_path / "run"
    small = ["backend=hf", f"model.name={tiny_model_dir}", "grpo.prompts_per_step=1", "grpo.group_size=2",
             "data.eval_size=2", "eval.every=0", "eval.save_samples=0", "checkpoint.every=1", "rollout.max_turns=1",
             "rollout.max_tokens_per_turn=8", "logging.live=off", "logging.tensorboard=false"]
    names = ["env=rlfactory-plugin-arithmetic:arithmetic", "parser=rlfactory-plugin-qwen3:qwen3",
             "rewards=[{name: 'rlfactory:exact_match'}]"]
    assert train(load_config([], [*small, *names, "train.steps=1", f"run_dir={run_dir}"])) == run_dir
    train(load_config([run_dir / "config.yaml"], ["train.steps=2"]), resume=run_dir)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train/loss" in r] == [1, 2]
    assert load_config([run_dir / "config.yaml"]).parser == "rlfactory-plugin-qwen3:qwen3"


def test_a_plugin_named_like_a_distribution_does_not_shadow_its_qualified_names(plugin_manager):
    """A qualifier names a distribution first: a stray plugin whose entry point is called
    ``rlfactory`` and registers ``calculator`` leaves ``rlfactory:calculator`` (which the
    arithmetic env asks for in code) meaning the built-in."""
    from rlfactory_core.default_plugins.tools import calculator as builtin

    def calculator(expression: str) -> str:
        """Not the built-in calculator."""
        return "0"

    class Stray:
        @hookimpl
        def rlfactory_register_tools(self, register):
            register(calculator)

    with registered_plugin(Stray(), name="rlfactory"):
        assert plugins.get_component("tool", "rlfactory:calculator").fn is builtin
