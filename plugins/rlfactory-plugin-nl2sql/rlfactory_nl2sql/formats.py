"""Loaders for the Spider and BIRD dataset formats.

**Spider** (Yu et al. 2018), as released::

    spider/
      tables.json                     one entry per database: db_id, table_names_original, column_names_original, ...
      train_spider.json, dev.json     JSON arrays of rows {"db_id", "question", "query", ...}
      database/<db_id>/<db_id>.sqlite

**BIRD** (Li et al. 2023), as released (``dev/`` and ``train/`` each like this)::

    dev/
      dev.json                        JSON array of rows {"question_id", "db_id", "question", "evidence", "SQL",
                                      "difficulty"}
      dev_tables.json                 Spider-style schema entries
      dev_databases/<db_id>/<db_id>.sqlite

Both become the same samples::

    {"id", "db_id", "question", "query", "answer", "evidence", "db_path", "source", ...}

``query`` is the gold SQL (BIRD's ``SQL``), ``answer`` repeats it (so run samples show it as
the expected answer), ``evidence`` is BIRD's hint ("" for Spider), ``db_path`` the database
file. A row's id is its ``id`` when it has one (the built-in data), else
``<source>-<file stem>-<question_id>`` (BIRD) or ``<source>-<file stem>-<row number>``.
A row's ``difficulty`` (BIRD) or ``kind`` (the built-in data) is kept.

Every problem is reported at once as a :class:`~rlfactory_core.errors.ConfigError`, one
line each naming the file, the row and what to fix: a file that is not a JSON array, a row
without a question or gold SQL, a ``db_id`` with no database file (the message says where
it looked and which databases exist).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

from rlfactory_core import ConfigError

__all__ = [
    "FORMATS",
    "read_json_rows",
    "load_tables_json",
    "load_spider",
    "load_bird",
    "load_rows",
    "database_path",
    "known_databases",
    "database_dirs_for",
]

#: The dataset formats and the key of their gold SQL.
FORMATS = {"spider": "query", "bird": "SQL"}
_MAX_PROBLEMS = 5  # listed in one error; the rest are counted


def read_json_rows(path: str | os.PathLike[str]) -> list[Any]:
    """The JSON array in ``path``; :class:`ConfigError` when it cannot be read or is not one."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"{path}: no such file"], hint="check the data directory and the split file names") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{path}: cannot be read ({exc})"]) from None
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError([f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"],
                          hint="Spider and BIRD files hold one JSON array of rows") from None
    if not isinstance(rows, list):
        raise ConfigError([f"{path}: must hold a JSON array of rows, got a JSON {type(rows).__name__}"],
                          hint="Spider and BIRD files hold one JSON array of rows") from None
    return rows


def load_tables_json(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Spider's ``tables.json`` (BIRD's ``dev_tables.json``) by ``db_id``. Each entry must
    be an object with a string ``db_id`` and a list ``table_names_original``."""
    problems = []
    tables: dict[str, dict[str, Any]] = {}
    for index, entry in enumerate(read_json_rows(path)):
        if not isinstance(entry, dict):
            problems.append(f"{path} entry {index}: must be an object, got {type(entry).__name__}")
        elif not isinstance(entry.get("db_id"), str) or not entry["db_id"]:
            problems.append(f"{path} entry {index}: needs a string 'db_id'")
        elif not isinstance(entry.get("table_names_original"), list):
            problems.append(f"{path} entry {index} ({entry['db_id']}): needs a list 'table_names_original'")
        else:
            tables[entry["db_id"]] = entry
    _raise(problems, hint="tables.json is a JSON array of Spider schema entries")
    return tables


def database_path(db_dirs: Sequence[Path], db_id: str) -> Path | None:
    """``<dir>/<db_id>/<db_id>.sqlite`` in the first of ``db_dirs`` that has it, or None."""
    if not db_id or "/" in db_id or "\\" in db_id or db_id in (".", ".."):
        return None
    for directory in db_dirs:
        candidate = Path(directory) / db_id / f"{db_id}.sqlite"
        if candidate.is_file():
            return candidate
    return None


def known_databases(db_dirs: Sequence[Path]) -> list[str]:
    """The db_ids that have a database file in ``db_dirs``, sorted."""
    found = set()
    for directory in db_dirs:
        directory = Path(directory)
        if directory.is_dir():
            found.update(p.name for p in directory.iterdir() if (p / f"{p.name}.sqlite").is_file())
    return sorted(found)


def database_dirs_for(split_file: Path, fmt: str, db_dir: Path | None = None) -> list[Path]:
    """Where the databases of ``split_file`` are looked for: ``db_dir`` when given; else,
    beside the file, ``database/`` (Spider) or ``<stem>_databases/``, ``dev_databases/``
    and ``train_databases/`` (BIRD: ``dev.json`` -> ``dev_databases``)."""
    if db_dir is not None:
        return [Path(db_dir)]
    base = Path(split_file).parent
    if fmt == "bird":
        stem = Path(split_file).stem
        return list(dict.fromkeys([base / f"{stem}_databases", base / "dev_databases", base / "train_databases"]))
    return [base / "database"]


def _shown_list(names: Iterable[str], limit: int = 8) -> str:
    names = list(names)
    shown = ", ".join(names[:limit]) + (f" ... ({len(names)} in all)" if len(names) > limit else "")
    return shown or "none"


def _raise(problems: list[str], hint: str | None = None) -> None:
    if not problems:
        return
    shown = problems[:_MAX_PROBLEMS]
    if len(problems) > _MAX_PROBLEMS:
        shown.append(f"and {len(problems) - _MAX_PROBLEMS} more problems")
    raise ConfigError(shown, hint=hint)


def load_rows(path: str | os.PathLike[str], fmt: str, db_dirs: Sequence[Path],
              tables: dict[str, dict[str, Any]] | None = None, source: str | None = None) -> list[dict[str, Any]]:
    """The samples of the Spider- or BIRD-format file ``path`` (``fmt``: ``spider`` or
    ``bird``), with the database of each row found in ``db_dirs``. With ``tables`` (from
    ``tables.json``) a db_id must also be listed there. Every problem is reported at once."""
    if fmt not in FORMATS:
        raise ConfigError([f"unknown dataset format {fmt!r}"], hint=f"use one of: {', '.join(FORMATS)}")
    path = Path(path)
    gold_key = FORMATS[fmt]
    source = source or fmt
    problems: list[str] = []
    samples: list[dict[str, Any]] = []
    found: dict[str, Path | None] = {}
    for index, row in enumerate(read_json_rows(path)):
        where = f"{path} row {index}"
        if not isinstance(row, dict):
            problems.append(f"{where}: must be a JSON object, got {type(row).__name__}")
            continue
        missing = [key for key in ("db_id", "question", gold_key)
                   if not isinstance(row.get(key), str) or not row[key].strip()]
        if missing:
            keys = ", ".join(repr(k) for k in missing)
            problems.append(f"{where}: needs {keys} as non-empty text (a {fmt} row has db_id, question and {gold_key})")
            continue
        evidence = row.get("evidence", "")
        if evidence is None:
            evidence = ""
        if not isinstance(evidence, str):
            problems.append(f"{where}: 'evidence' must be text, got {type(evidence).__name__}")
            continue
        db_id = row["db_id"].strip()
        if db_id not in found:
            found[db_id] = database_path(db_dirs, db_id)
        if tables is not None and db_id not in tables:
            problems.append(f"{where}: db_id {db_id!r} is not in tables.json (its databases: "
                            f"{_shown_list(sorted(tables))})")
            continue
        if found[db_id] is None:
            dirs = " or ".join(str(d) for d in db_dirs)
            problems.append(f"{where}: unknown db_id {db_id!r}: no {db_id}/{db_id}.sqlite in {dirs} "
                            f"(databases there: {_shown_list(known_databases(db_dirs))})")
            continue
        if isinstance(row.get("id"), str) and row["id"]:
            sample_id = row["id"]  # the built-in data names its rows
        else:
            number = row.get("question_id")
            sample_id = f"{source}-{path.stem}-{number if isinstance(number, (int, str)) else index}"
        sample = {
            "id": sample_id,
            "db_id": db_id,
            "question": row["question"].strip(),
            "query": row[gold_key].strip(),
            "answer": row[gold_key].strip(),
            "evidence": evidence.strip(),
            "db_path": str(found[db_id]),
            "source": source,
        }
        for key in ("difficulty", "kind"):
            if isinstance(row.get(key), str):
                sample[key] = row[key]
        check = row.get("check_db_id")
        if check is not None:  # a second database the query must also be right on (the reward's)
            if not isinstance(check, str) or not check.strip():
                problems.append(f"{where}: 'check_db_id' must name a database, got {check!r}")
                continue
            if check.strip() not in found:
                found[check.strip()] = database_path(db_dirs, check.strip())
            if found[check.strip()] is None:
                dirs = " or ".join(str(d) for d in db_dirs)
                problems.append(f"{where}: unknown check_db_id {check.strip()!r}: no {check.strip()}/"
                                f"{check.strip()}.sqlite in {dirs}")
                continue
            sample["check_db_path"] = str(found[check.strip()])
        samples.append(sample)
    _raise(problems, hint=f"fix or remove these rows of {path.name}; a db_id is looked up as "
                          "<db_dir>/<db_id>/<db_id>.sqlite")
    return samples


def load_spider(path: str | os.PathLike[str], db_dir: str | os.PathLike[str] | None = None,
                tables_json: str | os.PathLike[str] | None = None, source: str = "spider") -> list[dict[str, Any]]:
    """The samples of a Spider file (``train_spider.json``, ``dev.json``): databases in
    ``db_dir`` (default ``database/`` beside the file); db_ids checked against
    ``tables_json`` (default ``tables.json`` beside the file, when it exists)."""
    path = Path(path)
    tables_path = Path(tables_json) if tables_json is not None else path.parent / "tables.json"
    tables = load_tables_json(tables_path) if tables_json is not None or tables_path.is_file() else None
    dirs = database_dirs_for(path, "spider", Path(db_dir) if db_dir is not None else None)
    return load_rows(path, "spider", dirs, tables, source=source)


def load_bird(path: str | os.PathLike[str], db_dir: str | os.PathLike[str] | None = None,
              tables_json: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """The samples of a BIRD file (``dev.json``, ``train.json``): databases in ``db_dir``
    (default ``<stem>_databases/`` beside the file, e.g. ``dev_databases/``); db_ids checked
    against ``tables_json`` when given (BIRD ships ``dev_tables.json``)."""
    path = Path(path)
    tables = load_tables_json(tables_json) if tables_json is not None else None
    dirs = database_dirs_for(path, "bird", Path(db_dir) if db_dir is not None else None)
    return load_rows(path, "bird", dirs, tables)
