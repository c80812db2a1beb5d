"""Chat-template rendering for token-exact trajectories.

A trajectory's token ids are built by appending, never by re-rendering the conversation:
the prompt is rendered once; each model turn is the ids the backend sampled; each
observation (tool results, env feedback) is rendered as a *delta* of the chat template
and tokenized on its own. Re-tokenizing the whole conversation after every turn would
silently change the model's own tokens (a sampled token sequence is often not the one the
tokenizer would choose for the same text), and the policy would be trained on tokens it
never produced.

The delta of an observation is computed on a small reference conversation, not on the
trajectory's real history, so that templates which rewrite earlier turns (dropping old
reasoning, inserting default system prompts) cannot shift it::

    glue   = what the template writes after an assistant message's content
             (e.g. "<|im_end|>\\n"), minus the end-of-turn token the model already sampled
    delta  = render(ref + [assistant] + observation, generation prompt)
             - render(ref + [assistant])
    observation ids = tokenize(glue + delta)

:func:`check_retokenization` is the diagnostic the other way round: it renders the
finished conversation through the template, tokenizes it, and reports where that would
differ from the ids kept (``rlf doctor`` runs it on a sample conversation).

Images
------
With a vision-language model's ``processor``, messages may carry images
(:attr:`~rlfactory_core.types.Message.images`). The template writes one placeholder per image
(``<image>``); :meth:`ChatTemplate.encode` tokenizes through the processor, which expands each
placeholder to the image's run of image tokens. The prompt and every observation are encoded
with their own images, so the kept ids hold exactly the image tokens the model saw, and the
trajectory's images (:attr:`~rlfactory_core.types.Trajectory.images`) line up with those
runs in order: the backends and the trainer give the model the same images in that order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ..errors import ModelError, one_line
from ..types import Message, Segment, Trajectory

__all__ = ["ChatTemplate", "RetokenizationReport", "check_retokenization", "self_check", "trajectory_ids",
           "as_pil_image"]

# A reference conversation for computing deltas. The marker is plain ASCII that no
# template transforms; the user turn makes templates that insist on one happy.
_MARKER = "RlfAssistantContentMarker"
_REFERENCE = [Message(role="user", content="RlfReferenceQuestion")]


def _dicts(messages: Iterable[Message | dict[str, Any]]) -> list[dict[str, Any]]:
    return [m.to_dict() if isinstance(m, Message) else dict(m) for m in messages]


def _images(messages: Iterable[Message | dict[str, Any]]) -> list[Any]:
    return [image for m in messages if isinstance(m, Message) for image in m.images]


def as_pil_image(image: Any) -> Any:
    """``image`` as an RGB ``PIL.Image.Image``: a PIL image, or the bytes of an image file
    (PNG, JPEG ...). Raises :class:`ValueError` for anything else."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - transformers' image processors need it too
        raise ModelError("images need Pillow", hint="pip install pillow") from None
    if isinstance(image, Image.Image):
        return image if image.mode == "RGB" else image.convert("RGB")
    if isinstance(image, (bytes, bytearray, memoryview)):
        import io

        try:
            with Image.open(io.BytesIO(bytes(image))) as opened:
                return opened.convert("RGB")
        except Exception as exc:  # noqa: BLE001 - PIL raises several kinds
            raise ValueError(f"the image bytes are not a readable image file ({exc})") from None
    raise ValueError(f"an image must be a PIL.Image.Image or the bytes of an image file, got {type(image).__name__}")


class ChatTemplate:
    """Renders and tokenizes conversations with a tokenizer's chat template.

    :param tokenizer: a transformers tokenizer with a ``chat_template``.
    :param stop_token_ids: ids that end a model turn besides the tokenizer's EOS (the
        same ``stop_token_ids`` given to the backend's sampling).
    :param processor: a vision-language model's processor (``AutoProcessor``), for messages
        with images; None for a text-only model, which then refuses them.
    :param template_kwargs: extra variables for the template (e.g. ``enable_thinking``).
    """

    def __init__(self, tokenizer: Any, stop_token_ids: Sequence[int] = (), *, processor: Any = None,
                 **template_kwargs: Any):
        if not getattr(tokenizer, "chat_template", None) and getattr(processor, "chat_template", None):
            # Vision-language checkpoints often keep the template on the processor only.
            tokenizer.chat_template = processor.chat_template
        if not getattr(tokenizer, "chat_template", None):
            raise ModelError(
                f"the tokenizer of {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template",
                hint="use an instruct/chat model, or set tokenizer.chat_template before the rollout",
            )
        self.tokenizer = tokenizer
        self.processor = processor if getattr(processor, "image_processor", None) is not None else None
        self.template_kwargs = template_kwargs
        eos = tokenizer.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.end_of_turn_ids: frozenset[int] = frozenset(eos_ids | set(stop_token_ids))
        self.turn_suffix = self._assistant_turn_suffix()
        #: the end-of-turn token the template itself writes (``<|im_end|>``), if any
        self.turn_end_id: int | None = next(
            (i for i in sorted(self.end_of_turn_ids)
             if (text := self.decode([i], skip_special_tokens=False)) and self.turn_suffix.startswith(text)), None)

    # ----------------------------------------------------------------- rendering

    def render(self, messages: Iterable[Message | dict[str, Any]], add_generation_prompt: bool = False) -> str:
        """The template's text for ``messages``."""
        return self.tokenizer.apply_chat_template(
            _dicts(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **self.template_kwargs
        )

    @property
    def accepts_images(self) -> bool:
        """Whether messages may carry images (the model has an image processor)."""
        return self.processor is not None

    def encode(self, text: str, images: Sequence[Any] = ()) -> list[int]:
        """Token ids of rendered text. No BOS/EOS added: the template writes its own.

        ``images``: one per image placeholder in ``text``, in order; the processor expands
        each placeholder to the image's tokens. Raises :class:`ModelError` when the model
        takes no images or the placeholders and images do not match."""
        if not images:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        self._check_accepts(images)
        try:
            pictures = [as_pil_image(image) for image in images]
            encoded = self.processor(text=[text], images=pictures, add_special_tokens=False)
        except (ValueError, TypeError) as exc:
            raise ModelError(f"cannot encode {len(images)} image(s) with the text: {one_line(exc)}",
                             hint="each image needs its own placeholder in the rendered text: put images in "
                                  "Message.images, not in the content") from None
        return [int(i) for i in encoded["input_ids"][0]]

    def _check_accepts(self, images: Sequence[Any]) -> None:
        if images and self.processor is None:
            raise ModelError(
                f"{len(images)} image(s) in the conversation, but {getattr(self.tokenizer, 'name_or_path', 'the model')!r} "
                "is a text-only model (it has no image processor)",
                hint="turn the env's images off (e.g. env_options.screenshot=false), or use a vision-language model")

    def image_inputs(self, images: Sequence[Any]) -> dict[str, Any]:
        """The model's inputs for ``images`` (``pixel_values`` ...: tensors whose first
        dimension is the image), in order. Requires :attr:`accepts_images`."""
        if self.processor is None:
            raise ModelError("this model takes no images", hint="use a vision-language model")
        return image_inputs(self.processor, images)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def prompt_ids(self, messages: Sequence[Message | dict[str, Any]]) -> list[int]:
        """Ids of the opening conversation followed by the generation prompt."""
        self._check_accepts(_images(messages))  # before rendering: a text template fails on image parts
        return self.encode(self.render(messages, add_generation_prompt=True), _images(messages))

    def _assistant_turn_suffix(self) -> str:
        """What the template writes after an assistant message's content (``<|im_end|>\\n``)."""
        with_turn = self.render([*_REFERENCE, Message(role="assistant", content=_MARKER)])
        self._reference_turn = with_turn  # what every observation delta is taken against
        at = with_turn.rfind(_MARKER)
        if at == -1:
            raise ModelError(
                "the chat template does not render assistant messages verbatim; cannot build token-exact trajectories",
                hint="use a model whose chat template writes assistant content as given",
            )
        return with_turn[at + len(_MARKER):]

    def observation_ids(self, model_token_ids: Sequence[int], observation: Sequence[Message]) -> list[int]:
        """Ids to append after a model turn so the context shows ``observation`` and then
        opens the next assistant turn. Carries loss mask 0: the model did not write them.

        The model's end-of-turn token (when it sampled one) is kept as the model's; only
        the rest of the template's turn ending (``"\\n"`` after ``<|im_end|>``) is added.
        """
        self._check_accepts(_images(observation))
        return self.encode(self.turn_glue(model_token_ids) + self.observation_delta(observation), _images(observation))

    def turn_glue(self, model_token_ids: Sequence[int]) -> str:
        """The template's assistant-turn ending not already sampled by the model."""
        if model_token_ids and model_token_ids[-1] in self.end_of_turn_ids:
            sampled_end = self.decode([model_token_ids[-1]], skip_special_tokens=False)
            if sampled_end and self.turn_suffix.startswith(sampled_end):
                return self.turn_suffix[len(sampled_end):]
        # Cut off by the token limit (or ended on a token the template does not write):
        # close the turn the way the template would.
        return self.turn_suffix

    def observation_delta(self, observation: Sequence[Message]) -> str:
        """Template text for ``observation`` after an assistant turn, with the next
        generation prompt. Raises :class:`ModelError` for templates that do not render
        conversations append-only (the earlier text changes when a message is added)."""
        history = [*_REFERENCE, Message(role="assistant", content=_MARKER)]
        before = self._reference_turn
        after = self.render([*history, *observation], add_generation_prompt=True)
        if not after.startswith(before):
            raise ModelError(
                "the chat template rewrites earlier turns when a message is added; observations "
                "cannot be appended token-exactly",
                hint="use a template that renders conversations append-only (ChatML, Qwen, Llama 3 ...)",
            )
        return after[len(before):]


def image_inputs(processor: Any, images: Sequence[Any]) -> dict[str, Any]:
    """``processor``'s image processor applied to ``images``: a dict of tensors whose first
    dimension is the image (``pixel_values`` ``[n, 3, H, W]`` for LLaVA), in order."""
    pictures = [as_pil_image(image) for image in images]
    out = processor.image_processor(pictures, return_tensors="pt")
    return {key: value for key, value in out.items() if hasattr(value, "shape")}


@dataclass
class RetokenizationReport:
    """Where re-tokenizing the rendered conversation differs from the ids kept.

    ``ok`` is True when the kept ids are a prefix of the re-tokenized conversation (the
    template may add a turn ending after the last model turn). Otherwise
    ``first_difference`` is the index of the first differing token and ``kept`` /
    ``retokenized`` show the text around it.
    """

    ok: bool
    kept_tokens: int
    retokenized_tokens: int
    first_difference: int | None = None
    kept: str = ""
    retokenized: str = ""

    def describe(self) -> str:
        if self.ok:
            return f"token-exact: the {self.kept_tokens} kept ids match the re-rendered conversation"
        return (f"differs at token {self.first_difference} of {self.kept_tokens}: kept {self.kept!r}, "
                f"re-tokenized {self.retokenized!r}")


def trajectory_ids(trajectory: Trajectory) -> list[int]:
    """All ids of a trajectory: the prompt, then every segment in order."""
    ids = list(trajectory.prompt_ids)
    for segment in trajectory.segments:
        ids.extend(segment.token_ids)
    return ids


def check_retokenization(trajectory: Trajectory, chat: ChatTemplate, context_tokens: int = 8) -> RetokenizationReport:
    """Render ``trajectory.messages`` through the template, tokenize, compare to the kept ids.

    A difference is not necessarily a bug (a model may sample a non-canonical tokenization
    of its text), but it is exactly what a framework that re-tokenizes would silently
    train on instead of what the model produced.
    """
    kept = trajectory_ids(trajectory)
    ends_with_observation = bool(trajectory.segments) and trajectory.segments[-1].kind == "observation"
    retokenized = chat.encode(chat.render(trajectory.messages, add_generation_prompt=ends_with_observation),
                              trajectory.images)
    limit = min(len(kept), len(retokenized))
    first = next((i for i in range(limit) if kept[i] != retokenized[i]), None)
    if first is None and len(kept) <= len(retokenized):
        return RetokenizationReport(True, len(kept), len(retokenized))
    if first is None:
        first = limit
    lo = max(0, first - context_tokens)
    return RetokenizationReport(
        False, len(kept), len(retokenized), first,
        kept=chat.decode(kept[lo:first + context_tokens], skip_special_tokens=False),
        retokenized=chat.decode(retokenized[lo:first + context_tokens], skip_special_tokens=False),
    )


def self_check(chat: ChatTemplate) -> RetokenizationReport:
    """Build a two-turn tool-using conversation the way the rollout does (prompt, a model
    turn with a tool call ending in the end-of-turn token, the tool result as an
    observation delta, an answer) and check it against re-tokenizing the rendered
    conversation. Fails for templates that cannot give token-exact trajectories; raises
    :class:`ModelError` for templates the rollout refuses outright."""
    opening = [Message(role="system", content="You can call tools."),
               Message(role="user", content="What is 12*7?")]
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>'
    observation = [Message(role="user", content="<tool_response>\n84\n</tool_response>")]
    end = [chat.turn_end_id] if chat.turn_end_id is not None else []
    call_ids = chat.encode(call) + end
    answer_ids = chat.encode("The answer is 84.") + end
    trajectory = Trajectory(
        sample_id="self-check",
        prompt_ids=chat.prompt_ids(opening),
        messages=[*opening, Message(role="assistant", content=call), *observation,
                  Message(role="assistant", content="The answer is 84.")],
        segments=[Segment("model", call_ids, [0.0] * len(call_ids)),
                  Segment("observation", chat.observation_ids(call_ids, observation)),
                  Segment("model", answer_ids, [0.0] * len(answer_ids))],
    )
    return check_retokenization(trajectory, chat)
