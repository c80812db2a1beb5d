"""Fixtures of the qwq_judge tests: the embedded judge model, and local OpenAI-compatible
servers (uvicorn in a thread, on a port the OS picks, stopped after the tests).

The embedded judge model is the root ``conftest.py``'s ``default_model_dir``.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse

from rlfactory_core import Message, Trajectory

#: The Authorization header the scripted server's ``/auth`` route accepts.
API_KEY = "test-secret-key"

#: What the scripted server's ``/reply/<name>/<delay_ms>`` routes answer: content, finish reason.
CANNED_REPLIES: dict[str, tuple[str | None, str]] = {
    "score": ("The student wrote Paris, as the reference does.\n</think>\n\n<score>0.75</score>", "stop"),
    "unreadable": ("I cannot decide about this one.", "stop"),
    "thinking": ("<think>Let me compare the two answers carefully, starting with", "length"),
    "null": (None, "length"),
}


@dataclass
class Server:
    """A running test server: its root URL and the requests it received."""

    url: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    active: int = 0  # requests being answered right now
    max_active: int = 0
    api_key: str = API_KEY
    replies: dict[str, tuple[str | None, str]] = field(default_factory=lambda: dict(CANNED_REPLIES))

    def base_url(self, prefix: str = "") -> str:
        return f"{self.url}{prefix}/v1"


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """Run ``app`` with uvicorn in a thread on a free localhost port; yields its root URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))  # port 0: the OS picks a free one, no race with other tests
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


def completion(model: str, content: str | None, finish_reason: str) -> dict[str, Any]:
    """An OpenAI chat-completion response body."""
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": finish_reason}],
    }


def scripted_app(server: Server) -> FastAPI:
    """Answers from :data:`CANNED_REPLIES`, and the failures a real server can have."""
    app = FastAPI()

    async def record(request: Request) -> dict[str, Any]:
        body = await request.json()
        server.requests.append({"path": request.url.path, "body": body,
                                "authorization": request.headers.get("authorization")})
        return body

    @app.post("/reply/{name}/{delay_ms}/v1/chat/completions")
    async def reply(name: str, delay_ms: int, request: Request):
        body = await record(request)
        server.active += 1
        server.max_active = max(server.max_active, server.active)
        try:
            await asyncio.sleep(delay_ms / 1000)
        finally:
            server.active -= 1
        content, finish_reason = CANNED_REPLIES[name]
        return completion(body["model"], content, finish_reason)

    @app.post("/auth/v1/chat/completions")
    async def auth(request: Request):
        body = await record(request)
        if request.headers.get("authorization") != f"Bearer {API_KEY}":
            return JSONResponse({"error": {"message": "invalid api key"}}, status_code=401)
        return completion(body["model"], "<score>1</score>", "stop")

    @app.post("/error/v1/chat/completions")
    async def error(request: Request):
        await record(request)
        return PlainTextResponse("Internal Server Error: CUDA out of memory", status_code=500)

    @app.post("/garbage/v1/chat/completions")
    async def garbage(request: Request):
        await record(request)
        return HTMLResponse("<html><body>Welcome to nginx!</body></html>")

    @app.post("/wrong-shape/v1/chat/completions")
    async def wrong_shape(request: Request):
        await record(request)
        return {"object": "chat.completion", "choices": []}

    @app.post("/slow/v1/chat/completions")
    async def slow(request: Request):
        await record(request)
        await asyncio.sleep(1)  # longer than the 0.3 s timeout the test sets
        return completion("m", "<score>1</score>", "stop")

    return app


@pytest.fixture(scope="session")
def scripted_server() -> Iterator[Server]:
    """A server with canned replies and failures; no model behind it."""
    server = Server(url="")
    with serve(scripted_app(server)) as url:
        server.url = url
        yield server


@pytest.fixture
def requests_seen(scripted_server) -> list[dict[str, Any]]:
    """The requests the scripted server receives during this test."""
    scripted_server.requests.clear()
    scripted_server.max_active = 0
    return scripted_server.requests


def model_app(server: Server, backend: Any, tokenizer: Any, model_name: str) -> FastAPI:
    """An OpenAI-compatible chat-completions server generating with a real model."""
    from rlfactory_core import SamplingParams

    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def complete(request: Request):
        body = await request.json()
        server.requests.append({"path": request.url.path, "body": body})
        if body.get("model") != model_name:
            return JSONResponse({"error": {"message": f"The model `{body.get('model')}` does not exist."}},
                                status_code=404)
        text = tokenizer.apply_chat_template(body["messages"], tokenize=False, add_generation_prompt=True)
        prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        sampling = SamplingParams(temperature=float(body.get("temperature", 1.0)),
                                  top_p=float(body.get("top_p", 1.0)), max_tokens=int(body.get("max_tokens", 64)))
        generation = await backend.generate(prompt_ids, sampling)
        content = tokenizer.decode(generation.token_ids, skip_special_tokens=True)
        return completion(model_name, content, generation.finish_reason)

    return app


@pytest.fixture(scope="session")
def model_server(default_model_dir) -> Iterator[Server]:
    """A server answering with the embedded model on the core's hf backend."""
    from rlfactory_core import load_tokenizer, make_backend

    tokenizer = load_tokenizer(default_model_dir)
    backend = make_backend("hf", str(default_model_dir))
    server = Server(url="")
    try:
        with serve(model_app(server, backend, tokenizer, "smollm2")) as url:
            server.url = url
            yield server
    finally:
        asyncio.run(backend.close())


@pytest.fixture
def make_trajectory():
    """``make_trajectory(answer, question=...)``: a finished trajectory with that final answer."""

    def make(final_answer: str | None, question: str = "What is the capital of France?",
             assistant: str | None = None) -> Trajectory:
        messages = [Message(role="user", content=question)]
        if assistant is not None:
            messages.append(Message(role="assistant", content=assistant))
        return Trajectory(sample_id="s0", prompt_ids=[1, 2, 3], messages=messages, final_answer=final_answer)

    return make
