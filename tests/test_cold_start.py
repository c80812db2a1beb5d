"""The cold start (rlfactory_core.training.cold_start): its config, demonstrations replayed through
the agent loop (token-exact, tools really called, kept only when correct), rejection sampling,
the warm-up's loss mask and update, and a run that warms up, evaluates and trains.

The real tokenizer and chat template of the embedded model; the tiny random model for updates."""

from __future__ import annotations

import asyncio
import contextlib
import re

import pytest

from rlfactory_core.config import load_config
from rlfactory_core.engines import rollout_config_for
from rlfactory_core.engines.local import LocalRollout
from rlfactory_core.errors import ConfigError
from rlfactory_core.hookspecs import hookimpl
from rlfactory_core.records import RunRecords
from rlfactory_core.metrics import read_metrics
from rlfactory_core.preflight import preflight
from rlfactory_core.rollout import ChatTemplate, TemplateFamily, check_retokenization, rollout
from rlfactory_core.task import build_task
from rlfactory_core.testing import ScriptedBackend, registered_plugin, train
from rlfactory_core.training.cold_start import (collect_examples, demonstration_examples, example_batch,
                                                rejection_examples, supervised_update, warm_up_optimizer)
from rlfactory_core.training.logprobs import token_logprobs
from rlfactory_core.types import ToolCall
from rlfactory_arithmetic.env import ArithmeticEnv


def question_of(sample):
    return re.fullmatch(r"What is (.+)\?", sample["questions"][0]).group(1)


class ArithmeticDemos(ArithmeticEnv):
    """The arithmetic env with demonstrations: the calculator called on the question, then the
    answer; sample 3's demonstration answers wrongly (the rewards must drop it)."""

    name = "arithmetic_demos"

    def dataset(self, size=256, split="train"):
        if split == "far":  # a second held-out split, for eval.splits: three questions
            return [{**sample, "id": f"far-{i}"} for i, sample in enumerate(super().dataset(3, "test"))]
        return super().dataset(size, split)

    async def demonstration(self, sample, parser):
        answer = "-1" if sample["id"].endswith("-3") else sample["answer"]
        call = parser.format_tool_call(ToolCall(name="calculator", arguments={"expression": question_of(sample)}))
        return [call, f"The answer is {answer}."]


class Registers:
    @hookimpl
    def rlfactory_register_envs(self, register):
        register(ArithmeticDemos)


@pytest.fixture
def demos_env():
    with registered_plugin(Registers()):
        yield


def config_of(*overrides):
    return load_config([], ["env=arithmetic_demos", "rollout.max_turns=3", "rollout.max_tokens_per_turn=48",
                            *overrides])


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


# --------------------------------------------------------------------------- config


def test_the_cold_start_is_off_by_default_and_its_bad_values_are_all_reported_one_line_each():
    cold = load_config([], []).cold_start
    assert (cold.source, cold.examples, cold.epochs, cold.batch_size, cold.eval) == ("off", 64, 2, 8, True)
    assert load_config([], ["cold_start.source=auto"]).cold_start.source == "auto"
    # YAML reads a bare `off` as false: on the command line and in a file alike it means off
    assert load_config([], ["cold_start.source=demonstrations", "cold_start.source=off"]).cold_start.source == "off"
    assert load_config([], [], base={"cold_start": {"source": False}}).cold_start.source == "off"
    with pytest.raises(ConfigError) as error:
        load_config([], ["cold_start.source=sometimes", "cold_start.epochs=0", "cold_start.lr=0",
                         "cold_start.max_rollouts=0", "cold_start.shots=3"])
    lines = error.value.errors
    assert len(lines) == 5 and all("\n" not in line for line in lines), lines
    for key in ("cold_start.source", "cold_start.epochs", "cold_start.lr", "cold_start.max_rollouts"):
        assert any(line.startswith(f"{key}: ") for line in lines), (key, lines)
    assert "cold_start.shots: unknown key" in " ".join(lines)
    # on the ray engine, demonstrations are scored in the driver, which has no judge pool
    with pytest.raises(ConfigError, match=r"^invalid config: cold_start.source: demonstrations are scored in the "
                                          r"driver process, which cannot reach the judge pool that scores "
                                          r"\['exact_match'\]"):
        load_config([], ["engine=ray", "ray.judge.rewards=[exact_match]", "cold_start.source=auto"])
    assert load_config([], ["engine=ray", "ray.judge.rewards=[exact_match]",
                            "cold_start.source=rejection"]).cold_start.source == "rejection"
    # demonstrations from an env that gives none: found before anything runs
    _, problems = preflight([], ["env=arithmetic", "cold_start.source=demonstrations"])
    assert problems == ["cold_start.source: the 'arithmetic' env gives no demonstrations (it has no `demonstration` "
                        "method); use cold_start.source=rejection (or auto)"]
    assert preflight([], ["env=nl2sql", "cold_start.source=demonstrations"])[1] == []


# --------------------------------------------------------------------------- demonstrations


def test_a_demonstration_is_replayed_token_exactly_with_its_tool_really_called_and_kept_only_when_correct(
        demos_env, tokenizer):
    config = config_of()
    task = build_task(config)
    chat = ChatTemplate(tokenizer)
    samples = task.env.dataset(size=5, split="train")

    async def run():
        kept, rows, tried, failed = await demonstration_examples(task, chat, samples, config, want=10)
        # the same turns written by a model, through the ordinary rollout
        scripted = ScriptedBackend(tokenizer, await task.env.demonstration(samples[0], task.parser))
        written = await rollout(samples[:1], env=task.env, family=TemplateFamily(chat, task.parser),
                                tool_manager=task.tool_manager, backend=scripted, config=config.rollout)
        await task.close()
        return kept, rows, tried, failed, written[0]

    kept, rows, tried, failed, written = asyncio.run(run())
    assert (tried, failed, rows) == (5, 1, [0, 1, 2, 4])  # sample 3's wrong answer is not kept
    demo = kept[0]
    assert demo.stop_reason == "env_done" and demo.final_answer == samples[0]["answer"]
    # the calculator really ran: its result is the observation the model is trained to read
    assert [r.content for r in demo.tool_results] == [samples[0]["answer"]] and demo.tool_results[0].ok
    # exactly the ids and masks of the rollout, and of the whole conversation rendered by the template
    assert demo.prompt_ids == written.prompt_ids
    assert [(s.kind, s.token_ids, s.loss_mask) for s in demo.segments] == [
        (s.kind, s.token_ids, s.loss_mask) for s in written.segments]
    assert check_retokenization(demo, chat).ok

    # the loss mask covers exactly the assistant's turns (each with its end-of-turn token)
    batch = example_batch(kept, tokenizer.pad_token_id)
    row = batch["input_ids"][0][batch["loss_mask"][0].bool()].tolist()
    model_ids = [i for s in demo.segments if s.kind == "model" for i in s.token_ids]
    assert row == model_ids and sum(len(s.token_ids) for s in demo.segments if s.kind == "model") == len(row)
    text = tokenizer.decode(row)
    end = tokenizer.decode([chat.turn_end_id])
    assert text == f"{task.parser.format_tool_call(ToolCall('calculator', {'expression': question_of(samples[0])}))}" \
                   f"{end}The answer is {samples[0]['answer']}.{end}"
    assert int(batch["loss_mask"][0].sum()) < int(batch["attention_mask"][0].sum()) / 2  # prompt, result: 0


def test_a_demonstration_that_raises_is_skipped_and_reported_and_the_others_are_kept(demos_env, tokenizer, caplog):
    """One sample's failing demonstration (a plugin bug, a retriever server down) costs that
    sample, not the run."""
    config = config_of()
    task = build_task(config)
    samples = task.env.dataset(size=3, split="train")
    demonstrate = task.env.demonstration

    async def flaky(sample, parser):
        if sample is samples[1]:
            raise ConnectionError("the retriever at http://127.0.0.1:9/retrieve refused the connection")
        return await demonstrate(sample, parser)

    task.env.demonstration = flaky

    async def run():
        try:
            return await demonstration_examples(task, ChatTemplate(tokenizer), samples, config, want=10)
        finally:
            await task.close()

    kept, rows, tried, failed = asyncio.run(run())
    assert (rows, tried, failed) == ([0, 2], 3, 1)
    assert "env.demonstration raised for 1 sample(s), which were skipped; the first: sample 1: ConnectionError: " \
           "the retriever at http://127.0.0.1:9/retrieve refused the connection" in caplog.text


# --------------------------------------------------------------------------- rejection sampling


class ScriptedEngine:
    """The engine protocol's rollout with a scripted model: right on even answers, wrong on odd ones."""

    def __init__(self, task, tokenizer):
        def reply(prompt):
            question = re.findall(r"What is ([^?]+)\?", prompt)[-1]
            value = eval(question)  # noqa: S307 - the env's own questions
            return f"The answer is {value if value % 2 == 0 else value + 1}."

        self.rollout_half = LocalRollout(task, ScriptedBackend(tokenizer, reply),
                                         TemplateFamily(ChatTemplate(tokenizer), task.parser))
        self.rollouts = 0

    async def rollout(self, samples, rollout_config, *, group_size, rewards="train"):
        self.rollouts += 1
        return await self.rollout_half.rollout(samples, rollout_config, group_size=group_size, rewards=rewards)


def test_rejection_sampling_keeps_one_correct_trajectory_per_prompt_within_max_rollouts(demos_env, tokenizer):
    config = config_of("cold_start.source=rejection", "cold_start.max_rollouts=7", "grpo.group_size=2",
                       "grpo.prompts_per_step=2", "env_options={few_shot: false}")
    task = build_task(config)
    samples = task.env.dataset(size=20, split="train")
    engine = ScriptedEngine(task, tokenizer)

    async def run():
        try:
            return await rejection_examples(engine, samples, config, lambda a: rollout_config_for(config, 0, attempt=a),
                                            want=10)
        finally:
            await task.close()

    kept, rows, rolled = asyncio.run(run())
    assert rolled == 6 and engine.rollouts == 2  # 2 prompts x 2, then 1 prompt x 2: a third would pass 7
    even = [i for i in range(3) if int(samples[i]["answer"]) % 2 == 0]
    assert rows == even and [t.final_answer for t in kept] == [samples[i]["answer"] for i in even]
    assert len({t.group for t in kept}) == len(kept) or len(kept) <= 1


def test_auto_fills_up_with_demonstrations_for_the_samples_rejection_found_nothing_for(demos_env, tokenizer):
    config = config_of("cold_start.source=auto", "cold_start.examples=4", "cold_start.max_rollouts=8",
                       "grpo.group_size=2", "grpo.prompts_per_step=4", "env_options={few_shot: false}")
    task = build_task(config)
    samples = task.env.dataset(size=12, split="train")
    engine = ScriptedEngine(task, tokenizer)

    async def run():
        try:
            return await collect_examples(engine, task, ChatTemplate(tokenizer), config, samples,
                                          lambda a: rollout_config_for(config, 0, attempt=a))
        finally:
            await task.close()

    examples = asyncio.run(run())
    metrics = examples.metrics()
    assert metrics["cold_start/examples"] == 4 and metrics["cold_start/rollouts"] == 8
    assert 0 < metrics["cold_start/examples/rejection"] < 4
    assert metrics["cold_start/examples/rejection"] + metrics["cold_start/examples/demonstrations"] == 4
    ids = [t.sample_id for t in examples.trajectories]
    assert len(set(ids)) == 4  # one example per sample: demonstrations only where rejection found none


# --------------------------------------------------------------------------- the update


@contextlib.contextmanager
def one_thread():
    """One torch thread: a tiny model's steps take ~0.1 s so, but seconds each with two threads
    on a loaded 2-core machine (measured: 1 s vs 28 s for this test's update)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def test_the_warm_up_lowers_the_loss_on_its_demonstrations_and_trains_assistant_tokens_only(
        demos_env, tokenizer, tiny_model_dir):
    import torch
    from transformers import LlamaForCausalLM

    config = config_of("cold_start.epochs=4", "cold_start.lr=1e-2", "cold_start.batch_size=4", "train.bf16=false",
                       "grpo.micro_batch_tokens=600", "env_options={few_shot: false}")
    task = build_task(config)
    samples = task.env.dataset(size=4, split="train")

    async def demos():
        try:
            return (await demonstration_examples(task, ChatTemplate(tokenizer), samples, config, want=4))[0]
        finally:
            await task.close()

    batch = example_batch(asyncio.run(demos()), tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)

    def mean_nll():
        with torch.no_grad():
            logprobs, _ = token_logprobs(model, batch, bf16=False, entropy=False)
        return float(-(logprobs * batch["loss_mask"]).sum() / batch["loss_mask"].sum())

    before = mean_nll()
    with one_thread():
        stats = supervised_update(model, warm_up_optimizer(model, config), batch, config)
    after = mean_nll()
    assert stats["cold_start/optimizer_steps"] == 4 and stats["cold_start/trained_tokens"] == pytest.approx(
        4 * float(batch["loss_mask"].sum()))
    assert stats["cold_start/loss_start"] == pytest.approx(before, rel=1e-4)  # the first step's loss: no update yet
    assert after < before - 1.0 and stats["cold_start/loss_last_epoch"] < stats["cold_start/loss_first_epoch"]

    # observation and prompt tokens carry no loss: changing them changes no gradient target
    # (the loss reads logprobs at masked positions only; here: a batch with nothing masked trains nothing)
    empty = batch.clone()
    empty["loss_mask"].zero_()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with one_thread():
        stats = supervised_update(model, warm_up_optimizer(model, config), empty, config)
    assert stats["cold_start/optimizer_steps"] == 0
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())


# --------------------------------------------------------------------------- a run


@pytest.mark.slow
def test_a_run_warms_up_on_demonstrations_evaluates_the_warm_up_alone_then_trains(demos_env, tmp_path,
                                                                                  tiny_model_dir, capsys):
    run_dir = tmp_path / "run"
    config = config_of("backend=hf", f"model.name={tiny_model_dir}", f"run_dir={run_dir}", "train.steps=1",
                       "grpo.prompts_per_step=2", "grpo.group_size=2", "data.eval_size=2", "eval.every=0",
                       "eval.save_samples=1", "rollout.max_tokens_per_turn=12", "logging.live=off",
                       "logging.tensorboard=false", "cold_start.source=demonstrations", "cold_start.examples=3",
                       "cold_start.epochs=1", "data.train_size=6", "eval.splits=[far]")
    train(config)
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [0, 0, 1]
    # eval.splits: the whole split before training, after the warm-up and at the last step
    for record, prefix in zip(records, ("eval/far/", "cold_start/eval/far/", "eval/far/")):
        assert record[f"{prefix}rollout/trajectories"] == 3 and f"{prefix}reward/accuracy" in record
    assert (run_dir / "samples" / "cold_start" / "far" / "step-000000.jsonl").exists()
    assert {"eval-far", "cold_start_eval-far"} <= set(RunRecords(run_dir).kinds())
    assert len(RunRecords(run_dir).list("eval-far", 1)) == 3
    cold = records[1]
    assert cold["cold_start/examples"] == 3 and cold["cold_start/examples/demonstrations"] == 3
    assert cold["cold_start/optimizer_steps"] == 1 and cold["cold_start/loss_start"] > 0
    for key in ("cold_start/eval/reward/accuracy", "cold_start/eval/tools/calls_per_trajectory",
                "time/cold_start_collect", "time/cold_start_train"):
        assert key in cold, key
    assert (run_dir / "samples" / "cold_start" / "step-000000.jsonl").exists()
    assert "train/loss" in records[2]
    # the warm-up is an update: the weights it pushed are version 1, sampled by its eval and step 1
    recorded = RunRecords(run_dir)
    versions = [(kind, step, {r["policy_version"] for r in recorded.list(kind, step)})
                for kind, step in (("eval", 0), ("cold_start_eval", 0), ("train", 1), ("eval", 1))]
    assert versions == [("eval", 0, {0}), ("cold_start_eval", 0, {1}), ("train", 1, {1}), ("eval", 1, {2})]
    # said before the warm-up starts (minutes on a CPU), then its result
    out = capsys.readouterr().out
    announced = (f"cold start: 3 examples ({cold['cold_start/tokens']:.0f} tokens) collected in "
                 f"{cold['time/cold_start_collect']:.0f} s; training 1 x 1 optimizer steps")
    assert announced in out and out.index(announced) < out.index("cold start: 3 examples (0 own, 3 demonstrations)")


@pytest.mark.slow
def test_a_run_whose_cold_start_finds_nothing_says_so_and_trains_from_the_base_model(tmp_path, tiny_model_dir,
                                                                                     capsys):
    run_dir = tmp_path / "run"
    config = load_config([], ["env=arithmetic", "backend=hf", f"model.name={tiny_model_dir}", f"run_dir={run_dir}",
                              "train.steps=1", "grpo.prompts_per_step=2", "grpo.group_size=2", "data.eval_size=2",
                              "eval.every=0", "rollout.max_turns=1", "rollout.max_tokens_per_turn=8",
                              "logging.live=off", "logging.tensorboard=false", "cold_start.source=auto",
                              "cold_start.max_rollouts=4"])
    train(config)  # the tiny random model is never right, and the arithmetic env has no demonstrations
    cold = read_metrics(run_dir)[1]
    assert cold["step"] == 0 and cold["cold_start/examples"] == 0 and cold["cold_start/rollouts"] == 4
    assert not any(key.startswith(("cold_start/eval/", "cold_start/loss")) for key in cold)
    assert "no successful trajectory or demonstration was found" in capsys.readouterr().out
