"""The splits beyond the training templates (issue 40) and the check database: they exist as
documented, they are honest (no test item is a training item; no skeleton, join path or
aggregate pattern of test_skeletons is in training), and a query counts only when it is right
on the real database and on the check copy."""

from __future__ import annotations

import json
import re
import sqlite3

import pytest

from rlfactory_core import ConfigError
from rlfactory_nl2sql import SQLExecutionReward, data
from rlfactory_nl2sql.data import CHECK_DATABASE_FILE, DATABASE_FILE, KINDS
from rlfactory_nl2sql.env import NL2SQLEnv
from rlfactory_nl2sql.formats import load_spider
from rlfactory_nl2sql.generalisation import SKELETON_KINDS, WORDINGS, join_path, patterns, skeleton
from rlfactory_nl2sql.sandbox import read_schema, run_query

from test_nl2sql_reward import trajectory

GENERALISATION = ("test_wordings", "test_skeletons")


@pytest.fixture(scope="module")
def splits(built) -> dict[str, list[dict]]:
    return {split: load_spider(built / name) for split, name in data.SPLITS.items()}


def _words(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def _masked(sample: dict) -> str:
    """The question with the names its gold SQL states masked, normalised (case, punctuation)."""
    question = sample["question"]
    for literal in sorted(re.findall(r"'((?:[^']|'')*)'", sample["query"]), key=len, reverse=True):
        question = question.replace(literal.replace("''", "'"), " X ")
    question = re.sub(r"\d[\d,]*", " N ", question)
    return _words(question)


def test_the_splits_are_built_large_enough_and_every_question_names_the_check_copy(built, splits):
    assert len(splits["test_wordings"]) == len(splits["test"]) >= 150
    assert len(splits["test_skeletons"]) >= 150
    assert {s["kind"] for s in splits["test_skeletons"]} == set(SKELETON_KINDS)
    check = str(built / CHECK_DATABASE_FILE)
    assert all(s["check_db_path"] == check for rows in splits.values() for s in rows)
    manifest = json.loads((built / "manifest.json").read_text())
    assert set(manifest["files"]) >= {CHECK_DATABASE_FILE, "test_wordings.json", "test_skeletons.json"}
    # the env serves them by name, as eval.splits asks for them
    env = NL2SQLEnv(data_dir=str(built))
    assert [s["id"] for s in env.dataset(5, split="test_skeletons")] == [s["id"] for s in splits["test_skeletons"][:5]]


def test_the_check_copy_has_the_schema_and_names_but_other_facts(built, splits):
    real, check = built / DATABASE_FILE, built / CHECK_DATABASE_FILE
    assert read_schema(real) == read_schema(check)

    def rows(path, sql):
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            return conn.execute(sql).fetchall()

    assert rows(real, "SELECT code, name FROM countries ORDER BY code") == \
        rows(check, "SELECT code, name FROM countries ORDER BY code")
    moved = rows(real, "SELECT code, population, subregion FROM countries ORDER BY code")
    other = rows(check, "SELECT code, population, subregion FROM countries ORDER BY code")
    assert sum(a != b for a, b in zip(moved, other)) > 0.9 * len(moved)
    # most answers differ, so a constant answer fails on most questions (the manifest says how many)
    counts = json.loads((built / "manifest.json").read_text())["counts"]
    for split, rows_ in splits.items():
        assert counts[split]["answer_differs_on_check_db"] >= 0.9 * len(rows_), split


def test_no_test_question_is_a_training_question_after_normalisation(splits):
    train = {_masked(s) for s in splits["train"]}
    templates = {_words(t) for t, _ in KINDS.values()}
    for template in WORDINGS.values():
        assert _words(template) not in templates, template
    for split in GENERALISATION:
        overlap = [s["question"] for s in splits[split] if _masked(s) in train]
        assert not overlap, f"{split}: {overlap[:3]}"
    assert not {s["id"] for s in splits["train"]} & {s["id"] for split in ("test",) + GENERALISATION
                                                       for s in splits[split]}


def test_no_skeleton_of_test_skeletons_occurs_in_training_and_new_paths_and_patterns_are_needed(splits):
    train = splits["train"]
    seen_skeletons = {skeleton(s["query"]) for s in train} | {skeleton(data.EXAMPLE_SQL)}
    seen_paths = {join_path(s["query"]) for s in train} | {join_path(data.EXAMPLE_SQL)}
    seen_patterns = {p for s in train for p in patterns(s["query"])} | set(patterns(data.EXAMPLE_SQL))
    for sample in splits["test_skeletons"]:
        assert skeleton(sample["query"]) not in seen_skeletons, sample["query"]
    new_paths = {join_path(s["query"]) for s in splits["test_skeletons"]} - seen_paths
    new_patterns = {p for s in splits["test_skeletons"] for p in patterns(s["query"])} - seen_patterns
    assert len(new_paths) >= 2 and {("borders", "capitals", "countries")} <= new_paths, new_paths
    assert {"avg", "group by", "having", "order by column asc", "order by computed desc"} <= new_patterns
    # the masking really masks: two questions of one template share a skeleton
    assert len({skeleton(s["query"]) for s in train if s["kind"] == "capital"}) == 1


def test_every_generalisation_gold_sql_runs_non_empty_on_the_real_database(built, splits):
    for split in GENERALISATION:
        for sample in splits[split]:
            result = run_query(built / DATABASE_FILE, sample["query"])
            assert result.rows and result.rows[0][0] is not None, sample
            if split == "test_skeletons" and sample["query"].startswith("SELECT COUNT(*)"):
                assert result.rows != [(0,)], sample


def test_a_constant_or_copied_result_is_right_on_one_database_only(built, splits):
    reward = SQLExecutionReward()
    sample = next(s for s in splits["test"] if s["kind"] == "capital")
    real = run_query(built / DATABASE_FILE, sample["query"]).rows
    constant = "SELECT " + ", ".join("'" + str(v).replace("'", "''") + "'" for v in real[0])
    out = reward.score(trajectory(f"<answer>{constant}</answer>"), sample)
    assert out.correct is False and out.value == pytest.approx(0.1)
    assert out.components["check_db_mismatch"] == 1.0 and out.components["execution_match"] == 0.0
    gold = trajectory(f"<answer>{sample['query']}</answer>")
    out = reward.score(gold, sample)
    assert out.correct is True and out.components["check_db_mismatch"] == 0.0
    # without a check copy (a user's own dataset) the constant counts, as it always did
    plain = {k: v for k, v in sample.items() if k != "check_db_path"}
    assert reward.score(trajectory(f"<answer>{constant}</answer>"), plain).correct is True
    # a query wrong on the real database is not a check-copy mismatch: it never reaches the copy
    wrong = trajectory("<answer>SELECT name FROM capitals WHERE country_code = 'XXX'</answer>")
    assert reward.score(wrong, sample).components["check_db_mismatch"] == 0.0  # wrong already on the real one


def test_a_query_failing_on_the_check_copy_is_wrong_there_and_a_broken_copy_names_itself(built, splits, tmp_path):
    """A query right on the real database that fails on the check copy (here: it also reads a
    table the copy lacks) scores 0 with the copy's error recorded; a check copy on which the gold
    SQL itself fails is the dataset's error, one line naming the sample and the copy."""
    import shutil
    import sqlite3

    sample = next(s for s in splits["test"] if s["kind"] == "capital")
    copy = tmp_path / "check.sqlite"
    shutil.copy(sample["check_db_path"], copy)
    with sqlite3.connect(copy) as db:
        db.execute("DROP TABLE borders")
    reward = SQLExecutionReward()
    on_copy = {**sample, "check_db_path": str(copy)}
    reads_borders = sample["query"].rstrip(";") + " AND EXISTS (SELECT 1 FROM borders)"
    assert run_query(built / DATABASE_FILE, reads_borders).rows == run_query(built / DATABASE_FILE, sample["query"]).rows
    t = trajectory(f"<answer>{reads_borders}</answer>")
    out = reward.score(t, on_copy)
    assert out.correct is False and out.components["check_db_mismatch"] == 1.0
    assert t.metadata["sql_execution"]["database"] == "check" and "borders" in t.metadata["sql_execution"]["error"]
    with sqlite3.connect(copy) as db:
        db.execute("DROP TABLE capitals")
    with pytest.raises(RuntimeError, match=rf"the gold SQL of sample {sample['id']} failed on {copy}: .*capitals"
                                           r".*fix or drop this dataset row"):
        SQLExecutionReward().score(trajectory(f"<answer>{sample['query']}</answer>"), on_copy)


def test_a_row_naming_an_unknown_check_database_is_a_one_line_error(built, tmp_path):
    rows = json.loads((built / "test.json").read_text())[:2]
    rows[1]["check_db_id"] = "nowhere"
    rows[0]["check_db_id"] = 7
    (tmp_path / "database").symlink_to(built / "database")
    (tmp_path / "split.json").write_text(json.dumps(rows))
    with pytest.raises(ConfigError) as info:
        load_spider(tmp_path / "split.json")
    text = str(info.value)
    assert "row 0: 'check_db_id' must name a database, got 7" in text
    assert "row 1: unknown check_db_id 'nowhere'" in text
