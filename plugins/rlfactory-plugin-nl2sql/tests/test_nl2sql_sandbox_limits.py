"""The sandbox against inputs that once escaped it: text SQLite cannot take, queries too
large to parse, single function calls that run for seconds or minutes (printf, replace,
instr, trim), memory, column names that are not UTF-8, deeply nested SQL, WAL-mode
databases, and the SQL text helpers on adversarial model text. Every failure must be a
QueryError with a one-line message: a tool error ``sql_<kind>`` for the model, an
``execution_error`` for the reward, never an exception."""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path

import pytest

from rlfactory_core import Message, Segment, ToolCall, Trajectory
from rlfactory_core.testing import ConcurrentToolManager
from rlfactory_nl2sql import NL2SQLEnv, SQLExecutionReward
from rlfactory_nl2sql.engine import printf_bound
from rlfactory_nl2sql.sandbox import ERROR_KINDS, MAX_SQL_BYTES, QueryLimits, read_schema, run_query
from rlfactory_nl2sql.sqltext import QueryError, check_query, extract_sql, normalise_sql, orders_rows

from nl2sql_testdata import CONCERT_SQL, make_db, sha256

NESTED = "SELECT " + "(" * 5000 + "1" + ")" * 5000


@pytest.fixture
def db(tmp_path) -> Path:
    return make_db(tmp_path / "db" / "concert.sqlite", CONCERT_SQL)


def failure(db_path, sql: str, limits: QueryLimits = QueryLimits()) -> QueryError:
    with pytest.raises(QueryError) as info:
        run_query(db_path, sql, limits)
    error = info.value
    assert error.kind in ERROR_KINDS and "\n" not in str(error)
    return error


# --------------------------------------------------------------------------- text


@pytest.mark.parametrize("sql, kind, phrase", [
    ("SELECT '\ud800'", "sql_error", "(U+D800, a lone surrogate, at position 8)"),
    ("SELECT name FROM singer WHERE name = '\udfff'", "sql_error", "lone surrogate"),
    ("SELECT 1\x00; DROP TABLE singer", "sql_error", "NUL character (at position 8)"),
    # 60,000 characters, 120,000 bytes of UTF-8: the limit is in bytes
    ("SELECT '" + "é" * 60_000 + "'", "too_large", f"longer than the limit of {MAX_SQL_BYTES:,} bytes"),
    ("SELECT '" + "x" * 10_000_000 + "'", "too_large", "SQL text"),
    ("SELECT '" + "\ud800" * 10_000_000 + "'", "too_large", "SQL text"),  # the size is checked first
    (NESTED, "sql_error", "SQL error: parser stack overflow"),
])
def test_text_sqlite_cannot_take_is_a_query_error(db, sql, kind, phrase):
    error = failure(db, sql)
    assert error.kind == kind and phrase in str(error), str(error)


def test_a_huge_query_is_refused_before_sqlglot_sees_it(db, monkeypatch):
    """The size is checked before any parsing: sqlglot's tokenizer never receives the 10 MB
    text (it took 14-17 s and 1.7 GB on it), while a normal query still goes through it."""
    from sqlglot.dialects.dialect import Dialect

    seen: list[int] = []
    tokenize = Dialect.tokenize

    def recording(self, sql, *args, **kwargs):
        seen.append(len(sql))
        return tokenize(self, sql, *args, **kwargs)

    monkeypatch.setattr(Dialect, "tokenize", recording)
    assert run_query(db, "SELECT COUNT(*) FROM singer").rows == [(6,)]
    assert seen == [len("SELECT COUNT(*) FROM singer")]
    for huge in ("SELECT 1 -- " + "x" * 10_000_000, "SELECT 1 " + "; SELECT 2" * 1_000_000):
        seen.clear()
        with pytest.raises(QueryError, match="SQL text is longer than the limit") as info:
            check_query(huge)
        assert info.value.kind == "too_large" and seen == []
        assert failure(db, huge).kind == "too_large" and seen == []


async def test_bad_text_reaches_the_model_as_a_tool_error_and_the_reward_as_an_execution_error(db, tmp_path):
    env = NL2SQLEnv(source="builtin", data_dir=str(tmp_path / "unused"))
    ctx = {"state": {"db_path": str(db)}}
    calls = [ToolCall("run_query", {"query": sql}, id=str(i))
             for i, sql in enumerate(["SELECT '\ud800'", "SELECT 1\x00", NESTED])]
    results = await ConcurrentToolManager(env.tools).call(calls, ctx)
    # the tool manager may refuse a lone surrogate in any tool's arguments before the call
    assert results[0].error in ("tool_error", "invalid_arguments") and "lone surrogate" in results[0].content
    for result in results[1:]:
        assert result.error == "tool_error" and result.metadata["tool_error"] == "sql_error", result
        assert result.content.startswith("Error: ") and "\n" not in result.content
    run_query_tool = next(tool for tool in env.tools if tool.name == "run_query")
    direct = await run_query_tool.call({"query": "SELECT '\ud800'"}, ctx)  # the tool itself, without the manager
    assert direct.error == "sql_error" and "lone surrogate" in direct.content
    reward = SQLExecutionReward()
    sample = {"id": "s1", "query": "SELECT name FROM singer", "db_path": str(db)}
    for sql in ("SELECT '\ud800'", NESTED):
        trajectory = Trajectory(sample_id="s1", prompt_ids=[1])
        trajectory.messages = [Message("user", "?"), Message("assistant", f"<answer>{sql}</answer>")]
        trajectory.segments = [Segment("model", [5], [-0.1])]
        trajectory.final_answer = sql
        output = reward.score(trajectory, sample)
        assert output.value == 0 and output.components["execution_error"] == 1.0
        assert trajectory.metadata["sql_execution"]["error_kind"] == "sql_error"
    # a gold SQL that SQLite cannot take is the documented dataset error, not a UnicodeEncodeError
    trajectory.final_answer = "SELECT 1"
    with pytest.raises(RuntimeError, match=r"the gold SQL of sample s1 failed on .*lone surrogate.*fix or drop"):
        reward.score(trajectory, {**sample, "query": "SELECT '\ud800'"})


def test_sql_helpers_take_deeply_nested_sql():
    assert orders_rows(NESTED) is False and orders_rows(NESTED + " ORDER BY 1") is True
    assert normalise_sql(NESTED) == NESTED  # sqlglot's RecursionError: the text as it is


def test_extract_sql_is_linear_and_finds_what_the_regex_finds():
    """The <answer> pairs are found by one pass (the regex scanned to the end of the text from
    every unclosed <answer>: 80 kB of them took 3 s); the result is the regex's."""
    from rlfactory_nl2sql.sqltext import _answer_tags

    regex = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
    texts = ["", "<answer>a</answer>", "<answer>a<answer>b</answer>c</answer>", "</answer><answer>x</answer>",
             "<ANSWER>x</Answer> <answer>y", "<answer><answer></answer></answer>", "<answer>" * 5 + "</answer>" * 2,
             "a</answer>b<answer>c</answer>d<answer>e</answer>f</answer>", "<answer>\n1\n</answer><answer></answer>"]
    for text in texts:
        assert _answer_tags(text) == regex.findall(text), text
    hostile = "<answer>" * 500_000 + "</answer>"[:-1]  # 4 MB, never closed
    assert extract_sql(hostile) == ("", None)
    assert extract_sql(hostile + "> <answer>SELECT 1</answer>") == ("SELECT 1", "answer_tag")


# --------------------------------------------------------------------------- single calls


@pytest.mark.parametrize("sql", [
    "SELECT printf('%.*c', 2000000000, 'x')",  # SQLite's own printf loops 2e9 times: seconds in one call
    "SELECT format('%.*c', 2000000000, 'x')",
    "SELECT printf('%*c', 2000000000, 'x')",  # and these returned NULL: a wrong value, not an error
    "SELECT printf('%2000000000d', 1)",
    "SELECT printf('%.*f', 2000000000, 1.0)",
    "SELECT printf('%!.*f%s', 50000000, 2.5, 'x')",
    "SELECT printf('%.*c%.*c', 6000000, 'x', 6000000, 'y')",
    "SELECT printf('%.*c', 6000000, 'é')",  # 2 bytes a character
    "SELECT printf('%.*c', n * 100000000, 'x') FROM (SELECT 1 AS n)",
])
def test_printf_past_the_value_size_limit_is_refused_before_it_runs(db, sql):
    error = failure(db, sql)
    assert error.kind == "too_large" and "printf() would write up to" in str(error)
    assert "more than the limit of 10,000,000 bytes for one value" in str(error)


FORMATS = [
    ("%d|%5d|%-5d|%05d|%+d|%,d", (42, 42, 42, 42, 42, 1234567)),
    ("%.3f|%10.2e|%g|%G|%!.20g", (3.14159, 31415.9, 0.0001, 1e20, 0.1)),
    ("%x|%X|%o|%#x|%lld|%llx", (255, 255, 8, 255, 2 ** 40, 2 ** 40)),
    ("%s|%.2s|%10s|%-10s|%z", ("héllo", "héllo", "ab", "ab", "zz")),
    ("%q|%Q|%Q|%w", ("it's", "it's", None, 'a"b')),
    ("%c|%.5c|%*c|%.*c|%.*c", ("xyz", "é", 3, "k", 4, "m", 0, "n")),
    ("%*d|%-*d|%.*s|%%|%n|%s", (6, 1, -6, 2, 3, "abcdef", "end")),
    ("%d %s", ()),  # missing arguments
    ("%", ()),
    ("%5", ()),
    ("no conversion", (1, 2)),
    ("%s", (b"blob",)),
]


@pytest.mark.parametrize("fmt, args", FORMATS)
def test_printf_gives_sqlites_output_and_its_bound_holds(db, fmt, args):
    builtin = sqlite3.connect(":memory:")
    builtin.text_factory = lambda data: data.decode("utf-8", "replace")  # '%.2s' cuts 'é' in half
    marks = ", ".join("?" * (len(args) + 1))
    expected = builtin.execute(f"SELECT printf({marks})", (fmt, *args)).fetchone()[0]
    literal = ", ".join(["'" + fmt.replace("'", "''") + "'"] + [
        "NULL" if a is None else f"x'{a.hex()}'" if isinstance(a, bytes) else
        "'" + a.replace("'", "''") + "'" if isinstance(a, str) else repr(a) for a in args])
    assert run_query(db, f"SELECT printf({literal})").rows == [(expected,)]
    assert printf_bound(fmt, args) >= len((expected or "").encode())


@pytest.mark.parametrize("sql", [
    # one call each, quadratic in its arguments: 2 MB x 100 kB compares for seconds (10 MB x 5 MB: hours)
    "SELECT replace(printf('%.*c', 2000000, 'a'), printf('%.*c', 100000, 'a') || 'b', 'x')",
    "SELECT instr(printf('%.*c', 2000000, 'a'), printf('%.*c', 100000, 'a') || 'b')",
    "SELECT trim(printf('%.*c', 2000000, 'a') || 'z', printf('%.*c', 100000, 'b') || 'a')",
])
def test_a_single_slow_function_call_is_stopped_at_the_time_limit(db, sql):
    """The progress handler cannot stop one C call; its worker process is killed at the
    limit (plus a grace), and the next query gets a new worker."""
    error = failure(db, sql, QueryLimits(time_limit_s=0.2))
    assert error.kind == "timeout" and "longer than the limit of 0.2 s" in str(error)
    assert run_query(db, "SELECT COUNT(*) FROM singer").rows == [(6,)]


def test_queries_run_in_a_process_holding_many_file_descriptors(db):
    """A training process holds many descriptors; the pipe of a new worker may be numbered
    past 1023, where select() fails (the wait uses poll)."""
    import resource

    from rlfactory_nl2sql import sqlworker

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        sqlworker._stop_idle()  # the next query starts a worker, whose pipes come after `held`
        assert run_query(db, "SELECT COUNT(*) FROM singer").rows == [(6,)]
        assert failure(db, "SELECT instr(printf('%.*c', 2000000, 'a'), printf('%.*c', 100000, 'a') || 'b')",
                       QueryLimits(time_limit_s=0.2)).kind == "timeout"
    finally:
        for fd in held:
            os.close(fd)
        sqlworker._stop_idle()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_worker_that_cannot_start_is_a_machine_error_not_a_query_error(db, monkeypatch):
    """The reward scores a QueryError 0 (the policy's fault); a worker that does not start is
    the machine's, and is raised as such (the reward layer counts it in reward/errors)."""
    from rlfactory_nl2sql import sqlworker

    sqlworker._stop_idle()
    monkeypatch.setattr(sqlworker, "_BOOT", "import sys; sys.exit(3)")
    with pytest.raises(RuntimeError, match=r"SQL worker process did not start .*exit code 3"):
        run_query(db, "SELECT 1")
    monkeypatch.undo()
    assert run_query(db, "SELECT 1").rows == [(1,)]


def test_a_worker_process_that_cannot_be_created_is_a_machine_error_too(db, monkeypatch, tmp_path):
    """Popen's own OSError (no such interpreter here; out of processes or descriptors on a
    busy machine) is the machine's fault too, not a QueryError."""
    from rlfactory_nl2sql import sqlworker

    sqlworker._stop_idle()
    monkeypatch.setattr(sqlworker.sys, "executable", str(tmp_path / "no-such-python"))
    with pytest.raises(RuntimeError, match=r"SQL worker process could not start .*no-such-python"):
        run_query(db, "SELECT 1")
    monkeypatch.undo()
    assert run_query(db, "SELECT 1").rows == [(1,)]


def test_memory_is_limited(db):
    columns = ", ".join(["randomblob(9000000)"] * 30)  # 270 MB in one row
    error = failure(db, f"SELECT {columns}", QueryLimits(time_limit_s=60, max_memory_bytes=200 * 2 ** 20))
    assert error.kind == "too_large" and "more memory than the limit of 200 MiB" in str(error)
    assert run_query(db, "SELECT COUNT(*) FROM singer").rows == [(6,)]


def test_a_column_name_that_is_not_utf8_is_a_query_error(tmp_path):
    odd = make_db(tmp_path / "odd.sqlite", "CREATE TABLE t (a); INSERT INTO t VALUES (1);")
    conn = sqlite3.connect(odd)
    conn.execute("PRAGMA writable_schema = ON")  # a column named b'\xff': what a damaged dataset can hold
    conn.execute("UPDATE sqlite_master SET sql = CAST(x'435245415445205441424c45207428ff29' AS TEXT)")
    conn.commit()
    conn.close()
    error = failure(odd, "SELECT * FROM t")
    assert error.kind == "sql_error" and "column name of the result is not valid UTF-8" in str(error)
    assert run_query(odd, "SELECT rowid AS n FROM t").rows == [(1,)]


def test_a_file_that_is_not_a_database(tmp_path):
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 100)
    error = failure(junk, "SELECT 1 FROM t")
    assert error.kind == "no_database" and "file is not a database" in str(error)


# --------------------------------------------------------------------------- WAL mode


def test_a_wal_database_is_read_without_creating_files(tmp_path):
    path = make_db(tmp_path / "wal" / "w.sqlite", "PRAGMA journal_mode = WAL; CREATE TABLE t (a); "
                                                  "INSERT INTO t VALUES (1);")
    listing, before = sorted(p.name for p in path.parent.iterdir()), sha256(path)
    assert listing == ["w.sqlite"]  # closed cleanly: checkpointed, no -wal left
    assert run_query(path, "SELECT a FROM t").rows == [(1,)]
    assert [t.name for t in read_schema(path)] == ["t"]
    assert sorted(p.name for p in path.parent.iterdir()) == listing and sha256(path) == before


def test_rows_committed_only_in_the_wal_are_seen(tmp_path):
    """A writer keeps its connection open (no checkpoint): its committed rows live only in
    the -wal file. The queries see them, on a private checkpointed copy; nothing beside the
    database changes or appears."""
    path = make_db(tmp_path / "wal" / "w.sqlite", "PRAGMA journal_mode = WAL; CREATE TABLE t (a); "
                                                  "INSERT INTO t VALUES (1);")
    writer = sqlite3.connect(path)
    try:
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        writer.execute("INSERT INTO t VALUES (2)")
        writer.execute("CREATE TABLE u (b)")
        writer.commit()
        beside = {p.name: sha256(p) for p in path.parent.iterdir()}
        assert Path(f"{path}-wal").stat().st_size > 0
        immutable = sqlite3.connect(f"{path.as_uri()}?mode=ro&immutable=1", uri=True)
        assert immutable.execute("SELECT a FROM t").fetchall() == [(1,)]  # what immutable=1 alone misses
        immutable.close()
        assert run_query(path, "SELECT a FROM t ORDER BY a").rows == [(1,), (2,)]
        assert [t.name for t in read_schema(path)] == ["t", "u"]
        writer.execute("INSERT INTO t VALUES (3)")
        writer.commit()
        assert run_query(path, "SELECT a FROM t ORDER BY a").rows == [(1,), (2,), (3,)]
        assert failure(path, "INSERT INTO t VALUES (4)").kind == "not_a_query"
        assert failure(path, "WITH x AS (SELECT 1) DELETE FROM t").kind == "refused"
        writer.execute("INSERT INTO t VALUES (5)")  # what the writer sees is still its own
        writer.rollback()
        assert set(beside) == {p.name for p in path.parent.iterdir()}
        assert beside[path.name] == sha256(path)
    finally:
        writer.close()
