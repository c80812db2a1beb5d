"""One query on one sandbox connection: the layers that SQLite enforces itself.

This is the part of the sandbox (:mod:`rlfactory_nl2sql.sandbox`) that runs inside a SQL
worker process (:mod:`rlfactory_nl2sql.sqlworker`): it opens the read-only connection with
SQLite's limits, installs the authorizer and the progress handler, replaces ``printf`` /
``format`` by a version that refuses outputs over the value size limit, runs the statement
and fetches its rows within the row and byte limits. Every failure is a
:class:`~rlfactory_nl2sql.sqltext.QueryError`.
"""

from __future__ import annotations

import re
import sqlite3
import time
from dataclasses import dataclass
from typing import Any, Literal

from .sqltext import MAX_SQL_BYTES, QueryError

__all__ = ["QueryLimits", "QueryResult", "connect", "execute", "Guard", "printf_bound", "memory_error"]

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
# SQLite's own printf returns NULL, not an error, when its output passes SQLITE_LIMIT_LENGTH,
# and its '%.*c' repeat loop runs to the end even then (2e9 rounds: seconds inside one call,
# where the progress handler cannot stop it). Both names are replaced on the sandbox connection.
_PRINTF_NAMES = ("printf", "format") if sqlite3.sqlite_version_info >= (3, 38) else ("printf",)


@dataclass(frozen=True)
class QueryLimits:
    """What one query may use.

    :param time_limit_s: wall-clock seconds for preparing, running and fetching.
    :param max_rows: rows fetched at most.
    :param max_bytes: bytes of all fetched values at most (text and blobs by length,
        numbers 8).
    :param max_value_bytes: the longest string or blob SQLite may build
        (``SQLITE_LIMIT_LENGTH``).
    :param max_memory_bytes: the address space of the worker process that runs the query
        (``RLIMIT_AS``); past it the query is ``too_large``.
    :param overflow: what a result beyond ``max_rows`` / ``max_bytes`` gives: ``truncate``
        (the rows up to the limit, ``truncated=True``: what the model's tool shows) or
        ``error`` (a ``too_many_rows`` / ``too_large`` error: what the reward compares).
    """

    time_limit_s: float = 2.0
    max_rows: int = 1000
    max_bytes: int = 4_000_000
    max_value_bytes: int = 10_000_000
    max_memory_bytes: int = 2 * 1024 ** 3
    overflow: Literal["truncate", "error"] = "truncate"


@dataclass
class QueryResult:
    """A query's columns and rows (each a tuple); ``truncated``: more rows (or bytes) than
    the limits allowed exist and were not fetched."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool = False
    elapsed_s: float = 0.0


def _decode_text(data: bytes) -> str:
    # Spider/BIRD databases hold some text that is not UTF-8: show it, do not fail the query.
    return data.decode("utf-8", "replace")


def connect(uri: str, limits: QueryLimits, label: str) -> sqlite3.Connection:
    """A read-only connection to the database at ``uri`` (a ``file:`` URI with ``mode=ro``),
    with ``query_only`` and SQLite's limits; ``label`` names the database in errors."""
    try:
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None,
                               timeout=max(limits.time_limit_s, 0.1))
    except sqlite3.Error as exc:
        raise QueryError("no_database", f"the database {label} cannot be opened: {exc}") from None
    try:
        conn.text_factory = _decode_text
        conn.execute("PRAGMA query_only = ON")
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.max_value_bytes)
        conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_BYTES)
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    except sqlite3.Error as exc:
        conn.close()
        raise QueryError("no_database", f"the database {label} cannot be read: {exc}") from None
    return conn


# --------------------------------------------------------------------------- printf

_SPEC = re.compile(r"%([-+ #0!,]*)(\*|\d*)(?:\.(\*|\d*))?(?:ll|l)?(.?)", re.S)
_INT_PREFIX = re.compile(r"\s*[-+]?\d+")
_NUMBER_BYTES = 400  # a double written with %f: up to ~310 digits, a sign, a point
_BIG = 2 ** 31  # SQLite keeps widths and precisions in an int


def _int_arg(value: Any) -> int:
    """An argument as SQLite's printf reads a width or precision (``sqlite3_value_int64``),
    as a size: its absolute value, at most 2**31."""
    if isinstance(value, (bytes, str)):
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        match = _INT_PREFIX.match(text)
        value = int(match.group()) if match else 0
    elif isinstance(value, float):
        value = int(value) if abs(value) < 2 ** 63 else _BIG
    elif not isinstance(value, int):
        value = 0
    return min(abs(value), _BIG)


def _text_bytes(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode("utf-8", "replace"))
    return _NUMBER_BYTES


def printf_bound(fmt: Any, args: tuple[Any, ...]) -> int:
    """An upper bound of the bytes SQLite's ``printf(fmt, *args)`` writes, found without
    writing them: the format's own text plus, for each conversion, the most it can write
    given its width, precision and argument."""
    if fmt is None:
        return 0
    text = fmt.decode("utf-8", "replace") if isinstance(fmt, bytes) else str(fmt)
    total, next_arg = len(text.encode("utf-8", "replace")), 0

    def take() -> Any:
        nonlocal next_arg
        next_arg += 1
        return args[next_arg - 1] if next_arg <= len(args) else None

    for spec in _SPEC.finditer(text):
        _, width, precision, kind = spec.groups()
        if kind == "%" or kind == "":
            continue
        wide = _int_arg(take()) if width == "*" else min(int(width or 0), _BIG)
        exact = None
        if precision is not None:
            exact = _int_arg(take()) if precision == "*" else min(int(precision or 0), _BIG)
        if kind == "n":
            continue
        value = take()
        if kind == "c":  # the argument's first character, repeated `precision` times
            first = value.decode("utf-8", "replace")[:1] if isinstance(value, bytes) else str(value or "")[:1]
            written = len(first.encode("utf-8", "replace") or b"\0") * max(exact or 1, 1)
        elif kind in "sz":
            written = _text_bytes(value)
        elif kind in "qQw":
            written = 2 * _text_bytes(value) + 4  # quotes doubled, NULL or the outer quotes
        else:
            written = (exact or 0) * 4 // 3 + _NUMBER_BYTES  # digits, zero padding, ',' separators
        total += max(wide, written)
    return total


class _Printf:
    """SQLite's printf behind a size check: an output over the value size limit is an
    error (``too_large``) before anything is written; the formatting itself is SQLite's, on a
    private in-memory connection where printf is the built-in one."""

    def __init__(self, guard: "Guard", max_value_bytes: int):
        self.guard, self.max_value_bytes = guard, max_value_bytes
        self._builtin: sqlite3.Connection | None = None

    def __call__(self, fmt: Any = None, *args: Any) -> Any:
        if time.monotonic() > self.guard.deadline:
            self.guard.timed_out = True
            raise TimeoutError("deadline")
        bound = printf_bound(fmt, args)
        if bound > self.max_value_bytes:
            self.guard.too_large = (f"printf() would write up to {bound:,} bytes, more than the limit of "
                                    f"{self.max_value_bytes:,} bytes for one value; use a smaller width or precision")
            raise ValueError(self.guard.too_large)
        if self._builtin is None:
            self._builtin = sqlite3.connect(":memory:", check_same_thread=False)
            self._builtin.text_factory = _decode_text
            self._builtin.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self.max_value_bytes)
        marks = ", ".join("?" * (len(args) + 1))
        return self._builtin.execute(f"SELECT printf({marks})", (fmt, *args)).fetchone()[0]

    def close(self) -> None:
        if self._builtin is not None:
            self._builtin.close()


# --------------------------------------------------------------------------- the guard


class Guard:
    """The authorizer and the progress handler of one query, and what they saw."""

    def __init__(self, time_limit_s: float):
        self.time_limit_s = time_limit_s
        self.deadline = float("inf")
        self.denied: str | None = None
        self.too_large: str | None = None
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

    def timeout(self) -> QueryError:
        return QueryError("timeout", f"the query ran longer than the limit of {self.time_limit_s:g} s and was "
                                     "stopped; make it cheaper (no cross joins, bounded recursion, smaller values)")

    def error(self, exc: BaseException, limits: QueryLimits) -> QueryError:
        """The :class:`QueryError` for an exception raised while running the query."""
        message = str(exc).strip() or type(exc).__name__
        lowered = message.lower()
        if self.timed_out or "interrupted" in lowered:
            return self.timeout()
        if self.too_large is not None:
            return QueryError("too_large", self.too_large)
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
        if "file is not a database" in lowered:
            return QueryError("no_database", f"the database file cannot be read: {message}")
        if isinstance(exc, MemoryError) or "out of memory" in lowered:
            return QueryError("too_large", memory_error(limits))
        if isinstance(exc, UnicodeDecodeError):
            # Python decodes column names strictly; a database may hold names that are not UTF-8
            return QueryError("sql_error", "SQL error: a column name of the result is not valid UTF-8; give the "
                                           "column an alias (SELECT ... AS name)")
        return QueryError("sql_error", f"SQL error: {message}")


def memory_error(limits: QueryLimits) -> str:
    return (f"the query needs more memory than the limit of {limits.max_memory_bytes / 2 ** 20:,.0f} MiB; select "
            "fewer or smaller values")


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


# --------------------------------------------------------------------------- one query


def _value_bytes(value: Any) -> int:
    if isinstance(value, (str, bytes)):
        return len(value)
    return 8


def execute(uri: str, statement: str, limits: QueryLimits, label: str) -> QueryResult:
    """Run ``statement`` (already through :func:`~rlfactory_nl2sql.sqltext.check_query`) on
    the database at ``uri`` under every layer; raises :class:`QueryError`."""
    guard = Guard(limits.time_limit_s)
    started = time.monotonic()
    conn = connect(uri, limits, label)
    printf = _Printf(guard, limits.max_value_bytes)
    try:
        conn.set_authorizer(guard.authorize)
        conn.set_progress_handler(guard.progress, _PROGRESS_EVERY)
        for name in _PRINTF_NAMES:
            conn.create_function(name, -1, printf, deterministic=True)
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
        # OverflowError: an integer Python cannot hand to SQLite; UnicodeDecodeError: a column
        # name that is not UTF-8; MemoryError: the worker's memory limit
        except (sqlite3.Error, sqlite3.Warning, OverflowError, UnicodeError, MemoryError, ValueError) as exc:
            raise guard.error(exc, limits) from None
    finally:
        printf.close()
        conn.close()
    if truncated and limits.overflow == "error":
        if overflow == "rows":
            raise QueryError("too_many_rows", f"the result has more than {limits.max_rows:,} rows; "
                                              "select only the rows the question asks for")
        raise QueryError("too_large", f"the result is larger than {limits.max_bytes:,} bytes; "
                                      "select only the columns and rows the question asks for")
    return QueryResult(columns=columns, rows=rows, truncated=truncated, elapsed_s=time.monotonic() - started)
