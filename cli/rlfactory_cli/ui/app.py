"""The ``rlf ui`` web app: a JSON API over the runs directory and one static page.

Every route is behind :class:`~.security.AccessGuard` (the access token, the Host and Origin
checks); run names from requests are resolved inside the runs directory
(:func:`~.security.run_dir_of`). The page (``static/``) and plotly.js (read from the plotly
wheel, at its pinned version) are served from here: nothing comes from a CDN, and the UI works
with no network.
"""

from __future__ import annotations

import hashlib
import os
import pkgutil
from pathlib import Path
from typing import Any, Sequence

from fastapi import Body, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles

from rlfactory_core.records import RecordError

from . import compare, export, new_run, search
from .launcher import LaunchError, Launcher
from .runs_data import SORTABLE, RunsData
from .security import AccessGuard, PathRefused

__all__ = ["create_app"]

STATIC = Path(__file__).parent / "static"
#: The longest mcpServers JSON taken from the form (characters).
MAX_MCP_JSON = 256_000


def create_app(runs_dir: str | Path, *, token: str, port: int, launcher: Launcher | None = None,
               allowed_hosts: Sequence[str] = ("127.0.0.1", "localhost", "[::1]")) -> Any:
    """The app serving ``runs_dir``, guarded by ``token`` (for a server on ``port``, reached
    by one of ``allowed_hosts``)."""
    launcher = launcher or Launcher(Path(runs_dir).resolve())
    data = RunsData(runs_dir, controls=launcher.controls)
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

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        return JSONResponse({"error": f"{where or 'request'}: {first.get('msg', 'invalid')}"}, status_code=422)

    # ------------------------------------------------------------------ the page

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/vendor/plotly.min.js", include_in_schema=False)
    def plotly_js() -> Response:
        return Response(_plotly_js(), media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    # ------------------------------------------------------------------ runs
    # Routes that answer with records or metrics return RunsData's JSON-safe values as a
    # response: FastAPI would otherwise walk every value (jsonable_encoder) before encoding it,
    # 260 ms for the 160k points of a 1,000-step run's metrics (bench/ui_records.py).

    @app.get("/api/runs")
    def runs() -> dict[str, Any]:
        return {"runs_dir": str(data.runs_dir), "runs": data.runs()}

    @app.get("/api/runs/{name}")
    def run(name: str) -> dict[str, Any]:
        page = data.run(name)
        data.prefetch(name, page["recorded"])  # the step lists, for a list of every step
        return page

    @app.get("/api/runs/{name}/metrics")
    def metrics(name: str) -> Response:
        return Response(data.metrics_json(name), media_type="application/json")

    @app.get("/api/runs/{name}/console")
    def console(name: str, lines: int = Query(200, ge=1, le=5000)) -> dict[str, Any]:
        run_dir = data.run_dir(name)
        out = {}
        for file in ("console.txt", "log.txt"):
            refused: dict[str, str] = {}
            if data.readable(run_dir / file, refused):
                out[file] = _tail(run_dir / file, lines)
            elif refused:  # shown where the text would be, with the reason
                out[file] = f"({refused[file]})"
        return out

    @app.get("/api/runs/{name}/trajectories")
    def trajectories(name: str, kind: str = "eval", step: int | None = None, min_reward: float | None = None,
                     max_reward: float | None = None, stop_reason: str | None = None,
                     tool_error: str | None = None, sample_id: str | None = None, outcome: str | None = None,
                     policy_version: int | None = None, sequences: int | None = None,
                     sort: str | None = Query(None, pattern=f"^({'|'.join(SORTABLE)})$"),
                     order: str = Query("asc", pattern="^(asc|desc)$"),
                     offset: int = Query(0, ge=0), limit: int = Query(100, ge=1, le=1000)) -> JSONResponse:
        return JSONResponse(data.trajectories(
            name, _kind(kind), step=step, min_reward=min_reward, max_reward=max_reward,
            stop_reason=stop_reason or None, tool_error=tool_error or None, sample_id=sample_id or None,
            outcome=outcome or None, policy_version=policy_version, sequences=sequences, sort=sort or None,
            descending=order == "desc", offset=offset, limit=limit))

    @app.get("/api/runs/{name}/trajectories/{kind}/{step}/{index}")
    def trajectory(name: str, kind: str, step: int, index: int) -> Response:
        return Response(data.trajectory_json(name, _kind(kind), step, index), media_type="application/json")

    @app.get("/api/runs/{name}/search")
    def search_run(name: str, q: str = Query(..., max_length=1000), kind: str | None = None,
                   outcome: str | None = Query(None, max_length=100)) -> JSONResponse:
        return JSONResponse(search.search(data, name, q, _kind(kind) if kind else None, outcome=outcome))

    # ------------------------------------------------------------------ downloads

    @app.get("/api/runs/{name}/export/metrics.csv")
    def export_metrics(name: str) -> Response:
        text = export.metrics_csv(data, name)
        return Response(text, media_type="text/csv; charset=utf-8", headers=export.attachment(f"{name}-metrics.csv"))

    @app.get("/api/runs/{name}/export/trajectories.jsonl")
    def export_trajectories(name: str, kind: str = "eval", step: int | None = None, min_reward: float | None = None,
                            max_reward: float | None = None, stop_reason: str | None = None,
                            tool_error: str | None = None, sample_id: str | None = None,
                            outcome: str | None = None, policy_version: int | None = None,
                            sequences: int | None = None) -> StreamingResponse:
        kind = _kind(kind)
        data.run_dir(name)  # an unknown run is a 404 before the stream starts
        lines = export.trajectories_jsonl(data, name, kind, step=step, min_reward=min_reward, max_reward=max_reward,
                                          stop_reason=stop_reason or None, tool_error=tool_error or None,
                                          sample_id=sample_id or None, outcome=outcome or None,
                                          policy_version=policy_version, sequences=sequences)
        where = f"-step-{step}" if step is not None else ""
        return StreamingResponse(lines, media_type="application/x-ndjson",
                                 headers=export.attachment(f"{name}-{kind}{where}.jsonl"))

    @app.get("/api/runs/{name}/export/config.yaml")
    def export_config(name: str) -> Response:
        text = export.config_yaml(data, name)
        if text is None:
            return JSONResponse({"error": f"{name} has no config.yaml to download"}, status_code=404)
        return Response(text, media_type="application/yaml", headers=export.attachment(f"{name}-config.yaml"))

    @app.get("/api/runs/{name}/group")
    def group(name: str, step: int, group: int, kind: str = "train") -> Response:
        import orjson

        return Response(orjson.dumps(compare.group(data, name, _kind(kind), step, group)),
                        media_type="application/json")

    @app.get("/api/runs/{name}/same-sample")
    def same_sample(name: str, sample_id: str, kind: str = "eval") -> JSONResponse:
        return JSONResponse(data.same_sample(name, _kind(kind), sample_id))

    @app.post("/api/runs/{name}/stop")
    def stop(name: str) -> dict[str, Any]:
        return {"stopped": name, "pid": launcher.stop(name)}

    @app.delete("/api/runs/{name}")
    def delete(name: str) -> dict[str, Any]:
        launcher.delete(name)
        data.forget(name)
        return {"deleted": name}

    @app.put("/api/runs/{name}/tags")
    def tags(name: str, body: dict[str, Any] = Body(...)) -> JSONResponse:
        data.run_dir(name)  # an unknown run: 404 (PathRefused), not a bad tag
        try:
            return JSONResponse({"name": name, "tags": data.set_tags(name, body.get("tags"))})
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)

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
        # exactly what Launch checks: Check and Launch never disagree
        return new_run.validate(_with_mcp_file(data.runs_dir, values), runs_dir=data.runs_dir)

    @app.post("/api/new-run/launch")
    def launch(values: dict[str, Any] = Body(...)) -> JSONResponse:
        checked = new_run.validate(_with_mcp_file(data.runs_dir, values), runs_dir=data.runs_dir)
        if not checked["ok"]:
            return JSONResponse(checked, status_code=422)
        return JSONResponse({**checked, "run": launcher.launch(checked["config"])})

    @app.post("/api/new-run/mcp-tools")
    async def mcp_tools(body: dict[str, Any] = Body(...)) -> dict[str, Any]:
        return await new_run.mcp_tools(str(body.get("mcpServers_json", "")))

    # level 1: a 1,000-step run's 1.8 MB of metrics in 20 ms instead of level 9's 275 ms, 7% larger
    app.add_middleware(GZipMiddleware, minimum_size=2048, compresslevel=1)
    # last added, so first to see a request: nothing answers before the token and Host are checked
    app.add_middleware(AccessGuard, token=token, port=port, allowed_hosts=tuple(allowed_hosts))
    return app


def _kind(kind: str) -> str:
    """A kind of record: ``train``, ``eval``, ``cold_start_eval``, or one of those evals on an
    ``eval.splits`` split (``eval-<split>``; split names are letters, digits, ``_-.``)."""
    base, _, split = kind.partition("-")
    if base not in ("train", "eval", "cold_start_eval") or (kind != base and (
            base == "train" or not split or split.strip(".") == "" or
            not all(ch.isalnum() or ch in "_-." for ch in split))):
        raise PathRefused(f"unknown kind {kind!r} (train, eval, cold_start_eval, or eval-<split>)")
    return kind


def _with_mcp_file(runs_dir: Path, values: dict[str, Any]) -> dict[str, Any]:
    """The form's values with a pasted mcpServers JSON saved as a file (the mcp env reads its
    servers from ``env_options.mcp_config``), named by its content, in ``RUNS_DIR/.ui/``."""
    values = dict(values)
    text = values.pop("mcpServers_json", None)
    if text is not None and not isinstance(text, str):
        raise LaunchError("mcpServers_json: must be the JSON text of an mcpServers config")
    if text and text.strip():
        if len(text) > MAX_MCP_JSON:
            raise LaunchError(f"mcpServers_json: {len(text)} characters; an mcpServers config of more than "
                              f"{MAX_MCP_JSON} is not one")
        directory = runs_dir / ".ui"
        directory.mkdir(mode=0o700, exist_ok=True)
        path = directory / f"mcp-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
        if not path.exists():  # owner-only: the servers' env often holds API keys
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
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
    """The last ``lines`` lines of ``path``, each as a terminal leaves it: a progress bar's
    carriage-return updates folded into their last state (tqdm writes one per update)."""
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - 200_000))
        text = f.read().decode("utf-8", errors="replace")
    shown = [line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n")]
    if shown and shown[-1] == "":
        shown.pop()
    return "\n".join(shown[-lines:])
