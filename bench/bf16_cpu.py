"""bf16 autocast against float32 for the policy's forward and backward on this CPU.

    .venv/bin/python bench/bf16_cpu.py               # ~2 minutes on a 2-core CPU
    .venv/bin/python bench/bf16_cpu.py --repeats 1   # quicker, noisier

``train.bf16=auto`` (rlfactory_core.training.logprobs.native_bf16) turns bf16 autocast on
for a CPU only when it has AMX. This script is the measurement behind that rule: the
embedded SmolLM2-135M (float32 weights, as the trainer holds them), micro-batches shaped like
android's warm-up (2 rows of 1,050 tokens) and deepsearch's (4 of 470), loss on one token in
six past a 300-token prompt, through the trainer's own ``token_logprobs`` and a backward pass;
the two settings alternate, ``--repeats`` times each, in one process. It prints seconds per
micro-batch, tokens per second, and float32's speed over bf16's.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed micro-batches per setting and shape")
    args = parser.parse_args()

    import torch

    from rlfactory_core.models import load_model, resolve_model
    from rlfactory_core.training.logprobs import native_bf16, token_logprobs

    torch.manual_seed(0)
    model = load_model(resolve_model("smollm2-135m-instruct"), dtype="float32", device="cpu")
    model.train()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, oneDNN bf16 {torch.ops.mkldnn._is_mkldnn_bf16_supported()}, "
          f"train.bf16=auto picks bf16 here: {native_bf16('cpu')}")
    print("| micro-batch | bf16 autocast s | float32 s | bf16 tokens/s | float32 tokens/s | float32 / bf16 speed |")
    print("|---|---:|---:|---:|---:|---:|")
    for length, rows in ((1050, 2), (470, 4)):
        ids = torch.randint(100, 40000, (rows, length))
        loss_mask = torch.zeros_like(ids)
        loss_mask[:, 300::6] = 1
        micro = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": loss_mask}
        seconds: dict[bool, list[float]] = {True: [], False: []}
        for repeat in range(args.repeats + 1):  # the first round warms both up, untimed
            for bf16 in (True, False):
                started = time.perf_counter()
                logprobs, _ = token_logprobs(model, micro, bf16=bf16, entropy=False)
                (-(logprobs * loss_mask).sum() / loss_mask.sum()).backward()
                model.zero_grad(set_to_none=True)
                if repeat:
                    seconds[bf16].append(time.perf_counter() - started)
        bf16_s, fp32_s = statistics.median(seconds[True]), statistics.median(seconds[False])
        tokens = rows * length
        ratios = sorted(b / f for b, f in zip(seconds[True], seconds[False]))
        print(f"| {rows} x {length} | {bf16_s:.2f} | {fp32_s:.2f} | {tokens / bf16_s:.0f} | {tokens / fp32_s:.0f} "
              f"| {bf16_s / fp32_s:.2f}x (pairs {ratios[0]:.2f}-{ratios[-1]:.2f}x) |")
    print(f"(medians of {args.repeats} micro-batches per setting; the pairs' range is each repeat's bf16 / float32)")


if __name__ == "__main__":
    main()
