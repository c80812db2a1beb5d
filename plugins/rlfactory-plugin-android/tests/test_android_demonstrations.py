"""The android env's demonstrations for the cold start (``cold_start.source: demonstrations``): a
scripted solver over the simulated phone (rlfactory_android.demonstrations), replayed by the
core through the agent loop and scored by the ``android_task`` reward (side effects included),
on every built-in split: shuffled layouts and long lists too."""

from __future__ import annotations

import asyncio

from rlfactory_core import ChatTemplate, ToolCall
from rlfactory_core.testing import build_task, demonstration_examples, load_config


def test_every_builtin_task_has_a_demonstration_that_the_reward_calls_a_success(default_model_dir):
    from transformers import AutoTokenizer

    config = load_config([], [], flags={"env": "android"})
    task = build_task(config)
    chat = ChatTemplate(AutoTokenizer.from_pretrained(default_model_dir))

    async def run():
        out = {}
        for split in ("train", "validation", "test"):
            samples = task.env.dataset(split=split)
            out[split] = samples, await demonstration_examples(task, chat, samples, config, len(samples))
        wifi = next(s for s in out["train"][0] if s["id"] == "train-setting-wifi_on-on")
        turns = await task.env.demonstration(wifi, task.parser)
        on_adb = await task.env.demonstration(wifi, type("NoCalls", (), {})())  # a parser without format_tool_call
        await task.close()
        return out, wifi, turns, on_adb

    out, wifi, turns, no_parser = asyncio.run(run())
    for split, (samples, (kept, rows, tried, failed)) in out.items():
        assert (tried, failed, rows) == (len(samples), 0, list(range(len(samples)))), split
        assert all(t.stop_reason == "env_done" and t.tool_calls for t in kept), split
        assert all(t.env_state["success"] is True for t in kept), split  # the check read from the replayed phone
    # the task starts in Settings with Wi-Fi off: tap its row (found by its title on the screen shown,
    # wherever the task's layout puts it: the clock and the title come first), done
    wifi_row = 3 + wifi["start"]["layout"]["settings_order"].index("Wi-Fi")
    assert wifi_row != 3  # the training layouts never show a setting's row where the usual one does
    assert turns == [task.parser.format_tool_call(ToolCall(name="tap", arguments={"element": wifi_row})), "Done."]
    assert no_parser is None
