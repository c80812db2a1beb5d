"""The judge behind an OpenAI-compatible server (``backend: openai``).

A FastAPI app on localhost stands in for vLLM's server: one with canned replies and
failures (fast), and one generating with the embedded model on the core's hf backend
(slow). Nothing leaves the machine.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from rlfactory_qwq_judge import FEW_SHOT_YES_NO_TEMPLATE, JudgeBackendError, JudgeOutputError, QwQJudgeReward

SAMPLE = {"question": "What is the capital of France?", "answer": "Paris"}


def http_reward(base_url: str, **options) -> QwQJudgeReward:
    return QwQJudgeReward(**{"backend": "openai", "model": "judge", "base_url": base_url, **options})


# --------------------------------------------------------------------------- scripted server


async def test_reply_is_scored_and_the_request_is_a_chat_completion(scripted_server, requests_seen,
                                                                     make_trajectory):
    reward = http_reward(scripted_server.base_url("/reply/score/0"), max_tokens=512, temperature=0.6,
                         top_p=0.95, system_prompt="Grade strictly.")
    try:
        output = await reward.score(make_trajectory("Paris"), SAMPLE)
    finally:
        await reward.close()
    assert (output.value, output.components) == (0.75, {"no_answer": 0.0, "cache_hit": 0.0})
    assert output.correct is True  # 0.75 >= correct_at (0.5): counts for reward/accuracy
    [request] = requests_seen
    assert request["path"] == "/reply/score/0/v1/chat/completions"
    assert request["authorization"] is None  # no api_key_env: no key sent
    body = request["body"]
    assert (body["model"], body["max_tokens"], body["temperature"], body["top_p"]) == ("judge", 512, 0.6, 0.95)
    assert body["messages"][0] == {"role": "system", "content": "Grade strictly."}
    assert "Student's answer: Paris" in body["messages"][1]["content"]


async def test_same_prompt_is_judged_once_also_when_asked_concurrently(scripted_server, requests_seen,
                                                                        make_trajectory):
    reward = http_reward(scripted_server.base_url("/reply/score/300"))
    try:
        outputs = await asyncio.gather(*(reward.score(make_trajectory("Paris"), SAMPLE) for _ in range(5)))
        assert [o.value for o in outputs] == [0.75] * 5
        assert len(requests_seen) == 1  # four callers shared the one in flight
        again = await reward.score(make_trajectory("Paris"), SAMPLE)
        assert (again.value, again.components["cache_hit"]) == (0.75, 1.0)
        assert len(requests_seen) == 1
        await reward.score(make_trajectory("Lyon"), SAMPLE)  # another answer: another prompt
        assert len(requests_seen) == 2
        assert reward.stats() == {"judged": 7, "requests": 2, "cache_hits": 1, "shared": 4, "parse_errors": 0}
    finally:
        await reward.close()


async def test_cache_keeps_the_most_recent_replies(scripted_server, requests_seen, make_trajectory):
    reward = http_reward(scripted_server.base_url("/reply/score/0"), cache_size=2)
    try:
        for answer in ["a", "b", "a", "c", "a", "b"]:  # "b" was dropped when "c" came
            await reward.score(make_trajectory(answer), SAMPLE)
        answers = [r["body"]["messages"][0]["content"].split("Student's answer: ")[1][0] for r in requests_seen]
        assert answers == ["a", "b", "c", "b"]
    finally:
        await reward.close()
    uncached = http_reward(scripted_server.base_url("/reply/score/0"), cache_size=0)
    try:
        await uncached.score(make_trajectory("a"), SAMPLE)
        await uncached.score(make_trajectory("a"), SAMPLE)
        assert uncached.stats()["requests"] == 2
    finally:
        await uncached.close()


async def test_max_requests_limits_requests_in_flight(scripted_server, requests_seen, make_trajectory):
    reward = http_reward(scripted_server.base_url("/reply/score/200"), max_requests=2)
    try:
        await asyncio.gather(*(reward.score(make_trajectory(f"answer {i}"), SAMPLE) for i in range(6)))
    finally:
        await reward.close()
    assert len(requests_seen) == 6
    assert scripted_server.max_active == 2


async def test_unreadable_reply_raises_and_is_not_asked_again(scripted_server, requests_seen, make_trajectory):
    reward = http_reward(scripted_server.base_url("/reply/unreadable/0"))
    try:
        for _ in range(2):
            with pytest.raises(JudgeOutputError, match="no score found in the judge's reply: 'I cannot decide") as info:
                await reward.score(make_trajectory("Paris"), SAMPLE)
        assert info.value.reply == scripted_server.replies["unreadable"][0]
        assert len(requests_seen) == 1  # the reply is cached; asking again would not change it at temperature 0
        assert reward.stats()["parse_errors"] == 2
    finally:
        await reward.close()


@pytest.mark.parametrize("name, message", [
    ("thinking", "reasoning \\(<think>\\) was never closed.*cut off at max_tokens=64"),
    ("null", "reply is empty; the reply was cut off at max_tokens=64"),
])
async def test_reply_cut_off_says_so(scripted_server, requests_seen, make_trajectory, name, message):
    reward = http_reward(scripted_server.base_url(f"/reply/{name}/0"), max_tokens=64)
    try:
        with pytest.raises(JudgeOutputError, match=message) as info:
            await reward.score(make_trajectory("Paris"), SAMPLE)
        assert info.value.hint == "raise max_tokens"
    finally:
        await reward.close()


async def test_api_key_is_sent_from_the_environment(scripted_server, requests_seen, make_trajectory, monkeypatch):
    monkeypatch.setenv("QWQ_JUDGE_TEST_KEY", scripted_server.api_key)
    reward = http_reward(scripted_server.base_url("/auth"), api_key_env="QWQ_JUDGE_TEST_KEY")
    try:
        assert (await reward.score(make_trajectory("Paris"), SAMPLE)).value == 1.0
    finally:
        await reward.close()
    assert requests_seen[0]["authorization"] == f"Bearer {scripted_server.api_key}"
    keyless = http_reward(scripted_server.base_url("/auth"))
    try:
        with pytest.raises(JudgeBackendError, match="answered HTTP 401: .*invalid api key") as info:
            await keyless.score(make_trajectory("Paris"), SAMPLE)
        assert "api_key_env" in info.value.hint
    finally:
        await keyless.close()


@pytest.mark.parametrize("prefix, message, hint", [
    ("/error", r"answered HTTP 500: 'Internal Server Error: CUDA out of memory'", "server's log"),
    ("/garbage", r"did not answer with JSON: '<html><body>Welcome to nginx!</body></html>'", "/v1"),
    ("/wrong-shape", r"not a chat completion \(no choices\[0\]\.message\.content\)", "/v1"),
    ("/no-such-route", r"answered HTTP 404", "base_url"),
])
async def test_server_failures_become_one_line_errors(scripted_server, requests_seen, make_trajectory,
                                                      prefix, message, hint):
    reward = http_reward(scripted_server.base_url(prefix))
    try:
        for _ in range(2):  # failures are not cached: the next score asks again
            with pytest.raises(JudgeBackendError, match=message) as info:
                await reward.score(make_trajectory("Paris"), SAMPLE)
            assert "\n" not in str(info.value)
            assert hint in info.value.hint
        assert reward.stats()["requests"] == 2
    finally:
        await reward.close()


async def test_slow_server_times_out(scripted_server, requests_seen, make_trajectory):
    reward = http_reward(scripted_server.base_url("/slow"), timeout_s=0.3)
    try:
        with pytest.raises(JudgeBackendError, match=r"did not answer within 0\.3 s"):
            await reward.score(make_trajectory("Paris"), SAMPLE)
    finally:
        await reward.close()


async def test_unreachable_server(make_trajectory):
    with socket.socket() as sock:  # a port that was free a moment ago, and nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    reward = http_reward(f"http://127.0.0.1:{port}/v1")
    try:
        with pytest.raises(JudgeBackendError, match=f"cannot reach the judge server at http://127.0.0.1:{port}/v1"):
            await reward.score(make_trajectory("Paris"), SAMPLE)
    finally:
        await reward.close()
    with pytest.raises(JudgeBackendError, match="closed"):
        await reward.score(make_trajectory("Paris"), SAMPLE)


# --------------------------------------------------------------------------- a real model behind the server

# SmolLM2-135M does not follow the default template's "<score>" instruction (it writes
# prose); asked for a yes/no it answers with a verdict word most of the time.
YES_NO_TEMPLATE = ("Question: {question}\nCorrect answer: {reference}\nStudent answer: {answer}\n"
                   "Is the student answer correct? Answer yes or no.")


@pytest.mark.slow
async def test_judge_served_by_a_real_model(model_server, make_trajectory):
    model_server.requests.clear()
    reward = http_reward(model_server.base_url(), model="smollm2", prompt_template=YES_NO_TEMPLATE,
                         max_tokens=24, timeout_s=120)
    answers = ["Paris", "London", "Paris"]
    try:
        outcomes = await asyncio.gather(*(reward.score(make_trajectory(a), SAMPLE) for a in answers),
                                        return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                assert isinstance(outcome, JudgeOutputError), outcome  # a reply the model got wrong
            else:
                assert 0.0 <= outcome.value <= 1.0
        # The first and last trajectories give the same prompt: one request for the two.
        assert len(model_server.requests) == 2
        assert reward.stats()["requests"] == 2
        assert sum(not isinstance(o, BaseException) for o in outcomes) >= 1
    finally:
        await reward.close()


@pytest.mark.slow
async def test_unknown_model_name_on_a_real_server(model_server, make_trajectory):
    reward = http_reward(model_server.base_url(), model="Qwen/QwQ-32B")
    try:
        with pytest.raises(JudgeBackendError, match="HTTP 404: .*does not exist") as info:
            await reward.score(make_trajectory("Paris"), SAMPLE)
        assert "model is the name the server serves" in info.value.hint
    finally:
        await reward.close()


@pytest.mark.slow
def test_judge_over_http_scores_a_training_step(model_server, tmp_path, tiny_model_dir):
    """One real step of the core's trainer (arithmetic env) with the judge behind the
    OpenAI-compatible server, next to a rule reward; the eval uses the same rewards. The
    server answers with the embedded model, prompted with the few-shot yes/no template, so the
    judge really scores instead of falling back. The policy's turns are scripted (an answer
    every time, sampled or greedy) and its update runs on the tiny model: the judge's
    plumbing through a run is the point, not what the policy writes."""
    import json

    from rlfactory_core import load_tokenizer
    from rlfactory_core.testing import ScriptedBackend, load_config, read_metrics, scripted_backend, train

    model_server.requests.clear()
    run_dir = tmp_path / "run"
    judge = {"backend": "openai", "base_url": model_server.base_url(), "model": "smollm2", "max_tokens": 4,
             "timeout_s": 120, "prompt_template": FEW_SHOT_YES_NO_TEMPLATE}
    rewards = [{"name": "exact_match"}, {"name": "qwq_judge", "weight": 0.5, "options": judge}]
    with scripted_backend(lambda path: ScriptedBackend(load_tokenizer(path), lambda text: "The answer is 42.")):
        train(load_config([], [
            "backend=hf", f"model.name={tiny_model_dir}", "grpo.prompts_per_step=1", "grpo.group_size=2",
            "data.eval_size=1", "eval.save_samples=1", "rollout.max_turns=2", "rollout.max_tokens_per_turn=32",
            "logging.live=off", "logging.tensorboard=false", "train.steps=1", f"run_dir={run_dir}",
            f"rewards={json.dumps(rewards)}"]))
    step = read_metrics(run_dir)[1]
    for prefix, trajectories in (("reward", 2), ("eval/reward", 1)):
        for key in ("exact_match", "qwq_judge", "qwq_judge/cache_hit", "mean", "errors"):
            assert f"{prefix}/{key}" in step, f"{prefix}/{key}"
        assert step[f"{prefix}/errors"] == step.get(f"{prefix}/errors/qwq_judge", 0.0)  # only the judge may fail
        # The judge scored: not every trajectory fell back, and one had an answer it judged.
        assert step.get(f"{prefix}/errors/qwq_judge", 0.0) < trajectories, prefix
        assert step[f"{prefix}/qwq_judge/no_answer"] < 1.0, prefix
        assert 0.0 <= step[f"{prefix}/qwq_judge"] <= 1.0
    assert step["reward/mean"] == pytest.approx(step["reward/exact_match"] + 0.5 * step["reward/qwq_judge"])
    # The replies came from the server, asked with the configured model name and template.
    assert model_server.requests
    for request in model_server.requests:
        body = request["body"]
        assert (body["model"], body["max_tokens"]) == ("smollm2", 4)
        assert body["messages"][-1]["content"].endswith("Match:")
