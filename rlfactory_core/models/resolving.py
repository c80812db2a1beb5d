"""Where a model name points, and reaching the Hugging Face hub.

Three kinds of model names are accepted everywhere a model is asked for
(:func:`resolve_model`):

* an **embedded** name such as ``smollm2-135m-instruct``
  (:data:`~rlfactory_core.models.DEFAULT_MODEL`): prepared once into the cache by
  :mod:`rlfactory_core.models.embedded` and loaded from there;
* a **local directory** holding ``config.json`` (any Hugging Face model saved to disk);
* anything else is a **hub id** (``Qwen/Qwen3-4B``), returned as is; loading it needs the
  network or the Hugging Face cache.

For hub ids, :func:`hub_kwargs` makes an offline machine fail at once (or use its Hugging
Face cache) instead of retrying for half a minute, and :func:`load_error` turns whatever a
transformers loader raised into one :class:`~rlfactory_core.errors.ModelError` line that says
what to do. :mod:`~rlfactory_core.models.loading` and :mod:`~rlfactory_core.models.vision`
load through them.
"""

from __future__ import annotations

import functools
import errno
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ..errors import ModelError, one_line
from .embedded import DEFAULT_MODEL, EMBEDDED_MODELS, prepare_model

__all__ = ["resolve_model", "hub_kwargs", "load_error", "LOCAL_HINT"]

#: The hint of every "cannot find or reach this model" error.
LOCAL_HINT = f"pass a local model directory (one with config.json) or the embedded default '{DEFAULT_MODEL}'"


def _looks_local(text: str) -> bool:
    """A name written as a filesystem path rather than a hub id (``org/name``)."""
    return (
        text.startswith(("./", "../", "/", "~", ".\\", "..\\"))
        or text in {".", ".."}
        or os.path.isabs(text)
        or (len(text) > 1 and text[1] == ":")  # C:\...
    )


def resolve_model(name_or_path: str | os.PathLike[str]) -> str | Path:
    """Turn a model name into something ``from_pretrained`` can load.

    An embedded name is prepared and its directory returned; an existing directory with
    ``config.json`` is returned as a :class:`~pathlib.Path`; a path that does not exist
    (or holds no ``config.json``) is a :class:`ModelError`; anything else is a hub id and
    is returned unchanged (loading it needs the network or the Hugging Face cache).
    """
    text = os.fspath(name_or_path)
    if not text.strip():  # Path("") would be the current directory
        raise ModelError("empty model name", hint=LOCAL_HINT)
    if not isinstance(name_or_path, os.PathLike) and text in EMBEDDED_MODELS:
        return prepare_model(text)
    path = Path(text).expanduser()
    try:
        path.stat()
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:  # is_dir() would raise it, not say False
            raise ModelError(f"model name {text[:60]!r}... is {len(text)} characters, too long for a path or a hub id",
                             hint=LOCAL_HINT) from None
    if path.is_dir():
        if (path / "config.json").is_file():
            return path.absolute()
        raise ModelError(f"model directory {text!r} has no config.json",
                         hint="pass a directory written by save_pretrained() (config.json, weights, tokenizer)")
    if path.exists():
        raise ModelError(f"model path {text!r} is a file, not a model directory",
                         hint="pass the directory that holds config.json and the weights")
    if isinstance(name_or_path, os.PathLike) or _looks_local(text):
        raise ModelError(f"model directory {text!r} does not exist", hint=LOCAL_HINT)
    if text != text.strip():
        raise ModelError(f"invalid model name {text!r} (leading or trailing space)", hint=LOCAL_HINT)
    return text


def _truthy_env(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


@functools.lru_cache(maxsize=None)
def _hub_reachable() -> bool:
    """A quick TCP connect to the hub, so an offline machine fails at once.

    Without it huggingface_hub retries for about 25 s, printing a warning per retry,
    before the same failure. Behind a proxy a direct connect says nothing: assume yes.
    """
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=3):
            return True
    except OSError:
        return False


def hub_kwargs(resolved: str | Path) -> dict[str, Any]:
    """The ``from_pretrained`` keyword arguments for ``resolved`` (a :func:`resolve_model`
    result): none for a local directory; ``local_files_only`` for a hub id when the machine
    is offline, so the Hugging Face cache answers at once."""
    if isinstance(resolved, Path):
        return {}
    offline = _truthy_env("HF_HUB_OFFLINE") or _truthy_env("TRANSFORMERS_OFFLINE")
    # local_files_only still finds a copy in the Hugging Face cache, without the retries.
    return {"local_files_only": True} if offline or not _hub_reachable() else {}


_NETWORK_ERRORS = {
    "LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectError", "ConnectTimeout",
    "ConnectionError", "gaierror", "ReadTimeout", "TimeoutError",
}


def _is_network_error(exc: BaseException) -> bool:
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if type(cause).__name__ in _NETWORK_ERRORS or "couldn't connect" in str(cause).lower():
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def load_error(what: str, name: str, resolved: str | Path, exc: Exception) -> ModelError:
    """The one-line :class:`ModelError` for a failed load of ``what`` (``"model"``,
    ``"tokenizer"`` ...) named ``name`` by the user, resolved to ``resolved``: no network,
    an unknown hub id, or the loader's own message."""
    if isinstance(resolved, str):
        if _is_network_error(exc):
            return ModelError(
                f"cannot load {what} {name!r}: no network/hub access and no copy in the Hugging Face cache",
                hint=LOCAL_HINT,
            )
        if type(exc).__name__ in {"RepositoryNotFoundError", "GatedRepoError"} or "is not a local folder" in str(exc):
            return ModelError(f"cannot load {what} {name!r} from the hub: {one_line(exc)}",
                              hint="check the model id, or " + LOCAL_HINT)
    return ModelError(f"cannot load {what} {name!r} from {resolved}: {one_line(exc)}",
                      hint="rerun with RLFACTORY_DEBUG=1 for the traceback")
