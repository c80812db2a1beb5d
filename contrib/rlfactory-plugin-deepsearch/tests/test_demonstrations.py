"""The deepsearch env's demonstrations for the cold start (``cold_start.source: demonstrations``):
the searches for each kind of countryinfo question, checked against the corpus, replayed
through the agent loop and kept only when the rewards call them correct."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from rlfactory_core import ChatTemplate, ToolCall
from rlfactory_core.testing import build_task, demonstration_examples, load_config
from rlfactory_deepsearch import DeepSearchEnv
from rlfactory_deepsearch.data import KINDS
from rlfactory_deepsearch.env import search_plan


def sample(kind, question, entity, answer):
    return {"id": kind, "question": question, "kind": kind, "entity": entity, "answer": answer,
            "golden_answers": [answer]}


@pytest.mark.parametrize("row, plan", [
    (sample("capital", "What is the capital of Peru?", "Peru", "Lima"), [("Peru capital", "Lima")]),
    (sample("language", "Which language is spoken in Egypt?", "Egypt", "Arabic"), [("Egypt language", "Arabic")]),
    (sample("country_of_capital", "Which country has Lima as its capital?", "Peru", "Peru"),
     [("Lima capital", "Peru")]),
    (sample("country_of_capital", "Lima is the capital of which country?", "Peru", "Peru"),
     [("Lima capital", "Peru")]),
    (sample("currency_via_capital", "Which currency is used in the country whose capital city is Stockholm?",
            "Sweden", "Swedish Krona"), [("Stockholm capital", "Sweden"), ("Sweden currency", "Swedish Krona")]),
    (sample("region_via_capital", "Which region is the country whose capital is Asunción in?", "Paraguay",
            "Americas"), [("Asunción capital", "Paraguay"), ("Paraguay region", "Americas")]),
    (sample("capital_via_currency_border",
            "Which city is the capital of the country that borders Honduras and uses the US Dollar?",
            "El Salvador", "San Salvador"),
     [("US Dollar Honduras", "El Salvador"), ("El Salvador capital", "San Salvador")]),
])
def test_the_searches_of_each_kind_of_question(row, plan):
    assert search_plan(row) == plan


def test_samples_without_a_known_kind_or_phrasing_have_no_plan():
    assert search_plan({"question": "Who wrote Hamlet?", "golden_answers": ["Shakespeare"]}) is None  # Search-R1's
    assert search_plan(sample("population", "How many people live in Peru?", "Peru", "33 million")) is None
    assert search_plan(sample("currency_via_capital", "Name the money of the land ruled from Lima.", "Peru",
                              "Sol")) is None


def test_demonstrations_replay_correctly_with_two_distinct_searches_for_two_hop_questions(built, default_model_dir):
    from transformers import AutoTokenizer

    config = load_config([], [f"env_options={{data_dir: {built / 'data'}, cache_dir: {built / 'cache'}}}"],
                         flags={"env": "deepsearch"})
    task = build_task(config)
    chat = ChatTemplate(AutoTokenizer.from_pretrained(default_model_dir))
    samples = task.env.dataset(size=None, split="train")
    by_kind = {kind: [s for s in samples if s["kind"] == kind][:3] for kind in KINDS}
    chosen = [s for rows in by_kind.values() for s in rows]

    async def run():
        kept, rows, tried, failed = await demonstration_examples(task, chat, chosen, config, len(chosen))
        scored = await task.eval_rewards.score(kept, [chosen[r] for r in rows])  # plain exact match
        no_plan = await task.env.demonstration({"question": "Who wrote Hamlet?", "answer": "Shakespeare"},
                                               task.parser)
        no_parser = await task.env.demonstration(chosen[0], type("NoCalls", (), {})())
        await task.close()
        return kept, rows, tried, failed, scored, no_plan, no_parser

    kept, rows, tried, failed, scored, no_plan, no_parser = asyncio.run(run())
    assert tried == len(chosen) and failed == 0
    assert Counter(chosen[r]["kind"] for r in rows).keys() == set(KINDS)  # every kind has demonstrations
    assert scored.correct == [True] * len(kept)
    for trajectory, row in zip(kept, rows):
        hops = KINDS[chosen[row]["kind"]]
        queries = [call.arguments["query"] for call in trajectory.tool_calls]
        assert len(set(queries)) == hops and trajectory.stop_reason == "env_done"
        assert all(result.ok for result in trajectory.tool_results)
        assert trajectory.final_answer == chosen[row]["answer"]
    assert no_plan is None and no_parser is None


async def test_a_search_that_misses_the_needed_fact_gives_no_demonstration(built):
    env = DeepSearchEnv(data_dir=str(built / "data"), cache_dir=str(built / "cache"))
    parser = env.parser
    row = sample("capital", "What is the capital of Peru?", "Peru", "Lima")
    try:
        search = parser.format_tool_call(ToolCall(name="search", arguments={"query": "Peru capital"}))
        assert await env.demonstration(row, parser) == [search, "<answer>Lima</answer>"]
        # a gold answer the corpus does not hold: the search cannot have found it
        assert await env.demonstration({**row, "answer": "Atlantis"}, parser) is None
    finally:
        await env.tools[0].close()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("deepsearch-demonstrations")
    DeepSearchEnv.build_data(root / "data")
    return root
