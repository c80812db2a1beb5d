"""The nl2sql env's demonstrations for the cold start (``cold_start.source: demonstrations``):
the gold query run with ``run_query`` (its real result in the trajectory), then the answer,
which the ``sql_execution`` reward scores as an execution match."""

from __future__ import annotations

import asyncio

from rlfactory_core import ChatTemplate, ToolCall
from rlfactory_core.testing import build_task, demonstration_examples, load_config
from rlfactory_nl2sql.sandbox import format_table, run_query


def test_a_demonstration_runs_the_gold_query_and_its_answer_scores_one(built, default_model_dir):
    from transformers import AutoTokenizer

    config = load_config([], [f"env_options={{data_dir: {built}}}"], flags={"env": "nl2sql"})
    task = build_task(config)
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    samples = task.env.dataset(size=3, split="train")

    async def run():
        turns = await task.env.demonstration(samples[0], task.parser)
        kept, rows, tried, failed = await demonstration_examples(task, ChatTemplate(tokenizer), samples, config, 3)
        scored = await task.eval_rewards.score(kept, [samples[r] for r in rows])  # format_score 0: the match alone
        no_gold = await task.env.demonstration({k: v for k, v in samples[0].items() if k != "query"}, task.parser)
        await task.close()
        return turns, kept, rows, tried, failed, scored, no_gold

    turns, kept, rows, tried, failed, scored, no_gold = asyncio.run(run())
    gold = samples[0]["query"]
    assert turns == [task.parser.format_tool_call(ToolCall(name="run_query", arguments={"query": gold})),
                     f"<answer>{gold}</answer>"]
    assert (tried, failed, rows) == (3, 0, [0, 1, 2])
    demo = kept[0]
    # the tool really ran: the observation holds the gold query's real result, as the env shows it
    assert [c.name for c in demo.tool_calls] == ["run_query"] and demo.tool_calls[0].arguments == {"query": gold}
    db_path = task.env.resolve_database(samples[0])
    shown = format_table(run_query(db_path, gold, task.env.display_limits(task.env.max_rows)), task.env.max_cell_chars)
    assert demo.tool_results[0].ok and demo.tool_results[0].content == shown
    assert shown in tokenizer.decode([i for s in demo.segments if s.kind == "observation" for i in s.token_ids])
    assert demo.final_answer == gold and demo.stop_reason == "env_done"
    assert scored.totals == [1.0, 1.0, 1.0] and scored.correct == [True, True, True]
    assert no_gold is None
