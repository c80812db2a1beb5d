"""The SQL sandbox (``rlfactory_nl2sql.sandbox``) and the SQL text helpers
(``rlfactory_nl2sql.sqltext``): hostile SQL through the real tool manager, each layer of the
sandbox on its own, limits, and the database file byte-identical afterwards."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

from rlfactory_core import ToolCall
from rlfactory_core.testing import ConcurrentToolManager
from rlfactory_nl2sql import NL2SQLEnv
from rlfactory_nl2sql.engine import Guard
from rlfactory_nl2sql.sandbox import (
    ERROR_KINDS,
    QueryLimits,
    QueryResult,
    _open,
    format_table,
    format_value,
    read_schema,
    run_query,
    schema_text,
)
from rlfactory_nl2sql.sqltext import QueryError, check_query, extract_sql, orders_rows

from nl2sql_testdata import CONCERT_SQL, make_db, sha256

BIG_SQL = """
CREATE TABLE big (n INTEGER PRIMARY KEY, label TEXT);
INSERT INTO big WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < 2000)
    SELECT n, 'row ' || n FROM seq;
"""

#: (hostile SQL, error kind, a phrase the one-line message must contain)
HOSTILE = [
    ("DROP TABLE singer", "not_a_query", "starts with DROP"),
    ("UPDATE singer SET age = 0", "not_a_query", "starts with UPDATE"),
    ("INSERT INTO singer VALUES (9, 'Eve', 'Nowhere', 1)", "not_a_query", "starts with INSERT"),
    ("DELETE FROM singer", "not_a_query", "starts with DELETE"),
    ("CREATE TABLE loot (a)", "not_a_query", "starts with CREATE"),
    ("ATTACH DATABASE 'evil.db' AS evil", "not_a_query", "starts with ATTACH"),
    ("VACUUM INTO 'copy.db'", "not_a_query", "starts with VACUUM"),
    ("PRAGMA user_version = 7", "not_a_query", "starts with PRAGMA"),
    ("PRAGMA query_only = OFF", "not_a_query", "starts with PRAGMA"),
    ("PRAGMA journal_mode = WAL", "not_a_query", "starts with PRAGMA"),
    ("BEGIN IMMEDIATE", "not_a_query", "starts with BEGIN"),
    ("SELECT * FROM singer; DROP TABLE singer", "multiple_statements", "only one statement"),
    ("SELECT 1; SELECT 2;", "multiple_statements", "got 2"),
    ("SELECT load_extension('/tmp/evil.so')", "refused", "load_extension() is not allowed"),
    # SQLite asks to UPDATE sqlite_master for a pragma function: said as what it is, not as a write
    ("SELECT * FROM pragma_table_info('singer')", "refused", "pragma functions such as pragma_table_info()"),
    ("WITH x AS (SELECT 1) DELETE FROM singer", "refused", "writing to the database (DELETE singer)"),
    ("WITH x AS (SELECT 1) INSERT INTO singer SELECT * FROM singer", "refused", "writing to the database (INSERT"),
    ("WITH x AS (SELECT 1) UPDATE singer SET age = 1", "refused", "writing to the database (UPDATE singer"),
    ("SELECT COUNT(*) FROM big AS a, big AS b, big AS c", "timeout", "longer than the limit of 0.3 s"),
    ("WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT MAX(x) FROM r", "timeout",
     "longer than the limit"),
    ("SELECT zeroblob(2000000000)", "too_large", "larger than the limit"),
    ("SELECT randomblob(2000000000)", "too_large", "larger than the limit"),
    ("SELECT length(replace(hex(zeroblob(3000000)), '0', 'ab'))", "too_large", "larger than the limit"),
    ("SELECT * FROM no_such_table", "sql_error", "no such table: no_such_table"),
    ("SELECT name FROM singer WHERE", "sql_error", "SQL error"),
    ("SELEC name FROM singer", "not_a_query", "starts with SELEC"),
]


@pytest.fixture
def db(tmp_path) -> Path:
    return make_db(tmp_path / "db" / "concert_singer" / "concert_singer.sqlite", CONCERT_SQL + BIG_SQL)


def state(db_path: Path) -> dict:
    return {"state": {"db_path": str(db_path)}, "tool_names": None}


async def test_hostile_sql_gets_a_one_line_error_and_the_database_is_untouched(db, tmp_path, monkeypatch):
    """Every hostile statement through the real tool manager and run_query tool: an error
    observation of one line naming the problem; afterwards the file is byte-identical and no
    file appeared beside it (no journal, no attached or vacuumed copy)."""
    monkeypatch.chdir(db.parent)  # where 'evil.db' / 'copy.db' would be created
    before, listing = sha256(db), sorted(p.name for p in db.parent.iterdir())
    env = NL2SQLEnv(source="builtin", data_dir=str(tmp_path / "unused"), time_limit_s=0.3)
    manager = ConcurrentToolManager(env.tools)
    calls = [ToolCall("run_query", {"query": sql}, id=str(i)) for i, (sql, _, _) in enumerate(HOSTILE)]
    results = await manager.call(calls, state(db))
    for (sql, kind, phrase), result in zip(HOSTILE, results):
        assert result.error == "tool_error" and result.metadata["tool_error"] == (
            "sql_error" if kind == "sql_error" else f"sql_{kind}"), (sql, result)
        assert result.content.startswith("Error: ") and "\n" not in result.content, (sql, result.content)
        assert phrase in result.content, (sql, result.content)
    assert sha256(db) == before
    assert sorted(p.name for p in db.parent.iterdir()) == listing
    assert not (tmp_path / "evil.db").exists() and not Path("copy.db").exists()
    # the database still answers
    assert run_query(db, "SELECT COUNT(*) FROM singer").rows == [(6,)]


@pytest.mark.parametrize("sql, kind, phrase", HOSTILE)
def test_run_query_raises_the_kind_of_each_hostile_statement(db, sql, kind, phrase):
    with pytest.raises(QueryError) as info:
        run_query(db, sql, QueryLimits(time_limit_s=0.3))
    assert info.value.kind == kind and info.value.kind in ERROR_KINDS
    assert phrase in str(info.value)


def test_each_layer_refuses_writes_on_its_own(db):
    """The gate is only for messages: the read-only connection and the authorizer each stop a write."""
    before = sha256(db)
    # 1. the mode=ro connection with query_only, without the authorizer
    conn = _open(db, QueryLimits())
    try:
        for statement in ("DELETE FROM singer", "CREATE TABLE loot (a)", "PRAGMA user_version = 3"):
            with pytest.raises(sqlite3.Error):
                conn.execute(statement)
        conn.execute("PRAGMA query_only = OFF")  # even with query_only off, mode=ro holds
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            conn.execute("DELETE FROM singer")
        with pytest.raises(sqlite3.OperationalError, match="too many attached databases"):
            conn.execute("ATTACH DATABASE ':memory:' AS other")  # SQLITE_LIMIT_ATTACHED = 0
    finally:
        conn.close()
    # 2. the authorizer alone, on a writable connection to a copy
    copy = db.with_name("copy.sqlite")
    copy.write_bytes(db.read_bytes())
    writable = sqlite3.connect(copy)
    guard = Guard(1.0)
    writable.set_authorizer(guard.authorize)
    try:
        for statement in ("DELETE FROM singer", "DROP TABLE singer", "ATTACH DATABASE ':memory:' AS x",
                          "PRAGMA user_version = 3", "SELECT load_extension('x')", "BEGIN"):
            guard.denied = None
            with pytest.raises(sqlite3.DatabaseError, match="not authorized|authorization denied"):
                writable.execute(statement)
            assert guard.denied, statement
        assert writable.execute("SELECT COUNT(*) FROM singer").fetchone() == (6,)
    finally:
        writable.close()
    assert sha256(copy) == before and sha256(db) == before


def test_extension_loading_stays_disabled(db):
    conn = _open(db, QueryLimits())
    try:
        with pytest.raises(sqlite3.OperationalError):
            conn.execute("SELECT load_extension('/no/such/lib')")  # not authorized without the authorizer too
    finally:
        conn.close()


def test_rows_and_bytes_are_limited_by_truncating_or_by_an_error(db):
    result = run_query(db, "SELECT n FROM big", QueryLimits(max_rows=5))
    assert result.rows == [(1,), (2,), (3,), (4,), (5,)] and result.truncated
    assert run_query(db, "SELECT n FROM big WHERE n <= 5", QueryLimits(max_rows=5)).truncated is False
    with pytest.raises(QueryError, match="more than 5 rows") as info:
        run_query(db, "SELECT n FROM big", QueryLimits(max_rows=5, overflow="error"))
    assert info.value.kind == "too_many_rows"
    # a streaming cross join of 8e9 rows: the first rows come back at once, the rest is never computed
    streamed = run_query(db, "SELECT a.n, b.n, c.n FROM big AS a, big AS b, big AS c", QueryLimits(max_rows=3))
    assert len(streamed.rows) == 3 and streamed.truncated
    # bytes: 2000 labels of 5-8 characters
    small = QueryLimits(max_bytes=100)
    assert run_query(db, "SELECT label FROM big", small).truncated
    with pytest.raises(QueryError, match="larger than 100 bytes") as info:
        run_query(db, "SELECT label FROM big", QueryLimits(max_bytes=100, overflow="error"))
    assert info.value.kind == "too_large"
    with pytest.raises(QueryError) as info:
        run_query(db, "SELECT '" + "x" * 200_000 + "'")
    assert info.value.kind == "too_large" and "SQL text" in str(info.value)


def test_a_missing_database_and_undecodable_text(tmp_path, db):
    with pytest.raises(QueryError, match="no database file") as info:
        run_query(tmp_path / "nope.sqlite", "SELECT 1")
    assert info.value.kind == "no_database"
    odd = make_db(tmp_path / "odd.sqlite", "CREATE TABLE t (s TEXT); INSERT INTO t VALUES (CAST(x'41ff42' AS TEXT));")
    assert run_query(odd, "SELECT s FROM t").rows == [("A\ufffdB",)]


def test_without_connection_setlimit_the_sandbox_refuses_to_run(db, monkeypatch):
    """Python 3.10's sqlite3 cannot set SQLite's limits (value size, SQL text, attached
    databases): the sandbox, the env and the reward refuse to start there, in one line."""
    from rlfactory_nl2sql import SQLExecutionReward, sandbox

    assert sandbox._HAS_SETLIMIT == (sys.version_info >= (3, 11))
    monkeypatch.setattr(sandbox, "_HAS_SETLIMIT", False)
    for start in (lambda: run_query(db, "SELECT 1"), lambda: read_schema(db), NL2SQLEnv, SQLExecutionReward):
        with pytest.raises(sandbox.SandboxUnavailableError) as info:
            start()
        assert str(info.value).startswith("the nl2sql SQL sandbox needs Python 3.11 or newer: Python ")
        assert "Connection.setlimit" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("sql, expected", [
    ("  SELECT 1 ", "SELECT 1"),
    ("with x as (select 1) select * from x", "with x as (select 1) select * from x"),
    ("(SELECT 1)", "(SELECT 1)"),
    ("VALUES (1), (2)", "VALUES (1), (2)"),
    ("-- a comment\nSELECT 1;", "-- a comment\nSELECT 1;"),
    ("SELECT 1; -- trailing comment", "SELECT 1; -- trailing comment"),
    ("SELECT ';' AS semicolon", "SELECT ';' AS semicolon"),
])
def test_check_query_accepts_one_query(sql, expected):
    assert check_query(sql) == expected


@pytest.mark.parametrize("sql, kind", [
    ("", "empty"), ("   ", "empty"), (None, "empty"), (42, "empty"), (";;", "empty"),
    ("SELECT 1; SELECT 2", "multiple_statements"), ("EXPLAIN SELECT 1", "not_a_query"),
    ("REINDEX", "not_a_query"), ("/* hi */ DROP TABLE t", "not_a_query"),
])
def test_check_query_refuses(sql, kind):
    with pytest.raises(QueryError) as info:
        check_query(sql)
    assert info.value.kind == kind


@pytest.mark.parametrize("sql, ordered", [
    ("SELECT a FROM t ORDER BY a", True),
    ("SELECT a FROM t order by a desc limit 3", True),
    ("WITH x AS (SELECT a FROM t ORDER BY a) SELECT a FROM x", False),
    ("WITH x AS (SELECT a FROM t) SELECT a FROM x ORDER BY a", True),
    ("SELECT a FROM (SELECT a FROM t ORDER BY a)", False),
    ("SELECT a FROM t WHERE a IN (SELECT b FROM u ORDER BY b LIMIT 2)", False),
    ("SELECT a FROM t UNION SELECT b FROM u ORDER BY 1", True),
    ("(SELECT a FROM t ORDER BY a)", True),
    ("SELECT a FROM t WHERE name = 'order by'", False),
    ("SELECT a FROM t", False),
    # sqlglot cannot read this; the fallback still sees the top-level ORDER BY only
    ("SELECT a FROM t WHERE b = (SELECT c FROM u ORDER BY c) ORDER BY a ))(", True),
])
def test_orders_rows_finds_a_top_level_order_by(sql, ordered):
    assert orders_rows(sql) is ordered


@pytest.mark.parametrize("text, sql, form", [
    ("<answer>SELECT 1</answer>", "SELECT 1", "answer_tag"),
    ("<answer> SELECT name FROM t; </answer>", "SELECT name FROM t", "answer_tag"),
    ("<answer>\n```sql\nSELECT 2\n```\n</answer>", "SELECT 2", "answer_tag"),
    ("first <answer>SELECT 1</answer> then <answer>SELECT 2</answer>", "SELECT 2", "answer_tag"),
    ("<think>maybe <answer>SELECT 0</answer></think><answer>SELECT 3</answer>", "SELECT 3", "answer_tag"),
    ("The query:\n```sql\nSELECT 4;\n```", "SELECT 4", "sql_block"),
    ("```SQL\nSELECT 5\n```", "SELECT 5", "sql_block"),
    ("SELECT 6", "", None),
    ("<answer></answer>", "", None),
    ("<answer>SELECT 7", "", None),
    (None, "", None),
])
def test_extract_sql(text, sql, form):
    assert extract_sql(text) == (sql, form)


def test_results_are_shown_as_a_compact_table():
    result = QueryResult(columns=["name", "area", "note", "blob"],
                         rows=[("Peru", 1285216.0, None, b"\x00\x01"), ("A" * 60, 0.125, "two\nlines", None)])
    assert format_table(result, max_cell_chars=20) == (
        "name | area | note | blob\n"
        "Peru | 1285216 | NULL | <blob, 2 bytes>\n"
        f"{'A' * 19}… | 0.125 | two lines | NULL\n"
        "(2 rows)")
    assert format_table(QueryResult(["n"], [(1,)], truncated=True)).endswith("(1 row shown; the result has more)")
    assert format_value(1 / 3) == "0.3333333333" and format_value(-2.0) == "-2" and format_value(7) == "7"


def test_read_schema_lists_tables_columns_and_foreign_keys(db):
    tables = read_schema(db)
    assert [t.name for t in tables] == ["stadium", "singer", "concert", "big"]
    concert = tables[2]
    assert [c.name for c in concert.columns] == ["concert_id", "concert_name", "stadium_id", "year"]
    assert concert.columns[0].primary_key and concert.columns[0].type == "INTEGER"
    assert concert.foreign_keys == (("stadium_id", "stadium", "stadium_id"),)
    assert concert.sql.startswith("CREATE TABLE concert (")
    assert schema_text(tables[:2]) == "stadium(stadium_id, name, capacity)\nsinger(singer_id, name, country, age)"
    assert read_schema(db) is tables  # cached
