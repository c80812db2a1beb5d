"""The degenerate baselines of each built-in nl2sql split (issue 40), scored by the real
``sql_execution`` reward (both databases: the real one and the check copy).

A score on a split counts only by how far it is above the best answer that needs no
understanding of SQL. Computed here without a model, on every item of each split:

* ``constant``: the gold result written as a constant query (``SELECT 'Lima'``), the best any
  constant can do: it counts only where the check copy gives the same answer;
* ``nearest training query``: the gold SQL of the training question with the most words in
  common, unchanged (a model that memorised its training queries);
* ``template fill``: the training template nearest the question in words (names and numbers
  masked), its slots filled with the names the question states (found in the database's own
  names, longest first) and its number: the slot-filling the in-template test measures;
* ``scripted solver``: the gold SQL itself, run as the warm-up's demonstrations run it (1.000
  by construction: the ceiling).

The model with its tools turned off is a model run (``env_options.tools: false``), recorded
beside the trained models' scores in bench/README.md.

    .venv/bin/python bench/nl2sql_baselines.py
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

from rlfactory_core import Message, Trajectory
from rlfactory_nl2sql import SQLExecutionReward
from rlfactory_nl2sql.data import DATABASE_FILE, KINDS
from rlfactory_nl2sql.env import NL2SQLEnv
from rlfactory_nl2sql.facts import gold_sql
from rlfactory_nl2sql.sandbox import run_query

SPLITS = ("test", "test_wordings", "test_skeletons")
#: The database's names a question may state, by slot, as ``SELECT`` queries of them.
NAMES = {"country": "SELECT name FROM countries", "capital": "SELECT name FROM capitals",
         "region": "SELECT DISTINCT region FROM countries", "subregion": "SELECT DISTINCT subregion FROM countries",
         "currency": "SELECT name FROM currencies", "language": "SELECT name FROM languages"}


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def masked_words(text: str, names: list[tuple[str, str]]) -> set[str]:
    for name, _ in names:
        text = text.replace(name, " ")
    return words(re.sub(r"\d[\d,]*", " ", re.sub(r"\{\w+\}", " ", text)))


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / max(1, len(a | b))


def stated(question: str, names: list[tuple[str, str]]) -> dict[str, str]:
    """The names a question states, by slot (longest names first, each span used once), and its number."""
    found: dict[str, str] = {}
    rest = question
    for name, slot in names:
        if re.search(rf"(?<!\w){re.escape(name)}(?!\w)", rest):
            found.setdefault(slot, name)
            rest = rest.replace(name, " ")
    number = re.search(r"\d[\d,]*", rest)
    if number:
        found["threshold"] = number.group().replace(",", "")
    return found


def score(reward: SQLExecutionReward, sql: str | None, sample: dict[str, Any]) -> bool:
    if not sql:
        return False
    trajectory = Trajectory(sample_id=sample["id"], prompt_ids=[1])
    trajectory.messages = [Message("assistant", f"<answer>{sql}</answer>")]
    trajectory.final_answer = sql
    return bool(reward.score(trajectory, sample).correct)


def constant(sample: dict[str, Any]) -> str:
    rows = run_query(sample["db_path"], sample["query"]).rows
    cells = [", ".join("'" + str(v).replace("'", "''") + "'" if isinstance(v, str) else repr(v) for v in row)
             for row in rows]
    return " UNION ALL ".join(f"SELECT {c}" for c in cells)


def main() -> None:
    env = NL2SQLEnv()
    train = env.dataset(None, split="train")
    database = env.build_data() / DATABASE_FILE
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as conn:
        names = sorted({(row[0], slot) for slot, sql in NAMES.items() for row in conn.execute(sql) if row[0]},
                       key=lambda pair: (-len(pair[0]), pair))
    templates = {kind: masked_words(question, names) for kind, (question, _) in KINDS.items()}
    train_words = [(words(s["question"]), s["query"]) for s in train]
    reward = SQLExecutionReward(format_score=0)

    def template_fill(sample: dict[str, Any]) -> str | None:
        question_words = masked_words(sample["question"], names)
        kind = max(templates, key=lambda k: (jaccard(question_words, templates[k]), k))
        slots = stated(sample["question"], names)
        needed = re.findall(r"\{(\w+)\}", KINDS[kind][1])
        if not all(slot in slots for slot in needed):
            return None
        return gold_sql(KINDS[kind][1], {slot: slots[slot] for slot in needed})

    def nearest(sample: dict[str, Any]) -> str:
        question_words = words(sample["question"])
        return max(train_words, key=lambda pair: jaccard(question_words, pair[0]))[1]

    baselines = {"constant": constant, "nearest training query": nearest, "template fill": template_fill,
                 "scripted solver (ceiling)": lambda s: s["query"]}
    print("| split | items | " + " | ".join(baselines) + " |")
    print("|---|---|" + "---|" * len(baselines))
    for split in SPLITS:
        samples = env.dataset(None, split=split)
        cells = [f"{sum(score(reward, make(s), s) for s in samples) / len(samples):.3f}" for make in baselines.values()]
        print(f"| {split} | {len(samples)} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
