"""The security layer of ``rlf ui`` (cli/rlfactory_cli/ui/security.py), through a real tiny
FastAPI app wrapped in AccessGuard and Starlette's TestClient, and its path checks on a real
runs directory with real symlinks."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.testclient import TestClient
from starlette.websockets import WebSocket, WebSocketDisconnect

from rlfactory_cli.ui.security import (
    CONTENT_SECURITY_POLICY,
    AccessGuard,
    PathRefused,
    check_token,
    cookie_name,
    new_token,
    resolve_in,
    run_dir_of,
)

PORT = 8765
BASE = f"http://127.0.0.1:{PORT}"
TOKEN = new_token()
COOKIE = cookie_name(PORT)
HTML = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def make_app(runs_dir: Path) -> FastAPI:
    """A tiny app shaped like the UI's: a page, a JSON API over runs_dir, a POST, a stream."""
    app = FastAPI()
    seen: list[str] = []
    app.state.seen = seen

    @app.exception_handler(PathRefused)
    async def refused(_: Request, exc: PathRefused) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=404)

    @app.get("/")
    def page() -> PlainTextResponse:
        return PlainTextResponse("<html>page</html>", media_type="text/html")

    @app.get("/api/runs/{name}")
    def run(name: str) -> dict:
        seen.append(name)
        return {"dir": str(run_dir_of(runs_dir, name))}

    @app.get("/api/files/{rel:path}")
    def file(rel: str) -> dict:
        seen.append(rel)
        return {"path": str(resolve_in(runs_dir, *rel.split("/")))}

    @app.get("/api/cached")
    def cached() -> PlainTextResponse:
        return PlainTextResponse("x", headers={"Cache-Control": "max-age=600"})

    @app.post("/api/runs/{name}/stop")
    def stop(name: str) -> dict:
        return {"stopped": str(run_dir_of(runs_dir, name).name)}

    @app.get("/api/stream")
    def stream() -> StreamingResponse:
        def chunks():
            for i in range(3):
                yield f"chunk {i}\n".encode()
        return StreamingResponse(chunks(), media_type="text/plain")

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("hello")
        await websocket.close()

    return app


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    (runs / "run-a").mkdir(parents=True)
    (runs / "run-a" / "sub").mkdir()
    (runs / "notes.txt").write_text("a file, not a run")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("secret")
    return runs


@pytest.fixture
def app(runs_dir: Path) -> FastAPI:
    return make_app(runs_dir)


@pytest.fixture
def client(app: FastAPI) -> TestClient:
    """A client with no credentials and no redirects followed (so a 303 is seen as a 303)."""
    return TestClient(AccessGuard(app, token=TOKEN, port=PORT), base_url=BASE, follow_redirects=False)


@pytest.fixture
def authed(app: FastAPI) -> TestClient:
    """Another client, holding the token cookie as a browser does after its first visit."""
    authed = TestClient(AccessGuard(app, token=TOKEN, port=PORT), base_url=BASE, follow_redirects=False)
    authed.cookies.set(COOKIE, TOKEN)
    return authed


# ---------------------------------------------------------------------------------- the token


def test_new_token_is_random_and_usable():
    tokens = {new_token() for _ in range(20)}
    assert len(tokens) == 20
    assert all(check_token(t) == t and len(t) == 32 for t in tokens)


@pytest.mark.parametrize("bad", ["", "short", "a" * 15, "a" * 20 + " b", "a" * 20 + ";", "é" * 20])
def test_weak_or_unsafe_user_tokens_are_refused(bad):
    with pytest.raises(ValueError):
        AccessGuard(FastAPI(), token=bad, port=PORT)


def test_no_token_is_401_and_echoes_nothing(client):
    response = client.get("/", headers=HTML)
    assert response.status_code == 401
    assert "rlf ui" in response.text and "printed" in response.text
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert response.headers["cache-control"] == "no-store"


def test_wrong_token_is_401_everywhere(client):
    wrong = TOKEN[:-1] + ("A" if TOKEN[-1] != "A" else "B")
    for response in (client.get(f"/api/runs/run-a?token={wrong}"),
                     client.get("/api/runs/run-a", headers={"Authorization": f"Bearer {wrong}"}),
                     client.get("/api/runs/run-a", headers={"Cookie": f"{COOKIE}={wrong}"}),
                     client.get("/api/runs/run-a", headers={"Authorization": TOKEN}),  # no scheme
                     client.get("/api/runs/run-a", headers={"Cookie": f"rlf_ui_token_9999={TOKEN}"}),  # another UI's
                     client.get("/api/runs/run-a?token=%C3%A9")):  # non-ASCII must not crash the compare
        assert response.status_code == 401
        assert TOKEN not in response.text and wrong not in response.text


def test_bearer_token_works(client):
    response = client.get("/api/runs/run-a", headers=BEARER)
    assert response.status_code == 200, response.text
    assert response.json()["dir"].endswith("run-a")
    assert client.get("/api/runs/run-a", headers={"Authorization": f"bearer {TOKEN}"}).status_code == 200


def test_html_get_with_token_redirects_to_a_cookie(client):
    response = client.get(f"/?view=runs&token={TOKEN}&run=run-a", headers=HTML)
    assert response.status_code == 303
    location = response.headers["location"]
    assert location == "/?view=runs&run=run-a"
    assert TOKEN not in location and TOKEN not in response.text
    set_cookie = response.headers["set-cookie"]
    assert set_cookie.startswith(f"{COOKIE}={TOKEN};")
    assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie and "Path=/" in set_cookie
    assert response.headers["cache-control"] == "no-store"
    # the client kept the cookie: the redirected page loads without the token in the URL
    followed = client.get(location, headers=HTML)
    assert followed.status_code == 200
    assert followed.text == "<html>page</html>"


def call_raw(app: FastAPI, scope: dict) -> list[dict]:
    """The messages the guarded app sends for one raw HTTP scope (paths and headers no HTTP
    client would send as they are)."""
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    base = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
            "scheme": "http", "path": "/", "raw_path": b"/", "query_string": b"", "root_path": "",
            "headers": [], "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", PORT)}
    asyncio.run(AccessGuard(app, token=TOKEN, port=PORT)(dict(base, **scope), receive, send))
    return sent


def test_redirect_location_is_never_protocol_relative(app):
    for raw in (b"//evil.example/x", b"/\\evil.example/x"):
        sent = call_raw(app, {"path": raw.decode(), "raw_path": raw, "query_string": f"token={TOKEN}".encode(),
                              "headers": [(b"host", b"127.0.0.1:8765"), (b"accept", b"text/html")]})
        assert sent[0]["status"] == 303
        assert dict(sent[0]["headers"])[b"location"] == b"/evil.example/x"


def test_two_host_headers_are_400(app):
    sent = call_raw(app, {"headers": [(b"host", b"127.0.0.1:8765"), (b"host", b"evil.example"),
                                      (b"authorization", f"Bearer {TOKEN}".encode())]})
    assert sent[0]["status"] == 400


def test_api_get_with_token_param_just_passes(client):
    response = client.get(f"/api/runs/run-a?token={TOKEN}", headers={"Accept": "application/json"})
    assert response.status_code == 200
    assert "set-cookie" not in response.headers


# ---------------------------------------------------------------------------------- Host


@pytest.mark.parametrize("host", ["evil.example:8765", "evil.example", "127.0.0.1:9999", "localhost:80",
                                  "127.0.0.1:", "127.0.0.1.nip.io:8765", "[::1]:9999", "[::1", ""])
def test_unknown_host_is_400_even_with_the_token(client, host):
    response = client.get("/api/runs/run-a", headers={**BEARER, "Host": host})
    assert response.status_code == 400
    assert "unknown Host" in response.text


@pytest.mark.parametrize("host", ["127.0.0.1:8765", "127.0.0.1", "localhost", "LOCALHOST:8765", "[::1]:8765",
                                  "[::1]"])
def test_our_hosts_pass(client, host):
    assert client.get("/api/runs/run-a", headers={**BEARER, "Host": host}).status_code == 200


def test_allowed_hosts_can_name_more_hosts(app):
    client = TestClient(AccessGuard(app, token=TOKEN, port=PORT, allowed_hosts=["box.lan", "::1"]),
                        base_url=BASE)
    assert client.get("/api/runs/run-a", headers={**BEARER, "Host": "box.lan:8765"}).status_code == 200
    assert client.get("/api/runs/run-a", headers={**BEARER, "Host": "[::1]:8765"}).status_code == 200
    assert client.get("/api/runs/run-a", headers={**BEARER, "Host": "127.0.0.1:8765"}).status_code == 400


# ---------------------------------------------------------------------------------- cross-site writes


@pytest.mark.parametrize("headers", [
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},  # another port on localhost is the same site
    {"Origin": "http://evil.example"},
    {"Origin": "http://127.0.0.1:3000"},
    {"Origin": "null"},
    {"Origin": "http://127.0.0.1:8765", "Sec-Fetch-Site": "cross-site"},
])
def test_cross_site_post_with_a_valid_cookie_is_403(authed, headers):
    response = authed.post("/api/runs/run-a/stop", headers=headers)
    assert response.status_code == 403


@pytest.mark.parametrize("origin", ["http://127.0.0.1:8765", "http://localhost:8765", "http://[::1]:8765"])
def test_same_origin_post_passes(authed, origin):
    response = authed.post("/api/runs/run-a/stop", headers={"Origin": origin, "Sec-Fetch-Site": "same-origin"})
    assert response.status_code == 200
    assert response.json() == {"stopped": "run-a"}


def test_curl_like_post_with_bearer_and_no_origin_passes(client):
    assert client.post("/api/runs/run-a/stop", headers=BEARER).status_code == 200


def test_cross_site_get_is_not_refused_by_the_origin_rules(authed):
    # reads are protected by the token and the same-origin policy, not by Sec-Fetch-Site
    assert authed.get("/api/runs/run-a", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 200


# ---------------------------------------------------------------------------------- response headers


def test_security_headers_on_every_response(client, authed):
    assert client.get("/").status_code == 401
    for response in (client.get("/"), authed.get("/"), authed.get("/api/runs/run-a"),
                     authed.get("/api/runs/nope"), client.get("/", headers={"Host": "evil.example"})):
        assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "no-referrer"
        assert response.headers["x-frame-options"] == "DENY"
    csp = CONTENT_SECURITY_POLICY
    assert "script-src 'self';" in csp and "unsafe-eval" not in csp and "frame-ancestors 'none'" in csp


def test_api_responses_are_never_cached(authed):
    assert authed.get("/api/runs/run-a").headers["cache-control"] == "no-store"
    cached = authed.get("/api/cached")
    assert cached.headers.get_list("cache-control") == ["no-store"]  # the app's own header is replaced
    assert "cache-control" not in authed.get("/").headers


def test_streaming_response_passes_through(authed):
    with authed.stream("GET", "/api/stream") as response:
        assert response.status_code == 200
        assert response.headers["x-frame-options"] == "DENY"
        assert list(response.iter_lines()) == ["chunk 0", "chunk 1", "chunk 2"]


def test_head_of_a_refusal_has_no_body(client):
    response = client.head("/")
    assert response.status_code == 401 and response.content == b""


def test_websockets_need_the_token_and_our_origin(client, authed):
    host = {"Host": f"127.0.0.1:{PORT}"}  # the test client's websockets say "testserver" otherwise
    with pytest.raises(WebSocketDisconnect):
        with client.websocket_connect("/ws", headers=host):
            pass
    with pytest.raises(WebSocketDisconnect):
        with authed.websocket_connect("/ws", headers={**host, "Origin": "http://evil.example"}):
            pass
    with pytest.raises(WebSocketDisconnect):
        with authed.websocket_connect("/ws", headers={"Host": "evil.example", "Origin": BASE}):
            pass
    with authed.websocket_connect("/ws", headers={**host, "Origin": BASE}) as ws:
        assert ws.receive_text() == "hello"


# ---------------------------------------------------------------------------------- paths


@pytest.mark.parametrize("part", ["..", ".", "", "../x", "x/..", "/etc/passwd", "a/b", "a\\b", "..\\x",
                                  "run-a\x00", "~", "~root", "C:", "c:\\windows", "C:x"])
def test_resolve_in_refuses_parts_that_are_not_plain_names(runs_dir, part):
    with pytest.raises(PathRefused) as refused:
        resolve_in(runs_dir, part)
    message = str(refused.value)
    assert "\n" not in message and repr(part) in message


def test_refusal_is_a_value_error(runs_dir):
    assert issubclass(PathRefused, ValueError)
    with pytest.raises(ValueError):
        run_dir_of(runs_dir, "..")


def test_resolve_in_joins_plain_names(runs_dir):
    assert resolve_in(runs_dir, "run-a", "sub") == (runs_dir / "run-a" / "sub").resolve()
    assert resolve_in(runs_dir, "not-yet") == (runs_dir / "not-yet").resolve()  # existence is the caller's
    # a literal "%2e%2e" (a double-encoded "..", decoded once) is a strange name, not the parent
    assert resolve_in(runs_dir, "%2e%2e") == (runs_dir / "%2e%2e").resolve()
    with pytest.raises(PathRefused):
        resolve_in(runs_dir, "run-a", "..")


def test_symlink_pointing_outside_is_refused(runs_dir):
    (runs_dir / "escape").symlink_to(runs_dir.parent / "outside", target_is_directory=True)
    (runs_dir / "run-a" / "leak").symlink_to(runs_dir.parent / "outside" / "secret.txt")
    (runs_dir / "root").symlink_to(runs_dir, target_is_directory=True)
    with pytest.raises(PathRefused):
        run_dir_of(runs_dir, "escape")
    with pytest.raises(PathRefused):
        resolve_in(runs_dir, "escape", "secret.txt")
    with pytest.raises(PathRefused):
        resolve_in(runs_dir, "run-a", "leak")
    with pytest.raises(PathRefused):
        run_dir_of(runs_dir, "root")


def test_symlink_pointing_inside_is_followed(runs_dir):
    (runs_dir / "alias").symlink_to(runs_dir / "run-a", target_is_directory=True)
    assert run_dir_of(runs_dir, "alias") == (runs_dir / "run-a").resolve()
    assert resolve_in(runs_dir, "alias", "sub") == (runs_dir / "run-a" / "sub").resolve()


def test_runs_dir_given_through_a_symlink(runs_dir, tmp_path):
    link = tmp_path / "runs-link"
    link.symlink_to(runs_dir, target_is_directory=True)
    assert run_dir_of(link, "run-a") == (runs_dir / "run-a").resolve()


def test_run_dir_of_wants_a_directory_directly_in_runs_dir(runs_dir):
    assert run_dir_of(runs_dir, "run-a") == (runs_dir / "run-a").resolve()
    for name in ("notes.txt", "missing", "x" * 300):
        with pytest.raises(PathRefused):
            run_dir_of(runs_dir, name)
    (runs_dir / "deep").symlink_to(runs_dir / "run-a" / "sub", target_is_directory=True)
    with pytest.raises(PathRefused):
        run_dir_of(runs_dir, "deep")


@pytest.mark.parametrize("url", [
    "/api/runs/..%2F..%2Fetc",
    "/api/runs/%2e%2e",
    "/api/runs/%2E%2E",
    "/api/runs/..%5c",
    "/api/runs/..%5C..%5Cetc",
    "/api/runs/%2e%2e%2f%2e%2e%2foutside",
    "/api/runs/run-a%00",
    "/api/runs/%2Fetc%2Fpasswd",
    "/api/runs/~",
    "/api/runs/notes.txt",
    "/api/files/..%2Foutside%2Fsecret.txt",
    "/api/files/run-a/..%2F..%2Foutside%2Fsecret.txt",
    "/api/files/%2e%2e/outside/secret.txt",
    "/api/files/%2Fetc%2Fpasswd",
    "/api/files/run-a%5C..%5C..%5Coutside",
])
def test_encoded_traversal_through_the_router_never_leaves_runs_dir(authed, app, runs_dir, url):
    response = authed.get(url)
    assert response.status_code in (400, 404), (url, response.text)
    outside = str(runs_dir.parent / "outside")
    assert outside not in response.text and "secret" not in response.text.replace("secret.txt", "")


def test_router_hands_decoded_names_to_the_checks(authed, app):
    # the refusals above happen in resolve_in, not by luck of routing: the names arrive decoded
    authed.get("/api/runs/%2e%2e")
    authed.get("/api/runs/..%5c")
    authed.get("/api/files/run-a/..%2F..%2Foutside")
    assert app.state.seen == ["..", "..\\", "run-a/../../outside"]


def test_symlink_escape_through_the_router(authed, runs_dir):
    os.symlink(runs_dir.parent / "outside", runs_dir / "escape")
    assert authed.get("/api/runs/escape").status_code == 404
    assert authed.get("/api/files/escape/secret.txt").status_code == 404
    assert authed.get("/api/runs/run-a").status_code == 200
