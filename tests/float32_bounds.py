"""How far two correct float32 runs of the same AdamW training may land apart, per tensor.

The golden trace (``test_golden_trace.py``, whose docstring derives every bound here) and the
engines' parity tests (the local engine against FSDP2 ranks) compare training runs that reduce
the same sums in other orders: other CPUs' kernels, another split of the work. Single weights
are no fair test there: AdamW divides by the gradient's size, so an element whose gradient
cancels to almost nothing moves by whatever its rounding says. Sums over a tensor are: each
element's bound is known, and a sum moves by at most the sum of its elements' bounds.

Checksums of a tensor ``x`` (in float64): ``[sum x, sum |x|, sum x^2]``.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

__all__ = ["U", "LAMBDA", "relative_error", "adam_ratio_bound", "moment_bound", "tensor_stats", "tensor_bounds",
           "compare_tensors"]

U = 2.0 ** -24  # float32's unit roundoff
LAMBDA = 4.0  # sqrt(n) u bounds hold with probability >= 1 - 2 exp(-LAMBDA^2 / 2) (Higham & Mary 2019)
LABELS = {"update": ("sum", "sum|x|", "sum x^2"), "exp_avg": ("sum", "sum|x|", "sum x^2"),
          "exp_avg_sq": ("sum", "sum x^2")}


def relative_error(vocab: int) -> float:
    """``delta``: the relative error of a logprob, a gradient element or the gradient norm, from
    float32 sums of up to ``vocab`` terms (the longest of a language model's step)."""
    return LAMBDA * math.sqrt(vocab) * U


def _checksums(x: Any) -> list[float]:
    x = x.double()
    return [float(x.sum()), float(x.abs().sum()), float((x * x).sum())]


def tensor_stats(weights: Any, initial: Any, exp_avg: Any = None, exp_avg_sq: Any = None) -> dict[str, Any]:
    """The checksums of one tensor's update ``weights - initial`` (and of AdamW's moments, when
    given), with what :func:`tensor_bounds` needs to bound them."""
    update = weights.double() - initial.double()
    out: dict[str, Any] = {"numel": weights.numel(), "update": _checksums(update),
                           "update_max": float(update.abs().max()),
                           "weights_abs": float(weights.double().abs().sum()),
                           "weights_max": float(weights.double().abs().max())}
    if exp_avg is not None:
        v = exp_avg_sq.double()
        rms = v.sqrt()
        out.update({"exp_avg": _checksums(exp_avg), "exp_avg_max": float(exp_avg.double().abs().max()),
                    "exp_avg_sq": [float(v.sum()), float((v * v).sum())],
                    "grad_rms": [float(rms.sum()), float(rms.max())]})
    return out


def adam_ratio_bound(step: int, betas: Sequence[float]) -> float:
    """The largest ``|m^| / sqrt(v^)`` after ``step`` AdamW steps, over all gradients: by
    Cauchy-Schwarz over the bias-corrected weights ``a`` (of ``m^``) and ``b`` (of ``v^``),
    ``sqrt(sum_k a_k^2 / b_k)``."""
    beta1, beta2 = betas
    a = [(1 - beta1) * beta1 ** (step - k) / (1 - beta1 ** step) for k in range(1, step + 1)]
    b = [(1 - beta2) * beta2 ** (step - k) / (1 - beta2 ** step) for k in range(1, step + 1)]
    return math.sqrt(sum(x * x / y for x, y in zip(a, b)))


def moment_bound(steps: int, betas: Sequence[float]) -> float:
    """``C_T``: ``sum_k w_k |g_k| <= C_T sqrt(v)`` for the raw first moment's weights ``w`` after
    ``steps`` steps (the same Cauchy-Schwarz, without bias correction)."""
    beta1, beta2 = betas
    return math.sqrt(sum(((1 - beta1) * beta1 ** (steps - k)) ** 2 / ((1 - beta2) * beta2 ** (steps - k))
                         for k in range(1, steps + 1)))


def tensor_bounds(stats: dict[str, Any], lrs: Sequence[float], *, betas: Sequence[float], weight_decay: float,
                  vocab: int) -> dict[str, list[float]]:
    """How far each checksum of one tensor (``stats``, as :func:`tensor_stats` gave it) may be
    from another correct float32 run's after AdamW steps at learning rates ``lrs``."""
    delta = relative_error(vocab)
    steps, n = len(lrs), stats["numel"]
    c = [adam_ratio_bound(s, betas) for s in range(1, steps + 1)]
    # how far a weight can travel in these steps: its magnitude at any of them is at most this more
    travel = sum(lr * (cs + weight_decay * (stats["weights_max"] + 1.0)) for lr, cs in zip(lrs, c))
    # a 2 delta error in the clipped gradient moves AdamW's step m^/(sqrt(v^)+eps) by at most
    # 4 delta c_s; the step's own roundings by a few u of lr
    gradient = sum(4 * delta * cs * lr + 8 * U * lr for lr, cs in zip(lrs, c))
    # one ulp (<= 2u|w|) for the initial weights' and each step's last rounding
    rounding = 2 * U * (steps + 1)
    update_total = rounding * (stats["weights_abs"] + n * travel) + n * gradient
    update_max = rounding * (stats["weights_max"] + travel) + gradient
    out = {"update": [update_total, update_total, (2 * stats["update_max"] + update_max) * update_total]}
    if "exp_avg" in stats:
        moment = 2 * delta * moment_bound(steps, betas)
        m_total = moment * stats["grad_rms"][0]
        relative_v = (1 + 2 * delta) ** 2 - 1
        out["exp_avg"] = [m_total, m_total, (2 * stats["exp_avg_max"] + moment * stats["grad_rms"][1]) * m_total]
        out["exp_avg_sq"] = [relative_v * stats["exp_avg_sq"][0], ((1 + relative_v) ** 2 - 1) * stats["exp_avg_sq"][1]]
    return out


def compare_tensors(mine: dict[str, dict], recorded: dict[str, dict], lrs: Sequence[float], *, label: str,
                    betas: Sequence[float], weight_decay: float, vocab: int) -> list[str]:
    """One line for every checksum of ``mine`` further from ``recorded`` (both ``{tensor name:
    stats}``) than :func:`tensor_bounds` allows; empty when every tensor matches."""
    problems = []
    if sorted(mine) != sorted(recorded):
        problems.append(f"tensor {label}: tensors {sorted(set(mine) ^ set(recorded))} are in one run only")
    for name in sorted(set(mine) & set(recorded)):
        bounds = tensor_bounds(recorded[name], lrs, betas=betas, weight_decay=weight_decay, vocab=vocab)
        for kind, limits in bounds.items():
            for which, a, b, limit in zip(LABELS[kind], mine[name][kind], recorded[name][kind], limits):
                if abs(a - b) > limit:
                    problems.append(f"tensor {label} {name} {kind} {which}: {a:.10g} vs {b:.10g} (off by "
                                    f"{abs(a - b):.3g}, bound {limit:.3g}: {abs(a - b) / limit:.1f}x)")
    return problems
