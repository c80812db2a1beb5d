"""The read-only SQL sandbox: how the model's SQL (and the gold SQL) runs.

Every query runs on a fresh connection that can only read, under several independent
layers, so that no single mistake opens the database to the model:

1. **Statement gate** (:func:`rlfactory_nl2sql.sqltext.check_query`, sqlglot's SQLite
   tokenizer): exactly one statement, starting with ``SELECT``, ``WITH`` or ``VALUES``.
   It exists for clear messages; the layers below enforce the rules on their own.
2. **Read-only connection**: the database is opened through a ``file:...?mode=ro`` URI,
   so SQLite itself opens the file read-only (no write, no journal file can reach it),
   and ``PRAGMA query_only=ON`` refuses every statement that would change it.
3. **Authorizer** (``Connection.set_authorizer``): a statement may only read tables
   (``SQLITE_SELECT``, ``SQLITE_READ``, ``SQLITE_RECURSIVE``) and call functions; every
   other action is denied: writes and DDL, ``ATTACH``/``DETACH`` (also ``VACUUM INTO``,
   which attaches its target), every ``PRAGMA`` (``query_only=OFF`` included),
   transactions and savepoints. The functions ``load_extension`` and ``fts3_tokenizer``
   are denied; extension loading is also never enabled on the connection.
4. **Limits**: a time limit (a progress handler, called every 1000 virtual-machine
   instructions, interrupts the statement past its deadline: huge cross joins and
   recursive CTE bombs stop there, also while rows are fetched), a row limit and a byte
   limit on what is fetched (rows are fetched in batches, never all at once), SQLite's
   own limit on the size of one value (``SQLITE_LIMIT_LENGTH``: ``zeroblob(1e9)`` fails
   at once), on the length of the SQL text, and on attached databases (0). Setting them
   needs ``Connection.setlimit`` (Python 3.11+): on an older Python the sandbox refuses
   to open (:func:`require_sandbox`) rather than run without them.

The source database is never modified (the tests check it byte for byte after hostile
SQL). Each failure is a :class:`~rlfactory_nl2sql.sqltext.QueryError` whose ``kind`` is
one of :data:`ERROR_KINDS` and whose message is one line, written for the model.

Reading the schema (:func:`read_schema`) uses the same read-only connection without the
authorizer: it runs only this module's own statements.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

from rlfactory_core.errors import RLFactoryError

from .sqltext import QueryError, check_query, quote_identifier

__all__ = [
    "ERROR_KINDS",
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

#: Longest SQL text accepted, in bytes (SQLITE_LIMIT_SQL_LENGTH).
MAX_SQL_BYTES = 100_000
_PROGRESS_EVERY = 1000  # virtual-machine instructions between two time checks
_FETCH_BATCH = 256
_DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"})
_READ_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, getattr(sqlite3, "SQLITE_RECURSIVE", 33)})
# Authorizer action codes by name (the module also exports result codes with the same values).
_AUTHORIZER_ACTIONS = (
    "CREATE_INDEX", "CREATE_TABLE", "CREATE_TEMP_INDEX", "CREATE_TEMP_TABLE", "CREATE_TEMP_TRIGGER",
    "CREATE_TEMP_VIEW", "CREATE_TRIGGER", "CREATE_VIEW", "DELETE", "DROP_INDEX", "DROP_TABLE", "DROP_TEMP_INDEX",
    "DROP_TEMP_TABLE", "DROP_TEMP_TRIGGER", "DROP_TEMP_VIEW", "DROP_TRIGGER", "DROP_VIEW", "INSERT", "PRAGMA",
    "READ", "SELECT", "TRANSACTION", "UPDATE", "ATTACH", "DETACH", "ALTER_TABLE", "REINDEX", "ANALYZE",
    "CREATE_VTABLE", "DROP_VTABLE", "FUNCTION", "SAVEPOINT", "RECURSIVE",
)
_ACTION_NAMES = {getattr(sqlite3, f"SQLITE_{name}"): name.replace("_", " ")
                 for name in _AUTHORIZER_ACTIONS if hasattr(sqlite3, f"SQLITE_{name}")}
_WRITES = ("INSERT", "UPDATE", "DELETE", "CREATE", "DROP", "ALTER", "REINDEX", "ANALYZE")


@dataclass(frozen=True)
class QueryLimits:
    """What one query may use.

    :param time_limit_s: wall-clock seconds for preparing, running and fetching.
    :param max_rows: rows fetched at most.
    :param max_bytes: bytes of all fetched values at most (text and blobs by length,
        numbers 8).
    :param max_value_bytes: the longest string or blob SQLite may build
        (``SQLITE_LIMIT_LENGTH``).
    :param overflow: what a result beyond ``max_rows`` / ``max_bytes`` gives: ``truncate``
        (the rows up to the limit, ``truncated=True``: what the model's tool shows) or
        ``error`` (a ``too_many_rows`` / ``too_large`` error: what the reward compares).
    """

    time_limit_s: float = 2.0
    max_rows: int = 1000
    max_bytes: int = 4_000_000
    max_value_bytes: int = 10_000_000
    overflow: Literal["truncate", "error"] = "truncate"


@dataclass
class QueryResult:
    """A query's columns and rows (each a tuple); ``truncated``: more rows (or bytes) than
    the limits allowed exist and were not fetched."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool = False
    elapsed_s: float = 0.0


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


def _decode_text(data: bytes) -> str:
    # Spider/BIRD databases hold some text that is not UTF-8: show it, do not fail the query.
    return data.decode("utf-8", "replace")


def _open(db_path: str | os.PathLike[str], limits: QueryLimits) -> sqlite3.Connection:
    """A read-only connection to ``db_path`` (``mode=ro`` URI, ``query_only``, limits)."""
    require_sandbox()
    path = Path(db_path)
    if not path.is_file():
        raise QueryError("no_database", f"there is no database file at {path}")
    uri = f"{path.resolve().as_uri()}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None,
                               timeout=max(limits.time_limit_s, 0.1))
    except sqlite3.Error as exc:
        raise QueryError("no_database", f"the database {path} cannot be opened: {exc}") from None
    try:
        conn.text_factory = _decode_text
        conn.execute("PRAGMA query_only = ON")
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.max_value_bytes)
        conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_BYTES)
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    except sqlite3.Error as exc:
        conn.close()
        raise QueryError("no_database", f"the database {path} cannot be read: {exc}") from None
    return conn


class _Guard:
    """The authorizer and the progress handler of one query, and what they saw."""

    def __init__(self, time_limit_s: float):
        self.time_limit_s = time_limit_s
        self.deadline = float("inf")
        self.denied: str | None = None
        self.timed_out = False

    def start(self) -> None:
        self.deadline = time.monotonic() + self.time_limit_s

    def authorize(self, action: int, arg1: str | None, arg2: str | None, db_name: str | None,
                  source: str | None) -> int:
        if action in _READ_ACTIONS:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION:
            if (arg2 or "").lower() not in _DENIED_FUNCTIONS:
                return sqlite3.SQLITE_OK
            what = f"the function {arg2}()"
        else:
            what = _describe_action(action, arg1, arg2)
        if self.denied is None:
            self.denied = what
        return sqlite3.SQLITE_DENY

    def progress(self) -> int:
        if time.monotonic() > self.deadline:
            self.timed_out = True
            return 1  # non-zero: SQLite interrupts the statement
        return 0

    def error(self, exc: BaseException, limits: QueryLimits) -> QueryError:
        """The :class:`QueryError` for an exception raised while running the query."""
        message = str(exc).strip() or type(exc).__name__
        lowered = message.lower()
        if self.timed_out or "interrupted" in lowered:
            return QueryError("timeout", f"the query ran longer than the limit of {self.time_limit_s:g} s and was "
                                         "stopped; make it cheaper (no cross joins, bounded recursion)")
        if self.denied is not None or "not authorized" in lowered or "authorization denied" in lowered:
            what = self.denied or "this statement"
            return QueryError("refused", f"refused: {what} is not allowed; the database is read-only and only "
                                         "SELECT queries may run")
        if "readonly" in lowered or "read-only" in lowered:
            return QueryError("refused", "refused: writing is not allowed; the database is read-only and only "
                                         "SELECT queries may run")
        if "one statement at a time" in lowered:
            return QueryError("multiple_statements", "only one statement may run at a time; remove everything "
                                                     "after the first ';'")
        if "too big" in lowered:
            return QueryError("too_large", f"a value of the result is larger than the limit of "
                                           f"{limits.max_value_bytes:,} bytes")
        if "too long" in lowered:
            return QueryError("too_large", f"the SQL text is longer than the limit of {MAX_SQL_BYTES:,} bytes")
        return QueryError("sql_error", f"SQL error: {message}")


def _describe_action(action: int, arg1: str | None, arg2: str | None) -> str:
    name = _ACTION_NAMES.get(action, f"action {action}")
    if name == "PRAGMA":
        return f"PRAGMA {arg1}" if arg1 else "PRAGMA"
    if name in ("ATTACH", "DETACH"):
        return f"{name} (opening another database)" if name == "ATTACH" else name
    if name in ("TRANSACTION", "SAVEPOINT"):
        return "a transaction (BEGIN, COMMIT, SAVEPOINT)"
    if name == "UPDATE" and (arg1 or "").lower() == "sqlite_master":
        # what SQLite reports for a pragma table-valued function (pragma_table_info(...) ...)
        return "pragma functions such as pragma_table_info() (list_tables and describe_table show the schema)"
    if name.startswith(_WRITES):
        target = f" {arg1}" if arg1 else ""
        return f"writing to the database ({name}{target})"
    return name


# --------------------------------------------------------------------------- queries


def _value_bytes(value: Any) -> int:
    if isinstance(value, (str, bytes)):
        return len(value)
    return 8


def run_query(db_path: str | os.PathLike[str], sql: str, limits: QueryLimits = QueryLimits()) -> QueryResult:
    """Run the query ``sql`` on the database file ``db_path`` in the sandbox (see the
    module docstring); raises :class:`~rlfactory_nl2sql.sqltext.QueryError`. Blocking:
    call it from a worker thread in async code."""
    statement = check_query(sql)
    if len(statement.encode("utf-8")) > MAX_SQL_BYTES:
        raise QueryError("too_large", f"the SQL text is longer than the limit of {MAX_SQL_BYTES:,} bytes")
    guard = _Guard(limits.time_limit_s)
    started = time.monotonic()
    conn = _open(db_path, limits)
    try:
        conn.set_authorizer(guard.authorize)
        conn.set_progress_handler(guard.progress, _PROGRESS_EVERY)
        guard.start()
        rows: list[tuple[Any, ...]] = []
        size, truncated, overflow = 0, False, ""
        try:
            cursor = conn.execute(statement)
            columns = [d[0] for d in cursor.description or ()]
            while not truncated:
                batch = cursor.fetchmany(_FETCH_BATCH)
                if not batch:
                    break
                for row in batch:
                    if len(rows) >= limits.max_rows:
                        truncated, overflow = True, "rows"
                        break
                    size += sum(_value_bytes(v) for v in row)
                    if size > limits.max_bytes:
                        truncated, overflow = True, "bytes"
                        break
                    rows.append(tuple(row))
        except (sqlite3.Error, sqlite3.Warning) as exc:
            raise guard.error(exc, limits) from None
        except OverflowError as exc:  # an integer Python cannot hand to SQLite
            raise QueryError("sql_error", f"SQL error: {exc}") from None
    finally:
        conn.close()
    if truncated and limits.overflow == "error":
        if overflow == "rows":
            raise QueryError("too_many_rows", f"the result has more than {limits.max_rows:,} rows; "
                                              "select only the rows the question asks for")
        raise QueryError("too_large", f"the result is larger than {limits.max_bytes:,} bytes; "
                                      "select only the columns and rows the question asks for")
    return QueryResult(columns=columns, rows=rows, truncated=truncated, elapsed_s=time.monotonic() - started)


# --------------------------------------------------------------------------- schema

_SCHEMA_CACHE: OrderedDict[tuple[str, int, int], tuple[Table, ...]] = OrderedDict()
_SCHEMA_LOCK = threading.Lock()
_SCHEMA_CACHE_SIZE = 256


def read_schema(db_path: str | os.PathLike[str]) -> tuple[Table, ...]:
    """The user tables of the database (``sqlite_*`` tables aside), in file order; cached
    by path, size and modification time. Raises ``QueryError(kind="no_database")``."""
    path = Path(db_path)
    try:
        stat = path.stat()
    except OSError:
        raise QueryError("no_database", f"there is no database file at {path}") from None
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    with _SCHEMA_LOCK:
        if key in _SCHEMA_CACHE:
            _SCHEMA_CACHE.move_to_end(key)
            return _SCHEMA_CACHE[key]
    conn = _open(path, QueryLimits(time_limit_s=10.0))
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
