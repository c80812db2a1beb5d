"""The large run that ``bench/ui_records.py`` measures ``rlf ui`` on, generated: a run of
``--steps`` (1,000) deepsearch-shaped steps recording ``--eval-per-step`` (84) eval and
``--train-groups`` x ``--group-size`` (2 x 8) training trajectories each (100,000 in all), made
by the real ``trajectory_records`` from real Trajectory and ScoredBatch objects and the embedded
model's tokenizer, and written by the real ``write_records``; plus 3 small runs. The what and
why of the shape are in ``bench/ui_records.py``'s docstring."""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from pathlib import Path

BIG = "big"
MARKER = ".bench-ui-records.json"

COUNTRIES = [("Kenya", "Nairobi", "Africa", "Kenyan Shilling", "Swahili"),
             ("Chile", "Santiago", "Americas", "Chilean Peso", "Spanish"),
             ("Japan", "Tokyo", "Asia", "Japanese Yen", "Japanese"),
             ("Portugal", "Lisbon", "Europe", "Euro", "Portuguese"),
             ("Fiji", "Suva", "Oceania", "Fijian Dollar", "Fijian"),
             ("Ghana", "Accra", "Africa", "Ghanaian Cedi", "English"),
             ("Mongolia", "Ulaanbaatar", "Asia", "Mongolian Tögrög", "Mongolian"),
             ("Uruguay", "Montevideo", "Americas", "Uruguayan Peso", "Spanish"),
             ("Slovenia", "Ljubljana", "Europe", "Euro", "Slovene"),
             ("Laos", "Vientiane", "Asia", "Lao Kip", "Lao"),
             ("Namibia", "Windhoek", "Africa", "Namibian Dollar", "English"),
             ("Tonga", "Nukuʻalofa", "Oceania", "Tongan Paʻanga", "Tongan")]
KINDS = ("capital", "country_of_capital", "region", "currency", "language", "region_via_capital",
         "currency_via_capital", "language_via_capital", "capital_via_currency")
INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
    "get new information. If you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. If you find no further external knowledge needed, you can directly provide the answer "
    "inside <answer> and </answer>, without detailed illustrations.\n\n"
    "Question: Which currency is used in Norway?\n<search> Norway currency </search>\n<information>Doc 1(Title: "
    "\"Norway\") Norway uses the Norwegian Krone as its currency. Languages spoken in Norway include Norwegian, "
    "Norwegian Bokmål and Norwegian Nynorsk.</information>\n<answer> Norwegian Krone </answer>\n\n"
    "Question: In which region is the country whose capital is Asunción?\n<search> Asunción capital </search>\n"
    "<information>Doc 1(Title: \"Asunción\") Asunción is the capital city of Paraguay.</information>\n"
    "<search> Paraguay region </search>\n<information>Doc 1(Title: \"Paraguay\") Paraguay lies in the Americas "
    "region, in Latin America and the Caribbean.</information>\n<answer> Americas </answer>")


# --------------------------------------------------------------------------- the generated run


def passage(country: tuple[str, ...], rng: random.Random) -> str:
    name, capital, region, currency, language = country
    return rng.choice([
        f'"{name}"\n{name} uses the {currency} as its currency.',
        f'"{name}"\nLanguages spoken in {name} include {language}.',
        f'"{capital}"\n{capital} is the capital city of {name}. It lies at {rng.uniform(0, 60):.2f}° '
        f'{rng.choice("NS")}.',
        f'"{name}"\n{name} lies in the {region} region, in {rng.choice(["the south", "the east", "the west"])} '
        f'of {region}.'])


class Generator:
    """Deepsearch-shaped trajectories for a step, as the rollout would build them."""

    def __init__(self, tokenizer, eval_questions: int, train_questions: int):
        self.tokenizer = tokenizer
        rng = random.Random(0)
        self.questions = {}
        for split, count in (("test", eval_questions), ("train", train_questions)):
            for i in range(count):
                country, kind = rng.choice(COUNTRIES), rng.choice(KINDS)
                text = {"capital": f"What is the capital of {country[0]}?",
                        "country_of_capital": f"{country[1]} is the capital of which country?",
                        "region": f"In which region is {country[0]}?",
                        "currency": f"Which currency is used in {country[0]}?",
                        "language": f"Which language is spoken in {country[0]}?"}.get(
                    kind, f"What is the {kind.split('_')[0]} of the country whose capital is {country[1]}?")
                answer = {"capital": country[1], "country_of_capital": country[0], "region": country[2],
                          "currency": country[3], "language": country[4]}.get(kind, country[2])
                messages = [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": text}]
                ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
                ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
                sample_id = f"deepsearch-{split}-{kind}-{i:05d}"
                self.questions.setdefault(split, []).append(
                    {"id": sample_id, "text": text, "answer": answer, "country": country, "prompt_ids": ids})

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def trajectory(self, question: dict, rng: random.Random, step: int, group: int | None, train: bool):
        from rlfactory_core.types import Message, Segment, ToolCall, ToolResult, Trajectory

        t = Trajectory(sample_id=question["id"], prompt_ids=question["prompt_ids"], group=group)
        t.messages = [Message("system", INSTRUCTION), Message("user", question["text"])]
        skill = min(0.8, 0.15 + step / 1500)
        searches = 1 if rng.random() < 0.6 else 2
        cut = rng.random() < 0.04  # ran out of turns
        tool_errors = {}
        for turn in range(searches):
            country = question["country"] if rng.random() < 0.8 else rng.choice(COUNTRIES)
            query = f"{country[0 if turn == 0 else 1]} {rng.choice(['capital', 'region', 'currency', 'language'])}"
            thought = rng.choice(["I need to find this.", f"I should search for {country[0]}.",
                                  "Let me look it up.", "The passage does not say; search again."])
            text = f"<think> {thought} </think>\n<search> {query} </search>"
            call = ToolCall(name="search", arguments={"query": query}, id=f"call-{turn}")
            t.messages.append(Message("assistant", text, tool_calls=[call]))
            t.segments.append(self.model_segment(text, rng, step - 1 if train else step))
            t.tool_calls.append(call)
            if rng.random() < 0.01:
                result = "Error: the search timed out"
                t.tool_results.append(ToolResult("search", result, call_id=call.id, error="timeout", latency_s=30.0))
                tool_errors["timeout"] = tool_errors.get("timeout", 0) + 1
            else:
                found = [passage(country, rng), passage(rng.choice(COUNTRIES), rng)]
                result = "\n".join(f"Doc {i}(Title: {p.partition(chr(10))[0]}) {p.partition(chr(10))[2]}"
                                   for i, p in enumerate(found, 1))
                t.tool_results.append(ToolResult("search", result, call_id=call.id, latency_s=rng.uniform(0.01, 0.2)))
            t.messages.append(Message("tool", result, name="search", tool_call_id=call.id))
            t.segments.append(Segment("observation", self.ids(
                f"<|im_end|>\n<|im_start|>user\n<information>{result}</information><|im_end|>\n"
                f"<|im_start|>assistant\n")))
        correct = rng.random() < skill
        if cut:
            t.stop_reason, t.final_answer = "max_turns", None
        else:
            answer = question["answer"] if correct else rng.choice(COUNTRIES)[rng.randint(0, 4)]
            text = f"<think> The passage says it. </think>\n<answer> {answer} </answer>"
            t.messages.append(Message("assistant", text))
            t.segments.append(self.model_segment(text, rng, step - 1 if train else step))
            t.stop_reason, t.final_answer = "no_tool_call", answer
        t.turn_rewards = [0.0] * sum(s.kind == "model" for s in t.segments)
        t.metadata = {"tool_errors": tool_errors} if tool_errors else {}
        if train:
            t.metadata["cut_turns"] = 0
        reward = float(correct and not cut)
        if train:  # search_r1's format terms
            reward = reward + (0.1 if searches else 0.0) - (0.2 if cut else 0.0)
        return t, reward, correct and not cut

    def model_segment(self, text: str, rng: random.Random, version: int):
        """A model turn sampled by weight ``version`` (a sync run's: ``step - 1`` in training,
        ``step`` in its eval)."""
        from rlfactory_core.types import Segment

        ids = self.ids(text + "<|im_end|>")
        return Segment("model", ids, [-rng.expovariate(3.0) for _ in ids], policy_version=version)

    def step_records(self, step: int, eval_count: int, groups: int, group_size: int):
        """The step's eval and train records, as the trainer and run_eval make them."""
        import torch

        from rlfactory_core.records import trajectory_records
        from rlfactory_core.rewards import ScoredBatch

        rng = random.Random(step)
        out = {}
        tests = self.questions["test"][:eval_count]
        made = [self.trajectory(q, rng, step, None, False) for q in tests]
        trajectories, rewards, correct = zip(*made)
        scored = ScoredBatch(totals=list(rewards), components=[{"exact_match": r} for r in rewards],
                             correct=list(correct), errors={}, applied={})
        out["eval"] = trajectory_records(list(trajectories), step=step, kind="eval", scored=scored,
                                         tokenizer=self.tokenizer, row_samples=tests)
        picked = rng.sample(self.questions["train"], groups)
        samples = [q for q in picked for _ in range(group_size)]
        made = [self.trajectory(q, rng, step, g // group_size, True) for g, q in enumerate(samples)]
        trajectories, rewards, correct = zip(*made)
        scored = ScoredBatch(totals=list(rewards), components=[{"search_r1": r} for r in rewards],
                             correct=list(correct), errors={}, applied={})
        advantages = []
        for g in range(groups):
            part = rewards[g * group_size:(g + 1) * group_size]
            mean, std = statistics.fmean(part), statistics.pstdev(part)
            advantages += [(r - mean) / (std + 1e-6) for r in part]
        width = max(len(t.prompt_ids) + sum(len(s.token_ids) for s in t.segments) for t in trajectories)
        token_advantages = torch.zeros(len(trajectories), width)
        trainer = torch.zeros(len(trajectories), width)
        for row, t in enumerate(trajectories):
            at = len(t.prompt_ids)
            for s in t.segments:
                n = len(s.token_ids)
                if s.kind == "model":
                    token_advantages[row, at:at + n] = advantages[row]
                    trainer[row, at:at + n] = torch.tensor(s.logprobs) + torch.randn(n) * 0.01
                at += n
        out["train"] = trajectory_records(
            list(trajectories), step=step, kind="train", scored=scored, tokenizer=self.tokenizer,
            row_samples=samples, advantages=torch.tensor(advantages),
            token_advantages=token_advantages, trainer_logprobs=trainer)
        return out, made


def metrics_line(step: int, rng: random.Random, eval_records, train_made) -> dict:
    """One step's metrics: the keys a deepsearch run logs (~80)."""
    line = {"step": step, "time": 1_790_000_000 + step * 45.0}
    train_rewards = [r for _, r, _ in train_made]
    for prefix in ("reward", "eval/reward"):
        line.update({f"{prefix}/{k}": rng.random() for k in ("mean", "std", "errors", "accuracy")})
        line[f"{prefix}/{'search_r1' if prefix == 'reward' else 'exact_match'}"] = rng.random()
    line["reward/mean"] = statistics.fmean(train_rewards)
    line["eval/reward/accuracy"] = statistics.fmean(float(bool(r["correct"])) for r in eval_records)
    line.update({f"eval/reward/accuracy/{kind}": rng.random() for kind in KINDS})
    line.update({"reward/constant_groups": rng.random(), **{f"advantage/{k}": rng.gauss(0, 1)
                                                            for k in ("mean", "std", "max", "min")}})
    for prefix in ("rollout", "eval/rollout"):
        line.update({f"{prefix}/{k}": rng.uniform(0, 500) for k in (
            "trajectories", "turns_mean", "model_tokens_mean", "total_tokens_mean", "tool_calls", "tool_errors",
            "parse_errors", "stop/no_tool_call", "stop/max_turns")})
    for prefix in ("tools", "eval/tools"):
        line.update({f"{prefix}/{k}": rng.random() for k in (
            "calls_per_trajectory", "trajectories_with_calls", "error_rate", "parse_errors_per_trajectory")})
    line.update({f"train/{k}": rng.random() for k in (
        "loss", "entropy", "clip_fraction", "ratio_mean", "ratio_max", "sampler_logprob_diff", "sampler_kl",
        "trained_tokens", "grad_norm", "kl", "lr")})
    line["train/optimizer_steps"] = 1
    line.update({f"time/{k}": rng.uniform(0, 40) for k in (
        "generation_per_trajectory", "tools_per_trajectory", "rollout", "reward", "train", "weight_sync", "eval",
        "checkpoint", "step")})
    line.update({"rollout/cut_off": rng.random(), "throughput/rollout_tokens_per_s": rng.uniform(100, 300),
                 "throughput/train_tokens_per_s": rng.uniform(300, 600), "batch/groups_sampled": 4.0,
                 "batch/groups_kept": 4.0, "batch/extra_rollouts": 0.0})
    line["samples"] = sorted({r for r in (t.sample_id for t, _, _ in train_made)})
    return line


_WORKER: dict = {}


def write_step(step: int) -> str:
    """Step ``step``'s records written (in a worker process); its metrics line."""
    generator, run_dir, args = _WORKER["generator"], _WORKER["run_dir"], _WORKER["args"]
    from rlfactory_core.records import write_records

    import torch

    torch.set_num_threads(1)
    records, train_made = generator.step_records(step, args.eval_per_step, args.train_groups, args.group_size)
    for kind, rows in records.items():
        write_records(run_dir, kind, step, rows)
    return json.dumps(metrics_line(step, random.Random(-step), records["eval"], train_made))


def write_run(run_dir: Path, generator: Generator, steps: int, args, progress: bool) -> None:
    import multiprocessing

    from rlfactory_core.config import load_config
    from rlfactory_core.runs import write_run_files

    run_dir.mkdir(parents=True)
    config = load_config([], ["env=deepsearch", f"train.steps={steps}", f"grpo.group_size={args.group_size}"])
    write_run_files(run_dir, config)
    _WORKER.update(generator=generator, run_dir=run_dir, args=args)
    start = time.perf_counter()
    context = multiprocessing.get_context("fork")  # the workers inherit the tokenizer and the questions
    with open(run_dir / "metrics.jsonl", "w", encoding="utf-8") as metrics, \
            context.Pool(args.workers) as pool:
        for step, line in enumerate(pool.imap(write_step, range(1, steps + 1), chunksize=5), 1):
            metrics.write(line + "\n")
            if progress and (step % 50 == 0 or step == steps):
                rate = step / (time.perf_counter() - start)
                print(f"  {run_dir.name}: step {step}/{steps} ({rate:.1f} steps/s, "
                      f"~{(steps - step) / rate:.0f} s left)", flush=True)
    status = {"version": 1, "state": "finished", "pid": 1, "host": "bench", "started_at": 1_790_000_000.0,
              "updated_at": 1_790_000_000.0 + steps * 45.0, "step": steps, "steps": steps, "message": ""}
    (run_dir / "status.json").write_text(json.dumps(status) + "\n")


def generate(runs_dir: Path, args) -> dict:
    from rlfactory_core.models import DEFAULT_MODEL, load_tokenizer, prepare_model

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tokenizer = load_tokenizer(prepare_model(DEFAULT_MODEL))
    generator = Generator(tokenizer, args.eval_per_step, 500)
    runs_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for i in range(3):
        write_run(runs_dir / f"small-{i}", generator, 5, args, progress=False)
    print(f"generating {BIG}: {args.steps} steps x ({args.eval_per_step} eval + "
          f"{args.train_groups} x {args.group_size} train) trajectories", flush=True)
    write_run(runs_dir / BIG, generator, args.steps, args, progress=True)
    shape = {"steps": args.steps, "eval_per_step": args.eval_per_step, "train_groups": args.train_groups,
             "group_size": args.group_size, "generated_s": round(time.perf_counter() - start, 1)}
    (runs_dir / MARKER).write_text(json.dumps(shape))
    return shape


def describe(runs_dir: Path) -> dict:
    """What the big run holds: files, bytes, trajectories, tokens."""
    import pyarrow.parquet as pq

    big = runs_dir / BIG / "trajectories"
    out = {}
    for kind in ("eval", "train"):
        files = sorted((big / kind).glob("step-*.parquet"))
        rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        out[kind] = {"files": len(files), "rows": rows, "bytes": sum(f.stat().st_size for f in files)}
    scalars = [pq.read_table(f, columns=["num_tokens", "num_turns"]).to_pydict()
               for f in sorted(big.glob("*/step-*.parquet"))]
    out["tokens_mean"] = statistics.fmean(n for part in scalars for n in part["num_tokens"])
    out["turns_mean"] = statistics.fmean(n for part in scalars for n in part["num_turns"])
    out["metrics_bytes"] = (runs_dir / BIG / "metrics.jsonl").stat().st_size
    first = json.loads((runs_dir / BIG / "metrics.jsonl").open().readline())
    out["metrics_keys"] = len(first)
    return out
