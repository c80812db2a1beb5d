"""The security layer of ``rlf ui``: who may talk to the server, and which files a request may name.

The UI starts processes (it launches ``rlf train``), so a request it obeys is code run as the
user. It binds 127.0.0.1, but that alone protects nothing from the browser the user already
runs: any web page can send requests to 127.0.0.1, and DNS rebinding (evil.example first
resolving to the attacker, then to 127.0.0.1) makes such a page same-origin with us. Hence:

- every request carries the access token (a query parameter once, then a cookie, or an
  ``Authorization: Bearer`` header), compared in constant time;
- the Host header must name this server (a rebinding page's requests say ``Host: evil.example``);
- requests that change state must not come from another site (``Sec-Fetch-Site``, ``Origin``):
  cookies ignore ports, so a page on ``localhost:3000`` is "same-site" and would send our
  cookie, even with ``SameSite=Strict``;
- every response forbids framing, sniffing, referrers, inline scripts and eval (the CSP);
- run names and other path parts from requests never leave the runs directory.

:class:`AccessGuard` is a pure ASGI middleware (not ``BaseHTTPMiddleware``), so it wraps
streaming responses without buffering them and sees websocket scopes too.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Awaitable, Callable
from urllib.parse import unquote_plus, urlsplit

__all__ = [
    "AccessGuard",
    "PathRefused",
    "CONTENT_SECURITY_POLICY",
    "DEFAULT_ALLOWED_HOSTS",
    "cookie_name",
    "check_token",
    "new_token",
    "resolve_in",
    "run_dir_of",
]

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_ALLOWED_HOSTS = ("127.0.0.1", "localhost", "[::1]")
TOKEN_PARAM = "token"
MIN_TOKEN_LENGTH = 16
# What a token given by the user may hold: it travels in a URL, a cookie and a header unescaped.
TOKEN_CHARS = re.compile(r"[A-Za-z0-9._~-]+")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Sec-Fetch-Site values of requests this origin made itself ("same-origin") or the user typed,
# bookmarked or opened from a terminal ("none"). "same-site" is refused: another port on
# localhost is the same site.
OWN_FETCH_SITES = frozenset({"same-origin", "none"})

# Why each directive is what it is, checked against plotly.js 4.1.1 (plotly 7.1's
# package_data/plotly.min.js) in headless Chromium 150 under exactly this policy, listening for
# securitypolicyviolation events (a one-off check, not a test):
# - style-src 'unsafe-inline': plotly sets style="" attributes and injects <style> elements.
# - no 'unsafe-eval': the SVG "scatter" trace drew and exported with no violation. The WebGL
#   traces evaluate strings (scattergl raised script-src 'eval' violations; splom and parcoords
#   use the same regl, which compiles its draw calls with Function.apply, and this bundle's
#   reglPrecompiled table is empty), so the UI must draw
#   with "scatter", never "scattergl". Two other `Function(...)` calls in the bundle sit in
#   try/catch fallbacks that modern browsers never reach (globalThis exists; bind is native).
# - img-src blob:: the modebar's "download plot as png" (Plotly.toImage / downloadImage, png
#   or jpeg outside Safari) draws the SVG through an <img> whose src is a blob: URL; without
#   blob: the export fails with an img-src violation. Only scripts already running in this
#   origin can mint blob: URLs for it, so this adds no source an attacker controls.
# - map traces (maplibre) would need worker-src blob: and tile servers; the UI draws none.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; "
    "script-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'self'"
)
SECURITY_HEADERS = (
    ("content-security-policy", CONTENT_SECURITY_POLICY),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
)
API_PREFIX = "/api/"

UNKNOWN_HOST = "400 Bad Request: unknown Host. Open the URL that `rlf ui` printed.\n"
NO_TOKEN = ("401 Unauthorized: this page needs the access token. "
            "Open the URL that `rlf ui` printed (it ends in ?token=...).\n")
CROSS_SITE = "403 Forbidden: a request from another site may not change anything here.\n"
WEBSOCKET_POLICY_VIOLATION = 1008


# ---------------------------------------------------------------------------------- tokens


def new_token() -> str:
    """A fresh access token: 24 random bytes, URL-safe base64 (32 characters)."""
    return secrets.token_urlsafe(24)


def check_token(token: str) -> str:
    """``token`` itself when it may be used as an access token, else ValueError saying why.

    A token given by the user must be long enough not to be guessed by a page that can send
    thousands of requests a second to 127.0.0.1, and must travel in a URL, a cookie and a
    header without escaping."""
    if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(f"the access token must be at least {MIN_TOKEN_LENGTH} characters")
    if not TOKEN_CHARS.fullmatch(token):
        raise ValueError("the access token may hold only letters, digits and . _ ~ -")
    return token


def cookie_name(port: int) -> str:
    """The token cookie's name: cookies ignore ports, so two UIs on one host need two names."""
    return f"rlf_ui_token_{port}"


# ---------------------------------------------------------------------------------- paths


class PathRefused(ValueError):
    """A path part from a request that could name something outside its root."""


def resolve_in(root: Path, *parts: str) -> Path:
    """``root/parts...`` with symlinks followed, guaranteed strictly inside ``root.resolve()``.

    Each part is one path component from a request (routers have already decoded %2F and
    %2e%2e), so any part that is not a plain name is refused before the filesystem is asked,
    and the resolved result is checked again, for symlinks that point outside. The check and
    the later open are not atomic: whoever can swap symlinks in the runs directory already
    runs as the user, which is outside this threat model."""
    base = Path(root).resolve()
    for part in parts:
        _check_part(part)
    try:
        resolved = base.joinpath(*parts).resolve()
    except (RuntimeError, OSError):  # a symlink loop (RuntimeError before Python 3.13), a name too long
        raise PathRefused(f"refused path {'/'.join(parts)!r}: it cannot be resolved (a symlink loop?)") from None
    if resolved == base or not resolved.is_relative_to(base):
        raise PathRefused(f"refused path {'/'.join(parts)!r}: it leads outside {base.name or base}")
    return resolved


def run_dir_of(runs_dir: Path, name: str) -> Path:
    """The directory of the run called ``name``: a directory directly inside ``runs_dir``
    (after following symlinks), so a name can never reach a run's subdirectory or a file."""
    base = Path(runs_dir).resolve()
    path = resolve_in(base, name)
    if path.parent != base:
        raise PathRefused(f"refused run name {name!r}: it is not a directory directly in the runs directory")
    try:
        is_dir = path.is_dir()
    except OSError:  # ENAMETOOLONG and friends: no such run either way
        is_dir = False
    if not is_dir:
        raise PathRefused(f"refused run name {name!r}: no run directory by that name")
    return path


def _check_part(part: str) -> None:
    """PathRefused unless ``part`` is one plain file name on both POSIX and Windows."""
    if not isinstance(part, str):
        raise PathRefused(f"refused path part {part!r}: not a string")
    reason = None
    if part in ("", ".", ".."):
        reason = "not a name"
    elif "\x00" in part:
        reason = "it holds a NUL byte"
    elif "/" in part or "\\" in part:
        reason = "it holds a path separator"
    elif part.startswith("~"):
        reason = "it starts with ~"
    elif PurePosixPath(part).is_absolute() or PureWindowsPath(part).drive or re.match(r"[A-Za-z]:", part):
        reason = "it is an absolute path or has a drive letter"
    if reason is not None:
        raise PathRefused(f"refused path part {part!r}: {reason}")


# ---------------------------------------------------------------------------------- headers


def _split_host(value: str) -> tuple[str, str | None] | None:
    """``(host, port or None)`` of a Host header or an Origin's netloc, lower-cased; None when
    it cannot be read. IPv6 addresses keep their brackets, as they are written in Host."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        host, rest = value[: end + 1], value[end + 1:]
    else:
        host, sep, port = value.partition(":")
        rest = sep + port
    if rest == "":
        return host, None
    if not rest.startswith(":") or not rest[1:].isdigit():
        return None
    return host, rest[1:]


def _normal_host(host: str) -> str:
    """An allowed host as it appears in a Host header: lower case, IPv6 in brackets."""
    host = host.strip().lower()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return host


def _host_allowed(value: str | None, allowed: frozenset[str], port: int) -> bool:
    """Whether a Host header names this server: an allowed host, and our port if it has one."""
    split = _split_host(value) if value is not None else None
    if split is None:
        return False
    host, host_port = split
    return host in allowed and (host_port is None or int(host_port) == port)


def _origin_allowed(origin: str, allowed: frozenset[str], port: int) -> bool:
    """Whether an Origin header is this server: http(s), an allowed host, and our port."""
    try:
        parts = urlsplit(origin.strip())
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or parts.path or parts.query or parts.fragment:
        return False
    split = _split_host(parts.netloc)
    if split is None or "@" in parts.netloc:
        return False
    host, origin_port = split
    effective = int(origin_port) if origin_port is not None else (80 if parts.scheme == "http" else 443)
    return host in allowed and effective == port


def _headers(scope: Scope) -> dict[str, list[str]]:
    """The request's headers by lower-case name, each with every value it was sent with."""
    found: dict[str, list[str]] = {}
    for name, value in scope.get("headers", ()):
        found.setdefault(name.decode("latin-1").lower(), []).append(value.decode("latin-1"))
    return found


def _query_pairs(query: str) -> list[tuple[str, str, str]]:
    """``(raw piece, decoded name, decoded value)`` for each ``&``-separated query piece."""
    pairs = []
    for piece in query.split("&"):
        if piece:
            name, _, value = piece.partition("=")
            pairs.append((piece, unquote_plus(name), unquote_plus(value)))
    return pairs


def _cookies(header_values: list[str]) -> list[tuple[str, str]]:
    """The ``(name, value)`` pairs of every Cookie header (HTTP/2 may split them)."""
    pairs = []
    for header in header_values:
        for piece in header.split(";"):
            name, sep, value = piece.strip().partition("=")
            if sep:
                pairs.append((name.strip(), value.strip().strip('"')))
    return pairs


def _same_token(candidate: str, token: str) -> bool:
    """Constant-time comparison (compare_digest refuses non-ASCII str, so compare bytes)."""
    return secrets.compare_digest(candidate.encode("utf-8", "surrogatepass"), token.encode("utf-8"))


def _without_token_location(scope: Scope) -> str:
    """The request's own path and query minus every ``token`` parameter, as a relative URL.

    The raw path keeps the request's own encoding; leading slashes are collapsed so that the
    Location can never be read as a protocol-relative URL to another host."""
    raw_path = scope.get("raw_path")
    path = raw_path.decode("latin-1") if raw_path else scope.get("path", "/")
    path = "/" + path.lstrip("/\\")
    query = scope.get("query_string", b"").decode("latin-1")
    kept = [piece for piece, name, _ in _query_pairs(query) if name != TOKEN_PARAM]
    return path + ("?" + "&".join(kept) if kept else "")


# ---------------------------------------------------------------------------------- middleware


class AccessGuard:
    """ASGI middleware that answers 400/401/403 before the app sees a request that is not ours.

    Per HTTP request, in order: the Host header (400), the access token (401), and for methods
    that change state, ``Sec-Fetch-Site`` and ``Origin`` (403). A browser's first visit with
    ``?token=`` is redirected to the same URL without it, with the token in an HttpOnly,
    SameSite=Strict cookie, so the token leaves the address bar and the history. Every
    response gets the security headers; responses under ``/api/`` are never cached.
    Websockets (the UI opens none) must pass the same checks or are closed before accept.
    """

    def __init__(self, app: ASGIApp, *, token: str, port: int,
                 allowed_hosts: Iterable[str] = DEFAULT_ALLOWED_HOSTS):
        self.app = app
        self.token = check_token(token)
        self.port = int(port)
        self.allowed_hosts = frozenset(_normal_host(host) for host in allowed_hosts)
        if not self.allowed_hosts:
            raise ValueError("AccessGuard needs at least one allowed host")
        self.cookie = cookie_name(self.port)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
        else:  # lifespan: no request, nothing to guard
            await self.app(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope)
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            status, body, extra = refusal
            await self._plain(send, scope, status, body, extra)
            return
        if self._wants_token_cookie(scope, headers):
            await self._set_cookie_redirect(send, scope)
            return
        await self.app(scope, receive, self._with_headers(scope, send))

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope)
        # a websocket handshake is a GET, but it opens a channel both ways: check it like a POST
        if self._refusal(scope, headers, method="CONNECT") is not None:
            await send({"type": "websocket.close", "code": WEBSOCKET_POLICY_VIOLATION})
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope, headers: dict[str, list[str]],
                 method: str | None = None) -> tuple[int, str, list[tuple[str, str]]] | None:
        """``(status, body, extra headers)`` when the request must be refused, else None."""
        hosts = headers.get("host", [])
        if len(hosts) != 1 or not _host_allowed(hosts[0], self.allowed_hosts, self.port):
            return 400, UNKNOWN_HOST, []
        if not self._has_token(scope, headers):
            return 401, NO_TOKEN, [("www-authenticate", 'Bearer realm="rlf ui"')]
        method = method or scope.get("method", "GET").upper()
        if method not in SAFE_METHODS and self._cross_site(headers):
            return 403, CROSS_SITE, []
        return None

    def _has_token(self, scope: Scope, headers: dict[str, list[str]]) -> bool:
        """Whether any offered token (query, bearer header, our cookie) is the token."""
        return any(_same_token(candidate, self.token) for candidate in self._offered_tokens(scope, headers))

    def _offered_tokens(self, scope: Scope, headers: dict[str, list[str]]) -> list[str]:
        offered = [value for _, name, value in _query_pairs(scope.get("query_string", b"").decode("latin-1"))
                   if name == TOKEN_PARAM]
        for value in headers.get("authorization", []):
            scheme, _, credentials = value.strip().partition(" ")
            if scheme.lower() == "bearer":
                offered.append(credentials.strip())
        offered += [value for name, value in _cookies(headers.get("cookie", [])) if name == self.cookie]
        return offered

    def _cross_site(self, headers: dict[str, list[str]]) -> bool:
        """Whether a browser says this request comes from another site or origin.

        A request with neither header (curl, scripts with the bearer token) is not cross-site:
        browsers send Origin on every POST, PUT, PATCH and DELETE they make."""
        for site in headers.get("sec-fetch-site", []):
            if site.strip().lower() not in OWN_FETCH_SITES:
                return True
        return any(not _origin_allowed(origin, self.allowed_hosts, self.port)
                   for origin in headers.get("origin", []))

    def _wants_token_cookie(self, scope: Scope, headers: dict[str, list[str]]) -> bool:
        """A browser's page load (GET, Accept: text/html) with a correct ``?token=``."""
        if scope.get("method") != "GET":
            return False
        if not any("text/html" in accept.lower() for accept in headers.get("accept", [])):
            return False
        query = scope.get("query_string", b"").decode("latin-1")
        return any(name == TOKEN_PARAM and _same_token(value, self.token)
                   for _, name, value in _query_pairs(query))

    async def _set_cookie_redirect(self, send: Send, scope: Scope) -> None:
        cookie = f"{self.cookie}={self.token}; HttpOnly; SameSite=Strict; Path=/"
        extra = [("location", _without_token_location(scope)), ("set-cookie", cookie)]
        await self._plain(send, scope, 303, "303 See Other: the access token is now in a cookie.\n", extra)

    async def _plain(self, send: Send, scope: Scope, status: int, body: str,
                     extra: list[tuple[str, str]]) -> None:
        """A short text/plain answer of our own (never echoing the token), never cached."""
        data = body.encode("utf-8")
        headers = [("content-type", "text/plain; charset=utf-8"), ("content-length", str(len(data))),
                   ("cache-control", "no-store"), *extra, *SECURITY_HEADERS]
        await send({"type": "http.response.start", "status": status,
                    "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]})
        await send({"type": "http.response.body", "body": b"" if scope.get("method") == "HEAD" else data})

    def _with_headers(self, scope: Scope, send: Send) -> Send:
        """``send`` that puts the security headers on the app's response start, replacing any
        the app set itself (this layer's policy wins); body messages pass through untouched."""
        replaced = {name.encode("latin-1") for name, _ in SECURITY_HEADERS}
        added = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in SECURITY_HEADERS]
        if scope.get("path", "").startswith(API_PREFIX):
            replaced.add(b"cache-control")
            added.append((b"cache-control", b"no-store"))

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", ()) if k.lower() not in replaced]
                message = {**message, "headers": kept + added}
            await send(message)

        return send_with_headers
