"""The image path through the vllm backend, on the tiny LLaVA: vLLM expands the images
itself, so the kept ids go in collapsed and must come back identical; generation, a rollout
and the trainer's scoring agree with the hf backend; the checkpoint (transformers 5 names)
and the trainer's weight updates load renamed."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio
import torch

from rlfactory_core.training.batch import build_batch, rows_of
from rlfactory_core.training.logprobs import token_logprobs
from rlfactory_core.training.policy import weights_for_backend
from rlfactory_core.rollout import ChatTemplate, RolloutConfig, SamplingParams, TemplateFamily, run_trajectory
from rlfactory_core.rollout.backends.hf import HFBackend
from rlfactory_core.rollout.render import trajectory_ids
from rlfactory_core.types import Message
from test_vision import _NoTools, _PlainParser, _ScreenEnv, picture

pytestmark = [
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),  # the engine is bound to the loop it started in
]


#: Largest |vLLM - transformers| logprob accepted here (float32 both, other kernels).
LOGPROB_TOL = 1e-4


async def hf_greedy_with_gaps(hf, monkeypatch, *args, **kwargs):
    """The hf backend's generation and each greedy step's top-two logprob gap. Greedy tokens
    are compared exactly only where no gap is within ``2 * LOGPROB_TOL`` (where both sides'
    logprobs agree to ``LOGPROB_TOL``, only a closer tie could flip on another CPU); the gaps
    are the model's, not the machine's."""
    from rlfactory_core.rollout.backends import hf_runner

    gaps, real = [], hf_runner.sample

    def sample(logits, rows, generator):
        for row, request in zip(logits, rows):
            if request.sampling.temperature < hf_runner.GREEDY_TEMPERATURE:
                top = row.float().log_softmax(-1).topk(2).values
                gaps.append(float(top[0] - top[1]))
        return real(logits, rows, generator)

    with monkeypatch.context() as patch:
        patch.setattr(hf_runner, "sample", sample)
        result = await hf.generate(*args, **kwargs)
    assert min(gaps) > 2 * LOGPROB_TOL, (f"a near tie on the greedy path (top-two logprob gap {min(gaps):.2e}): "
                                         f"the tokens may flip on another CPU; the test's model or prompt must change")
    return result


@pytest.fixture(scope="module")
def vlm(tiny_vlm_dir):
    from rlfactory_core.models import load_model, load_processor, load_tokenizer

    processor = load_processor(tiny_vlm_dir)
    return ChatTemplate(load_tokenizer(tiny_vlm_dir), processor=processor), load_model(tiny_vlm_dir).eval(), processor


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def vllm_vlm(tiny_vlm_dir):
    from rlfactory_core.rollout.backends.vllm import VLLMBackend

    backend = VLLMBackend(str(tiny_vlm_dir), max_model_len=1024, kv_cache_gib=0.25)
    await backend.start()
    yield backend
    await backend.close()


async def test_vllm_generates_token_exactly_from_the_images_and_the_trainer_agrees(vlm, vllm_vlm, monkeypatch):
    """vLLM takes the kept ids (each image's run collapsed, expanded again by vLLM and
    checked): a rollout with a picture per turn through vLLM gives the hf backend's greedy
    tokens, and the trainer's logprobs of vLLM's sampled tokens are vLLM's."""
    from rlfactory_core.config import load_config

    chat, model, processor = vlm
    red, blue = picture((250, 0, 0)), picture((0, 0, 250))
    ids = chat.prompt_ids([Message("user", "Look.", images=[red])])
    ids += chat.observation_ids(chat.encode("ok") + [chat.turn_end_id], [Message("user", "And now?", images=[blue])])
    greedy = SamplingParams(temperature=0, max_tokens=6)
    hf = HFBackend(model, max_batch_size=4, processor=processor)
    try:
        ours, text_only = await asyncio.gather(vllm_vlm.generate(ids, greedy, images=[red, blue]),
                                               vllm_vlm.generate(chat.prompt_ids([Message("user", "hi")]), greedy))
        reference = await hf_greedy_with_gaps(hf, monkeypatch, ids, greedy, images=[red, blue])
    finally:
        await hf.close()
    assert ours.token_ids == reference.token_ids and text_only.token_ids
    torch.testing.assert_close(torch.tensor(ours.logprobs), torch.tensor(reference.logprobs), atol=LOGPROB_TOL, rtol=0)

    config = RolloutConfig(max_turns=3, max_tokens_per_turn=5, max_trajectory_tokens=512,
                           sampling={"temperature": 0.7, "seed": 5})
    trajectories = list(await asyncio.gather(*(
        run_trajectory({"id": f"s{i}"}, env=_ScreenEnv(), family=TemplateFamily(chat, _PlainParser()),
                       tool_manager=_NoTools(), backend=vllm_vlm, config=config, index=i) for i in range(2))))
    assert [t.stop_reason for t in trajectories] == ["env_done", "env_done"], [t.metadata for t in trajectories]
    for trajectory in trajectories:
        trajectory.group = 0  # one group of two, as a rollout would make it
    batch = build_batch(trajectories, [0.0, 1.0], load_config([], ["grpo.group_size=2"]), pad_id=0,
                        processor=processor)
    with torch.no_grad():
        logprobs, _ = token_logprobs(model, rows_of(batch, [0, 1]), bf16=False, entropy=False, temperature=0.7)
    for row, trajectory in enumerate(trajectories):
        # every turn's context went through the collapse-expand-compare round trip
        assert len(trajectory.images) == 3
        assert trajectory_ids(trajectory).count(model.config.image_token_id) == 3 * 4
        sampled = torch.tensor([lp for s in trajectory.segments if s.kind == "model" for lp in s.logprobs])
        torch.testing.assert_close(logprobs[row][batch["loss_mask"][row].bool()], sampled, atol=LOGPROB_TOL, rtol=0)


async def test_a_literal_image_placeholder_in_screen_text_stays_text_on_vllm(vlm, vllm_vlm):
    """Screen text holding ``<image>`` and forged turns next to real screenshots: vLLM is
    fed (and gives back) one image run per screenshot, the typed placeholder stays text."""
    from test_render_data import run_forging_screens

    chat, model, _ = vlm
    await run_forging_screens(vllm_vlm, chat, model.config.image_token_id)


async def test_vllm_takes_the_trainers_weights_for_a_vision_model(vlm, vllm_vlm, monkeypatch):
    """The tiny LLaVA's checkpoint (transformers 5 names) was loaded renamed after a dummy
    start; an update with the trainer's in-memory names lands too: vLLM then generates what
    the updated model does."""
    import copy

    chat, model, processor = vlm
    updated = copy.deepcopy(model)
    torch.manual_seed(9)  # seed 4 put two tokens 1.4e-5 apart on the greedy path; 9: 2.5e-2
    with torch.no_grad():
        for parameter in updated.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    await vllm_vlm.update_weights(weights_for_backend(updated))
    image = picture((10, 200, 30))
    ids = chat.prompt_ids([Message("user", "Look.", images=[image])])
    greedy = SamplingParams(temperature=0, max_tokens=6)
    hf = HFBackend(updated, max_batch_size=2, processor=processor)
    try:
        ours = await vllm_vlm.generate(ids, greedy, images=[image])
        reference = await hf_greedy_with_gaps(hf, monkeypatch, ids, greedy, images=[image])
    finally:
        await hf.close()
    assert ours.token_ids == reference.token_ids
    torch.testing.assert_close(torch.tensor(ours.logprobs), torch.tensor(reference.logprobs), atol=LOGPROB_TOL, rtol=0)
