"""Which weights a push to the generation backends must carry (``train.weight_push``):
only the decoder layers with a value that changed, *in the sampler's dtype*, since the last push.

The trainer keeps float32 weights; the sampler holds them in its own dtype (float32 on a
CPU by default, bfloat16 on most GPUs). A decoder layer (:func:`load_unit`) is sent whole
when any element of any of its tensors, cast to the sampler's dtype, differs bitwise from
what was sent last; then the sampler's copy equals the trainer's weights cast to its dtype
after every push, exactly. What is saved depends on what the update changes (measured by
``bench/weight_sync.py``, figures in bench/README.md): a LoRA run's merged weights change
only in the adapted layers (not the embeddings, the final norm, the head); full fine-tuning
with AdamW moves every tensor each step, so nothing can be left out, and tracking is off
by default there (``auto``). The price is one copy of the sent weights in the sampler's
dtype, kept here, and a comparison per push, on the training thread.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..rollout.backends.base import load_unit

__all__ = ["ChangedWeights", "pushes_changed_only"]


def pushes_changed_only(config: Any) -> bool:
    """Whether the run's pushes send only the changed layers (``train.weight_push``)."""
    choice = config.train.weight_push
    return choice == "changed" or (choice == "auto" and config.model.lora.enabled)


class ChangedWeights:
    """Remembers what was pushed; :meth:`select` returns what the next push must send.

    ``dtype``: the sampler's (a ``torch.dtype``), or None to compare in the trainer's own
    (a change in a narrower dtype is always a change in the wider one, so this sends a
    superset: still exact)."""

    def __init__(self, dtype: Any = None):
        self.dtype = dtype
        self._sent: dict[str, Any] = {}

    def select(self, named_tensors: Iterable[tuple[str, Any]]) -> tuple[list[tuple[str, Any]], dict[str, float]]:
        """``(name, tensor in the sampler's dtype)`` of every tensor of each load unit (decoder
        layer) that changed since the last push (all of them on the first), and the metrics of the choice:
        ``weight_sync/changed_share`` (elements that changed, of all) and
        ``weight_sync/sent_share`` (bytes sent, of all)."""
        import torch

        compared: list[tuple[str, Any, bool]] = []
        changed_units: set[str] = set()
        elements = changed_elements = 0
        for name, tensor in named_tensors:
            value = tensor.detach().to(device="cpu", dtype=self.dtype or tensor.dtype)
            previous = self._sent.get(name)
            if previous is None or previous.shape != value.shape:
                differing = value.numel()
            else:
                # bitwise, so a NaN (never equal to itself) or a -0.0 reaching the weights is sent too
                differing = int(torch.count_nonzero(_bits(value) != _bits(previous)))
            elements += value.numel()
            changed_elements += differing
            if differing:
                changed_units.add(load_unit(name))
            # .to may return the trainer's own tensor, which later updates change in place:
            # what is kept (and sent) is then a copy, made only for the tensors sent
            compared.append((name, value, value.data_ptr() == tensor.data_ptr()))
        sent = [(name, value.clone() if aliased else value) for name, value, aliased in compared
                if load_unit(name) in changed_units]
        self._sent.update(sent)
        sent_bytes = sum(value.numel() * value.element_size() for _, value in sent)
        all_bytes = sum(value.numel() * value.element_size() for _, value, _ in compared)
        metrics = {"weight_sync/changed_share": changed_elements / max(elements, 1),
                   "weight_sync/sent_share": sent_bytes / max(all_bytes, 1)}
        return sent, metrics


def _bits(tensor: Any) -> Any:
    """The tensor's raw bits as integers of its width (float equality is not bit equality)."""
    import torch

    integer = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.view(integer) if tensor.is_floating_point() else tensor
