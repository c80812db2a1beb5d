"""The degenerate baselines of the android env's built-in test splits (issue 40), scored by
the env's own success check (side effects included) on the simulated phone.

A success rate on a split counts only by how far it is above what needs no reading of the
screen. Computed here without a model, on every task of each split:

* ``nearest training demonstration``: the scripted demonstration of the training task whose
  goal has the most words in common (Jaccard; the first such task on a tie), its tool calls
  replayed unchanged, element numbers included (a model that memorised its training
  episodes);
* ``nothing``: answer "Done." at once (the start state never passes the check);
* ``scripted solver``: the demonstration made for the task itself (the ceiling: every task
  has one, so 1.000 unless the solver broke).

    .venv/bin/python bench/android_baselines.py
"""

from __future__ import annotations

import asyncio
import re

from rlfactory_android import AndroidEnv
from rlfactory_android.demonstrations import replay, solve_calls
from rlfactory_android.tasks import BUILTIN_DIR, Task, load_tasks

SPLITS = ("test", "test_layouts")


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def nearest(task: Task, train: list[Task]) -> Task:
    """The training task whose goal shares the most words with ``task``'s (Jaccard), first on a tie."""
    goal = words(task.goal)
    return max(train, key=lambda t: len(goal & words(t.goal)) / max(1, len(goal | words(t.goal))))


async def baselines() -> dict[str, dict[str, float]]:
    env = AndroidEnv(few_shot=False)
    train = load_tasks(BUILTIN_DIR / "train.jsonl")
    demos = {t.id: await solve_calls(env, t) for t in train}
    table: dict[str, dict[str, float]] = {}
    for split in SPLITS:
        tasks = load_tasks(BUILTIN_DIR / f"{split}.jsonl")
        solved = {"nearest training demonstration": 0, "nothing": 0, "scripted solver": 0}
        for task in tasks:
            memorised = demos[nearest(task, train).id] or []
            own = await solve_calls(env, task)
            solved["nearest training demonstration"] += (await replay(env, task, memorised))[0]
            solved["nothing"] += (await replay(env, task, []))[0]
            solved["scripted solver"] += own is not None and (await replay(env, task, own))[0]
        table[split] = {name: count / len(tasks) for name, count in solved.items()} | {"tasks": len(tasks)}
    return table


def main() -> None:
    table = asyncio.run(baselines())
    print("| baseline | " + " | ".join(f"{split} ({int(table[split]['tasks'])})" for split in SPLITS) + " |")
    print("|---|" + "---|" * len(SPLITS))
    for name in ("nearest training demonstration", "nothing", "scripted solver"):
        print(f"| {name} | " + " | ".join(f"{table[split][name]:.3f}" for split in SPLITS) + " |")


if __name__ == "__main__":
    main()
