"""The New-run page's back end (cli/rlfactory_cli/ui/new_run.py): the form generated from the
run schema, what is installed, validation by rlf train's own checks, the YAML export and the
MCP tool listing (a real server from PyPI, mcp-server-time). No model is loaded."""

from __future__ import annotations

import json
import sys

import psutil
import pydantic
import pytest

from rlfactory_cli.ui import new_run
from rlfactory_core import hookimpl
from rlfactory_core.config import RunConfig, describe, load_config
from rlfactory_core.models import DEFAULT_MODEL
from rlfactory_core.preflight import checked_config

TIME_SERVER = {"command": sys.executable, "args": ["-m", "mcp_server_time"]}


def _has(field: dict, **expected) -> bool:
    """Whether ``field`` holds every item of ``expected``."""
    return {key: field.get(key) for key in expected} == expected


# --------------------------------------------------------------------------- the form


def test_the_form_has_a_field_for_every_setting_of_the_run_schema():
    form = new_run.form_schema()
    json.dumps(form)  # the route returns it as it is
    leaves = [key for key, _, _ in describe() if key not in new_run.NOT_OFFERED]  # run_dir: Launch refuses it
    assert set(leaves) <= set(form["fields"])
    assert set(form["fields"]) - set(leaves) == {"preset"}  # a config-file key, not a schema one
    # In the schema's order, each key in exactly one group.
    assert [key for key in form["fields"] if key != "preset"] == leaves
    grouped = [key for group in form["groups"] for key in group["keys"]]
    assert sorted(grouped) == sorted(form["fields"])
    for key, field in form["fields"].items():
        assert field["key"] == key
        assert field["type"] in {"int", "float", "bool", "str", "enum", "list", "dict", "json"}, key


def test_main_settings_come_first_and_the_sections_follow_collapsed_in_schema_order():
    form = new_run.form_schema()
    main, *rest = form["groups"]
    assert main["name"] == "main" and not main["collapsed"]
    assert main["keys"] == list(new_run.MAIN_SETTINGS) == form["main"]
    assert all(form["fields"][key]["group"] == "main" for key in main["keys"])
    assert all(group["collapsed"] for group in rest)
    names = [group["name"] for group in rest]
    assert names[0] == "general"
    assert names.index("model") < names.index("model.lora") < names.index("rollout") < names.index("grpo") \
        < names.index("train") < names.index("logging")
    grpo = next(group for group in rest if group["name"] == "grpo")
    assert "grpo.clip_high" in grpo["keys"] and "grpo.group_size" not in grpo["keys"]  # shown once, in main


def test_fields_carry_type_default_description_constraints_and_choices():
    fields = new_run.form_schema()["fields"]
    assert _has(fields["grpo.group_size"], type="int", default=4, section="grpo", nullable=False,
                constraints={"ge": 2}, description="trajectories per prompt (the GRPO group)")
    assert fields["train.lr"]["type"] == "float" and fields["train.lr"]["constraints"] == {"gt": 0}
    assert fields["grpo.clip_low"]["constraints"] == {"ge": 0, "lt": 1}
    assert fields["logging.tensorboard"]["type"] == "bool"
    assert fields["grpo.advantage_norm"]["type"] == "enum"
    assert fields["grpo.advantage_norm"]["choices"] == ["group", "batch", "none"]
    assert fields["train.bf16"]["choices"] == ["auto", True, False]
    assert _has(fields["data.train_size"], type="int", nullable=True, default=None, constraints={"ge": 1})
    assert fields["env_options"]["type"] == "dict" and fields["env_options"]["default"] == {}
    assert fields["train.betas"]["type"] == "list" and fields["train.betas"]["items"]["type"] == "float"
    assert fields["model.lora.target_modules"]["type"] == "json"  # a list of names or 'all-linear'
    assert fields["model.name"]["default"] == DEFAULT_MODEL and fields["model.name"]["component"] == "models"
    assert fields["env"]["component"] == "envs" and fields["parser"]["component"] == "parsers"
    rewards = fields["rewards"]
    assert rewards["type"] == "list" and rewards["items"]["type"] == "object"
    assert rewards["items"]["fields"]["name"]["required"] and rewards["items"]["fields"]["weight"]["type"] == "float"
    assert rewards["default"] == [RunConfig().model_dump(mode="json")["rewards"][0]]
    assert fields["preset"]["choices"] == ["cpu-smoke", "gpu"]


def test_defaults_follow_the_env_and_preset_a_run_would_use():
    form = new_run.form_schema(env="deepsearch", preset="cpu-smoke")
    fields = form["fields"]
    assert form["defaults_for"] == {"env": "deepsearch", "preset": "cpu-smoke"}
    assert fields["env"]["default"] == "deepsearch" and fields["preset"]["default"] == "cpu-smoke"
    assert fields["parser"]["default"] == "search_r1"  # the env's config_defaults
    assert [r["name"] for r in fields["rewards"]["default"]] == ["search_r1"]
    assert fields["rollout.max_turns"]["default"] == 3  # the preset over the env's 4, as in rlf train
    assert fields["train.lr"]["default"] == 1e-5 and fields["grpo.dynamic_sampling"]["default"] is True
    assert form["presets"]["gpu"]["backend_options"] == {"gpu_memory_utilization": 0.4}  # a mapping kept whole
    unknown = new_run.form_schema(env="no-such-env", preset="no-such-preset")  # validate() says why
    assert unknown["defaults_for"] == {"env": "arithmetic", "preset": None}
    assert unknown["fields"]["parser"]["default"] == "qwen3" and unknown["fields"]["env"]["default"] == "arithmetic"
    assert new_run.form_schema(env="no-such-env")["fields"]["rewards"]["default"][0]["name"] == "exact_match"


class _Widget(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    size: int = pydantic.Field(3, ge=1, description="how big")
    mode: str = pydantic.Field("fast", description="how")


class _LaterRunConfig(RunConfig):
    knob: float = pydantic.Field(0.5, le=1, description="a setting added later")
    widget: _Widget = pydantic.Field(default_factory=_Widget, description="a section added later")


def test_settings_added_to_the_schema_later_appear_with_no_change(monkeypatch):
    monkeypatch.setattr(new_run, "RunConfig", _LaterRunConfig)
    form = new_run.form_schema()
    assert _has(form["fields"]["knob"], type="float", default=0.5, constraints={"le": 1}, group="general",
                description="a setting added later")
    assert _has(form["fields"]["widget.size"], type="int", default=3, section="widget", constraints={"ge": 1})
    widget = next(group for group in form["groups"] if group["name"] == "widget")
    assert widget["keys"] == ["widget.size", "widget.mode"] and widget["description"] == "a section added later"


# --------------------------------------------------------------------------- what is installed


def test_choices_list_the_installed_components_with_their_plugins(plugin_manager):
    found = new_run.choices()
    json.dumps(found)
    envs = {env["name"]: env for env in found["envs"]}
    assert {"arithmetic", "deepsearch", "mcp"} <= set(envs)
    assert envs["deepsearch"]["distribution"] == "rlfactory-plugin-deepsearch"
    assert envs["deepsearch"]["parser"] == "search_r1" and envs["deepsearch"]["rewards"] == ["search_r1"]
    assert envs["arithmetic"]["rewards"] == ["exact_match"] and envs["arithmetic"]["description"]
    assert {"mcp_config", "data", "servers", "tools"} <= {option["name"] for option in envs["mcp"]["options"]}
    managers = {m["name"]: m for m in found["tool_managers"]}
    assert managers["concurrent"]["distribution"] == "rlfactory"
    assert "timeout_s" in [o["name"] for o in managers["concurrent"]["options"]]
    assert "tools" not in [o["name"] for o in managers["concurrent"]["options"]]  # passed by the run
    assert {"exact_match", "f1", "search_r1"} <= {r["name"] for r in found["rewards"]}
    assert {"qwen3", "search_r1"} <= {p["name"] for p in found["parsers"]}
    calculator = next(t for t in found["tools"] if t["name"] == "calculator")
    assert calculator["plugin"] == "rlfactory.tools" and calculator["parameters"]["type"] == "object"
    assert found["models"]["default"] == DEFAULT_MODEL
    assert DEFAULT_MODEL in [m["name"] for m in found["models"]["available"]]
    assert found["presets"] == ["cpu-smoke", "gpu"] and found["errors"] == []


class _BrokenPlugin:
    @hookimpl
    def rlfactory_register_rewards(self, register):
        raise RuntimeError("cannot reach its judge")


def test_a_broken_plugin_is_an_error_row_not_a_broken_list(plugin_manager):
    plugin_manager.register(_BrokenPlugin(), name="broken-judge")
    found = new_run.choices()
    assert [e["plugin"] for e in found["errors"]] == ["broken-judge"]
    assert "cannot reach its judge" in found["errors"][0]["message"]
    assert "arithmetic" in [env["name"] for env in found["envs"]] and found["rewards"]


# --------------------------------------------------------------------------- validation


def test_a_good_form_validates_and_its_yaml_loads_back_with_rlf_train(tmp_path):
    result = new_run.validate({
        "env": "arithmetic", "model.name": DEFAULT_MODEL,
        "grpo.group_size": "8", "train.lr": "2e-6", "train.steps": 3, "data.train_size": "",
        "logging.live": "off", "logging.tensorboard": "false",
        "rewards": [{"name": "exact_match", "weight": "0.5"}, {"name": "format", "weight": 0.1}],
        "tool_manager": {"name": "concurrent", "options": "{timeout_s: 10}"},
        "run_dir": str(tmp_path / "run"),
    })
    assert result["ok"] and result["errors"] == []
    json.dumps(result)
    config = result["config"]
    assert config["grpo"]["group_size"] == 8 and config["train"]["lr"] == 2e-6 and config["train"]["steps"] == 3
    assert config["data"]["train_size"] is None and config["logging"]["live"] == "off"
    assert config["logging"]["tensorboard"] is False
    assert [(r["name"], r["weight"]) for r in config["rewards"]] == [("exact_match", 0.5), ("format", 0.1)]
    assert config["tool_manager"] == {"name": "concurrent", "options": {"timeout_s": 10}}
    path = tmp_path / "run.yaml"
    path.write_text(result["yaml"], encoding="utf-8")
    assert load_config([path], []).model_dump(mode="json") == config
    assert checked_config([path], []).model_dump(mode="json") == config  # rlf train --config's own check


def test_the_env_defaults_and_the_preset_stay_under_what_the_form_sets(tmp_path):
    result = new_run.validate({"env": "deepsearch", "preset": "cpu-smoke", "train.steps": "2"})
    assert result["ok"], result["errors"]
    config = result["config"]
    assert config["parser"] == "search_r1" and [r["name"] for r in config["rewards"]] == ["search_r1"]
    assert config["rollout"]["max_turns"] == 3  # the preset's, over the env's 4 (as rlf train layers them)
    assert config["grpo"]["dynamic_sampling"] is True and config["train"]["steps"] == 2
    path = tmp_path / "deepsearch.yaml"
    path.write_text(result["yaml"], encoding="utf-8")
    assert load_config([path], []).model_dump(mode="json") == config


def test_every_mistake_of_a_form_is_reported_at_once_with_its_key():
    result = new_run.validate({
        "env": "no-such-env",
        "grpo.group_size": -1,
        "train.lr": "fast",
        "grpo.bogus": 1,
        "rewards": [{"name": "exact_match", "weight": "heavy"}, {"name": "no-such-reward"}],
        "tool_manager.options": {"bogus_option": 1},
        "train.seed": "[1",
        "preset": "no-such-preset",
    })
    assert result == {"ok": False, "errors": result["errors"], "config": None, "yaml": None}
    by_key = {error["key"]: error["message"] for error in result["errors"]}
    assert set(by_key) == {"env", "grpo.group_size", "train.lr", "grpo.bogus", "rewards[0].weight", "rewards[1]",
                           "tool_manager.options.bogus_option", "train.seed", "preset"}
    assert "no env named 'no-such-env'" in by_key["env"] and "arithmetic" in by_key["env"]
    assert "greater than or equal to 2" in by_key["grpo.group_size"]
    assert "valid number" in by_key["train.lr"] and "'fast'" in by_key["train.lr"]
    assert "unknown key" in by_key["grpo.bogus"]
    assert "valid number" in by_key["rewards[0].weight"]
    assert "no reward named 'no-such-reward'" in by_key["rewards[1]"]
    assert "not valid YAML" in by_key["train.seed"]
    assert all("\n" not in error["message"] for error in result["errors"])


def test_checks_across_settings_name_their_first_key():
    result = new_run.validate({"grpo.prompts_per_step": 1, "grpo.group_size": 2, "grpo.mini_batches": 5})
    assert not result["ok"]
    assert result["errors"] == [{"key": "grpo.mini_batches", "message": result["errors"][0]["message"]}]
    assert result["errors"][0]["message"].startswith("grpo.mini_batches (5) is more than")


def test_the_form_offers_the_schedule_and_says_what_it_cannot_do():
    field = new_run.form_schema()["fields"]["train.mode"]
    assert field["group"] == "main" and field["default"] == "sync"
    assert "one_step_off" in str(field)  # a choice of the select
    result = new_run.validate({"train.mode": "one_step_off", "train.max_staleness": "0", "engine": "ray",
                               "train.overlap_cores": "split"})
    keys = {error["key"]: error["message"] for error in result["errors"]}
    assert keys["train.max_staleness"].startswith("0 allows no token older")
    assert keys["train.overlap_cores"].startswith("split is the local engine's")
    assert new_run.validate({"train.mode": "one_step_off"})["ok"]


def test_text_settings_keep_text_and_other_settings_read_it_as_yaml():
    result = new_run.validate({"data.eval_split": "123", "data.eval_size": "", "data.train_size": "100",
                               "eval.rewards": "[{name: exact_match}]", "train.bf16": "false",
                               "env_options": "{few_shot: false}"})
    assert result["ok"], result["errors"]
    config = result["config"]
    assert config["data"]["eval_split"] == "123" and config["data"]["eval_size"] is None
    assert config["data"]["train_size"] == 100 and config["train"]["bf16"] is False
    assert config["eval"]["rewards"][0]["name"] == "exact_match" and config["env_options"] == {"few_shot": False}
    assert new_run.validate(["not", "a", "form"])["errors"][0]["key"] == ""


# --------------------------------------------------------------------------- MCP servers


def _time_servers() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if "mcp_server_time" in " ".join(p.cmdline())]


async def test_mcp_tools_lists_a_real_servers_tools_and_a_bad_server_is_its_own_error():
    text = json.dumps({"mcpServers": {"time": TIME_SERVER, "broken": {"command": "no-such-mcp-server-xyz"}}})
    result = await new_run.mcp_tools(text, timeout_s=30)
    json.dumps(result)
    assert result["errors"] == []
    servers = {server["name"]: server for server in result["servers"]}
    assert servers["time"]["error"] is None and servers["time"]["transport"] == "stdio"
    tools = {tool["name"]: tool for tool in servers["time"]["tools"]}
    assert {"get_current_time", "convert_time"} <= set(tools)
    assert tools["get_current_time"]["description"]
    assert tools["get_current_time"]["input_schema"]["type"] == "object"
    assert "timezone" in tools["get_current_time"]["input_schema"]["properties"]
    assert servers["broken"]["tools"] == []
    assert "command not found: 'no-such-mcp-server-xyz'" in servers["broken"]["error"]
    assert "\n" not in servers["broken"]["error"]
    assert _time_servers() == []  # listed, then stopped


async def test_mcp_tools_reports_text_that_is_not_an_mcp_config_without_starting_anything():
    malformed = await new_run.mcp_tools('{"mcpServers": {"time": ')
    assert malformed["servers"] == [] and len(malformed["errors"]) == 1
    assert malformed["errors"][0].startswith("not valid JSON (line 1")
    refused = await new_run.mcp_tools(json.dumps({"mcpServers": {"a": {"args": []}, "b": {"command": "x", "bad": 1}}}))
    assert refused["servers"] == [] and len(refused["errors"]) == 2
    assert "found neither" in refused["errors"][0] and "unknown key(s) 'bad'" in refused["errors"][1]
    assert (await new_run.mcp_tools("[1, 2]"))["errors"]


def test_values_that_cannot_be_read_are_each_an_error_of_their_own():
    result = new_run.validate({"rewards": [{"name": "f1", "options": "{a: "}, {"name": "format", "weight": "[0"}],
                               "tool_manager": {"name": "concurrent", "options": "{b: "}})
    keys = [error["key"] for error in result["errors"]]
    assert keys == ["rewards[0].options", "rewards[1].weight", "tool_manager.options"]


def test_check_reports_every_problem_in_one_pass_and_refuses_what_launch_refuses(tmp_path):
    # an unreadable options text no longer hides a bad weight of the same reward
    result = new_run.validate({"rewards": [{"name": "f1", "options": "{a: ", "weight": "heavy"}]})
    assert {"rewards[0].options", "rewards[0].weight"} <= {e["key"] for e in result["errors"]}
    # a field's own error and every check across settings, in the same pass, each under its key
    result = new_run.validate({"train.lr": "fast", "grpo.prompts_per_step": 1, "grpo.group_size": 2,
                               "grpo.mini_batches": 5, "rollout.max_tokens_per_turn": 100,
                               "rollout.max_trajectory_tokens": 50})
    by_key = {e["key"]: e["message"] for e in result["errors"]}
    assert {"train.lr", "grpo.mini_batches", "rollout.max_trajectory_tokens"} <= set(by_key), by_key
    # Launch writes runs into the UI's runs directory under a name of its own: Check says so too,
    # and the form does not offer the setting
    result = new_run.validate({"run_dir": str(tmp_path / "mine")}, runs_dir=tmp_path / "runs")
    assert not result["ok"] and [e["key"] for e in result["errors"]] == ["run_dir"]
    assert "run_dir" not in new_run.form_schema()["fields"]
