"""The retriever server: Search-R1's API as Search-R1's own client uses it, validation,
batching of concurrent requests, our HTTP client against it, and ``rlf retriever serve``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from typer.testing import CliRunner

from rlfactory_core import ConfigError, RLFactoryError, ToolCall, Trajectory, outcome_of
from rlfactory_core.testing import ConcurrentToolManager
from rlfactory_deepsearch.env import DeepSearchEnv
from rlfactory_deepsearch.cli_retriever import app as retriever_cli
from rlfactory_deepsearch.retrieval import BM25Retriever, Document, HTTPRetriever
from rlfactory_deepsearch.server import RetrieverServer, create_app

PASSAGES = [
    Document("0", '"Paris"\nParis is the capital and most populous city of France.'),
    Document("1", '"Berlin"\nBerlin is the capital and largest city of Germany.'),
    Document("2", '"Tokyo"\nTokyo is the capital of Japan.'),
    Document("3", '"Mount Everest"\nMount Everest is the highest mountain above sea level.'),
    Document("4", '"Penicillin"\nPenicillin was discovered by Alexander Fleming in 1928.'),
    Document("5", '"Jupiter"\nJupiter is the largest planet in the Solar System.'),
    Document("6", '"Amazon River"\nThe Amazon is the largest river by discharge volume.'),
    Document("7", '"Marie Curie"\nMarie Curie won Nobel Prizes for research on radioactivity.'),
]
QUERIES = {"capital of France": "0", "who discovered penicillin": "4", "largest planet": "5",
           "highest mountain": "3", "radioactivity research": "7"}


@pytest.fixture(scope="module")
def bm25() -> BM25Retriever:
    return BM25Retriever(PASSAGES)


@pytest.fixture
def server(bm25):
    # A long batching window: the concurrent-request test relies on requests sharing it.
    running = RetrieverServer(create_app(bm25, topk=3, max_wait_s=0.1)).start()
    try:
        yield running
    finally:
        running.stop()


# -- a client written as Search-R1's (search_r1/llm_agent/generation.py) -------------------


def search_r1_batch_search(search_url: str, queries: list[str], topk: int) -> dict:
    payload = {"queries": queries, "topk": topk, "return_scores": True}
    return requests.post(search_url, json=payload).json()


def search_r1_passages2string(retrieval_result: list[dict]) -> str:
    format_reference = ""
    for idx, doc_item in enumerate(retrieval_result):
        content = doc_item["document"]["contents"]
        title = content.split("\n")[0]
        text = "\n".join(content.split("\n")[1:])
        format_reference += f"Doc {idx + 1}(Title: {title}) {text}\n"
    return format_reference


def search_r1_batch_search_strings(search_url: str, queries: list[str], topk: int) -> list[str]:
    results = search_r1_batch_search(search_url, queries, topk)["result"]
    return [search_r1_passages2string(result) for result in results]


def test_search_r1_client_gets_the_passages(server):
    observations = search_r1_batch_search_strings(f"{server.url}/retrieve", list(QUERIES), topk=3)
    assert len(observations) == len(QUERIES)
    assert observations[0].startswith('Doc 1(Title: "Paris") Paris is the capital and most populous city of France.\n')
    assert observations[1].startswith('Doc 1(Title: "Penicillin") Penicillin was discovered')
    for observation in observations:
        assert 1 <= observation.count("\n") <= 3

    result = search_r1_batch_search(f"{server.url}/retrieve", ["capital"], topk=2)["result"]
    assert [sorted(item) for item in result[0]] == [["document", "score"]] * 2
    assert sorted(result[0][0]["document"]) == ["contents", "id"]
    assert isinstance(result[0][0]["score"], float) and result[0][0]["score"] >= result[0][1]["score"]


def test_without_scores_and_default_topk(server, bm25):
    response = requests.post(f"{server.url}/retrieve", json={"queries": ["capital city", "largest"]})
    assert response.status_code == 200
    result = response.json()["result"]
    # Search-R1's shape without scores: the documents themselves; topk: the server's 3
    expected = bm25.search(["capital city", "largest"], 3)
    assert result == [[{"id": h.document.id, "contents": h.document.contents} for h in hits] for hits in expected]
    assert len(result[0]) == 3
    assert requests.post(f"{server.url}/retrieve", json={"queries": []}).json() == {"result": []}
    # a field Search-R1's model does not know is ignored, as there
    assert requests.post(f"{server.url}/retrieve", json={"queries": ["Tokyo"], "extra": 1}).status_code == 200


@pytest.mark.parametrize(("body", "problem"), [
    ({"topk": 3}, "queries: Field required"),
    ({"queries": "capital of France"}, "queries: Input should be a valid list"),
    ({"queries": ["a", 7]}, "queries.1: Input should be a valid string"),
    ({"queries": ["a"], "topk": 0}, "topk: Input should be greater than or equal to 1"),
    ({"queries": ["a"], "topk": "three"}, "topk: Input should be a valid integer"),
    ({"queries": ["a"], "return_scores": [1]}, "return_scores: Input should be a valid boolean"),
    ("not json", "JSON decode error"),
])
def test_bad_requests_get_422_with_a_clear_message(server, body, problem):
    if isinstance(body, str):
        response = requests.post(f"{server.url}/retrieve", data=body, headers={"Content-Type": "application/json"})
    else:
        response = requests.post(f"{server.url}/retrieve", json=body)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail.startswith("invalid request: ") and problem in detail and "\n" not in detail
    assert '"queries": ["...", ...]' in detail  # says what a request looks like


def test_concurrent_requests_are_batched(server, bm25):
    queries = [f"{query} {i}" for i in range(7) for query in QUERIES][:32]
    barrier = threading.Barrier(len(queries))
    answers: dict[int, list] = {}

    def client(index: int) -> None:
        barrier.wait()
        answers[index] = search_r1_batch_search(f"{server.url}/retrieve", [queries[index]], topk=2)["result"]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(queries))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    for index, query in enumerate(queries):
        [hits] = bm25.search([query], 2)
        assert answers[index] == [[{"document": {"id": h.document.id, "contents": h.document.contents},
                                    "score": h.score} for h in hits]]
    stats = server.app.state.batcher.stats()
    assert stats.queries == 32 and stats.batches < 32
    health = requests.get(f"{server.url}/health").json()
    assert health["batching"]["batches"] == stats.batches and health["documents"] == len(PASSAGES)
    assert (health["status"], health["retriever"], health["topk"]) == ("ok", "bm25", 3)


# -- HTTPRetriever ------------------------------------------------------------------------


async def test_http_retriever_against_the_server(server, bm25):
    for url in (server.url, server.url + "/retrieve", server.url + "/"):
        client = HTTPRetriever(url, timeout_s=30)
        try:
            assert client.url == server.url + "/retrieve"
            expected = bm25.search(list(QUERIES), 3)
            assert client.search(list(QUERIES), 3) == expected
            assert await client.asearch(list(QUERIES), 3) == expected
            assert client.search([], 3) == []
        finally:
            await client.aclose()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_http_retriever_unreachable_server():
    with HTTPRetriever(f"http://127.0.0.1:{_free_port()}", timeout_s=5) as client:
        with pytest.raises(RLFactoryError, match=r"retriever server http://127\.0\.0\.1:\d+/retrieve is unreachable"):
            client.search(["capital"], 3)


class BrokenRetriever:
    name = "broken"

    def search(self, queries, topk):
        raise RuntimeError("index file vanished")


def test_http_retriever_reports_a_server_error():
    server = RetrieverServer(create_app(BrokenRetriever())).start()
    try:
        with HTTPRetriever(server.url) as client:
            with pytest.raises(RLFactoryError, match="answered HTTP 500: retrieval failed: RuntimeError: index file vanished"):
                client.search(["capital"], 3)
    finally:
        server.stop()


def _fake_server_app(body) -> FastAPI:
    fake = FastAPI()

    @fake.post("/retrieve")
    async def retrieve():
        return PlainTextResponse(body) if isinstance(body, str) else JSONResponse(body)

    return fake


@pytest.mark.parametrize(("body", "message"), [
    ("<html>not a retriever</html>", "answered malformed JSON"),
    ({"results": []}, "malformed result: no 'result' list"),
    ({"result": []}, "malformed result: 0 result lists for 1 queries"),
    ({"result": [[{"document": {"id": "1"}, "score": 1.0}]]}, r"result\[0\]\[0\] has no document with 'contents'"),
    ({"result": [[{"document": {"contents": "x"}, "score": "high"}]]}, r"result\[0\]\[0\] has no numeric 'score'"),
])
def test_http_retriever_reports_a_malformed_answer(body, message):
    server = RetrieverServer(_fake_server_app(body)).start()
    try:
        with HTTPRetriever(server.url) as client, pytest.raises(RLFactoryError, match=message):
            client.search(["capital"], 3)
    finally:
        server.stop()


def test_http_retriever_accepts_search_r1_bm25_documents():
    # Search-R1's BM25 server sends {"title", "text", "contents"} documents without an id.
    document = {"title": "Paris", "text": "Paris is ...", "contents": '"Paris"\nParis is ...'}
    server = RetrieverServer(_fake_server_app({"result": [[{"document": document, "score": 7.5}]]})).start()
    try:
        with HTTPRetriever(server.url) as client:
            [[hit]] = client.search(["capital"], 3)
        assert (hit.document.id, hit.document.contents, hit.score) == ("", document["contents"], 7.5)
    finally:
        server.stop()


# -- server lifecycle and the CLI ---------------------------------------------------------


def test_server_options_are_checked(bm25):
    with pytest.raises(ConfigError) as info:
        create_app(bm25, topk=0, max_batch=0, max_wait_s=-1)
    assert len(info.value.errors) == 3


def test_port_in_use_is_a_clear_error(server, bm25):
    with pytest.raises(RLFactoryError, match=rf"cannot listen on 127\.0\.0\.1:{server.port}: Address already in use"):
        RetrieverServer(create_app(bm25), port=server.port)


def test_cli_rejects_a_bad_retriever_kind(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": d.id, "contents": d.contents}) + "\n" for d in PASSAGES))
    result = CliRunner().invoke(retriever_cli, ["serve", "--corpus", str(corpus), "--retriever", "elastic",
                                                "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 2  # a usage error, before anything is indexed
    assert "'elastic'" in result.output and "bm25" in result.output


def test_cli_serves_a_corpus(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": d.id, "contents": d.contents}) + "\n" for d in PASSAGES))
    stdout, stderr = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    command = [sys.executable, "-c", "from rlfactory_deepsearch.cli_retriever import app; app()",
               "serve", "--corpus", str(corpus), "--port", "0", "--topk", "2", "--cache-dir", str(tmp_path / "cache")]
    env = {**os.environ, "COLUMNS": "200"}
    with stdout.open("w") as out, stderr.open("w") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env)
    try:
        url = ""
        for _ in range(600):  # the URL is printed once the index is ready
            url = stdout.read_text().strip()
            if url or process.poll() is not None:
                break
            time.sleep(0.1)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/retrieve"), stderr.read_text()
        assert f"Serving {len(PASSAGES)} passages (bm25, top 2)" in stderr.read_text()
        result = search_r1_batch_search(url, ["capital of France"], topk=1)["result"]
        assert result[0][0]["document"]["id"] == "0"
        assert len(requests.post(url, json={"queries": ["capital"]}).json()["result"][0]) == 2
    finally:
        process.terminate()
        process.wait(30)
    assert list(Path(tmp_path / "cache").iterdir())  # the index was cached


# -- failures through the search tool and the tool manager (rlfactory_core.outcomes) -----------


def _failing_app(mode: str) -> FastAPI:
    app = FastAPI()

    @app.post("/retrieve")
    async def retrieve():
        if mode == "hang":
            import asyncio

            await asyncio.sleep(3)
        if mode == "503":
            return JSONResponse({"detail": "overloaded"}, status_code=503)
        return PlainTextResponse("<html>a login page</html>")

    return app


@pytest.mark.parametrize(("case", "outcome"), [
    ("stopped", "tool_unavailable"),  # the server stopped: unreachable, retries spent
    ("503", "tool_unavailable"),
    ("hang", "tool_timeout"),  # the tool manager's timeout_s: the service did not answer in time
    ("malformed", "tool_infra_error"),  # an answer the client cannot use: the service's, not the query's
])
async def test_a_failing_retriever_service_is_the_infrastructures_failure_through_the_tool_manager(
        server, case, outcome):
    """The env's real search tool on a real retriever server (or one that fails as named),
    through the real tool manager: each failure is classified on the infrastructure's side,
    so a run resamples it instead of training on it as a wrong answer."""
    failing = None if case == "stopped" else RetrieverServer(_failing_app(case)).start()
    env = DeepSearchEnv(retriever="http", url=(failing or server).url, max_batch=1)
    manager = ConcurrentToolManager(env.tools, timeout_s=1, max_retries=1, retry_backoff_s=0.0)
    call = ToolCall(name="search", arguments={"query": "capital of France"})
    try:
        if case == "stopped":
            [ok] = await manager.call([call], {})
            assert ok.ok and outcome_of(_ended([ok])) == "answered"
            server.stop()
        [failed] = await manager.call([call], {})
        assert not failed.ok and outcome_of(_ended([failed])) == outcome
    finally:
        await manager.close()
        if failing is not None:
            failing.stop()


def _ended(results) -> Trajectory:
    return Trajectory(sample_id="s", prompt_ids=[1], tool_results=list(results), stop_reason="env_done",
                      final_answer="x")


async def test_hung_searches_do_not_hold_up_the_others_through_the_tool_manager():
    """A service that hangs some requests: those searches time out (the infrastructure's),
    while searches of other trajectories sent meanwhile are answered, not queued behind them
    until their own timeouts (which would fail every search of a flaky service)."""
    import asyncio

    app = FastAPI()

    @app.post("/retrieve")
    async def retrieve(request: Request):
        queries = (await request.json())["queries"]
        if any("hang" in query for query in queries):
            await asyncio.sleep(30)
        return {"result": [[{"document": {"id": q, "contents": f'"{q}"\nfound'}, "score": 1.0}] for q in queries]}

    flaky = RetrieverServer(app).start()
    env = DeepSearchEnv(retriever="http", url=flaky.url, max_batch=1)
    manager = ConcurrentToolManager(env.tools, timeout_s=2, max_retries=0)
    try:
        hung = [manager.call([ToolCall(name="search", arguments={"query": f"hang {i}"})], {}) for i in range(4)]
        answered = [manager.call([ToolCall(name="search", arguments={"query": f"capital {i}"})], {})
                    for i in range(4)]
        results = [result for [result] in await asyncio.gather(*hung, *answered)]
        assert [outcome_of(_ended([r])) for r in results[:4]] == ["tool_timeout"] * 4, [r.content for r in results[:4]]
        assert all(r.ok for r in results[4:]), [r for r in results[4:] if not r.ok]
    finally:
        await manager.close()
        flaky.stop()
