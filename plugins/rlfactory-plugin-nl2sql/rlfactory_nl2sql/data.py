"""The built-in nl2sql dataset: a SQLite database of countries and questions with gold SQL.

Built offline in about a second from facts shipped on PyPI (``rlf data build nl2sql``, or on
first use) into ``$RLFACTORY_HOME/data/nl2sql``, in the **Spider format**, so the same loader
reads it and Spider's own files::

    tables.json                       Spider schema entry of the database
    train.json, validation.json, test.json, test_wordings.json, test_skeletons.json
                                      JSON arrays of {"id", "db_id", "question", "query", "kind",
                                      "check_db_id"}
    database/world/world.sqlite
    database/world_perturbed/world_perturbed.sqlite
                                      the check copy: same schema and names, other facts
    manifest.json                     source versions, counts, file hashes

The database ``world`` (facts of the package ``countryinfo``; ``pycountry`` turns ISO codes
into names; entries without a current ISO code, a world region and a subregion are left
out, as are withdrawn currencies and ISO fund codes)::

    countries(code, name, region, subregion, population, area)     code: ISO 3166 alpha-3; area in km²
    capitals(country_code, name, latitude, longitude)
    currencies(code, name)                                          ISO 4217
    country_currencies(country_code, currency_code)
    languages(code, name)                                           ISO 639
    country_languages(country_code, language_code)
    borders(country_code, neighbour_code)                           both directions

Questions come from the templates of :data:`KINDS` (look-ups, joins, aggregates, ordered
top-k, filters), each naming its values exactly as the database spells them. Every gold SQL
is normalised by sqlglot, run in the sandbox, and kept only when it returns a non-empty
result with no NULL in its first row; a top-k question is kept only when no tie decides its
answer. Splits: a stable hash of the question's id puts it in train (70%), validation (10%)
or test (20%); each split is shuffled by a hash, so its first N rows mix the kinds.
``test_wordings`` and ``test_skeletons`` test beyond the templates (other wordings; SQL
skeletons, join paths and aggregate patterns no training question has): see
:mod:`rlfactory_nl2sql.generalisation`.

**The check copy.** Every question names ``world_perturbed`` as its ``check_db_id``: the same
countries, regions, currencies and languages by name, with other facts
(:func:`rlfactory_nl2sql.facts.perturbed`). The ``sql_execution`` reward counts a query only
when it returns the gold SQL's result on both databases, so a constant
(``SELECT 'Andorra la Vella'``) or a result copied from a tool call scores like a wrong
query. The manifest counts, per split, the questions whose answer differs between the two
(the rest could still be answered by a constant; a top-k question is kept only when it is
decided on both).

The build is deterministic (two builds are byte-identical) and atomic: files are written into
a temporary directory beside the target and moved into place only when complete, so an
interrupted build leaves the previous build (or nothing), never half a dataset.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import sqlite3
from pathlib import Path
from typing import Any, Callable, Iterator

from rlfactory_core import RLFactoryError, build_directory, rlfactory_home

from .sandbox import QueryLimits, read_schema, run_query
from . import generalisation
from .facts import Country, gold_sql, load_countries, perturbed, question_text, split_of, stable_int
from .sqltext import QueryError

__all__ = [
    "DB_ID",
    "SPLITS",
    "KINDS",
    "BUILDER_VERSION",
    "build",
    "default_data_dir",
    "database_file",
    "spider_tables_entry",
]

#: The built-in database's id.
DB_ID = "world"
#: The check database's id: the same schema and names, other facts (see the module docstring).
CHECK_DB_ID = "world_perturbed"
#: The splits of the built-in data and their files: the in-template ones, then those that test
#: beyond the templates (:mod:`rlfactory_nl2sql.generalisation`).
SPLITS = {"train": "train.json", "validation": "validation.json", "test": "test.json",
          "test_wordings": "test_wordings.json", "test_skeletons": "test_skeletons.json"}
#: Bumped whenever the output changes for the same sources, so older builds are rebuilt.
BUILDER_VERSION = 2

TABLES_FILE = "tables.json"
MANIFEST_FILE = "manifest.json"
DATABASE_FILE = f"database/{DB_ID}/{DB_ID}.sqlite"
CHECK_DATABASE_FILE = f"database/{CHECK_DB_ID}/{CHECK_DB_ID}.sqlite"
_DATA_FILES = (DATABASE_FILE, CHECK_DATABASE_FILE, TABLES_FILE) + tuple(SPLITS.values())
_SOURCES = ("countryinfo", "pycountry", "sqlglot")


SCHEMA_SQL = """
CREATE TABLE countries (
  code TEXT PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  region TEXT NOT NULL,
  subregion TEXT NOT NULL,
  population INTEGER,
  area REAL
);
CREATE TABLE capitals (
  country_code TEXT PRIMARY KEY REFERENCES countries(code),
  name TEXT NOT NULL,
  latitude REAL,
  longitude REAL
);
CREATE TABLE currencies (
  code TEXT PRIMARY KEY,
  name TEXT NOT NULL
);
CREATE TABLE country_currencies (
  country_code TEXT NOT NULL REFERENCES countries(code),
  currency_code TEXT NOT NULL REFERENCES currencies(code),
  PRIMARY KEY (country_code, currency_code)
);
CREATE TABLE languages (
  code TEXT PRIMARY KEY,
  name TEXT NOT NULL
);
CREATE TABLE country_languages (
  country_code TEXT NOT NULL REFERENCES countries(code),
  language_code TEXT NOT NULL REFERENCES languages(code),
  PRIMARY KEY (country_code, language_code)
);
CREATE TABLE borders (
  country_code TEXT NOT NULL REFERENCES countries(code),
  neighbour_code TEXT NOT NULL REFERENCES countries(code),
  PRIMARY KEY (country_code, neighbour_code)
);
"""

# Aliases used by the gold SQL of every template.
_CAPITAL_JOIN = "FROM countries AS c JOIN capitals AS cap ON cap.country_code = c.code"
_CURRENCY_JOIN = ("FROM countries AS c JOIN country_currencies AS cc ON cc.country_code = c.code "
                  "JOIN currencies AS cu ON cu.code = cc.currency_code")
_LANGUAGE_JOIN = ("FROM countries AS c JOIN country_languages AS cl ON cl.country_code = c.code "
                  "JOIN languages AS l ON l.code = cl.language_code")
_BORDER_JOIN = ("FROM countries AS c JOIN borders AS b ON b.country_code = c.code "
                "JOIN countries AS n ON n.code = b.neighbour_code")

#: Question kinds: (question template, gold SQL template). Slots: {country}, {capital},
#: {region}, {subregion}, {currency}, {language}, {threshold}; SQL slots hold literals.
KINDS: dict[str, tuple[str, str]] = {
    "capital": ("What is the capital of {country}?",
                f"SELECT cap.name {_CAPITAL_JOIN} WHERE c.name = {{country}}"),
    "country_of_capital": ("Which country has {capital} as its capital?",
                           f"SELECT c.name {_CAPITAL_JOIN} WHERE cap.name = {{capital}}"),
    "population": ("What is the population of {country}?",
                   "SELECT population FROM countries WHERE name = {country}"),
    "area": ("What is the area of {country} in square kilometres?",
             "SELECT area FROM countries WHERE name = {country}"),
    "region_of": ("In which region is {country}?",
                  "SELECT region FROM countries WHERE name = {country}"),
    "count_region": ("How many countries are in the {region} region?",
                     "SELECT COUNT(*) FROM countries WHERE region = {region}"),
    "count_subregion": ("How many countries are in {subregion}?",
                        "SELECT COUNT(*) FROM countries WHERE subregion = {subregion}"),
    "list_subregion": ("List the countries of {subregion}.",
                       "SELECT name FROM countries WHERE subregion = {subregion}"),
    "most_populous": ("Which country in {subregion} has the largest population?",
                      "SELECT name FROM countries WHERE subregion = {subregion} ORDER BY population DESC LIMIT 1"),
    "largest_three": ("Name the three largest countries of the {region} region by area, largest first.",
                      "SELECT name FROM countries WHERE region = {region} ORDER BY area DESC LIMIT 3"),
    "total_population": ("What is the total population of {subregion}?",
                         "SELECT SUM(population) FROM countries WHERE subregion = {subregion}"),
    "populous_over": ("Which countries in {subregion} have more than {threshold} people?",
                      "SELECT name FROM countries WHERE subregion = {subregion} AND population > {threshold}"),
    "currency": ("Which currency is used in {country}?",
                 f"SELECT cu.name {_CURRENCY_JOIN} WHERE c.name = {{country}}"),
    "currency_countries": ("Which countries use the {currency}?",
                           f"SELECT c.name {_CURRENCY_JOIN} WHERE cu.name = {{currency}}"),
    "count_currency": ("How many countries use the {currency}?",
                       "SELECT COUNT(*) FROM country_currencies AS cc JOIN currencies AS cu ON cu.code = "
                       "cc.currency_code WHERE cu.name = {currency}"),
    "languages": ("Which languages are spoken in {country}?",
                  f"SELECT l.name {_LANGUAGE_JOIN} WHERE c.name = {{country}}"),
    "language_countries": ("In which countries is {language} spoken?",
                           f"SELECT c.name {_LANGUAGE_JOIN} WHERE l.name = {{language}}"),
    "count_language": ("In how many countries is {language} spoken?",
                       "SELECT COUNT(*) FROM country_languages AS cl JOIN languages AS l ON l.code = "
                       "cl.language_code WHERE l.name = {language}"),
    "neighbours": ("Which countries border {country}?",
                   f"SELECT n.name {_BORDER_JOIN} WHERE c.name = {{country}}"),
    "count_neighbours": ("How many countries border {country}?",
                         "SELECT COUNT(*) FROM borders AS b JOIN countries AS c ON c.code = b.country_code "
                         "WHERE c.name = {country}"),
    "southern_capitals": ("Which capitals of the {region} region lie south of the equator?",
                          f"SELECT cap.name {_CAPITAL_JOIN} WHERE c.region = {{region}} AND cap.latitude < 0"),
}

# A currency or language shared by this many countries or fewer gets "which countries" questions.
_MAX_LISTED = 15
_THRESHOLDS = (1_000_000, 10_000_000, 50_000_000)

# The worked example of the prompt (rlfactory_nl2sql.env): not one of the templates above, so
# no split holds it (tests/test_data.py checks the result shown against the built database).
EXAMPLE_QUESTION = "What is the largest area of a country in the Europe region?"
EXAMPLE_SQL = "SELECT MAX(area) FROM countries WHERE region = 'Europe'"


# --------------------------------------------------------------------------- locations


def default_data_dir() -> Path:
    """Where the dataset is built by default: ``$RLFACTORY_HOME/data/nl2sql``."""
    return rlfactory_home() / "data" / "nl2sql"


def database_file(data_dir: Path) -> Path:
    """The ``world`` database of the build in ``data_dir``."""
    return Path(data_dir) / DATABASE_FILE


# --------------------------------------------------------------------------- database


def _write_database(path: Path, countries: list[Country]) -> None:
    """The ``world`` database at ``path``, rows inserted in a fixed order (same bytes every build)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA page_size = 4096")
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.executescript(SCHEMA_SQL)
        conn.executemany("INSERT INTO countries VALUES (?, ?, ?, ?, ?, ?)",
                         [(c.code, c.name, c.region, c.subregion, c.population, c.area) for c in countries])
        conn.executemany("INSERT INTO capitals VALUES (?, ?, ?, ?)",
                         [(c.code, c.capital, c.latitude, c.longitude) for c in countries if c.capital])
        currencies = sorted({cur for c in countries for cur in c.currencies})
        conn.executemany("INSERT INTO currencies VALUES (?, ?)", currencies)
        conn.executemany("INSERT INTO country_currencies VALUES (?, ?)",
                         [(c.code, code) for c in countries for code, _ in c.currencies])
        languages = sorted({lang for c in countries for lang in c.languages})
        conn.executemany("INSERT INTO languages VALUES (?, ?)", languages)
        conn.executemany("INSERT INTO country_languages VALUES (?, ?)",
                         [(c.code, code) for c in countries for code, _ in c.languages])
        # "A borders B" when either lists the other.
        pairs = sorted({p for c in countries for b in c.borders for p in ((c.code, b), (b, c.code))})
        conn.executemany("INSERT INTO borders VALUES (?, ?)", pairs)
        conn.commit()
        conn.execute("VACUUM")
    finally:
        conn.close()


def spider_tables_entry(db_path: str | os.PathLike[str], db_id: str) -> dict[str, Any]:
    """The Spider ``tables.json`` entry of a SQLite database (names as in the database, the
    readable names with underscores as spaces)."""
    tables = read_schema(db_path)
    column_names: list[list[Any]] = [[-1, "*"]]
    column_types = ["text"]
    primary_keys: list[int] = []
    index: dict[tuple[str, str], int] = {}
    for t_index, table in enumerate(tables):
        for column in table.columns:
            index[(table.name.lower(), column.name.lower())] = len(column_names)
            if column.primary_key:
                primary_keys.append(len(column_names))
            column_names.append([t_index, column.name])
            kind = column.type.lower()
            column_types.append("number" if kind in ("integer", "real", "int", "numeric", "float") else "text")
    foreign_keys = [[index[(t.name.lower(), col.lower())], index[(other.lower(), other_col.lower())]]
                    for t in tables for col, other, other_col in t.foreign_keys
                    if (other.lower(), other_col.lower()) in index]
    return {
        "db_id": db_id,
        "table_names_original": [t.name for t in tables],
        "table_names": [t.name.replace("_", " ") for t in tables],
        "column_names_original": column_names,
        "column_names": [[t, name.replace("_", " ")] for t, name in column_names],
        "column_types": column_types,
        "primary_keys": primary_keys,
        "foreign_keys": foreign_keys,
    }


# --------------------------------------------------------------------------- questions


def _candidates(countries: list[Country]) -> Iterator[tuple[str, str, dict[str, str]]]:
    """``(kind, key, slots)`` for every question the facts suggest, in a fixed order."""
    regions = sorted({c.region for c in countries})
    subregions = sorted({c.subregion for c in countries})
    currency_users: dict[str, int] = {}
    language_users: dict[str, int] = {}
    for c in countries:
        for _, name in c.currencies:
            currency_users[name] = currency_users.get(name, 0) + 1
        for _, name in c.languages:
            language_users[name] = language_users.get(name, 0) + 1
    for c in countries:
        country = {"country": c.name}
        if c.capital:
            yield "capital", c.code, country
            yield "country_of_capital", c.code, {"capital": c.capital}
        if c.population:
            yield "population", c.code, country
        if c.area:
            yield "area", c.code, country
        yield "region_of", c.code, country
        if c.currencies:
            yield "currency", c.code, country
        if c.languages:
            yield "languages", c.code, country
        if c.borders:
            yield "neighbours", c.code, country
            yield "count_neighbours", c.code, country
    for region in regions:
        yield "count_region", region, {"region": region}
        yield "largest_three", region, {"region": region}
        yield "southern_capitals", region, {"region": region}
    for subregion in subregions:
        slots = {"subregion": subregion}
        yield "count_subregion", subregion, slots
        yield "list_subregion", subregion, slots
        yield "most_populous", subregion, slots
        yield "total_population", subregion, slots
        threshold = _THRESHOLDS[stable_int("threshold", subregion) % len(_THRESHOLDS)]
        yield "populous_over", subregion, {"subregion": subregion, "threshold": str(threshold)}
    for currency in sorted(currency_users):
        if 2 <= currency_users[currency] <= _MAX_LISTED:
            yield "currency_countries", currency, {"currency": currency}
            yield "count_currency", currency, {"currency": currency}
    for language in sorted(language_users):
        if 2 <= language_users[language] <= _MAX_LISTED:
            yield "language_countries", language, {"language": language}
            yield "count_language", language, {"language": language}


# Top-k kinds: a query of the ordering value in the gold's order, and k (see _decided).
_TOP_K = {"most_populous": ("SELECT population FROM countries WHERE subregion = {subregion} "
                            "ORDER BY population DESC", 1),
          "largest_three": ("SELECT area FROM countries WHERE region = {region} ORDER BY area DESC", 3)}
_BUILD_LIMITS = QueryLimits(time_limit_s=30.0, max_rows=10_000, overflow="error")


def _decided(db_path: Path, values_template: str, k: int, slots: dict[str, str]) -> bool:
    """For a top-k question: whether its first k rows are known (no NULL) and the k-th value
    differs from the next (else the answer depends on how SQLite breaks a tie)."""
    rows = run_query(db_path, gold_sql(values_template, slots), _BUILD_LIMITS).rows[:k + 1]
    if len(rows) < k or any(v is None for row in rows[:k] for v in row):
        return False
    return len(rows) == k or rows[k - 1][0] != rows[k][0]


def _questions(db_paths: tuple[Path, Path], candidates: Iterator[tuple[str, str, dict[str, str]]],
               kinds: dict[str, tuple[str, str]], top_k: dict[str, tuple[str, int]],
               prefix: str = "nl2sql") -> list[tuple[dict[str, Any], dict[str, str]]]:
    """``(sample, slots)`` of every candidate whose gold SQL returns a non-empty answer on the
    real database (no NULL in its first row) and, for a top-k kind, is decided on both."""
    samples, seen = [], set()
    for kind, key, slots in candidates:
        template, sql_template = kinds[kind]
        question = question_text(template, slots)
        sql = gold_sql(sql_template, slots)
        try:
            result = run_query(db_paths[0], sql, _BUILD_LIMITS)
        except QueryError as exc:
            raise RLFactoryError(f"the gold SQL of a {kind} question failed: {exc} ({sql})",
                                 hint="a builder bug or an unexpected countryinfo update; report it") from None
        if not result.rows or result.rows[0][0] is None or question.lower() in seen:
            continue
        if kind in top_k and not all(_decided(path, *top_k[kind], slots) for path in db_paths):
            continue
        seen.add(question.lower())
        samples.append(({"id": f"{prefix}-{kind}-{stable_int('id', kind, key):016x}", "db_id": DB_ID,
                         "question": question, "query": sql, "kind": kind, "check_db_id": CHECK_DB_ID}, slots))
    return samples


def _skeleton_questions(db_paths: tuple[Path, Path], countries: list[Country]) -> list[dict[str, Any]]:
    """``test_skeletons``: at most PER_KIND questions of each kind, by a stable hash, none
    whose answer is a count of 0."""
    found = _questions(db_paths, generalisation.skeleton_candidates(countries), generalisation.SKELETON_KINDS,
                       generalisation.SKELETON_TOP_K, prefix="nl2sql-skeleton")
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for sample, _ in sorted(found, key=lambda pair: stable_int("pick", pair[0]["id"])):
        if sample["query"].startswith("SELECT COUNT(*)") and \
                run_query(db_paths[0], sample["query"], _BUILD_LIMITS).rows == [(0,)]:
            continue
        by_kind.setdefault(sample["kind"], []).append(sample)
    return [s for kind in generalisation.SKELETON_KINDS for s in by_kind.get(kind, [])[:generalisation.PER_KIND]]


def _reworded(questions: list[tuple[dict[str, Any], dict[str, str]]]) -> list[dict[str, Any]]:
    """``test_wordings``: the test split's questions in the other wording of their kind."""
    return [{**sample, "id": sample["id"].replace("nl2sql-", "nl2sql-wording-", 1),
             "question": question_text(generalisation.WORDINGS[sample["kind"]], slots)}
            for sample, slots in questions if split_of(sample["id"]) == "test"]


# --------------------------------------------------------------------------- build


def _source_versions() -> dict[str, str]:
    versions = {"sqlite": sqlite3.sqlite_version}
    for package in _SOURCES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            raise RLFactoryError(f"the nl2sql dataset is built with {package}, which is not installed",
                                 hint=f"pip install {package} (a dependency of rlfactory-plugin-nl2sql)") from None
    return versions


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _json(value: Any) -> bytes:
    return (json.dumps(value, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def _write_dataset(staged: Path, progress: Callable[[str], None]) -> None:
    """Every file of the dataset into ``staged``, the manifest last."""
    versions = _source_versions()
    progress(f"reading facts from countryinfo {versions['countryinfo']} and pycountry {versions['pycountry']}")
    countries = load_countries()
    db_paths = (staged / DATABASE_FILE, staged / CHECK_DATABASE_FILE)
    _write_database(db_paths[0], countries)
    _write_database(db_paths[1], perturbed(countries))
    progress(f"wrote {DATABASE_FILE} and its check copy {CHECK_DATABASE_FILE} ({len(countries)} countries)")
    questions = _questions(db_paths, _candidates(countries), KINDS, _TOP_K)
    splits: dict[str, list[dict[str, Any]]] = {split: [] for split in SPLITS}
    for sample, _ in questions:
        splits[split_of(sample["id"])].append(sample)
    splits["test_wordings"] = _reworded(questions)
    splits["test_skeletons"] = _skeleton_questions(db_paths, countries)
    (staged / TABLES_FILE).write_bytes(_json([spider_tables_entry(db_paths[0], DB_ID)]))
    counts: dict[str, Any] = {"countries": len(countries)}
    for split, rows in splits.items():
        rows.sort(key=lambda s: stable_int("order", s["id"]))
        (staged / SPLITS[split]).write_bytes(_json(rows))
        by_kind = {kind: sum(s["kind"] == kind for s in rows) for kind in dict.fromkeys(s["kind"] for s in rows)}
        differs = sum(_differs_on_check(db_paths, s["query"]) for s in rows)
        counts[split] = {"questions": len(rows), "by_kind": dict(sorted(by_kind.items())),
                         "answer_differs_on_check_db": differs}
        progress(f"wrote {SPLITS[split]} ({len(rows)} questions, {differs} with another answer on the check copy)")
    hashes = {name: _sha256((staged / name).read_bytes()) for name in _DATA_FILES}
    manifest = {
        "dataset": "nl2sql-world",
        "builder_version": BUILDER_VERSION,
        "sources": versions,
        "counts": counts,
        "files": hashes,
        "content_hash": _sha256("".join(f"{name}:{hashes[name]}\n" for name in _DATA_FILES).encode()),
    }
    (staged / MANIFEST_FILE).write_bytes(_json(manifest))


def _differs_on_check(db_paths: tuple[Path, Path], sql: str) -> bool:
    real, check = (sorted(map(repr, run_query(path, sql, _BUILD_LIMITS).rows)) for path in db_paths)
    return real != check


def is_complete(directory: Path) -> bool:
    """Whether ``directory`` holds an intact build of this builder from the installed sources."""
    try:
        manifest = json.loads((Path(directory) / MANIFEST_FILE).read_text(encoding="utf-8"))
        if manifest.get("builder_version") != BUILDER_VERSION or manifest.get("sources") != _source_versions():
            return False
        return all(_sha256((Path(directory) / name).read_bytes()) == manifest["files"][name] for name in _DATA_FILES)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def build(out_dir: str | os.PathLike[str] | None = None, force: bool = False,
          progress: Callable[[str], None] | None = None) -> Path:
    """Build the dataset (database, tables.json, three splits, manifest) into ``out_dir``.

    Does nothing when ``out_dir`` already holds an intact build from the same builder and
    source versions, unless ``force``. Atomic: see the module docstring.

    :param out_dir: target directory (default :func:`default_data_dir`); it may hold only a
        previous build, since a rebuild replaces the whole directory.
    :param force: rebuild even when a complete build is there.
    :param progress: called with one-line messages as the build goes.
    :return: the dataset's directory.
    """
    out = Path(out_dir).expanduser() if out_dir is not None else default_data_dir()
    report = progress or (lambda message: None)
    owned = {Path(name).parts[0] for name in _DATA_FILES} | {MANIFEST_FILE}
    return build_directory(out, label="the nl2sql dataset", owned=owned, is_complete=is_complete,
                           write=lambda staged: _write_dataset(staged, report), force=force, progress=report)
