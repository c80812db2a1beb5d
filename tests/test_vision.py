"""Images for vision-language models, end to end on a tiny random LLaVA: messages with
image parts, token-exact rendering with the processor's image tokens, the hf backend's
generation with pixel values, the agent loop carrying them, and the trainer scoring the
same tokens with the same images."""

from __future__ import annotations

import asyncio
import io

import pytest
import torch
from PIL import Image

from rlfactory_core.training.batch import build_batch, rows_of
from rlfactory_core.training.logprobs import token_logprobs
from rlfactory_core.errors import ConfigError, ModelError
from rlfactory_core.rollout import ChatTemplate, RolloutConfig, SamplingParams, TemplateFamily, run_trajectory
from rlfactory_core.rollout.backends.hf import HFBackend
from rlfactory_core.rollout.render import check_retokenization, trajectory_ids
from rlfactory_core.types import EnvReset, EnvStep, Message, Segment, Trajectory

IMAGE_TOKENS = 4  # (28 / 14) ** 2 patches per image in the tiny LLaVA


def picture(color: tuple[int, int, int], size: tuple[int, int] = (40, 60)) -> Image.Image:
    return Image.new("RGB", size, color)


def png(color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    picture(color).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def vlm(tiny_vlm_dir):
    from rlfactory_core.models import load_model, load_processor, load_tokenizer

    processor = load_processor(tiny_vlm_dir)
    chat = ChatTemplate(load_tokenizer(tiny_vlm_dir), processor=processor)
    model = load_model(tiny_vlm_dir, dtype="float32").eval()
    return chat, model, processor


def test_a_message_with_images_renders_image_parts_before_its_text():
    message = Message(role="user", content="What is on the screen?", images=[picture((1, 2, 3)), b"png"])
    assert message.to_dict() == {"role": "user", "content": [
        {"type": "image"}, {"type": "image"}, {"type": "text", "text": "What is on the screen?"}]}
    assert Message(role="user", content="plain").to_dict() == {"role": "user", "content": "plain"}
    first, second = picture((1, 1, 1)), picture((2, 2, 2))
    trajectory = Trajectory("t", [], messages=[Message("user", "a", images=[first]), Message("assistant", "b"),
                                                Message("user", "c", images=[second])])
    assert trajectory.images == [first, second]


def test_the_processor_expands_each_placeholder_to_the_images_tokens(vlm):
    chat, model, _ = vlm
    image_token = model.config.image_token_id
    messages = [Message("user", "Look.", images=[picture((200, 0, 0))])]
    ids = chat.prompt_ids(messages)
    assert ids.count(image_token) == IMAGE_TOKENS
    assert chat.decode(ids, skip_special_tokens=False).count("<image>") == IMAGE_TOKENS
    # PNG bytes (what a device's screenshot is) read the same as the picture
    assert chat.prompt_ids([Message("user", "Look.", images=[png((200, 0, 0))])]) == ids
    observation = [Message("user", "The screen now:", images=[picture((0, 200, 0)), picture((0, 0, 9))])]
    end = [chat.turn_end_id]
    observed = chat.observation_ids(chat.encode("Tapping.") + end, observation)
    assert observed.count(image_token) == 2 * IMAGE_TOKENS
    assert chat.accepts_images


def test_trajectories_with_images_are_token_exact(vlm):
    chat, _, _ = vlm
    opening = [Message("system", "Operate the phone."), Message("user", "Task: open Settings.", images=[picture((9, 9, 9))])]
    call = chat.encode("I will tap.") + [chat.turn_end_id]
    observation = [Message("user", "Tapped.", images=[png((50, 60, 70))])]
    answer = chat.encode("Done.") + [chat.turn_end_id]
    trajectory = Trajectory(
        "t", chat.prompt_ids(opening),
        messages=[*opening, Message("assistant", "I will tap."), *observation, Message("assistant", "Done.")],
        segments=[Segment("model", call, [0.0] * len(call)), Segment("observation", chat.observation_ids(call, observation)),
                  Segment("model", answer, [0.0] * len(answer))])
    report = check_retokenization(trajectory, chat)
    assert report.ok, report.describe()


def test_a_text_only_model_refuses_images_with_a_clear_error(default_model_dir):
    from rlfactory_core.models import load_processor, load_tokenizer

    assert load_processor(default_model_dir) is None
    chat = ChatTemplate(load_tokenizer(default_model_dir))
    assert not chat.accepts_images
    with pytest.raises(ModelError, match="text-only model") as caught:
        chat.prompt_ids([Message("user", "Look.", images=[picture((1, 2, 3))])])
    assert "screenshot=false" in caught.value.hint


def test_unreadable_image_bytes_are_a_clear_error(vlm):
    chat, _, _ = vlm
    with pytest.raises(ModelError, match="not a readable image file"):
        chat.prompt_ids([Message("user", "Look.", images=[b"not an image"])])
    with pytest.raises(ModelError, match="PIL.Image.Image or the bytes"):
        chat.prompt_ids([Message("user", "Look.", images=["screen.png"])])


def _greedy_reference(model, ids, pixel_values, steps):
    """Greedy tokens by full forwards of the whole sequence with its images (no cache)."""
    ids = list(ids)
    out = []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([ids]), pixel_values=pixel_values).logits[0, -1]
            token = int(logits.argmax())
            out.append(token)
            ids.append(token)
    return out


async def test_the_hf_backend_generates_from_the_images(vlm):
    """Greedy tokens equal full forwards with the images, also with other requests (a
    text-only one, one with other images) in the same prefill; different images give
    different logits, so the images really reach the model."""
    chat, model, processor = vlm
    red = chat.prompt_ids([Message("user", "Look.", images=[picture((250, 0, 0))])])
    two = chat.prompt_ids([Message("user", "Compare.", images=[picture((0, 0, 250)), picture((0, 250, 0))])])
    text = chat.prompt_ids([Message("user", "No picture.")])
    backend = HFBackend(model, max_batch_size=8, processor=processor)
    greedy = SamplingParams(temperature=0, max_tokens=6)
    scored = SamplingParams(temperature=0, max_tokens=1)
    try:
        together = await asyncio.gather(
            backend.generate(red, greedy, images=[picture((250, 0, 0))]),
            backend.generate(two, greedy, images=[picture((0, 0, 250)), picture((0, 250, 0))]),
            backend.generate(text, greedy))
        blue = await backend.generate(red, scored, images=[picture((0, 0, 250))])
        red_again = await backend.generate(red, scored, images=[picture((250, 0, 0))])
    finally:
        await backend.close()
    pixels = chat.image_inputs
    assert together[0].token_ids == _greedy_reference(model, red, pixels([picture((250, 0, 0))])["pixel_values"], 6)
    both = pixels([picture((0, 0, 250)), picture((0, 250, 0))])["pixel_values"]
    assert together[1].token_ids == _greedy_reference(model, two, both, 6)
    assert together[2].token_ids == _greedy_reference(model, text, None, 6)
    assert backend.stats()["max_rows"] == 3  # the three ran as one batch
    assert blue.logprobs != red_again.logprobs


async def test_the_hf_backend_refuses_images_it_cannot_use(vlm, tiny_model_dir):
    chat, model, processor = vlm
    text_only = HFBackend(str(tiny_model_dir), max_batch_size=2)
    vision = HFBackend(model, max_batch_size=2, processor=processor)
    sampling = SamplingParams(max_tokens=2)
    try:
        with pytest.raises(ModelError, match="text-only model"):
            await text_only.generate([1, 2, 3], sampling, images=[picture((1, 1, 1))])
        with pytest.raises(ModelError, match="no image tokens"):
            await vision.generate(chat.prompt_ids([Message("user", "hi")]), sampling, images=[picture((1, 1, 1))])
        with pytest.raises(ModelError, match="cannot read the request's images"):
            await vision.generate(chat.prompt_ids([Message("user", "hi", images=[picture((1, 1, 1))])]), sampling,
                                  images=[b"junk"])
        # the backend serves on after refusals
        ok = await vision.generate(chat.prompt_ids([Message("user", "hi", images=[picture((1, 1, 1))])]), sampling,
                                   images=[picture((1, 1, 1))])
        assert len(ok.token_ids) >= 1
    finally:
        await text_only.close()
        await vision.close()


class _ScreenEnv:
    """Shows a picture with the task and another after every turn, for three turns."""

    name = "screens"
    description = "pictures"
    shows_images = True

    async def reset(self, sample):
        return EnvReset(messages=[Message("user", "What color?", images=[picture((255, 0, 0))])], state={"turn": 0})

    async def step(self, state, turn, results):
        state["turn"] += 1
        colors = [(0, 255, 0), (0, 0, 255)]
        if state["turn"] > len(colors):
            return EnvStep(done=True)
        return EnvStep(observation=[Message("user", "And now?", images=[png(colors[state["turn"] - 1])])])

    async def close(self, state):
        pass


class _NoTools:
    async def call(self, calls, ctx=None):
        return []


class _PlainParser:
    def render_system_prompt(self, system, tools):
        return system

    def parse(self, text):
        from rlfactory_core.types import ParsedTurn

        return ParsedTurn(text=text, content=text)

    def render_tool_results(self, results):
        return []


async def _rollout_with_images(chat, model, processor, temperature):
    backend = HFBackend(model, max_batch_size=4, processor=processor)
    config = RolloutConfig(max_turns=3, max_tokens_per_turn=5, max_trajectory_tokens=512,
                           sampling={"temperature": temperature, "seed": 11})
    try:
        return [await run_trajectory({"id": f"s{i}"}, env=_ScreenEnv(), family=TemplateFamily(chat, _PlainParser()),
                                     tool_manager=_NoTools(), backend=backend, config=config, index=i)
                for i in range(2)]
    finally:
        await backend.close()


async def test_the_agent_loop_keeps_every_image_and_its_tokens(vlm):
    chat, model, processor = vlm
    trajectories = await _rollout_with_images(chat, model, processor, temperature=1.0)
    for trajectory in trajectories:
        assert trajectory.stop_reason == "env_done", trajectory.metadata
        assert len(trajectory.images) == 3
        ids = trajectory_ids(trajectory)
        assert ids.count(model.config.image_token_id) == 3 * IMAGE_TOKENS
        # the observations' ids are the template's rendering of them, images expanded
        observations = [seg for seg in trajectory.segments if seg.kind == "observation"]
        assert all(seg.token_ids.count(model.config.image_token_id) == IMAGE_TOKENS for seg in observations)


@pytest.mark.parametrize("packed", [False, True])
async def test_the_trainer_scores_the_sampled_tokens_with_the_same_images(vlm, packed):
    """The trainer's logprobs of a batch of image trajectories (padded or packed) are the
    sampler's, at the sampling temperature: the images reach the training forward in the
    order of their tokens."""
    from rlfactory_core.config import load_config

    chat, model, processor = vlm
    trajectories = await _rollout_with_images(chat, model, processor, temperature=0.7)
    for trajectory in trajectories:
        trajectory.group = 0  # one group of two, as a rollout would make it
    config = load_config([], ["rollout.sampling.temperature=0.7", "grpo.group_size=2"])
    batch = build_batch(trajectories, [0.0, 1.0], config, pad_id=0, processor=processor)
    assert batch["image_counts"].tolist() == [3, 3]
    micro = rows_of(batch, [1, 0])
    with torch.no_grad():
        logprobs, _ = token_logprobs(model, micro, bf16=False, entropy=False, packed=packed, temperature=0.7)
    for position, row in enumerate([1, 0]):  # the micro-batch's rows are the batch's 1 and 0
        sampled = torch.tensor([lp for s in trajectories[row].segments if s.kind == "model" for lp in s.logprobs])
        ours = logprobs[position][micro["loss_mask"][position].bool()]
        torch.testing.assert_close(ours, sampled, atol=1e-4, rtol=0)
    # without the images the same tokens score differently: the pixels matter
    del micro["image_inputs"]
    with torch.no_grad():
        blind, _ = token_logprobs(model, micro.exclude("image_counts"), bf16=False, entropy=False,
                                     packed=packed, temperature=0.7)
    assert (blind - logprobs).abs().max() > 1e-3


def test_an_env_that_shows_images_needs_a_vision_model_and_the_local_engine(default_model_dir, tiny_vlm_dir):
    from rlfactory_core.config import load_config
    from rlfactory_core.models import check_images

    config = load_config([], ["env=arithmetic"])
    with pytest.raises(ConfigError, match="the arithmetic env shows the model images, but 'llama' is a text-only model"):
        check_images(config, _ScreenEnv(), default_model_dir)
    assert check_images(config, _ScreenEnv(), tiny_vlm_dir) is not None
    assert check_images(config, object(), default_model_dir) is None
    ray = load_config([], ["env=arithmetic", "engine=ray"])
    with pytest.raises(ConfigError, match="ray engine"):
        check_images(ray, _ScreenEnv(), tiny_vlm_dir)
    assert check_images(ray, _ScreenEnv(), tiny_vlm_dir, training=False) is not None  # rlf eval runs locally


def test_image_runs_collapse_to_one_placeholder_per_image():
    from rlfactory_core.rollout.backends.vllm import collapse_image_runs

    I = 99
    assert collapse_image_runs([1, I, I, I, I, 2, I, I, I, I, I, I, I, I, 3], I, 3) == [1, I, 2, I, I, 3]
    with pytest.raises(ModelError, match="2 image\\(s\\) given, but the prompt has 3 image token"):
        collapse_image_runs([1, I, I, I], I, 2)
    with pytest.raises(ModelError, match="a run of 3 image tokens is not a whole number of images of 2 tokens"):
        collapse_image_runs([I, I, I, 5, I], I, 2)


async def test_vllm_refuses_images_for_a_text_model_before_starting(default_model_dir):
    from rlfactory_core.rollout.backends.vllm import VLLMBackend

    vllm = VLLMBackend(str(default_model_dir))  # the engine starts on first use: the check comes first
    try:
        with pytest.raises(ModelError, match="is not a vision-language model this backend takes images for"):
            await vllm.generate([1, 2], SamplingParams(max_tokens=1), images=[picture((1, 1, 1))])
        assert vllm._engine is None
    finally:
        await vllm.close()


async def test_vision_architectures_not_tested_end_to_end_are_refused(vlm, tiny_vlm_dir, monkeypatch):
    """Only architectures in VISION_MODEL_TYPES (with a tower in VISION_TOWER_TYPES) take
    images: another one (here LLaVA itself, struck off the list) is refused by the config
    check and the backend, not run approximately; a text-only model by the config check."""
    from rlfactory_core.config import load_config
    from rlfactory_core.models import check_images, vision

    chat, model, processor = vlm
    monkeypatch.setattr(vision, "VISION_MODEL_TYPES", ("qwen2_vl",))
    with pytest.raises(ConfigError, match="images for 'llava' models with a 'clip_vision_model' vision tower are "
                                          "not supported yet"):
        check_images(load_config([], ["env=arithmetic"]), _ScreenEnv(), tiny_vlm_dir)
    backend = HFBackend(model, max_batch_size=2, processor=processor)
    try:
        with pytest.raises(ModelError, match="images for 'llava' models with a 'clip_vision_model' vision tower"):
            await backend.generate(chat.prompt_ids([Message("user", "hi", images=[picture((1, 1, 1))])]),
                                   SamplingParams(max_tokens=2), images=[picture((1, 1, 1))])
    finally:
        await backend.close()


async def test_a_request_whose_images_do_not_fit_its_tokens_fails_alone(vlm):
    """Its prefill batch-mates are retried one by one and succeed."""
    chat, model, processor = vlm
    one_image = chat.prompt_ids([Message("user", "Look.", images=[picture((9, 9, 9))])])
    backend = HFBackend(model, max_batch_size=4, processor=processor)
    sampling = SamplingParams(temperature=0, max_tokens=3)
    try:
        good, text, bad = await asyncio.gather(
            backend.generate(one_image, sampling, images=[picture((9, 9, 9))]),
            backend.generate(chat.prompt_ids([Message("user", "hi")]), sampling),
            backend.generate(one_image, sampling, images=[picture((1, 1, 1)), picture((2, 2, 2))]),
            return_exceptions=True)
    finally:
        await backend.close()
    assert isinstance(bad, Exception) and "do not match" in str(bad)
    assert good.token_ids == _greedy_reference(model, one_image, chat.image_inputs([picture((9, 9, 9))])["pixel_values"], 3)
    assert len(text.token_ids) == 3


class _UnreadableScreenEnv(_ScreenEnv):
    async def reset(self, sample):
        return EnvReset(messages=[Message("user", "What color?", images=[b"not a png"])], state={"turn": 0})


async def test_a_prompt_that_cannot_be_rendered_ends_its_trajectory_and_trains_on(vlm):
    """Unreadable image bytes end that trajectory as env_error with no images; a batch
    with it and a good trajectory still builds and scores."""
    chat, model, processor = vlm
    backend = HFBackend(model, max_batch_size=4, processor=processor)
    config = RolloutConfig(max_turns=3, max_tokens_per_turn=4, max_trajectory_tokens=512, sampling={"seed": 1})
    try:
        bad = await run_trajectory({"id": "bad"}, env=_UnreadableScreenEnv(),
                                   family=TemplateFamily(chat, _PlainParser()), tool_manager=_NoTools(),
                                   backend=backend, config=config)
        good = await run_trajectory({"id": "good"}, env=_ScreenEnv(), family=TemplateFamily(chat, _PlainParser()),
                                    tool_manager=_NoTools(), backend=backend, config=config)
    finally:
        await backend.close()
    assert bad.stop_reason == "env_error" and "not a readable image file" in bad.metadata["error"]
    assert bad.images == [] and bad.prompt_ids == []
    from rlfactory_core.config import load_config

    bad.group = good.group = 0  # one group of two, as a rollout would make it
    batch = build_batch([bad, good], [0.0, 1.0], load_config([], ["grpo.group_size=2"]), pad_id=0,
                        processor=processor)
    assert batch["image_counts"].tolist() == [0, 3]


def test_a_template_kept_on_the_processor_only_is_used(tiny_vlm_dir):
    from rlfactory_core.models import load_processor, load_tokenizer

    tokenizer, processor = load_tokenizer(tiny_vlm_dir), load_processor(tiny_vlm_dir)
    tokenizer.chat_template = None
    chat = ChatTemplate(tokenizer, processor=processor)
    assert chat.prompt_ids([Message("user", "Look.", images=[picture((3, 3, 3))])]).count(
        processor.image_token_id) == IMAGE_TOKENS
