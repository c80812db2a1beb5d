"""The ``rlf ui`` web app: a JSON API over the runs directory and one static page.

Every route is behind :class:`~.security.AccessGuard` (the access token, the Host and Origin
checks); run names from requests are resolved inside the runs directory
(:func:`~.security.run_dir_of`). The page (``static/``) and plotly.js (read from the plotly
wheel, at its pinned version) are served from here: nothing comes from a CDN, and the UI works
with no network.
"""

from __future__ import annotations

import hashlib
import pkgutil
from pathlib import Path
from typing import Any, Sequence

from fastapi import Body, FastAPI, Query, Request
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from rlfactory_core.records import RecordError

from . import new_run
from .launcher import LaunchError, Launcher
from .runs_data import RunsData
from .security import AccessGuard, PathRefused

__all__ = ["create_app"]

STATIC = Path(__file__).parent / "static"


def create_app(runs_dir: str | Path, *, token: str, port: int, launcher: Launcher | None = None,
               allowed_hosts: Sequence[str] = ("127.0.0.1", "localhost", "[::1]")) -> Any:
    """The app serving ``runs_dir``, guarded by ``token`` (for a server on ``port``, reached
    by one of ``allowed_hosts``)."""
    data = RunsData(runs_dir)
    launcher = launcher or Launcher(data.runs_dir)
    app = FastAPI(title="rlf ui", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.data, app.state.launcher = data, launcher

    @app.exception_handler(PathRefused)
    async def refused(_: Request, exc: PathRefused) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=404)

    @app.exception_handler(RecordError)
    async def unreadable(_: Request, exc: RecordError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=404)

    @app.exception_handler(LaunchError)
    async def not_launched(_: Request, exc: LaunchError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=409)

    # ------------------------------------------------------------------ the page

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/vendor/plotly.min.js", include_in_schema=False)
    def plotly_js() -> Response:
        return Response(_plotly_js(), media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    # ------------------------------------------------------------------ runs

    @app.get("/api/runs")
    def runs() -> dict[str, Any]:
        return {"runs_dir": str(data.runs_dir), "runs": data.runs()}

    @app.get("/api/runs/{name}")
    def run(name: str) -> dict[str, Any]:
        return data.run(name)

    @app.get("/api/runs/{name}/metrics")
    def metrics(name: str) -> dict[str, Any]:
        return data.metrics(name)

    @app.get("/api/runs/{name}/console")
    def console(name: str, lines: int = Query(200, ge=1, le=5000)) -> dict[str, Any]:
        run_dir = data.run_dir(name)
        out = {}
        for file in ("console.txt", "log.txt"):
            path = run_dir / file
            if path.is_file():
                out[file] = _tail(path, lines)
        return out

    @app.get("/api/runs/{name}/trajectories")
    def trajectories(name: str, kind: str = "eval", step: int | None = None, min_reward: float | None = None,
                     max_reward: float | None = None, stop_reason: str | None = None,
                     tool_error: str | None = None, sample_id: str | None = None,
                     offset: int = Query(0, ge=0), limit: int = Query(100, ge=1, le=1000)) -> dict[str, Any]:
        return data.trajectories(name, _kind(kind), step=step, min_reward=min_reward, max_reward=max_reward,
                                 stop_reason=stop_reason or None, tool_error=tool_error or None,
                                 sample_id=sample_id or None, offset=offset, limit=limit)

    @app.get("/api/runs/{name}/trajectories/{kind}/{step}/{index}")
    def trajectory(name: str, kind: str, step: int, index: int) -> dict[str, Any]:
        return data.trajectory(name, _kind(kind), step, index)

    @app.get("/api/runs/{name}/same-sample")
    def same_sample(name: str, sample_id: str, kind: str = "eval") -> dict[str, Any]:
        return data.same_sample(name, _kind(kind), sample_id)

    @app.post("/api/runs/{name}/stop")
    def stop(name: str) -> dict[str, Any]:
        return {"stopped": name, "pid": launcher.stop(name)}

    @app.post("/api/runs/{name}/resume")
    def resume(name: str) -> dict[str, Any]:
        launcher.resume(name)
        return {"resumed": name}

    # ------------------------------------------------------------------ a new run

    @app.get("/api/new-run/form")
    def form(env: str | None = None, preset: str | None = None) -> dict[str, Any]:
        return {"form": new_run.form_schema(env or None, preset or None), "choices": new_run.choices()}

    @app.post("/api/new-run/validate")
    def validate(values: dict[str, Any] = Body(...)) -> dict[str, Any]:
        return new_run.validate(_with_mcp_file(data.runs_dir, values))

    @app.post("/api/new-run/launch")
    def launch(values: dict[str, Any] = Body(...)) -> JSONResponse:
        checked = new_run.validate(_with_mcp_file(data.runs_dir, values))
        if not checked["ok"]:
            return JSONResponse(checked, status_code=422)
        return JSONResponse({**checked, "run": launcher.launch(checked["config"])})

    @app.post("/api/new-run/mcp-tools")
    async def mcp_tools(body: dict[str, Any] = Body(...)) -> dict[str, Any]:
        return await new_run.mcp_tools(str(body.get("mcpServers_json", "")))

    app.add_middleware(GZipMiddleware, minimum_size=2048)
    # last added, so first to see a request: nothing answers before the token and Host are checked
    app.add_middleware(AccessGuard, token=token, port=port, allowed_hosts=tuple(allowed_hosts))
    return app


def _kind(kind: str) -> str:
    if kind not in ("train", "eval", "cold_start_eval"):
        raise PathRefused(f"unknown kind {kind!r} (train, eval or cold_start_eval)")
    return kind


def _with_mcp_file(runs_dir: Path, values: dict[str, Any]) -> dict[str, Any]:
    """The form's values with a pasted mcpServers JSON saved as a file (the mcp env reads its
    servers from ``env_options.mcp_config``), named by its content, in ``RUNS_DIR/.ui/``."""
    values = dict(values)
    text = values.pop("mcpServers_json", None)
    if isinstance(text, str) and text.strip():
        directory = runs_dir / ".ui"
        directory.mkdir(exist_ok=True)
        path = directory / f"mcp-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
        path.write_text(text, encoding="utf-8")
        values["env_options.mcp_config"] = str(path)
    return values


_PLOTLY: list[bytes] = []


def _plotly_js() -> bytes:
    """plotly.js from the plotly wheel (the version pinned by the ``ui`` extra)."""
    if not _PLOTLY:
        js = pkgutil.get_data("plotly", "package_data/plotly.min.js")
        if js is None:
            raise FileNotFoundError("plotly.min.js is not in the installed plotly: pip install 'rlfactory[ui]'")
        _PLOTLY.append(js)
    return _PLOTLY[0]


def _tail(path: Path, lines: int) -> str:
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - 200_000))
        text = f.read().decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])
