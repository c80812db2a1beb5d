"""The multi-turn agent loop: generate -> parse -> run tools -> env step -> observe -> repeat.

Every trajectory is its own asyncio task, so trajectories never wait for each other: while
one waits for a slow tool, the backend keeps generating for the rest (the opposite of the
lockstep "whole batch per turn" loop of Search-R1 and RL-Factory, where every turn waits
for the slowest generation and then for the slowest tool of the batch).

One trajectory::

    env.reset(sample)                -> opening messages, tools, private state
    prompt ids = family.prompt(messages, tools)   (the model family: rollout.family)
    repeat:
        backend.generate(all ids so far, the same sampling, their images) -> model segment
        family.parse(the new ids, the ids before them)                   -> tool calls, errors
        tool manager runs the calls (concurrently, limits, timeouts)    -> results
        env.step(state, parsed turn, results)                            -> feedback, done, reward
        observation = family.tool_messages(results) + feedback
        ids += family.observation_ids(the new ids, observation)         -> observation segment
          (None: the format rewrites earlier turns; ids = family.prompt(the whole
           conversation, tools) starts a new sequence of the trajectory)
    env.close(state)                                                     (always)

A trajectory is one token sequence unless its family rewrites history (gpt-oss after a final
answer, DeepSeek's several tool results): each sequence is exact, its prompt rendered by the
family and its model segments as sampled, and every sampled token is trained in the one
sequence that sampled it (``Trajectory.earlier_sequences``). The token limit is per sequence:
what the model sees at once.

It ends (``Trajectory.stop_reason``) on: ``no_tool_call`` (the model answered and the env
sent no follow-up; always, with ``stop_on_no_tool_call``), ``env_done``, ``max_turns``,
``token_budget`` (the next turn or observation would not fit ``max_trajectory_tokens`` or
the model's context: the context is never silently cut),
``prompt_too_long``, ``tool_error`` (with ``on_tool_error="end"``), ``aborted`` (the backend
gave up on a request), ``env_error`` / ``generation_error`` (an exception, recorded in
``metadata["error"]``; the batch goes on). Failures of tools and parse errors are shown to
the model as error observations and counted in ``metadata``; so are turns stopped at
``max_tokens_per_turn`` (``cut_turns``, and ``last_turn_cut`` for the last turn: see
:mod:`rlfactory_core.training.overlong`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import replace
from typing import Any, AsyncIterator, Literal, Sequence

import pydantic

from .. import outcomes
from ..errors import one_line
from ..interfaces import member
from ..plugins import notify
from ..types import EnvReset, Message, ParsedTurn, Sample, Segment, TokenSequence, ToolResult, Trajectory
from .backends.base import Backend, SamplingParams
from .family import parse_error_results, parse_turn

__all__ = ["RolloutConfig", "SamplingConfig", "run_trajectory", "rollout", "rollout_groups", "rollout_metrics",
           "STOP_REASONS"]

log = logging.getLogger("rlfactory.rollout")

#: every ``Trajectory.stop_reason`` (their outcomes: :data:`rlfactory_core.outcomes.STOP_REASONS`)
STOP_REASONS = tuple(outcomes.STOP_REASONS)


class SamplingConfig(pydantic.BaseModel):
    """Sampling settings, the same on every turn of every trajectory."""

    model_config = pydantic.ConfigDict(extra="forbid")

    temperature: float = pydantic.Field(1.0, ge=0, description="0 = greedy")
    top_p: float = pydantic.Field(1.0, gt=0, le=1)
    top_k: int = pydantic.Field(-1, ge=-1, description="-1 = off")
    seed: int | None = pydantic.Field(None, description="base seed; trajectory i uses seed + i")
    stop_token_ids: list[int] = pydantic.Field(default_factory=list, description="end a turn besides EOS")


class RolloutConfig(pydantic.BaseModel):
    """How trajectories are generated. Unknown keys are errors."""

    model_config = pydantic.ConfigDict(extra="forbid")

    max_turns: int = pydantic.Field(8, ge=1, description="model turns per trajectory")
    max_tokens_per_turn: int = pydantic.Field(256, ge=1, description="new tokens per model turn")
    max_trajectory_tokens: int = pydantic.Field(
        2048, ge=2, description="prompt + every turn and observation; never silently truncated")
    stop_on_no_tool_call: bool = pydantic.Field(
        False, description="a turn without tool calls (and without parse errors) always ends the trajectory; "
                           "when false (the default) it ends unless the env answers it with feedback "
                           "(a follow-up question, 'no answer found, try again')")
    on_tool_error: Literal["observe", "end", "penalty"] = pydantic.Field(
        "observe", description="failed tool calls and parse errors: show the error and go on; "
                               "end the trajectory; or go on with tool_error_penalty added per failure")
    tool_error_penalty: float = pydantic.Field(
        -0.1, description="per-failure turn reward for on_tool_error=penalty (the policy's failures only: never "
                          "a timeout or an outage, rlfactory_core.outcomes)")
    tool_exception_side: Literal["policy", "infrastructure"] = pydantic.Field(
        "policy", description="whose failure a plain exception from a tool is (one that is neither a "
                              "TransientToolError nor an InfrastructureError): the model's call's, by default, as "
                              "most are its arguments' fault; 'infrastructure' for tools whose exceptions are "
                              "outages (rlfactory_core.outcomes)")
    infrastructure_retries: int = pydantic.Field(
        0, ge=0, le=10, description="a tool call whose result failed on the infrastructure's side (a timeout, an "
                                    "outage: rlfactory_core.outcomes) runs again with the same arguments, up to this "
                                    "many times, before the model sees a result: the trajectory is the one a working "
                                    "service would have given, later (no selection, unlike resampling the member)")
    sampling: SamplingConfig = pydantic.Field(default_factory=SamplingConfig)

    def sampling_params(self, index: int = 0, stop_token_ids: Sequence[int] = ()) -> SamplingParams:
        """The sampling of trajectory ``index``'s turns; ``stop_token_ids``: the model family's
        ends of a turn, besides the configured ones."""
        s = self.sampling
        return SamplingParams(
            temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_tokens=self.max_tokens_per_turn,
            stop_token_ids=tuple(dict.fromkeys([*s.stop_token_ids, *stop_token_ids])),
            seed=None if s.seed is None else s.seed + index,
        )


def _token_limit(config: RolloutConfig, backend: Any) -> int:
    """``max_trajectory_tokens``, lowered to the model's context length when the backend
    knows it (a longer request would be refused by the backend)."""
    context_length = getattr(backend, "max_model_len", None)
    if isinstance(context_length, int) and context_length > 0:
        return min(config.max_trajectory_tokens, context_length)
    return config.max_trajectory_tokens


async def _retried(tool_manager: Any, calls: Sequence[Any], results: list[ToolResult], ctx: dict[str, Any],
                   config: RolloutConfig, trajectory: Trajectory) -> list[ToolResult]:
    """``results`` with each call that failed on the infrastructure's side run again (the same
    call), up to ``config.infrastructure_retries`` times; the trajectory's metadata counts the
    runs (``infrastructure_retries``)."""
    results = list(results)
    for _ in range(config.infrastructure_retries):
        again = [i for i, r in enumerate(results) if not r.ok and outcomes.side_of(
            outcomes.result_outcome(r, config.tool_exception_side) or "answered") == outcomes.INFRASTRUCTURE]
        if not again:
            break
        trajectory.metadata["infrastructure_retries"] = trajectory.metadata.get("infrastructure_retries", 0) + len(again)
        for i, result in zip(again, await tool_manager.call([calls[i] for i in again], ctx)):
            results[i] = result
    return results


def _observer_reward(values: list[Any]) -> float:
    total = 0.0
    for value in values:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            total += float(value)
        else:
            log.warning("an on_env_step observer returned %r; expected a number or None (ignored)", value)
    return total


async def run_trajectory(
    sample: Sample,
    *,
    env: Any,
    family: Any,
    tool_manager: Any,
    backend: Backend,
    config: RolloutConfig,
    index: int = 0,
) -> Trajectory:
    """Run one episode of ``env`` for ``sample`` to its end. Never raises for a failure of
    the env, the tools or the backend: the trajectory ends with the reason recorded."""
    sample_id = str(sample.get("id", index)) if hasattr(sample, "get") else str(index)
    trajectory = Trajectory(sample_id=sample_id, prompt_ids=[])
    errors: Counter[str] = Counter()
    trajectory.metadata.update(tool_errors=errors, parse_errors=0, generation_s=0.0, tool_s=0.0, cut_turns=0,
                               tool_call_turns=[])
    state: Any = None
    reset: EnvReset | None = None
    try:
        try:
            reset = await env.reset(sample)
        except Exception as exc:  # noqa: BLE001 - one bad sample must not end the batch
            return _end(trajectory, "env_error", f"env.reset failed: {one_line(exc)}")
        state = trajectory.env_state = reset.state
        try:
            messages, trajectory.prompt_ids = family.prompt(list(reset.messages), reset.tools)
        except Exception as exc:  # noqa: BLE001 - e.g. tools the format cannot show, images for a text-only model
            return _end(trajectory, "env_error", f"rendering the prompt failed: {one_line(exc)}")
        # Only now: the messages (and their images) are those the ids hold.
        trajectory.messages = list(messages)
        # the conversation as the family renders it afresh (turns as parsed), for a new sequence
        history = list(reset.messages)
        context = list(trajectory.prompt_ids)
        # The images behind the context's image tokens, in order (see rollout.render).
        images = trajectory.images
        limit = _token_limit(config, backend)
        if len(context) >= limit:
            return _end(trajectory, "prompt_too_long", f"the prompt has {len(context)} tokens; the limit is {limit}")
        tool_names = {tool.name for tool in reset.tools}  # calls of other tools are unknown_tool
        sampling = config.sampling_params(index, stop_token_ids=member("family", family, "stop_token_ids"))
        for turn_index in range(config.max_turns):
            budget = limit - len(context)
            started = time.perf_counter()
            try:
                turn_sampling = sampling.with_max_tokens(min(budget, sampling.max_tokens))
                # Only a multimodal context passes images, so text-only backends keep the
                # two-argument call.
                generation = await (backend.generate(context, turn_sampling, images=images) if images
                                    else backend.generate(context, turn_sampling))
            except Exception as exc:  # noqa: BLE001
                return _end(trajectory, "generation_error", f"generation failed: {one_line(exc)}")
            trajectory.metadata["generation_s"] += time.perf_counter() - started
            trajectory.segments.append(Segment("model", list(generation.token_ids), list(generation.logprobs),
                                               policy_version=getattr(generation, "policy_version", None)))
            before = list(context)  # the ids the turn was sampled after
            turn = parse_turn(family, generation.token_ids, before)
            context.extend(generation.token_ids)
            trajectory.messages.append(Message(role="assistant", content=family.decode(generation.token_ids)))
            history.append(Message(role="assistant", content=turn.content, tool_calls=list(turn.tool_calls),
                                   reasoning=turn.reasoning))
            # a turn stopped at max_tokens: the last one makes the trajectory cut off (training.overlong)
            trajectory.metadata["last_turn_cut"] = generation.finish_reason == "length"
            trajectory.metadata["cut_turns"] += generation.finish_reason == "length"
            if generation.finish_reason == "abort":
                return _end(trajectory, "aborted", "the backend aborted the request")

            trajectory.tool_calls.extend(turn.tool_calls)
            trajectory.metadata["tool_call_turns"] += [turn_index] * len(turn.tool_calls)  # the calls' model turns
            trajectory.metadata["parse_errors"] += len(turn.errors)
            results: list[ToolResult] = []
            if turn.tool_calls:
                started = time.perf_counter()
                ctx = {"sample": sample, "state": state, "trajectory": trajectory, "tool_names": tool_names}
                results = await tool_manager.call(turn.tool_calls, ctx)
                if config.infrastructure_retries:
                    results = await _retried(tool_manager, turn.tool_calls, results, ctx, config, trajectory)
                trajectory.metadata["tool_s"] += time.perf_counter() - started
                trajectory.tool_results.extend(results)
            failures = [r for r in results if not r.ok]
            for result in failures:
                errors[result.error or "error"] += 1

            try:
                step = await env.step(state, turn, results)
            except Exception as exc:  # noqa: BLE001
                return _end(trajectory, "env_error", f"env.step failed: {one_line(exc)}")
            reward = (step.reward or 0.0) + _observer_reward(
                notify("rlfactory_on_env_step", trajectory=trajectory, turn=turn, results=results, step=step))
            n_failures = len(failures) + len(turn.errors)
            if n_failures and config.on_tool_error == "penalty":  # the model's failures, not the services'
                reward += config.tool_error_penalty * (len(turn.errors) + sum(
                    outcomes.side_of(outcomes.result_outcome(r, config.tool_exception_side)) == outcomes.POLICY
                    for r in failures))
            trajectory.turn_rewards.append(reward)
            if step.final_answer is not None:
                trajectory.final_answer = step.final_answer

            answered = not turn.tool_calls and not turn.errors
            if answered and trajectory.final_answer is None:
                trajectory.final_answer = turn.content
            if step.done:
                return _end(trajectory, "env_done")
            if answered and (config.stop_on_no_tool_call or not step.observation):
                return _end(trajectory, "no_tool_call")
            if n_failures and config.on_tool_error == "end":
                return _end(trajectory, "tool_error", f"{n_failures} failed tool call(s) or parse error(s)")
            if turn_index + 1 == config.max_turns:
                return _end(trajectory, "max_turns")

            try:
                observation = [*family.tool_messages([*parse_error_results(turn), *results]), *step.observation]
                observation_ids = family.observation_ids(generation.token_ids, before, observation)
                if observation_ids is None:  # the format rewrites earlier turns here: a new sequence
                    _, next_prompt = family.prompt([*history, *observation], reset.tools)
            except Exception as exc:  # noqa: BLE001 - e.g. a template that refuses a message
                return _end(trajectory, "env_error", f"rendering the observation failed: {one_line(exc)}")
            # Room for the observation and at least one generated token, or the episode ends
            # here with a recorded reason: the context is never silently cut.
            if observation_ids is None:
                if len(next_prompt) >= limit:
                    return _end(trajectory, "token_budget",
                                f"the conversation rendered afresh ({len(next_prompt)} tokens) does not fit the "
                                f"trajectory's limit of {limit} tokens")
                # the finished sequence does not show the observation (the next one's prompt
                # does): an empty observation segment keeps its messages' place in the turns
                trajectory.segments.append(Segment("observation", [], num_messages=len(observation)))
                trajectory.earlier_sequences.append(TokenSequence(trajectory.prompt_ids, trajectory.segments))
                trajectory.prompt_ids, trajectory.segments = list(next_prompt), []
                context = list(next_prompt)
            else:
                if len(context) + len(observation_ids) >= limit:
                    return _end(trajectory, "token_budget",
                                f"the next observation ({len(observation_ids)} tokens) does not fit the "
                                f"trajectory's limit of {limit} tokens")
                trajectory.segments.append(Segment("observation", observation_ids, num_messages=len(observation)))
                context.extend(observation_ids)
            trajectory.messages.extend(observation)
            history.extend(observation)
            images = [*images, *(image for message in observation for image in message.images)]
        return _end(trajectory, "max_turns")
    except asyncio.CancelledError:
        _end(trajectory, "cancelled")
        raise
    finally:
        if reset is not None:
            try:
                await env.close(state)
            except Exception as exc:  # noqa: BLE001 - a failing close is logged, the trajectory is kept
                log.warning("env.close failed for sample %s: %s", sample_id, one_line(exc))
                trajectory.metadata.setdefault("close_error", one_line(exc))
        trajectory.metadata["tool_errors"] = dict(errors)


def _end(trajectory: Trajectory, reason: str, error: str | None = None) -> Trajectory:
    trajectory.stop_reason = reason
    if error is not None:
        trajectory.metadata["error"] = error
        if reason in outcomes.ERROR_STOPS:
            log.warning("trajectory %s ended (%s): %s", trajectory.sample_id, reason, error)
    return trajectory


async def rollout(
    samples: Sequence[Sample],
    *,
    env: Any,
    family: Any,
    tool_manager: Any,
    backend: Backend,
    config: RolloutConfig,
    group_size: int = 1,
) -> list[Trajectory]:
    """``group_size`` trajectories per sample, all running at once; returned in sample
    order (the ``group_size`` trajectories of sample 0 first), each with its ``group`` (the
    index of its sample in ``samples``). Observers see each trajectory end
    (``rlfactory_on_trajectory_end``)."""
    return list(await asyncio.gather(*_trajectory_jobs(samples, env=env, family=family, tool_manager=tool_manager,
                                                       backend=backend, config=config, group_size=group_size)))


async def rollout_groups(
    samples: Sequence[Sample],
    *,
    env: Any,
    family: Any,
    tool_manager: Any,
    backend: Backend,
    config: RolloutConfig,
    group_size: int = 1,
) -> AsyncIterator[list[Trajectory]]:
    """:func:`rollout`, streamed: each sample's group (its ``group_size`` trajectories, in
    order) as soon as all of them finished, groups in the order they finish. The trajectories
    start as :func:`rollout` starts them (all at once, in the same order, with the same
    seeds), so they are the same trajectories. Closing the iterator early cancels the rest."""
    jobs = [asyncio.ensure_future(job) for job in _trajectory_jobs(
        samples, env=env, family=family, tool_manager=tool_manager, backend=backend, config=config,
        group_size=group_size)]
    groups = [asyncio.gather(*jobs[g * group_size:(g + 1) * group_size]) for g in range(len(samples))]
    try:
        for finished in asyncio.as_completed(groups):
            yield list(await finished)
    finally:
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)


def _trajectory_jobs(samples: Sequence[Sample], *, env: Any, family: Any, tool_manager: Any, backend: Backend,
                     config: RolloutConfig, group_size: int) -> list[Any]:
    """One coroutine per trajectory, sample by sample: ``i`` numbers the trajectories (it
    seeds their sampling), ``group`` names their sample."""

    async def one(i: int, group: int, sample: Sample) -> Trajectory:
        trajectory = await run_trajectory(sample, env=env, family=family, tool_manager=tool_manager,
                                          backend=backend, config=config, index=i)
        trajectory.group = group
        notify("rlfactory_on_trajectory_end", trajectory=trajectory, sample=sample)
        return trajectory

    return [one(group * group_size + k, group, sample) for group, sample in enumerate(samples)
            for k in range(group_size)]


def rollout_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Flat metrics of a batch of trajectories (keys documented in the README's metrics table):

    ``rollout/trajectories``, ``rollout/turns_mean``, ``rollout/model_tokens_mean`` (tokens
    the model wrote per trajectory), ``rollout/total_tokens_mean`` (prompt + all segments, of
    every sequence), ``rollout/sequences_mean`` (token sequences per trajectory),
    ``rollout/tool_calls`` (total), ``rollout/tool_errors`` (total failed calls, after retries),
    ``rollout/infrastructure_retries`` (calls run again for failing on the infrastructure's side; only
    when there were),
    ``rollout/tool_errors/<kind>``, ``rollout/parse_errors``, ``rollout/stop/<reason>`` (share
    of trajectories ending for each reason).
    """
    n = len(trajectories)
    if n == 0:
        return {"rollout/trajectories": 0.0}
    metrics: dict[str, float] = {"rollout/trajectories": float(n)}
    model_tokens = [sum(len(s.token_ids) for s in t.all_segments if s.kind == "model") for t in trajectories]
    total_tokens = [sum(len(q.prompt_ids) + sum(len(s.token_ids) for s in q.segments) for q in t.sequences)
                    for t in trajectories]
    metrics["rollout/turns_mean"] = sum(t.num_turns for t in trajectories) / n
    metrics["rollout/model_tokens_mean"] = sum(model_tokens) / n
    metrics["rollout/total_tokens_mean"] = sum(total_tokens) / n
    metrics["rollout/sequences_mean"] = sum(len(t.sequences) for t in trajectories) / n
    metrics["rollout/tool_calls"] = float(sum(len(t.tool_calls) for t in trajectories))
    retried = sum(t.metadata.get("infrastructure_retries", 0) for t in trajectories)
    if retried:
        metrics["rollout/infrastructure_retries"] = float(retried)
    kinds: Counter[str] = Counter()
    for t in trajectories:
        kinds.update(t.metadata.get("tool_errors", {}))
    metrics["rollout/tool_errors"] = float(sum(kinds.values()))
    for kind, count in sorted(kinds.items()):
        metrics[f"rollout/tool_errors/{kind}"] = float(count)
    metrics["rollout/parse_errors"] = float(sum(t.metadata.get("parse_errors", 0) for t in trajectories))
    for reason, count in sorted(Counter(t.stop_reason for t in trajectories).items()):
        metrics[f"rollout/stop/{reason}"] = count / n
    return metrics
