"""RLFactory plugin: the ``qwq_judge`` reward, a judge model that grades answers.

Installing this distribution registers the reward ``qwq_judge``. A judge model (QwQ-32B
or any chat model), run in-process on the core's ``hf`` / ``vllm`` backends or behind an
OpenAI-compatible server, reads the question, the policy's answer and the reference
answer and gives a score in [0, 1]. Select it in a run config::

    rewards:
      - {name: exact_match}
      - {name: qwq_judge, weight: 0.5, options: {backend: vllm, model: Qwen/QwQ-32B}}

The options are documented on :class:`QwQJudgeReward` and in the README; how replies
are read is in :mod:`rlfactory_qwq_judge.verdict`.
"""

from __future__ import annotations

from rlfactory_core import hookimpl

from .clients import JudgeBackendError, JudgeReply, LocalJudgeClient, OpenAIJudgeClient
from .reward import BACKENDS, DEFAULT_PROMPT_TEMPLATE, FEW_SHOT_YES_NO_TEMPLATE, Judgement, QwQJudgeReward
from .verdict import JudgeOutputError, parse_verdict

#: the plugin API versions this plugin works with (checked when rlfactory loads it)
rlfactory_api = ">=1.0,<2"

__all__ = [
    "QwQJudgeReward",
    "Judgement",
    "JudgeOutputError",
    "JudgeBackendError",
    "JudgeReply",
    "LocalJudgeClient",
    "OpenAIJudgeClient",
    "parse_verdict",
    "DEFAULT_PROMPT_TEMPLATE",
    "FEW_SHOT_YES_NO_TEMPLATE",
    "BACKENDS",
    "rlfactory_register_rewards",
]


@hookimpl
def rlfactory_register_rewards(register):
    register(QwQJudgeReward)
