"""The ``qwq_judge`` reward: a judge model grades the policy's answer against the reference.

For each trajectory the reward writes a judge prompt from the question, the policy's
answer and the reference answer(s), asks the judge model (in-process or over HTTP), and
reads a score in [0, 1] from its reply (:func:`~rlfactory_qwq_judge.verdict.parse_verdict`).

Replies are cached by the exact prompt, so an answer that several trajectories of a group
share (common in GRPO) is judged once; identical requests arriving together share one
call. At most ``max_requests`` judge requests are in flight.
"""

from __future__ import annotations

import asyncio
import difflib
import inspect
import os
import re
import string
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from rlfactory_core import ConfigError, RewardOutput, Sample, SamplingParams, Trajectory

from .clients import JudgeBackendError, JudgeReply, LocalJudgeClient, OpenAIJudgeClient
from .verdict import JudgeOutputError, parse_verdict, strip_reasoning

__all__ = ["QwQJudgeReward", "Judgement", "DEFAULT_PROMPT_TEMPLATE", "FEW_SHOT_YES_NO_TEMPLATE", "BACKENDS",
           "REFERENCE_KEYS", "defuse_tags", "policy_answer"]

#: ``hf``, ``vllm`` and ``auto`` run the judge in this process; ``openai`` calls a server.
BACKENDS = ("hf", "vllm", "auto", "openai")

#: Where the reference answer is looked up, after the ``reference_key`` option.
REFERENCE_KEYS = ("answer", "answers", "golden_answers")

#: The placeholders a prompt template may use; ``answer`` and ``reference`` are required.
PLACEHOLDERS = ("question", "answer", "reference")

DEFAULT_PROMPT_TEMPLATE = """\
Judge whether a student's answer to a question is correct, using the reference answer.

Question: {question}

Reference answer: {reference}

Student's answer: {answer}

The student's answer is correct if it means the same as the reference answer (or as one \
of them, when several are listed). Different wording, formatting or units do not matter; \
extra claims that contradict the reference do. Give a score between 0 and 1: 1 if the \
answer is correct, 0 if it is wrong, a value in between only if it is partly correct. \
End your reply with the score inside <score></score> tags."""

#: A few-shot yes/no prompt for tiny judge models, for checking pipelines. It ends where the
#: verdict goes, so the model's first word is the verdict ("yes" scores 1, "no" 0); use it
#: with a small ``max_tokens`` (4), so the model has no room to write another example after
#: it. The embedded SmolLM2-135M ignores the default template's ``<score>`` request, but
#: completes this one with a verdict word; that makes it parseable, not a good judge (it
#: says "no" to most answers, right ones included).
FEW_SHOT_YES_NO_TEMPLATE = """Decide if the student answer matches the correct answer. Reply yes or no.

Correct answer: Rome
Student answer: Rome
Match: yes

Correct answer: Rome
Student answer: Berlin
Match: no

Correct answer: {reference}
Student answer: {answer}
Match:"""


@dataclass(frozen=True)
class Judgement:
    """The judge's verdict on one answer: ``score`` in [0, 1], the judge's full ``reply``,
    and whether it was ``cached`` (no new judge request was made for it)."""

    score: float
    reply: str
    cached: bool


class QwQJudgeReward:
    """Scores a trajectory's final answer with a judge model (QwQ-32B or any chat model).

    Built once per run with the reward's ``options`` from the config (all keyword-only; the
    README's options table gives each default):

    :param model: the judge model. In-process: an embedded name, a local directory or a
        hub id. ``openai``: the model name the server serves.
    :param backend: ``hf``, ``vllm`` or ``auto`` (in this process, started on the first
        score) or ``openai`` (an OpenAI-compatible ``/chat/completions`` server).
    :param backend_options: keyword arguments for the in-process backend (``device``,
        ``dtype``, ``kv_cache_gib``, ``gpu_memory_utilization`` ...).
    :param base_url: the server's API root for ``openai``, e.g. ``http://host:8000/v1``.
    :param api_key_env: name of the environment variable holding the server's API key
        (``openai``); leave it out for a server without authentication.
    :param timeout_s: seconds one HTTP request may take (``openai``).
    :param prompt_template: the judge's user message, with ``{question}``, ``{answer}``
        and ``{reference}`` placeholders (``answer`` and ``reference`` required; write
        literal braces as ``{{`` and ``}}``).
    :param system_prompt: a system message for the judge, or ``None`` for none (QwQ is
        meant to be used without one).
    :param max_tokens: the most tokens of one judge reply, reasoning included.
    :param temperature: the judge's sampling temperature (0: greedy, deterministic).
    :param top_p: the judge's nucleus sampling threshold (1: off).
    :param max_requests: judge requests in flight at once.
    :param correct_at: the score from which an answer counts as correct for the
        ``reward/accuracy`` metric (``RewardOutput.correct``); ``null`` leaves accuracy to
        the other rewards.
    :param cache_size: replies kept, least recently used dropped first (0: no cache).
    :param question_key: the sample key holding the question.
    :param reference_key: the sample key holding the reference answer(s), tried before
        ``answers`` and ``golden_answers``.

    Every problem with the options is reported at once, as a
    :class:`~rlfactory_core.errors.ConfigError`.
    """

    name = "qwq_judge"
    description = ("A judge model (QwQ-32B or any chat model; in-process hf/vllm or an OpenAI-compatible "
                   "server) scores the final answer against the reference, 0 to 1.")

    def __init__(
        self,
        *,
        model: str | None = None,
        backend: str = "hf",
        backend_options: Mapping[str, Any] | None = None,
        base_url: str | None = None,
        api_key_env: str | None = None,
        timeout_s: float = 300.0,
        prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
        system_prompt: str | None = None,
        max_tokens: int = 4096,
        temperature: float = 0.0,
        top_p: float = 1.0,
        max_requests: int = 32,
        correct_at: float | None = 0.5,
        cache_size: int = 10_000,
        question_key: str = "question",
        reference_key: str = "answer",
        **unknown: Any,
    ) -> None:
        problems = [_unknown_option(key) for key in unknown]
        problems += _check_options(
            model=model, backend=backend, backend_options=backend_options, base_url=base_url,
            api_key_env=api_key_env, timeout_s=timeout_s, prompt_template=prompt_template,
            system_prompt=system_prompt, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
            max_requests=max_requests, cache_size=cache_size, question_key=question_key,
            reference_key=reference_key)
        if correct_at is not None and (isinstance(correct_at, bool) or not isinstance(correct_at, (int, float))
                                       or not 0 <= correct_at <= 1):
            problems.append(f"correct_at must be a number in [0, 1] or null, got {correct_at!r}")
        if problems:
            raise ConfigError(problems, hint="see the option table in the rlfactory-plugin-qwq-judge README")
        self.correct_at = correct_at

        self.prompt_template = prompt_template
        self.system_prompt = system_prompt
        self.question_key = question_key
        self.reference_key = reference_key
        self.cache_size = cache_size
        self.max_tokens = max_tokens
        sampling = SamplingParams(temperature=float(temperature), top_p=float(top_p), max_tokens=max_tokens)
        self.client: LocalJudgeClient | OpenAIJudgeClient
        if backend == "openai":
            api_key = os.environ[api_key_env] if api_key_env else None
            self.client = OpenAIJudgeClient(base_url, model, sampling, timeout_s=float(timeout_s), api_key=api_key)
        else:
            self.client = LocalJudgeClient(backend, model, sampling, backend_options=dict(backend_options or {}))
        self._limit = asyncio.Semaphore(max_requests)
        self._cache: OrderedDict[tuple[tuple[str, str], ...], JudgeReply] = OrderedDict()
        self._in_flight: dict[tuple[tuple[str, str], ...], asyncio.Task[JudgeReply]] = {}
        self._stats = {"judged": 0, "requests": 0, "cache_hits": 0, "shared": 0, "parse_errors": 0}
        self._closed = False

    # ------------------------------------------------------------------ reward interface

    async def score(self, trajectory: Trajectory, sample: Sample) -> RewardOutput | None:
        """The judge's score for the trajectory's answer, or ``None`` when the sample has no
        reference answer (the reward does not apply). No answer at all scores 0 without
        asking the judge. Raises :class:`JudgeOutputError` when the reply holds no score
        and :class:`JudgeBackendError` when the judge gives no reply."""
        references = self.references(sample)
        if references is None:
            return None
        answer = policy_answer(trajectory)
        judged = self.correct_at is not None
        if not answer:
            return RewardOutput(value=0.0, components={"no_answer": 1.0, "cache_hit": 0.0},
                                correct=False if judged else None)
        judgement = await self.judge(self.question(trajectory, sample), answer, references)
        return RewardOutput(value=judgement.score,
                            components={"no_answer": 0.0, "cache_hit": float(judgement.cached)},
                            correct=judgement.score >= self.correct_at if judged else None)

    async def close(self) -> None:
        """Stop the judge's backend (in-process engine or HTTP client). Idempotent."""
        self._closed = True
        for task in list(self._in_flight.values()):
            task.cancel()
        await self.client.close()

    # ------------------------------------------------------------------ judging

    async def judge(self, question: str, answer: str, references: str | Sequence[str]) -> Judgement:
        """Ask the judge about one answer (cached by the exact prompt) and read its score."""
        if self._closed:
            raise JudgeBackendError("the qwq_judge reward is closed", hint="build a new one to judge again")
        self._stats["judged"] += 1
        messages = self.messages(question, answer, references)
        reply, cached = await self._reply(messages)
        try:
            value = parse_verdict(reply.text)
        except JudgeOutputError as exc:
            self._stats["parse_errors"] += 1
            if reply.truncated:
                raise JudgeOutputError(f"{exc.message}; the reply was cut off at max_tokens={self.max_tokens}",
                                       reply=reply.text, hint="raise max_tokens") from None
            raise
        return Judgement(score=value, reply=reply.text, cached=cached)

    def messages(self, question: str, answer: str, references: str | Sequence[str]) -> list[dict[str, str]]:
        """The chat messages the judge gets for one answer. The answer's own ``<score>`` and
        ``<think>`` tags are defused (see :func:`defuse_tags`)."""
        refs = [references] if isinstance(references, str) else list(references)
        reference = refs[0] if len(refs) == 1 else "\n" + "\n".join(f"- {r}" for r in refs)
        user = self.prompt_template.format(question=question, answer=defuse_tags(answer), reference=reference)
        head = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*head, {"role": "user", "content": user}]

    def question(self, trajectory: Trajectory, sample: Sample) -> str:
        """``sample[question_key]``, else the first user message of the trajectory."""
        value = sample.get(self.question_key)
        if value is not None and str(value).strip():
            return str(value).strip()
        for message in trajectory.messages:
            if message.role == "user" and message.content.strip():
                return message.content.strip()
        return "(no question given)"

    def references(self, sample: Sample) -> list[str] | None:
        """The sample's reference answers (``reference_key``, then ``answers``, then
        ``golden_answers``; a string or a list), or ``None`` when it has none."""
        for key in dict.fromkeys((self.reference_key, *REFERENCE_KEYS)):
            value = sample.get(key)
            if value is None:
                continue
            if hasattr(value, "tolist"):  # numpy arrays and tensors from a datasets column
                value = value.tolist()
            values = [value] if isinstance(value, (str, int, float)) else list(value)
            refs = [str(v).strip() for v in values if v is not None and str(v).strip()]
            return refs or None
        return None

    def stats(self) -> dict[str, int]:
        """Counters since construction: ``judged`` (answers judged), ``requests`` (judge
        requests actually made), ``cache_hits``, ``shared`` (served by an identical request
        already in flight), ``parse_errors``."""
        return dict(self._stats)

    # ------------------------------------------------------------------ cache

    async def _reply(self, messages: list[dict[str, str]]) -> tuple[JudgeReply, bool]:
        key = tuple((m["role"], m["content"]) for m in messages)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            self._stats["cache_hits"] += 1
            return cached, True
        task = self._in_flight.get(key)
        if task is not None:
            self._stats["shared"] += 1
            return await asyncio.shield(task), True
        task = asyncio.create_task(self._request(key, messages))
        self._in_flight[key] = task
        task.add_done_callback(lambda done: self._finished(key, done))
        # Shielded: a caller that times out or is cancelled must not cancel the request the
        # other callers of the same prompt are waiting for.
        return await asyncio.shield(task), False

    async def _request(self, key: tuple[tuple[str, str], ...], messages: list[dict[str, str]]) -> JudgeReply:
        async with self._limit:
            self._stats["requests"] += 1
            reply = await self.client.complete(messages)
        if self.cache_size > 0:
            self._cache[key] = reply
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return reply

    def _finished(self, key: tuple[tuple[str, str], ...], task: asyncio.Task[JudgeReply]) -> None:
        if self._in_flight.get(key) is task:
            del self._in_flight[key]
        if not task.cancelled():
            task.exception()  # retrieved: its callers have it, or nobody was left waiting


# --------------------------------------------------------------------------- helpers


def policy_answer(trajectory: Trajectory) -> str:
    """The answer to judge: the env's ``final_answer``, else the text of the last assistant
    message without its reasoning; ``""`` when there is none."""
    if trajectory.final_answer is not None:
        return trajectory.final_answer.strip()
    for message in reversed(trajectory.messages):
        if message.role == "assistant":
            return (strip_reasoning(message.content) or "").strip()
    return ""


_VERDICT_TAG = re.compile(r"<(/?)(score|think)>", re.IGNORECASE)


def defuse_tags(answer: str) -> str:
    """``answer`` with ``<score>``, ``</score>``, ``<think>`` and ``</think>`` written as
    ``[score]`` ... : the policy writes the answer, and a judge that quotes it back must not
    hand the policy the verdict (``<score>1</score>``) or end its own reasoning early."""
    return _VERDICT_TAG.sub(r"[\1\2]", answer)


def _option_names() -> list[str]:
    return [p for p in inspect.signature(QwQJudgeReward.__init__).parameters if p not in ("self", "unknown")]


def _unknown_option(key: str) -> str:
    names = _option_names()
    close = difflib.get_close_matches(key, names, n=1)
    guess = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown option {key!r} ({guess}options: {', '.join(names)})"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _template_problems(template: Any) -> list[str]:
    if not isinstance(template, str) or not template.strip():
        return ["prompt_template must be a non-empty string"]
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as exc:
        return [f"prompt_template is not a valid format string ({exc}); write literal braces as {{{{ and }}}}"]
    problems = []
    unknown = sorted(f for f in fields if f not in PLACEHOLDERS)
    if unknown:
        problems.append(f"prompt_template has unknown placeholder(s) {', '.join('{' + f + '}' for f in unknown)}; "
                        f"use {{question}}, {{answer}} and {{reference}} (literal braces: {{{{ }}}})")
    missing = [f for f in ("answer", "reference") if f not in fields]
    if missing:
        problems.append(f"prompt_template must contain {' and '.join('{' + f + '}' for f in missing)}")
    if not problems:
        try:
            template.format(question="q", answer="a", reference="r")
        except (ValueError, IndexError, KeyError) as exc:
            problems.append(f"prompt_template cannot be filled in ({exc})")
    return problems


def _check_options(*, model: Any, backend: Any, backend_options: Any, base_url: Any, api_key_env: Any,
                   timeout_s: Any, prompt_template: Any, system_prompt: Any, max_tokens: Any,
                   temperature: Any, top_p: Any, max_requests: Any, cache_size: Any, question_key: Any,
                   reference_key: Any) -> list[str]:
    """Every problem with the options, in the order of the README's table."""
    problems = []
    if backend not in BACKENDS:
        problems.append(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if not isinstance(model, str) or not model.strip():
        what = "the model name the server serves" if backend == "openai" else \
            "an embedded name (e.g. smollm2-135m-instruct), a local model directory or a hub id"
        problems.append(f"model is required: {what}")
    if backend == "openai":
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            problems.append(f"base_url is required for backend openai: the server's API root such as "
                            f"http://127.0.0.1:8000/v1, got {base_url!r}")
        if backend_options:
            problems.append("backend_options are for the in-process backends (hf, vllm, auto), not openai")
        if api_key_env is not None:
            if not isinstance(api_key_env, str) or not api_key_env.strip():
                problems.append("api_key_env must be the name of an environment variable")
            elif not os.environ.get(api_key_env):
                problems.append(f"api_key_env: the environment variable {api_key_env} is not set; export it "
                                "with the judge server's API key, or leave api_key_env out for a server "
                                "without authentication")
    elif backend in BACKENDS:
        for name, value in (("base_url", base_url), ("api_key_env", api_key_env)):
            if value is not None:
                problems.append(f"{name} is only used by backend openai, not {backend}")
        if backend_options is not None and not isinstance(backend_options, Mapping):
            problems.append(f"backend_options must be a mapping of backend arguments, got "
                            f"{type(backend_options).__name__}")
    if not _is_number(timeout_s) or timeout_s <= 0:
        problems.append(f"timeout_s must be a number of seconds > 0, got {timeout_s!r}")
    problems += _template_problems(prompt_template)
    if system_prompt is not None and not isinstance(system_prompt, str):
        problems.append(f"system_prompt must be a string or null, got {type(system_prompt).__name__}")
    if not _is_int(max_tokens) or max_tokens < 1:
        problems.append(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    if not _is_number(temperature) or temperature < 0:
        problems.append(f"temperature must be a number >= 0, got {temperature!r}")
    if not _is_number(top_p) or not 0 < top_p <= 1:
        problems.append(f"top_p must be a number in (0, 1], got {top_p!r}")
    if not _is_int(max_requests) or max_requests < 1:
        problems.append(f"max_requests must be an integer >= 1, got {max_requests!r}")
    if not _is_int(cache_size) or cache_size < 0:
        problems.append(f"cache_size must be an integer >= 0 (0: no cache), got {cache_size!r}")
    for name, value in (("question_key", question_key), ("reference_key", reference_key)):
        if not isinstance(value, str) or not value:
            problems.append(f"{name} must be a non-empty string, got {value!r}")
    return problems
