"""Outcomes (:mod:`rlfactory_core.outcomes`): every stop reason and tool error kind of the core
and the shipped plugins maps to exactly one class on one side, by the documented precedence;
the vocabularies are read from the one source; real failing tools through the real tool
manager produce the classes."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from rlfactory_core import (CALL_ERRORS, OUTCOMES, InfrastructureError, ToolCall, ToolResult, Trajectory,
                            TransientToolError, function_tool, outcome_of)
from rlfactory_core import outcomes
from rlfactory_core.default_plugins.tool_managers import ERROR_KINDS, ConcurrentToolManager
from rlfactory_core.rollout import STOP_REASONS
from rlfactory_core.training.overlong import LIMIT_STOPS

POLICY_CLASSES = {"answered", "no_answer", "max_turns", "token_budget", "malformed_call", "unknown_tool",
                  "invalid_arguments", "tool_error_caused_by_call"}
INFRASTRUCTURE_CLASSES = {"tool_timeout", "tool_unavailable", "tool_infra_error", "backend_error", "env_error",
                          "reward_error"}


def _trajectory(stop="env_done", results=(), answer=None, parse_errors=0):
    return Trajectory(sample_id="s", prompt_ids=[1], tool_results=list(results), final_answer=answer,
                      stop_reason=stop, metadata={"parse_errors": parse_errors})


def _failed(kind, **fields):
    return ToolResult(name="t", content="Error", error=kind, **fields)


def test_the_classes_and_their_sides_are_the_documented_table():
    assert {n for n, o in OUTCOMES.items() if o.side == "policy"} == POLICY_CLASSES
    assert {n for n, o in OUTCOMES.items() if o.side == "infrastructure"} == INFRASTRUCTURE_CLASSES
    for name in OUTCOMES:  # each row of the module docstring's table names its class and side
        assert f"``{name}``" in outcomes.__doc__
    with pytest.raises(ValueError, match="unknown outcome 'oops': one of answered, "):
        outcomes.side_of("oops")


# Every stop reason of the core, alone (no tool results, no answer), and its class.
BY_STOP = {"no_tool_call": "no_answer", "env_done": "no_answer", "max_turns": "max_turns",
           "token_budget": "token_budget", "prompt_too_long": "env_error", "tool_error": "no_answer",
           "aborted": "backend_error", "env_error": "env_error", "generation_error": "backend_error",
           "cancelled": "backend_error"}


def test_every_stop_reason_of_the_core_has_one_class():
    assert set(BY_STOP) == set(STOP_REASONS)  # a new stop reason must be classified here
    for reason, expected in BY_STOP.items():
        assert outcome_of(_trajectory(reason)) == expected, reason
    with pytest.raises(ValueError, match=r"unknown stop reason 'exploded': add it to rlfactory_core.outcomes"):
        outcome_of(_trajectory("exploded"))


# Every error kind of the core's tool manager and parser, and the shipped plugins' own kinds
# (returned as ToolResult.error by their tools, kept in metadata["tool_error"]), as a result
# holds them after the tool manager: (error, fields) -> class.
BY_RESULT = [
    (("unknown_tool", {}), "unknown_tool"),
    (("invalid_arguments", {}), "invalid_arguments"),
    (("parse_error", {}), "malformed_call"),
    (("timeout", {}), "tool_timeout"),
    (("timeout", {"transient": True}), "tool_timeout"),  # retry_timeouts: still a timeout when spent
    (("exception", {}), "tool_error_caused_by_call"),  # unmarked: the policy's by default
    (("exception", {"transient": True}), "tool_unavailable"),  # TransientToolError/ConnectionError, retries spent
    (("exception", {"infrastructure": True}), "tool_infra_error"),  # InfrastructureError
    (("tool_error", {"metadata": {"tool_error": "sql_error"}, "infrastructure": False}), "tool_error_caused_by_call"),
    (("tool_error", {"metadata": {"tool_error": "sql_timeout"}, "infrastructure": False}),
     "tool_error_caused_by_call"),  # a limit on what the model asked for
    (("tool_error", {"metadata": {"tool_error": "sql_refused"}, "infrastructure": False}), "tool_error_caused_by_call"),
    (("tool_error", {"metadata": {"tool_error": "sql_too_many_rows"}, "infrastructure": False}),
     "tool_error_caused_by_call"),
    (("tool_error", {"metadata": {"tool_error": "sql_no_database"}, "infrastructure": True}), "tool_infra_error"),
    (("tool_error", {"metadata": {"tool_error": "device_error"}, "infrastructure": True}), "tool_infra_error"),
    (("tool_error", {}), "tool_error_caused_by_call"),  # the MCP server's isError result
]


@pytest.mark.parametrize(("failure", "expected"), BY_RESULT, ids=[f"{k}-{e}" for (k, _), e in BY_RESULT])
def test_every_tool_error_kind_has_one_class(failure, expected):
    kind, fields = failure
    result = _failed(kind, **fields)
    assert outcomes.result_outcome(result) == expected
    # and it is the trajectory's outcome when it is its only signal (no answer)
    assert outcome_of(_trajectory(results=[result])) == expected


def test_the_core_kinds_are_read_from_the_one_source():
    assert set(ERROR_KINDS) | {"parse_error"} == set(outcomes.TOOL_ERROR_KINDS)
    assert {kind for (kind, _), _ in BY_RESULT} == set(outcomes.TOOL_ERROR_KINDS)
    assert tuple(STOP_REASONS) == tuple(outcomes.STOP_REASONS)
    assert LIMIT_STOPS is outcomes.LIMIT_STOPS and LIMIT_STOPS == {"max_turns", "token_budget"}
    assert CALL_ERRORS == {"unknown_tool", "invalid_arguments"}
    from rlfactory_deepsearch import reward as deepsearch_reward

    from rlfactory_core.default_plugins import rewards

    assert rewards._CALL_FORMAT_ERRORS is CALL_ERRORS and deepsearch_reward._INVALID_CALLS is CALL_ERRORS


def test_an_unmarked_exception_takes_the_configured_side():
    plain = _failed("exception")
    assert outcomes.result_outcome(plain, unmarked_exception="infrastructure") == "tool_infra_error"
    assert outcome_of(_trajectory(results=[plain]), unmarked_exception="infrastructure") == "tool_infra_error"
    assert outcome_of(_trajectory(results=[plain])) == "tool_error_caused_by_call"


@pytest.mark.parametrize(("trajectory", "reward_failed", "expected"), [
    # a timed-out search, then a right answer: the later turns read a corrupted result
    (_trajectory(results=[_failed("timeout"), ToolResult(name="t", content="ok")], answer="42"), False,
     "tool_timeout"),
    # how the episode stopped comes first
    (_trajectory("env_error", results=[_failed("timeout")]), True, "env_error"),
    (_trajectory("generation_error", results=[_failed("exception", transient=True)]), False, "backend_error"),
    # then the reward's failure, then the tools': unavailable before timeout before a reported failure
    (_trajectory(results=[_failed("timeout")], answer="42"), True, "reward_error"),
    (_trajectory(results=[_failed("exception", infrastructure=True), _failed("timeout"),
                          _failed("exception", transient=True)]), False, "tool_unavailable"),
    (_trajectory(results=[_failed("exception", infrastructure=True), _failed("timeout")]), False, "tool_timeout"),
    # an infrastructure failure outranks a limit; a limit outranks the policy's other classes
    (_trajectory("max_turns", results=[_failed("timeout")]), False, "tool_timeout"),
    (_trajectory("token_budget", results=[_failed("invalid_arguments")], answer="x", parse_errors=1), False,
     "token_budget"),
    # an answer outranks the failed calls on the way to it
    (_trajectory(results=[_failed("unknown_tool")], answer="42", parse_errors=2), False, "answered"),
    # no answer: a malformed call, else the first failed call
    (_trajectory(results=[_failed("invalid_arguments")], parse_errors=1), False, "malformed_call"),
    (_trajectory("tool_error", results=[_failed("unknown_tool"), _failed("invalid_arguments")]), False,
     "unknown_tool"),
    (_trajectory(answer=""), False, "answered"),  # an empty answer is still an answer (graded by the reward)
])
def test_the_precedence_of_several_signals(trajectory, reward_failed, expected):
    assert outcome_of(trajectory, reward_failed=reward_failed) == expected


def test_real_failing_tools_through_the_tool_manager_produce_their_classes():
    """A hanging tool, a tool whose service is down (retries spent), one that reports an
    outage, one that raises a plain error, and a call with bad arguments, each through the
    real ConcurrentToolManager."""
    attempts = []

    @function_tool
    def hangs(query: str) -> str:
        """Never answers in time."""
        time.sleep(2)
        return "late"

    @function_tool
    def down(query: str) -> str:
        """Its service is down."""
        attempts.append(query)
        raise TransientToolError("503 Service Unavailable")

    @function_tool
    def outage(query: str) -> str:
        """Its service reports an outage."""
        raise InfrastructureError("the index server answered 500")

    @function_tool
    def opens(path: str) -> str:
        """Opens a file the model named."""
        raise FileNotFoundError(path)

    manager = ConcurrentToolManager([hangs, down, outage, opens], timeout_s=0.2, max_retries=2,
                                    retry_backoff_s=0.0)
    calls = [ToolCall(name="hangs", arguments={"query": "q"}), ToolCall(name="down", arguments={"query": "q"}),
             ToolCall(name="outage", arguments={"query": "q"}), ToolCall(name="opens", arguments={"path": "/x"}),
             ToolCall(name="opens", arguments={"query": 3}), ToolCall(name="nope", arguments={})]
    results = asyncio.run(manager.call(calls, {}))
    assert [outcomes.result_outcome(r) for r in results] == [
        "tool_timeout", "tool_unavailable", "tool_infra_error", "tool_error_caused_by_call", "invalid_arguments",
        "unknown_tool"]
    assert len(attempts) == 3 and results[2].infrastructure is True and results[3].infrastructure is None

    @function_tool
    def odd(query: str) -> ToolResult:
        """Marks its failure with something that is not a bool."""
        return ToolResult(name="odd", content="Error: no", error="busy", infrastructure="yes")

    [marked] = asyncio.run(ConcurrentToolManager([odd]).call([ToolCall(name="odd", arguments={"query": "q"})], {}))
    assert marked.infrastructure is None and outcomes.result_outcome(marked) == "tool_error_caused_by_call"
    assert outcome_of(_trajectory(results=results)) == "tool_unavailable"


def test_the_reward_layer_gives_each_trajectory_its_outcome_once():
    """With the scores (ScoredBatch.outcomes): a reward that raises on one trajectory makes it
    reward_error; a trajectory the core never ended (built by hand) is left unclassified."""
    from rlfactory_core.config import RewardSpec
    from rlfactory_core.rewards import ScoredBatch, build_reward_layer
    from rlfactory_core.testing import registered_plugin

    class Flaky:
        name, description = "flaky", "raises for the sample marked so"

        def score(self, trajectory, sample):
            if sample.get("fail"):
                raise ConnectionError("the judge is down")
            return 1.0

    class Plugin:
        from rlfactory_core import hookimpl

        @hookimpl
        def rlfactory_register_rewards(self, register):
            register(Flaky)

    trajectories = [_trajectory("no_tool_call", answer="7"), _trajectory("no_tool_call", answer="7"),
                    _trajectory("max_turns", results=[_failed("timeout")]), _trajectory("")]
    with registered_plugin(Plugin()):
        layer = build_reward_layer([RewardSpec(name="flaky"), RewardSpec(name="exact_match")])
        scored = asyncio.run(layer.score(trajectories, [{"answer": "7"}, {"answer": "7", "fail": True},
                                                        {"answer": "7"}, {"answer": "7"}]))
    assert scored.outcomes == ["answered", "reward_error", "tool_timeout", None]
    assert ScoredBatch.concat([scored.select([3, 1]), scored.select([0])]).outcomes == [None, "reward_error",
                                                                                       "answered"]
    side = build_reward_layer([RewardSpec(name="exact_match")], tool_exception_side="infrastructure")
    plain = asyncio.run(side.score([_trajectory(results=[_failed("exception")])], [{"answer": "7"}]))
    assert plain.outcomes == ["tool_infra_error"]


def test_outcome_metrics_by_hand():
    names = ["answered", "answered", "tool_timeout", None, "reward_error", "malformed_call"]
    correct = [True, False, True, True, None, False]
    # 5 classified: answered 2/5, tool_timeout, reward_error, malformed_call 1/5 each;
    # infrastructure 2/5; policy-only accuracy over answered x2 and malformed_call: 1/3
    assert outcomes.outcome_metrics("outcome", names, correct) == pytest.approx({
        "outcome/answered": 0.4, "outcome/tool_timeout": 0.2, "outcome/reward_error": 0.2,
        "outcome/malformed_call": 0.2, "outcome/infrastructure": 0.4, "outcome/accuracy_policy_only": 1 / 3})
    assert outcomes.outcome_metrics("eval/outcome", ["answered"]) == {"eval/outcome/answered": 1.0,
                                                                      "eval/outcome/infrastructure": 0.0}
    assert outcomes.outcome_metrics("outcome", [None, None]) == {}


def test_masked_failures_carry_no_loss_and_move_no_baseline_in_the_batch():
    from rlfactory_core.config import load_config
    from rlfactory_core.training.batch import build_batch
    from rlfactory_core.training.grpo import group_advantages
    from rlfactory_core.types import Segment

    def member(group, tokens):
        t = Trajectory(sample_id=f"s{group}", prompt_ids=[1, 2, 3], stop_reason="no_tool_call", group=group)
        t.segments.append(Segment("model", [7] * tokens, [-0.5] * tokens))
        return t

    rows = [member(0, 5), member(0, 5), member(0, 5), member(1, 4), member(1, 4)]
    rewards = [1.0, 0.0, 0.0, 1.0, 0.0]
    outcomes_ = ["answered", "tool_timeout", "answered", "answered", "reward_error"]
    config = load_config([], [])
    masked = config.failures.masked(outcomes_)
    assert masked == [False, True, False, False, True]  # the infrastructure's classes, by default
    batch = build_batch(rows, rewards, config, pad_id=0, masked=masked)
    assert batch["loss_mask"].sum(-1).tolist() == [5, 0, 5, 4, 0]
    want = group_advantages(torch.tensor(rewards), [0, 0, 0, 1, 1], "group", include=[not m for m in masked])
    assert torch.equal(batch["sequence_advantages"], want) and want[1] == want[4] == 0.0
    assert batch["trajectory_tokens"].tolist() == [5, 0, 5, 4, 0]  # the loss normalisers count no masked token
    # importance weights (rlfactory_core.resampling.selection_weights) reach the advantages
    weights = [2.0, 1.0, 1.0, 1.0, 3.0]
    weighted = build_batch(rows, rewards, config, pad_id=0, masked=masked, weights=weights)
    assert torch.equal(weighted["sequence_advantages"], group_advantages(
        torch.tensor(rewards), [0, 0, 0, 1, 1], "group", include=[not m for m in masked], weights=weights))
    penalized = load_config([], ["failures.infrastructure=penalize"]).failures.masked(outcomes_)
    assert penalized == [False] * 5  # today's behaviour, on request


def test_selection_weights_undo_keeping_only_the_attempts_the_service_answered():
    """A step whose searches failed 2 of 6 times (f = 1/3) and whose 2 lookups never did: a kept
    trajectory with two answered searches survived with probability (2/3)^2 and weighs 9/4, one
    with one search 3/2, one without 1; lookups weigh nothing. Per group, the largest weight over
    the group's mean is reported. A class trained as scored selects nothing: no weights; nor
    with failures.resample_correction=none, nor in a step without failures."""
    from rlfactory_core.config import load_config
    from rlfactory_core.resampling import Replaced, selection_weights

    def member(group, *results):
        return Trajectory(sample_id=f"s{group}", prompt_ids=[1], group=group, tool_results=list(results))

    search, lookup = ToolResult("search", "ok"), ToolResult("lookup", "ok")
    down = ToolResult("search", "503", error="exception", transient=True)  # tool_unavailable
    kept = [member(0, search, search), member(0, search, lookup), member(1, lookup), member(1)]
    failed = [member(0, search, down), member(1, down)]
    replaced = [Replaced(t.group, 0, 0, t, scored=None) for t in failed]  # their scores play no part
    weights, metrics = selection_weights(load_config([], []), kept, replaced)
    assert weights == pytest.approx([9 / 4, 3 / 2, 1.0, 1.0])
    # 2 failed of 8 calls; group 0's weights (9/4, 3/2) average 15/8: the largest is 1.2 times that
    assert metrics == pytest.approx({"failures/call_failure_rate": 2 / 8, "failures/weight_max": 1.2})
    assert selection_weights(load_config([], ["failures.infrastructure=penalize"]), kept, replaced) == (None, {})
    assert selection_weights(load_config([], ["failures.resample_correction=none"]), kept, replaced) == (None, {})
    assert selection_weights(load_config([], []), kept) == (None, {})


SERVICE = {"fails": lambda expression: "+" in expression}  # when the calculator's service fails


async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    if SERVICE["fails"](expression):
        raise InfrastructureError("the calculator service answered 503")
    return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 - digits and one operator


def calls_then_answers(text):
    """A scripted model: calls the calculator on the question, then answers with what it said."""
    question = text.rsplit("What is ", 1)[1]
    if "<tool_response>" not in question:
        call = '{"name": "calculator", "arguments": {"expression": "%s"}}' % question.split("?", 1)[0]
        return f"<tool_call>\n{call}\n</tool_call>"
    return "The answer is " + question.rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>", 1)[0]


def flaky_run(run_dir, model_dir, *overrides, resume=None, after_step=None, seeds=None):
    """A run of the arithmetic task on the flaky calculator, with the scripted model;
    ``after_step(step)`` is called as each step ends; ``seeds`` (a list) gets the sampling seed
    of every model turn."""
    from rlfactory_arithmetic import ArithmeticEnv

    from rlfactory_core import hookimpl
    from rlfactory_core.config import load_config
    from rlfactory_core.models import load_tokenizer
    from rlfactory_core.testing import ScriptedBackend, registered_plugin, scripted_backend, train

    class FlakyArithmetic(ArithmeticEnv):
        name, description = "flaky_arithmetic", "arithmetic whose calculator service fails"

        def __init__(self, **options):
            super().__init__(**options)
            self.tools = [function_tool(calculator)]  # the name the model calls

    class Plugin:
        @hookimpl
        def rlfactory_register_envs(self, register):
            register(FlakyArithmetic)

        @hookimpl
        def rlfactory_on_train_step_end(self, step, metrics):
            if after_step is not None:
                after_step(step)

    config = load_config([], ["env=flaky_arithmetic", "backend=hf", f"model.name={model_dir}", f"run_dir={run_dir}",
                              "train.steps=1", "grpo.prompts_per_step=4", "grpo.group_size=2", "rollout.max_turns=2",
                              "data.eval_size=4", "eval.every=0", "logging.live=off", "logging.tensorboard=false",
                              "logging.record_train_groups=4", "env_options={few_shot: false}",
                              "cold_start.source=off", *overrides])
    class Backend(ScriptedBackend):
        async def generate(self, prompt_ids, sampling, **options):
            if seeds is not None:
                seeds.append(sampling.seed)
            return await super().generate(prompt_ids, sampling, **options)

    with registered_plugin(Plugin()), scripted_backend(lambda path: Backend(load_tokenizer(path), calls_then_answers)):
        return train(config, resume=resume)


def test_a_run_masks_a_failing_services_trajectories_and_counts_them(tmp_path, tiny_model_dir):
    """The calculator's service fails on sums (InfrastructureError), the scripted model always
    calls it: the sums' trajectories end tool_infra_error and, with failures.infrastructure=mask,
    are masked; with failures.infrastructure=penalize they train as scored."""
    from rlfactory_core.metrics import read_metrics
    from rlfactory_core.records import RunRecords

    SERVICE["fails"] = lambda expression: "+" in expression
    flaky_run(tmp_path / "masked", tiny_model_dir, "failures.infrastructure=mask")
    step, records = read_metrics(tmp_path / "masked")[1], RunRecords(tmp_path / "masked")
    share = step["outcome/tool_infra_error"]
    assert 0 < share < 1 and step["outcome/masked/tool_infra_error"] == share
    assert step["outcome/infrastructure"] == share and "eval/outcome/infrastructure" in step
    for row in records.list("train", 1):
        failed = row["outcome"] == "tool_infra_error"
        assert row["outcome_side"] == ("infrastructure" if failed else "policy")
        assert (row["advantage"] == 0.0) if failed else row["outcome"] == "answered"
    flaky_run(tmp_path / "penalized", tiny_model_dir, "failures.infrastructure=penalize")
    penalized = read_metrics(tmp_path / "penalized")[1]
    assert penalized["outcome/tool_infra_error"] == share and "outcome/masked/tool_infra_error" not in penalized
    assert step["advantage/on_infrastructure"] == 0.0


@pytest.mark.parametrize("mode", ["sync", "one_step_off", "async"])
def test_a_step_mostly_lost_to_an_outage_aborts_saves_the_last_step_and_resumes(tmp_path, tiny_model_dir, mode):
    """failures.classes={tool_infra_error: abort}: the service goes down after step 1, so step
    2's trajectories all end tool_infra_error: the run stops before training it, with one line
    naming the class, status failed, step 1 saved (checkpoint.every would not have saved it);
    once the service is back, --resume trains step 2 from there. In every training mode (the
    overlapping ones roll step 2 out while step 1 trains: its outage starts with step 1's
    rollout done, so step 2's rollout fails whenever it runs)."""
    from rlfactory_core.metrics import read_metrics
    from rlfactory_core.run import RunAborted
    from rlfactory_core.run_status import read_status
    from rlfactory_core.testing import latest_checkpoint

    from rlfactory_arithmetic import ArithmeticEnv

    from rlfactory_core.data import batch_indices

    # the service fails on step 2's questions (the data order's prompts 4-7), whenever they run
    samples = ArithmeticEnv().dataset(split="train")
    step_2 = {samples[i]["questions"][0].removeprefix("What is ").rstrip("?")
              for i in batch_indices(len(samples), 8, seed=0, position=0)[4:]}
    SERVICE["fails"] = lambda expression: expression in step_2
    run_dir = tmp_path / "run"
    settings = ["train.steps=2", "checkpoint.every=100", "failures.classes={tool_infra_error: abort}",
                f"train.mode={mode}", "grpo.tis_cap=2.0"]
    with pytest.raises(RunAborted) as aborted:
        flaky_run(run_dir, tiny_model_dir, *settings)
    message = str(aborted.value)
    assert "\n" not in message and message.startswith(
        "step 2 not trained: 100% of the step's trajectories ended in tool_infra_error")
    assert f"step 1 is saved: once the service is back, continue with `rlf train --resume {run_dir}`" in message
    status = read_status(run_dir)
    assert status.state == "failed" and "tool_infra_error" in status.message
    assert latest_checkpoint(run_dir).name == "step-000001"
    assert [m["step"] for m in read_metrics(run_dir) if "train/loss" in m] == [1]

    SERVICE["fails"] = lambda expression: False  # the service is back
    flaky_run(run_dir, tiny_model_dir, *settings, resume=run_dir)
    assert [m["step"] for m in read_metrics(run_dir) if "train/loss" in m] == [1, 2]
    assert read_status(run_dir).state == "finished" and latest_checkpoint(run_dir).name == "step-000002"
    SERVICE["fails"] = lambda expression: "+" in expression


def test_a_failures_section_with_several_mistakes_names_each_at_once():
    from rlfactory_core.config import load_config
    from rlfactory_core.errors import ConfigError

    with pytest.raises(ConfigError) as bad:
        load_config([], ["failures.classes={answered: explode, nope: mask}", "failures.abort_share=0",
                         "failures.extra=1", "rollout.tool_exception_side=maybe", "failures.policy=retry"])
    errors = bad.value.errors
    assert any(e.startswith("failures.classes: unknown outcome class 'nope'; 'answered': unknown handling 'explode'")
               for e in errors), errors
    assert {e.split(":")[0] for e in errors} == {"failures.classes", "failures.abort_share", "failures.extra",
                                                 "rollout.tool_exception_side", "failures.policy"}
    assert not any("Value error" in e for e in errors)


@pytest.mark.parametrize("mode", ["sync", "one_step_off", "async"])
def test_members_failed_by_the_service_run_again_with_their_own_seeds_and_replace_their_attempts(
        tmp_path, tiny_model_dir, mode):
    """By default (failures.infrastructure=resample) a member whose calculator call met an outage
    runs again before its group joins the batch: the service fails each question's first call,
    so each such member's second attempt answers. The step trains on answered trajectories
    only; outcome/resampled counts the replaced attempts; the recorded groups hold each replaced
    attempt (replaced, attempt 0, no advantage) beside the attempt that replaced it (attempt 1,
    trained); the resample's seeds are (step, position, member, attempt)'s, the same in a
    rerun. With failures.infrastructure=penalize, the failed attempts are trained on as wrong
    answers (a negative advantage/on_infrastructure). In every training mode: the synchronous
    phases (sync, one_step_off's rollout ahead) and the asynchronous stream."""
    from rlfactory_core.config import load_config
    from rlfactory_core.metrics import read_metrics
    from rlfactory_core.records import RunRecords
    from rlfactory_core.resampling import resample_seed

    runs = []
    for rerun in ("first", "again"):
        seen = set()
        SERVICE["fails"] = lambda expression: expression not in seen and not seen.add(expression)
        seeds = []
        flaky_run(tmp_path / rerun, tiny_model_dir, f"train.mode={mode}", "grpo.tis_cap=2.0", seeds=seeds)
        runs.append((read_metrics(tmp_path / rerun)[1], RunRecords(tmp_path / rerun).list("train", 1), seeds))
    seen = set()  # today's behaviour, for contrast: the failed attempts trained as wrong answers
    SERVICE["fails"] = lambda expression: expression not in seen and not seen.add(expression)
    flaky_run(tmp_path / "penalized", tiny_model_dir, f"train.mode={mode}", "grpo.tis_cap=2.0",
              "failures.infrastructure=penalize")
    penalized = read_metrics(tmp_path / "penalized")[1]
    SERVICE["fails"] = lambda expression: "+" in expression
    (step, rows, seeds), (_, rows_again, seeds_again) = runs
    # a failed member beside an answered one got a wrong answer's advantage; resampled, none is trained
    assert penalized["advantage/on_infrastructure"] < 0 and "advantage/on_infrastructure" not in step
    trained = [r for r in rows if not r["replaced"]]
    replaced = [r for r in rows if r["replaced"]]
    assert len(trained) == 8 and {r["outcome"] for r in trained} == {"answered"}
    assert replaced and {(r["outcome"], r["attempt"], r["advantage"]) for r in replaced} == {
        ("tool_infra_error", 0, None)}
    for attempt in replaced:  # beside the attempt that replaced it, in its group
        assert any(r["group"] == attempt["group"] and r["attempt"] == 1 and r["sample_id"] == attempt["sample_id"]
                   for r in trained)
    assert sum(r["attempt"] == 1 for r in trained) == len(replaced)
    assert step["outcome/resampled/tool_infra_error"] == len(replaced) / 8
    assert step["outcome/answered"] == 1.0 and "outcome/masked/tool_infra_error" not in step
    # every trajectory made one call: the kept ones survived alike, so the weights are equal
    assert step["failures/call_failure_rate"] == pytest.approx(len(replaced) / (8 + len(replaced)))
    assert step["failures/weight_max"] == pytest.approx(1.0) and "failures/call_failure_rate" not in penalized
    config = load_config([], [])  # train.seed 0, as the runs'
    possible = {resample_seed(config, 1, position, member, 1) for position in range(4) for member in range(2)}
    resampled = sorted(s for s in seeds if s in possible)
    assert len(resampled) == 2 * len(replaced)  # two turns each: the call, then the answer
    assert resampled == sorted(s for s in seeds_again if s in possible)
    assert [(r["group"], r["outcome"], r["attempt"]) for r in rows] == [
        (r["group"], r["outcome"], r["attempt"]) for r in rows_again]


def test_a_call_the_service_failed_runs_again_before_the_model_reads_a_result(tmp_path, tiny_model_dir):
    """rollout.infrastructure_retries=1: the service fails each sum's first call; the call runs
    again at once (the same call, through the real tool manager), the model reads the answer, and
    the step trains on answered trajectories: none resampled, masked or weighed, since nothing
    was selected."""
    from rlfactory_core.metrics import read_metrics
    from rlfactory_core.records import RunRecords

    seen = set()
    SERVICE["fails"] = lambda expression: expression not in seen and not seen.add(expression)
    try:
        flaky_run(tmp_path / "run", tiny_model_dir, "rollout.infrastructure_retries=1")
    finally:
        SERVICE["fails"] = lambda expression: "+" in expression
    step, rows = read_metrics(tmp_path / "run")[1], RunRecords(tmp_path / "run").list("train", 1)
    assert step["outcome/answered"] == 1.0 and {r["outcome"] for r in rows} == {"answered"}
    assert not [k for k in step if k.startswith(("outcome/resampled", "outcome/masked", "failures/"))]
    assert all(not r["replaced"] and r["attempt"] == 0 and not r["tool_error_kinds"] for r in rows)
    # one retry per question: its first call failed, every later one (the group's other member) did not
    assert step["rollout/infrastructure_retries"] == len({r["sample_id"] for r in rows}) == 4


def test_a_member_failing_every_attempt_is_masked_and_each_attempt_recorded(tmp_path, tiny_model_dir):
    """The service fails on every sum: each sum's member runs failures.max_resamples=1 more time,
    fails again and is masked (out of the loss and the baseline); both attempts are counted
    and recorded."""
    from rlfactory_core.metrics import read_metrics
    from rlfactory_core.records import RunRecords

    SERVICE["fails"] = lambda expression: "+" in expression
    flaky_run(tmp_path / "run", tiny_model_dir, "failures.max_resamples=1")
    step, rows = read_metrics(tmp_path / "run")[1], RunRecords(tmp_path / "run").list("train", 1)
    share = step["outcome/tool_infra_error"]
    assert 0 < share < 1 and step["outcome/masked/tool_infra_error"] == share
    assert step["outcome/resampled/tool_infra_error"] == share  # one replaced attempt each
    failed = [r for r in rows if r["outcome"] == "tool_infra_error"]
    assert sorted((r["replaced"], r["attempt"]) for r in failed) == sorted(
        [(True, 0)] * int(share * 8) + [(False, 1)] * int(share * 8))
    assert all(r["advantage"] in (None, 0.0) for r in failed)
