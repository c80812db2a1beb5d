"""The nl2sql env: registration through the real plugin manager, config defaults, option
checks, the prompt, the episode logic, the tools through the real tool manager, whole
episodes through the core's agent loop and reward layer with a scripted model, and
`rlf eval --env nl2sql` with that scripted model as the generation backend."""

from __future__ import annotations

import re
import sqlite3

import pytest

from rlfactory_core import ConfigError, ParsedTurn, ParseError, ToolCall, ToolResult, get_component
from rlfactory_core.testing import (ConcurrentToolManager, ScriptedBackend, load_config, plugin_infos,
                                    scripted_backend)
from rlfactory_nl2sql import NL2SQLEnv, SQLExecutionReward
from rlfactory_nl2sql.data import EXAMPLE_QUESTION, EXAMPLE_SQL, database_file
from rlfactory_nl2sql.env import INSTRUCTION, NO_TOOLS_INSTRUCTION


@pytest.fixture
def env(built) -> NL2SQLEnv:
    return NL2SQLEnv(data_dir=str(built))


def sample(built, question="What is the capital of Peru?", **extra):
    return {"id": "s1", "db_id": "world", "question": question, "query": "SELECT 1", **extra}


# --------------------------------------------------------------------------- registration and config


def test_registered_through_the_plugin_manager():
    assert get_component("env", "nl2sql") is NL2SQLEnv
    assert get_component("reward", "sql_execution") is SQLExecutionReward
    info = next(i for i in plugin_infos() if i.name == "nl2sql")
    assert info.distribution == "rlfactory-plugin-nl2sql"


def test_the_env_brings_its_run_defaults_and_the_user_can_change_them():
    config = load_config([], flags={"env": "nl2sql"})
    assert config.parser == "qwen3"
    assert [(r.name, r.options) for r in config.rewards] == [("sql_execution", {})]
    assert [(r.name, r.options) for r in config.eval.rewards] == [("sql_execution", {"format_score": 0.0})]
    assert (config.rollout.max_turns, config.rollout.max_tokens_per_turn, config.rollout.max_trajectory_tokens) == (
        4, 128, 2048)
    changed = load_config([], ["rollout.max_turns=2", "env_options={tools: false}"], flags={"env": "nl2sql"})
    assert changed.rollout.max_turns == 2 and changed.env_options == {"tools": False}
    assert [r.name for r in load_config([]).rewards] == ["exact_match"]  # other envs keep the core default


def test_the_trainer_builds_the_task_with_the_runs_parser(built):
    from rlfactory_core.testing import build_task

    def task(*overrides):
        return build_task(load_config([], [f"env_options={{data_dir: {built}}}", *overrides], flags={"env": "nl2sql"}))

    built_task = task()
    assert isinstance(built_task.env, NL2SQLEnv) and built_task.parser.name == "qwen3" and built_task.offers_tools
    assert sorted(built_task.tool_manager.tools) == ["describe_table", "list_tables", "run_query"]
    assert built_task.rewards.names == ["sql_execution"]
    assert not task("env_options={data_dir: " + str(built) + ", tools: false}").offers_tools
    with pytest.raises(ConfigError, match="env_options.parser is 'search_r1' but the run's parser is 'qwen3'"):
        task("env_options={data_dir: " + str(built) + ", parser: search_r1}")


def test_bad_env_options_are_all_reported_at_once(tmp_path):
    with pytest.raises(ConfigError) as info:
        NL2SQLEnv(source="mysql", tools="yes", max_rows=0, describe_rows=-1, time_limit_s=0, max_cell_chars=2,
                  splits="dev.json", schema_in_prompt=1, row_limit=5)
    errors = info.value.errors
    assert [e.split(":")[0] for e in errors] == [
        "env_options.row_limit", "env_options.source", "env_options.tools", "env_options.schema_in_prompt",
        "env_options.max_rows",
        "env_options.describe_rows", "env_options.max_cell_chars", "env_options.time_limit_s",
        "env_options.splits"]
    assert errors[0].startswith("env_options.row_limit: unknown option (options: source, data_dir, db_dir, splits,")
    assert errors[1] == "env_options.source: must be one of builtin, spider, bird, got 'mysql'"
    assert "\n" not in str(info.value) and "README" in info.value.hint

    with pytest.raises(ConfigError) as info:
        NL2SQLEnv(source="spider")
    assert info.value.errors == ["env_options.data_dir: the spider source needs the directory of its files "
                                 "(e.g. data_dir: ~/data/spider)"]
    with pytest.raises(ConfigError) as info:
        NL2SQLEnv(source="bird", data_dir=str(tmp_path / "nope"), db_dir="dbs", parser="no_such_parser")
    assert [e.split(":")[0] for e in info.value.errors] == ["env_options.data_dir", "env_options.db_dir",
                                                            "env_options.parser"]
    assert info.value.errors[2].startswith("env_options.parser: no parser named 'no_such_parser' (available: ")
    (tmp_path / "bird").mkdir()
    (tmp_path / "bird" / "dev.json").write_text("[]")
    with pytest.raises(ConfigError) as info:
        NL2SQLEnv(source="bird", data_dir=str(tmp_path / "bird"), splits={"validation": "val.json"})
    assert info.value.errors == [
        f"env_options.splits.train: no file {tmp_path / 'bird' / 'train.json'}; set splits: {{train: FILE}} "
        "(relative to data_dir or absolute), or {train: null} to drop it",
        f"env_options.splits.validation: no file {tmp_path / 'bird' / 'val.json'}; set splits: "
        "{validation: FILE} (relative to data_dir or absolute), or {validation: null} to drop it"]
    # the same problems reach a run as one config error
    from rlfactory_core.testing import build_task

    with pytest.raises(ConfigError, match="env_options.max_rows: must be an integer from 1 to 1000, got 0"):
        build_task(load_config([], ["env_options={max_rows: 0}"], flags={"env": "nl2sql"}))


def test_an_unknown_split_or_size_is_a_config_error(env):
    with pytest.raises(ConfigError, match=r"no 'dev' split \(splits: train, validation, test, test_wordings, test_skeletons\); add it"):
        env.dataset(4, "dev")
    with pytest.raises(ConfigError, match="whole number"):
        env.dataset(-1, "test")


def test_the_builtin_data_is_built_on_first_use(tmp_path):
    env = NL2SQLEnv(data_dir=str(tmp_path / "fresh"))
    assert not (tmp_path / "fresh").exists()  # building the env builds nothing
    test = env.dataset(5, "test")
    assert len(test) == 5 and (tmp_path / "fresh" / "manifest.json").is_file()
    assert env.dataset(5, "test") == test and len(env.dataset(None, "validation")) > 100
    assert all(s["db_path"] == str(database_file(tmp_path / "fresh")) for s in test)


# --------------------------------------------------------------------------- episodes


async def test_reset_shows_the_instruction_the_schema_the_example_and_the_question(env, built):
    reset = await env.reset(sample(built))
    system = reset.messages[0].content
    assert system.startswith(INSTRUCTION)
    assert system.endswith("Database world, its tables and columns:\n"
                           "countries(code, name, region, subregion, population, area)\n"
                           "capitals(country_code, name, latitude, longitude)\n"
                           "currencies(code, name)\n"
                           "country_currencies(country_code, currency_code)\n"
                           "languages(code, name)\n"
                           "country_languages(country_code, language_code)\n"
                           "borders(country_code, neighbour_code)")
    # the worked example in the qwen3 format, with the real result of its query
    assert [m.role for m in reset.messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert reset.messages[1].content == f"Question: {EXAMPLE_QUESTION}"
    assert reset.messages[2].content == (
        '<tool_call>\n{"name": "run_query", "arguments": {"query": "' + EXAMPLE_SQL + '"}}\n</tool_call>')
    assert reset.messages[3].content == "<tool_response>\nMAX(area)\n17124442\n(1 row)\n</tool_response>"
    assert reset.messages[4].content == f"<answer>{EXAMPLE_SQL}</answer>"
    assert reset.messages[5].content == "Question: What is the capital of Peru?"
    assert [t.name for t in reset.tools] == ["list_tables", "describe_table", "run_query"]
    assert reset.state == {"db_id": "world", "db_path": str(database_file(built)), "tool_turns": 0}


async def test_without_tools_schema_or_example(built):
    bare = NL2SQLEnv(data_dir=str(built), tools=False)
    reset = await bare.reset(sample(built))
    assert reset.tools == [] and bare.tools == []
    assert reset.messages[0].content.startswith(NO_TOOLS_INSTRUCTION)
    assert [m.content for m in reset.messages[1:]] == [
        f"Question: {EXAMPLE_QUESTION}", f"<answer>{EXAMPLE_SQL}</answer>", "Question: What is the capital of Peru?"]
    plain = NL2SQLEnv(data_dir=str(built), schema_in_prompt=False, few_shot=False)
    reset = await plain.reset(sample(built))
    assert [m.content for m in reset.messages] == [INSTRUCTION, "Question: What is the capital of Peru?"]


async def test_a_tool_turn_continues_and_an_answer_turn_ends_with_its_sql(env, built):
    state = (await env.reset(sample(built))).state
    call = ToolCall("run_query", {"query": "SELECT 1"})
    step = await env.step(state, ParsedTurn(text="...", tool_calls=[call]), [ToolResult("run_query", "1")])
    assert not step.done and state["tool_turns"] == 1
    step = await env.step(state, ParsedTurn(text="...", errors=[ParseError("bad json")]), [])
    assert not step.done and state["tool_turns"] == 2
    answer = "<answer>SELECT cap.name FROM capitals AS cap;</answer>"
    step = await env.step(state, ParsedTurn(text=answer, content=answer), [])
    assert step.done and step.final_answer == "SELECT cap.name FROM capitals AS cap"
    fenced = "Here it is:\n```sql\nSELECT 2\n```"
    assert (await env.step(state, ParsedTurn(text=fenced, content=fenced), [])).final_answer == "SELECT 2"
    step = await env.step(state, ParsedTurn(text="Lima", content="Lima"), [])
    assert step.done and step.final_answer == ""  # no tags, no block: no answer


@pytest.mark.parametrize("bad, message", [
    ({"id": "q1", "db_id": "world"}, "nl2sql sample q1: needs a 'question' (text), got keys ['db_id', 'id']"),
    ({"id": "q2", "question": "Q?"}, "nl2sql sample q2: needs a 'db_id' (or a 'db_path'), got keys ['id', 'question']"),
    ({"id": "q3", "question": "Q?", "db_id": "atlas"},
     "nl2sql sample q3: unknown db_id 'atlas': no atlas/atlas.sqlite in"),
    ({"id": "q4", "question": "Q?", "db_path": "/no/such.sqlite"},
     "nl2sql sample q4: its db_path /no/such.sqlite does not exist; fix the sample or give its db_id"),
    ({"id": "q5", "question": "Q?", "db_id": "../world"}, "unknown db_id '../world'"),
])
async def test_bad_samples_get_one_line_errors(env, bad, message):
    with pytest.raises(ValueError) as info:
        await env.reset(bad)
    assert message in str(info.value) and "\n" not in str(info.value)


# --------------------------------------------------------------------------- tools


async def call(env, built, *calls, db_path=None):
    manager = ConcurrentToolManager(env.tools)
    ctx = {"state": {"db_path": str(db_path or database_file(built))}, "tool_names": None}
    return await manager.call([ToolCall(name, args, id=str(i)) for i, (name, args) in enumerate(calls)], ctx)


async def test_the_tools_show_tables_schemas_rows_and_results(env, built):
    tables, described, result, empty = await call(
        env, built, ("list_tables", {}), ("describe_table", {"table": "Capitals"}),
        ("run_query", {"query": "SELECT name, area FROM countries WHERE region = 'Oceania' ORDER BY area DESC"}),
        ("run_query", {"query": "SELECT name FROM countries WHERE name = 'Atlantis'"}))
    assert all(r.ok for r in (tables, described, result, empty))
    assert tables.content.splitlines()[0] == "countries(code, name, region, subregion, population, area)"
    lines = described.content.splitlines()
    assert lines[0] == ("CREATE TABLE capitals ( country_code TEXT PRIMARY KEY REFERENCES countries(code), "
                        "name TEXT NOT NULL, latitude REAL, longitude REAL )")
    assert lines[1:3] == ["First rows of capitals:", "country_code | name | latitude | longitude"]
    assert len(lines) == 3 + 3 + 1 and lines[-1] == "(3 rows shown; the result has more)"
    rows = result.content.splitlines()
    assert rows[:2] == ["name | area", "Australia | 7692024"] and len(rows) == 12
    assert rows[-1] == "(10 rows shown; the result has more)"
    assert empty.content == "name\n(0 rows)"
    small = NL2SQLEnv(data_dir=str(built), max_rows=2, describe_rows=0, max_cell_chars=8)
    described, result = await call(small, built, ("describe_table", {"table": "borders"}),
                                   ("run_query", {"query": "SELECT name FROM countries ORDER BY name"}))
    assert "First rows" not in described.content
    assert result.content == "name\nAfghani…\nAlbania\n(2 rows shown; the result has more)"


@pytest.mark.parametrize("name, arguments, message", [
    ("run_query", {}, "invalid arguments for run_query: 'query' is missing; give it as text"),
    ("run_query", {"query": 42}, "invalid arguments for run_query: 'query' must be text, got int"),
    ("run_query", {"query": "  "}, "invalid arguments for run_query: 'query' is empty"),
    ("run_query", {"query": "SELECT 1", "limit": 5}, "invalid arguments for run_query: unknown argument 'limit'; "
                                                    "it takes query"),
    ("list_tables", {"table": "x"}, "invalid arguments for list_tables: unknown argument 'table'; it takes no "
                                    "arguments"),
    ("describe_table", {"table": "planets"}, "describe_table: there is no table named 'planets'; the tables are: "
                                             "countries, capitals, currencies"),
])
async def test_malformed_arguments_are_invalid_arguments_with_one_line(env, built, name, arguments, message):
    [result] = await call(env, built, (name, arguments))
    assert result.error == "invalid_arguments"
    assert result.content.startswith("Error: ") and message in result.content and "\n" not in result.content


async def test_bad_model_sql_is_a_one_line_error_observation(env, built):
    results = await call(env, built, ("run_query", {"query": "SELECT nme FROM countries"}),
                         ("run_query", {"query": "SELECT * FROM planets"}),
                         ("run_query", {"query": "SELECT name FROM countries WHERE"}))
    assert [r.content for r in results] == [
        "Error: SQL error: no such column: nme", "Error: SQL error: no such table: planets",
        "Error: SQL error: incomplete input"]
    assert all(r.error == "tool_error" and r.metadata["tool_error"] == "sql_error" for r in results)


async def test_the_tools_need_an_episode(env):
    manager = ConcurrentToolManager(env.tools)
    [result] = await manager.call([ToolCall("list_tables", {}, id="1")], {"tool_names": None})
    assert result.error == "exception" and "run inside an nl2sql episode" in result.content


# --------------------------------------------------------------------------- whole episodes


def scripted_model(tokenizer, script):
    """A stand-in model: for each question (``script``: question -> (probe SQL, answer)),
    first a run_query call with the probe, then the answer."""

    def reply(prompt):
        question = re.findall(r"Question: (.*)", prompt)[-1].strip()
        probe, answer = script[question]
        seen = prompt.rsplit(f"Question: {question}", 1)[1]
        return answer if "<tool_response>" in seen else (
            '<tool_call>\n{"name": "run_query", "arguments": {"query": "' + probe + '"}}\n</tool_call>')

    return ScriptedBackend(tokenizer, reply)


async def test_episodes_through_the_agent_loop_and_the_reward_layer(env, built):
    """Real rollouts (qwen3 parser, tool manager, chat template of the embedded model) with a
    scripted model: one right answer, one wrong, one that errs, one without tags."""
    from rlfactory_core import ChatTemplate, TemplateFamily, load_tokenizer
    from rlfactory_core.testing import DEFAULT_MODEL, RolloutConfig, build_reward_layer, prepare_model, rollout

    tokenizer = load_tokenizer(prepare_model(DEFAULT_MODEL))
    peru = "SELECT cap.name FROM countries AS c JOIN capitals AS cap ON cap.country_code = c.code WHERE c.name = 'Peru'"
    samples = [sample(built, f"Question {i}?", id=f"s{i}", query=peru) for i in range(4)]
    script = {
        "Question 0?": ("SELECT code FROM countries WHERE name = 'Peru'",
                        "<answer>SELECT c.name FROM capitals AS c WHERE c.country_code = 'PER'</answer>"),
        "Question 1?": ("SELECT 1", "<answer>SELECT name FROM capitals WHERE country_code = 'FRA'</answer>"),
        "Question 2?": ("SELECT 1", "<answer>SELECT capital FROM countries</answer>"),
        "Question 3?": ("SELECT 1", "The capital is Lima."),
    }
    config = load_config([], ["rewards=[{name: sql_execution}]"], flags={"env": "nl2sql"})
    manager = ConcurrentToolManager(env.tools)
    family = TemplateFamily(ChatTemplate(tokenizer), get_component("parser", "qwen3"))
    trajectories = await rollout(samples, env=env, family=family, tool_manager=manager,
                                 backend=scripted_model(tokenizer, script),
                                 config=RolloutConfig(**config.rollout.model_dump()), group_size=1)
    assert [t.num_turns for t in trajectories] == [2, 2, 2, 2]
    assert "PER" in trajectories[0].tool_results[0].content
    layer = build_reward_layer(config.rewards, manager)
    scored = await layer.score(trajectories, samples)
    assert scored.totals == pytest.approx([1.1, 0.1, 0.0, 0.0])
    assert scored.correct == [True, False, False, False]
    metrics = scored.metrics("reward")
    assert metrics["reward/accuracy"] == 0.25
    assert metrics["reward/sql_execution/execution_error"] == 0.25
    assert metrics["reward/sql_execution/no_answer"] == 0.25 and metrics["reward/errors"] == 0.0
    assert trajectories[2].metadata["sql_execution"] == {"error_kind": "sql_error",
                                                          "error": "SQL error: no such column: capital"}
    assert trajectories[3].final_answer == "" and trajectories[3].messages[-1].content == "The capital is Lima."


def test_rlf_eval_reports_the_execution_accuracy_of_what_the_model_answered(built, tmp_path, capsys):
    """`rlf eval --env nl2sql`, in process, through the CLI and rlfactory_core.evaluation.evaluate
    (the env's run defaults, its eval reward with format_score 0, the agent loop, the
    report), with the generation backend replaced by the scripted model. Of 8 test
    questions it answers 5 with their gold SQL, one with another question's gold SQL (runs,
    another result), one with SQL that fails, one without an answer: accuracy 5/8."""
    import json

    from rlfactory_cli.app import run
    from rlfactory_core import load_tokenizer
    from rlfactory_core.testing import DEFAULT_MODEL

    samples = NL2SQLEnv(data_dir=str(built)).dataset(8, "test")  # what `rlf eval --size 8` evaluates
    answers = [f"<answer>{s['query']}</answer>" for s in samples]
    answers[2] = f"<answer>{samples[3]['query']}</answer>"
    answers[5] = "<answer>SELECT nme FROM countries</answer>"
    answers[7] = "I do not know."
    script = {s["question"]: ("SELECT 1", answer) for s, answer in zip(samples, answers)}
    assert len(script) == 8
    report_dir = tmp_path / "report"
    with scripted_backend(lambda model_path: scripted_model(load_tokenizer(model_path), script)):
        code = run(["eval", "--env", "nl2sql", "--model", DEFAULT_MODEL, "--size", "8", "--report", str(report_dir),
                    f"env_options={{data_dir: {built}}}", "logging.live=off"])
    printed = capsys.readouterr()
    assert code == 0, printed.err[-3000:]
    report = json.loads((report_dir / "report.json").read_text())
    metrics = report["metrics"]
    assert (report["env"], report["split"], report["samples"]) == ("nl2sql", "test", 8)
    assert metrics["eval/reward/accuracy"] == 5 / 8
    assert metrics["eval/reward/mean"] == 5 / 8  # format_score 0 in evaluation: the mean is the accuracy
    assert metrics["eval/reward/sql_execution/execution_match"] == 5 / 8
    assert metrics["eval/reward/sql_execution/execution_error"] == 1 / 8
    assert metrics["eval/reward/sql_execution/no_answer"] == 1 / 8
    assert metrics["eval/tools/calls_per_trajectory"] == 1.0
    assert "reward/accuracy" in printed.out and "0.625" in printed.out
    rows = [json.loads(line) for line in next((report_dir / "samples").glob("*.jsonl")).read_text().splitlines()]
    assert [r["reward"] for r in rows] == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0]  # eval.save_samples: 8


def test_the_data_fingerprint_covers_every_database_an_episode_opens(env, built, tmp_path):
    # eval.reuse_untrained keys on it (rlfactory_core.eval_reuse): the databases and check copies
    test = env.dataset(4, "test")
    fingerprint = env.data_fingerprint(test)
    assert len(fingerprint) == 64 and env.data_fingerprint(test) == fingerprint
    assert all(s.get("check_db_path") for s in test)
    copy = tmp_path / "world.sqlite"
    copy.write_bytes(database_file(built).read_bytes())
    mine = [sample(built, db_path=str(copy))]
    before = env.data_fingerprint(mine)
    assert before != fingerprint
    with sqlite3.connect(copy) as db:
        db.execute("UPDATE capitals SET name = 'Cusco' WHERE name = 'Lima'")
    assert env.data_fingerprint(mine) != before
