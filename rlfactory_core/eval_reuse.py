"""The eval before training, reused (``eval.reuse_untrained``).

Before its first step a new run evaluates the model it starts from. With greedy decoding that
eval is the same in every run that evaluates the same model files on the same samples with the
same settings and code on the same kind of machine: every seed of a recipe, every rerun. So it
is kept, per split, in ``$RLFACTORY_HOME/evals/<key>/`` (``$RLFACTORY_EVAL_CACHE`` moves it) and
copied into a later run's directory instead of being run again: its metrics, its sample
trajectories (``samples/``) and its token records (``trajectories/``), byte for byte. The run's
output says which run it came from. ``$RLFACTORY_EVAL_CACHE=off`` turns it off whatever the
config says (the test kit's scripted backend does).

The key is a sha256 over everything that can change the result:

* the config, all of it but what cannot touch this eval (the run directory, the training
  length, the cold start and checkpoint settings, the live view and the metric sinks, the other
  eval splits, and ``train.seed`` when the eval is greedy);
* the samples evaluated (their canonical JSON) and the split's name;
* the model's files (name, size and modification time of each);
* what the env's episodes read besides the samples and the code, as the env fingerprints it
  (its optional ``data_fingerprint(samples)``: a corpus, database files). An env without it, or
  that returns None (a live service, an MCP server), is never reused;
* the code: every installed distribution's name and version, and the source files of every
  package imported from outside ``site-packages`` (a checkout, an editable install);
* the machine's kind (CPU model and flags, or the GPU's name): vLLM's CPU numerics differ
  between an Intel and an AMD machine (bench/README.md, issue 39's fourth pass).

A damaged entry is reported, removed and evaluated again; two runs that store one key at once
keep the first (an entry is published by one rename).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from ._fs import fsync_tree, remove_tree
from .config import RunConfig
from .fingerprints import hash_file
from .interfaces import member
from .models import rlfactory_home

__all__ = ["CACHE_ENV", "UntrainedEvals", "cache_root", "reuse_enabled", "code_fingerprint", "machine_fingerprint",
           "model_fingerprint", "reused_config"]

#: Where reused evals are kept (default ``$RLFACTORY_HOME/evals``); ``off`` turns reuse off.
CACHE_ENV = "RLFACTORY_EVAL_CACHE"
log = logging.getLogger("rlfactory.eval")
_FORMAT = 1
_ENTRY = "entry.json"


def reuse_enabled() -> bool:
    """False when ``$RLFACTORY_EVAL_CACHE`` is ``off`` (a scripted backend's evals are not the model's)."""
    return os.environ.get(CACHE_ENV, "").strip().lower() != "off"


def cache_root() -> Path:
    value = os.environ.get(CACHE_ENV, "").strip()
    return Path(value).expanduser() if value else rlfactory_home() / "evals"


def reused_config(config: RunConfig) -> dict[str, Any]:
    """The part of ``config`` the eval before training depends on (see the module docstring)."""
    data = config.model_dump(mode="json")
    for key in ("run_dir", "cold_start", "checkpoint"):
        data.pop(key)
    data["train"].pop("steps")
    if config.eval.temperature == 0:  # greedy: no sampling seed reaches the tokens
        data["train"].pop("seed")
    for key in ("every", "splits"):
        data["eval"].pop(key)
    for key in ("live", "tensorboard", "wandb_project", "wandb_entity", "no_tool_call_warning",
                "record_train_groups"):
        data["logging"].pop(key)
    return data


def model_fingerprint(model_dir: str | os.PathLike[str]) -> list[list[Any]]:
    """Each file under ``model_dir``: relative name, size, modification time (ns)."""
    root = Path(model_dir)
    if not root.is_dir():
        return [[str(model_dir)]]  # a hub id: its own name
    return sorted([str(p.relative_to(root)), s.st_size, s.st_mtime_ns]
                  for p in root.rglob("*") if p.is_file() for s in (p.stat(),))


def _source_roots() -> list[Path]:
    """The directories of the top-level packages imported from outside ``site-packages``."""
    installed = tuple(os.path.realpath(p) for p in (sys.base_prefix, sys.prefix))
    roots: set[Path] = set()
    for name, module in list(sys.modules.items()):
        if "." in name:
            continue
        for location in getattr(module, "__path__", None) or ([module.__file__] if getattr(module, "__file__", None)
                                                               else []):
            real = os.path.realpath(location)
            if real.startswith(installed) or "site-packages" in real or "dist-packages" in real:
                continue
            roots.add(Path(real))
    return sorted(roots)


def code_fingerprint() -> str:
    """Every installed distribution's name and version, and the source of every package
    imported from outside ``site-packages`` (see the module docstring)."""
    digest = hashlib.sha256()
    dists = sorted({f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
                    if d.metadata["Name"]})
    digest.update(json.dumps(dists).encode())
    for root in _source_roots():
        files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
        for path in files:
            if "__pycache__" in path.parts or not path.is_file():
                continue
            digest.update(str(path.relative_to(root.parent)).encode() + b"\0")
            hash_file(path, digest)
    return digest.hexdigest()


def machine_fingerprint() -> dict[str, Any]:
    """The kind of machine the numbers come from: the CPU's model and flags, the GPUs' names."""
    cpu: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "flags") and key.strip() not in cpu:
                cpu[key.strip()] = value.strip()
    except OSError:
        cpu["processor"] = platform.processor()
    gpus: list[str] = []
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"machine": platform.machine(), "cpu": cpu, "gpus": gpus}


def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (bytes, bytearray)):
        return {"sha256": hashlib.sha256(value).hexdigest()}
    if hasattr(value, "tobytes"):  # an image, an array
        return {"type": type(value).__name__, "sha256": hashlib.sha256(value.tobytes()).hexdigest(),
                "shape": _canonical(getattr(value, "size", getattr(value, "shape", None)))}
    return {"type": type(value).__name__, "repr": repr(value)}


class UntrainedEvals:
    """The reused evals of one run's starting model (built when the run opens; see the module
    docstring). ``key`` names a split's entry; ``load`` copies it into the run, ``store`` keeps
    one the run computed."""

    def __init__(self, config: RunConfig, env: Any, model_dir: str | os.PathLike[str], root: Path | None = None):
        self.env, self.root = env, root if root is not None else cache_root()
        self.base = {"format": _FORMAT, "config": reused_config(config), "model": model_fingerprint(model_dir),
                     "code": code_fingerprint(), "machine": machine_fingerprint()}

    def key(self, split: str, samples: Sequence[Any]) -> str | None:
        """The entry of ``split``'s eval of ``samples``; None when the env cannot fingerprint
        what its episodes read (then the eval is not reused)."""
        fingerprint = member("env", self.env, "data_fingerprint")
        try:
            data = fingerprint(samples) if fingerprint is not None else None
        except Exception as exc:  # a sample naming a missing database: its episodes say so, not the key
            log.warning("the eval before training is not reused: the env's data_fingerprint failed: %s", exc)
            return None
        if data is None:
            return None
        text = json.dumps({**self.base, "split": split, "data": data, "samples": _canonical(list(samples))},
                          sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()[:40]

    def load(self, key: str, run_dir: Path) -> tuple[dict[str, float], dict[str, Any]] | None:
        """The entry's metrics and origin, its files copied into ``run_dir``; None when there is
        no entry (a damaged one is removed, with a warning in the log)."""
        entry = self.root / key
        if not entry.is_dir():
            return None
        try:
            saved = json.loads((entry / _ENTRY).read_text())
            files = [Path(name) for name in saved["files"]]
            if saved.get("format") != _FORMAT or any(f.is_absolute() or ".." in f.parts for f in files):
                raise ValueError("not an entry of this version")
            missing = [str(f) for f in files if not (entry / "files" / f).is_file()]
            if missing:
                raise ValueError(f"missing {', '.join(missing)}")
            metrics = {str(k): float(v) for k, v in saved["metrics"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning(
                "the reused eval %s is damaged (%s): removed, evaluating again", entry, exc)
            remove_tree(entry)
            return None
        for name in files:
            target = run_dir / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(entry / "files" / name, target)
        return metrics, dict(saved.get("origin", {}))

    def store(self, key: str, run_dir: Path, metrics: dict[str, float], files: Sequence[Path]) -> None:
        """Keep ``metrics`` and ``files`` (inside ``run_dir``) as ``key``'s entry: written aside,
        published by one rename; an entry another run published first is kept. A failure (a
        full disk) is a warning in the log: the run has its eval either way."""
        entry = self.root / key
        if entry.exists():
            return
        tmp = self.root / f".{key}.{os.getpid()}.tmp"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            remove_tree(tmp)
            names = [str(Path(f).relative_to(run_dir)) for f in files]
            for name in names:
                (tmp / "files" / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(run_dir / name, tmp / "files" / name)
            (tmp / _ENTRY).write_text(json.dumps({
                "format": _FORMAT, "metrics": metrics, "files": names,
                "origin": {"run_dir": str(run_dir), "time": time.strftime("%Y-%m-%d %H:%M:%S")}}, indent=1))
            fsync_tree(tmp)
            os.rename(tmp, entry)
        except OSError as exc:
            if not entry.exists():  # else another run published it first
                log.warning("the eval before training could not be kept for reuse in %s: %s", entry, exc)
        finally:
            remove_tree(tmp)
