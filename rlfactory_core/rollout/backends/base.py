"""The generation backend interface, shared by the ``hf`` and ``vllm`` implementations
(and any other backend): it imports no implementation, and every implementation imports it.

A backend turns prompt token ids into new token ids, one request at a time from the
caller's point of view; many requests are in flight at once (one per trajectory) and the
backend batches them. It never re-tokenizes: ids in, ids out.

Logprobs are the log-probabilities of the sampled tokens under the distribution they were
sampled from after temperature (and top-k / top-p, which leave a sampled token's
probability renormalised): ``log_softmax(logits / temperature)`` when top-k and top-p are
off, which is what the trainer computes for the policy (it divides its logits by the
rollout's temperature; top-k / top-p truncation is not applied in training, as in verl and
TRL, so with them on ``train/sampler_*`` also measures the truncation). Greedy requests
(temperature below :data:`GREEDY_TEMPERATURE`) report the raw ``log_softmax(logits)``. Both backends report the same
quantity (vLLM's ``logprobs_mode="processed_logprobs"``).

Weight versions: a backend serves one version of the weights at a time, ``weight_version``
(0 for the weights it was built with, unless its owner says otherwise). ``update_weights``
moves it to the version given (the engine numbers its pushes), or one past the current one.
Every request is sampled by a single version, reported as ``Generation.policy_version``.
Which requests an update waits for differs: ``hf`` lets the rows it is decoding finish and
starts the requests still queued on the new weights; ``vllm`` pauses in ``"wait"`` mode, so
every request it has been given (running or queued in the engine) finishes on the old ones.
Either way the reported version is the one that sampled the request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Protocol, Sequence

from ...errors import ConfigError

__all__ = [
    "SamplingParams",
    "Generation",
    "Backend",
    "FinishReason",
    "GREEDY_TEMPERATURE",
    "load_unit",
]

#: Temperatures below this are greedy (vLLM's ``_SAMPLING_EPS``): dividing by them would
#: overflow, and the backends and the trainer must agree on which requests are greedy.
GREEDY_TEMPERATURE = 1e-5

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one model turn. The same settings are used for every turn of a
    trajectory (RL-Factory decodes turns after the first greedily; we do not).

    ``max_tokens`` is the most new tokens for this request; the agent loop lowers it to
    what is left of the trajectory's token budget. ``stop_token_ids`` end the turn in
    addition to the tokenizer's end-of-sequence ids; the stop token is part of the output
    (it is a token the model sampled). Text stop strings are deliberately not supported:
    they end a turn in the middle of a token and make ids and text disagree.
    ``seed`` makes a request reproducible on its own (``None``: not seeded).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.temperature < 0:
            problems.append(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            problems.append(f"top_k must be -1 (off) or a positive integer, got {self.top_k}")
        if self.max_tokens < 1:
            problems.append(f"max_tokens must be >= 1, got {self.max_tokens}")
        if problems:
            raise ConfigError(problems)

    def with_max_tokens(self, max_tokens: int) -> "SamplingParams":
        from dataclasses import replace

        return replace(self, max_tokens=max_tokens)


@dataclass
class Generation:
    """What one request produced.

    ``token_ids``: the new tokens exactly as sampled, including the stop / end-of-sequence
    token when the turn ended on one. ``logprobs``: one per token (see the module
    docstring). ``finish_reason``: ``"stop"`` (an end-of-sequence or stop token),
    ``"length"`` (``max_tokens`` reached) or ``"abort"`` (the backend gave up on the
    request, e.g. on shutdown). ``policy_version``: the weight version that sampled every
    token (see the module docstring); None from a source that is no policy (a replayed
    demonstration) or does not count versions.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    metadata: dict[str, Any] = field(default_factory=dict)
    policy_version: int | None = None


class Backend(Protocol):
    """Generates tokens for many concurrent requests; owns the inference copy of the weights."""

    name: str

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        """New tokens for ``prompt_ids``. Safe to call from many tasks at once: concurrent
        requests are batched. Raises only for a request that can never succeed (e.g. a
        prompt longer than the model's context).

        A backend for vision-language models also takes ``images=[...]``: the images behind
        the prompt's image tokens, in order (both built-in backends do). The agent loop
        passes it only when the context has images, so text-only backends need not."""

    weight_version: int
    """The version of the weights new requests are sampled by (settable before serving: a
    resumed run's backend starts from its checkpoint's version)."""

    weight_dtype: Any
    """Optional: the ``torch.dtype`` the backend holds its weights in. The engines compare
    pushes in it (:mod:`rlfactory_core.training.weight_push`); without it, in the trainer's."""

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]],
                             version: int | None = None) -> float | None:
        """Load new weights (``(name, tensor)`` pairs named as in the HF checkpoint) without
        restarting; they are ``version`` (default: ``weight_version + 1``). The pairs may be
        a subset of whole load units (:func:`load_unit`: vLLM refuses part of a layer): the
        weights not named keep their values (an empty push only moves the version). Requests
        the backend is working on finish first, on the old version (see the module docstring);
        later ones use the new weights. Returns the pause it caused: the seconds during which
        no new request could start (None: not measured)."""

    async def close(self) -> None:
        """Stop the backend and free its memory. Idempotent."""


def load_unit(name: str) -> str:
    """The weights that travel together with ``name``: its whole decoder layer (the name up to
    its first numeric part: ``model.layers.3``), else its module (``model.embed_tokens``).

    vLLM reloads weights layer by layer: a layer that gets some of its weights is rebuilt
    from those alone, the rest left uninitialised (q_proj alone in the fused qkv_proj left k
    and v as garbage: ``tests/test_vllm_backend.py``). Fused modules (qkv, gate_up, a
    mixture's experts) never span decoder layers, so a whole layer is always complete."""
    parts = name.split(".")
    for index, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:index + 1])
    return ".".join(parts[:-1])
