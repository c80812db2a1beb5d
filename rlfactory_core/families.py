"""Which model family a run renders and parses with, and building it.

A family (:class:`~rlfactory_core.interfaces.ModelFamily`, registered through
``rlfactory_register_model_families``) is a model's chat format at the level of token ids.
``model.family`` names one, or is ``auto`` (the default):

1. the family marked ``detected`` whose ``anchors`` (token -> id) the tokenizer has: a
   Qwen3 tokenizer has ``<think>`` at 151667, Llama 3.1's ``<|python_tag|>`` at 128010;
   two matches are an error (set ``model.family``);
2. else ``template``: the model's own chat template, with the run's tool-call format
   (``parser``). A model with neither is refused with the list of families.

A named family whose anchors fail is refused before the run starts (a Llama family on a
Qwen tokenizer would train on the wrong markup without a single error).

The tool-call format (``parser``) is a recipe's choice, apart from the model: the
``template`` family takes any registered format. A family whose ``build`` has no ``parser``
parameter writes calls in its own format; a run whose config (or recipe) names another
format gets the ``template`` family under ``auto`` (the run says why) and an error when
``model.family`` names such a family.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import RunConfig
from .errors import ConfigError, ModelError, RLFactoryError, one_line
from .interfaces import accepts, member
from .plugins import components, get_component

__all__ = ["FamilyChoice", "choose_family", "build_family", "anchor_problems", "tokenizer_sha256", "recorded",
           "with_recorded_family"]

TEMPLATE = "template"


@dataclass(frozen=True)
class FamilyChoice:
    """The family a run uses and why (said when the run starts)."""

    name: str
    cls: Any
    reason: str

    def describe(self) -> str:
        return f"{self.name} ({self.reason})"


def anchor_problems(family_cls: Any, tokenizer: Any) -> list[str]:
    """How ``tokenizer`` differs from the vocabulary ``family_cls`` is made for (its
    ``anchors``); empty when it fits."""
    anchors = member("family", family_cls, "anchors")
    if not anchors:
        return []
    vocab = tokenizer.get_vocab()
    problems = []
    for token, want in anchors.items():
        got = vocab.get(token)
        if got is None:
            problems.append(f"{token} is not a token")
        elif want is not None and got != want:
            problems.append(f"{token} is {got}, not {want}")
    return problems


def _own_format_problem(family_cls: Any, config: RunConfig) -> str | None:
    """Why the run's chosen tool-call format does not fit a family that writes calls in its
    own format; None when it fits (or no format was chosen)."""
    if "parser" not in config.model_fields_set or accepts("family", family_cls.build, "parser"):
        return None
    native = member("family", family_cls, "native_format")
    if config.parser == native:
        return None
    return (f"the {family_cls.name} family writes tool calls in its own format"
            + (f" ({native})" if native else "") + f", not the {config.parser!r} format the config chose")


def choose_family(config: RunConfig, tokenizer: Any, processor: Any = None) -> FamilyChoice:
    """The family for ``config`` and the model's ``tokenizer`` (see the module docstring);
    a :class:`ConfigError` naming what to set when there is none."""
    registry = components("family")
    name = config.model.family
    if name != "auto":
        try:
            cls = get_component("family", name)
        except RLFactoryError as exc:  # unknown (the message lists the families) or ambiguous
            raise ConfigError([f"model.family: {exc.message} (or auto: the one the tokenizer's anchors show)"]) \
                from exc
        problems = anchor_problems(cls, tokenizer)
        if problems:
            raise ConfigError([f"model.family: the model's tokenizer is not {name}'s ({'; '.join(problems[:3])}"
                               f"{'; ...' if len(problems) > 3 else ''}); set model.family to the model's family, "
                               f"or auto"])
        problem = _own_format_problem(cls, config)
        if problem:
            raise ConfigError([f"parser: {problem}; remove `parser` to use the family's format, or set "
                               f"model.family=template to keep {config.parser!r} with the model's chat template"])
        return FamilyChoice(name, cls, "model.family")

    matches = [(n, c.obj) for n, c in sorted(registry.items())
               if member("family", c.obj, "detected") and not anchor_problems(c.obj, tokenizer)]
    if len(matches) > 1:
        raise ConfigError([f"model.family: the tokenizer has the anchor tokens of {len(matches)} families "
                           f"({', '.join(n for n, _ in matches)}); set model.family to the model's"])
    fallback = None
    if matches:
        found, cls = matches[0]
        problem = _own_format_problem(cls, config)
        if problem is None:
            return FamilyChoice(found, cls, "auto: the tokenizer has its anchor tokens")
        fallback = f"auto: the tokenizer is {found}'s, but {problem}"
    if not (getattr(tokenizer, "chat_template", None) or getattr(processor, "chat_template", None)):
        raise ConfigError([f"model.family: no family's anchor tokens match the model's tokenizer and it has no chat "
                           f"template; set model.family to one of {', '.join(sorted(registry))} (or give the "
                           f"model a chat template)"])
    return FamilyChoice(TEMPLATE, registry[TEMPLATE].obj if TEMPLATE in registry else get_component("family", TEMPLATE),
                        fallback or "auto: the model's own chat template; no family's anchor tokens match")


def build_family(config: RunConfig, task: Any, tokenizer: Any, processor: Any = None) -> Any:
    """The run's family, built for ``tokenizer`` with ``model.family_options``, the task's
    tool-call format and the model's image processor where the family takes them."""
    choice = choose_family(config, tokenizer, processor)
    build = choice.cls.build
    given = dict(config.model.family_options)
    options = dict(given)
    if accepts("family", build, "parser"):
        options["parser"] = task.parser
    if accepts("family", build, "processor"):
        options["processor"] = processor
    elif processor is not None:
        raise ConfigError([f"model.family: the {choice.name} family cannot show images (its build takes no "
                           f"processor); use model.family=template for this vision model"])
    try:
        return build(tokenizer, **options)
    except (ConfigError, ModelError):
        raise
    except TypeError as exc:
        raise ConfigError([f"model.family_options: the {choice.name} family does not take {sorted(given)}: "
                           f"{one_line(exc)}"]) from exc


# --------------------------------------------------------------------------- what a checkpoint records


def tokenizer_sha256(tokenizer: Any) -> str:
    """A fingerprint of what the tokenizer does (its serialized pipeline for a fast tokenizer,
    else its vocabulary and added tokens), apart from how its files are laid out."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        text = backend.to_str()
    else:
        text = json.dumps([sorted(tokenizer.get_vocab().items()),
                           sorted((i, str(t)) for i, t in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items())])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def recorded(checkpoint: Path | None) -> dict[str, Any]:
    """The family and tokenizer fingerprint a checkpoint recorded (``family``,
    ``tokenizer_sha256``); empty for a checkpoint from before they were recorded."""
    if checkpoint is None:
        return {}
    try:
        state = json.loads((Path(checkpoint) / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: state[k] for k in ("family", "tokenizer_sha256") if isinstance(state.get(k), str)}


def with_recorded_family(config: RunConfig, checkpoint: Path | None, tokenizer: Any = None) -> RunConfig:
    """``config`` with the family ``checkpoint`` was trained with, so a resumed run and ``rlf
    eval`` render as training did; a ``model.family`` that names another one, or a tokenizer
    that is not the checkpoint's (when given), is a :class:`ConfigError`."""
    found = recorded(checkpoint)
    problems = []
    if tokenizer is not None and found.get("tokenizer_sha256") not in (None, tokenizer_sha256(tokenizer)):
        problems.append(f"model.name: the tokenizer is not the one checkpoint {checkpoint} was trained with (its "
                        f"fingerprint differs); resume with the model the run started from")
    family = found.get("family")
    if family is not None and config.model.family not in ("auto", family):
        problems.append(f"model.family: {config.model.family!r}, but checkpoint {checkpoint} was trained with the "
                        f"{family!r} family; set model.family={family} (or auto)")
    if problems:
        raise ConfigError(problems)
    if family is None or config.model.family == family:
        return config
    return config.model_copy(update={"model": config.model.model_copy(update={"family": family})})
