"""The splits that test beyond the training templates (rlfactory_deepsearch.generalisation):
large enough, honest (nothing in them can be answered from a training item), searchable
through the real search tool, and solvable by the scripted procedure."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from rlfactory_core import ConfigError, ToolCall, normalize_answer
from rlfactory_core.testing import ConcurrentToolManager
from rlfactory_deepsearch.data import GENERALISATION_SPLITS, KINDS, build
from rlfactory_deepsearch.env import DeepSearchEnv, search_plan
from rlfactory_deepsearch.facts import TEMPLATES
from rlfactory_deepsearch.generalisation import COMPOSITIONS, COUNTERFACTUAL, WORDINGS
from rlfactory_deepsearch.search_r1_format import iter_wiki_corpus


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("deepsearch") / "data")


@pytest.fixture(scope="module")
def splits(built) -> dict[str, list[dict]]:
    names = ("train", "validation", "test") + GENERALISATION_SPLITS
    return {split: read_jsonl(built / f"{split}.jsonl") for split in names}


def phrasing(text: str) -> str:
    """A phrasing compared as the questions' normalisation does (case, punctuation, articles),
    its slots kept as placeholders."""
    return " ".join(normalize_answer(part) if not part.startswith("{") else part
                    for part in re.split(r"(\{\w+\})", text) if part.strip())


def masked(sample: dict) -> str:
    """The question with the names it states (its slots) replaced by their placeholders."""
    question = sample["question"]
    for slot, value in sorted(sample["slots"].items(), key=lambda item: -len(item[1])):
        question = question.replace(value, f"{{{slot}}}")
    return phrasing(question)


def test_each_split_is_large_enough_and_counted_in_the_manifest(built, splits):
    manifest = json.loads((built / "manifest.json").read_text())
    for split in GENERALISATION_SPLITS:
        assert len(splits[split]) >= 150, split
        assert manifest["counts"][split]["questions"] == len(splits[split])
        assert len({s["id"] for s in splits[split]}) == len(splits[split])


def test_no_item_is_a_training_item(splits):
    """No question of a split is a training question; on the counterfactual split some are
    (a training country's capital now names a test country), and then the training answer is
    wrong there: that item tests exactly whether the model reads or remembers."""
    training = {}
    for sample in splits["train"]:
        training.setdefault(normalize_answer(sample["question"]), set()).update(
            normalize_answer(a) for a in sample["golden_answers"])
    for split in GENERALISATION_SPLITS:
        for sample in splits[split]:
            answers = {normalize_answer(a) for a in sample["golden_answers"]}
            if split == "test_counterfactual":
                assert not training.get(normalize_answer(sample["question"]), set()) & answers, sample
            else:
                assert normalize_answer(sample["question"]) not in training, sample


def test_the_new_wordings_are_phrasings_no_training_template_uses(splits):
    trained = {phrasing(t) for templates in TEMPLATES.values() for t in templates}
    new = {phrasing(t) for templates in WORDINGS.values() for t in templates}
    assert not trained & new
    asked = {masked(s) for s in splits["test_wordings"]}
    assert asked <= new and len(asked) > len(KINDS)  # every item in a new phrasing, many of them used
    test = {(s["kind"], s["entity"]) for s in splits["test"]}
    assert {(s["kind"], s["entity"]) for s in splits["test_wordings"]} == test  # the same questions, reworded


def test_the_compositions_are_absent_from_training_and_their_hops_present(splits):
    trained_kinds = {s["kind"] for s in splits["train"]}
    composed = {s["kind"] for s in splits["test_composition"]}
    assert composed == set(COMPOSITIONS) and not composed & trained_kinds
    # each hop is trained on alone: the capital's country, the currency-and-border clue, the fact
    assert {"country_of_capital", "capital_via_currency_border", "language", "region"} <= trained_kinds
    for sample in splits["test_composition"]:
        assert masked(sample) not in {phrasing(t) for templates in TEMPLATES.values() for t in templates}


def test_a_memorised_answer_scores_nothing_on_the_counterfactual_split(built, splits):
    real = {normalize_answer(s["question"]): s for split in ("train", "validation", "test") for s in splits[split]}
    same_question = 0
    for sample in splits["test_counterfactual"]:
        assert sample["corpus"] == COUNTERFACTUAL
        twin = real.get(normalize_answer(sample["question"]))
        if twin is not None:  # the same question about the real world: no answer in common
            same_question += 1
            assert not ({normalize_answer(a) for a in twin["golden_answers"]}
                        & {normalize_answer(a) for a in sample["golden_answers"]}), sample["question"]
    assert same_question >= len(splits["test_counterfactual"]) // 2
    # nor the real fact of the country the question is about (the changed first hop found, the
    # second answered from memory)
    facts = {}
    for sample in splits["test"] + splits["validation"] + splits["train"]:
        if sample["kind"] in ("capital", "currency", "language", "region"):
            facts[(sample["entity"], sample["kind"])] = {normalize_answer(a) for a in sample["golden_answers"]}
    for sample in splits["test_counterfactual"]:
        fact = sample["kind"].split("_via_")[0]
        answers = {normalize_answer(a) for a in sample["golden_answers"]}
        assert not facts.get((sample["entity"], fact), set()) & answers, sample
    # the changed world states other facts for every country: no capital passage is the real one
    passages = {row["contents"] for row in iter_wiki_corpus(built / "corpus.jsonl")}
    changed = [row["contents"] for row in iter_wiki_corpus(built / "corpus_counterfactual.jsonl")]
    capitals = [text for text in changed if " is the capital city of " in text]
    assert len(capitals) > 150 and not set(capitals) & passages


async def test_a_counterfactual_sample_searches_the_changed_world_through_the_tool_manager(built, splits):
    env = DeepSearchEnv(data_dir=str(built))
    manager = ConcurrentToolManager(env.tools, timeout_s=60)
    sample = next(s for s in splits["test_counterfactual"] if s["kind"] == "capital")
    real = next(s for s in splits["test"] if s["kind"] == "capital" and s["entity"] == sample["entity"])
    call = ToolCall(name="search", arguments={"query": f"{sample['entity']} capital"})
    try:
        [changed] = await manager.call([call], {"sample": sample})
        [kept] = await manager.call([call], {"sample": real})
    finally:
        await manager.close()
    assert changed.ok and kept.ok
    assert f"{sample['answer']} is the capital city of {sample['entity']}" in changed.content
    assert f"{real['answer']} is the capital city of {real['entity']}" in kept.content


def test_the_counterfactual_split_needs_the_built_corpus(built, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "0", "contents": "\\"A\\"\\nB"}\n')
    for env in (DeepSearchEnv(retriever="http", url="http://127.0.0.1:9", data_dir=str(built)),
                DeepSearchEnv(corpus=str(corpus), data_dir=str(built))):
        with pytest.raises(ConfigError, match="test_counterfactual"):
            env.dataset(4, split="test_counterfactual")
        assert len(env.dataset(4, split="test_wordings")) == 4  # the others need no other corpus


async def test_a_sample_from_a_file_naming_a_corpus_the_env_cannot_search_fails_on_the_infrastructures_side(
        built, splits):
    """Samples read from a JSONL file skip dataset()'s check: their first search fails, and the
    failure is the run's setup's (masked, counted), not a wrong query of the model's."""
    from rlfactory_core import Trajectory, outcome_of

    env = DeepSearchEnv(retriever="http", url="http://127.0.0.1:9", data_dir=str(built))
    manager = ConcurrentToolManager(env.tools, timeout_s=30, max_retries=0)
    call = ToolCall(name="search", arguments={"query": "Peru capital"})
    try:
        [result] = await manager.call([call], {"sample": splits["test_counterfactual"][0]})
    finally:
        await manager.close()
    assert not result.ok and "test_counterfactual" in result.content
    ended = Trajectory(sample_id="s", prompt_ids=[1], tool_results=[result], stop_reason="env_done", final_answer="x")
    assert outcome_of(ended) == "tool_infra_error"


async def test_the_scripted_procedure_solves_most_of_every_split(built):
    """The ceiling of the scripted solver (the demonstrations' procedure): its searches find
    what each step needs for at least 85% of every split (bench/README.md has the figures)."""
    env = DeepSearchEnv(data_dir=str(built))

    async def solved(sample: dict) -> bool:
        for query, needed in search_plan(sample):
            found = await env.tools[0].call({"query": query}, {"sample": sample})
            if f" {normalize_answer(needed)} " not in f" {normalize_answer(found)} ":
                return False
        return True

    try:
        for split in ("test",) + GENERALISATION_SPLITS:
            samples = env.dataset(None, split=split)
            assert all(search_plan(s) is not None for s in samples), split
            share = sum(await asyncio.gather(*map(solved, samples))) / len(samples)
            assert share >= 0.85, (split, share)
    finally:
        await env.tools[0].close()


async def test_the_tools_off_baseline_offers_no_search_and_shows_no_searching(built):
    from rlfactory_core import ConfigError as Refused

    env = DeepSearchEnv(use_tools=False, data_dir=str(built))
    sample = env.dataset(1, split="test_wordings")[0]
    reset = await env.reset(sample)
    assert reset.tools == [] and env.tools == []
    shown = " ".join(str(m.content) for m in reset.messages)
    assert "search" not in shown.lower() and "<answer>Norwegian Krone</answer>" in shown
    assert await env.demonstration(sample, env.parser) is None
    with pytest.raises(Refused, match="require_search"):
        DeepSearchEnv(use_tools=False, require_search=True)
