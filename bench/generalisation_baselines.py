"""The degenerate baselines and the scripted solver's ceiling of each deepsearch split (issue 40).

A score on a split counts only by how far it is above the best answer that needs no
understanding. Computed here without a model, on every item of each split:

* ``majority per kind``: the training split's most frequent answer of the question's kind
  (for a composed kind, of the fact it ends on: the language or the region);
* ``copy a stated name``: answer with a name the question states (its country, capital,
  currency or neighbour), the best such choice per kind, chosen on the split itself (an
  upper bound of this baseline);
* ``nearest training answer``: the gold answer of the training question with the most words
  in common (a model that memorised its training questions and matches on the surface: the
  replay of the nearest demonstration's answer);
* ``scripted solver``: the warm-up's procedure (``search_plan``): its searches, then the
  gold answer when every search found what the next step needs (the ceiling of that
  procedure with this retriever).

The model with its tools turned off is a model run, recorded beside the trained models'
scores in bench/README.md.

    .venv/bin/python bench/generalisation_baselines.py
"""

from __future__ import annotations

import asyncio
import collections
import re
from typing import Any

from rlfactory_core import normalize_answer
from rlfactory_deepsearch.data import GENERALISATION_SPLITS
from rlfactory_deepsearch.env import DeepSearchEnv, search_plan

SPLITS = ("test",) + GENERALISATION_SPLITS
_STATED = ("country", "capital", "currency", "neighbour")


def right(answer: str, sample: dict[str, Any]) -> bool:
    return normalize_answer(answer) in {normalize_answer(a) for a in sample["golden_answers"]}


def final_fact(kind: str) -> str:
    """The fact a kind asks for in the end: ``language_via_capital`` -> ``language``."""
    return kind.split("_via_", 1)[0]


def stated_names(sample: dict[str, Any]) -> dict[str, str]:
    """The names the question states: its slots, or for a shipped-template question (no slots)
    the entity when named, and the capitalised phrases otherwise."""
    if isinstance(sample.get("slots"), dict):
        return dict(sample["slots"])
    names = {}
    if sample["entity"] in sample["question"]:
        names["country"] = sample["entity"]
    for i, phrase in enumerate(re.findall(r"(?:[A-Z][\w'.-]*)(?: [A-Z][\w'.-]*)*", sample["question"])[1:]):
        names.setdefault(f"name{i}", phrase)
    return names


def majority_by_fact(train: list[dict[str, Any]]) -> dict[str, str]:
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for sample in train:
        counts[final_fact(sample["kind"])][sample["answer"]] += 1
    return {fact: counter.most_common(1)[0][0] for fact, counter in counts.items()}


def copy_score(samples: list[dict[str, Any]]) -> float:
    by_kind: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for sample in samples:
        by_kind[sample["kind"]].append(sample)
    hits = 0
    for members in by_kind.values():
        choices = {slot for sample in members for slot in stated_names(sample)}
        hits += max((sum(right(stated_names(s).get(slot, ""), s) for s in members) for slot in choices), default=0)
    return hits / len(samples)


def words(text: str) -> set[str]:
    return set(normalize_answer(text).split())


def nearest_answer_score(samples: list[dict[str, Any]], train: list[dict[str, Any]]) -> float:
    indexed = [(words(t["question"]), t["answer"]) for t in train]
    hits = 0
    for sample in samples:
        asked = words(sample["question"])
        _, answer = max(indexed, key=lambda item: len(item[0] & asked) / len(item[0] | asked))
        hits += right(answer, sample)
    return hits / len(samples)


async def solver_score(env: DeepSearchEnv, samples: list[dict[str, Any]]) -> float:
    async def solved(sample: dict[str, Any]) -> bool:
        for query, needed in search_plan(sample) or [("", "\x00")]:
            found = await env.tools[0].call({"query": query}, {"sample": sample}) if query else ""
            if f" {normalize_answer(needed)} " not in f" {normalize_answer(found)} ":
                return False
        return True

    return sum(await asyncio.gather(*map(solved, samples))) / len(samples)


async def main() -> None:
    env = DeepSearchEnv()
    train = env.dataset(None, split="train")
    majority = majority_by_fact(train)
    print("| split | items | majority per kind | copy a stated name | nearest training answer | best degenerate "
          "| scripted solver (ceiling) |")
    print("|---|---|---|---|---|---|---|")
    try:
        for split in SPLITS:
            samples = env.dataset(None, split=split)
            scores = {
                "majority": sum(right(majority.get(final_fact(s["kind"]), ""), s) for s in samples) / len(samples),
                "copy": copy_score(samples),
                "nearest": nearest_answer_score(samples, train),
            }
            best = max(scores, key=scores.__getitem__)
            ceiling = await solver_score(env, samples)
            print(f"| `{split}` | {len(samples)} | {scores['majority']:.3f} | {scores['copy']:.3f} "
                  f"| {scores['nearest']:.3f} | {scores[best]:.3f} ({best}) | {ceiling:.3f} |", flush=True)
    finally:
        await env.tools[0].close()


if __name__ == "__main__":
    asyncio.run(main())
