"""The built-in nl2sql dataset: a SQLite database of countries and questions with gold SQL.

Built offline in about a second from facts shipped on PyPI (``rlf data build nl2sql``, or on
first use) into ``$RLFACTORY_HOME/data/nl2sql``, in the **Spider format**, so the same loader
reads it and Spider's own files::

    tables.json                       Spider schema entry of the database
    train.json, validation.json, test.json
                                      JSON arrays of {"id", "db_id", "question", "query", "kind"}
    database/world/world.sqlite
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from rlfactory_core import RLFactoryError, build_directory, rlfactory_home

from .sandbox import QueryLimits, read_schema, run_query
from .sqltext import QueryError, normalise_sql, sql_string

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
#: The splits of the built-in data and their files.
SPLITS = {"train": "train.json", "validation": "validation.json", "test": "test.json"}
#: Bumped whenever the output changes for the same sources, so older builds are rebuilt.
BUILDER_VERSION = 1

TABLES_FILE = "tables.json"
MANIFEST_FILE = "manifest.json"
DATABASE_FILE = f"database/{DB_ID}/{DB_ID}.sqlite"
_DATA_FILES = (DATABASE_FILE, TABLES_FILE) + tuple(SPLITS.values())
_SOURCES = ("countryinfo", "pycountry", "sqlglot")

_REGIONS = ("Africa", "Americas", "Asia", "Europe", "Oceania")
# ISO 4217 fund codes: accounting units countryinfo lists beside the money people use.
_FUND_CURRENCIES = frozenset({"BOV", "CHE", "CHW", "CLF", "COU", "MXV", "USN", "USS", "UYI", "UYW",
                              "XDR", "XSU", "XUA"})

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


# --------------------------------------------------------------------------- facts


@dataclass
class _Country:
    code: str
    name: str
    region: str
    subregion: str
    population: int | None
    area: float | None
    capital: str | None
    latitude: float | None
    longitude: float | None
    currencies: list[tuple[str, str]]  # (code, name)
    languages: list[tuple[str, str]]
    borders: list[str]

    def fact_count(self) -> int:
        return sum(bool(x) for x in (self.population, self.area, self.capital, self.currencies, self.languages,
                                     self.borders))


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value > 0 else None


def _currency(code: Any) -> tuple[str, str] | None:
    import pycountry

    if not isinstance(code, str) or code in _FUND_CURRENCIES:
        return None
    currency = pycountry.currencies.get(alpha_3=code)  # absent: withdrawn (HRK, VEF ...)
    return (currency.alpha_3, currency.name) if currency else None


def _language(code: Any) -> tuple[str, str] | None:
    import pycountry

    if not isinstance(code, str) or len(code) not in (2, 3) or not code.islower():
        return None
    language = pycountry.languages.get(**{"alpha_2" if len(code) == 2 else "alpha_3": code})
    if language is None:
        return None
    return code, language.name.split(" (")[0].strip()  # "Malay (macrolanguage)" -> "Malay"


def _parse(raw: dict[str, Any]) -> _Country | None:
    import pycountry

    name = _text(raw.get("name"))
    iso = raw.get("ISO") if isinstance(raw.get("ISO"), dict) else {}
    code = _text(iso.get("alpha3"))
    region, subregion = _text(raw.get("region")), _text(raw.get("subregion"))
    if not name or not code or region not in _REGIONS or not subregion:
        return None
    if pycountry.countries.get(alpha_3=code) is None:  # withdrawn codes, non-countries
        return None
    capital = _text(raw.get("capital"))
    if capital and "/" in capital:  # "Kralendijk / Oranjestad / The Bottom": several
        capital = None
    latlng = raw.get("capital_latlng")
    latitude = longitude = None
    if capital and isinstance(latlng, list) and len(latlng) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in latlng):
        latitude, longitude = round(float(latlng[0]), 4), round(float(latlng[1]), 4)
    population = _positive(raw.get("population"))
    country = _Country(
        code=code, name=name, region=region, subregion=subregion,
        population=int(population) if population else None, area=_positive(raw.get("area")),
        capital=capital, latitude=latitude, longitude=longitude,
        currencies=list(dict.fromkeys(c for c in map(_currency, raw.get("currencies") or []) if c)),
        languages=list(dict.fromkeys(lang for lang in map(_language, raw.get("languages") or []) if lang)),
        borders=list(dict.fromkeys(c for c in raw.get("borders") or []
                                   if isinstance(c, str) and len(c) == 3 and c.isupper())),
    )
    return country if country.fact_count() >= 2 else None


def _load_countries() -> list[_Country]:
    """Every usable country, one per ISO code and one per name, sorted by code."""
    from countryinfo import CountryInfo

    everything = CountryInfo.all()
    by_code: dict[str, list[_Country]] = {}
    for key in sorted(everything):
        country = _parse(everything[key])
        if country is not None:
            by_code.setdefault(country.code, []).append(country)
    countries, names = [], set()
    for code in sorted(by_code):
        # Two entries for one code (Burma and Myanmar): the one with the most facts.
        best = sorted(by_code[code], key=lambda c: (-c.fact_count(), c.name))[0]
        if best.name.lower() not in names:
            names.add(best.name.lower())
            countries.append(best)
    known = {c.code for c in countries}
    for country in countries:
        country.borders = [b for b in country.borders if b in known and b != country.code]
    return countries


# --------------------------------------------------------------------------- database


def _write_database(path: Path, countries: list[_Country]) -> None:
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


def _stable_int(*parts: str) -> int:
    """A hash that is the same on every machine and Python version (``hash()`` is salted)."""
    return int.from_bytes(hashlib.sha256("\x1f".join(parts).encode()).digest()[:8], "big")


def _split_of(sample_id: str) -> str:
    bucket = _stable_int("split", sample_id) % 10
    return "train" if bucket < 7 else "validation" if bucket < 8 else "test"


def _candidates(countries: list[_Country]) -> Iterator[tuple[str, str, dict[str, str]]]:
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
        threshold = _THRESHOLDS[_stable_int("threshold", subregion) % len(_THRESHOLDS)]
        yield "populous_over", subregion, {"subregion": subregion, "threshold": str(threshold)}
    for currency in sorted(currency_users):
        if 2 <= currency_users[currency] <= _MAX_LISTED:
            yield "currency_countries", currency, {"currency": currency}
            yield "count_currency", currency, {"currency": currency}
    for language in sorted(language_users):
        if 2 <= language_users[language] <= _MAX_LISTED:
            yield "language_countries", language, {"language": language}
            yield "count_language", language, {"language": language}


def _question_text(template: str, slots: dict[str, str]) -> str:
    shown = dict(slots)
    if "threshold" in shown:
        shown["threshold"] = f"{int(shown['threshold']):,}"
    return template.format(**shown)


def _gold_sql(template: str, slots: dict[str, str]) -> str:
    literals = {k: (v if k == "threshold" else sql_string(v)) for k, v in slots.items()}
    return normalise_sql(template.format(**literals))


# Top-k kinds: the column they order by and k.
_TOP_K = {"most_populous": ("population", 1), "largest_three": ("area", 3)}


def _decided_without_ties(db_path: Path, kind: str, sql: str) -> bool:
    """For a top-k question: whether its k values are known and the k-th differs from the
    next (else the answer depends on how SQLite breaks a tie)."""
    if kind not in _TOP_K:
        return True
    column, k = _TOP_K[kind]
    head, tail = "SELECT name ", f" LIMIT {k}"
    assert sql.startswith(head) and sql.endswith(tail), sql
    values_sql = f"SELECT {column} {sql[len(head):-len(tail)]} LIMIT {k + 1}"
    values = [row[0] for row in run_query(db_path, values_sql, _BUILD_LIMITS).rows]
    if len(values) < k or any(v is None for v in values[:k]):
        return False
    return len(values) == k or values[k - 1] != values[k]


_BUILD_LIMITS = QueryLimits(time_limit_s=30.0, max_rows=10_000, overflow="error")


def _questions(db_path: Path, countries: list[_Country]) -> list[dict[str, Any]]:
    """Every question whose gold SQL runs and returns a non-empty, decided answer."""
    samples, seen = [], set()
    for kind, key, slots in _candidates(countries):
        template, sql_template = KINDS[kind]
        question = _question_text(template, slots)
        sql = _gold_sql(sql_template, slots)
        try:
            result = run_query(db_path, sql, _BUILD_LIMITS)
        except QueryError as exc:
            raise RLFactoryError(f"the gold SQL of a {kind} question failed: {exc} ({sql})",
                                 hint="a builder bug or an unexpected countryinfo update; report it") from None
        if not result.rows or result.rows[0][0] is None or question.lower() in seen:
            continue
        if not _decided_without_ties(db_path, kind, sql):
            continue
        seen.add(question.lower())
        samples.append({"id": f"nl2sql-{kind}-{_stable_int('id', kind, key):016x}", "db_id": DB_ID,
                        "question": question, "query": sql, "kind": kind})
    return samples


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
    countries = _load_countries()
    db_path = staged / DATABASE_FILE
    _write_database(db_path, countries)
    progress(f"wrote {DATABASE_FILE} ({len(countries)} countries)")
    samples = _questions(db_path, countries)
    splits: dict[str, list[dict[str, Any]]] = {split: [] for split in SPLITS}
    for sample in samples:
        splits[_split_of(sample["id"])].append(sample)
    (staged / TABLES_FILE).write_bytes(_json([spider_tables_entry(db_path, DB_ID)]))
    counts: dict[str, Any] = {"countries": len(countries)}
    for split, rows in splits.items():
        rows.sort(key=lambda s: _stable_int("order", s["id"]))
        (staged / SPLITS[split]).write_bytes(_json(rows))
        by_kind = {kind: sum(s["kind"] == kind for s in rows) for kind in KINDS}
        counts[split] = {"questions": len(rows), "by_kind": by_kind}
        progress(f"wrote {SPLITS[split]} ({len(rows)} questions)")
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
