"""A retriever server speaking Search-R1's API, so Search-R1's trainer, its forks, and our
:class:`~rlfactory_deepsearch.retrieval.HTTPRetriever` can all use it.

``POST /retrieve`` takes ``{"queries": [str, ...], "topk": int, "return_scores": bool}``
(``topk`` optional: the server's default; ``return_scores`` optional: false) and answers

* ``{"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}`` with
  ``return_scores: true`` (what Search-R1's ``_batch_search`` asks for), and
* ``{"result": [[{"id", "contents"}, ...], ...]}`` without,

one list per query, best passage first, as ``search_r1/search/retrieval_server.py`` does.
Unlike it, ``topk`` 0 or negative is refused (422) instead of meaning the default.
``GET /health`` reports the retriever, the corpus size and the batching counters.

During RL rollouts every trajectory sends its own request with one query. All requests go
through one :class:`~rlfactory_deepsearch.retrieval.QueryBatcher`, so the queries of
concurrent requests are answered by one batched retrieval call
(``bench/retriever.py`` measures the gain).

:class:`RetrieverServer` runs the app with uvicorn in a background thread (tests, benches,
a trainer hosting its own retriever); :func:`serve` runs it in the foreground
(``rlf retriever serve``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
import threading
import time
from typing import Any, AsyncIterator, Optional, Sized

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from rlfactory_core import ConfigError, RLFactoryError, one_line

from .retrieval import QueryBatcher, Retriever

__all__ = ["create_app", "RetrieveRequest", "RetrieverServer", "serve", "bind_socket", "server_url", "DEFAULT_TOPK"]

log = logging.getLogger("rlfactory.deepsearch.server")

#: Passages per query when a request gives no ``topk`` (Search-R1's ``--topk`` default).
DEFAULT_TOPK = 3
_REQUEST_FORMAT = ('expected {"queries": ["...", ...], "topk": <int >= 1, optional>, '
                   '"return_scores": <bool, optional>}')


class RetrieveRequest(BaseModel):
    """The body of ``POST /retrieve``: Search-R1's ``QueryRequest`` (unknown fields are
    ignored, as there)."""

    queries: list[str]
    topk: Optional[int] = Field(default=None, ge=1)
    return_scores: bool = False


def create_app(retriever: Retriever, *, topk: int = DEFAULT_TOPK, max_batch: int = 64,
               max_wait_s: float = 0.005, max_concurrent_batches: int = 1) -> Any:
    """The FastAPI app serving ``retriever``.

    :param retriever: any :class:`~rlfactory_deepsearch.retrieval.Retriever`.
    :param topk: passages per query when a request gives none.
    :param max_batch: most queries in one retrieval call (1: no batching).
    :param max_wait_s: how long a query waits for others to share its retrieval call.
    :param max_concurrent_batches: retrieval calls running at once (see
        :class:`~rlfactory_deepsearch.retrieval.QueryBatcher`).

    The batcher is ``app.state.batcher`` (its :meth:`~QueryBatcher.stats` count requests'
    queries and retrieval calls).
    """
    problems: list[str] = []
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        problems.append(f"topk must be a positive integer, got {topk!r}")
    try:
        batcher = QueryBatcher(retriever, max_batch=max_batch, max_wait_s=max_wait_s,
                               max_concurrent_batches=max_concurrent_batches)
    except ConfigError as exc:
        problems.extend(exc.errors)
    if problems:
        raise ConfigError([f"retriever server: {p}" for p in problems])

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await batcher.close()

    app = FastAPI(title="RLFactory retriever (Search-R1 API)", lifespan=lifespan)
    app.state.batcher = batcher
    app.state.retriever = retriever
    app.state.topk = topk

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error.get("loc", ()) if part != "body") or "body"
            problems.append(f"{where}: {error.get('msg', 'invalid')}")
        return JSONResponse(status_code=422, content={
            "detail": f"invalid request: {'; '.join(problems)}; {_REQUEST_FORMAT}",
            "errors": jsonable_encoder(exc.errors(), custom_encoder={Exception: str}),
        })

    @app.post("/retrieve")
    async def retrieve(request: RetrieveRequest) -> JSONResponse:
        """Passages for each query, best first (Search-R1's retriever API)."""
        k = request.topk or topk
        try:
            hits = await asyncio.gather(*(batcher.search(query, k) for query in request.queries))
        except Exception as exc:  # noqa: BLE001 - a failed retrieval is the client's 500, not a dead server
            log.exception("retrieval failed")
            return JSONResponse(status_code=500, content={"detail": f"retrieval failed: {one_line(exc)}"})
        if request.return_scores:
            result = [[{"document": {"id": hit.document.id, "contents": hit.document.contents}, "score": hit.score}
                       for hit in query_hits] for query_hits in hits]
        else:
            result = [[{"id": hit.document.id, "contents": hit.document.contents} for hit in query_hits]
                      for query_hits in hits]
        # A JSONResponse skips FastAPI's re-validation of the answer: it is built right here.
        return JSONResponse({"result": result})

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness, the retriever, the corpus size and the batching counters."""
        stats = batcher.stats()
        return {
            "status": "ok",
            "retriever": getattr(retriever, "name", type(retriever).__name__),
            "documents": len(retriever) if isinstance(retriever, Sized) else None,
            "topk": topk,
            "max_batch": batcher.max_batch,
            "max_wait_s": batcher.max_wait_s,
            "max_concurrent_batches": batcher.max_concurrent_batches,
            "batching": {**dataclasses.asdict(stats), "mean_batch": stats.mean_batch},
        }

    return app


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free port), or an
    :class:`RLFactoryError` saying why it cannot be had. It listens at once, so the URL
    can be announced before the server runs: early connections wait in the backlog."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise RLFactoryError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                             hint="give a host name or address of this machine, e.g. 127.0.0.1") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)  # uvicorn's default backlog
    except OSError as exc:
        sock.close()
        raise RLFactoryError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                             hint="pick another port (--port), or stop what is using this one") from None
    return sock


def server_url(host: str, port: int) -> str:
    """``http://host:port`` (IPv6 addresses in brackets; a wildcard host as 127.0.0.1)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _uvicorn_server(app: Any, log_level: str) -> Any:
    import uvicorn

    # No access log: one line per request is noise (and time) at thousands of requests/s.
    config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="on",
                            timeout_graceful_shutdown=5)
    return uvicorn.Server(config)


def serve(app: Any, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning",
          sock: socket.socket | None = None) -> None:
    """Serve ``app`` in the foreground until interrupted (Ctrl-C stops it cleanly).

    ``sock``: an already bound socket (:func:`bind_socket`), so the caller can print the
    real port before serving; otherwise ``host:port`` is bound here."""
    sock = sock or bind_socket(host, port)
    _uvicorn_server(app, log_level).run(sockets=[sock])


class RetrieverServer:
    """``app`` served by uvicorn in a background thread, until :meth:`stop`.

    :param app: the app of :func:`create_app`.
    :param host: the address to listen on.
    :param port: the port; 0 picks a free one (:attr:`url` tells which).

    Use it as a context manager (``with RetrieverServer(app) as server: ...``) or call
    :meth:`start` and :meth:`stop` (in a ``finally``).
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        self.app = app
        self.host = host
        self._sock = bind_socket(host, port)
        self.port = self._sock.getsockname()[1]
        self._server = _uvicorn_server(app, log_level)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        """The server's base URL; Search-R1 clients post to ``url + "/retrieve"``."""
        return server_url(self.host, self.port)

    def _run(self) -> None:
        try:
            asyncio.run(self._server.serve(sockets=[self._sock]))
        except BaseException as exc:  # noqa: BLE001 - reported by start(); uvicorn exits on startup failure
            self._error = exc

    def start(self, timeout_s: float = 30.0) -> "RetrieverServer":
        """Start serving; return once requests are accepted."""
        if self._thread is not None:
            raise RLFactoryError("this retriever server was already started", hint="make a new RetrieverServer")
        self._thread = threading.Thread(target=self._run, name=f"retriever-server-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        # uvicorn sets `started` from its own thread; poll it, and notice a thread that died.
        while not self._server.started:
            if not self._thread.is_alive():
                reason = one_line(self._error) if self._error else "it stopped"
                raise RLFactoryError(f"the retriever server on {self.url} failed to start: {reason}",
                                     hint="see the log above")
            if time.monotonic() > deadline:
                self.stop()
                raise RLFactoryError(f"the retriever server on {self.url} did not start within {timeout_s:g} s",
                                     hint="see the log above")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving and wait for the thread (safe to call twice, or before start)."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._sock.close()

    def __enter__(self) -> "RetrieverServer":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()
