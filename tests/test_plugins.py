"""The plugin system through the real plugin manager and real entry-point discovery."""

from __future__ import annotations

import json

import pytest

from rlfactory_core import PLUGIN_API_VERSION, hookimpl, plugins
from rlfactory_core.errors import DuplicateComponentError, PluginError, RegistrationError, UnknownComponentError
from rlfactory_core.testing import registered_plugin, write_distribution
from rlfactory_core.types import EnvReset, EnvStep, Message, ParsedTurn, RewardOutput, ToolCall, ToolResult, Trajectory


def install_fake_distribution(monkeypatch, root, dist_name, entry_point, module_name, source):
    """A real installed distribution (dist-info + module on sys.path) declaring an entry point."""
    write_distribution(root, dist_name, entry_point, module_name, source)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(__import__("sys").modules, module_name, raising=False)


GOOD_PLUGIN = """
from rlfactory_core import hookimpl

def shout(text: str) -> str:
    \"\"\"Upper-case the text.\"\"\"
    return text.upper()

@hookimpl
def rlfactory_register_tools(register):
    register(shout)
"""


@pytest.fixture
def good_plugin(tmp_path, monkeypatch, plugin_manager):
    install_fake_distribution(monkeypatch, tmp_path, "rlfactory-plugin-good", "good", "rlf_test_good", GOOD_PLUGIN)
    plugins.reset_plugins()
    return "good"


# -- components used by the registration tests --------------------------------------------


class EchoParser:
    name = "echo"

    def render_system_prompt(self, system_prompt, tools):
        return system_prompt + "\nTools: " + ", ".join(t.name for t in tools)

    def parse(self, text):
        return ParsedTurn(text=text, content=text)

    def render_tool_results(self, results):
        return [Message(role="user", content=r.content) for r in results]


class OneTurnEnv:
    name = "one_turn"
    description = "Ask the question once; the first reply is the answer."

    async def reset(self, sample):
        return EnvReset(messages=[Message(role="user", content=sample["question"])], state={"turns": 0})

    async def step(self, state, turn, results):
        state["turns"] += 1
        return EnvStep(done=True, final_answer=turn.content)

    async def close(self, state):
        state["closed"] = True


class SerialToolManager:
    name = "serial"
    description = "Runs calls one after another."

    def __init__(self, tools):
        self.tools = {t.name: t for t in tools}

    async def call(self, calls, ctx=None):
        return [await self.tools[c.name].call(c.arguments, ctx) for c in calls]

    async def close(self):
        pass


class LengthReward:
    name = "short_answer"
    description = "1 for answers of at most 5 words."

    async def score(self, trajectory, sample):
        return RewardOutput(value=float(len((trajectory.final_answer or "").split()) <= 5))


class EveryKindPlugin:
    @hookimpl
    def rlfactory_register_tools(self, register):
        def reverse(text: str) -> str:
            """Reverse the text."""
            return text[::-1]

        register(reverse)

    @hookimpl
    def rlfactory_register_parsers(self, register):
        register(EchoParser())

    @hookimpl
    def rlfactory_register_envs(self, register):
        register(OneTurnEnv)

    @hookimpl
    def rlfactory_register_tool_managers(self, register):
        register(SerialToolManager)

    @hookimpl
    def rlfactory_register_rewards(self, register):
        register(LengthReward)


# -- registration hooks -------------------------------------------------------------------


def test_builtins_register_through_the_plugin_manager(plugin_manager):
    tool = plugins.components("tool")["calculator"]
    assert tool.plugin == "rlfactory.tools"
    assert plugins.components("tool_manager")["concurrent"].plugin == "rlfactory.tool_managers"
    assert plugins.components("reward")["exact_match"].plugin == "rlfactory.rewards"
    infos = {info.name: info for info in plugins.plugin_infos()}
    assert infos["rlfactory.tools"].builtin and infos["rlfactory.tools"].status == "ok"
    assert infos["rlfactory.tools"].components == {"tool": ["calculator"]}


async def test_register_tools_hook_makes_a_callable_tool(plugin_manager):
    with registered_plugin(EveryKindPlugin(), name="every-kind"):
        component = plugins.components("tool")["reverse"]
        assert component.plugin == "every-kind"
        result = await component.obj.call({"text": "abc"})
        assert result.content == "cba"


def test_register_parsers_hook(plugin_manager):
    with registered_plugin(EveryKindPlugin(), name="every-kind"):
        parser = plugins.get_component("parser", "echo")
        assert parser.parse("hi").content == "hi"
        assert plugins.components("parser")["echo"].plugin == "every-kind"


async def test_register_envs_hook(plugin_manager):
    with registered_plugin(EveryKindPlugin(), name="every-kind"):
        env = plugins.get_component("env", "one_turn")()
        reset = await env.reset({"question": "2+2?"})
        step = await env.step(reset.state, ParsedTurn(text="4", content="4"), [])
        await env.close(reset.state)
        assert step.done and step.final_answer == "4" and reset.state["closed"]


async def test_register_tool_managers_hook(plugin_manager):
    with registered_plugin(EveryKindPlugin(), name="every-kind"):
        manager_cls = plugins.get_component("tool_manager", "serial")
        manager = manager_cls([plugins.get_component("tool", "calculator")])
        [result] = await manager.call([ToolCall(name="calculator", arguments={"expression": "6*7"})])
        assert result.content == "42"


async def test_register_rewards_hook(plugin_manager):
    with registered_plugin(EveryKindPlugin(), name="every-kind"):
        reward = plugins.get_component("reward", "short_answer")()
        out = await reward.score(Trajectory(sample_id="s", prompt_ids=[], final_answer="Paris"), {})
        assert out.value == 1.0


def test_register_rejects_objects_that_do_not_fit_and_names_what_is_missing(plugin_manager):
    class NotAReward:
        name = "bad"
        description = "no score method"

    class BadPlugin:
        @hookimpl
        def rlfactory_register_rewards(self, register):
            with pytest.raises(RegistrationError, match="missing method 'score'") as info:
                register(NotAReward)
            assert isinstance(info.value, TypeError)
            with pytest.raises(RegistrationError, match="must be a class"):
                register(LengthReward())
            register(NotAReward)  # let the error escape: the plugin is reported broken

    with registered_plugin(BadPlugin(), name="bad-rewards"):
        rewards = plugins.components("reward")
        assert "exact_match" in rewards and "bad" not in rewards
        info = {i.name: i for i in plugins.plugin_infos()}["bad-rewards"]
        assert info.status == "broken" and "missing method 'score'" in info.problems[0]


def test_a_plugins_registrations_land_together_or_not_at_all(plugin_manager):
    class HalfBroken:
        @hookimpl
        def rlfactory_register_parsers(self, register):
            register(EchoParser())
            raise RuntimeError("database not reachable")

    with registered_plugin(HalfBroken(), name="half"):
        assert "echo" not in plugins.components("parser")
        info = {i.name: i for i in plugins.plugin_infos()}["half"]
        assert "RuntimeError: database not reachable" in info.problems[0]


def test_duplicate_names_are_refused_naming_both_plugins(plugin_manager):
    # More in test_plugin_conflicts.py: load order, the CLI, entry-point names, strict mode.
    class Second:
        @hookimpl
        def rlfactory_register_tools(self, register):
            def calculator(expression: str) -> str:
                """A shadowing calculator."""
                return "0"

            register(calculator)

    with registered_plugin(Second(), name="shadow"):
        assert "calculator" not in plugins.components("tool")
        with pytest.raises(DuplicateComponentError) as error:
            plugins.get_component("tool", "calculator")
        assert "'rlfactory.tools'" in str(error.value) and "'shadow'" in str(error.value)
        infos = {i.name: i for i in plugins.plugin_infos()}
        assert infos["shadow"].status == infos["rlfactory.tools"].status == "conflict"
        assert infos["shadow"].conflicts[0].message == (
            "tool 'calculator' is also registered by plugin 'rlfactory.tools' (rlfactory): neither is used under "
            "that name; this one is 'shadow:calculator'")
        assert plugins.get_component("tool", "rlfactory:calculator") is plugins.all_components("tool")[0].obj


def test_unknown_component_lists_what_is_available(plugin_manager):
    with pytest.raises(UnknownComponentError, match=r"no env named 'chess' \(available: .*arithmetic"):
        plugins.get_component("env", "chess")


# -- discovery through entry points --------------------------------------------------------


def test_entry_point_plugin_is_discovered(good_plugin):
    component = plugins.components("tool")["shout"]
    assert component.plugin == "good"
    info = {i.name: i for i in plugins.plugin_infos()}["good"]
    assert (info.distribution, info.version, info.status) == ("rlfactory-plugin-good", "0.1.0", "ok")
    assert info.hooks == ["rlfactory_register_tools"]


def test_plugin_that_fails_to_import_is_reported_and_others_work(tmp_path, monkeypatch, good_plugin, rlf):
    install_fake_distribution(monkeypatch, tmp_path, "rlfactory-plugin-broken", "broken", "rlf_test_broken",
                              "import a_module_that_does_not_exist\n")
    plugins.reset_plugins()
    infos = {i.name: i for i in plugins.plugin_infos()}
    assert infos["broken"].status == "broken"
    assert "ModuleNotFoundError" in infos["broken"].problems[0]
    assert "shout" in plugins.components("tool")

    code, out, err = rlf("plugins", "list", "--json")
    assert code == 0
    rows = {row["name"]: row for row in json.loads(out)}
    assert rows["broken"]["status"] == "broken" and rows["good"]["status"] == "ok"
    assert "broken" in err  # the warning reaches stderr, not the JSON on stdout

    code, out, _ = rlf("plugins", "list")
    assert code == 0 and "broken" in out and "a_module_that_does_not_exist" in out


def test_plugin_whose_hook_raises_is_reported(tmp_path, monkeypatch, good_plugin, rlf):
    install_fake_distribution(monkeypatch, tmp_path, "rlfactory-plugin-raises", "raises", "rlf_test_raises", """
        from rlfactory_core import hookimpl

        @hookimpl
        def rlfactory_register_envs(register):
            raise ValueError("config file missing")
    """)
    code, out, _ = rlf("plugins", "list", "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    assert code == 0
    assert rows["raises"]["status"] == "broken"
    assert "ValueError: config file missing" in rows["raises"]["problems"][0]
    assert rows["good"]["components"] == {"tool": ["shout"]}


def test_a_plugins_text_is_shown_literally_not_as_markup(tmp_path, monkeypatch, plugin_manager, rlf):
    # rich markup in a plugin's error ("[/]" closes nothing) used to crash `rlf plugins list`
    install_fake_distribution(monkeypatch, tmp_path, "rlfactory-plugin-markup", "markup[bold]", "rlf_test_markup", """
        from rlfactory_core import hookimpl

        @hookimpl
        def rlfactory_register_tools(register):
            raise ValueError("expected [/] or [red]x[/red]")
    """)
    code, out, err = rlf("plugins", "list")
    assert code == 0, err
    assert "broken markup[bold]: rlfactory_register_tools failed: ValueError: expected [/] or [red]x[/red]" in out


def test_strict_mode_makes_broken_plugins_fatal(tmp_path, monkeypatch, plugin_manager, rlf):
    install_fake_distribution(monkeypatch, tmp_path, "rlfactory-plugin-broken2", "broken2", "rlf_test_broken2",
                              "raise ImportError('missing optional dependency foo')\n")
    monkeypatch.setenv(plugins.STRICT_ENV, "1")
    plugins.reset_plugins()
    with pytest.raises(PluginError, match="missing optional dependency foo"):
        plugins.get_plugin_manager()
    code, out, err = rlf("plugins", "list")
    assert code == 1 and out == ""
    assert "Error:" in err and "broken2" in err and "Traceback" not in err


def test_load_plugins_env_limits_which_plugins_load(good_plugin, monkeypatch):
    monkeypatch.setenv(plugins.LOAD_ENV, "")
    plugins.reset_plugins()
    assert "shout" not in plugins.components("tool")
    assert "calculator" in plugins.components("tool")  # built-ins always load

    monkeypatch.setenv(plugins.LOAD_ENV, "rlfactory-plugin-good")  # distribution names work too
    plugins.reset_plugins()
    assert "shout" in plugins.components("tool")


def _plugin_declaring(api_range: str) -> str:
    return f"rlfactory_api = {api_range!r}\n" + GOOD_PLUGIN.replace("shout", "whisper")


@pytest.mark.parametrize(("api_range", "fix"), [(">=99", "upgrade rlfactory"), ("<1.0", "upgrade the plugin")])
def test_a_plugin_for_another_plugin_api_is_reported_and_others_work(tmp_path, monkeypatch, good_plugin, rlf,
                                                                      api_range, fix):
    install_fake_distribution(monkeypatch, tmp_path, "rlfactory-plugin-future", "future", "rlf_test_future",
                              _plugin_declaring(api_range))
    code, out, err = rlf("plugins", "list", "--json")
    assert code == 0
    rows = {row["name"]: row for row in json.loads(out)}
    assert rows["future"]["status"] == "broken" and rows["future"]["hooks"] == []
    [problem] = rows["future"]["problems"]
    assert problem.startswith(f"needs plugin API {api_range!r} but rlfactory ")
    assert f"provides plugin API {PLUGIN_API_VERSION}: {fix}" in problem
    assert "plugin 'future' is broken" in err  # the warning names the plugin
    assert rows["good"]["status"] == "ok" and "shout" in plugins.components("tool")
    assert "whisper" not in plugins.components("tool")

    monkeypatch.setenv(plugins.STRICT_ENV, "1")
    plugins.reset_plugins()
    with pytest.raises(PluginError, match=r"plugin 'future': needs plugin API"):
        plugins.get_plugin_manager()


def test_a_plugin_whose_range_admits_the_running_api_loads(tmp_path, monkeypatch, plugin_manager):
    install_fake_distribution(monkeypatch, tmp_path, "rlfactory-plugin-current", "current", "rlf_test_current",
                              _plugin_declaring(f">={PLUGIN_API_VERSION},<{int(PLUGIN_API_VERSION.split('.')[0]) + 1}"))
    plugins.reset_plugins()
    assert {i.name: i for i in plugins.plugin_infos()}["current"].status == "ok"
    assert plugins.components("tool")["whisper"].plugin == "current"


def test_a_plugin_added_at_run_time_is_held_to_its_declared_range(plugin_manager):
    class Future:
        rlfactory_api = ">=2"

        @hookimpl
        def rlfactory_register_tools(self, register):
            register(lambda: None)

    info = plugins.add_plugin(Future(), name="future-object")
    assert info.status == "broken" and "needs plugin API '>=2'" in info.problems[0]
    assert not plugin_manager.has_plugin("future-object")


def test_unknown_hooks_and_wrappers_are_reported(plugin_manager):
    class Typo:
        @hookimpl
        def rlfactory_register_tool(self, register):  # missing the final "s"
            pass

    class Wrapper:
        @hookimpl(wrapper=True)
        def rlfactory_on_train_start(self, config):
            return (yield)

    plugins.add_plugin(Typo(), "typo")
    plugins.add_plugin(Wrapper(), "wrapper")
    infos = {i.name: i for i in plugins.plugin_infos()}
    assert "unknown hook 'rlfactory_register_tool'" in infos["typo"].problems[0]
    assert "wrapper" in infos["wrapper"].problems[0]
    assert not plugin_manager.is_registered(Typo) and plugins.notify("rlfactory_on_train_start", config={}) == []


# -- observer hooks -------------------------------------------------------------------------


class Recorder:
    def __init__(self):
        self.calls = []

    @hookimpl
    def rlfactory_on_env_step(self, trajectory, step):  # a subset of the parameters is enough
        self.calls.append(("env_step", trajectory.sample_id, step.done))
        return 0.5

    @hookimpl
    def rlfactory_on_trajectory_end(self, trajectory, sample):
        self.calls.append(("trajectory_end", trajectory.stop_reason, sample["id"]))

    @hookimpl
    def rlfactory_on_train_start(self, config):
        self.calls.append(("train_start", config["lr"]))

    @hookimpl
    def rlfactory_on_train_step_end(self, step, metrics):
        self.calls.append(("train_step_end", step, metrics["loss"]))

    @hookimpl
    def rlfactory_on_train_end(self, step, metrics):
        self.calls.append(("train_end", step))


class RaisingObserver:
    @hookimpl
    def rlfactory_on_env_step(self, trajectory, turn, results, step):
        raise RuntimeError("logger offline")


def _env_step_kwargs():
    return dict(
        trajectory=Trajectory(sample_id="q1", prompt_ids=[1, 2]),
        turn=ParsedTurn(text="hi"),
        results=[ToolResult(name="calculator", content="4")],
        step=EnvStep(done=True),
    )


def test_on_env_step_collects_shaping_rewards_and_isolates_failures(plugin_manager):
    recorder = Recorder()
    plugins.add_plugin(recorder, "recorder")
    plugins.add_plugin(RaisingObserver(), "raising")
    assert plugins.notify("rlfactory_on_env_step", **_env_step_kwargs()) == [0.5]
    assert recorder.calls == [("env_step", "q1", True)]
    info = {i.name: i for i in plugins.plugin_infos()}["raising"]
    assert "RuntimeError: logger offline" in info.problems[0]


def test_raising_observer_is_fatal_in_strict_mode(plugin_manager, monkeypatch):
    plugins.add_plugin(RaisingObserver(), "raising")
    monkeypatch.setenv(plugins.STRICT_ENV, "1")
    with pytest.raises(PluginError, match="logger offline"):
        plugins.notify("rlfactory_on_env_step", **_env_step_kwargs())


def test_on_trajectory_end(plugin_manager):
    recorder = Recorder()
    plugins.add_plugin(recorder, "recorder")
    trajectory = Trajectory(sample_id="q1", prompt_ids=[], stop_reason="answer")
    plugins.notify("rlfactory_on_trajectory_end", trajectory=trajectory, sample={"id": "q1"})
    assert recorder.calls == [("trajectory_end", "answer", "q1")]


def test_training_observers(plugin_manager):
    recorder = Recorder()
    plugins.add_plugin(recorder, "recorder")
    plugins.notify("rlfactory_on_train_start", config={"lr": 1e-6})
    plugins.notify("rlfactory_on_train_step_end", step=1, metrics={"loss": 0.25})
    plugins.notify("rlfactory_on_train_end", step=1, metrics={"loss": 0.25})
    assert recorder.calls == [("train_start", 1e-6), ("train_step_end", 1, 0.25), ("train_end", 1)]


# -- CLI commands from plugins ----------------------------------------------------------------


def test_plugins_add_cli_commands_and_a_raising_one_does_not_break_the_cli(tmp_path, monkeypatch, plugin_manager, rlf):
    install_fake_distribution(monkeypatch, tmp_path, "rlfactory-plugin-hello", "hello", "rlf_test_hello", """
        import typer
        from rlfactory_core import hookimpl

        @hookimpl
        def rlfactory_register_commands(app):
            @app.command("hello-plugin")
            def hello(name: str = "world"):
                \"\"\"Say hello.\"\"\"
                typer.echo(f"hello {name}")
    """)
    (tmp_path / "cmd_broken").mkdir()
    install_fake_distribution(monkeypatch, tmp_path / "cmd_broken", "rlfactory-plugin-cmdbroken", "cmdbroken",
                              "rlf_test_cmdbroken", """
        from rlfactory_core import hookimpl

        @hookimpl
        def rlfactory_register_commands(app):
            raise RuntimeError("cannot add commands")
    """)
    code, out, err = rlf("hello-plugin", "--name", "RL")
    assert (code, out) == (0, "hello RL\n")
    assert "cmdbroken" in err and "cannot add commands" in err
    code, out, _ = rlf("envs", "list")
    assert code == 0


def test_plugins_list_shows_installed_plugins_and_all_adds_the_builtins(rlf):
    code, out, _ = rlf("plugins", "list")
    assert code == 0 and "qwen3" in out and "parser: qwen3" in out
    assert "built-in plugins of rlfactory: `rlf plugins list --all` shows them" in out
    code, out, _ = rlf("plugins", "list", "--all", "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    assert rows["qwen3"]["status"] == "ok" and rows["qwen3"]["components"] == {"parser": ["qwen3"]}
    assert {"rlfactory.tools", "rlfactory.tool_managers", "rlfactory.rewards"} <= set(rows)
    assert all(rows[name]["builtin"] for name in ("rlfactory.tools", "rlfactory.rewards"))
    # The arithmetic env is not in the core: `make install` installs its contrib plugin by default.
    assert (rows["arithmetic"]["distribution"], rows["arithmetic"]["builtin"]) == ("rlfactory-plugin-arithmetic", False)
    assert rows["arithmetic"]["components"] == {"env": ["arithmetic"], "reward": ["arithmetic_verified"]}


def test_version_and_errors_are_one_line(rlf):
    from rlfactory_core import __version__

    assert rlf("--version") == (0, f"rlf {__version__}\n", "")
    code, out, err = rlf("models", "prepare", "./no-such-model")
    assert code == 1 and out == ""
    assert err.startswith("Error: ") and "Traceback" not in err and len(err.strip().splitlines()) <= 2
