"""The env ``mcp``: options, tasks, episodes, a rollout through the real engine that
survives a server killed mid-run, and `rlf train --env mcp` / `rlf eval` end to end."""

import asyncio
import json
import sys

import pytest

from mcp_testing import (assert_none_left, marked, marked_processes, new_marker, server_processes, stdio_toolbox,
                         time_server)
from rlfactory_core import ConfigError, Message, ParsedTurn, ToolCall, get_component
from rlfactory_core.testing import ScriptedBackend, load_config
from rlfactory_mcp import MCPEnv


@pytest.fixture
def files(tmp_path):
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"box": stdio_toolbox(), "time": time_server()}}))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "question": f"What is {i} plus {i}?", "answer": str(2 * i)})
                             + "\n" for i in range(40)))
    return config, tasks


@pytest.fixture
def server_marker():
    """A marker for the servers of one test; any still running after it are killed."""
    marker = new_marker()
    yield marker
    for process in marked_processes(marker):
        process.kill()


def test_registered_through_the_plugin_manager():
    assert get_component("env", "mcp") is MCPEnv


def test_every_bad_option_is_reported_at_once(tmp_path):
    with pytest.raises(ConfigError) as info:
        MCPEnv(data=str(tmp_path / "none.jsonl"), test_fraction=1.5, servers={"box": {"pool_size": 0}},
               tools="echo", system_prompt=" ")
    errors = info.value.errors
    assert errors[0].startswith("env_options.mcp_config: required")
    assert any(e.startswith("env_options.data: no file at") for e in errors)
    assert any("test_fraction" in e for e in errors) and any("pool_size" in e for e in errors)
    assert any("env_options.tools" in e for e in errors) and any("system_prompt" in e for e in errors)
    assert len(errors) == 6


def test_bad_task_rows_are_named(files, tmp_path):
    config, _ = files
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "ok?", "answer": "yes"}\n{"question": "no answer?"}\n{"answer": "x"}\n')
    with pytest.raises(ConfigError) as info:
        MCPEnv(mcp_config=str(config), data=str(bad))
    assert [e.split(": ", 1)[1] for e in info.value.errors] == [
        "task 2 (bad-2) needs its gold answer(s): 'answer': \"...\" or 'answers': [...]",
        "task 3 (bad-3) needs a 'question' (text)"]
    assert server_processes() == []  # nothing was started for a run that cannot go


async def test_tasks_split_into_train_and_a_fixed_held_out_test(files, tmp_path):
    config, tasks = files
    env = MCPEnv(mcp_config=str(config), data=str(tasks), test_fraction=0.25)
    try:
        train, test = env.dataset(None, "train"), env.dataset(None, "test")
        assert len(train) + len(test) == 40 and 4 <= len(test) <= 18
        assert not {r["id"] for r in train} & {r["id"] for r in test}
        again = MCPEnv(mcp_config=str(config), data=str(tasks), test_fraction=0.25)
        assert [r["id"] for r in again.dataset(None, "test")] == [r["id"] for r in test]
        assert len(env.dataset(3, "train")) == 3
        with pytest.raises(ConfigError, match="splits train and test, not 'validation'"):
            env.dataset(3, "validation")
        held = tmp_path / "held.jsonl"
        held.write_text('{"question": "q?", "answers": ["a", "b"]}\n')
        given = MCPEnv(mcp_config=str(config), data=str(tasks), test_data=str(held), tools=["echo", "convert_time"])
        assert len(given.dataset(None, "train")) == 40 and given.dataset(None, "test")[0]["answers"] == ["a", "b"]
        assert [t.name for t in given.tools] == ["echo", "convert_time"]
    finally:
        await env.toolset.close()


async def test_an_episode_continues_on_tool_calls_and_ends_with_the_tagged_answer(files):
    config, tasks = files
    env = MCPEnv(mcp_config=str(config), data=str(tasks))
    reset = await env.reset({"id": "1", "question": "What is 2 plus 2?"})
    assert [m.role for m in reset.messages] == ["system", "user"] and "<answer>" in reset.messages[0].content
    assert {t.name for t in reset.tools} >= {"add", "get_current_time"}
    step = await env.step(reset.state, ParsedTurn(text="...", tool_calls=[ToolCall("add", {"a": 2, "b": 2})]), [])
    assert not step.done and reset.state["tool_calls"] == 1
    step = await env.step(reset.state, ParsedTurn(text="x", content="<think>4?</think> It is <answer> 4 </answer>"), [])
    assert step.done and step.final_answer == "4"
    plain = MCPEnv(mcp_config=str(config), data=str(tasks), answer_tags=False)
    assert (await plain.step({"tool_calls": 0}, ParsedTurn(text="4", content=" 4 "), [])).final_answer == "4"
    with pytest.raises(ValueError, match="needs a 'question'"):
        await env.reset({"id": "2"})


class ServerKillingScript:
    """The script of a ScriptedBackend, a stand-in for a model that has learned to call the
    tool: first an ``add`` call, then the answer. The MCP server is killed once ``kill_after``
    results have come back, and every later call waits for that kill, so the rest of the
    calls reach a dead server whatever the machine's speed (a schedule of sleeps let all of
    them finish before the kill on a loaded machine)."""

    def __init__(self, kill_after: int):
        self.kill_after, self.calls_made, self.results_seen = kill_after, 0, 0
        self.killed = None
        self.kill_done = asyncio.Event()

    async def __call__(self, text):
        number = int(text.rsplit("What is ", 1)[1].split(" ", 1)[0])
        if "<tool_response>" not in text.rsplit("What is ", 1)[1]:
            self.calls_made += 1
            if self.calls_made > self.kill_after:
                await self.kill_done.wait()
            return '<tool_call>\n{"name": "add", "arguments": {"a": %d, "b": %d}}\n</tool_call>' % (number, number)
        self.results_seen += 1
        if self.results_seen == self.kill_after:
            [self.killed] = server_processes_named("toolbox.py")
            self.killed.kill()
            self.killed.wait(timeout=30)
            self.kill_done.set()
        result = text.rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>", 1)[0]
        return f"<answer>{result}</answer>"


def server_processes_named(fragment):
    return [p for p in server_processes() if any(fragment in part for part in p.cmdline())]


async def test_a_rollout_recovers_when_a_server_is_killed_mid_run(files):
    """32 trajectories through the real rollout engine and tool manager; the server is
    killed after 10 of them have their result. Every trajectory still gets its result."""
    from rlfactory_core import ChatTemplate, TemplateFamily, load_tokenizer
    from rlfactory_core.testing import (DEFAULT_MODEL, ConcurrentToolManager, RolloutConfig, build_reward_layer,
                                        prepare_model, rollout)

    config, tasks = files
    env = MCPEnv(mcp_config=str(config), data=str(tasks))
    chat = ChatTemplate(load_tokenizer(prepare_model(DEFAULT_MODEL)))
    script = ServerKillingScript(kill_after=10)
    policy = ScriptedBackend(chat.tokenizer, script, end_token_id=chat.tokenizer.convert_tokens_to_ids("<|im_end|>"))
    manager = ConcurrentToolManager(env.tools, timeout_s=120)
    try:
        samples = env.dataset(32, "train")
        trajectories = await rollout(samples, env=env, family=TemplateFamily(chat, get_component("parser", "qwen3")),
                                     tool_manager=manager, backend=policy,
                                     config=RolloutConfig(max_turns=3, max_tokens_per_turn=64))
        assert script.killed is not None and env.toolset.restarts >= 1
        assert all(t.stop_reason == "env_done" for t in trajectories)
        assert all(r.error is None for t in trajectories for r in t.tool_results)
        scores = await build_reward_layer(load_config([]).rewards, manager).score(trajectories, samples)
        assert [t.final_answer for t in trajectories] == [s["answer"] for s in samples]
        assert scores.correct == [True] * 32
    finally:
        await manager.close()
    assert server_processes() == []


@pytest.mark.slow
def test_rlf_train_and_eval_mcp_end_to_end(files, tmp_path, server_marker, tiny_model_dir):
    """`rlf train --env mcp` (a tiny model, hf backend, 2 steps) then `rlf eval`: the servers'
    lifecycle around real runs (tool calls through the env are tested above, scripted).

    The servers belong to the `rlf` subprocess, and one it left behind would be re-parented
    when it exits: they carry a marker in their environment and are looked for among all
    processes. The toolbox keeps running after its stdin closes (as some servers do), so
    only the MCP client's close ends it, and a server left behind is still there to find."""
    import subprocess

    config, tasks = files
    marker = server_marker
    config.write_text(json.dumps({"mcpServers": {"box": marked(stdio_toolbox(), marker, outlives_stdin=True),
                                                 "time": marked(time_server(), marker)}}))
    run_dir = tmp_path / "run"
    logs = tmp_path / "logs"
    logs.mkdir()
    common = [f"env_options={{mcp_config: {config}, data: {tasks}, log_dir: {logs}}}", "backend=hf",
              f"model.name={tiny_model_dir}", "data.eval_size=2", "logging.live=off", "rollout.max_tokens_per_turn=32",
              "rollout.max_turns=2"]
    with open(tmp_path / "train.log", "w") as out:
        code = subprocess.call([sys.executable, "-m", "rlfactory_cli", "train", "--env", "mcp", "--run-dir",
                                str(run_dir), *common, "train.steps=2", "grpo.prompts_per_step=2", "grpo.group_size=2",
                                "eval.every=2", "eval.save_samples=2"],
                               stdout=out, stderr=subprocess.STDOUT, timeout=900)
    assert code == 0, (tmp_path / "train.log").read_text()[-3000:]
    assert_none_left(marker)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train/loss" in r] == [1, 2]
    assert "eval/reward/accuracy" in records[-1] and "tools/calls_per_trajectory" in records[-1]
    assert (run_dir / "checkpoints" / "latest").exists()
    with open(tmp_path / "eval.log", "w") as out:
        code = subprocess.call([sys.executable, "-m", "rlfactory_cli", "eval", "--env", "mcp", "--model",
                                str(run_dir), "--size", "2", "--report", str(tmp_path / "report"), *common],
                               stdout=out, stderr=subprocess.STDOUT, timeout=900)
    assert code == 0, (tmp_path / "eval.log").read_text()[-3000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["samples"] == 2 and "eval/reward/accuracy" in report["metrics"]
    assert_none_left(marker)
    # the servers' stderr logs: kept where a server wrote something, none left empty
    assert all(log.stat().st_size > 0 for log in logs.iterdir()), sorted(log.name for log in logs.iterdir())

