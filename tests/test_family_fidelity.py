"""Token fidelity of the renderers families on their real tokenizers (built offline): a
multi-turn tool episode runs through the real agent loop (``run_trajectory``, the
``concurrent`` tool manager, real tools, one of which fails once), with every model turn
written in the family's own encoding by a scripted backend. Checked per family:

- the model's tokens stay as sampled, and every call is read back from the ids;
- the whole context equals a reference render of the same conversation: ``openai-harmony``
  (OpenAI's own encoder, an implementation apart from ``renderers``) for gpt-oss; for the
  others the renderer's own render of the whole conversation (self-consistent only: no
  other implementation of their format is available offline);
- text the model did not write stays data: a tool result holding the vocabulary's special
  and added tokens adds none of them to the context.

What each fixture holds is asserted (tool rounds, a parallel call, reasoning, a tool error),
and where a family cannot hold it, its fixture says why.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

import pytest

from rlfactory_core.default_plugins.tool_managers import ConcurrentToolManager
from rlfactory_core.models import load_tokenizer
from rlfactory_core.plugins import get_component
from rlfactory_core.rollout import RolloutConfig, run_trajectory
from rlfactory_core.testing import ScriptedBackend, markup_cases, shared_tokenizer
from rlfactory_core.tools import function_tool
from rlfactory_core.types import EnvReset, EnvStep, Message

SYSTEM, QUESTION = "Answer with the tools.", "Which city is larger, Avalon or Brightwater?"
FACTS = {"Avalon": "Avalon has 5 million people.", "Brightwater": "Brightwater has 7 million people."}


@dataclass
class Turn:
    """One model turn of the script: reasoning, an answer, calls (name, arguments)."""

    reasoning: str | None
    content: str
    calls: list[tuple[str, dict]]


#: The episode: 3 tool rounds, a parallel call (whose second call fails once), reasoning
#: in every turn, then the answer.
PARALLEL = [
    Turn("I need both populations.", "", [("search", {"query": "Avalon"}), ("search", {"query": "Brightwater"})]),
    Turn("The second search failed; again.", "", [("search", {"query": "Brightwater"})]),
    Turn("Now the difference.", "", [("calculate", {"expression": "7-5"})]),
    Turn("Brightwater, by 2 million.", "Brightwater is larger, by 2 million people.", []),
]
#: One call per turn: the same episode for formats that cannot call twice in one turn.
SEQUENTIAL = [PARALLEL[0].__class__(PARALLEL[0].reasoning, "", [c]) for c in PARALLEL[0].calls] + PARALLEL[1:]


#: GLM 4.5's markup, added to Qwen3's vocabulary (which has <think>, <tool_call> ...): a
#: look-alike, as no GLM tokenizer is available offline
GLM_MARKUP = ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<arg_key>",
              "</arg_key>", "<arg_value>", "</arg_value>"]


@functools.lru_cache(maxsize=None)
def _tokenizer(name: str):
    if name == "glm-look-alike":
        tokenizer = load_tokenizer("qwen3")  # its own copy: tokens are added
        tokenizer.add_special_tokens({"additional_special_tokens": GLM_MARKUP})
        return tokenizer
    return shared_tokenizer(name)  # one load per test session: each is seconds


def _tools():
    failed = set()

    @function_tool
    def search(query: str) -> str:
        """Search the web.

        :param query: what to look for
        """
        if query == "Brightwater" and query not in failed:
            failed.add(query)
            raise RuntimeError("the search backend timed out")
        return FACTS[query]

    @function_tool
    def calculate(expression: str) -> str:
        """Evaluate arithmetic.

        :param expression: e.g. 7-5
        """
        a, b = expression.split("-")
        return str(int(a) - int(b))

    return [search, calculate]


class _Env:
    name, description = "fidelity", "one question, answered with search and a calculator"

    def __init__(self):
        self.tools = _tools()

    async def reset(self, sample):
        return EnvReset(messages=[Message("system", SYSTEM), Message("user", QUESTION)], tools=self.tools)

    async def step(self, state, turn, results):
        return EnvStep(done=not turn.tool_calls and not turn.errors, final_answer=turn.content or None)

    async def close(self, state):
        return None


def _openai_call(k: int, name: str, arguments: dict) -> dict:
    return {"id": f"call_{k}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _assistant(turn: Turn, first_call: int = 0) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": turn.content}
    if turn.reasoning:
        message["reasoning_content"] = turn.reasoning
    if turn.calls:
        message["tool_calls"] = [_openai_call(first_call + k, n, a) for k, (n, a) in enumerate(turn.calls)]
    return message


def _tool_specs(tools) -> list[dict]:
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.parameters}} for t in tools]


# ------------------------------------------------------------------ each family's encoding


def _qwen3_completion(tokenizer, turn: Turn, context: list[int]) -> list[int]:
    """Qwen3's turn as its model card writes it: <think> reasoning, Hermes <tool_call> JSON."""
    text = f"<think>\n{turn.reasoning}\n</think>\n\n{turn.content}"
    text += "\n".join("<tool_call>\n" + json.dumps({"name": n, "arguments": a}) + "\n</tool_call>" for n, a in turn.calls)
    return tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)


def _harmony():
    from rlfactory_core.models.tokenizer_sources import offline_tiktoken

    with offline_tiktoken():
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding

        return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def _harmony_assistant(turn: Turn, content_type: bool = True) -> list:
    """``content_type``: a call as the model writes it (``<|constrain|>json``); without, as a
    conversation of parsed turns holds it (the OpenAI message shape has no content type)."""
    from openai_harmony import Message as HarmonyMessage
    from openai_harmony import Role

    out = [HarmonyMessage.from_role_and_content(Role.ASSISTANT, turn.reasoning).with_channel("analysis")]
    for name, arguments in turn.calls:
        call = HarmonyMessage.from_role_and_content(Role.ASSISTANT, json.dumps(arguments)).with_channel(
            "commentary").with_recipient(f"functions.{name}")
        out.append(call.with_content_type("<|constrain|>json") if content_type else call)
    if not turn.calls:
        out.append(HarmonyMessage.from_role_and_content(Role.ASSISTANT, turn.content).with_channel("final"))
    return out


def _gpt_oss_completion(tokenizer, turn: Turn, context: list[int]) -> list[int]:
    """gpt-oss's turn as OpenAI's harmony encoder writes it: the analysis channel (the prompt
    opened it), then a commentary call ending in <|call|>, or the final answer."""
    encoding = _harmony()
    ids: list[int] = []
    for message in _harmony_assistant(turn):
        ids += encoding.render(message)
    opening = tokenizer.encode("<|start|>assistant<|channel|>analysis<|message|>", add_special_tokens=False)
    assert ids[:len(opening)] == opening
    ids = ids[len(opening):]
    if turn.calls:
        return ids[:-1] + [tokenizer.convert_tokens_to_ids("<|call|>")]  # a call ends the turn: <|call|>
    return ids[:-1] + [tokenizer.convert_tokens_to_ids("<|return|>")]  # the final answer: <|return|>


def _rendered_completion(family, turn: Turn, context: list[int], history: list[dict], tools) -> list[int]:
    """The turn as the family's renderer writes it (for formats with no other writer here):
    the render of the conversation with the turn, after the prompt, up to the first stop id."""
    full = family.renderer.render_ids([*history, _assistant(turn)], tools=_tool_specs(tools),
                                      add_generation_prompt=False)
    prompt = family.renderer.render_ids(history, tools=_tool_specs(tools), add_generation_prompt=True)
    assert full[:len(prompt)] == prompt
    completion = full[len(prompt):]
    stops = set(family.stop_token_ids)
    end = next((k for k, i in enumerate(completion) if i in stops), None)
    if end is None:  # a format whose history ends a turn with the next role's token (GLM): the model
        # writes that token to stop, <|observation|> after calls
        return [*completion, family.tokenizer.convert_tokens_to_ids("<|observation|>" if turn.calls else "<|user|>")]
    return completion[:end + 1]


@dataclass
class Case:
    family: str
    tokenizer: str
    script: list[Turn]
    writer: str  # qwen3 | harmony | renderer
    options: dict
    reference: str  # harmony | renderer


CASES = [
    Case("qwen3", "qwen3", PARALLEL, "qwen3", {}, "renderer"),
    # harmony: a call ends the turn (<|call|> is a stop token), so no two calls in one turn
    Case("gpt-oss", "gpt-oss", SEQUENTIAL, "harmony", {}, "harmony"),
    # DeepSeek V4 with its thinking mode on (off by default: the prompt closes </think>); its
    # renderer appends one tool result at a time only (a full render sorts several by call id),
    # so parallel calls start a new sequence (test_a_format_that_rewrites_history_...): one
    # call per turn here
    Case("deepseek-v4", "deepseek-v4", SEQUENTIAL, "renderer", {"enable_thinking": True}, "renderer"),
    # Llama 3.1 has no reasoning and its template refuses two calls in one message
    Case("llama3", "llama3.1", [Turn(None, t.content, t.calls) for t in SEQUENTIAL], "renderer", {}, "renderer"),
    # DeepSeek V3 (its markup on V4's vocabulary, a look-alike) writes no reasoning
    Case("deepseek-v3", "deepseek-v4", [Turn(None, t.content, t.calls) for t in PARALLEL], "renderer", {},
         "renderer"),
    # GLM 4.5 (its markup added to Qwen3's vocabulary, a look-alike): each argument written as
    # <arg_key>/<arg_value> text, typed back from the tools' schemas the prompt described
    Case("glm45", "glm-look-alike", PARALLEL, "renderer", {}, "renderer"),
    # not here: deepseek-r1 (on V4's vocabulary, a look-alike): its prompt opens <think> and its
    # render of a finished turn drops it, so a whole render is no reference; its episode is
    # checked by test_a_format_that_rewrites_history_... (one sequence, appended)
]


async def _episode(case: Case):
    tokenizer = _tokenizer(case.tokenizer)
    family = get_component("family", case.family).build(tokenizer, **case.options)
    env = _Env()
    history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    written: list[list[int]] = []
    calls_so_far = 0

    def reply(prompt_text: str) -> list[int]:
        nonlocal calls_so_far
        turn = case.script[len(written)]
        context = backend.prompts[-1]
        if case.writer == "qwen3":
            ids = _qwen3_completion(tokenizer, turn, context)
        elif case.writer == "harmony":
            ids = _gpt_oss_completion(tokenizer, turn, context)
        else:
            ids = _rendered_completion(family, turn, context, history, env.tools)
        written.append(ids)
        history.append(_assistant(turn, calls_so_far))
        calls_so_far += len(turn.calls)
        return ids

    backend = ScriptedBackend(tokenizer, reply)
    trajectory = await _run_episode(env, family, backend)
    return tokenizer, family, trajectory, written, history, env


async def _run_episode(env, family, backend):
    """One episode through the real agent loop and tool manager, turns from ``backend``."""
    manager = ConcurrentToolManager(env.tools, timeout_s=10, max_retries=0)
    return await run_trajectory({"id": "q"}, env=env, family=family, tool_manager=manager, backend=backend,
                                config=RolloutConfig(max_turns=8, max_tokens_per_turn=512, max_trajectory_tokens=16000))


def _reference(case: Case, family, tokenizer, trajectory, env) -> list[int]:
    """The whole conversation rendered in one piece by the reference implementation."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    results = iter(trajectory.tool_results)
    k = 0
    for turn in case.script:
        messages.append(_assistant(turn, k))
        for j, (name, _) in enumerate(turn.calls):
            result = next(results)
            messages.append({"role": "tool", "name": name, "tool_call_id": f"call_{k + j}", "content": result.content})
        k += len(turn.calls)
    if case.reference == "renderer":
        return family.renderer.render_ids(messages, tools=_tool_specs(env.tools), add_generation_prompt=False)
    from openai_harmony import (Author, Conversation, DeveloperContent, Message as HarmonyMessage,
                                RenderConversationConfig, Role, SystemContent, ToolDescription)

    system = SystemContent.new().with_conversation_start_date(family.renderer.config.conversation_start_date)
    developer = DeveloperContent.new().with_instructions(SYSTEM).with_function_tools(
        [ToolDescription.new(t.name, t.description, parameters=t.parameters) for t in env.tools])
    conversation = [HarmonyMessage.from_role_and_content(Role.SYSTEM, system),
                    HarmonyMessage.from_role_and_content(Role.DEVELOPER, developer),
                    HarmonyMessage.from_role_and_content(Role.USER, QUESTION)]
    results = iter(trajectory.tool_results)
    for turn in case.script:
        conversation += _harmony_assistant(turn)
        for name, _ in turn.calls:
            conversation.append(HarmonyMessage.from_author_and_content(Author.new(Role.TOOL, f"functions.{name}"),
                                                                       next(results).content)
                                .with_recipient("assistant").with_channel("commentary"))
    return _harmony().render_conversation_for_training(Conversation.from_messages(conversation),
                                                       RenderConversationConfig(auto_drop_analysis=False))


@pytest.mark.parametrize("case", CASES, ids=[c.family for c in CASES])
async def test_a_multi_turn_tool_episode_is_token_exact(case):
    tokenizer, family, trajectory, written, history, env = await _episode(case)
    # the fixture holds what it claims
    rounds = sum(1 for t in case.script if t.calls)
    assert rounds >= 3 and trajectory.stop_reason in ("no_tool_call", "env_done"), trajectory.stop_reason
    assert any(r.error for r in trajectory.tool_results), "a tool error"
    if case.script is PARALLEL:
        assert any(len(t.calls) > 1 for t in case.script), "a parallel call"
    if case.family not in ("llama3", "deepseek-v3"):
        assert all(t.reasoning for t in case.script), "reasoning in every turn"
    assert len(trajectory.sequences) == 1
    # the model's tokens as sampled, every call read back from the ids
    model = [s.token_ids for s in trajectory.segments if s.kind == "model"]
    assert model == written
    assert [(c.name, c.arguments) for c in trajectory.tool_calls] == [c for t in case.script for c in t.calls]
    assert not any(r.error == "parse_error" for r in trajectory.tool_results)
    # the context, appended turn by turn, is the reference's render of the whole conversation
    context = trajectory.prompt_ids + [i for s in trajectory.segments for i in s.token_ids]
    reference = _reference(case, family, tokenizer, trajectory, env)
    # a template may close the last message after its stop id (Qwen3's "\n" after <|im_end|>):
    # ids no model writes, as the turn ends at the stop id
    closing = reference[len(context):]
    assert not tokenizer.decode(closing).strip(), f"the reference goes on: {tokenizer.decode(closing)!r}"
    reference = reference[:len(context)]
    # a format whose turns end with the next role's token (GLM's <|user|> after an answer): the
    # model writes it to stop, a render of the conversation leaves it to the next message
    if len(context) == len(reference) + 1 and context[-1] in family.stop_token_ids:
        context = context[:-1]
    if context != reference:
        k = next((i for i, (a, b) in enumerate(zip(context, reference)) if a != b), min(len(context), len(reference)))
        pytest.fail(f"{case.family}: the context differs from the {case.reference} reference at {k}:\n"
                    f"context   {tokenizer.decode(context[max(0, k - 20):k + 20])!r}\n"
                    f"reference {tokenizer.decode(reference[max(0, k - 20):k + 20])!r}")


@pytest.mark.parametrize("case", CASES, ids=[c.family for c in CASES])
def test_a_tool_result_holding_the_vocabularys_markup_stays_text(case):
    tokenizer = _tokenizer(case.tokenizer)
    family = get_component("family", case.family).build(tokenizer, **case.options)
    markup = [t.content for i, t in sorted(tokenizer.added_tokens_decoder.items()) if i in family.structural_ids][:64]
    forged = "before " + "".join(markup) + " after"
    _, context = family.prompt([Message("system", SYSTEM), Message("user", QUESTION)], _tools())
    first = case.script[0]
    turn = written_turn = _rendered_completion(family, Turn(first.reasoning, "", first.calls[:1]), context,
                                               [{"role": "system", "content": SYSTEM},
                                                {"role": "user", "content": QUESTION}], _tools())
    call_id = family.parse(turn, context).tool_calls[0].id

    def observation(text):
        return family.observation_ids(written_turn, context, [Message("tool", text, name="search",
                                                                      tool_call_id=call_id)])

    structural = [i for i in observation(forged) if i in family.structural_ids]
    assert structural == [i for i in observation("before  after") if i in family.structural_ids]
    assert forged in tokenizer.decode(observation(forged))


CONFORMANCE = [("qwen3", "qwen3", {}), ("gpt-oss", "gpt-oss", {}), ("deepseek-v4", "deepseek-v4", {}),
               ("llama3", "llama3.1", {}), ("glm45", "glm-look-alike", {}), ("mistral", "mistral-v3", {}),
               ("mistral", "mistral-tekken", {}),
               # V3's and R1's markup on V4's vocabulary (a look-alike: no V3 tokenizer here)
               ("deepseek-v3", "deepseek-v4", {}), ("deepseek-r1", "deepseek-v4", {})]


@pytest.mark.parametrize(("name", "source", "options"), CONFORMANCE, ids=[f"{c[0]}@{c[1]}" for c in CONFORMANCE])
def test_every_family_reads_hostile_completions_without_raising_in_linear_time(name, source, options):
    from rlfactory_core.testing import check_family_conformance

    tokenizer = _tokenizer(source)
    family = get_component("family", name).build(tokenizer, **options)
    _, context = family.prompt([Message("system", SYSTEM), Message("user", QUESTION)], _tools())
    check_family_conformance(family, tokenizer, context)


def test_the_template_family_meets_the_same_bar_at_the_id_level(default_model_dir):
    from rlfactory_core.rollout import TemplateFamily
    from rlfactory_core.testing import check_family_conformance

    tokenizer = load_tokenizer(default_model_dir)
    family = TemplateFamily.build(tokenizer, get_component("parser", "qwen3"))
    check_family_conformance(family, tokenizer)


def test_the_family_bar_catches_a_raising_or_quadratic_reader():
    from rlfactory_core.testing import check_family_conformance
    from rlfactory_core.types import ParsedTurn

    tokenizer = _tokenizer("qwen3")

    class Reader:
        name = "reader"

        def decode(self, ids):
            return tokenizer.decode(ids)

    class Raising(Reader):
        def parse(self, ids, context):
            if len(ids) > 300:
                raise RecursionError("deep")
            return ParsedTurn(text=self.decode(ids), content="")

    class Quadratic(Reader):
        def parse(self, ids, context):
            pairs = sum(1 for a in ids for b in ids if a == b)  # every id against every id
            return ParsedTurn(text=self.decode(ids), content=str(pairs)[:1])

    case = markup_cases(tokenizer)[:1]
    with pytest.raises(AssertionError, match=r"family 'reader', case 'markup_in_order': parse raised RecursionError"):
        check_family_conformance(Raising(), tokenizer, cases=case)
    with pytest.raises(AssertionError, match=r"the work grows faster than the completion"):
        check_family_conformance(Quadratic(), tokenizer, cases=case, size=400)


BROKEN_ARGUMENTS = [
    ("gpt-oss", "gpt-oss", 'Look.<|end|><|start|>assistant<|channel|>commentary to=functions.search <|constrain|>json'
                           '<|message|>{"query": <|call|>'),
    ("qwen3", "qwen3", '<tool_call>\n{"name": "search", "arguments": "query=Avalon"}\n</tool_call><|im_end|>'),
    ("mistral", "mistral-v7", '[TOOL_CALLS] [{"name": "search", "arguments": "query=Avalon"}]</s>'),
    ("deepseek-v4", "deepseek-v4", '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="search">\n<｜DSML｜parameter '
                                   'name="query" string="false">{bad</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
                                   '</｜DSML｜tool_calls><｜end▁of▁sentence｜>'),
]


@pytest.mark.parametrize(("name", "source", "text"), BROKEN_ARGUMENTS, ids=[c[0] for c in BROKEN_ARGUMENTS])
async def test_a_named_call_with_broken_arguments_is_answered_invalid_arguments(name, source, text):
    """One rule for every format: the tool is named, so the call stays and the tool manager
    answers invalid_arguments without running the tool (a call naming no tool: a parse error)."""
    tokenizer = _tokenizer(source)
    family = get_component("family", name).build(tokenizer)
    _, context = family.prompt([Message("user", QUESTION)], _tools())
    turn = family.parse(tokenizer.encode(text, add_special_tokens=False), context)
    assert not turn.errors and [(c.name, c.arguments) for c in turn.tool_calls] == [("search", {})]
    assert "cannot be used" in turn.tool_calls[0].invalid
    [result] = await ConcurrentToolManager(_tools(), timeout_s=5).call(turn.tool_calls)
    assert result.error == "invalid_arguments" and result.content.startswith("Error: the arguments of 'search'")


# ------------------------------------------------------------------ several sequences
#
# Formats that rewrite earlier turns cannot append the next observation: the trajectory goes
# on in a new sequence whose prompt is the family's render of the whole conversation. Each
# sequence must be exact on its own, every sampled turn trained once (a model segment of the
# one sequence that sampled it), and the new prompt equal to the reference's render.

FOLLOW_UP = "And how many people live in the two together?"
#: after the first answer the env asks FOLLOW_UP: one more tool round, then the answer
SECOND_QUESTION = [
    Turn("Add the two populations.", "", [("calculate", {"expression": "7-5"})]),
    Turn("Done.", "Together 12 million people; the calculator only subtracts.", []),
]


class _FollowUpEnv(_Env):
    def __init__(self, follow_ups):
        super().__init__()
        self.follow_ups = list(follow_ups)

    async def step(self, state, turn, results):
        answered = not turn.tool_calls and not turn.errors
        if answered and self.follow_ups:
            return EnvStep(observation=[Message("user", self.follow_ups.pop(0))], final_answer=turn.content)
        return EnvStep(done=answered, final_answer=turn.content or None)


def _r1_completion(tokenizer, turn: Turn) -> list[int]:
    """DeepSeek R1's turn as it writes one: the reasoning the prompt's <think> opened, then its
    tool-call markup (as its renderer writes calls) or the answer."""
    text = f"{turn.reasoning}\n</think>\n\n{turn.content}"
    if turn.calls:
        text += "<｜tool▁calls▁begin｜>" + "\n".join(
            f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n{json.dumps(a)}\n```<｜tool▁call▁end｜>"
            for n, a in turn.calls) + "<｜tool▁calls▁end｜>"
    return tokenizer.encode(text + "<｜end▁of▁sentence｜>", add_special_tokens=False)


@dataclass
class Rewriting:
    family: str
    tokenizer: str
    script: list[Turn]
    follow_ups: list[str]
    writer: str  # harmony | renderer | r1
    options: dict
    sequences: int  # how many the episode makes


REWRITING = [
    # harmony drops past analysis once a final answer follows it: the follow-up question
    # starts a second sequence, checked against OpenAI's encoder
    Rewriting("gpt-oss", "gpt-oss", SEQUENTIAL + SECOND_QUESTION, [FOLLOW_UP], "harmony", {}, 2),
    # DeepSeek V4 renders several tool results at once: the parallel call's results start a
    # new sequence
    Rewriting("deepseek-v4", "deepseek-v4", PARALLEL, [], "renderer", {"enable_thinking": True}, 2),
    # R1 (its markup on V4's vocabulary, a look-alike): its prompt opens <think> and its render
    # of a finished turn drops it, yet the renderer appends each tool round after the sampled
    # ids: one sequence (a render of the whole conversation is not a reference for it)
    Rewriting("deepseek-r1", "deepseek-v4", SEQUENTIAL, [], "r1", {}, 1),
]


def _harmony_prompt(conversation: list) -> list[int]:
    from openai_harmony import Conversation, Role

    return _harmony().render_conversation_for_completion(Conversation.from_messages(conversation), Role.ASSISTANT)


def _harmony_opening(family, tools) -> list:
    from openai_harmony import DeveloperContent, Message as HarmonyMessage, Role, SystemContent, ToolDescription

    system = SystemContent.new().with_conversation_start_date(family.renderer.config.conversation_start_date)
    developer = DeveloperContent.new().with_instructions(SYSTEM).with_function_tools(
        [ToolDescription.new(t.name, t.description, parameters=t.parameters) for t in tools])
    return [HarmonyMessage.from_role_and_content(Role.SYSTEM, system),
            HarmonyMessage.from_role_and_content(Role.DEVELOPER, developer),
            HarmonyMessage.from_role_and_content(Role.USER, QUESTION)]


@pytest.mark.parametrize("case", REWRITING, ids=[c.family for c in REWRITING])
async def test_a_format_that_rewrites_history_trains_several_exact_sequences(case):
    """(R1 is here for its hand-written turns: it appends, one sequence.)"""
    from openai_harmony import Author, Message as HarmonyMessage, Role

    tokenizer = _tokenizer(case.tokenizer)
    family = get_component("family", case.family).build(tokenizer, **case.options)
    env = _FollowUpEnv(case.follow_ups)
    history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    written: list[list[int]] = []

    def reply(prompt_text: str) -> list[int]:
        turn = case.script[len(written)]
        if case.writer == "harmony":
            ids = _gpt_oss_completion(tokenizer, turn, backend.prompts[-1])
        elif case.writer == "r1":
            ids = _r1_completion(tokenizer, turn)
        else:
            ids = _rendered_completion(family, turn, backend.prompts[-1], history, env.tools)
        written.append(ids)
        return ids

    backend = ScriptedBackend(tokenizer, reply)
    trajectory = await _run_episode(env, family, backend)
    assert trajectory.stop_reason == "env_done", trajectory.metadata.get("error")
    assert len(written) == len(case.script) and len(trajectory.sequences) == case.sequences
    # every sampled turn is a model segment of exactly one sequence, as sampled, in order
    assert [s.token_ids for s in trajectory.all_segments if s.kind == "model"] == written
    assert [(c.name, c.arguments) for c in trajectory.tool_calls] == [c for t in case.script for c in t.calls]
    # each sequence is what the model was given: its prompt, then its turns and observations
    # appended; generation k saw exactly the ids of its sequence before it
    contexts = iter(backend.prompts)
    for sequence in trajectory.sequences:
        ids = list(sequence.prompt_ids)
        for segment in sequence.segments:
            if segment.kind == "model":
                assert next(contexts) == ids
            ids += segment.token_ids
    # a later sequence's prompt is the reference's render of the conversation so far
    results = iter(trajectory.tool_results)
    turns = iter(case.script)
    follow_ups = iter(case.follow_ups)
    harmony = _harmony_opening(family, env.tools) if case.writer == "harmony" else None
    k = 0
    for sequence in trajectory.sequences:
        if sequence is not trajectory.sequences[0]:
            if harmony is not None:
                reference = _harmony_prompt(harmony)
                # the renderer opens the analysis channel in the prompt; harmony's completion
                # prompt stops at the role
                opening = tokenizer.encode("<|channel|>analysis<|message|>", add_special_tokens=False)
                got = sequence.prompt_ids[:len(reference)]
                at = next((i for i, (a, b) in enumerate(zip(got, reference)) if a != b), len(reference))
                assert got == reference and sequence.prompt_ids[len(reference):] in ([], opening), (
                    f"at {at}: {tokenizer.decode(got[at - 5:at + 10])!r} vs {tokenizer.decode(reference[at - 5:at + 10])!r} "
                    f"{got[at - 5:at + 10]} {reference[at - 5:at + 10]}")
            else:
                reference = family.renderer.render_ids(history, tools=_tool_specs(env.tools),
                                                       add_generation_prompt=True)
                assert sequence.prompt_ids == reference
        for segment in sequence.segments:
            if segment.kind != "model":
                continue
            turn = next(turns)
            history.append(_assistant(turn, k))
            if harmony is not None:  # the conversation as parsed: what a new sequence renders
                harmony += _harmony_assistant(turn, content_type=False)
            for j, (name, _) in enumerate(turn.calls):
                result = next(results)
                history.append({"role": "tool", "name": name, "tool_call_id": f"call_{k + j}",
                                "content": result.content})
                if harmony is not None:
                    harmony.append(HarmonyMessage.from_author_and_content(
                        Author.new(Role.TOOL, f"functions.{name}"), result.content).with_recipient(
                        "assistant").with_channel("commentary"))
            k += len(turn.calls)
            if not turn.calls:
                question = next(follow_ups, None)
                if question is not None:
                    history.append({"role": "user", "content": question})
                    if harmony is not None:
                        harmony.append(HarmonyMessage.from_role_and_content(Role.USER, question))


# ------------------------------------------------------------------ Mistral (mistral-common)
#
# The family encodes with mistral-common; the model's turns are written by mistral-common's
# own assistant encoding (ids as Mistral's nine characters), and the context appended turn by
# turn must equal mistral-common's encoding of the whole conversation in one request.

MISTRAL = ["mistral-v3", "mistral-v7", "mistral-tekken"]


def _mistral_call_id(k: int) -> str:
    return f"call{k:05d}"


def _mistral_messages(turn: Turn, first_call: int):
    from mistral_common.protocol.instruct.messages import AssistantMessage
    from mistral_common.protocol.instruct.tool_calls import FunctionCall, ToolCall

    calls = [ToolCall(id=_mistral_call_id(first_call + k), function=FunctionCall(name=n, arguments=json.dumps(a)))
             for k, (n, a) in enumerate(turn.calls)]
    return AssistantMessage(content=turn.content or None, tool_calls=calls or None)


@pytest.mark.parametrize("source", MISTRAL)
async def test_a_mistral_episode_is_token_exact_against_mistral_common(source):
    from mistral_common.protocol.instruct.messages import SystemMessage, ToolMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    tokenizer = _tokenizer(source)
    family = get_component("family", "mistral").build(tokenizer)
    mistral = family.mistral
    script = [Turn(None, t.content, t.calls) for t in PARALLEL]  # Mistral writes no reasoning
    env = _Env()
    written: list[list[int]] = []
    calls = 0

    def reply(prompt_text: str) -> list[int]:
        nonlocal calls
        turn = script[len(written)]
        ids = list(mistral.instruct_tokenizer.encode_assistant_message(_mistral_messages(turn, calls), False))
        calls += len(turn.calls)
        written.append(ids)
        return ids

    trajectory = await _run_episode(env, family, ScriptedBackend(tokenizer, reply))
    assert trajectory.stop_reason == "env_done", trajectory.metadata.get("error")
    assert sum(1 for t in script if t.calls) >= 3 and any(len(t.calls) > 1 for t in script)
    assert any(r.error for r in trajectory.tool_results) and len(trajectory.sequences) == 1
    assert [s.token_ids for s in trajectory.segments if s.kind == "model"] == written
    assert [(c.name, c.arguments) for c in trajectory.tool_calls] == [c for t in script for c in t.calls]
    assert [c.id for c in trajectory.tool_calls] == [_mistral_call_id(k) for k in range(calls)]
    # the whole conversation in one request (up to the last tool result), then the answer
    messages: list[Any] = [SystemMessage(content=SYSTEM), UserMessage(content=QUESTION)]
    results = iter(trajectory.tool_results)
    k = 0
    for turn in script[:-1]:
        messages.append(_mistral_messages(turn, k))
        for j, (name, _) in enumerate(turn.calls):
            messages.append(ToolMessage(content=next(results).content, tool_call_id=_mistral_call_id(k + j), name=name))
        k += len(turn.calls)
    tools = [family._tool(t) for t in env.tools]  # noqa: SLF001 - the family's own conversion of the tools
    reference = list(mistral.encode_chat_completion(ChatCompletionRequest(messages=messages, tools=tools)).tokens)
    reference += written[-1]
    context = trajectory.prompt_ids + [i for s in trajectory.segments for i in s.token_ids]
    if context != reference:
        k = next((i for i, (a, b) in enumerate(zip(context, reference)) if a != b), min(len(context), len(reference)))
        pytest.fail(f"{source}: the context differs from mistral-common's at {k}:\n"
                    f"context   {tokenizer.decode(context[max(0, k - 20):k + 20])!r}\n"
                    f"reference {tokenizer.decode(reference[max(0, k - 20):k + 20])!r}")


@pytest.mark.parametrize("source", MISTRAL)
async def test_a_mistral_follow_up_question_starts_a_sequence_rendered_by_mistral_common(source):
    """A new user message moves Mistral's tool list (and v3's system prompt) in front of it:
    the follow-up question starts a second sequence, mistral-common's render of the
    conversation as parsed; the model's turns are each in one sequence, as written."""
    tokenizer = _tokenizer(source)
    family = get_component("family", "mistral").build(tokenizer)
    script = [Turn(None, t.content, t.calls) for t in SEQUENTIAL[2:] + SECOND_QUESTION]
    env = _FollowUpEnv([FOLLOW_UP])
    written: list[list[int]] = []
    calls = 0

    def reply(prompt_text: str) -> list[int]:
        nonlocal calls
        turn = script[len(written)]
        ids = list(family.mistral.instruct_tokenizer.encode_assistant_message(_mistral_messages(turn, calls), False))
        calls += len(turn.calls)
        written.append(ids)
        return ids

    backend = ScriptedBackend(tokenizer, reply)
    trajectory = await _run_episode(env, family, backend)
    assert trajectory.stop_reason == "env_done", trajectory.metadata.get("error")
    assert len(trajectory.sequences) == 2
    assert [s.token_ids for s in trajectory.all_segments if s.kind == "model"] == written
    first, second = trajectory.sequences
    assert backend.prompts[len([s for s in first.segments if s.kind == "model"])] == second.prompt_ids
    text = tokenizer.decode(second.prompt_ids)
    assert text.rfind("[AVAILABLE_TOOLS]") > text.find(QUESTION) and text.endswith("[/INST]")
    assert FOLLOW_UP in text and text.count("[TOOL_RESULTS]") == 2


def test_the_mistral_family_refuses_a_tokenizer_it_cannot_encode_for(default_model_dir):
    from rlfactory_core.errors import ModelError

    with pytest.raises(ModelError, match="found no mistral-common tokenizer file"):
        get_component("family", "mistral").build(load_tokenizer(default_model_dir))
    with pytest.raises(ModelError, match="encode text differently"):
        get_component("family", "mistral").build(_tokenizer("mistral-v3"), encoding="mistral-tekken")
    with pytest.raises(ModelError, match="'v9' is not a Mistral encoding"):
        get_component("family", "mistral").build(_tokenizer("mistral-v3"), encoding="v9")


@pytest.mark.parametrize("source", MISTRAL)
def test_mistral_markup_in_messages_and_tool_results_stays_text(source):
    tokenizer = _tokenizer(source)
    family = get_component("family", "mistral").build(tokenizer)
    control = {int(i) for i in tokenizer.added_tokens_decoder}
    markup = "".join(tokenizer.convert_ids_to_tokens(sorted(control)[:64]))

    def controls(text):
        _, ids = family.prompt([Message("system", text), Message("user", text)], _tools())
        return [i for i in ids if i in control]

    assert controls(f"before {markup} after") == controls("before  after")
    check = family.self_check()  # the tool result holding the markup: rlf doctor's check
    assert check.ok, check.describe()
