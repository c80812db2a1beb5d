"""The agent loop end to end: the qwen3 parser, real tools, the arithmetic env, the real tokenizer.

The first test runs the embedded 135M model on the hf backend: the ``arithmetic`` env
(``contrib/rlfactory-plugin-arithmetic``) shows it two example tool calls, which it then
imitates, so its trajectories contain real calls written by a real model, token for token.
The loop's mechanics (masks, budgets, failing tools and envs, cancelling, observers, groups)
do not depend on what a model writes: they run on a ``ScriptedBackend`` that solves the task
the way a trained model would (a calculator call, then the tool's result as the answer), so
every turn they need happens, in seconds.
"""

from __future__ import annotations

import asyncio

import pytest

from rlfactory_arithmetic import ArithmeticEnv
from rlfactory_core import InfrastructureError, hookimpl
from rlfactory_core.default_plugins.tool_managers import ConcurrentToolManager
from rlfactory_core.models import load_tokenizer
from rlfactory_core.plugins import get_component
from rlfactory_core.rollout import (
    ChatTemplate,
    RolloutConfig,
    TemplateFamily,
    check_retokenization,
    rollout,
    rollout_metrics,
)
from rlfactory_core.rollout.backends.hf import HFBackend
from rlfactory_core.testing import ScriptedBackend, registered_plugin
from rlfactory_core.tools import function_tool
from rlfactory_core.training.batch import to_tensordict
from rlfactory_core.types import Message

GREEDY = {"sampling": {"temperature": 0.0}, "max_tokens_per_turn": 48, "max_turns": 4}


@pytest.fixture(scope="module")
def chat(default_model_dir):
    return ChatTemplate(load_tokenizer(default_model_dir))


@pytest.fixture(scope="module")
def backend(default_model_dir):
    backend = HFBackend(default_model_dir)
    yield backend
    asyncio.run(backend.close())


@pytest.fixture(scope="module")
def parser():
    return get_component("parser", "qwen3")


def solve(text: str) -> str:
    """A model that has learned the arithmetic task: it calls the calculator on the question
    asked last, then answers with what the tool returned (an error message included)."""
    question = text.rsplit("What is ", 1)[1]
    if "<tool_response>" not in question:
        return CALL % question.split("?", 1)[0]
    return "The answer is " + question.rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>", 1)[0]


CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>'


@pytest.fixture
def solver(chat):
    """A scripted backend that solves every question in two turns (:func:`solve`)."""
    return ScriptedBackend(chat.tokenizer, solve)


def make_env(tool=None, **options) -> ArithmeticEnv:
    env = ArithmeticEnv(**options)
    if tool is not None:
        env.tools = [tool]
    return env


async def run(env, backend, chat, parser, samples=None, manager=None, group_size=1, **config):
    manager = manager or ConcurrentToolManager(env.tools, timeout_s=60.0)
    trajectories = await rollout(
        samples if samples is not None else env.dataset(2), env=env, family=TemplateFamily(chat, parser),
        tool_manager=manager, backend=backend, config=RolloutConfig(**{**GREEDY, **config}), group_size=group_size)
    return trajectories


def all_ids(trajectory) -> list[int]:
    return trajectory.prompt_ids + [i for s in trajectory.segments for i in s.token_ids]


async def test_multi_turn_rollout_is_token_exact(backend, chat, parser):
    env = make_env(questions_per_episode=2)
    trajectories = await run(env, backend, chat, parser, env.dataset(3))
    calls = [c for t in trajectories for c in t.tool_calls]
    assert calls and all(c.name == "calculator" for c in calls)
    assert any(r.ok and r.content.lstrip("-").isdigit() for t in trajectories for r in t.tool_results)
    for trajectory in trajectories:
        assert trajectory.num_turns >= 2, trajectory.messages
        # After every observation, the ids kept so far decode to exactly the template's
        # rendering of the conversation so far, ready for the next assistant turn.
        ids, n_messages = list(trajectory.prompt_ids), len(trajectory.messages) - sum(
            s.num_messages for s in trajectory.segments)
        for segment in trajectory.segments:
            ids += segment.token_ids
            n_messages += segment.num_messages
            if segment.kind == "observation":
                rendered = chat.render(trajectory.messages[:n_messages], add_generation_prompt=True)
                assert chat.decode(ids, skip_special_tokens=False) == rendered
        assert check_retokenization(trajectory, chat).ok, check_retokenization(trajectory, chat).describe()


class NumberedLogprobs:
    """Gives every sampled token a log-probability of its own (a scripted backend gives them
    all the same one), so a logprob shifted against its token shows."""

    def __init__(self, backend):
        self.backend, self.sampled = backend, 0

    async def generate(self, prompt_ids, sampling):
        generation = await self.backend.generate(prompt_ids, sampling)
        n = len(generation.token_ids)
        generation.logprobs = [-(self.sampled + i + 1) / 1000 for i in range(n)]
        self.sampled += n
        return generation


async def test_loss_mask_covers_exactly_the_model_tokens(solver, chat, parser):
    env = make_env()
    trajectories = await run(env, NumberedLogprobs(solver), chat, parser)
    batch = to_tensordict(trajectories, pad_token_id=chat.tokenizer.pad_token_id)
    for row, trajectory in enumerate(trajectories):
        model_ids = [i for s in trajectory.segments if s.kind == "model" for i in s.token_ids]
        model_logprobs = [lp for s in trajectory.segments if s.kind == "model" for lp in s.logprobs]
        mask = batch["loss_mask"][row].bool()
        assert batch["input_ids"][row][mask].tolist() == model_ids
        assert batch["logprobs"][row][mask].tolist() == pytest.approx(model_logprobs)
        assert all(lp <= 0 for lp in model_logprobs)
        n = len(all_ids(trajectory))
        assert batch["input_ids"][row, :n].tolist() == all_ids(trajectory)
        assert batch["attention_mask"][row].sum() == n and batch["lengths"][row] == n


class RecordingBackend:
    """Passes requests to the real backend and keeps the sampling settings of each."""

    name = "recording"

    def __init__(self, backend):
        self.backend, self.requests = backend, []

    async def generate(self, prompt_ids, sampling):
        self.requests.append((len(prompt_ids), sampling))
        return await self.backend.generate(prompt_ids, sampling)


async def test_every_turn_samples_with_the_same_settings(solver, chat, parser):
    recording = RecordingBackend(solver)
    env = make_env(questions_per_episode=2)
    [trajectory] = await run(env, recording, chat, parser, env.dataset(1),
                             sampling={"temperature": 0.7, "top_p": 0.9, "seed": 3})
    assert len(recording.requests) == trajectory.num_turns >= 2
    settings = {(s.temperature, s.top_p, s.top_k, s.seed) for _, s in recording.requests}
    assert settings == {(0.7, 0.9, -1, 3)}


async def test_token_budget_ends_the_trajectory_without_truncation(solver, chat, parser):
    env = make_env(questions_per_episode=3)
    [sample] = env.dataset(1)
    [unbounded] = await run(env, solver, chat, parser, [sample], max_turns=1)
    prompt_len = len(unbounded.prompt_ids)
    budget = prompt_len + 60
    [trajectory] = await run(env, solver, chat, parser, [sample], max_trajectory_tokens=budget, max_turns=8)
    assert trajectory.stop_reason == "token_budget"
    assert len(all_ids(trajectory)) <= budget
    # Either the last turn filled the budget, or the next observation did not fit.
    assert len(all_ids(trajectory)) == budget or "does not fit" in trajectory.metadata["error"]
    [short] = await run(env, solver, chat, parser, [sample], max_trajectory_tokens=prompt_len)
    assert short.stop_reason == "prompt_too_long" and not short.segments


class _AnswerForgettingFamily(TemplateFamily):
    """A format that rewrites its history (as a context-managing agent does): once the env
    asks a new question, the conversation is shown as its system message, a long note of what
    was dropped, and that question."""

    @staticmethod
    def _question(message):  # (the qwen3 format shows tool results as user messages)
        return message.role == "user" and "<tool_response>" not in message.content

    def observation_ids(self, completion_ids, context_ids, observation):
        if any(self._question(m) for m in observation):
            return None  # not an extension of the ids: a new sequence
        return super().observation_ids(completion_ids, context_ids, observation)

    def prompt(self, messages, tools):
        last = max(i for i, m in enumerate(messages) if self._question(m))
        kept = [*(m for m in messages[:last] if m.role == "system"), messages[last]]
        if any(m.role == "assistant" for m in messages):  # a rewrite: a note of what it dropped
            kept.insert(-1, Message("user", "Earlier questions were answered. " * 30))
        return super().prompt(kept, tools)


async def test_a_family_that_rewrites_history_makes_one_sequence_per_rewrite(solver, chat, parser):
    """Each sequence is exact (its prompt the family's render, then its turns as sampled and
    its observations appended) and every sampled turn is in one sequence; the token limit is
    per sequence: what the model sees at once."""
    env = make_env(questions_per_episode=3, few_shot=False)
    [sample] = env.dataset(1)
    family = _AnswerForgettingFamily(chat, parser)
    sampled = []
    backend = ScriptedBackend(chat.tokenizer, lambda text: sampled.append(solve(text)) or sampled[-1])
    config = RolloutConfig(**{**GREEDY, "max_turns": 8})
    [trajectory] = await rollout([sample], env=env, family=family, backend=backend, config=config,
                                 tool_manager=ConcurrentToolManager(env.tools, timeout_s=60.0))
    assert trajectory.stop_reason in ("env_done", "no_tool_call") and len(trajectory.sequences) == 3
    written = [chat.tokenizer.decode(s.token_ids, skip_special_tokens=True) for s in trajectory.all_segments
               if s.kind == "model"]
    assert written == sampled  # (each turn ends at the end-of-turn token the backend adds)
    assert len(sampled) == 6 and trajectory.num_turns == 6
    for k, sequence in enumerate(trajectory.sequences):
        assert [s.kind for s in sequence.segments if s.token_ids] == ["model", "observation", "model"]
        assert backend.prompts[2 * k] == sequence.prompt_ids  # what generation saw first
        question = chat.tokenizer.decode(sequence.prompt_ids).rsplit("What is ", 1)[1]
        assert "What is " not in question and "<tool_response>" not in question  # the history is gone
        assert (k > 0) == ("Earlier questions" in chat.tokenizer.decode(sequence.prompt_ids))
    longest = max(len(q.prompt_ids) + sum(len(s.token_ids) for s in q.segments) for q in trajectory.sequences)
    total = sum(len(q.prompt_ids) + sum(len(s.token_ids) for s in q.segments) for q in trajectory.sequences)
    # the limit holds each sequence, not their sum
    [fits] = await rollout([sample], env=make_env(questions_per_episode=3, few_shot=False), family=family,
                           backend=ScriptedBackend(chat.tokenizer, solve),
                           config=RolloutConfig(**{**GREEDY, "max_turns": 8, "max_trajectory_tokens": longest + 1}),
                           tool_manager=ConcurrentToolManager(env.tools, timeout_s=60.0))
    assert longest + 1 < total and len(fits.sequences) == 3 and fits.stop_reason == trajectory.stop_reason
    # a conversation rendered afresh that does not fit ends the trajectory with the reason
    first = trajectory.sequences[0]
    assert len(first.prompt_ids) + sum(len(s.token_ids) for s in first.segments) < len(trajectory.sequences[1].prompt_ids)
    [cut] = await rollout([sample], env=make_env(questions_per_episode=3, few_shot=False), family=family,
                          backend=ScriptedBackend(chat.tokenizer, solve),
                          config=RolloutConfig(**{**GREEDY, "max_turns": 8,
                                                  "max_trajectory_tokens": len(trajectory.sequences[1].prompt_ids)}),
                          tool_manager=ConcurrentToolManager(env.tools, timeout_s=60.0))
    assert cut.stop_reason == "token_budget" and "rendered afresh" in cut.metadata["error"]


async def test_max_turns(solver, chat, parser):
    env = make_env(questions_per_episode=3)
    [trajectory] = await run(env, solver, chat, parser, env.dataset(1), max_turns=1)
    assert trajectory.stop_reason == "max_turns" and trajectory.num_turns == 1


def test_config_errors_are_reported_together():
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as info:
        RolloutConfig(max_turns=0, on_tool_error="explode", unknown_key=1)
    text = str(info.value)
    assert "max_turns" in text and "on_tool_error" in text and "unknown_key" in text


# ----------------------------------------------------------------- failures are survived


def calculator_that(behaviour):
    async def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return await behaviour(expression)
    return function_tool(calculator)


async def raise_error(expression):
    raise RuntimeError("the calculator is broken")


async def hang(expression):
    await asyncio.Event().wait()


async def test_failing_hanging_and_unknown_tools_become_error_observations(solver, chat, parser):
    cases = {
        "exception": calculator_that(raise_error),
        "timeout": calculator_that(hang),
        "unknown_tool": function_tool(lambda expression: "0", name="calc", description="a calculator"),
        "invalid_arguments": function_tool(lambda expression, base: "0", name="calculator", description="needs a base"),
    }
    for kind, tool in cases.items():
        env = make_env(tool)
        manager = ConcurrentToolManager(env.tools, timeout_s=0.3)
        [trajectory] = await run(env, solver, chat, parser, env.dataset(1), manager=manager)
        assert trajectory.metadata["tool_errors"].get(kind, 0) >= 1, (kind, trajectory.metadata)
        failed = [r for r in trajectory.tool_results if not r.ok]
        assert failed and failed[0].error == kind
        # The model saw the error and the episode went on.
        observation_text = "\n".join(m.content for m in trajectory.messages if m.role == "user")
        assert failed[0].content in observation_text
        assert trajectory.num_turns >= 2, kind
        metrics = rollout_metrics([trajectory])
        assert metrics[f"rollout/tool_errors/{kind}"] >= 1


async def test_slow_tool_is_waited_for(solver, chat, parser):
    async def slow(expression):
        await asyncio.sleep(0.4)
        return "84"
    env = make_env(calculator_that(slow))
    [trajectory] = await run(env, solver, chat, parser, env.dataset(1))
    assert trajectory.tool_results and trajectory.tool_results[0].ok
    assert trajectory.tool_results[0].latency_s >= 0.4


def solve_with_single_quotes(text: str) -> str:
    """A model that writes its calls with single-quoted (invalid) JSON."""
    return solve(text).replace('"', "'")


async def test_parse_errors_are_observed_counted_and_policy_applies(chat, parser):
    env = make_env()
    malformed = ScriptedBackend(chat.tokenizer, solve_with_single_quotes)
    [observed] = await run(env, malformed, chat, parser, env.dataset(1), max_turns=2)
    assert observed.metadata["parse_errors"] >= 1
    assert observed.num_turns == 2  # the parse error was shown and the model went on
    assert any(m.role == "user" and "Error:" in m.content and "<tool_response>" in m.content
               for m in observed.messages)
    [ended] = await run(env, malformed, chat, parser, env.dataset(1), on_tool_error="end")
    assert ended.stop_reason == "tool_error" and ended.num_turns == 1
    [penalised] = await run(env, malformed, chat, parser, env.dataset(1), max_turns=1, on_tool_error="penalty",
                            tool_error_penalty=-0.5)
    assert penalised.turn_rewards[0] <= -0.5


async def test_the_tool_error_penalty_is_the_models_failures_not_the_services(solver, chat, parser):
    """on_tool_error=penalty: a timeout or an outage is not the model's mistake (no penalty);
    a plain exception is, unless rollout.tool_exception_side says tools' exceptions are outages."""
    async def outage(expression):
        raise InfrastructureError("the calculator service answered 503")

    for behaviour, side, penalised in ((outage, "policy", False), (hang, "policy", False),
                                       (raise_error, "policy", True), (raise_error, "infrastructure", False)):
        env = make_env(calculator_that(behaviour))
        manager = ConcurrentToolManager(env.tools, timeout_s=0.2)
        [one] = await run(env, solver, chat, parser, env.dataset(1), manager=manager, max_turns=2,
                          on_tool_error="penalty", tool_error_penalty=-0.5, tool_exception_side=side)
        assert one.tool_results and not one.tool_results[0].ok, behaviour
        assert (one.turn_rewards[0] == -0.5) is penalised and one.turn_rewards[0] in (0.0, -0.5), (behaviour, side)


class CountingEnv(ArithmeticEnv):
    def __init__(self, fail_in=None, **options):
        super().__init__(**options)
        self.fail_in, self.opened, self.closed = fail_in, 0, 0

    async def reset(self, sample):
        if self.fail_in == "reset":
            raise KeyError("no such question")
        self.opened += 1
        return await super().reset(sample)

    async def step(self, state, turn, results):
        if self.fail_in == "step":
            raise RuntimeError("step failed")
        return await super().step(state, turn, results)

    async def close(self, state):
        self.closed += 1


async def test_env_failures_end_only_their_trajectory_and_close_is_always_called(solver, chat, parser):
    for where in ("reset", "step"):
        env = CountingEnv(fail_in=where)
        trajectories = await run(env, solver, chat, parser, env.dataset(2))
        assert {t.stop_reason for t in trajectories} == {"env_error"}
        assert all(where in t.metadata["error"] for t in trajectories)
        assert env.closed == env.opened


class OneToolParser:
    """A parser that can present only a tool called "search" (like the search_r1 parser)."""

    def __init__(self, inner):
        self.inner = inner

    def render_system_prompt(self, system_prompt, tools):
        if any(tool.name != "search" for tool in tools):
            raise ValueError("only the search tool can be called in this format")
        return system_prompt

    def __getattr__(self, name):
        return getattr(self.inner, name)


async def test_a_parser_that_cannot_present_the_tools_ends_only_that_episode(solver, chat, parser):
    env = CountingEnv()
    trajectories = await run(env, solver, chat, OneToolParser(parser), env.dataset(2))
    assert {t.stop_reason for t in trajectories} == {"env_error"}
    assert all("could not present the tools: ValueError: only the search tool" in t.metadata["error"] for t in trajectories)
    assert env.closed == env.opened == 2


async def test_cancelling_a_rollout_closes_every_episode(solver, chat, parser):
    started = asyncio.Event()

    async def hang_until_cancelled(expression):
        started.set()
        await asyncio.Event().wait()

    env = CountingEnv()
    env.tools = [calculator_that(hang_until_cancelled)]
    task = asyncio.create_task(run(env, solver, chat, parser, env.dataset(2),
                                   manager=ConcurrentToolManager(env.tools, timeout_s=60)))
    await asyncio.wait_for(started.wait(), timeout=120)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert env.opened == 2 and env.closed == 2


async def test_trajectories_never_wait_for_each_other(solver, chat, parser):
    """One trajectory's tool blocks until the other trajectory has finished completely."""
    other_done = asyncio.Event()

    async def gated(expression, ctx=None):
        if ctx["sample"]["id"].endswith("-0"):
            await asyncio.wait_for(other_done.wait(), timeout=120)
        return "1"

    class Observer:
        @hookimpl
        def rlfactory_on_trajectory_end(self, trajectory, sample):
            if sample["id"].endswith("-1"):
                other_done.set()

    async def calculator(expression: str, ctx=None) -> str:
        """Evaluate an arithmetic expression."""
        return await gated(expression, ctx)

    env = make_env(function_tool(calculator))
    manager = ConcurrentToolManager(env.tools, timeout_s=600)
    with registered_plugin(Observer()):
        first, second = await run(env, solver, chat, parser, env.dataset(2), manager=manager)
    assert other_done.is_set()
    assert first.tool_results and first.tool_results[0].ok


async def test_on_env_step_rewards_are_added_to_turn_rewards(solver, chat, parser):
    seen = []

    class Shaping:
        @hookimpl
        def rlfactory_on_env_step(self, trajectory, turn, results, step):
            seen.append((trajectory.sample_id, len(results)))
            return 0.25

    env = make_env()
    with registered_plugin(Shaping()):
        [trajectory] = await run(env, solver, chat, parser, env.dataset(1))
    assert len(seen) == trajectory.num_turns
    assert trajectory.turn_rewards == [0.25] * trajectory.num_turns


async def test_groups_and_trajectory_end_observer(solver, chat, parser):
    ended = []

    class Observer:
        @hookimpl
        def rlfactory_on_trajectory_end(self, trajectory, sample):
            ended.append((sample["id"], trajectory.stop_reason))

    env = make_env()
    samples = env.dataset(2)
    with registered_plugin(Observer()):
        trajectories = await run(env, solver, chat, parser, samples, group_size=2,
                                 sampling={"temperature": 1.0, "seed": 0})
    assert [t.sample_id for t in trajectories] == [samples[0]["id"]] * 2 + [samples[1]["id"]] * 2
    assert [t.group for t in trajectories] == [0, 0, 1, 1]
    assert sorted(sample_id for sample_id, _ in ended) == sorted(t.sample_id for t in trajectories)
    assert all(reason for _, reason in ended)
    metrics = rollout_metrics(trajectories)
    assert metrics["rollout/trajectories"] == 4
    assert sum(v for k, v in metrics.items() if k.startswith("rollout/stop/")) == pytest.approx(1.0)


async def test_final_answer_comes_from_the_env(solver, chat, parser):
    env = make_env()
    [sample] = env.dataset(1)
    [trajectory] = await run(env, solver, chat, parser, [sample])
    assert trajectory.stop_reason in ("env_done", "max_turns")
    if trajectory.stop_reason == "env_done":
        assert trajectory.final_answer is not None
    # the solver answers with the calculator's result; the env reads the number from it
    assert (trajectory.stop_reason, trajectory.final_answer) == ("env_done", sample["answer"])
    assert trajectory.messages[0] == Message(role="system", content=trajectory.messages[0].content)
    assert "<tools>" in trajectory.messages[0].content
