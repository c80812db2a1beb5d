"""The GRPO trainer: its pieces on a tiny model, then whole runs with the default model."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from rlfactory_core import OUTCOMES
from rlfactory_core.data import batch_indices, load_samples
from rlfactory_core.engines import local as local_engine
from rlfactory_core.engines.local import backend_for
from rlfactory_core.evaluation import evaluate
from rlfactory_core.task import build_task
from rlfactory_core.training.batch import build_batch, micro_batches, turn_reward_tensor
from rlfactory_core.training.logprobs import token_logprobs
from rlfactory_core.training.policy import (FrozenReference, attn_implementation, load_policy, packing_is_exact,
                                            use_packing, weights_for_backend)
from rlfactory_core.training.update import batch_logprobs, update_policy
from rlfactory_core.errors import ConfigError
from rlfactory_core.training.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from rlfactory_core.config import load_config
from rlfactory_core.hookspecs import hookimpl
from rlfactory_core.testing import ScriptedBackend, registered_plugin, scripted_backend, train
from rlfactory_core.metrics import read_metrics
from rlfactory_core.records import MODEL, RunRecords
from rlfactory_core.models import load_tokenizer
from rlfactory_core.types import Segment, Trajectory


def tiny_model(vocab_size=64, seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    return LlamaForCausalLM(config).float()


def trajectory(prompt, *segments, turn_rewards=(), group=0):
    t = Trajectory(sample_id="x", prompt_ids=list(prompt), group=group)
    for kind, ids in segments:
        t.segments.append(Segment(kind, list(ids), [-0.5] * len(ids) if kind == "model" else None))
    t.turn_rewards = list(turn_rewards)
    return t


# --------------------------------------------------------------------------- pieces


def test_data_order_is_fixed_by_seed_and_position():
    first = batch_indices(10, 4, seed=3, position=0)
    second = batch_indices(10, 4, seed=3, position=4)
    third = batch_indices(10, 4, seed=3, position=8)  # crosses into epoch 1
    epoch0 = first + second + third[:2]
    assert sorted(epoch0) == list(range(10))  # every sample once per epoch
    assert batch_indices(10, 12, seed=3, position=0) == first + second + third  # resumable anywhere
    assert batch_indices(10, 4, seed=4, position=0) != first
    assert batch_indices(10, 12, seed=3, position=0, shuffle=False) == [*range(10), 0, 1]


def test_micro_batches_respect_the_token_budget():
    lengths = torch.tensor([10, 50, 20, 40, 30])
    batches = micro_batches(range(5), lengths, token_budget=80)
    assert sorted(r for b in batches for r in b) == list(range(5))
    for b in batches:
        assert len(b) == 1 or max(int(lengths[r]) for r in b) * len(b) <= 80
    assert micro_batches([1], lengths, token_budget=10) == [[1]]  # a long row still gets a batch
    packed = micro_batches(range(5), lengths, token_budget=80, packed=True)  # padding is not counted
    assert packed == [[0, 2, 4], [3], [1]]  # 10 + 20 + 30 = 60; 40 + 50 > 80


def test_turn_rewards_sit_on_each_turns_last_model_token():
    t = trajectory([1, 2], ("model", [3, 4]), ("observation", [5]), ("model", [6]), turn_rewards=[0.5, -1.0])
    out = turn_reward_tensor([t], width=7)
    assert out.tolist() == [[0, 0, 0, 0.5, 0, -1.0, 0]]  # positions 3 and 5; 6 is padding


def test_a_trajectory_of_two_sequences_is_two_rows_sharing_its_group_and_advantage(default_model_dir):
    """A family that rewrote history made two sequences: one row each, the trajectory's
    advantage on both, its turns counted across them (a later sequence's turn reward credits
    the earlier turns), its loss tokens counted together; records write both sequences."""
    from rlfactory_core.records import trajectory_records
    from rlfactory_core.rewards import ScoredBatch
    from rlfactory_core.training.batch import trajectory_rows
    from rlfactory_core.types import TokenSequence

    two = trajectory([1, 2], ("model", [3, 4]), ("observation", []), turn_rewards=[0.5, -1.0], group=0)
    two.earlier_sequences = [TokenSequence(two.prompt_ids, two.segments)]
    two.prompt_ids, two.segments = [1, 2, 3, 4, 9], [Segment("model", [6, 7, 8], [-0.5] * 3)]
    one = trajectory([1, 2], ("model", [5]), group=0)
    config = load_config([], ["grpo.advantage_norm=none"])
    batch = build_batch([two, one], [1.0, 0.0], config, pad_id=0)
    assert batch["trajectory"].tolist() == [0, 0, 1] and trajectory_rows(batch) == [[0, 1], [2]]
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 0, 0, 0, 0], [1, 2, 3, 4, 9, 6, 7, 8], [1, 2, 5, 0, 0, 0, 0, 0]]
    assert batch["loss_mask"].tolist() == [[0, 0, 1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 1, 0, 0, 0, 0, 0]]
    assert batch["sequence_advantages"].tolist() == [0.5, 0.5, -0.5]  # reward minus the group mean
    assert batch["trajectory_tokens"].tolist() == [5, 5, 1]
    # turn 0 (+0.5) and turn 1 (-1.0, in the second sequence) are both after turn 0's tokens
    assert batch["advantages"][0, 2:4].tolist() == [0.5 + 0.5 - 1.0] * 2
    assert batch["advantages"][1, 5:8].tolist() == [0.5 - 1.0] * 3
    from collections import Counter

    scored = ScoredBatch(totals=[1.0, 0.0], components=[{}, {}], correct=[None, None], errors=Counter(),
                         applied=Counter())
    [record] = trajectory_records([two, one], step=1, kind="train", scored=scored, row_samples=[None, None],
                                  tokenizer=load_tokenizer(default_model_dir), rows=[0], batch_rows=trajectory_rows(batch),
                                  advantages=batch["sequence_advantages"], token_advantages=batch["advantages"])
    first, second = record["sequences"]
    assert first["token_ids"] == [1, 2, 3, 4] and second["token_ids"] == [1, 2, 3, 4, 9, 6, 7, 8]
    assert first["turn"] == [-1, -1, 0, 0] and second["turn"][5:] == [1, 1, 1]
    assert second["advantage"][5:] == [-0.5] * 3 and record["advantage"] == 0.5 and record["num_turns"] == 2


def test_images_over_several_sequences_are_refused_with_the_reason():
    from rlfactory_core.errors import ModelError
    from rlfactory_core.types import Message, TokenSequence

    t = trajectory([1, 2], ("model", [3]), group=0)
    t.messages = [Message("user", "look", images=[b"png"])]
    t.earlier_sequences = [TokenSequence([1], [])]
    with pytest.raises(ModelError, match="several token sequences"):
        build_batch([t], [1.0], load_config([], []), pad_id=0, processor=object())


def _micro(ids, attention, mask):
    from tensordict import TensorDict

    return TensorDict({"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(attention),
                       "loss_mask": torch.tensor(mask)}, batch_size=[len(ids)])


@pytest.mark.parametrize("packed", [False, True])
def test_token_logprobs_match_a_plain_forward_pass(packed):
    model = tiny_model()
    micro = _micro([[5, 6, 7, 8, 9], [5, 6, 7, 0, 0], [9, 8, 7, 6, 0]],
                   [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]],
                   [[0, 0, 1, 1, 1], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0]])
    with torch.no_grad():
        logprobs, entropy = token_logprobs(model, micro, bf16=False, entropy=True, packed=packed)
        for row, length in enumerate([5, 3, 4]):  # each trajectory alone, no padding
            ids = micro["input_ids"][row, :length]
            full = torch.log_softmax(model(input_ids=ids[None]).logits.float(), -1)[0]
            for t in range(1, length):
                if micro["loss_mask"][row, t]:
                    assert abs(float(logprobs[row, t]) - float(full[t - 1, ids[t]])) < 1e-5
    assert float(logprobs[0, 0]) == 0 and float(logprobs[1, 3]) == 0  # unmasked positions stay 0
    assert bool((entropy[micro["loss_mask"].bool()] > 0).all())
    assert bool((entropy[~micro["loss_mask"].bool()] == 0).all())


@pytest.mark.parametrize("temperature", [0.7, 1.0, 0.0])
async def test_trainer_logprobs_are_the_samplers_at_its_temperature(temperature):
    """The ratio, the KL and ``train/sampler_*`` compare the trainer's logprobs with the
    sampler's: both must be the distribution the tokens were drawn from, softmax(logits / T)
    (raw logits when greedy). Checked against the real hf backend's sampled tokens."""
    import copy

    from rlfactory_core.rollout import SamplingParams
    from rlfactory_core.rollout.backends.hf import HFBackend

    model = tiny_model(vocab_size=64, seed=3).eval()
    backend = HFBackend(copy.deepcopy(model), max_batch_size=4)
    prompt = [5, 9, 11, 2, 7]
    try:
        generated = await backend.generate(prompt, SamplingParams(temperature=temperature, max_tokens=12, seed=7))
    finally:
        await backend.close()
    ids = prompt + generated.token_ids
    micro = _micro([ids], [[1] * len(ids)], [[0] * len(prompt) + [1] * len(generated.token_ids)])
    with torch.no_grad():
        logprobs, _ = token_logprobs(model, micro, bf16=False, entropy=False, temperature=temperature)
        unscaled, _ = token_logprobs(model, micro, bf16=False, entropy=False)
    ours = logprobs[0, len(prompt):]
    torch.testing.assert_close(ours, torch.tensor(generated.logprobs), atol=1e-4, rtol=0)
    if temperature not in (0.0, 1.0):  # the distribution at T=1 is not the one that sampled
        assert (unscaled[0, len(prompt):] - ours).abs().max() > 1e-2


def test_packing_is_auto_on_only_with_flash_attention():
    auto, on, off = (load_config([], [f"grpo.packing={v}"]) for v in ("auto", "on", "off"))
    assert use_packing(auto, "flash_attention_2") and not use_packing(auto, "sdpa")
    assert use_packing(on, "sdpa") and not use_packing(off, "flash_attention_2")


def test_a_model_without_sdpa_trains_on_its_own_attention_and_an_unsupported_choice_is_refused(tmp_path,
                                                                                                   default_model_dir):
    """gpt-oss's attention sinks exist only in its eager (and flash/flex) attention: transformers'
    sdpa path drops them without a word. ``auto`` picks eager for it, so the trainer's logprobs
    are the model's own; asking for sdpa is refused at load."""
    from rlfactory_core.testing import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "gpt-oss", default_model_dir, hidden_size=64, architecture="gpt_oss")
    config = load_config([], ["train.device=cpu", "train.bf16=false"])
    policy = load_policy(config, model_dir, torch.device("cpu"))
    assert policy.config._attn_implementation == "eager"
    with torch.no_grad():  # sinks far from zero, so dropping them shows
        for module in policy.modules():
            if hasattr(module, "sinks"):
                module.sinks.copy_(torch.linspace(-2.0, 3.0, module.sinks.numel()))
    ids = torch.randint(5, 1000, (1, 40))
    micro = _micro(ids.tolist(), [[1] * 40], [[0] * 8 + [1] * 32])
    with torch.no_grad():
        expected = torch.log_softmax(policy(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
        ours, _ = token_logprobs(policy, micro, bf16=False, entropy=False, packed=False)
        policy.config._attn_implementation = "sdpa"  # what auto picked before: the sinks are gone
        without_sinks, _ = token_logprobs(policy, micro, bf16=False, entropy=False, packed=False)
    assert torch.allclose(ours[0, 8:], expected[7:], atol=1e-5)
    assert (without_sinks - ours)[0, 8:].abs().max() > 1e-2
    llama_policy = load_policy(config, default_model_dir, torch.device("cpu"))
    assert llama_policy.config._attn_implementation == "sdpa"
    # gpt-oss's causal mask ignores restarting positions: packing would join trajectories
    on, auto = (load_config([], [f"grpo.packing={choice}"]) for choice in ("on", "auto"))
    assert not packing_is_exact(policy) and packing_is_exact(llama_policy)
    assert use_packing(on, "sdpa", llama_policy) and not use_packing(auto, "eager", policy)
    with pytest.raises(ConfigError, match=r"grpo.packing=on: GptOssForCausalLM lets packed trajectories attend"):
        use_packing(on, "eager", policy)
    with pytest.raises(ConfigError, match=r"model.attn_implementation=sdpa: GptOssForCausalLM does not support it"):
        load_policy(load_config([], ["train.device=cpu", "model.attn_implementation=sdpa"]), model_dir,
                    torch.device("cpu"))


def _has_flash_attention():
    import importlib.util

    return torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None


@pytest.mark.slow
@pytest.mark.skipif(not _has_flash_attention(), reason="needs a CUDA GPU with flash-attn (the gpu extra)")
def test_flash_attention_varlen_packing_matches_padding_on_gpu(default_model_dir):
    from rlfactory_core.models import load_model

    device = torch.device("cuda")
    config = load_config([], ["train.device=cuda", "grpo.packing=auto"])
    assert attn_implementation(config, device) == "flash_attention_2"
    assert use_packing(config, "flash_attention_2")
    model = load_model(default_model_dir, dtype="bfloat16", device=device)
    model.config._attn_implementation = "flash_attention_2"
    torch.manual_seed(0)
    lengths = torch.tensor([300, 120, 257, 64])
    width = int(lengths.max())
    attention = (torch.arange(width)[None] < lengths[:, None]).long()
    micro = _micro((torch.randint(100, 40_000, (4, width)) * attention).tolist(), attention.tolist(),
                   (attention * (torch.arange(width)[None] >= 32)).tolist())
    with torch.no_grad():
        padded, _ = token_logprobs(model, micro, bf16=True, entropy=False, packed=False)
        packed, _ = token_logprobs(model, micro, bf16=True, entropy=False, packed=True)
    scored = micro["loss_mask"].bool().to(device)
    assert (padded - packed)[scored].abs().mean() < 0.05  # bf16: the layouts round differently


def _batch_for(model, config):
    trajectories = [trajectory([1, 2, 3], ("model", [4 + i, 5]), ("observation", [6]), ("model", [7, 8 + i]),
                               group=i // 2) for i in range(4)]
    return build_batch(trajectories, [1.0, 0.0, 0.0, 1.0], config, pad_id=0)


def _gradients(micro_batch_tokens, loss_agg, packed=False):
    config = load_config([], [f"grpo.micro_batch_tokens={micro_batch_tokens}", f"grpo.loss_agg={loss_agg}",
                              "grpo.group_size=2", "train.bf16=false"])
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: keep the weights, read the gradients
    stats = update_policy(model, None, optimizer, _batch_for(model, config), config, packed=packed)
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]), stats


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"])
def test_gradient_accumulation_and_packing_do_not_change_the_gradient(loss_agg):
    whole, stats = _gradients(4096, loss_agg)
    split, _ = _gradients(64, loss_agg)  # one trajectory per micro-batch
    packed, packed_stats = _gradients(4096, loss_agg, packed=True)  # all four in one row, no padding
    assert torch.allclose(whole, split, atol=1e-6)
    assert torch.allclose(whole, packed, atol=1e-6)
    assert whole.abs().sum() > 0
    assert stats["train/clip_fraction"] == 0.0 and abs(stats["train/ratio_mean"] - 1.0) < 1e-6
    assert packed_stats["train/trained_tokens"] == stats["train/trained_tokens"]


def test_an_update_moves_the_policy_toward_rewarded_tokens():
    config = load_config([], ["grpo.group_size=2", "train.bf16=false", "train.lr=0.05"])
    model = tiny_model()
    batch = _batch_for(model, config)
    before = batch_logprobs(model, batch, [0, 1], config, packed=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    for _ in range(3):
        update_policy(model, None, optimizer, batch, config)
    after = batch_logprobs(model, batch, [0, 1], config, packed=True)
    mask = batch["loss_mask"][:2].bool()
    # trajectory 0 was rewarded (advantage > 0), trajectory 1 was not
    assert (after[0][mask[0]] - before[0][mask[0]]).sum() > 0
    assert (after[1][mask[1]] - before[1][mask[1]]).sum() < 0


def test_a_batch_with_nothing_to_learn_leaves_the_weights_alone():
    """All advantages zero (every group constant, or masked): no optimizer step, though Adam
    carries momentum from the step before (which would move every weight again)."""
    config = load_config([], ["grpo.group_size=2", "train.bf16=false"])
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    learned = update_policy(model, None, optimizer, _batch_for(model, config), config)
    assert learned["train/optimizer_steps"] == 1
    before = [p.detach().clone() for p in model.parameters()]
    flat = _batch_for(model, config)
    flat["advantages"] = torch.zeros_like(flat["advantages"])
    stats = update_policy(model, None, optimizer, flat, config)
    assert stats["train/optimizer_steps"] == 0 and stats["train/grad_norm"] == 0.0
    assert stats["train/loss"] == 0.0 and stats["train/trained_tokens"] > 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with_kl = load_config([], ["grpo.group_size=2", "train.bf16=false", "grpo.kl_coef=0.1"])
    stats = update_policy(model, FrozenReference(tiny_model(seed=1)), optimizer, flat, with_kl)
    assert stats["train/optimizer_steps"] == 1  # the KL term still has a gradient


def test_multi_epoch_updates_use_recomputed_old_logprobs_and_kl():
    config = load_config([], ["grpo.group_size=2", "train.bf16=false", "grpo.epochs=2", "grpo.mini_batches=2",
                              "grpo.kl_coef=0.1", "grpo.tis_cap=2.0"])
    model, reference = tiny_model(), tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    stats = update_policy(model, FrozenReference(reference), optimizer, _batch_for(model, config), config)
    assert stats["train/optimizer_steps"] == 4
    assert stats["train/kl"] > 0  # later mini-batches run on a policy that moved away
    assert "train/tis_weight_mean" in stats and stats["train/sampler_logprob_diff"] > 0


def test_a_checkpoint_the_disk_has_no_room_for_says_so_and_leaves_nothing_half_written(
        tmp_path, default_model_dir, monkeypatch):
    """Disk full (faked at torch.save: we cannot fill this machine's disk in a test): one line
    naming the cause and what to do, not "a bug in rlfactory"; no half checkpoint left; the
    previous checkpoint still the latest."""
    import errno

    from rlfactory_core.errors import RLFactoryError

    tokenizer = load_tokenizer(default_model_dir)
    model = tiny_model(vocab_size=len(tokenizer))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    save = dict(model=model, tokenizer=tokenizer, optimizer=optimizer, scheduler=scheduler, state={"position": 0},
                config={"env": "arithmetic"})
    save_checkpoint(tmp_path, 1, **save)

    def no_room(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", no_room)
    with pytest.raises(RLFactoryError, match=r"checkpoint step-000002 could not be written: the disk .* is full"):
        save_checkpoint(tmp_path, 2, **save)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step-000001"]
    assert latest_checkpoint(tmp_path).name == "step-000001"


def test_checkpoints_are_atomic_pruned_and_restore_state(tmp_path, default_model_dir):
    tokenizer = load_tokenizer(default_model_dir)
    model = tiny_model(vocab_size=len(tokenizer))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    leftover = tmp_path / "checkpoints" / ".tmp-step-000009"
    leftover.mkdir(parents=True)  # an interrupted save
    for step in (1, 2, 3):
        torch.manual_seed(step)
        save_checkpoint(tmp_path, step, model=model, tokenizer=tokenizer, optimizer=optimizer,
                        scheduler=scheduler, state={"position": step * 8}, config={"env": "arithmetic"}, keep=2)
    assert not leftover.exists()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000002", "step-000003"]
    newest = latest_checkpoint(tmp_path)
    assert newest.name == "step-000003"
    restored = torch.optim.AdamW(tiny_model(vocab_size=len(tokenizer)).parameters(), lr=1e-3)
    state = load_checkpoint(newest, optimizer=restored,
                            scheduler=torch.optim.lr_scheduler.LambdaLR(restored, lambda s: 1.0))
    assert state == {"step": 3, "position": 24}
    assert restored.state_dict()["state"][0]["exp_avg"].shape == optimizer.state_dict()["state"][0]["exp_avg"].shape
    loaded = AutoModelForCausalLM.from_pretrained(newest / "model")  # HF format, safetensors
    assert (newest / "model" / "model.safetensors").is_file()
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name

    # the same step saved again replaces it; a save killed between moving the old copy aside
    # and renaming the new one into place loses nothing: the old copy goes back
    save_checkpoint(tmp_path, 3, model=model, tokenizer=tokenizer, optimizer=optimizer, scheduler=scheduler,
                    state={"position": 25}, config={"env": "arithmetic"}, keep=2)
    assert json.loads((newest / "state.json").read_text())["position"] == 25
    assert not list((tmp_path / "checkpoints").glob(".old-*"))
    aside = tmp_path / "checkpoints" / ".old-step-000003"
    newest.rename(aside)
    assert latest_checkpoint(tmp_path) == aside  # readers find the complete copy and leave it be
    assert aside.is_dir() and not newest.exists()
    save_checkpoint(tmp_path, 4, model=model, tokenizer=tokenizer, optimizer=optimizer, scheduler=scheduler,
                    state={"position": 32}, config={"env": "arithmetic"}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000003", "step-000004"]  # put back
    assert not aside.exists()

    # a reader never touches a save in progress (rlf eval or a resume check beside a run)
    in_progress = tmp_path / "checkpoints" / ".tmp-step-000005"
    in_progress.mkdir()
    assert latest_checkpoint(tmp_path).name == "step-000004" and in_progress.is_dir()


def test_rng_state_is_restored(tmp_path, default_model_dir):
    tokenizer = load_tokenizer(default_model_dir)
    model = tiny_model(vocab_size=len(tokenizer))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    torch.manual_seed(123)
    save_checkpoint(tmp_path, 1, model=model, tokenizer=tokenizer, optimizer=optimizer, scheduler=scheduler,
                    state={"position": 0}, config={})
    expected = torch.rand(3)
    torch.manual_seed(999)
    load_checkpoint(latest_checkpoint(tmp_path), optimizer=optimizer, scheduler=scheduler)
    assert torch.equal(torch.rand(3), expected)


def test_no_checkpoint_to_resume_is_a_clear_error(tmp_path):
    config = load_config([], [f"run_dir={tmp_path}"])
    with pytest.raises(Exception, match="has no checkpoint to resume from"):
        train(config, resume=tmp_path)


# --------------------------------------------------------------------------- whole runs

SMALL_RUN = ["backend=hf", "grpo.prompts_per_step=2", "grpo.group_size=2", "data.eval_size=4",
             "eval.every=1", "eval.save_samples=2", "checkpoint.every=1", "rollout.max_turns=2",
             "rollout.max_tokens_per_turn=40", "rollout.sampling.temperature=0.7", "logging.live=off"]


def _rlf(*args, env=None, **kwargs):
    return subprocess.run([sys.executable, "-m", "rlfactory_cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, **kwargs)


class Observer:
    def __init__(self):
        self.calls = []

    @hookimpl
    def rlfactory_on_train_start(self, config):
        self.calls.append(("start", config.env))

    @hookimpl
    def rlfactory_on_train_step_end(self, step, metrics):
        self.calls.append(("step", step, "reward/mean" in metrics))

    @hookimpl
    def rlfactory_on_train_end(self, step, metrics):
        self.calls.append(("end", step, "train/loss" in metrics))


@pytest.mark.slow
def test_a_short_run_writes_metrics_checkpoints_samples_and_resumes(tmp_path, tiny_model_dir):
    # the mechanics of a run, not learning: a tiny model with the default model's tokenizer
    run_dir = tmp_path / "run"
    config = load_config([], [*SMALL_RUN, f"model.name={tiny_model_dir}", "train.steps=2", f"run_dir={run_dir}"])
    observer = Observer()
    with registered_plugin(observer, "observer"):
        assert train(config) == run_dir
    assert observer.calls == [("start", "arithmetic"), ("step", 1, True), ("step", 2, True), ("end", 2, True)]
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [0, 1, 2]
    step = records[1]
    for key in ("reward/mean", "reward/std", "reward/accuracy", "reward/exact_match", "advantage/mean",
                "advantage/std", "train/loss", "train/kl", "train/entropy", "train/clip_fraction", "train/grad_norm",
                "train/lr", "rollout/model_tokens_mean", "rollout/total_tokens_mean", "rollout/turns_mean",
                "tools/calls_per_trajectory", "tools/error_rate", "time/rollout", "time/reward", "time/train",
                "time/weight_sync", "weight_sync/pause_s", "time/step", "time/generation_per_trajectory",
                "time/tools_per_trajectory",
                "eval/reward/mean", "eval/reward/accuracy", "train/sampler_logprob_diff"):
        assert key in step, key
    assert any(k.startswith("rollout/stop/") for k in step)
    # every trajectory classified (the tiny model fails nothing of the services'): shares sum to 1
    for prefix in ("outcome", "eval/outcome"):
        shares = {k: v for k, v in step.items() if k.startswith(f"{prefix}/") and k.count("/") == prefix.count("/") + 1
                  and k.rsplit("/", 1)[1] in OUTCOMES}
        assert shares and sum(shares.values()) == pytest.approx(1.0) and step[f"{prefix}/infrastructure"] == 0.0
    assert len(step["samples"]) == 2
    assert (run_dir / "config.yaml").is_file() and (run_dir / "plugins.yaml").is_file()
    assert list((run_dir / "tensorboard").glob("events.*"))
    sample_lines = (run_dir / "samples" / "step-000002.jsonl").read_text().splitlines()
    assert len(sample_lines) == 2 and "<|im_start|>assistant" in json.loads(sample_lines[0])["text"]
    assert latest_checkpoint(run_dir).name == "step-000002"
    # recorded token by token (rlfactory_core.records): all eval trajectories every eval, the
    # first logging.record_train_groups (2) whole groups of each step with the update's logprobs
    recorded = RunRecords(run_dir)
    assert recorded.steps("eval") == [0, 1, 2] and recorded.steps("train") == [1, 2]
    assert len(recorded.list("eval", 2)) == 4 and len(recorded.list("train", 1)) == 4
    one = recorded.trajectory("train", 1, 0)
    sequence = one["sequences"][0]
    model_at = [i for i, m in enumerate(sequence["loss_mask"]) if m]
    assert model_at and one["policy_version"] == 0 and one["advantage"] is not None
    # the trainer scored the sampled tokens of the same weights: near the sampler's logprobs
    assert all(abs(sequence["trainer_logprob"][i] - sequence["sampler_logprob"][i]) < 0.05 for i in model_at)

    # policy versions as the backend reported them: step k trains on tokens of the weights after
    # k - 1 updates, the eval after step k sees k updates; the checkpoint keeps the count
    assert _versions(recorded, "train") == {1: {0}, 2: {1}} and _versions(recorded, "eval") == {0: {0}, 1: {1}, 2: {2}}
    assert json.loads((latest_checkpoint(run_dir) / "state.json").read_text())["policy_version"] == 2

    # the same run, continued: two more steps, the data order of an uninterrupted run
    longer = load_config([run_dir / "config.yaml"], ["train.steps=4"])
    train(longer, resume=run_dir)
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    recorded = RunRecords(run_dir)
    assert _versions(recorded, "train") == {1: {0}, 2: {1}, 3: {2}, 4: {3}}  # counted on from the checkpoint
    assert _versions(recorded, "eval")[4] == {4}
    train_ids = [s["id"] for s in load_samples(longer, _env(), "train", None)]
    expected = batch_indices(len(train_ids), 8, seed=longer.train.seed, position=0)
    logged = [sid for r in records[1:] for sid in r["samples"]]
    assert logged == [train_ids[i] for i in expected]


def test_a_run_that_fails_after_its_engine_started_still_closes_it(tmp_path, tiny_model_dir, monkeypatch):
    """Between the engine's start and the first step (the metrics writers, the live view): a
    failure there closes the engine and its backends (a vLLM process or tool servers would be
    left behind) and the run's status says it failed."""
    from rlfactory_core import run as run_module
    from rlfactory_core.run_status import read_status

    def broken_logger(*args, **kwargs):
        raise OSError("no space left on device (tensorboard)")

    monkeypatch.setattr(run_module, "MetricsLogger", broken_logger)
    backend = ScriptedBackend(load_tokenizer(tiny_model_dir), lambda text: "4")
    run_dir = tmp_path / "run"
    with scripted_backend(backend), pytest.raises(OSError, match="no space left"):
        train(load_config([], [*SMALL_RUN, f"model.name={tiny_model_dir}", "train.steps=1", f"run_dir={run_dir}"]))
    assert backend.closed
    assert read_status(run_dir).state == "failed" and "no space left" in read_status(run_dir).message


def _versions(recorded, kind):
    """``{step: the policy versions of its recorded model tokens}``."""
    out = {}
    for step in recorded.steps(kind):
        for row in recorded.list(kind, step):
            sequence = recorded.trajectory(kind, step, row["index"])["sequences"][0]
            out.setdefault(step, set()).update(v for v, m in zip(sequence["policy_version"], sequence["segment"])
                                               if m == MODEL)
    return out


def _env():
    from rlfactory_arithmetic import ArithmeticEnv

    return ArithmeticEnv()


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_last_checkpoint(tmp_path, tiny_model_dir):
    # the mechanics of a kill, not learning: the tiny model, enough steps that the kill lands mid-run
    run_dir = tmp_path / "run"
    steps = 6
    args = ["train", "--env", "arithmetic", "--run-dir", str(run_dir), *SMALL_RUN, f"train.steps={steps}",
            f"model.name={tiny_model_dir}", "eval.every=0", "logging.tensorboard=false"]
    log = tmp_path / "train.log"
    with open(log, "w") as out:  # a file, not a pipe: a full pipe nobody reads would block the run
        process = subprocess.Popen([sys.executable, "-m", "rlfactory_cli", *args], stdout=out,
                                   stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 600
        while time.time() < deadline and latest_checkpoint(run_dir) is None and process.poll() is None:
            time.sleep(0.05)
        assert latest_checkpoint(run_dir) is not None, log.read_text()[-2000:]
    finally:
        process.send_signal(signal.SIGKILL)  # no chance to clean up: mid-step, mid-anything
        process.wait()
    saved = int(json.loads((latest_checkpoint(run_dir) / "state.json").read_text())["step"])
    assert saved < steps
    result = _rlf("train", "--resume", str(run_dir), timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(steps + 1))  # nothing repeated, nothing missing
    assert latest_checkpoint(run_dir).name == f"step-{steps:06d}"


def test_a_run_killed_between_its_checkpoint_and_its_metrics_line_keeps_that_steps_metrics(tmp_path,
                                                                                           tiny_model_dir):
    """The checkpoint carries its step's metrics: a kill after the checkpoint was written and
    before the metrics line (the race the killed-run test above can land in) loses nothing."""
    run_dir = tmp_path / "run"
    overrides = ["env=arithmetic", *SMALL_RUN, f"model.name={tiny_model_dir}", "eval.every=0",
                 "logging.tensorboard=false", f"run_dir={run_dir}"]
    train(load_config([], [*overrides, "train.steps=2"]))
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    lost = json.loads(lines[-1])
    assert lost["step"] == 2
    (run_dir / "metrics.jsonl").write_text("".join(line + "\n" for line in lines[:-1]))  # as if killed there
    train(load_config([], [*overrides, "train.steps=3"]), resume=run_dir)
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    restored = records[2]
    assert restored["samples"] == lost["samples"] and restored["reward/mean"] == lost["reward/mean"]
    assert "time/checkpoint" not in restored  # measured after the checkpoint was written: not in it


def test_cli_reports_config_errors_all_at_once(rlf):
    code, out, err = rlf("train", "--env", "arithmetic", "train.lr=-1", "grpo.group_size=1", "bogus.key=3")
    assert code == 1
    text = out + err
    assert "train.lr" in text and "grpo.group_size" in text and "bogus: unknown key" in text


def test_cli_help_config_lists_the_keys(rlf):
    code, out, _ = rlf("train", "--help-config")
    assert code == 0
    assert "grpo.clip_high" in out and "cpu-smoke" in out


def test_lora_weights_reach_the_backend_merged_under_hf_names(tmp_path, default_model_dir):
    peft = pytest.importorskip("peft")
    base = tiny_model()
    names = set(base.state_dict())
    model = peft.get_peft_model(base, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.fill_(0.1)  # B starts at 0; make the adapter change something
    weights = dict(weights_for_backend(model))
    assert set(weights) == names
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    expected = layer.base_layer.weight + (layer.lora_B["default"].weight @ layer.lora_A["default"].weight) * 2.0
    assert torch.allclose(weights["model.layers.0.self_attn.q_proj.weight"], expected, atol=1e-6)
    assert not torch.allclose(weights["model.layers.0.self_attn.q_proj.weight"], layer.base_layer.weight)
    # merging for the backend leaves the trained model as it was
    assert torch.equal(layer.base_layer.weight, base.model.layers[0].self_attn.q_proj.base_layer.weight)
    x = torch.tensor([[1, 2, 3]])
    before = model(input_ids=x).logits
    weights_for_backend(model)
    assert torch.allclose(model(input_ids=x).logits, before)

    # a checkpoint holds the adapter (to resume) and the merged model (to serve)
    tokenizer = load_tokenizer(default_model_dir)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    path = save_checkpoint(tmp_path, 1, model=model, tokenizer=tokenizer, optimizer=optimizer,
                           scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
                           state={"position": 0}, config={})
    assert (path / "adapter" / "adapter_config.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(path / "model")
    assert torch.allclose(merged.state_dict()["model.layers.0.self_attn.q_proj.weight"],
                          weights["model.layers.0.self_attn.q_proj.weight"], atol=1e-6)


@pytest.mark.slow
def test_a_lora_run_trains_adapters_syncs_merged_weights_and_resumes(tmp_path, monkeypatch, tiny_model_dir):
    pytest.importorskip("peft")
    from safetensors.torch import load_file

    backends = []
    make_backend = backend_for
    monkeypatch.setattr(local_engine, "backend_for", lambda *a, **kw: backends.append(make_backend(*a, **kw)) or backends[-1])
    trainer_weights = []  # what each push compared: the policy with its adapters merged
    merged_weights = local_engine.weights_for_backend
    monkeypatch.setattr(local_engine, "weights_for_backend",
                        lambda policy: trainer_weights.append(dict(merged_weights(policy))) or trainer_weights[-1].items())
    run_dir = tmp_path / "run"
    # a tiny random model earns equal rewards (no advantage): the entropy bonus still moves the adapters
    lora = ["model.lora.enabled=true", "model.lora.r=4", "train.lr=1e-3", "grpo.kl_coef=0.05", "eval.every=0",
            "grpo.entropy_coef=0.01", f"model.name={tiny_model_dir}"]
    train(load_config([], [*SMALL_RUN, *lora, "train.steps=2", f"run_dir={run_dir}"]))
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[2]["train/kl"] > 0  # the reference is the model with its adapters off

    checkpoint = latest_checkpoint(run_dir)
    assert (checkpoint / "adapter" / "adapter_config.json").is_file()
    merged = load_file(checkpoint / "model" / "model.safetensors")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert set(merged) <= set(base)  # plain HF names, loadable by transformers and vLLM
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(merged[name], base[name])  # the adapters were trained and merged in
    # the generation backend got the same merged weights in place after the last step
    served = backends[0]._model.state_dict()
    assert torch.allclose(served[name].float(), merged[name].float(), atol=1e-5)
    # LoRA pushes only what changed (train.weight_push=auto): the first push everything, the
    # second the adapted modules; the sampler then holds the trainer's weights bit for bit
    assert records[1]["weight_sync/sent_share"] == 1.0 and 0 < records[2]["weight_sync/sent_share"] < 1
    assert set(trainer_weights[-1]) == set(served)
    for key, tensor in trainer_weights[-1].items():
        assert torch.equal(served[key], tensor.to(served[key].dtype)), key

    train(load_config([run_dir / "config.yaml"], ["train.steps=3"]), resume=run_dir)
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1, 2, 3]
    assert (latest_checkpoint(run_dir) / "adapter").is_dir()


@pytest.mark.slow
def test_rlf_eval_reports_accuracy_and_tool_use(tmp_path, tiny_model_dir):
    # the mechanics of `rlf eval` (the CLI, the report, the samples), not the model's skill
    report = tmp_path / "report"
    result = _rlf("eval", "--env", "arithmetic", "--model", str(tiny_model_dir), "--size", "4",
                  "--report", str(report), "backend=hf", "rollout.max_turns=2", "rollout.max_tokens_per_turn=40",
                  timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "reward/accuracy" in result.stdout and "tools/calls_per_trajectory" in result.stdout
    data = json.loads((report / "report.json").read_text())
    assert data["samples"] == 4 and data["split"] == "test"
    assert 0.0 <= data["metrics"]["eval/reward/accuracy"] <= 1.0
    assert len((report / "samples" / "step-000000.jsonl").read_text().splitlines()) == 4


def test_rlf_eval_of_a_run_without_checkpoints_is_a_clear_error(tmp_path, rlf):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "config.yaml").write_text("env: arithmetic\n")
    code, out, err = rlf("eval", "--env", "arithmetic", "--model", str(tmp_path))
    assert code == 1 and "has no checkpoint yet" in out + err


def test_an_env_dataset_without_splits_is_refused_not_reused_for_eval():
    class NoSplits:
        def dataset(self, size=64):
            return [{"id": str(i)} for i in range(size)]

    config = load_config([], [])
    with pytest.raises(Exception, match="has no split"):
        load_samples(config, NoSplits(), "test", 4)


class _EnvWithExamples:
    """An env that writes tool calls into its prompt, so it takes the run's ``parser``."""

    name = "with_examples"
    description = "test env"

    def __init__(self, parser: str = "none"):
        self.parser_name = parser
        self.tools = [_NamedTool("lookup")]

    async def reset(self, sample): ...

    async def step(self, state, turn, results): ...

    async def close(self, state): ...


class _NamedTool:
    description, parameters = "a tool", {"type": "object", "properties": {}}

    def __init__(self, name):
        self.name = name

    async def call(self, arguments, ctx=None):
        return "ok"


class _SearchOnlyParser:
    name = "search_only"
    description = "presents only a tool named search"

    def render_system_prompt(self, system_prompt, tools):
        if any(tool.name != "search" for tool in tools):
            raise ValueError("only the search tool can be called in this format")
        return system_prompt

    def parse(self, text): ...

    def render_tool_results(self, results): ...


def test_an_env_that_takes_a_parser_gets_the_runs_and_a_parser_that_cannot_show_its_tools_is_refused():
    from rlfactory_core import hookimpl
    from rlfactory_core.testing import registered_plugin, train

    class Plugin:
        @hookimpl
        def rlfactory_register_envs(self, register):
            register(_EnvWithExamples)

        @hookimpl
        def rlfactory_register_parsers(self, register):
            register(_SearchOnlyParser())

    with registered_plugin(Plugin()):
        task = build_task(load_config([], ["env=with_examples"]))
        assert task.env.parser_name == "qwen3" and task.parser.name == "qwen3"
        with pytest.raises(ConfigError) as info:  # every unknown option at once
            build_task(load_config([], ["env=with_examples", "env_options={colour: red, size: 2}"]))
        assert info.value.errors == [f"env_options.{key}: the 'with_examples' env has no option {key!r} (its "
                                     f"options: parser)" for key in ("colour", "size")]
        with pytest.raises(ConfigError, match="env_options.parser is 'other' but the run's parser is 'qwen3'"):
            build_task(load_config([], ["env=with_examples", "env_options={parser: other}"]))
        with pytest.raises(ConfigError, match="parser: 'search_only' cannot show the model the 'with_examples' "
                                              "env's tools \\(ValueError: only the search tool"):
            build_task(load_config([], ["env=with_examples", "parser=search_only"]))


def test_auto_dtype_trains_float32_weights_even_from_a_bf16_checkpoint(tmp_path):
    """``model.dtype: auto`` keeps a checkpoint's dtype, often bf16: the trained weights are
    upcast, since bf16 rounds AdamW's small updates away."""
    tiny_model().to(torch.bfloat16).save_pretrained(tmp_path)
    config = load_config([], ["model.dtype=auto"])
    model = load_policy(config, tmp_path, torch.device("cpu"))
    assert {p.dtype for p in model.parameters()} == {torch.float32}


@pytest.mark.slow
def test_a_step_without_tool_calls_or_reward_differences_warns_and_its_run_evaluates(tmp_path, tiny_model_dir):
    """A random model calls no tool and earns 0 everywhere: both loud warnings are printed.
    Then ``rlf eval``'s function evaluates the run directory (its newest checkpoint), on the
    whole split unless a size is given."""
    import io

    from rich.console import Console

    run_dir = tmp_path / "run"
    config = load_config([], ["backend=hf", f"model.name={tiny_model_dir}", "grpo.prompts_per_step=1",
                              "grpo.group_size=2", "data.eval_size=2", "eval.every=0", "eval.save_samples=0",
                              "rollout.max_turns=1", "rollout.max_tokens_per_turn=8", "logging.live=off",
                              "logging.tensorboard=false", "train.steps=1", f"run_dir={run_dir}"])
    output = io.StringIO()
    train(config, console=Console(file=output, width=300))
    text = output.getvalue()
    assert "warning: step 1: the model made no tool call in 2 trajectories although the env offers tools" in text
    assert "warning: step 1: every group's rewards are constant (all 0)" in text
    step = read_metrics(run_dir)[1]
    assert step["rollout/tool_calls"] == 0 and step["reward/constant_groups"] == 1.0
    assert step["warnings/no_tool_call"] == step["warnings/constant_rewards"] == 1.0  # for rlf ui's markers

    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text("".join(json.dumps(row) + "\n" for row in _env().dataset(3, "test")))
    eval_config = load_config([run_dir / "config.yaml"], [f"data.eval_file={held_out}"])
    report = evaluate(eval_config, str(run_dir), report_dir=tmp_path / "report")
    assert report["model"] == str(run_dir / "checkpoints" / "step-000001" / "model")
    assert report["samples"] == 3  # the whole split, not data.eval_size (2)
    assert report["metrics"]["eval/reward/accuracy"] == 0.0
    assert json.loads((tmp_path / "report" / "report.json").read_text())["samples"] == 3
    assert evaluate(eval_config, str(run_dir), size=1)["samples"] == 1
