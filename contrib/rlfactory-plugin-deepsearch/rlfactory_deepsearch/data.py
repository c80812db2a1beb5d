"""The offline deepsearch dataset: questions about countries, answered from a small corpus.

Search-R1 trains on NQ/HotpotQA questions over a 21M-passage Wikipedia dump (wiki-18). This
module builds the same kind of task from facts shipped on PyPI, so it runs offline on a CPU:

* facts: the package ``countryinfo`` (name, capital, region, currencies, languages, borders,
  population ... of countries and territories), with ``pycountry`` turning ISO codes into
  names (``EUR`` -> "Euro", ``fr`` -> "French", ``DEU`` -> "Germany"); entries without a current
  ISO code or with hardly any facts, withdrawn currencies and odd codes are left out;
* ``corpus.jsonl``: short encyclopedic passages (under :data:`MAX_PASSAGE_WORDS` words, a small
  model's whole trajectory must fit in 1-2k tokens) in wiki-18's format,
  ``{"id": "0", "contents": "\\"France\\"\\nFrance lies in the Europe region, ..."}``: per country an
  overview (region, other names, demonym), currency and languages, land borders, population
  and area, and one passage per capital city ("Paris is the capital city of France.");
* ``train.jsonl`` / ``validation.jsonl`` / ``test.jsonl``: questions of the kinds in
  :data:`KINDS`, single-hop ("What is the capital of France?") and two-hop ("What currency is
  used in the country whose capital is Lima?"), each answerable from the corpus, unambiguous,
  and never containing its own answer. A capital is named only in its city's passage, so a
  two-hop question needs one passage to find the country and another for the answer;
* ``test_wordings.jsonl`` / ``test_composition.jsonl`` / ``test_counterfactual.jsonl`` and
  ``corpus_counterfactual.jsonl``: the splits that test beyond the training templates (new
  phrasings, unseen compositions of hops, a changed world's corpus;
  :mod:`rlfactory_deepsearch.generalisation`);
* ``manifest.json``: source package versions, counts, every file's hash and a content hash
  of the shipped corpus and splits.

Each sample is ``{"id", "question", "golden_answers", "answer", "hops", "kind", "data_source",
"entity", "supporting_ids"}``: ``golden_answers`` holds every accepted form (the first is
``answer``; aliases are names the corpus states, plus their unaccented spellings, deduplicated
under the exact-match reward's normalisation), ``entity`` is the country the question is about,
``supporting_ids`` the corpus passages that answer it, in the order they are needed.

Splits are by country: a stable hash puts each country, with all its questions, in train
(about 70%), validation (10%) or test (20%), so no test country is the subject of a training
question. With countryinfo 1.0.1 and pycountry 26.2.16: 236 countries, 1106 passages, 1632
questions (train 1149, validation 154, test 329). Building takes about a second and needs no
network; :func:`load_split` and :func:`default_corpus_path` build on first use. The facts are
countryinfo's, some dated (Kazakhstan's capital is Nur-Sultan, Swaziland keeps its old name,
Croatia has no currency because its kuna was withdrawn): the corpus, not the world, is the
ground truth. "Country" in the questions includes territories (Guam, Aruba ...).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from pathlib import Path
from typing import Any, Callable

from rlfactory_core import RLFactoryError, build_directory, normalize_answer, rlfactory_home

from .facts import DATA_SOURCE, KINDS, corpus_rows, load_countries, questions, split_of, stable_int
from .generalisation import COMPOSITIONS, GENERALISATION_SPLITS, generalisation_splits
from .search_r1_format import split_title

__all__ = [
    "SPLITS",
    "GENERALISATION_SPLITS",
    "ALL_SPLITS",
    "KINDS",
    "DATA_SOURCE",
    "MAX_PASSAGE_WORDS",
    "BUILDER_VERSION",
    "build",
    "default_data_dir",
    "default_corpus_path",
    "counterfactual_corpus_path",
    "load_split",
]

#: The splits by country (train about 70%, validation 10%, test 20% of the countries).
SPLITS = ("train", "validation", "test")
#: Every split :func:`load_split` knows: those by country, then the ones that test beyond the
#: training templates (:mod:`rlfactory_deepsearch.generalisation`).
ALL_SPLITS = SPLITS + GENERALISATION_SPLITS
#: Longest passage, in words: the policy model has a small context.
MAX_PASSAGE_WORDS = 60
#: Bumped whenever the output changes for the same sources, so old builds are rebuilt.
BUILDER_VERSION = 3

CORPUS_FILE = "corpus.jsonl"
COUNTERFACTUAL_CORPUS_FILE = "corpus_counterfactual.jsonl"
MANIFEST_FILE = "manifest.json"
_SHIPPED_FILES = (CORPUS_FILE,) + tuple(f"{split}.jsonl" for split in SPLITS)
_DATA_FILES = _SHIPPED_FILES + (COUNTERFACTUAL_CORPUS_FILE,) + tuple(f"{split}.jsonl" for split in GENERALISATION_SPLITS)
_SOURCES = ("countryinfo", "pycountry")

# --------------------------------------------------------------------------- locations


def default_data_dir() -> Path:
    """Where the dataset is built by default: ``$RLFACTORY_HOME/data/deepsearch``."""
    return rlfactory_home() / "data" / "deepsearch"


def default_corpus_path() -> Path:
    """The corpus of the default build (built first if needed, in seconds)."""
    return build() / CORPUS_FILE


def counterfactual_corpus_path(data_dir: Path | None = None) -> Path:
    """The changed world's corpus, for ``test_counterfactual`` (built first if needed)."""
    return build(data_dir) / COUNTERFACTUAL_CORPUS_FILE


# --------------------------------------------------------------------------- build


def _source_versions() -> dict[str, str]:
    versions = {}
    for package in _SOURCES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            raise RLFactoryError(f"the deepsearch dataset is built from {package}, which is not installed",
                                 hint=f"pip install {package} (a dependency of rlfactory-plugin-deepsearch)") from None
    return versions


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _dataset_files(progress: Callable[[str], None]) -> dict[str, bytes]:
    """The bytes of every file of the dataset, manifest included (deterministic: no dates)."""
    versions = _source_versions()
    progress(f"reading facts from countryinfo {versions['countryinfo']} and pycountry {versions['pycountry']}")
    countries = load_countries()
    rows, where = corpus_rows(countries)
    longest = max(len(split_title(row["contents"])[1].split()) for row in rows)
    if longest > MAX_PASSAGE_WORDS:
        raise RLFactoryError(f"a generated passage has {longest} words, over the limit of {MAX_PASSAGE_WORDS}",
                             hint="a countryinfo update changed the facts; pin countryinfo==1.0.1 and report it")
    samples = questions(countries, where)
    asked = [normalize_answer(s["question"]) for s in samples]
    if len(set(asked)) != len(asked):
        raise RLFactoryError("two generated questions are the same",
                             hint="a countryinfo update changed the facts; pin countryinfo==1.0.1 and report it")
    progress(f"{len(countries)} countries: {len(rows)} passages, {len(samples)} questions")
    splits: dict[str, list[dict[str, Any]]] = {split: [] for split in SPLITS}
    for sample in samples:
        country = sample["id"].rsplit("-", 1)[1]
        splits[split_of(country)].append(sample)
    beyond, changed_rows = generalisation_splits(countries, where)
    splits.update(beyond)
    files = {CORPUS_FILE: _jsonl(rows), COUNTERFACTUAL_CORPUS_FILE: _jsonl(changed_rows)}
    counts: dict[str, Any] = {"countries": len(countries), "passages": len(rows)}
    for split, split_samples in splits.items():
        # Shuffled by a hash of the id, so the first N of a split mix every kind and country.
        split_samples.sort(key=lambda s: stable_int("order", s["id"]))
        files[f"{split}.jsonl"] = _jsonl(split_samples)
        by_kind = {kind: sum(s["kind"] == kind for s in split_samples) for kind in [*KINDS, *COMPOSITIONS]}
        by_kind = {kind: n for kind, n in by_kind.items() if n or kind in KINDS}
        counts[split] = {"questions": len(split_samples), "by_kind": by_kind}
    hashes = {name: _sha256(data) for name, data in files.items()}
    manifest = {
        "dataset": "deepsearch-countryinfo",
        "builder_version": BUILDER_VERSION,
        "sources": versions,
        "counts": counts,
        "files": hashes,
        # of the shipped splits and corpus alone: unchanged since they were first built
        "content_hash": _sha256("".join(f"{name}:{hashes[name]}\n" for name in _SHIPPED_FILES).encode()),
    }
    files[MANIFEST_FILE] = (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    return files


def _is_complete(directory: Path) -> bool:
    """Whether ``directory`` holds a build of this builder from the installed sources, intact."""
    try:
        manifest = json.loads((directory / MANIFEST_FILE).read_text(encoding="utf-8"))
        if manifest.get("builder_version") != BUILDER_VERSION or manifest.get("sources") != _source_versions():
            return False
        return all(_sha256((directory / name).read_bytes()) == manifest["files"][name] for name in _DATA_FILES)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def build(out_dir: Path | None = None, force: bool = False,
          progress: Callable[[str], None] | None = None) -> Path:
    """Build the dataset (the corpora, every split, the manifest) into ``out_dir``; returns it.

    Takes a few seconds. Does nothing when ``out_dir`` already holds an intact build from the
    same builder and source versions, unless ``force``. The files are written to a temporary
    directory beside ``out_dir`` and moved into place only when complete, so an interrupted
    build leaves the previous one (or nothing), never a half dataset.

    :param out_dir: target directory (default :func:`default_data_dir`); it may hold only a
        previous build, since a rebuild replaces the whole directory.
    :param force: rebuild even when a complete build is there.
    :param progress: called with one-line messages as the build goes.
    """
    out_dir = Path(out_dir).expanduser() if out_dir is not None else default_data_dir()
    report = progress or (lambda message: None)

    def write(staged: Path) -> None:
        files = _dataset_files(report)
        for name in _DATA_FILES + (MANIFEST_FILE,):  # the manifest last: it marks a complete build
            (staged / name).write_bytes(files[name])
            report(f"wrote {name}")

    return build_directory(out_dir, label="the deepsearch dataset", owned=_DATA_FILES + (MANIFEST_FILE,),
                           is_complete=_is_complete, write=write, force=force, progress=report)


# --------------------------------------------------------------------------- loading


def load_split(split: str, data_dir: Path | None = None, size: int | None = None) -> list[dict[str, Any]]:
    """The samples of ``split`` (``train``, ``validation`` or ``test``), building the dataset
    first if needed.

    :param split: one of :data:`ALL_SPLITS`.
    :param data_dir: the build to read (default :func:`default_data_dir`); built there if absent.
    :param size: only the first ``size`` samples (a fixed mix of kinds and countries);
        None for all. More than the split holds is an error.
    """
    if split not in ALL_SPLITS:
        raise RLFactoryError(f"unknown deepsearch split {split!r}", hint=f"use one of: {', '.join(ALL_SPLITS)}")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise RLFactoryError(f"size must be a whole number >= 0 or None, got {size!r}",
                             hint="pass the number of samples to load, or None for the whole split")
    path = build(data_dir) / f"{split}.jsonl"
    samples = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            try:
                samples.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise RLFactoryError(f"{path}:{line_no}: not JSON ({exc.msg})",
                                     hint="rebuild the dataset: rlf data build deepsearch --force") from None
    if size is not None and size > len(samples):
        raise RLFactoryError(f"the deepsearch {split} split has {len(samples)} samples, {size} were asked for",
                             hint=f"ask for at most {len(samples)}, or None for all")
    return samples if size is None else samples[:size]
