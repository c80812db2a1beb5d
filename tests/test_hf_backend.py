"""The transformers backend (:mod:`rlfactory_core.rollout.backends.hf`).

Most tests run a tiny randomly initialised Llama (2 layers, hidden size 64, 256 tokens) so
they take milliseconds; references come from the same weights run alone, through
``model.generate`` or one teacher-forced forward pass. One test asks the embedded default
model a real question.

Rows joining a running batch is made deterministic without timing: a late request waits
until the backend reports a number of decode steps, then asks; ``stats()["joined_running"]``
confirms it was admitted into the running batch rather than after it.
"""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlfactory_core.errors import ModelError, RLFactoryError
from rlfactory_core.rollout import Generation, SamplingParams, make_backend
from rlfactory_core.rollout.backends.hf import HFBackend

VOCAB = 256
GREEDY = SamplingParams(temperature=0, max_tokens=16)


def tiny_model(seed: int = 0, **config) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    settings = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
        # Wider than the default 0.02 so the next-token distribution is peaked, as a trained
        # model's is: greedy choices are then not decided by float rounding.
        initializer_range=0.2,
    )
    settings.update(config)
    return LlamaForCausalLM(LlamaConfig(**settings)).float().eval()


def prompts(*lengths: int, seed: int = 1) -> list[list[int]]:
    rng = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=rng).tolist() for n in lengths]


def reference_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """What transformers' own greedy decoding produces for ``prompt`` alone. Checked to have no
    near tie: every top-two logprob gap on the path is wider than twice the tests' logprob
    tolerance (1e-4), so the backend's batched, cached kernels cannot pick another token on any
    CPU; the gaps are the model's, not the machine's."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             do_sample=False, max_new_tokens=max_new_tokens)
    greedy = out[0, len(prompt):].tolist()
    top = teacher_forced_logits(model, prompt, greedy).log_softmax(-1).topk(2).values
    gap = float((top[:, 0] - top[:, 1]).min())
    assert gap > 2e-4, f"a near tie on the greedy path (top-two logprob gap {gap:.2e}): change the test's model or prompt"
    return greedy


def teacher_forced_logits(model, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """(len(generated), vocab) float32 logits that predicted each generated token."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated])).logits[0].float()
    return logits[len(prompt) - 1: len(prompt) - 1 + len(generated)]


def processed_logprobs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """The backend.py definition, written out plainly: one row of logits at a time."""
    if sampling.temperature == 0:
        return logits.log_softmax(-1)
    rows = []
    for row in logits / sampling.temperature:
        keep = torch.ones_like(row, dtype=torch.bool)
        if sampling.top_k > 0:
            keep &= row >= row.topk(sampling.top_k).values[-1]
        if sampling.top_p < 1:
            probs = row.masked_fill(~keep, float("-inf")).softmax(-1)
            mass_above = 0.0
            for token in probs.argsort(descending=True).tolist():
                if mass_above >= sampling.top_p:
                    keep[token] = False
                mass_above += probs[token].item()
        rows.append(row.masked_fill(~keep, float("-inf")).log_softmax(-1))
    return torch.stack(rows)


async def after_steps(backend: HFBackend, steps: int, prompt: list[int], sampling: SamplingParams) -> Generation:
    """Ask once the backend has run ``steps`` decode steps: the request joins a running batch."""
    while backend.stats()["decode_steps"] < steps:
        await asyncio.sleep(0.001)
    return await backend.generate(prompt, sampling)


@pytest.fixture
def model():
    return tiny_model()


@pytest.fixture
async def backend(model):
    backend = HFBackend(copy.deepcopy(model), max_batch_size=4)
    yield backend
    await backend.close()


# -- greedy decoding and continuous batching ----------------------------------------------


async def test_greedy_matches_generate_for_concurrent_and_staggered_requests(model, backend):
    batch = prompts(3, 17, 9, 30, 1, 12)
    results = await asyncio.gather(
        backend.generate(batch[0], GREEDY),
        backend.generate(batch[1], GREEDY),
        after_steps(backend, 3, batch[2], GREEDY),
        after_steps(backend, 6, batch[3], GREEDY),
        after_steps(backend, 6, batch[4], GREEDY),
        after_steps(backend, 9, batch[5], GREEDY),
    )
    for prompt, result in zip(batch, results):
        assert result.token_ids == reference_greedy(model, prompt, GREEDY.max_tokens)
        assert result.finish_reason == "length"
    stats = backend.stats()
    assert stats["joined_running"] >= 3  # the late ones joined rows already decoding
    assert stats["max_rows"] == 4  # max_batch_size held the rest back until a row finished


async def test_max_tokens_ends_with_length(backend):
    for max_tokens in (1, 5):
        result = await backend.generate(prompts(4)[0], SamplingParams(temperature=0, max_tokens=max_tokens))
        assert len(result.token_ids) == len(result.logprobs) == max_tokens
        assert result.finish_reason == "length"


async def test_stop_token_ends_the_turn_and_is_included(model, backend):
    prompt = prompts(6)[0]
    greedy = reference_greedy(model, prompt, 16)
    cut = next(i for i in range(2, 16) if greedy[i] not in greedy[:i])  # first occurrence
    stop = greedy[cut]
    result = await backend.generate(prompt, SamplingParams(temperature=0, max_tokens=16, stop_token_ids=(stop,)))
    assert result.token_ids == greedy[: cut + 1]
    assert result.finish_reason == "stop"


async def test_eos_from_the_generation_config_ends_the_turn(model):
    prompt = prompts(6)[0]
    greedy = reference_greedy(model, prompt, 16)
    cut = next(i for i in range(2, 16) if greedy[i] not in greedy[:i])
    with_eos = copy.deepcopy(model)
    with_eos.generation_config.eos_token_id = [VOCAB - 1, greedy[cut]]
    backend = HFBackend(with_eos)
    try:
        assert backend.eos_token_ids == {VOCAB - 1, greedy[cut]}
        result = await backend.generate(prompt, GREEDY)
    finally:
        await backend.close()
    assert result.token_ids == greedy[: cut + 1]
    assert result.finish_reason == "stop"


# -- logprobs and sampling --------------------------------------------------------------------


@pytest.mark.parametrize("sampling", [
    SamplingParams(temperature=0, max_tokens=12),
    SamplingParams(temperature=0.7, max_tokens=12, seed=3),
    SamplingParams(temperature=0.9, top_k=5, top_p=0.8, max_tokens=12, seed=4),
], ids=["greedy", "temperature", "top-k-top-p"])
async def test_logprobs_equal_a_teacher_forced_forward_pass(model, backend, sampling):
    batch = prompts(5, 11, 2)
    results = await asyncio.gather(
        backend.generate(batch[0], sampling),
        backend.generate(batch[1], sampling),
        after_steps(backend, 4, batch[2], sampling),
    )
    for prompt, result in zip(batch, results):
        expected = processed_logprobs(teacher_forced_logits(model, prompt, result.token_ids), sampling)
        chosen = expected[torch.arange(len(result.token_ids)), torch.tensor(result.token_ids)]
        assert torch.isfinite(chosen).all(), "sampled a token outside top-k / top-p"
        torch.testing.assert_close(torch.tensor(result.logprobs), chosen, atol=1e-4, rtol=0)


async def test_seeded_sampling_is_reproducible_whatever_runs_beside_it(backend):
    prompt, other = prompts(7, 13)
    seeded = SamplingParams(temperature=1.0, max_tokens=16, seed=1234)
    alone = await backend.generate(prompt, seeded)
    crowded, _, _ = await asyncio.gather(
        after_steps(backend, 2, prompt, seeded),
        backend.generate(other, SamplingParams(temperature=1.0, max_tokens=24)),
        backend.generate(other, SamplingParams(temperature=1.0, max_tokens=24, seed=1234)),
    )
    assert crowded.token_ids == alone.token_ids
    assert crowded.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    reseeded = await backend.generate(prompt, SamplingParams(temperature=1.0, max_tokens=16, seed=4321))
    assert reseeded.token_ids != alone.token_ids


# -- refused requests -------------------------------------------------------------------------


async def test_a_too_long_prompt_fails_alone(model):
    backend = HFBackend(copy.deepcopy(model), max_model_len=40)
    short = prompts(8)[0]
    try:
        good, too_long, good_again = await asyncio.gather(
            backend.generate(short, GREEDY),
            backend.generate(prompts(30)[0], GREEDY),  # 30 + 16 > 40
            backend.generate(short, GREEDY),
            return_exceptions=True,
        )
    finally:
        await backend.close()
    assert isinstance(too_long, ModelError)
    assert "30 tokens" in str(too_long) and "context of 40" in str(too_long)
    assert good.token_ids == good_again.token_ids == reference_greedy(model, short, GREEDY.max_tokens)


async def test_context_defaults_to_max_position_embeddings(backend):
    assert backend.max_model_len == 256
    with pytest.raises(ModelError, match="context of 256"):
        await backend.generate([1] * 250, GREEDY)


@pytest.mark.parametrize("prompt, message", [
    ([], "empty prompt"),
    ([1, VOCAB, 2], "outside the vocabulary"),
    ([1, -1], "outside the vocabulary"),
])
async def test_bad_prompts_are_refused(backend, prompt, message):
    with pytest.raises(ModelError, match=message):
        await backend.generate(prompt, GREEDY)
    assert (await backend.generate([1, 2], GREEDY)).finish_reason == "length"  # still serving


class PoisonedLlama(LlamaForCausalLM):
    """A real model whose forward pass fails on one token id: a worker-side error."""

    poison: int = -1

    def forward(self, input_ids=None, **kwargs):
        if input_ids is not None and bool((input_ids == self.poison).any()):
            raise RuntimeError("poisoned token")
        return super().forward(input_ids=input_ids, **kwargs)


async def test_a_failing_model_call_fails_its_request_and_the_others_carry_on(model):
    running, late = prompts(5, 9)
    expected = [reference_greedy(model, p, GREEDY.max_tokens) for p in (running, late)]
    poisoned = PoisonedLlama(model.config)
    poisoned.load_state_dict(model.state_dict())
    # A token the healthy requests never see, so only the poisoned prompt's prefill fails.
    poisoned.poison = min(set(range(VOCAB)) - set(running + late + expected[0] + expected[1]))
    backend = HFBackend(poisoned)
    try:
        first, failed = await asyncio.gather(
            backend.generate(running, GREEDY),
            after_steps(backend, 3, [1, poisoned.poison, 2], GREEDY),
            return_exceptions=True,
        )
        after = await backend.generate(late, GREEDY)
    finally:
        await backend.close()
    assert isinstance(failed, RuntimeError) and "poisoned" in str(failed)
    assert [first.token_ids, after.token_ids] == expected
    assert backend.stats()["prefills"] == 3


async def test_a_cancelled_request_is_dropped(model, backend):
    long_one = asyncio.create_task(backend.generate(prompts(4)[0], SamplingParams(temperature=0, max_tokens=200)))
    while backend.stats()["decode_steps"] < 2:
        await asyncio.sleep(0.001)
    long_one.cancel()
    prompt = prompts(6)[0]
    result = await backend.generate(prompt, GREEDY)
    assert result.token_ids == reference_greedy(model, prompt, GREEDY.max_tokens)
    assert backend.stats()["decode_steps"] < 150  # the cancelled row did not run to the end


# -- weights --------------------------------------------------------------------------------------


async def test_update_weights_switches_to_the_new_weights_between_requests(model, backend):
    new_model = tiny_model(seed=7)
    running, queued = prompts(5, 8)
    long_turn = SamplingParams(temperature=0, max_tokens=24)
    expected_old = reference_greedy(model, running, long_turn.max_tokens)
    expected_new = reference_greedy(new_model, queued, GREEDY.max_tokens)
    assert expected_new != reference_greedy(model, queued, GREEDY.max_tokens)

    first = asyncio.create_task(backend.generate(running, long_turn))
    while backend.stats()["decode_steps"] < 3:
        await asyncio.sleep(0.001)
    update = asyncio.create_task(backend.update_weights(new_model.state_dict().items()))
    await asyncio.sleep(0)  # the update is registered before the next request arrives
    second = asyncio.create_task(backend.generate(queued, GREEDY))
    await asyncio.gather(first, update, second)

    assert first.result().token_ids == expected_old  # in flight: finished on the old weights
    assert second.result().token_ids == expected_new  # queued behind the update: new weights
    assert backend.stats()["weight_updates"] == 1
    # admission was held from the update's arrival until its copy
    assert update.result() > 0
    # each request reports the weight version that sampled it: one past the start's by default
    assert (first.result().policy_version, second.result().policy_version, backend.weight_version) == (0, 1, 1)
    # or the version the caller numbers it with (an engine's count of updates; a resumed run's)
    await backend.update_weights(model.state_dict().items(), version=7)
    again = await backend.generate(running, long_turn)
    assert again.token_ids == expected_old and again.policy_version == backend.weight_version == 7


async def test_paused_freezes_the_rows_and_resumes_them_to_the_same_tokens(model, backend):
    """``paused()`` (the update taking every core, ``train.overlap_cores: take_turns``): no
    decode step, admission or weight copy inside the block; after it, the row in flight
    finishes with the tokens it samples unpaused (seeded) on the weights it started on, and a
    push asked for inside lands after it, before the request that arrived behind the push."""
    running, queued = prompts(5, 8)
    seeded = SamplingParams(temperature=1.0, max_tokens=24, seed=1)
    unpaused = await backend.generate(running, seeded)
    steps = backend.stats()["decode_steps"]
    first = asyncio.create_task(backend.generate(running, seeded))
    while backend.stats()["decode_steps"] < steps + 3:
        await asyncio.sleep(0.001)
    async with backend.paused() as pausing_s:
        frozen = backend.stats()
        push = asyncio.create_task(backend.update_weights(tiny_model(seed=7).state_dict().items()))
        await asyncio.sleep(0)
        second = asyncio.create_task(backend.generate(queued, GREEDY))
        await asyncio.sleep(0.3)
        assert backend.stats() == frozen and not (first.done() or second.done() or push.done())
    assert pausing_s >= 0
    await asyncio.gather(first, second, push)
    assert first.result().token_ids == unpaused.token_ids and first.result().policy_version == 0
    assert second.result().policy_version == backend.weight_version == 1
    async with backend.paused():  # nothing running: takes effect at once
        pass
    await backend.close()
    with pytest.raises(RLFactoryError, match="closed"):
        async with backend.paused():
            pass


async def test_a_pause_waiting_for_a_model_call_that_crashes_the_worker_returns(model):
    """A bug in the worker's own loop (not a model error: those fail their requests) while a
    pause waits for the model call under way: the pause is released, the request fails."""
    import threading

    backend = HFBackend(copy.deepcopy(model))
    entered, release = threading.Event(), threading.Event()

    def broken_step(admitted):
        entered.set()
        release.wait(10)
        raise SystemError("a bug in the loop")

    backend._step = broken_step
    request = asyncio.create_task(backend.generate(prompts(5)[0], GREEDY))
    await asyncio.to_thread(entered.wait, 10)
    pause = asyncio.create_task(backend.paused().__aenter__())
    await asyncio.sleep(0.1)
    assert not pause.done()  # it waits for the model call
    release.set()
    await asyncio.wait_for(pause, 10)
    with pytest.raises(RLFactoryError, match="worker crashed"):  # answered, though the crash took it mid-step
        await asyncio.wait_for(request, 10)
    await backend.close()


async def test_update_weights_refuses_unknown_names_and_wrong_shapes(model, backend):
    prompt = prompts(5)[0]
    weights = dict(tiny_model(seed=7).state_dict())
    with pytest.raises(ModelError, match=r"2 name\(s\) not in the model.*'model.nope.weight'") as info:
        await backend.update_weights([*weights.items(), ("model.nope.weight", torch.zeros(1)), ("extra", torch.zeros(1))])
    assert "model.embed_tokens.weight" in str(info.value)  # the hint shows real names
    with pytest.raises(ModelError, match=r"model.norm.weight: shape \(3,\) does not match the model's \(64,\)"):
        await backend.update_weights([*weights.items(), ("model.norm.weight", torch.ones(3))])
    with pytest.raises(ModelError, match="expected a torch.Tensor"):
        await backend.update_weights([("model.norm.weight", [1.0] * 64)])
    # Nothing was half-applied, and the version did not move.
    unchanged = await backend.generate(prompt, GREEDY)
    assert unchanged.token_ids == reference_greedy(model, prompt, GREEDY.max_tokens) and unchanged.policy_version == 0
    assert backend.stats()["weight_updates"] == 0 and backend.weight_version == 0


# -- shutdown ---------------------------------------------------------------------------------------


async def test_close_aborts_pending_requests_and_is_idempotent(model):
    backend = HFBackend(copy.deepcopy(model), max_batch_size=2)
    endless = SamplingParams(temperature=0, max_tokens=200)
    tasks = [asyncio.create_task(backend.generate(p, endless)) for p in prompts(3, 4, 5, 6)]
    while backend.stats()["decode_steps"] < 2:
        await asyncio.sleep(0.001)
    await backend.close()
    results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)  # a guard against hanging only
    assert {r.finish_reason for r in results} == {"abort"}
    assert [len(r.token_ids) > 0 for r in results] == [True, True, False, False]  # two ran, two waited
    assert all(len(r.token_ids) == len(r.logprobs) for r in results)
    await backend.close()
    with pytest.raises(RLFactoryError, match="closed"):
        await backend.generate([1, 2], GREEDY)
    with pytest.raises(RLFactoryError, match="closed"):
        await backend.update_weights([])


# -- construction --------------------------------------------------------------------------------


async def test_make_backend_loads_a_model_directory(model, tmp_path):
    model.save_pretrained(tmp_path)
    backend = make_backend("hf", str(tmp_path), dtype="float32", max_batch_size=2)
    try:
        assert isinstance(backend, HFBackend) and backend.name == "hf"
        assert backend.model.dtype == torch.float32
        # device="auto", the default: the local engine passes none, and on a GPU machine
        # generation must not silently run on the CPU
        assert backend.model.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
        prompt = prompts(6)[0]
        assert (await backend.generate(prompt, GREEDY)).token_ids == reference_greedy(model, prompt, GREEDY.max_tokens)
    finally:
        await backend.close()


def test_on_cuda_the_model_calls_avoid_cudnn_attention_and_restore_the_flags():
    # The flags are process-wide settings that exist without a GPU, so the context is checked here.
    from rlfactory_core.rollout.backends.hf_runner import attention_kernels

    before = torch.backends.cuda.cudnn_sdp_enabled()
    with attention_kernels(torch.device("cuda")):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    with attention_kernels(torch.device("cpu")):  # nothing to choose on CPU
        assert torch.backends.cuda.cudnn_sdp_enabled() == before


@pytest.mark.parametrize("options, message", [
    ({"max_batch_size": 0}, "max_batch_size"),
    ({"max_model_len": 1}, "max_model_len"),
])
def test_bad_options_are_refused(model, options, message):
    with pytest.raises(ModelError, match=message):
        HFBackend(model, **options)


# -- the embedded default model ---------------------------------------------------------------


@pytest.mark.slow
async def test_default_model_knows_the_capital_of_france(default_model_dir):
    from rlfactory_core.models import load_tokenizer

    tokenizer = load_tokenizer(default_model_dir)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                         tokenize=False, add_generation_prompt=True)
    backend = HFBackend(str(default_model_dir), dtype="float32")
    try:
        result = await backend.generate(tokenizer.encode(text, add_special_tokens=False),
                                        SamplingParams(temperature=0, max_tokens=32))
    finally:
        await backend.close()
    assert "Paris" in tokenizer.decode(result.token_ids)
    assert result.finish_reason == "stop"
    assert result.token_ids[-1] in backend.eos_token_ids


async def test_prefill_and_decode_build_no_autograd_graph(model):
    """Every model call of the worker runs in inference mode: with autograd on, the decode
    steps kept each step's activations (a 2-request, 48-token generation of the default
    model peaked at 12 GB instead of 1.3 GB)."""
    modes: list[bool] = []
    served = copy.deepcopy(model)
    served.register_forward_hook(lambda *_: modes.append(torch.is_inference_mode_enabled()))
    backend = HFBackend(served, max_batch_size=4)
    try:
        await asyncio.gather(*(backend.generate(p, SamplingParams(temperature=0, max_tokens=4)) for p in prompts(5, 7)))
    finally:
        await backend.close()
    assert len(modes) >= 4 and all(modes)  # a prefill and three decode steps at least
