"""The rollout engine: turning prompts into token-exact multi-turn tool-using trajectories.

- :mod:`.agent_loop`: one asyncio task per trajectory (``rollout``, ``run_trajectory``,
  ``RolloutConfig``, ``rollout_metrics``)
- :mod:`.family`: the model family the loop renders and parses with (``TemplateFamily``: the
  model's chat template and a tool-call format)
- :mod:`.render`: chat-template deltas for observations, the re-tokenization checker
- :mod:`.backends`: generation backends: the interface (:mod:`.backends.base`), the
  implementations (:mod:`.backends.hf`, :mod:`.backends.vllm`) and ``make_backend``
  (``auto``, ``hf``, ``vllm``)

Importing this package does not import torch, transformers or vLLM; the backends import
them when used. (Trajectories become training tensors in :mod:`rlfactory_core.training.batch`.)
"""

from .agent_loop import (STOP_REASONS, RolloutConfig, SamplingConfig, rollout, rollout_groups, rollout_metrics,
                         run_trajectory)
from .backends import (BACKEND_NAMES, GREEDY_TEMPERATURE, Backend, Generation, SamplingParams, make_backend,
                       vllm_available)
from .family import TemplateFamily
from .render import ChatTemplate, RetokenizationReport, check_retokenization

__all__ = [
    "rollout",
    "rollout_groups",
    "run_trajectory",
    "RolloutConfig",
    "SamplingConfig",
    "rollout_metrics",
    "STOP_REASONS",
    "Backend",
    "Generation",
    "SamplingParams",
    "make_backend",
    "vllm_available",
    "BACKEND_NAMES",
    "GREEDY_TEMPERATURE",
    "ChatTemplate",
    "TemplateFamily",
    "RetokenizationReport",
    "check_retokenization",
]
