"""GRPO's advantages and losses against values computed by hand."""

import math

import pytest
import torch

from rlfactory_core.training.grpo import (
    aggregate,
    decoupled_policy_loss,
    entropy_from_logits,
    group_advantages,
    kl_penalty,
    masked_mean,
    policy_loss,
    token_advantages,
    truncated_importance_weights,
)


def close(actual, expected, tol=1e-5):
    return torch.allclose(torch.as_tensor(actual, dtype=torch.float32),
                          torch.as_tensor(expected, dtype=torch.float32), atol=tol, rtol=0)


# Two groups of two: (1, 0) and (1, 1).
REWARDS = torch.tensor([1.0, 0.0, 1.0, 1.0])
GROUPS = [0, 0, 1, 1]


def test_group_advantages_scaled_by_group_std():
    # group 1: mean 0.5, sample std sqrt(0.5) = 0.70711 -> +-0.70711; group 2: all equal -> 0
    adv = group_advantages(REWARDS, GROUPS, "group")
    assert close(adv, [0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5), 0.0, 0.0], 1e-4)


def test_group_advantages_scaled_by_batch_std():
    # batch std of (1, 0, 1, 1): mean 0.75, var = (3 * 0.0625 + 0.5625) / 3 = 0.25 -> std 0.5
    adv = group_advantages(REWARDS, GROUPS, "batch")
    assert close(adv, [1.0, -1.0, 0.0, 0.0], 1e-4)


def test_group_advantages_unscaled_is_dr_grpo():
    assert close(group_advantages(REWARDS, GROUPS, "none"), [0.5, -0.5, 0.0, 0.0])


def test_group_of_three_by_hand():
    # rewards (3, 0, 0): mean 1, deviations (2, -1, -1), sample std sqrt((4+1+1)/2) = sqrt(3)
    adv = group_advantages(torch.tensor([3.0, 0.0, 0.0]), [5, 5, 5], "group")
    assert close(adv, [2 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)], 1e-4)


def test_groups_are_data_not_positions_and_may_differ_in_size():
    # the rows of a group need not be adjacent: (1, 1) in rows 0 and 2, (0, 1, 2) in rows 1, 3, 4;
    # group 7 lost two of its trajectories (failures): one left, advantage 0
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 2.0, 5.0])
    adv = group_advantages(rewards, [3, 4, 3, 4, 4, 7], "group")
    # group 4: mean 1, deviations (-1, 0, 1), sample std 1
    assert close(adv, [0.0, -1.0, 0.0, 0.0, 1.0, 0.0], 1e-4)
    assert close(group_advantages(rewards, [3, 4, 3, 4, 4, 7], "none"), [0.0, -1.0, 0.0, 0.0, 1.0, 0.0])


def test_masked_failures_move_no_baseline_by_hand():
    """A group of four (1, 0, 0, 0) whose third member timed out (its 0 is no verdict): left
    out, the group is (1, 0, 0): mean 1/3, deviations (2/3, -1/3, -1/3), sample std
    sqrt((4/9 + 1/9 + 1/9) / 2) = sqrt(1/3); the masked row gets 0. Kept in, the timeout
    would have lowered the mean to 1/4 and raised the winner's advantage."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    include = [True, True, False, True]
    s = math.sqrt(1 / 3)
    assert close(group_advantages(rewards, [0] * 4, "group", include=include),
                 [(2 / 3) / s, (-1 / 3) / s, 0.0, (-1 / 3) / s], 1e-4)
    assert close(group_advantages(rewards, [0] * 4, "none", include=include), [2 / 3, -1 / 3, 0.0, -1 / 3])
    # the batch std is over the kept rows too: (1, 0, 0) and a second group (2, 4) with 4 masked
    # -> kept rewards (1, 0, 0, 2): mean 0.75, var = (0.0625 + 0.5625 * 2 + 1.5625) / 3 = 0.91667
    both = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 4.0]), [0, 0, 0, 0, 1, 1], "batch",
                            include=[True, True, False, True, True, False])
    std = math.sqrt((0.0625 + 0.5625 * 2 + 1.5625) / 3)
    assert close(both, [(2 / 3) / std, (-1 / 3) / std, 0.0, (-1 / 3) / std, 0.0, 0.0], 1e-4)
    # every member masked: nothing to learn from the group, nothing divides by zero
    assert close(group_advantages(rewards, [0] * 4, "group", include=[False] * 4), [0.0] * 4)
    with pytest.raises(ValueError, match="include must be 4 bools"):
        group_advantages(rewards, [0] * 4, include=[True])


def test_importance_weighted_advantages_by_hand():
    """A group (1, 0, 0) whose first member made the calls a flaky service failed most (weight 2;
    the others 1): weighted mean 2/4 = 0.5, deviations (0.5, -0.5, -0.5); V1 = 4, V2 = 6, weighted
    variance (2 * 0.25 + 0.25 + 0.25) / (4 - 6 / 4) = 0.4; each advantage times its weight over the
    group's mean weight 4/3: (1.5, 0.75, 0.75)."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 3.0, 1.0])
    groups, weights = [0, 0, 0, 1, 1], [2.0, 1.0, 1.0, 5.0, 5.0]
    std = math.sqrt(0.4)
    # group 1: equal weights are the plain advantages (mean 2, std sqrt(2), scale 1)
    want = [0.5 / std * 1.5, -0.5 / std * 0.75, -0.5 / std * 0.75, 1 / math.sqrt(2), -1 / math.sqrt(2)]
    assert close(group_advantages(rewards, groups, "group", weights=weights), want, 1e-4)
    assert close(group_advantages(rewards, groups, "none", weights=weights), [0.75, -0.375, -0.375, 1.0, -1.0])
    assert close(group_advantages(rewards, groups, "group", weights=[3.0] * 5), group_advantages(rewards, groups))
    # a masked member weighs nothing: the group is (1, 0) with weights (2, 1): mean 2/3,
    # deviations (1/3, -2/3), variance (2/9 + 4/9) / (3 - 5/3) = 0.5, scales (4/3, 2/3)
    masked = group_advantages(rewards, groups, "group", include=[True, True, False, True, True], weights=weights)
    assert close(masked[:3], [(1 / 3) / math.sqrt(0.5) * 4 / 3, (-2 / 3) / math.sqrt(0.5) * 2 / 3, 0.0], 1e-4)
    with pytest.raises(ValueError, match="weights must be 5 positive numbers"):
        group_advantages(rewards, groups, weights=[1.0, 0.0, 1.0, 1.0, 1.0])


def test_group_advantages_refuse_bad_groups_and_norms():
    with pytest.raises(ValueError, match="groups must be 4 integer group ids"):
        group_advantages(REWARDS, [0, 0, 1])
    with pytest.raises(ValueError, match="groups must be 4 integer group ids"):
        group_advantages(REWARDS, [0.0, 0.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="advantage norm"):
        group_advantages(REWARDS, GROUPS, "median")


def test_token_advantages_broadcast_over_model_tokens_only():
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1]])
    out = token_advantages(torch.tensor([2.0, -1.0]), mask)
    assert close(out, [[0, 2, 2, 0], [0, 0, -1, -1]])


def test_turn_rewards_are_summed_from_each_token_to_the_end():
    # turn 1 = tokens 1-2 (reward 0.5 on token 2), observation token 3, turn 2 = tokens 4-5
    # (reward -0.25 on token 5). Tokens of turn 1 get A + 0.5 - 0.25, turn 2 gets A - 0.25.
    mask = torch.tensor([[0, 1, 1, 0, 1, 1]])
    turn_rewards = torch.tensor([[0, 0, 0.5, 0, 0, -0.25]])
    out = token_advantages(torch.tensor([1.0]), mask, turn_rewards)
    assert close(out, [[0, 1.25, 1.25, 0, 0.75, 0.75]])


def test_policy_loss_by_hand():
    # token 1: ratio e^0.5 = 1.6487 > 1.28, A = +1 -> clipped: loss -1.28, clipped
    # token 2: ratio e^-0.5 = 0.6065 < 0.8,  A = +1 -> unclipped is smaller: loss -0.6065
    # token 3: ratio e^-0.5 = 0.6065 < 0.8,  A = -1 -> clipped: -min(-0.6065, -0.8) = 0.8, clipped
    # token 4: ratio 1, A = 2 -> loss -2; token 5 is masked
    logp = torch.tensor([[0.5, -0.5, -0.5, 0.0, 3.0]])
    old = torch.zeros_like(logp)
    adv = torch.tensor([[1.0, 1.0, -1.0, 2.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    loss, stats = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    assert close(loss[0, :4], [-1.28, -math.exp(-0.5), 0.8, -2.0], 1e-4)
    assert close(stats["clip_fraction"], 0.5)
    assert close(stats["ratio_mean"], (math.exp(0.5) + 2 * math.exp(-0.5) + 1) / 4, 1e-4)
    assert close(aggregate(loss, mask, "token_mean"), (-1.28 - math.exp(-0.5) + 0.8 - 2.0) / 4, 1e-4)


def test_policy_loss_gradient_vanishes_only_where_clipped():
    logp = torch.tensor([[0.5, 0.0]], requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros(1, 2), torch.tensor([[1.0, 1.0]]), torch.ones(1, 2))
    loss.sum().backward()
    # d/dlogp of -ratio*A = -ratio*A: 0 where clipped, -1 at ratio 1
    assert close(logp.grad, [[0.0, -1.0]])


def test_weights_scale_the_loss():
    loss, _ = policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2),
                          weights=torch.tensor([[0.5, 2.0]]))
    assert close(loss, [[-0.5, -2.0]])


def test_truncated_importance_weights():
    old = torch.tensor([0.0, 0.0, -1.0])
    sampler = torch.tensor([0.0, -1.0, 0.0])
    w = truncated_importance_weights(old, sampler, cap=2.0)
    # exp(0) = 1, exp(1) = 2.718 -> capped at 2, exp(-1) = 0.3679
    assert close(w, [1.0, 2.0, math.exp(-1)], 1e-4)
    assert not w.requires_grad


def test_aggregation_modes_by_hand():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert close(aggregate(per_token, mask, "token_mean"), 10 / 4)
    assert close(aggregate(per_token, mask, "seq_mean_token_sum"), (6 + 4) / 2)
    assert close(aggregate(per_token, mask, "seq_mean_token_mean"), (2 + 4) / 2)
    with pytest.raises(ValueError):
        aggregate(per_token, mask, "median")


def test_a_trajectory_of_two_rows_is_one_sequence_in_the_seq_mean_modes():
    # rows 0 and 1 are one trajectory's two sequences (4 loss tokens), row 2 another (1 token)
    per_token = torch.tensor([[1.0, 2.0, 3.0], [6.0, 0.0, 0.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 0, 0]])
    tokens = torch.tensor([4, 4, 1])
    assert close(aggregate(per_token, mask, "token_mean", sequence_tokens=tokens), 16 / 5)
    assert close(aggregate(per_token, mask, "seq_mean_token_sum", num_sequences=2, sequence_tokens=tokens),
                 (12 + 4) / 2)
    assert close(aggregate(per_token, mask, "seq_mean_token_mean", num_sequences=2, sequence_tokens=tokens),
                 (12 / 4 + 4 / 1) / 2)
    # split over micro-batches with the mini-batch's normalisers: the same number
    parts = sum(aggregate(per_token[rows], mask[rows], "seq_mean_token_mean", num_sequences=2,
                          sequence_tokens=tokens[rows]) for rows in ([0], [1, 2]))
    assert close(parts, (12 / 4 + 4 / 1) / 2)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"])
def test_micro_batches_sum_to_the_mini_batch_loss(mode):
    torch.manual_seed(0)
    per_token = torch.randn(6, 5)
    mask = (torch.rand(6, 5) > 0.3).long()
    mask[:, 0] = 1
    whole = aggregate(per_token, mask, mode)
    parts = sum(aggregate(per_token[i:i + 2], mask[i:i + 2], mode,
                          num_tokens=float(mask.sum()), num_sequences=6.0) for i in range(0, 6, 2))
    assert close(parts, whole)


def test_kl_estimators_by_hand():
    logp = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-1.5, -1.0])
    assert close(kl_penalty(logp, ref, "k1"), [0.5, -1.0])
    # k3 = exp(ref - logp) - (ref - logp) - 1: exp(-0.5) + 0.5 - 1 and exp(1) - 1 - 1
    assert close(kl_penalty(logp, ref, "k3"), [math.exp(-0.5) - 0.5, math.e - 2], 1e-5)
    assert bool((kl_penalty(torch.randn(100), torch.randn(100), "k3") >= 0).all())
    with pytest.raises(ValueError):
        kl_penalty(logp, ref, "k2")


def test_entropy_from_logits():
    # uniform over 4 -> ln 4; a certain token -> 0
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]])
    assert close(entropy_from_logits(logits), [math.log(4), 0.0], 1e-4)


def test_masked_mean_of_nothing_is_zero():
    assert close(masked_mean(torch.tensor([1.0, 2.0]), torch.tensor([0, 0])), 0.0)
    assert close(masked_mean(torch.tensor([1.0, 3.0]), torch.tensor([1, 1])), 2.0)


def test_decoupled_policy_loss_by_hand():
    # token 1: proximal 0, behaviour -1 (stale sampler found it less likely): weight e^1 = 2.718 -> cap 2;
    #          ratio to the proximal e^0.1 = 1.1052 inside the clip, A = 1: loss -1.1052 * 2
    # token 2: proximal -1, behaviour 0: weight e^-1 = 0.3679; ratio e^(0.5 - -1) = 4.48 clipped at 1.28,
    #          A = 1: loss -1.28 * 0.3679 (the clip is centred on the proximal policy, not the sampler)
    # token 3: masked
    logp = torch.tensor([[0.1, 0.5, 9.0]])
    proximal = torch.tensor([[0.0, -1.0, 0.0]])
    behaviour = torch.tensor([[-1.0, 0.0, 0.0]])
    adv = torch.ones(1, 3)
    mask = torch.tensor([[1, 1, 0]])
    loss, stats = decoupled_policy_loss(logp, proximal, behaviour, adv, mask, clip_low=0.2, clip_high=0.28, cap=2.0)
    assert close(loss[0, :2], [-math.exp(0.1) * 2.0, -1.28 * math.exp(-1)], 1e-4)
    assert close(stats["is_weight_mean"], (2.0 + math.exp(-1)) / 2, 1e-4)
    assert close(stats["clip_fraction"], 0.5)


def test_decoupled_policy_loss_without_cap_is_the_clipped_loss_on_the_proximal_policy():
    logp = torch.tensor([[0.5, -0.5, -0.5, 0.0]])
    proximal = torch.zeros_like(logp)
    behaviour = torch.full_like(logp, -3.0)  # ignored without a cap
    adv = torch.tensor([[1.0, 1.0, -1.0, 2.0]])
    mask = torch.ones(1, 4)
    loss, stats = decoupled_policy_loss(logp, proximal, behaviour, adv, mask, cap=None)
    expected, _ = policy_loss(logp, proximal, adv, mask)
    assert torch.equal(loss, expected) and "is_weight_mean" not in stats


def test_decoupled_gradient_flows_through_the_ratio_only():
    logp = torch.tensor([[0.0]], requires_grad=True)
    proximal = torch.tensor([[0.0]], requires_grad=True)
    behaviour = torch.tensor([[-0.5]], requires_grad=True)
    loss, _ = decoupled_policy_loss(logp, proximal, behaviour, torch.ones(1, 1), torch.ones(1, 1), cap=5.0)
    loss.sum().backward()
    # d/dlogp of -exp(logp - prox) * w = -w at ratio 1, w = e^0.5; the weight carries no gradient
    assert close(logp.grad, [[-math.exp(0.5)]], 1e-5)
    assert behaviour.grad is None
