"""The Spider and BIRD loaders (``rlfactory_nl2sql.formats``) on small files written here in
exactly those datasets' formats, and the env reading them (``source: spider`` / ``bird``)."""

from __future__ import annotations

import pytest

from rlfactory_core import ConfigError
from rlfactory_nl2sql import NL2SQLEnv, SQLExecutionReward, run_query
from rlfactory_nl2sql.formats import load_bird, load_spider, load_tables_json, read_json_rows

from nl2sql_testdata import BIRD_DEV, SPIDER_TRAIN, write_json


def test_spider_files_load_as_samples(spider_dir):
    train = load_spider(spider_dir / "train_spider.json")
    assert [s["question"] for s in train] == [row["question"] for row in SPIDER_TRAIN]
    first = train[0]
    assert first == {
        "id": "spider-train_spider-0", "db_id": "concert_singer", "question": "How many singers do we have?",
        "query": "SELECT count(*) FROM singer", "answer": "SELECT count(*) FROM singer", "evidence": "",
        "db_path": str(spider_dir / "database" / "concert_singer" / "concert_singer.sqlite"), "source": "spider"}
    assert train[2]["db_path"].endswith("database/pets/pets.sqlite")
    dev = load_spider(spider_dir / "dev.json")
    assert [s["id"] for s in dev] == ["spider-dev-0", "spider-dev-1"]
    for sample in train + dev:  # every gold query runs on its database
        assert run_query(sample["db_path"], sample["query"]).rows


def test_spider_tables_json_is_read_and_checked(spider_dir):
    tables = load_tables_json(spider_dir / "tables.json")
    assert sorted(tables) == ["concert_singer", "pets"]
    assert tables["concert_singer"]["table_names_original"] == ["stadium", "singer", "concert"]
    assert [-1, "*"] == tables["pets"]["column_names_original"][0]
    # a database that exists on disk but not in tables.json is refused, naming tables.json
    write_json(spider_dir / "tables.json", [tables["pets"]])
    with pytest.raises(ConfigError, match=r"db_id 'concert_singer' is not in tables.json \(its databases: pets\)"):
        load_spider(spider_dir / "train_spider.json")
    write_json(spider_dir / "tables.json", [{"db_id": "pets"}, "oops"])
    with pytest.raises(ConfigError) as info:
        load_tables_json(spider_dir / "tables.json")
    assert len(info.value.errors) == 2 and "needs a list 'table_names_original'" in info.value.errors[0]


def test_bird_files_load_with_evidence_and_their_question_ids(bird_dir):
    samples = load_bird(bird_dir / "dev.json", tables_json=bird_dir / "dev_tables.json")
    assert [s["id"] for s in samples] == ["bird-dev-0", "bird-dev-1", "bird-dev-2"]
    first = samples[0]
    assert first["query"] == BIRD_DEV[0]["SQL"] and first["answer"] == BIRD_DEV[0]["SQL"]
    assert first["evidence"] == "'POPLATEK TYDNE' stands for weekly issuance"
    assert first["difficulty"] == "simple" and first["source"] == "bird"
    assert first["db_path"] == str(bird_dir / "dev_databases" / "financial" / "financial.sqlite")
    for sample in samples:
        assert run_query(sample["db_path"], sample["query"]).rows


def test_bad_rows_are_all_reported_with_file_row_and_fix(spider_dir, bird_dir):
    rows = [
        {"db_id": "concert_singer", "question": "ok?", "query": "SELECT 1"},
        {"db_id": "concert_singer", "query": "SELECT 1"},  # no question
        {"db_id": "nowhere", "question": "q?", "query": "SELECT 1"},  # unknown database
        ["not", "an", "object"],
        {"db_id": "pets", "question": "q?", "query": "   "},  # empty gold SQL
    ]
    path = write_json(spider_dir / "dev.json", rows)
    with pytest.raises(ConfigError) as info:
        load_spider(path, tables_json=spider_dir / "tables.json")
    errors = info.value.errors
    assert len(errors) == 4
    assert errors[0] == f"{path} row 1: needs 'question' as non-empty text (a spider row has db_id, question and query)"
    assert errors[1].startswith(f"{path} row 2: db_id 'nowhere' is not in tables.json")
    assert errors[2] == f"{path} row 3: must be a JSON object, got list"
    assert "row 4: needs 'query'" in errors[3]
    assert "\n" not in str(info.value)
    # without tables.json, an unknown db_id names where it looked and what is there
    (spider_dir / "tables.json").unlink()
    with pytest.raises(ConfigError) as info:
        load_spider(path)
    assert (f"row 2: unknown db_id 'nowhere': no nowhere/nowhere.sqlite in {spider_dir / 'database'} "
            "(databases there: concert_singer, pets)") in str(info.value)
    # BIRD rows need SQL (not query), evidence must be text
    bad = write_json(bird_dir / "dev.json", [{"db_id": "financial", "question": "q?", "query": "SELECT 1"},
                                             {"db_id": "financial", "question": "q?", "SQL": "SELECT 1",
                                              "evidence": 3}])
    with pytest.raises(ConfigError) as info:
        load_bird(bad)
    assert info.value.errors == [
        f"{bad} row 0: needs 'SQL' as non-empty text (a bird row has db_id, question and SQL)",
        f"{bad} row 1: 'evidence' must be text, got int"]


def test_many_bad_rows_are_counted_not_all_listed(spider_dir):
    path = write_json(spider_dir / "dev.json", [{"db_id": "pets"}] * 12)
    with pytest.raises(ConfigError) as info:
        load_spider(path)
    assert len(info.value.errors) == 6 and info.value.errors[-1] == "and 7 more problems"


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON (Expecting property name enclosed in double quotes at line 1, column 2)"),
    ('{"db_id": "pets"}', "must hold a JSON array of rows, got a JSON dict"),
])
def test_unreadable_files_get_one_line(tmp_path, content, message):
    path = tmp_path / "dev.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match="hold one JSON array") as info:
        read_json_rows(path)
    assert info.value.errors == [f"{path}: {message}"]
    with pytest.raises(ConfigError, match="no such file"):
        read_json_rows(tmp_path / "missing.json")


async def test_the_env_reads_spider(spider_dir):
    env = NL2SQLEnv(source="spider", data_dir=str(spider_dir))
    assert set(env.split_files) == {"train", "test"}
    assert len(env.dataset(split="train")) == 3 and len(env.dataset(1, "test")) == 1
    sample = env.dataset(split="test")[0]
    reset = await env.reset(sample)
    system = reset.messages[0].content
    assert "Database concert_singer, its tables and columns:\nstadium(stadium_id, name, capacity)\n" in system
    assert [m.role for m in reset.messages] == ["system", "user"]  # the worked example is the built-in db's
    assert reset.state["db_path"] == sample["db_path"]
    # a JSONL-style sample with only a db_id is found in the databases of the split files
    found = await env.reset({"id": "x", "db_id": "pets", "question": "How many pets?"})
    assert found.state["db_path"].endswith("pets/pets.sqlite")
    with pytest.raises(ValueError, match=r"unknown db_id 'zoo': no zoo/zoo.sqlite in .*database \(databases "
                                         r"there: concert_singer, pets\); check env_options.data_dir / db_dir"):
        await env.reset({"id": "y", "db_id": "zoo", "question": "How many animals?"})


async def test_the_env_reads_bird_with_the_hint(bird_dir, tmp_path):
    env = NL2SQLEnv(source="bird", data_dir=str(bird_dir), splits={"train": None, "test": "dev.json"})
    samples = env.dataset(split="test")
    reset = await env.reset(samples[0])
    assert reset.messages[-1].content == ("Question: How many accounts have a weekly issuance?\n"
                                          "Hint: 'POPLATEK TYDNE' stands for weekly issuance")
    quiet = NL2SQLEnv(source="bird", data_dir=str(bird_dir), splits={"train": None}, use_evidence=False)
    assert (await quiet.reset(samples[0])).messages[-1].content == "Question: How many accounts have a weekly issuance?"
    # the databases may live elsewhere: db_dir
    moved = tmp_path / "elsewhere"
    (bird_dir / "dev_databases").rename(moved)
    with pytest.raises(ConfigError, match="unknown db_id 'financial'"):
        env.dataset(split="test")
    env = NL2SQLEnv(source="bird", data_dir=str(bird_dir), db_dir=str(moved), splits={"train": None})
    assert len(env.dataset(split="test")) == 3


def test_a_bird_gold_query_is_scored_by_the_reward(bird_dir):
    from rlfactory_core import Message, Segment, Trajectory

    env = NL2SQLEnv(source="bird", data_dir=str(bird_dir), splits={"train": None})
    ordered = env.dataset(split="test")[2]  # ORDER BY amount DESC: the order counts
    reward = SQLExecutionReward()

    def scored(sql):
        t = Trajectory(sample_id="b", prompt_ids=[1], final_answer=sql)
        t.messages = [Message("assistant", f"<answer>{sql}</answer>")]
        t.segments = [Segment("model", [1], [0.0])]
        return reward.score(t, ordered)

    assert scored("SELECT loan_id FROM loan ORDER BY amount DESC").correct
    assert not scored("SELECT loan_id FROM loan ORDER BY amount").correct
