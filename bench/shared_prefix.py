"""The update with and without ``grpo.shared_prefix``, side by side on the same batch.

A deepsearch-shaped GRPO batch: the env's real prompt (instruction, two worked examples,
a test question) rendered with the embedded model's chat template, then for each of
``--groups`` x ``--group-size`` trajectories a response of ``--response`` tokens on average
(model turns and search results, as a step of ``rlf train --env deepsearch`` has: ~440 tokens a
trajectory, ~110 of them after the prompt). The embedded SmolLM2-135M-Instruct (float32
weights, ``train.bf16=auto``) runs :func:`update_policy` on it, alternating shared and
unshared, ``--repeats`` times each (the first of each dropped as warm-up), and prints the
times, their spread and the ratio. The two updates' losses are printed too: they must agree.

    .venv/bin/python bench/shared_prefix.py            # 4 x 8 trajectories, 3 measured repeats each
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time


def build_trajectories(tokenizer, groups: int, group_size: int, response: int, seed: int = 0):
    from rlfactory_core import get_component
    from rlfactory_core.types import Segment, Trajectory

    env = get_component("env", "deepsearch")()
    samples = env.dataset(groups, split="validation")
    rng = random.Random(seed)
    trajectories = []
    for group, sample in enumerate(samples):
        reset = asyncio.run(env.reset(sample))
        messages = [{"role": m.role, "content": m.content} for m in reset.messages]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        for _ in range(group_size):
            t = Trajectory(sample_id=sample["id"], prompt_ids=prompt, group=group)
            length = max(8, int(rng.gauss(response, response / 4)))
            model_tokens = max(2, length // 4)
            ids = [rng.randrange(100, 40_000) for _ in range(length)]
            t.segments.append(Segment("model", ids[:model_tokens // 2], [-1.0] * (model_tokens // 2)))
            t.segments.append(Segment("observation", ids[model_tokens // 2:length - model_tokens // 2], None))
            t.segments.append(Segment("model", ids[length - model_tokens // 2:], [-1.0] * (model_tokens // 2)))
            trajectories.append(t)
    return trajectories, len(prompt)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--response", type=int, default=110)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args(argv)

    import torch

    from rlfactory_core.config import load_config
    from rlfactory_core.models import load_tokenizer, resolve_model
    from rlfactory_core.training.batch import build_batch
    from rlfactory_core.training.logprobs import bf16_autocast
    from rlfactory_core.training.policy import load_policy
    from rlfactory_core.training.update import update_policy

    path = resolve_model("smollm2-135m-instruct")
    tokenizer = load_tokenizer(path)
    trajectories, prompt_length = build_trajectories(tokenizer, args.groups, args.group_size, args.response)
    rewards = [float(i % 3 == 0) for i in range(len(trajectories))]
    total = sum(len(t.prompt_ids) + sum(len(s.token_ids) for s in t.segments) for t in trajectories)
    print(f"{len(trajectories)} trajectories, prompt {prompt_length} tokens, {total} tokens in all; "
          f"bf16 autocast: {bf16_autocast('auto', torch.device('cpu'))}; {torch.get_num_threads()} threads")
    times: dict[bool, list[float]] = {False: [], True: []}
    losses: dict[bool, float] = {}
    for repeat in range(args.repeats):
        for shared in (False, True):
            config = load_config([], [f"grpo.shared_prefix={shared}", f"grpo.group_size={args.group_size}",
                                      f"grpo.prompts_per_step={args.groups}"])
            model = load_policy(config, path, torch.device("cpu"))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the same weights for every repeat
            batch = build_batch(trajectories, rewards, config, pad_id=tokenizer.pad_token_id or 0)
            started = time.perf_counter()
            stats = update_policy(model, None, optimizer, batch, config)
            elapsed = time.perf_counter() - started
            losses[shared] = stats["train/loss"]
            print(f"repeat {repeat + 1} shared_prefix={shared}: {elapsed:.1f} s (loss {stats['train/loss']:.6f})",
                  flush=True)
            if repeat:  # the first of each is the warm-up
                times[shared].append(elapsed)
    plain, shared = statistics.mean(times[False]), statistics.mean(times[True])
    spread = lambda xs: f"{min(xs):.1f}-{max(xs):.1f}"  # noqa: E731
    print(f"\nunshared {plain:.1f} s ({spread(times[False])}), shared {shared:.1f} s ({spread(times[True])}) "
          f"over {len(times[True])} repeats: **{plain / shared:.2f}x**; losses {losses[False]:.6f} / "
          f"{losses[True]:.6f}")


if __name__ == "__main__":
    main(sys.argv[1:])
