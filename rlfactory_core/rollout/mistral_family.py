"""The Mistral family, encoded by ``mistral-common`` (Mistral's own library; wrapped, never
copied): SentencePiece v3 and v7 and Tekken vocabularies, tool calls as
``[TOOL_CALLS] [{"name": ..., "arguments": {...}, "id": ...}]`` and results as
``[TOOL_RESULTS] ... [/TOOL_RESULTS]``.

* **Prompts** are ``encode_chat_completion`` of the messages and tools; **observations** of
  tool results are the instruct tokenizer's encoding of each tool message, appended after the
  sampled turn. A user or system message in an observation moves the tool list (and v3's
  system prompt) in front of the *last* user message: the format rewrites earlier turns
  there, so ``observation_ids`` returns None and the trajectory goes on in a new sequence.
* **Calls are read from ids**: the turn is split at its ``[TOOL_CALLS]`` id (text cannot
  forge it), the rest read as one JSON array of calls (linear, guarded); a named call whose
  arguments cannot be used is kept with ``ToolCall.invalid`` (``invalid_arguments``).
* **Content is data**: mistral-common tokenizes message text without its control tokens
  (a tool result holding ``[INST]`` stays text), which the fidelity tests check.
* **Call ids**: Mistral's are nine letters or digits; a call the model wrote without a valid
  one gets one made from its place in the trajectory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Sequence

from ..errors import ModelError, one_line
from ..tools import named_call
from ..types import Message, ParsedTurn, ParseError, ToolResult
from .family import FamilyCheck, SelfCheckTool, tool_role_messages

__all__ = ["MistralFamily"]

#: the offline tokenizers (``rlfactory_core.models.tokenizer_sources``) this family encodes
#: with mistral-common, most specific first
_SOURCES = ("mistral-tekken", "mistral-v7", "mistral-v3")
#: the files a Mistral model directory holds for mistral-common
_MODEL_FILES = ("tekken.json", "tokenizer.model.v7", "tokenizer.model.v3")


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 9 and value.isascii() and value.isalnum()


class MistralFamily:
    """Mistral's chat format through mistral-common.

    :param tokenizer: the model's fast tokenizer (its ids must be mistral-common's).
    :param encoding: ``auto`` (the model directory's ``tekken.json`` / ``tokenizer.model.v3``
        / ``.v7``, else the offline vocabulary the tokenizer is), or one of
        ``mistral-tekken``, ``mistral-v7``, ``mistral-v3``.
    """

    name: ClassVar[str] = "mistral"
    description: ClassVar[str] = ("Mistral (v3, v7, Tekken: [TOOL_CALLS] JSON calls, [TOOL_RESULTS]), encoded by "
                                  "mistral-common")
    anchors: ClassVar[dict[str, int | None]] = {"[INST]": None, "[TOOL_CALLS]": None, "[AVAILABLE_TOOLS]": None,
                                                "[TOOL_RESULTS]": None}
    detected: ClassVar[bool] = True
    native_format: ClassVar[str | None] = None

    @classmethod
    def build(cls, tokenizer: Any, encoding: str = "auto") -> "MistralFamily":
        return cls(tokenizer, encoding)

    def __init__(self, tokenizer: Any, encoding: str = "auto"):
        try:
            from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
        except ImportError as exc:
            raise ModelError(f"the mistral family needs mistral-common ({one_line(exc)})",
                             hint="pip install -e '.[families]' (make install does)") from exc
        self.tokenizer = tokenizer
        path = self._encoding_file(tokenizer, encoding)
        self.mistral = MistralTokenizer.from_file(str(path))
        self.encoding_file = path
        self._check_same_vocabulary(path)
        vocab = tokenizer.get_vocab()
        self.tool_calls_id = vocab["[TOOL_CALLS]"]
        self.eos_id = tokenizer.convert_tokens_to_ids("</s>")
        self.stop_token_ids: tuple[int, ...] = (self.eos_id,)

    @staticmethod
    def _encoding_file(tokenizer: Any, encoding: str) -> Path:
        from ..models.tokenizer_sources import TOKENIZER_SOURCES, source_file

        if encoding != "auto":
            if encoding not in _SOURCES:
                raise ModelError(f"model.family_options.encoding: {encoding!r} is not a Mistral encoding",
                                 hint=f"one of auto, {', '.join(_SOURCES)}")
            return source_file(encoding)
        directory = Path(str(getattr(tokenizer, "name_or_path", "") or ""))
        for name in _MODEL_FILES:
            if (directory / name).is_file():
                return directory / name
        vocab = tokenizer.get_vocab()
        size = len(tokenizer)
        for name in _SOURCES:
            anchors = TOKENIZER_SOURCES[name].anchors
            if all(vocab.get(token) == token_id for token, token_id in anchors.items()) and \
                    tuple(tokenizer.encode("hello world", add_special_tokens=False)) == \
                    TOKENIZER_SOURCES[name].hello_world:
                return source_file(name)
        raise ModelError(f"the mistral family found no mistral-common tokenizer file for this tokenizer ({size} "
                         f"tokens): its model directory has none of {', '.join(_MODEL_FILES)} and it is none of "
                         f"the offline vocabularies", hint="put the model's tekken.json or tokenizer.model.v3 "
                                                           "beside it, or set model.family_options.encoding")

    def _check_same_vocabulary(self, path: Path) -> None:
        sample = "Hello world: 12*7 = 84, ünïcode and\nnew lines"  # (HF splits added tokens from text)
        theirs = self.mistral.instruct_tokenizer.tokenizer.encode(sample, bos=False, eos=False)
        ours = self.tokenizer.encode(sample, add_special_tokens=False)
        if list(theirs) != list(ours):
            raise ModelError(f"the model's tokenizer and mistral-common's {path.name} encode text differently",
                             hint="load the tokenizer mistral-common's file was converted from, or set "
                                  "model.family_options.encoding")

    # ------------------------------------------------------------------ rendering

    def prompt(self, messages: Sequence[Message], tools: Sequence[Any]) -> tuple[list[Message], list[int]]:
        from mistral_common.protocol.instruct.request import ChatCompletionRequest

        request = ChatCompletionRequest(messages=[self._message(m) for m in messages],
                                        tools=[self._tool(t) for t in tools] or None)
        return list(messages), list(self.mistral.encode_chat_completion(request).tokens)

    def observation_ids(self, completion_ids: Sequence[int], context_ids: Sequence[int],
                        observation: Sequence[Message]) -> list[int] | None:
        if not completion_ids or completion_ids[-1] != self.eos_id:
            return None  # a turn cut before its end: the conversation is rendered afresh
        if any(m.role != "tool" for m in observation):
            return None  # the tool list (and v3's system prompt) moves before the last user message
        ids: list[int] = []
        for message in observation:
            encoded = self.mistral.instruct_tokenizer.encode_tool_message(self._message(message), False)
            ids += list(encoded[0])
        return ids

    def _message(self, message: Message) -> Any:
        from mistral_common.protocol.instruct.messages import (AssistantMessage, SystemMessage, ToolMessage,
                                                               UserMessage)
        from mistral_common.protocol.instruct.tool_calls import FunctionCall
        from mistral_common.protocol.instruct.tool_calls import ToolCall as MistralCall

        if message.images:
            raise ModelError("the mistral family renders text only: a message has images",
                             hint="use a vision-language model's own template (model.family: template)")
        if message.role == "system":
            return SystemMessage(content=message.content)
        if message.role == "user":
            return UserMessage(content=message.content)
        if message.role == "tool":
            return ToolMessage(content=message.content, tool_call_id=self._call_id(message.tool_call_id, 0, 0),
                               name=message.name)
        calls = [MistralCall(id=self._call_id(c.id, 0, k), function=FunctionCall(
            name=c.name, arguments=json.dumps(c.arguments, ensure_ascii=False))) for k, c in enumerate(message.tool_calls)]
        return AssistantMessage(content=message.content or None, tool_calls=calls or None)

    @staticmethod
    def _tool(tool: Any) -> Any:
        from mistral_common.protocol.instruct.tool_calls import Function, Tool

        return Tool(function=Function(name=tool.name, description=getattr(tool, "description", "") or "",
                                      parameters=getattr(tool, "parameters", None) or {"type": "object"}))

    @staticmethod
    def _call_id(value: Any, position: int, k: int) -> str:
        """``value`` where it is a Mistral call id, else one made from the turn's place in the
        trajectory (``position``: the ids before it) and the call's index."""
        if _valid_id(value):
            return value
        return f"c{(position * 64 + k) % 10 ** 8:08d}"

    # ------------------------------------------------------------------ checking

    def self_check(self) -> FamilyCheck:
        """A tool round as the rollout builds it (the prompt, a call as mistral-common writes
        it, read back from its ids, the result appended) against mistral-common's encoding of
        the whole conversation in one request; and a tool result holding the text of every
        control token adding none of them (``rlf doctor --model`` runs it)."""
        from mistral_common.protocol.instruct.messages import AssistantMessage, SystemMessage, ToolMessage, UserMessage
        from mistral_common.protocol.instruct.request import ChatCompletionRequest
        from mistral_common.protocol.instruct.tool_calls import FunctionCall
        from mistral_common.protocol.instruct.tool_calls import ToolCall as MistralCall

        tool = SelfCheckTool()
        opening = [Message("system", "You can call tools."), Message("user", "What is 12*7?")]
        _, prompt = self.prompt(opening, [tool])
        call = AssistantMessage(tool_calls=[MistralCall(id="call00000", function=FunctionCall(
            name=tool.name, arguments=json.dumps({"expression": "12*7"})))])
        completion = list(self.mistral.instruct_tokenizer.encode_assistant_message(call, False))
        turn = self.parse(completion, prompt)
        if [(c.name, c.arguments, c.id) for c in turn.tool_calls] != [(tool.name, {"expression": "12*7"}, "call00000")]:
            return FamilyCheck(False, [f"the call mistral-common writes is read back as {turn.tool_calls or turn.errors}"])
        appended = self.observation_ids(completion, prompt, [Message("tool", "84", name=tool.name,
                                                                     tool_call_id="call00000")]) or []
        request = ChatCompletionRequest(messages=[SystemMessage(content="You can call tools."),
                                                  UserMessage(content="What is 12*7?"), call,
                                                  ToolMessage(content="84", tool_call_id="call00000", name=tool.name)],
                                        tools=[self._tool(tool)])
        reference = list(self.mistral.encode_chat_completion(request).tokens)
        context = [*prompt, *completion, *appended]
        problems = []
        if context != reference:
            k = next((i for i, (a, b) in enumerate(zip(context, reference)) if a != b), min(len(context), len(reference)))
            problems.append(f"the appended ids differ from mistral-common's encoding of the conversation at token {k}")
        control = self._control_ids()
        markup = "".join(self.tokenizer.convert_ids_to_tokens(sorted(control)))
        forged = self.observation_ids(completion, prompt, [Message("tool", f"84 {markup}", name=tool.name,
                                                                   tool_call_id="call00000")]) or []
        if sum(i in control for i in forged) != sum(i in control for i in appended):
            problems.append("a tool result holding the control tokens' text put control tokens into the context")
        return FamilyCheck(not problems, problems, len(context), "mistral-common's encoding of the whole conversation")

    def _control_ids(self) -> set[int]:
        """The vocabulary's control tokens ([INST], [TOOL_CALLS], </s> ...), up to 64."""
        added = getattr(self.tokenizer, "added_tokens_decoder", {}) or {}
        return {int(i) for i in sorted(added)[:64]}

    # ------------------------------------------------------------------ reading turns

    def parse(self, completion_ids: Sequence[int], context_ids: Sequence[int]) -> ParsedTurn:
        """Content before the turn's ``[TOOL_CALLS]`` id, the calls after it (one JSON array,
        a single object taken as one call). Never raises; linear in the turn's length."""
        ids = list(completion_ids)
        text = self.decode(ids)
        if self.tool_calls_id not in ids:
            return ParsedTurn(text=text, content=self._plain(ids).strip())
        at = ids.index(self.tool_calls_id)
        content = self._plain(ids[:at]).strip()
        body = self._plain([i for i in ids[at + 1:] if i != self.tool_calls_id]).strip()
        try:
            value = json.loads(body)
        except (ValueError, RecursionError):
            return ParsedTurn(text=text, content=content, errors=[ParseError(
                "the tool calls after [TOOL_CALLS] are not a JSON array; write "
                '[TOOL_CALLS] [{"name": "<tool>", "arguments": {...}}]', body[:200])])
        calls, errors = [], []
        for k, call in enumerate(value if isinstance(value, list) else [value]):
            name = call.get("name") if isinstance(call, dict) else None
            if not isinstance(name, str) or not name:
                errors.append(ParseError('a tool call without a "name"; write {"name": "<tool>", "arguments": {...}}',
                                         json.dumps(call, ensure_ascii=False, default=str)[:200]))
                continue
            call_id = self._call_id(call.get("id"), len(context_ids), k)
            if any(c.id == call_id for c in calls):
                call_id = self._call_id(None, len(context_ids), k)
            calls.append(named_call(name, call.get("arguments", {}), call_id))
        return ParsedTurn(text=text, content=content, tool_calls=calls, errors=errors)

    def tool_messages(self, results: Sequence[ToolResult]) -> list[Message]:
        return tool_role_messages(results)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False)

    def _plain(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)
