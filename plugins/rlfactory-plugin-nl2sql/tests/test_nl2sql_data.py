"""The built-in dataset (``rlfactory_nl2sql.data``): built for real from the installed
countryinfo and pycountry (about a second), deterministic, atomic, in the Spider format, and
every gold SQL runs and returns a non-empty result."""

from __future__ import annotations

import json
import re
from collections import Counter
import pytest

from rlfactory_core import RLFactoryError
from rlfactory_nl2sql import data, facts, run_query
from rlfactory_nl2sql.data import DB_ID, KINDS, SPLITS, build, database_file
from rlfactory_nl2sql.formats import load_spider, load_tables_json
from rlfactory_nl2sql.sandbox import QueryLimits, format_table, read_schema
from rlfactory_nl2sql.sqltext import normalise_sql, orders_rows

FILES = ("database/world/world.sqlite", "database/world_perturbed/world_perturbed.sqlite", "tables.json",
         "train.json", "validation.json", "test.json", "test_wordings.json", "test_skeletons.json", "manifest.json")
IN_TEMPLATE = ("train", "validation", "test")


@pytest.fixture(scope="module")
def splits(built) -> dict[str, list[dict]]:
    """The in-template splits (the others: test_nl2sql_generalisation.py)."""
    return {split: load_spider(built / SPLITS[split], source="builtin") for split in IN_TEMPLATE}


@pytest.fixture(scope="module")
def samples(splits) -> list[dict]:
    return [sample for split in IN_TEMPLATE for sample in splits[split]]


def test_two_builds_write_identical_files(built, tmp_path):
    again = build(tmp_path / "again")
    for name in FILES:
        assert (again / name).read_bytes() == (built / name).read_bytes(), name


def test_the_build_is_in_the_spider_format(built):
    assert sorted(str(p.relative_to(built)) for p in built.rglob("*") if p.is_file()) == sorted(FILES)
    tables = load_tables_json(built / "tables.json")
    entry = tables[DB_ID]
    assert entry["table_names_original"] == ["countries", "capitals", "currencies", "country_currencies",
                                             "languages", "country_languages", "borders"]
    names = entry["column_names_original"]
    assert names[0] == [-1, "*"] and [0, "code"] in names and len(entry["column_types"]) == len(names)
    keys = {(names[a][1], names[b][1]) for a, b in entry["foreign_keys"]}
    assert ("country_code", "code") in keys and ("currency_code", "code") in keys
    rows = json.loads((built / "test.json").read_text())
    assert set(rows[0]) == {"id", "db_id", "question", "query", "kind", "check_db_id"}


def test_the_database_holds_real_facts(built):
    db = database_file(built)

    def one(sql):
        return run_query(db, sql).rows[0][0]

    assert one("SELECT cap.name FROM capitals AS cap JOIN countries AS c ON c.code = cap.country_code "
               "WHERE c.name = 'France'") == "Paris"
    assert one("SELECT region FROM countries WHERE code = 'PER'") == "Americas"
    assert one("SELECT cu.name FROM currencies AS cu JOIN country_currencies AS cc ON cc.currency_code = cu.code "
               "WHERE cc.country_code = 'JPN'") == "Yen"
    assert one("SELECT COUNT(*) FROM borders WHERE country_code = 'DEU'") == 9
    assert one("SELECT COUNT(*) FROM borders AS a JOIN borders AS b ON a.country_code = b.neighbour_code "
               "AND a.neighbour_code = b.country_code") == one("SELECT COUNT(*) FROM borders")  # symmetric
    assert one("SELECT COUNT(*) FROM countries") == 236
    assert one("SELECT COUNT(*) FROM country_currencies WHERE currency_code IN ('CHE', 'USN', 'HRK')") == 0


def test_manifest_describes_the_files(built, splits):
    manifest = json.loads((built / "manifest.json").read_text())
    assert manifest["builder_version"] == data.BUILDER_VERSION
    assert set(manifest["sources"]) == {"countryinfo", "pycountry", "sqlglot", "sqlite"}
    for split, rows in splits.items():
        assert manifest["counts"][split]["questions"] == len(rows)
        assert sum(manifest["counts"][split]["by_kind"].values()) == len(rows)
    assert re.fullmatch(r"[0-9a-f]{64}", manifest["content_hash"])


def test_every_gold_sql_runs_and_returns_a_non_empty_result(built, samples):
    db = database_file(built)
    limits = QueryLimits(time_limit_s=10.0, max_rows=1000, overflow="error")
    for sample in samples:
        result = run_query(db, sample["query"], limits)
        assert result.rows and result.rows[0][0] is not None, sample
        assert sample["query"] == normalise_sql(sample["query"])  # written as sqlglot writes it
        assert sample["db_path"] == str(db) and sample["db_id"] == DB_ID


def test_questions_cover_every_kind_and_splits_are_disjoint(splits, samples):
    assert len(samples) > 1500
    assert set(Counter(s["kind"] for s in samples)) == set(KINDS)
    ids = [s["id"] for s in samples]
    assert len(ids) == len(set(ids))
    questions = [s["question"].lower() for s in samples]
    assert len(questions) == len(set(questions))
    share = {split: len(rows) / len(samples) for split, rows in splits.items()}
    assert 0.6 < share["train"] < 0.8 and 0.05 < share["validation"] < 0.15 and 0.12 < share["test"] < 0.28
    # the split of a question is a stable function of its id
    for split, rows in splits.items():
        assert all(facts.split_of(row["id"]) == split for row in rows)
    # top-k questions are ordered and decided without ties
    ordered = [s for s in samples if s["kind"] in ("most_populous", "largest_three")]
    assert ordered and all(orders_rows(s["query"]) for s in ordered)
    assert not any(orders_rows(s["query"]) for s in samples if s["kind"] not in ("most_populous", "largest_three"))


def test_the_worked_example_is_not_a_question_and_shows_the_real_result(built, samples):
    assert data.EXAMPLE_QUESTION.lower() not in {s["question"].lower() for s in samples}
    result = run_query(database_file(built), data.EXAMPLE_SQL)
    assert format_table(result) == "MAX(area)\n17124442\n(1 row)"  # Russia


def test_a_complete_build_is_reused_and_a_damaged_one_rebuilt(tmp_path):
    target = build(tmp_path / "data")
    messages: list[str] = []
    assert build(target, progress=messages.append) == target
    assert len(messages) == 1 and "is complete" in messages[0]
    good = (target / "test.json").read_bytes()
    (target / "test.json").write_bytes(good[: len(good) // 2])  # a torn file
    build(target, progress=messages.append)
    assert (target / "test.json").read_bytes() == good
    messages.clear()
    build(target, force=True, progress=messages.append)
    assert any("wrote test.json" in m for m in messages)


class Interrupted(Exception):
    pass


def test_an_interrupted_build_leaves_the_previous_build_or_nothing(tmp_path):
    def interrupt_at(text):
        def progress(message):
            if text in message:
                raise Interrupted(message)
        return progress

    target = tmp_path / "data"
    with pytest.raises(Interrupted):
        build(target, progress=interrupt_at("wrote test.json"))
    assert not target.exists() and list(tmp_path.iterdir()) == []  # no half dataset, no staging left
    build(target)
    before = {name: (target / name).read_bytes() for name in FILES}
    with pytest.raises(Interrupted):
        build(target, force=True, progress=interrupt_at("wrote train.json"))
    assert {name: (target / name).read_bytes() for name in FILES} == before
    assert [p.name for p in tmp_path.iterdir()] == ["data"]


def test_a_directory_with_other_files_is_never_replaced(tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(RLFactoryError, match="holds files that are not part of the nl2sql dataset"):
        build(target)
    assert (target / "notes.txt").read_text() == "mine"
    (tmp_path / "file").write_text("x")
    with pytest.raises(RLFactoryError, match="is a file, not a directory"):
        build(tmp_path / "file")


def test_rlf_data_build_nl2sql_builds_under_rlfactory_home(tmp_path, monkeypatch):
    from rlfactory_cli.app import run

    monkeypatch.setenv("RLFACTORY_HOME", str(tmp_path / "home"))
    target = tmp_path / "home" / "data" / "nl2sql"
    assert data.default_data_dir() == target
    assert run(["data", "build", "nl2sql"]) == 0
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()) == sorted(FILES)
    assert read_schema(database_file(target))
    assert run(["data", "build", "nl2sql", "--out", str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "elsewhere" / "manifest.json").read_bytes() == (target / "manifest.json").read_bytes()
