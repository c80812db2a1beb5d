"""The read-only SQL sandbox: how the model's SQL (and the gold SQL) runs.

Every query runs on a fresh connection that can only read, in a worker process, under
several independent layers, so that no single mistake opens the database to the model:

1. **Text and statement gate** (:func:`rlfactory_nl2sql.sqltext.check_query`): first the
   cheap checks, before anything parses the text: at most ``MAX_SQL_BYTES`` (100 kB) of
   UTF-8, no character UTF-8 cannot encode (a lone surrogate), no NUL; then, with sqlglot's
   SQLite tokenizer, exactly one statement, starting with ``SELECT``, ``WITH`` or
   ``VALUES``. The statement rules exist for clear messages; the layers below enforce them
   on their own.
2. **Read-only connection**: the database is opened through a ``file:...?mode=ro`` URI,
   so SQLite itself opens the file read-only (no write, no journal file can reach it),
   and ``PRAGMA query_only=ON`` refuses every statement that would change it. A WAL-mode
   database is read without creating its ``-wal``/``-shm`` files and without missing the
   rows committed in its ``-wal`` (:mod:`rlfactory_nl2sql.dbfile`).
3. **Authorizer** (``Connection.set_authorizer``): a statement may only read tables
   (``SQLITE_SELECT``, ``SQLITE_READ``, ``SQLITE_RECURSIVE``) and call functions; every
   other action is denied: writes and DDL, ``ATTACH``/``DETACH`` (also ``VACUUM INTO``,
   which attaches its target), every ``PRAGMA`` (``query_only=OFF`` included),
   transactions and savepoints. The functions ``load_extension`` and ``fts3_tokenizer``
   are denied; extension loading is also never enabled on the connection.
4. **Limits**: a time limit, held twice: a progress handler, called every 1000
   virtual-machine instructions, interrupts the statement past its deadline (huge cross
   joins and recursive CTE bombs stop there, also while rows are fetched), and the worker
   process (:mod:`rlfactory_nl2sql.sqlworker`) is killed shortly after it, which stops what
   the handler cannot: one call of a built-in function that runs for minutes (``replace``,
   ``instr``, ``trim`` on megabytes). A row limit and a byte limit on what is fetched (rows
   are fetched in batches, never all at once); SQLite's own limit on the size of one value
   (``SQLITE_LIMIT_LENGTH``: ``zeroblob(1e9)`` fails at once; ``printf``/``format``, whose
   built-in version returns NULL past it after looping through the whole width, are
   replaced by one that refuses such an output before writing it), on the length of the
   SQL text, and on attached databases (0); and a memory limit on the worker process
   (``RLIMIT_AS``). Setting SQLite's limits needs ``Connection.setlimit`` (Python 3.11+): on
   an older Python the sandbox refuses to open (:func:`require_sandbox`) rather than run
   without them.

The source database is never modified (the tests check it byte for byte after hostile
SQL). Each failure is a :class:`~rlfactory_nl2sql.sqltext.QueryError` whose ``kind`` is
one of :data:`ERROR_KINDS` and whose message is one line, written for the model.

Reading the schema (:func:`read_schema`) uses the same read-only connection in this process,
without the authorizer: it runs only this module's own statements.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from rlfactory_core import RLFactoryError

from . import sqlworker
from .dbfile import database_uri
from .engine import QueryLimits, QueryResult, connect
from .sqltext import MAX_SQL_BYTES, QueryError, check_query, quote_identifier

__all__ = [
    "ERROR_KINDS",
    "MAX_SQL_BYTES",
    "QueryError",
    "SandboxUnavailableError",
    "require_sandbox",
    "QueryLimits",
    "QueryResult",
    "Column",
    "Table",
    "run_query",
    "read_schema",
    "format_table",
    "format_value",
    "schema_text",
    "find_table",
    "table_rows_sql",
]

#: The kinds of :class:`QueryError`: the query was empty; held several statements; was not a
#: query; asked for something the sandbox refuses (a write, ATTACH, PRAGMA, a denied
#: function); ran past the time limit; returned more rows or bytes than allowed (for callers
#: that ask for an error rather than a truncated result); failed in SQLite (syntax, unknown
#: table or column ...); or had no database file to run on.
ERROR_KINDS = ("empty", "multiple_statements", "not_a_query", "refused", "timeout", "too_many_rows", "too_large",
               "sql_error", "no_database")


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    primary_key: bool = False


@dataclass(frozen=True)
class Table:
    """One table of a database: its columns, ``CREATE`` statement and foreign keys
    (``(column, other table, other column)``)."""

    name: str
    columns: tuple[Column, ...]
    sql: str
    foreign_keys: tuple[tuple[str, str, str], ...] = field(default=())


# --------------------------------------------------------------------------- connections

# Connection.setlimit came with Python 3.11; without it SQLite's own limits (one value's
# size, the SQL text, attached databases) cannot be set, and the sandbox does not run.
_HAS_SETLIMIT = hasattr(sqlite3.Connection, "setlimit")


class SandboxUnavailableError(RLFactoryError):
    """The SQL sandbox cannot enforce its limits on this Python."""


def require_sandbox() -> None:
    """Raise :class:`SandboxUnavailableError` where the sandbox cannot run: on Python
    3.10, whose ``sqlite3`` cannot set SQLite's limits. The env and the reward call it when
    they are built, so that a run stops at startup; every connection checks it too."""
    if not _HAS_SETLIMIT:
        version = ".".join(map(str, sys.version_info[:2]))
        raise SandboxUnavailableError(
            f"the nl2sql SQL sandbox needs Python 3.11 or newer: Python {version}'s sqlite3 has no "
            "Connection.setlimit, so the limits on one value's size, the SQL text and attached databases cannot "
            "be set", hint="run RLFactory on Python 3.11+ to use the nl2sql env and the sql_execution reward")


def _database(db_path: str | os.PathLike[str]) -> tuple[Path, str, str]:
    """``(path, uri, version)`` of the database file (see :func:`~rlfactory_nl2sql.dbfile.database_uri`)."""
    require_sandbox()
    path = Path(db_path)
    try:
        if path.is_file():
            return (path, *database_uri(path))
    except OSError as exc:
        raise QueryError("no_database", f"the database {path} cannot be read: {exc}") from None
    raise QueryError("no_database", f"there is no database file at {path}")


def _open(db_path: str | os.PathLike[str], limits: QueryLimits) -> sqlite3.Connection:
    """A read-only connection to ``db_path`` (``mode=ro`` URI, ``query_only``, limits), in
    this process: for the sandbox's own statements, which need no worker."""
    path, uri, _ = _database(db_path)
    return connect(uri, limits, str(path))


# --------------------------------------------------------------------------- queries


def run_query(db_path: str | os.PathLike[str], sql: str, limits: QueryLimits = QueryLimits()) -> QueryResult:
    """Run the query ``sql`` on the database file ``db_path`` in the sandbox (see the
    module docstring); raises :class:`~rlfactory_nl2sql.sqltext.QueryError`. Blocking:
    call it from a worker thread in async code."""
    statement = check_query(sql)  # cheap checks on the text first, then the statement gate
    path, uri, _ = _database(db_path)
    return sqlworker.run(uri, statement, limits, str(path))


# --------------------------------------------------------------------------- schema

_SCHEMA_CACHE: OrderedDict[str, tuple[Table, ...]] = OrderedDict()
_SCHEMA_LOCK = threading.Lock()
_SCHEMA_CACHE_SIZE = 256


def read_schema(db_path: str | os.PathLike[str]) -> tuple[Table, ...]:
    """The user tables of the database (``sqlite_*`` tables aside), in file order; cached
    by path, size and modification time (of the ``-wal`` file too, for a WAL-mode
    database). Raises ``QueryError(kind="no_database")``."""
    path, uri, key = _database(db_path)
    with _SCHEMA_LOCK:
        if key in _SCHEMA_CACHE:
            _SCHEMA_CACHE.move_to_end(key)
            return _SCHEMA_CACHE[key]
    conn = connect(uri, QueryLimits(time_limit_s=10.0), str(path))
    try:
        tables = []
        listed = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' "
                              "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY rowid").fetchall()
        for name, sql in listed:
            columns = tuple(Column(name=row[1], type=(row[2] or "").upper(), primary_key=bool(row[5]))
                            for row in conn.execute("SELECT * FROM pragma_table_info(?)", (name,)))
            keys = tuple((row[3], row[2], row[4] or "") for row in
                         conn.execute("SELECT * FROM pragma_foreign_key_list(?)", (name,)))
            tables.append(Table(name=name, columns=columns, sql=" ".join((sql or "").split()), foreign_keys=keys))
    except sqlite3.Error as exc:
        raise QueryError("no_database", f"the database {path} cannot be read: {exc}") from None
    finally:
        conn.close()
    result = tuple(tables)
    with _SCHEMA_LOCK:
        _SCHEMA_CACHE[key] = result
        while len(_SCHEMA_CACHE) > _SCHEMA_CACHE_SIZE:
            _SCHEMA_CACHE.popitem(last=False)
    return result


def schema_text(tables: Sequence[Table]) -> str:
    """The compact schema shown in prompts and by ``list_tables``: one line per table,
    ``name(col1, col2, ...)``."""
    return "\n".join(f"{t.name}({', '.join(c.name for c in t.columns)})" for t in tables)


def find_table(tables: Sequence[Table], name: str) -> Table | None:
    """The table named ``name`` (SQLite names are case-insensitive), or None."""
    wanted = name.strip().strip('"`[]').lower()
    return next((t for t in tables if t.name.lower() == wanted), None)


def table_rows_sql(table: Table, limit: int) -> str:
    """The query ``describe_table`` shows a table's first rows with."""
    return f"SELECT * FROM {quote_identifier(table.name)} LIMIT {int(limit)}"


# --------------------------------------------------------------------------- display


def format_value(value: Any, max_chars: int = 40) -> str:
    """One cell as the model sees it: NULL, numbers without noise, text on one line and cut."""
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        return f"<blob, {len(value)} bytes>"
    if isinstance(value, float):
        text = str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.10g}"
    else:
        text = " ".join(str(value).split()) if isinstance(value, str) else str(value)
    return text if len(text) <= max_chars else text[: max(max_chars - 1, 1)] + "…"


def format_table(result: QueryResult, max_cell_chars: int = 40) -> str:
    """The result as a compact text table: a header line, one line per row (cells joined by
    `` | ``), and a last line with the row count (saying when rows were left out)."""
    lines = [" | ".join(format_value(c, max_cell_chars) for c in result.columns)]
    lines += [" | ".join(format_value(v, max_cell_chars) for v in row) for row in result.rows]
    n = len(result.rows)
    if result.truncated:
        lines.append(f"({n} row{'s' if n != 1 else ''} shown; the result has more)")
    else:
        lines.append(f"({n} row{'s' if n != 1 else ''})")
    return "\n".join(lines)
