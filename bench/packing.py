"""Padded vs packed micro-batches in the GRPO update, side by side.

One rollout-like batch (``--trajectories`` rows, lengths uniform in ``--min-len`` ..
``--max-len``, the last third of each scored, as in a multi-turn trajectory whose prompt and
observations are not) goes through ``rlfactory_core.training.update.update_policy`` with the
embedded SmolLM2-135M-Instruct, alternately padded and packed (``grpo.packing``), with the
learning rate 0 so both see the same weights. The script prints the time of each update, the
ratio, and the largest difference between the two layouts' float32 logprobs (they must agree).

Packed, the trajectories of a micro-batch are one row with positions restarting at each;
transformers keeps them apart with flash-attention's varlen kernel (``flash_attention_2``)
or, with SDPA, a block-diagonal mask over the whole row. Run it with ``--attn`` to pick.

    .venv/bin/python bench/packing.py                      # SDPA, ~3 minutes on 2 CPU cores
    .venv/bin/python bench/packing.py --attn flash_attention_2 --device cuda   # with flash-attn
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=16)
    parser.add_argument("--min-len", type=int, default=300)
    parser.add_argument("--max-len", type=int, default=700)
    parser.add_argument("--micro-batch-tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--attn", default="sdpa")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import torch
    from tensordict import TensorDict

    from rlfactory_core.training.update import batch_logprobs, update_policy
    from rlfactory_core.config import load_config
    from rlfactory_core.models import load_model, resolve_model

    torch.manual_seed(0)
    lengths = torch.randint(args.min_len, args.max_len + 1, (args.trajectories,))
    width = int(lengths.max())
    positions = torch.arange(width)[None]
    attention = (positions < lengths[:, None]).long()
    loss_mask = ((positions >= (lengths[:, None] * 2) // 3) & attention.bool()).long()
    batch = TensorDict({
        "input_ids": torch.randint(100, 40_000, (args.trajectories, width)) * attention,
        "attention_mask": attention, "loss_mask": loss_mask,
        "sampler_logprobs": torch.zeros(args.trajectories, width),
        "advantages": torch.randn(args.trajectories, 1) * loss_mask,
        "lengths": lengths, "sequence_advantages": torch.zeros(args.trajectories),
    }, batch_size=[args.trajectories])
    config = load_config([], [f"grpo.micro_batch_tokens={args.micro_batch_tokens}",
                              f"train.device={args.device}"])
    model = load_model(resolve_model(config.model.name), dtype="float32", device=torch.device(args.device))
    model.config._attn_implementation = args.attn  # noqa: SLF001
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    print(f"{args.trajectories} trajectories, lengths {args.min_len}-{args.max_len} "
          f"({int(lengths.sum())} tokens, {args.trajectories * width} padded), "
          f"micro-batches of {args.micro_batch_tokens} tokens, attention {args.attn} on {args.device}")

    times: dict[bool, list[float]] = {False: [], True: []}
    update_policy(model, None, optimizer, batch.clone(), config, packed=False)  # warm-up
    for _ in range(args.repeats):
        for packed in (False, True):
            start = time.perf_counter()
            update_policy(model, None, optimizer, batch.clone(), config, packed=packed)
            times[packed].append(time.perf_counter() - start)
    rows = list(range(args.trajectories))
    fp32 = config.model_copy(update={"train": config.train.model_copy(update={"bf16": False})})
    padded_lp = batch_logprobs(model, batch, rows, fp32, packed=False)  # fp32: bf16 rounding differs by layout
    packed_lp = batch_logprobs(model, batch, rows, fp32, packed=True)
    difference = float((padded_lp - packed_lp)[loss_mask.bool()].abs().max())

    padded, packed = statistics.mean(times[False]), statistics.mean(times[True])
    print(f"padded: {padded:.2f} s per update  {[round(t, 2) for t in times[False]]}")
    print(f"packed: {packed:.2f} s per update  {[round(t, 2) for t in times[True]]}")
    print(f"padded / packed = {padded / packed:.2f}x   largest float32 logprob difference: {difference:.2e}")


if __name__ == "__main__":
    main()
