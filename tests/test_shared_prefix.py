"""``grpo.shared_prefix``: a group's common prompt computed once per micro-batch in the
update gives the unshared logprobs and gradients (to float rounding)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlfactory_core.config import load_config
from rlfactory_core.training.batch import build_batch, micro_batches, rows_of
from rlfactory_core.training.logprobs import MIN_SHARED_PREFIX, common_prefix_length, token_logprobs
from rlfactory_core.training.update import update_policy
from rlfactory_core.types import Segment, Trajectory

PROMPT = list(range(10, 10 + 40))  # 40 prompt tokens, above MIN_SHARED_PREFIX


def tiny_model(seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(config).float()
    model.config._attn_implementation = "sdpa"
    return model


def trajectory(prompt, group, answer_tokens, observation=(3, 4)):
    t = Trajectory(sample_id=f"s{group}", prompt_ids=list(prompt), group=group)
    first, second = answer_tokens[:2], answer_tokens[2:]
    t.segments.append(Segment("model", list(first), [-0.5] * len(first)))
    t.segments.append(Segment("observation", list(observation), None))
    t.segments.append(Segment("model", list(second), [-0.7] * len(second)))
    return t


def batch_of(config):
    # two groups of three with their own prompts; responses of different lengths (padding)
    trajectories = [trajectory(PROMPT, 0, [60 + i, 61, 62 + i, *range(70, 70 + i)]) for i in range(3)]
    trajectories += [trajectory(PROMPT[::-1], 1, [80, 81 + i, 82, 83 + 2 * i, *range(90, 90 + 2 * i)])
                     for i in range(3)]
    return build_batch(trajectories, [1.0, 0.0, 0.5, 0.0, 1.0, 0.0], config, pad_id=0)


def test_common_prefix_length():
    ids = torch.tensor([[1] * 20 + [2, 3], [1] * 20 + [2, 4], [1] * 20 + [5, 0]])
    mask = torch.tensor([[1] * 22, [1] * 22, [1] * 21 + [0]])
    assert common_prefix_length(ids, mask) == 20
    assert common_prefix_length(ids[:1], mask[:1]) == 0  # one row: nothing to share
    assert common_prefix_length(ids[:, 5:], mask[:, 5:]) == 0  # 15 < MIN_SHARED_PREFIX
    same = torch.ones((2, 30), dtype=torch.long)
    assert common_prefix_length(same, same) == 29  # the rows keep a token of their own
    assert MIN_SHARED_PREFIX == 16


def test_micro_batches_keep_each_prompt_together_within_the_budget():
    config = load_config([], ["grpo.group_size=3", "train.bf16=false"])
    batch = batch_of(config)
    rows = list(range(6))
    planned = micro_batches(rows, batch["lengths"], 4096, shared_prompts=batch)
    assert sorted(map(sorted, planned)) == [[0, 1, 2], [3, 4, 5]]
    # a budget of the prompt and two rows' rest: groups split, never mixed
    longest_rest = int(batch["lengths"].max()) - len(PROMPT)
    planned = micro_batches(rows, batch["lengths"], len(PROMPT) + 2 * longest_rest, shared_prompts=batch)
    assert all(set(m) <= {0, 1, 2} or set(m) <= {3, 4, 5} for m in planned) and len(planned) >= 3
    assert sorted(r for m in planned for r in m) == rows


def test_shared_logprobs_and_gradients_equal_the_unshared_ones():
    config = load_config([], ["grpo.group_size=3", "train.bf16=false"])
    batch = batch_of(config)
    micro = rows_of(batch, [0, 1, 2])
    assert common_prefix_length(micro["input_ids"], micro["attention_mask"]) >= len(PROMPT)
    results = {}
    for shared in (False, True):
        model = tiny_model()
        logprobs, _ = token_logprobs(model, micro, bf16=False, entropy=False, shared_prefix=shared,
                                     temperature=0.8)
        (logprobs * micro["advantages"]).sum().backward()
        results[shared] = logprobs.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])
    mask = micro["loss_mask"].bool()
    assert torch.allclose(results[True][0][mask], results[False][0][mask], atol=1e-5)
    assert (results[True][0][~mask] == 0).all()
    assert torch.allclose(results[True][1], results[False][1], rtol=1e-4, atol=1e-6)
    assert results[False][1].abs().sum() > 0


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_an_update_with_a_shared_prefix_is_the_unshared_update(kl_coef):
    from rlfactory_core.training.policy import FrozenReference

    weights, stats = {}, {}
    for shared in (False, True):
        config = load_config([], ["grpo.group_size=3", "train.bf16=false", f"grpo.shared_prefix={shared}",
                                  f"grpo.kl_coef={kl_coef}", "grpo.epochs=2"])
        model = tiny_model()
        reference = FrozenReference(tiny_model(seed=1)) if kl_coef else None
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # AdamW would blow up rounding noise
        # in near-zero gradients into full steps
        stats[shared] = update_policy(model, reference, optimizer, batch_of(config), config)
        weights[shared] = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert torch.allclose(weights[True], weights[False], rtol=1e-4, atol=1e-6)
    for key in ("train/loss", "train/grad_norm", "train/kl", "train/trained_tokens"):
        assert stats[True][key] == pytest.approx(stats[False][key], rel=1e-4, abs=1e-7), key


def test_micro_batches_count_a_common_prefix_once():
    lengths = [700, 720, 750]
    assert micro_batches([0, 1, 2], lengths, 2048) == [[0, 1], [2]]  # 3 x 750 padded is over the budget
    # with 600 tokens shared by every row: 600 + 3 x 150 fits
    assert micro_batches([0, 1, 2], lengths, 2048, common_prefix=600) == [[0, 1, 2]]
    assert micro_batches([0, 1, 2], lengths, 1000, common_prefix=600) == [[0, 1], [2]]  # 600 + 3 x 150 > 1000
    # packed micro-batches compute every token: the prefix is not counted once
    assert micro_batches([0, 1, 2], lengths, 2048, packed=True, common_prefix=600) == [[0, 1], [2]]


def test_the_cold_starts_warm_up_shares_the_system_prompt_of_different_samples_exactly():
    from rlfactory_core.training.cold_start import example_batch, supervised_update

    # three samples: the same 30-token system prompt, then questions and answers of their own
    system = list(range(10, 40))
    trajectories = [trajectory(system + [50 + i, 51 + i, 52], i, [60 + i, 61, 62, 63 + i]) for i in range(3)]
    weights, stats = {}, {}
    for shared in (False, True):
        # a budget of two rows' whole length: with the prompt shared, all three fit in one micro-batch
        config = load_config([], ["train.bf16=false", f"grpo.shared_prefix={shared}", "cold_start.epochs=1",
                                  "cold_start.batch_size=3", "grpo.micro_batch_tokens=64"])
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        stats[shared] = supervised_update(model, optimizer, example_batch(trajectories, 0), config)
        weights[shared] = torch.cat([p.detach().flatten() for p in model.parameters()])
    batch = example_batch(trajectories, 0)
    assert common_prefix_length(batch["input_ids"], batch["attention_mask"]) == len(system)
    assert torch.allclose(weights[True], weights[False], rtol=1e-4, atol=1e-6)
    assert stats[True]["cold_start/loss_start"] == pytest.approx(stats[False]["cold_start/loss_start"], rel=1e-5)
