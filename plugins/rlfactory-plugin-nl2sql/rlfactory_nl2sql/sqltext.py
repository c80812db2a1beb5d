"""SQL as text: the statement gate, ORDER BY detection, literals, and the SQL in a model's answer.

Everything that reads SQL without running it lives here, and uses ``sqlglot`` (SQLite
dialect) where SQL must be parsed or normalised:

* :func:`check_query` is the first layer of the sandbox (:mod:`rlfactory_nl2sql.sandbox`):
  text SQLite can take (at most :data:`MAX_SQL_BYTES` of UTF-8, no NUL), checked before
  anything parses it, then one statement, and it must be a query (``SELECT``, ``WITH ...``,
  ``VALUES``). The statement rules only make the refusal message clear; the read-only
  connection and the authorizer enforce them.
* :func:`orders_rows` tells whether a query orders its result at the top level (the
  reward then compares rows in order).
* :func:`extract_sql` finds the final SQL in a model turn: the last ``<answer>...</answer>``
  pair, else the last fenced ```` ```sql ```` block.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from typing import Literal

__all__ = [
    "QueryError",
    "MAX_SQL_BYTES",
    "QUERY_KEYWORDS",
    "check_text",
    "check_query",
    "orders_rows",
    "normalise_sql",
    "sql_string",
    "quote_identifier",
    "extract_sql",
    "AnswerForm",
]

#: Longest SQL text accepted, in bytes of UTF-8 (also SQLite's SQLITE_LIMIT_SQL_LENGTH).
MAX_SQL_BYTES = 100_000
#: The first keyword of a statement the sandbox runs.
QUERY_KEYWORDS = ("SELECT", "WITH", "VALUES")

AnswerForm = Literal["answer_tag", "sql_block"]

_ANSWER_OPEN = re.compile(r"<answer>", re.I)
_ANSWER_CLOSE = re.compile(r"</answer>", re.I)
_SQL_BLOCK = re.compile(r"```[ \t]*sql[ \t]*\n?(.*?)```", re.S | re.I)
_ANY_BLOCK = re.compile(r"^\s*```[^\n`]*\n?(.*?)```\s*$", re.S)
_THINK = re.compile(r"<think>.*?(</think>|$)", re.S)
_ONE_LINE = re.compile(r"\s+")


class QueryError(Exception):
    """A query the sandbox refused or that failed. ``kind`` names the failure (one of
    :data:`rlfactory_nl2sql.sandbox.ERROR_KINDS`); the message is one line, written for the
    model: what is wrong and what to do."""

    def __init__(self, kind: str, message: str):
        message = _ONE_LINE.sub(" ", message).strip()
        super().__init__(message)
        self.kind = kind
        self.message = message

    def __str__(self) -> str:
        return self.message


def _tokens(sql: str) -> list[tuple[str, str]] | None:
    """``(token type, text)`` of ``sql`` by sqlglot's SQLite tokenizer (comments dropped);
    None when it cannot tokenize the text (SQLite then reports the error itself)."""
    try:
        from sqlglot.dialects.sqlite import SQLite

        return [(t.token_type.name, t.text) for t in SQLite().tokenize(sql)]
    except Exception:  # noqa: BLE001 - any tokenizer failure: leave the verdict to SQLite
        return None


def check_text(sql: object) -> str:
    """``sql`` if it is text SQLite can take, else :class:`QueryError`; costs one pass over
    the text at most, so that it runs before anything parses the SQL (sqlglot's tokenizer
    takes seconds and gigabytes on megabytes of text).

    Kinds: ``empty`` (not text, or only white space), ``too_large`` (more than
    :data:`MAX_SQL_BYTES` bytes) and ``sql_error`` (a character UTF-8 cannot encode, such as
    a lone surrogate from a JSON ``\\ud800`` escape, or a NUL character, which would cut the
    statement short in SQLite).
    """
    if not isinstance(sql, str):
        raise QueryError("empty", "the query is empty; write one SELECT statement")
    too_long = f"the SQL text is longer than the limit of {MAX_SQL_BYTES:,} bytes; write a shorter query"
    if len(sql) > MAX_SQL_BYTES:  # every character is at least one byte of UTF-8
        raise QueryError("too_large", too_long)
    if not sql.strip():
        raise QueryError("empty", "the query is empty; write one SELECT statement")
    try:
        size = len(sql.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise QueryError("sql_error", f"the query holds a character that is not valid text "
                                      f"(U+{ord(sql[exc.start]):04X}, a lone surrogate, at position {exc.start}); "
                                      "write the query as plain text") from None
    if size > MAX_SQL_BYTES:
        raise QueryError("too_large", too_long)
    if "\x00" in sql:
        raise QueryError("sql_error", f"the query holds a NUL character (at position {sql.index(chr(0))}); "
                                      "remove it")
    return sql


def check_query(sql: object) -> str:
    """``sql`` stripped, if it is one query statement; else :class:`QueryError`.

    Kinds: those of :func:`check_text` (checked first), ``empty``, ``multiple_statements``
    (a second statement after a ``;``) and ``not_a_query`` (the statement does not start
    with SELECT, WITH or VALUES).
    """
    sql = check_text(sql)
    tokens = _tokens(sql)
    if tokens is not None:
        statements: list[list[tuple[str, str]]] = [[]]
        for kind, text in tokens:
            if kind == "SEMICOLON":
                statements.append([])
            else:
                statements[-1].append((kind, text))
        statements = [s for s in statements if s]
        if not statements:
            raise QueryError("empty", "the query holds no statement; write one SELECT statement")
        if len(statements) > 1:
            raise QueryError("multiple_statements", f"only one statement may run at a time, got {len(statements)}; "
                                                    "remove everything after the first ';'")
        words = [text for kind, text in statements[0] if kind != "L_PAREN"]
        first = words[0].upper() if words else ""
        if first not in QUERY_KEYWORDS:
            shown = first if re.fullmatch(r"[A-Z_]+", first) else repr(first[:20])
            raise QueryError("not_a_query", f"only read-only queries may run (SELECT or WITH ... SELECT), "
                                            f"this statement starts with {shown}")
    return sql.strip()


def orders_rows(sql: str) -> bool:
    """Whether ``sql`` orders its result at the top level (an ``ORDER BY`` of the outermost
    query, also after a ``WITH`` or on a ``UNION``); an ``ORDER BY`` inside a subquery does
    not count. SQL that sqlglot cannot parse is read with a fallback that ignores string
    literals and everything in parentheses."""
    try:
        import sqlglot
        from sqlglot import exp

        parsed = [e for e in sqlglot.parse(sql, read="sqlite") if e is not None]
        if parsed:
            root = parsed[0]
            while isinstance(root, (exp.Subquery, exp.Paren)) and root.this is not None:
                if root.args.get("order"):
                    return True
                root = root.this
            return bool(root.args.get("order"))
    except Exception:  # noqa: BLE001 - sqlglot does not know every SQLite construct (RecursionError too)
        pass
    return re.search(r"\border\s+by\b", _top_level(sql), re.I) is not None


def _top_level(sql: str) -> str:
    """``sql`` with string literals emptied and every balanced parenthesised part replaced
    by ``()`` (unbalanced parentheses stay), in one pass: a loop of innermost-first
    substitutions is quadratic in the nesting depth."""
    text = re.sub(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"", "''", sql)
    opened: list[int] = []
    pairs: list[tuple[int, int]] = []
    for match in re.finditer(r"[()]", text):
        if match.group() == "(":
            opened.append(match.start())
        elif opened:
            pairs.append((opened.pop(), match.start()))
    kept, end = [], 0
    for start, stop in sorted(pairs):
        if start >= end:  # an outermost pair: the pairs inside it end before it does
            kept.append(text[end:start] + "()")
            end = stop + 1
    kept.append(text[end:])
    return "".join(kept)


def normalise_sql(sql: str) -> str:
    """``sql`` as sqlglot writes it in the SQLite dialect (one line, keywords upper case);
    ``sql`` itself when sqlglot cannot read it."""
    try:
        import sqlglot

        written = sqlglot.transpile(sql, read="sqlite", write="sqlite")
        return written[0] if len(written) == 1 and written[0] else sql.strip()
    except Exception:  # noqa: BLE001
        return sql.strip()


def sql_string(value: str) -> str:
    """``value`` as an SQL string literal (``'it''s'``)."""
    return "'" + value.replace("'", "''") + "'"


def quote_identifier(name: str) -> str:
    """``name`` as a quoted SQL identifier (``"my table"``)."""
    return '"' + name.replace('"', '""') + '"'


def _clean(sql: str) -> str:
    sql = sql.strip()
    block = _ANY_BLOCK.match(sql)  # <answer>```sql ... ```</answer>
    if block:
        sql = block.group(1).strip()
    while sql.endswith(";"):
        sql = sql[:-1].rstrip()
    return sql


def extract_sql(text: str | None) -> tuple[str, AnswerForm | None]:
    """The final SQL of a model turn and the form it was given in.

    The SQL is the content of the last ``<answer>...</answer>`` pair outside ``<think>``
    (form ``answer_tag``; a fenced block inside the tags is unwrapped), else of the last
    fenced ```` ```sql ```` block (form ``sql_block``); trailing semicolons are dropped.
    ``("", None)`` when the turn has neither, or only empty ones.
    """
    if not isinstance(text, str):
        return "", None
    visible = _THINK.sub("", text)
    for found, form in ((_answer_tags(visible), "answer_tag"), (_SQL_BLOCK.findall(visible), "sql_block")):
        found = [sql for sql in map(_clean, found) if sql]
        if found:
            return found[-1], form  # type: ignore[return-value]
    return "", None


def _answer_tags(text: str) -> list[str]:
    """The contents of the ``<answer>...</answer>`` pairs of ``text``, left to right (what
    ``re.findall(r"<answer>(.*?)</answer>")`` gives), in linear time: that regex scans to
    the end of the text from every ``<answer>`` that is never closed."""
    closes = [m.start() for m in _ANSWER_CLOSE.finditer(text)]
    found, end, k = [], 0, 0
    for opening in _ANSWER_OPEN.finditer(text):
        if opening.start() < end:  # inside the previous pair
            continue
        k = bisect_left(closes, opening.end(), k)
        if k == len(closes):
            break  # no pair opens after the last closing tag
        found.append(text[opening.end():closes[k]])
        end = closes[k] + len("</answer>")
    return found
