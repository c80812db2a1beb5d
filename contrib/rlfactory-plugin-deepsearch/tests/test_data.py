"""The countryinfo dataset (``rlfactory_deepsearch.data``) and Search-R1's file formats
(``rlfactory_deepsearch.search_r1_format``).

Everything is built for real from the installed countryinfo and pycountry (a build takes under
a second); the parquet files are written here with pyarrow in Search-R1's exact schema.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import re
import shutil
import unicodedata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pycountry
import pytest

from rlfactory_core import RLFactoryError, normalize_answer
from rlfactory_deepsearch import data
from rlfactory_deepsearch.data import KINDS, MAX_PASSAGE_WORDS, SPLITS, build, load_split
from rlfactory_deepsearch.facts import TEMPLATES
from rlfactory_deepsearch.search_r1_format import (
    SEARCH_R1_PREFIX,
    check_corpus_row,
    iter_wiki_corpus,
    load_search_r1_parquet,
    samples_from_search_r1_rows,
    split_title,
    write_search_r1_parquet,
)

FILES = ("corpus.jsonl", "train.jsonl", "validation.jsonl", "test.jsonl", "corpus_counterfactual.jsonl",
         "test_wordings.jsonl", "test_composition.jsonl", "test_counterfactual.jsonl", "manifest.json")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def fold(text: str) -> str:
    """Answer normalisation plus accent folding, padded: `fold(phrase) in fold(text)` is a
    whole-word match."""
    text = "".join(ch for ch in unicodedata.normalize("NFKD", text) if not unicodedata.combining(ch))
    return f" {normalize_answer(text)} "


def mentions(text: str, phrase: str) -> bool:
    return fold(phrase) in fold(text)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("deepsearch") / "data")


@pytest.fixture(scope="module")
def corpus(built) -> dict[str, dict]:
    return {row["id"]: row for row in iter_wiki_corpus(built / "corpus.jsonl")}


@pytest.fixture(scope="module")
def splits(built) -> dict[str, list[dict]]:
    return {split: read_jsonl(built / f"{split}.jsonl") for split in SPLITS}


@pytest.fixture(scope="module")
def samples(splits) -> list[dict]:
    return [sample for split in SPLITS for sample in splits[split]]


# --------------------------------------------------------------------------- build


def test_two_builds_write_identical_files(built, tmp_path):
    again = build(tmp_path / "again")
    for name in FILES:
        assert (again / name).read_bytes() == (built / name).read_bytes(), name


def test_manifest_describes_the_files(built, splits, corpus):
    manifest = json.loads((built / "manifest.json").read_text())
    assert manifest["builder_version"] == data.BUILDER_VERSION
    assert set(manifest["sources"]) == {"countryinfo", "pycountry"}
    assert manifest["sources"]["pycountry"] == importlib.metadata.version("pycountry")
    assert manifest["counts"]["passages"] == len(corpus)
    for split, rows in splits.items():
        assert manifest["counts"][split]["questions"] == len(rows)
        assert sum(manifest["counts"][split]["by_kind"].values()) == len(rows)
    assert re.fullmatch(r"[0-9a-f]{64}", manifest["content_hash"])


def test_a_complete_build_is_reused_and_a_damaged_one_rebuilt(tmp_path):
    target = build(tmp_path / "data")
    messages: list[str] = []
    assert build(target, progress=messages.append) == target
    assert len(messages) == 1 and "is complete" in messages[0]  # nothing rebuilt
    messages.clear()
    good = (target / "test.jsonl").read_bytes()
    (target / "test.jsonl").write_bytes(good[: len(good) // 2])  # a torn file
    build(target, progress=messages.append)
    assert messages and (target / "test.jsonl").read_bytes() == good
    messages.clear()
    build(target, force=True, progress=messages.append)
    assert any("wrote manifest.json" in m for m in messages)


class Interrupted(Exception):
    pass


def interrupt_at(text: str):
    def progress(message: str) -> None:
        if text in message:
            raise Interrupted(message)
    return progress


def test_an_interrupted_rebuild_keeps_the_previous_build(built, tmp_path):
    target = tmp_path / "data"
    shutil.copytree(built, target)
    before = {name: (target / name).read_bytes() for name in FILES}
    with pytest.raises(Interrupted):
        build(target, force=True, progress=interrupt_at("wrote train.jsonl"))
    assert {name: (target / name).read_bytes() for name in FILES} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # no staging directory left


def test_an_interrupted_first_build_leaves_nothing_that_looks_complete(tmp_path):
    target = tmp_path / "data"
    with pytest.raises(Interrupted):
        build(target, progress=interrupt_at("wrote validation.jsonl"))
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []
    assert (build(target) / "manifest.json").is_file()  # the next call builds it


def test_build_refuses_to_replace_a_directory_with_other_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RLFactoryError, match="notes.txt"):
        build(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_default_locations_honour_rlfactory_home(tmp_path, monkeypatch):
    monkeypatch.setenv("RLFACTORY_HOME", str(tmp_path))
    assert data.default_data_dir() == tmp_path / "data" / "deepsearch"
    corpus_path = data.default_corpus_path()
    assert corpus_path == tmp_path / "data" / "deepsearch" / "corpus.jsonl" and corpus_path.is_file()
    assert len(load_split("validation", size=3)) == 3


# --------------------------------------------------------------------------- corpus


def test_corpus_rows_are_short_wiki18_passages_in_order(built, corpus):
    lines = (built / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["id"] for line in lines] == [str(i) for i in range(len(lines))]
    assert len(corpus) == len(lines) > 900
    for row in corpus.values():
        assert row["contents"].startswith(f'"{row["title"]}"\n') and row["title"]
        assert 3 <= len(row["text"].split()) <= MAX_PASSAGE_WORDS
    texts = {row["text"] for row in corpus.values()}
    assert "Paris is the capital city of France. It lies at 48.86° N, 2.35° E." in texts
    assert "France uses the Euro as its currency. Languages spoken in France include French." in texts


# --------------------------------------------------------------------------- questions


def test_samples_have_the_documented_fields(samples, corpus):
    for sample in samples:
        assert set(sample) == {"id", "question", "golden_answers", "answer", "hops", "kind", "data_source",
                               "entity", "supporting_ids"}
        assert sample["answer"] == sample["golden_answers"][0]
        assert sample["hops"] == KINDS[sample["kind"]] and sample["data_source"] == "countryinfo"
        assert sample["supporting_ids"] and all(i in corpus for i in sample["supporting_ids"])
    assert len({s["id"] for s in samples}) == len(samples)


def test_every_split_has_every_kind_and_test_is_large(splits):
    for split, rows in splits.items():
        assert {s["kind"] for s in rows} == set(KINDS), split
    assert len(splits["test"]) >= 200
    assert len(splits["validation"]) >= 100  # the env's default eval_size


def test_splits_share_no_question_and_no_country(splits):
    questions = {split: {normalize_answer(s["question"]) for s in rows} for split, rows in splits.items()}
    countries = {split: {s["entity"] for s in rows} for split, rows in splits.items()}
    for i, a in enumerate(SPLITS):
        for b in SPLITS[i + 1:]:
            assert not questions[a] & questions[b], (a, b)
            assert not countries[a] & countries[b], (a, b)
    assert sum(len(q) for q in questions.values()) == sum(len(rows) for rows in splits.values())
    # The env's worked examples ask about Peru, Norway, Paraguay (via Asunción), Egypt and Sweden
    # (via Stockholm): they must not give away an evaluation answer, and their passages must be
    # the corpus's own.
    assert {"Peru", "Norway", "Paraguay", "Egypt", "Sweden"} <= countries["train"]


def test_the_envs_worked_examples_quote_the_corpus(corpus):
    from rlfactory_deepsearch.env import EXAMPLES

    passages = {row["contents"] for row in corpus.values()}
    for _question, searches, _answer in EXAMPLES:
        for _query, passage in searches:
            title, _, text = passage.partition("\n")
            assert any(p.startswith(title + "\n") and text in p for p in passages), passage


def test_every_gold_answer_is_stated_in_the_corpus(samples, corpus):
    folded = [fold(row["contents"]) for row in corpus.values()]
    for sample in samples:
        support = [corpus[i]["contents"] for i in sample["supporting_ids"]]
        assert any(sample["answer"] in text for text in support), sample  # verbatim where it is needed
        for gold in map(fold, sample["golden_answers"]):  # aliases: somewhere, modulo accents and case
            assert any(gold in text for text in folded), (gold, sample["question"])


def test_no_question_contains_its_answer(samples):
    for sample in samples:
        assert not any(mentions(sample["question"], gold) for gold in sample["golden_answers"]), sample


def _slots(sample: dict) -> dict[str, str]:
    """The question's filled-in slots (capital, currency, neighbour), read back by its template."""
    for template in TEMPLATES[sample["kind"]]:
        pattern = re.escape(template)
        pattern = re.sub(r"\\\{(\w+)\\\}", lambda m: f"(?P<{m.group(1)}>.+?)", pattern)
        match = re.fullmatch(pattern, sample["question"])
        if match:
            return match.groupdict()
    raise AssertionError(f"no template of {sample['kind']} matches {sample['question']!r}")


def test_two_hop_questions_need_two_passages(samples, corpus):
    folded = [fold(row["text"]) for row in corpus.values()]
    two_hop = [s for s in samples if s["hops"] == 2]
    assert len(two_hop) > 300
    for sample in two_hop:
        clues = [fold(clue) for clue in _slots(sample).values()]
        golds = [fold(gold) for gold in sample["golden_answers"]]
        entity = fold(sample["entity"])
        first, last = corpus[sample["supporting_ids"][0]], corpus[sample["supporting_ids"][-1]]
        assert first["id"] != last["id"]
        # The first passage leads from a clue to the country, the last from the country to
        # the answer, and no passage anywhere holds a clue and the answer together.
        assert any(clue in fold(first["text"]) for clue in clues) and entity in fold(first["text"])
        assert entity in fold(last["contents"]) and sample["answer"] in last["text"]
        for text in folded:
            assert not (any(c in text for c in clues) and any(g in text for g in golds)), (sample, text)


def _border_lists(corpus: dict[str, dict]) -> dict[str, str]:
    """Country -> its border sentence's list, as ", A, B, C, " (" and " read as a comma)."""
    lists = {}
    for row in corpus.values():
        prefix = f"{row['title']} shares land borders with "
        if row["text"].startswith(prefix):
            lists[row["title"]] = ", " + row["text"][len(prefix):-1].replace(" and ", ", ") + ", "
    return lists


def test_capital_border_clues_single_out_one_country(samples, corpus):
    """Read from the corpus alone: exactly one country uses the currency and borders the
    neighbour (a border counts when either country's passage states it)."""
    borders = _border_lists(corpus)

    def listed(name: str, border_list: str) -> bool:
        return f", {name.replace(' and ', ', ')}, " in border_list

    checked = 0
    for sample in samples:
        if sample["kind"] != "capital_via_currency_border":
            continue
        slots = _slots(sample)
        currency = re.compile(rf"\bthe {re.escape(slots['currency'])}\b")
        users = {row["title"] for row in corpus.values()
                 if row["text"].startswith(f"{row['title']} uses ") and currency.search(row["text"])}
        neighbours = {country for country, border_list in borders.items() if listed(slots["neighbour"], border_list)}
        neighbours |= {country for country in users if listed(country, borders.get(slots["neighbour"], ""))}
        assert users & neighbours == {sample["entity"]}, sample
        checked += 1
    assert checked >= 40


def test_gold_answers_are_names_not_codes(samples):
    codes = {c.alpha_2 for c in pycountry.countries} | {c.alpha_3 for c in pycountry.countries}
    codes |= {c.alpha_3 for c in pycountry.currencies}
    language_codes = {getattr(lang, a) for lang in pycountry.languages for a in ("alpha_2", "alpha_3")
                      if hasattr(lang, a)}
    for sample in samples:
        golds = sample["golden_answers"]
        assert len({normalize_answer(g) for g in golds}) == len(golds), golds  # no repeats
        for gold in golds:
            assert gold == gold.strip() and len(gold) > 2, gold
            assert gold not in codes and gold not in language_codes, (gold, sample["question"])
            assert "," not in gold, gold
    france = next(s for s in samples if s["id"] == "countryinfo-country_of_capital-FRA")
    assert france["golden_answers"] == ["France", "French Republic"]
    bogota = next(s for s in samples if s["id"] == "countryinfo-capital-COL")
    assert bogota["golden_answers"] == ["Bogotá", "Bogota"]


# --------------------------------------------------------------------------- load_split


def test_load_split_reads_the_first_n(built, splits):
    for split in SPLITS:
        assert load_split(split, data_dir=built) == splits[split]
    assert load_split("test", data_dir=built, size=7) == splits["test"][:7]
    assert load_split("train", data_dir=built, size=0) == []
    assert len({s["kind"] for s in load_split("train", data_dir=built, size=60)}) == len(KINDS)  # mixed


def test_load_split_errors_say_what_exists(built):
    with pytest.raises(RLFactoryError, match="unknown deepsearch split 'val'") as exc:
        load_split("val", data_dir=built)
    assert "train, validation, test" in str(exc.value)
    with pytest.raises(RLFactoryError, match="has .* samples, 100000 were asked for"):
        load_split("test", data_dir=built, size=100_000)
    with pytest.raises(RLFactoryError, match="size must be"):
        load_split("test", data_dir=built, size=-1)


def test_load_split_builds_a_missing_dataset(tmp_path):
    rows = load_split("validation", data_dir=tmp_path / "fresh", size=2)
    assert len(rows) == 2 and (tmp_path / "fresh" / "manifest.json").is_file()


# --------------------------------------------------------------------------- Search-R1 parquet

NQ_PROMPT = SEARCH_R1_PREFIX.format(question="who got the first nobel prize in physics?")


def search_r1_row(index: int, question: str, target, **overrides) -> dict:
    """One row exactly as Search-R1's nq_search.py writes it (FlashRAG columns kept)."""
    row = {
        "id": f"train_{index}",
        "question": question,
        "golden_answers": target,
        "data_source": "nq",
        "prompt": [{"role": "user", "content": SEARCH_R1_PREFIX.format(question=question)}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": target}},
        "extra_info": {"split": "train", "index": index},
    }
    row.update(overrides)
    return row


def test_search_r1_prefix_is_the_original_instruction():
    assert NQ_PROMPT.startswith("Answer the given question. You must conduct reasoning inside <think>")
    assert "call a search engine by <search> query </search>" in NQ_PROMPT
    assert NQ_PROMPT.endswith("For example, <answer> Beijing </answer>. Question: "
                              "who got the first nobel prize in physics?\n")


def test_load_search_r1_parquet_reads_the_nq_schema(tmp_path):
    rows = [search_r1_row(0, "who got the first nobel prize in physics?", ["Wilhelm Conrad Röntgen"]),
            search_r1_row(1, "when was the last time anyone was on the moon?", ["14 December 1972 UTC",
                                                                                  "December 1972"])]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    samples = load_search_r1_parquet(path)
    assert samples[1] == {"id": "train_1", "question": "when was the last time anyone was on the moon?",
                          "golden_answers": ["14 December 1972 UTC", "December 1972"],
                          "answer": "14 December 1972 UTC", "data_source": "nq",
                          "extra_info": {"split": "train", "index": 1}}
    assert type(samples[0]["golden_answers"]) is list


def test_the_question_comes_from_the_prompt_when_there_is_no_question_column(tmp_path):
    row = search_r1_row(3, "what is the capital of peru?", ["Lima"])
    del row["question"], row["id"], row["golden_answers"]
    path = tmp_path / "prompt_only.parquet"
    pq.write_table(pa.Table.from_pylist([row]), path)
    [sample] = load_search_r1_parquet(path)
    assert sample["question"] == "what is the capital of peru?"
    assert sample["id"] == "nq-train-3" and sample["golden_answers"] == ["Lima"]


def test_numpy_answers_become_plain_lists(tmp_path):
    import pandas as pd

    frame = pd.DataFrame({
        "question": ["q one?", "q two?"],
        "golden_answers": [np.array(["a", "b"], dtype=object), np.array(["c"], dtype=object)],
        "reward_model": [{"style": "rule", "ground_truth": {"target": np.array(["a", "b"], dtype=object)}},
                         {"style": "rule", "ground_truth": {"target": np.array(["c"], dtype=object)}}],
    })
    path = tmp_path / "pandas.parquet"
    frame.to_parquet(path)
    loaded = load_search_r1_parquet(path)
    assert [s["golden_answers"] for s in loaded] == [["a", "b"], ["c"]]
    # What pandas.read_parquet hands back: numpy arrays inside the cells.
    from_pandas = samples_from_search_r1_rows(pd.read_parquet(path).to_dict("records"))
    assert [s["golden_answers"] for s in from_pandas] == [["a", "b"], ["c"]]
    assert all(type(s["golden_answers"]) is list and type(s["golden_answers"][0]) is str for s in from_pandas)


def test_a_string_target_is_one_answer(tmp_path):
    rows = [search_r1_row(0, "who wrote hamlet?", "William Shakespeare")]
    path = tmp_path / "string_target.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert load_search_r1_parquet(path)[0]["golden_answers"] == ["William Shakespeare"]


def test_a_row_without_answers_is_named(tmp_path):
    rows = [search_r1_row(0, "ok?", ["yes"]),
            search_r1_row(1, "no answer?", None, golden_answers=None,
                          reward_model={"style": "rule", "ground_truth": {"target": None}})]
    path = tmp_path / "missing_target.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(RLFactoryError, match=r"row 1: no gold answers"):
        load_search_r1_parquet(path)
    rows[1]["golden_answers"] = ["found"]  # the FlashRAG column stands in for a missing target
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert load_search_r1_parquet(path)[1]["golden_answers"] == ["found"]


def test_bad_rows_and_files_are_named(tmp_path):
    empty = [search_r1_row(0, "q?", ["a"]), search_r1_row(1, "q2?", [])]
    with pytest.raises(RLFactoryError, match="row 1: the list of gold answers is empty"):
        samples_from_search_r1_rows(empty)
    no_question = search_r1_row(0, "", ["a"], prompt=[{"role": "user", "content": "Just answer."}])
    with pytest.raises(RLFactoryError, match="row 0: no 'question' column and no 'Question: ...'"):
        samples_from_search_r1_rows([no_question])
    with pytest.raises(RLFactoryError, match="row 0 is a list, not a mapping"):
        samples_from_search_r1_rows([["q?", ["a"]]])
    nested = search_r1_row(0, "q?", [["a"]])
    with pytest.raises(RLFactoryError, match="row 0: a gold answer must be a string"):
        samples_from_search_r1_rows([nested])

    path = tmp_path / "other.parquet"
    pq.write_table(pa.Table.from_pylist([{"text": "hello"}]), path)
    with pytest.raises(RLFactoryError, match="no 'question' or 'prompt' and 'reward_model' or 'golden_answers'"):
        load_search_r1_parquet(path)
    not_parquet = tmp_path / "not.parquet"
    not_parquet.write_text("hello")
    with pytest.raises(RLFactoryError, match="not a readable parquet file"):
        load_search_r1_parquet(not_parquet)
    with pytest.raises(RLFactoryError, match="no Search-R1 parquet file"):
        load_search_r1_parquet(tmp_path / "absent.parquet")


def test_our_dataset_round_trips_through_search_r1_parquet(splits, tmp_path):
    ours = splits["test"][:25]
    path = write_search_r1_parquet(ours, tmp_path / "out" / "test.parquet", split="test")
    table = pq.read_table(path)
    assert table.column_names == ["id", "question", "golden_answers", "data_source", "prompt", "ability",
                                  "reward_model", "extra_info"]
    row = table.slice(3, 1).to_pylist()[0]
    assert row["prompt"] == [{"role": "user", "content": SEARCH_R1_PREFIX.format(question=ours[3]["question"])}]
    assert row["reward_model"] == {"style": "rule", "ground_truth": {"target": ours[3]["golden_answers"]}}
    assert row["extra_info"] == {"split": "test", "index": 3} and row["ability"] == "fact-reasoning"
    back = load_search_r1_parquet(path)
    keys = ("id", "question", "golden_answers", "answer", "data_source")
    assert [{k: s[k] for k in keys} for s in back] == [{k: s[k] for k in keys} for s in ours]
    custom = write_search_r1_parquet(ours[:2], tmp_path / "custom.parquet",
                                     prompt_builder=lambda s: f"Q: {s['question']}")
    assert pq.read_table(custom).column("prompt").to_pylist()[1][0]["content"] == f"Q: {ours[1]['question']}"
    with pytest.raises(RLFactoryError, match="sample 0: no gold answers"):
        write_search_r1_parquet([{"question": "q?"}], tmp_path / "bad.parquet")


# --------------------------------------------------------------------------- wiki-18 corpus


def test_split_title_follows_wiki18():
    assert split_title('"France"\nFrance is a country.') == ("France", "France is a country.")
    assert split_title('""Weird Al" Yankovic"\nA musician.') == ('"Weird Al" Yankovic', "A musician.")
    assert split_title("only a title") == ("only a title", "")


def test_check_corpus_row_names_the_line(tmp_path):
    assert check_corpus_row({"id": 7, "contents": '"T"\nx'}, 1) == "7"
    with pytest.raises(RLFactoryError, match="line 3: 'id' must be a non-empty string"):
        check_corpus_row({"id": True, "contents": "x"}, 3)
    with pytest.raises(RLFactoryError, match=r"c\.jsonl:4: 'contents' must be a string"):
        check_corpus_row({"id": "1", "contents": None}, 4, "c.jsonl")
    with pytest.raises(RLFactoryError, match="line 5: expected a JSON object, got list"):
        check_corpus_row([1, 2], 5)


def test_iter_wiki_corpus_reads_gzip_and_names_bad_lines(tmp_path):
    lines = ['{"id": "0", "contents": "\\"Evan Morris\\"\\nEvan L. Morris was a lobbyist."}', "",
             '{"id": 1, "contents": "\\"Lima\\"\\nLima is the capital city of Peru."}']
    path = tmp_path / "wiki.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    rows = list(iter_wiki_corpus(path))
    assert [(r["id"], r["title"], r["text"]) for r in rows] == [
        ("0", "Evan Morris", "Evan L. Morris was a lobbyist."), ("1", "Lima", "Lima is the capital city of Peru.")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(lines[0] + "\n{not json\n")
    with pytest.raises(RLFactoryError, match=r"bad\.jsonl:2: not valid JSON"):
        list(iter_wiki_corpus(bad))
