"""The float32 bounds the golden trace and the engines' parity tests compare within
(``tests/float32_bounds.py``): hand-computed values, and the inequalities they rest on checked
against torch's own AdamW and float32 sums."""

import math

import pytest
import torch

from float32_bounds import (U, adam_ratio_bound, compare_tensors, moment_bound, relative_error, tensor_bounds,
                            tensor_stats)

BETAS = (0.9, 0.999)


def test_hand_computed_values():
    assert adam_ratio_bound(1, BETAS) == pytest.approx(1.0)
    # step 2: a = (0.09, 0.1) / 0.19, b = (0.000999, 0.001) / 0.001999; sqrt(sum a^2 / b)
    assert adam_ratio_bound(2, BETAS) == pytest.approx(math.sqrt(0.473684 ** 2 / 0.499750 + 0.526316 ** 2 / 0.500250),
                                                       rel=1e-5)
    assert adam_ratio_bound(2, BETAS) == pytest.approx(1.001358, rel=1e-6)
    assert moment_bound(1, BETAS) == pytest.approx(math.sqrt(10))  # 0.1 / sqrt(0.001)
    assert moment_bound(2, BETAS) == pytest.approx(math.sqrt(0.09 ** 2 / 0.000999 + 10), rel=1e-12)
    assert relative_error(49_152) == pytest.approx(4 * math.sqrt(49_152) * 2 ** -24)


def test_adams_moments_stay_within_the_cauchy_schwarz_bounds():
    """torch's AdamW on adversarial gradient sequences (signs and sizes changing step to step):
    ``|m| <= C_T sqrt(v)`` and ``|m^| / sqrt(v^) <= c_T`` on every element."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.nn.Parameter(torch.zeros(4096, dtype=torch.float64))
    optimizer = torch.optim.AdamW([weight], lr=1e-3, betas=BETAS, eps=0.0, weight_decay=0.0)
    for step in range(1, 7):
        weight.grad = torch.randn(4096, generator=generator, dtype=torch.float64) * \
            10 ** torch.randint(-6, 2, (4096,), generator=generator).double()
        optimizer.step()
        state = optimizer.state[weight]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        assert (m.abs() <= moment_bound(step, BETAS) * v.sqrt() * (1 + 1e-12)).all()
        m_hat, v_hat = m / (1 - BETAS[0] ** step), v / (1 - BETAS[1] ** step)
        assert (m_hat.abs() / v_hat.sqrt()).max() <= adam_ratio_bound(step, BETAS) * (1 + 1e-12)


def test_float32_sums_in_other_orders_stay_within_delta():
    """The probabilistic bound: float32 sums of V terms, forwards, backwards and pairwise, each
    within ``delta * sum |x|`` of the float64 sum."""
    import numpy as np

    rng = np.random.default_rng(1)
    n = 49_152
    for _ in range(20):
        x = (rng.standard_normal(n) * rng.random(n) ** 4).astype(np.float32)
        exact = float(x.astype(np.float64).sum())
        budget = relative_error(n) * float(np.abs(x.astype(np.float64)).sum())
        # numpy's cumsum adds one term at a time in float32; its sum is pairwise
        sums = [np.cumsum(x, dtype=np.float32)[-1], np.cumsum(x[::-1], dtype=np.float32)[-1], x.sum(dtype=np.float32),
                float(torch.from_numpy(x).sum())]
        assert all(abs(float(s) - exact) <= budget for s in sums)


def test_a_tensor_an_ulp_off_everywhere_passes_and_a_changed_update_does_not():
    generator = torch.Generator().manual_seed(2)
    initial = torch.randn(1000, generator=generator) * 0.02
    weights = initial - 1e-3 * torch.randn(1000, generator=generator).sign()  # one AdamW step's worth
    recorded = {"w": tensor_stats(weights, initial)}
    lrs = [1e-3]
    # every element one ulp up: the kind of difference another kernel makes
    nudged = torch.nextafter(weights, torch.full_like(weights, math.inf))
    assert compare_tensors({"w": tensor_stats(nudged, initial)}, recorded, lrs, label="x", betas=BETAS,
                           weight_decay=0.0, vocab=49_152) == []
    # ten elements moving the other way: a changed update
    changed = weights.clone()
    changed[:10] = initial[:10] + (initial[:10] - weights[:10])
    problems = compare_tensors({"w": tensor_stats(changed, initial)}, recorded, lrs, label="x", betas=BETAS,
                               weight_decay=0.0, vocab=49_152)
    assert problems and all(p.startswith("tensor x w update") for p in problems)
    bounds = tensor_bounds(recorded["w"], lrs, betas=BETAS, weight_decay=0.0, vocab=49_152)
    assert bounds["update"][0] >= 2 * U * 2 * float(weights.abs().sum())  # two roundings of every weight
