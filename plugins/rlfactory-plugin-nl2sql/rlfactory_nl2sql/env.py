"""The env ``nl2sql``: answer questions about a SQLite database with one SQL query.

An episode is a question about one database. The system prompt holds the instruction and
(``schema_in_prompt``) the database's tables; the model may call three tools, through the
run's parser (Qwen3/Hermes ``<tool_call>`` JSON by default):

* ``list_tables()``: every table with its columns;
* ``describe_table(table)``: the table's ``CREATE TABLE`` statement and its first
  ``describe_rows`` rows;
* ``run_query(query)``: runs one read-only query and shows the result as a compact text
  table of at most ``max_rows`` rows (cells cut at ``max_cell_chars``).

Every query runs in the sandbox of :mod:`rlfactory_nl2sql.sandbox` (read-only connection,
authorizer, time/row/size limits); a refused or failing query comes back to the model as a
one-line ``Error: ...`` observation. Malformed arguments (a missing or empty ``query``, an
unknown table) raise ``ToolArgumentsError``, which the tool manager shows the model as
``invalid_arguments``.

A turn without a tool call ends the episode. Its answer is the SQL inside the last
``<answer>...</answer>`` pair (the form the prompt asks for), else in the last fenced
```` ```sql ```` block; a turn with neither gives no answer (the final answer is ``""``).
The ``sql_execution`` reward (:mod:`rlfactory_nl2sql.reward`) runs it against the gold SQL.

Data (``source``): ``builtin`` (default) is the countries dataset built offline by
:mod:`rlfactory_nl2sql.data` (``rlf data build nl2sql``); ``spider`` and ``bird`` read those
datasets' own files from ``data_dir`` (:mod:`rlfactory_nl2sql.formats`).
"""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any, Sequence

from rlfactory_core import (ConfigError, EnvReset, EnvStep, Message, ParsedTurn, RLFactoryError, Sample,
                            ToolArgumentsError, ToolCall, ToolResult, files_fingerprint, get_component,
                            run_in_tool_thread)

from . import data as builtin_data
from .formats import database_dirs_for, database_path, known_databases, load_bird, load_spider
from .reward import SQLExecutionReward
from .sandbox import (QueryLimits, find_table, format_table, read_schema, require_sandbox, run_query, schema_text,
                      table_rows_sql)
from .sqltext import QueryError, extract_sql

__all__ = ["NL2SQLEnv", "ListTablesTool", "DescribeTableTool", "RunQueryTool", "INSTRUCTION",
           "NO_TOOLS_INSTRUCTION", "SOURCES", "DEFAULT_SPLITS", "OPTIONS"]

INSTRUCTION = (
    "Answer the question with one SQLite query. You may call the tools to list the tables, describe a table "
    "and run read-only queries on the database. When you know the query, reply with only the SQL query "
    "inside <answer> and </answer>."
)
NO_TOOLS_INSTRUCTION = (
    "Answer the question with one SQLite query on the database. Reply with only the SQL query inside "
    "<answer> and </answer>."
)
#: Where the samples come from.
SOURCES = ("builtin", "spider", "bird")
#: Split name -> file, per source (relative to ``data_dir``).
DEFAULT_SPLITS: dict[str, dict[str, str]] = {
    "builtin": dict(builtin_data.SPLITS),
    "spider": {"train": "train_spider.json", "test": "dev.json"},
    "bird": {"train": "train.json", "test": "dev.json"},
}
#: The env's options (``env_options``), in the README's order.
OPTIONS = ("source", "data_dir", "db_dir", "splits", "tools", "max_rows", "describe_rows", "time_limit_s",
           "max_cell_chars", "schema_in_prompt", "few_shot", "use_evidence", "parser")
_RESULT_BYTES = 64_000  # what one tool result may fetch; the display cuts further


def _tool_error(exc: QueryError) -> str:
    """The tool error of a failed query: ``sql_<kind>`` (``sql_timeout``, ``sql_refused``,
    ``sql_error`` ...); the tool manager keeps it in the result's ``metadata["tool_error"]``."""
    return exc.kind if exc.kind.startswith("sql_") else f"sql_{exc.kind}"


def _infrastructure(exc: QueryError) -> bool:
    """Whether a failed query is the service's failure (the episode's database cannot be
    opened), not the model's query (an error, a refusal, a limit it ran into: the policy's;
    rlfactory_core.outcomes)."""
    return exc.kind in ("no_database", "sql_no_database")


class _DatabaseTool:
    """A tool on the episode's database (``ctx["state"]["db_path"]``, set by ``reset``).
    ``validate`` checks the arguments before the call (the tool manager uses it)."""

    name = ""
    description = ""
    #: argument name -> description; every argument is required text
    arguments: dict[str, str] = {}

    def __init__(self, env: "NL2SQLEnv"):
        self._env = env
        self.parameters = {
            "type": "object",
            "properties": {key: {"type": "string", "description": text} for key, text in self.arguments.items()},
            "required": list(self.arguments),
            "additionalProperties": False,
        }

    def validate(self, arguments: Any) -> dict[str, str]:
        """The arguments, or ``ToolArgumentsError`` naming what is wrong (one line)."""
        takes = ", ".join(self.arguments) or "no arguments"
        if not isinstance(arguments, dict):
            raise ToolArgumentsError(f"invalid arguments for {self.name}: expected a JSON object ({takes}), "
                                     f"got {type(arguments).__name__}")
        unknown = sorted(set(arguments) - set(self.arguments))
        if unknown:
            raise ToolArgumentsError(f"invalid arguments for {self.name}: unknown argument "
                                     f"{', '.join(map(repr, unknown))}; it takes {takes}")
        for key in self.arguments:
            value = arguments.get(key)
            if value is None:
                raise ToolArgumentsError(f"invalid arguments for {self.name}: {key!r} is missing; "
                                         f"give it as text")
            if not isinstance(value, str):
                raise ToolArgumentsError(f"invalid arguments for {self.name}: {key!r} must be text, "
                                         f"got {type(value).__name__}")
            if not value.strip():
                raise ToolArgumentsError(f"invalid arguments for {self.name}: {key!r} is empty")
        return arguments

    @staticmethod
    def _db_path(ctx: dict[str, Any] | None) -> str:
        state = (ctx or {}).get("state")
        path = state.get("db_path") if isinstance(state, dict) else None
        if not path:
            raise RuntimeError("the nl2sql tools run inside an nl2sql episode: ctx['state']['db_path'] is missing")
        return str(path)

    async def call(self, arguments: dict[str, Any], ctx: dict[str, Any] | None = None) -> ToolResult:
        self.validate(arguments)
        # each tool's blocking ``_run(arguments, db_path)`` runs in the core's tool thread pool
        return await run_in_tool_thread(self._run, arguments, self._db_path(ctx))  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class ListTablesTool(_DatabaseTool):
    name = "list_tables"
    description = "List the tables of the database with their columns."
    arguments: dict[str, str] = {}

    def _run(self, arguments: dict[str, str], db_path: str) -> ToolResult:
        try:
            tables = read_schema(db_path)
        except QueryError as exc:
            return ToolResult(name=self.name, content=f"Error: {exc}", error=_tool_error(exc),
                              infrastructure=_infrastructure(exc))
        return ToolResult(name=self.name, content=schema_text(tables) or "The database has no tables.")


class DescribeTableTool(_DatabaseTool):
    name = "describe_table"
    description = "Show a table's schema (its CREATE TABLE statement) and its first rows."
    arguments = {"table": "the table's name"}

    def _run(self, arguments: dict[str, str], db_path: str) -> ToolResult:
        try:
            tables = read_schema(db_path)
        except QueryError as exc:
            return ToolResult(name=self.name, content=f"Error: {exc}", error=_tool_error(exc),
                              infrastructure=_infrastructure(exc))
        table = find_table(tables, arguments["table"])
        if table is None:
            names = ", ".join(t.name for t in tables) or "none"
            raise ToolArgumentsError(f"describe_table: there is no table named {arguments['table'].strip()!r}; "
                                     f"the tables are: {names}")
        lines = [table.sql or f"CREATE TABLE {table.name} ({', '.join(c.name for c in table.columns)})"]
        rows = self._env.describe_rows
        if rows:
            try:
                result = run_query(db_path, table_rows_sql(table, rows + 1), self._env.display_limits(rows))
            except QueryError as exc:
                return ToolResult(name=self.name, content=f"{lines[0]}\nError: {exc}", error=_tool_error(exc),
                                  infrastructure=_infrastructure(exc))
            lines += [f"First rows of {table.name}:", format_table(result, self._env.max_cell_chars)]
        return ToolResult(name=self.name, content="\n".join(lines))


class RunQueryTool(_DatabaseTool):
    name = "run_query"
    description = "Run one read-only SQLite query (SELECT) on the database and show its result."
    arguments = {"query": "one SQLite SELECT statement"}

    def _run(self, arguments: dict[str, str], db_path: str) -> ToolResult:
        try:
            result = run_query(db_path, arguments["query"], self._env.display_limits(self._env.max_rows))
        except QueryError as exc:
            return ToolResult(name=self.name, content=f"Error: {exc}", error=_tool_error(exc),
                              infrastructure=_infrastructure(exc))
        return ToolResult(name=self.name, content=format_table(result, self._env.max_cell_chars))


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


class NL2SQLEnv:
    """Questions over SQLite databases, answered with one SQL query (see the module docstring).

    :param source: ``builtin`` (the countries dataset built offline), ``spider`` or ``bird``.
    :param data_dir: the dataset's directory: Spider's root (``tables.json``,
        ``train_spider.json``, ``dev.json``, ``database/``) or a BIRD split's directory
        (``dev.json``, ``dev_databases/``); for ``builtin``, where it is built (default
        ``$RLFACTORY_HOME/data/nl2sql``). Required for spider and bird.
    :param db_dir: the databases' directory (``<db_dir>/<db_id>/<db_id>.sqlite``), absolute or
        relative to ``data_dir``; default ``database/`` beside a Spider file,
        ``<stem>_databases/`` (``dev_databases/``) beside a BIRD file.
    :param splits: split name -> file (absolute or relative to ``data_dir``), merged over
        the source's defaults (:data:`DEFAULT_SPLITS`); ``null`` drops a default split.
        The trainer reads ``train`` and ``test``.
    :param tools: offer the tools (off: one turn, the model writes the SQL from the schema).
    :param max_rows: rows ``run_query`` shows.
    :param describe_rows: rows ``describe_table`` shows (0: only the schema).
    :param time_limit_s: the time limit of each query the tools run.
    :param max_cell_chars: longer cells are cut in tool results.
    :param schema_in_prompt: put the tables and their columns into the system prompt.
    :param few_shot: show a worked example (a ``run_query`` call, its result, the answer)
        before the question; it is about the built-in database, so it is shown only in
        episodes on that database.
    :param use_evidence: add BIRD's ``evidence`` to the question as ``Hint: ...``.
    :param parser: the parser that writes the example's tool call. The trainer passes the
        run's ``parser``; setting a different one is a config error.
    """

    name = "nl2sql"
    description = ("NL2SQL: answer questions about SQLite databases with one SQL query, exploring them with "
                   "read-only SQL tools (built-in countries data, Spider or BIRD).")

    #: The config this env runs with unless the user sets otherwise: a CPU run with the embedded
    #: model, training on execution match plus a small format credit, evaluation on execution
    #: match alone (so ``eval/reward/mean`` and ``eval/reward/accuracy`` are execution accuracy).
    config_defaults: dict[str, Any] = {
        "parser": "qwen3",
        "rewards": [{"name": "sql_execution"}],
        "eval": {"rewards": [{"name": "sql_execution", "options": {"format_score": 0.0}}], "every": 3,
                 "temperature": 0.0, "reuse_untrained": True},
        "rollout": {"max_turns": 4, "max_tokens_per_turn": 128, "max_trajectory_tokens": 2048,
                    "sampling": {"temperature": 0.8}},
        "grpo": {"group_size": 8, "prompts_per_step": 4},
        # The base model never answers (0.000): a warm-up on 32 demonstrations (gold query run,
        # then answered) gave 0.56 on validation, 3 RL steps more 0.67 (bench/README.md).
        "cold_start": {"source": "demonstrations", "examples": 32, "lr": 5e-5},
        "train": {"steps": 6, "lr": 1e-5},
        "data": {"eval_size": 64},
        "checkpoint": {"every": 3},
    }

    def __init__(self, source: str = "builtin", data_dir: str | None = None, db_dir: str | None = None,
                 splits: dict[str, str | None] | None = None, tools: bool = True, max_rows: int = 10,
                 describe_rows: int = 3, time_limit_s: float = 2.0, max_cell_chars: int = 40,
                 schema_in_prompt: bool = True, few_shot: bool = True, use_evidence: bool = True,
                 parser: str = "qwen3", **unknown: Any):
        require_sandbox()  # Python 3.11+: stop at startup, not at the first query
        # Unknown options are reported with the other problems, not one TypeError at a time.
        problems = [f"env_options.{key}: unknown option (options: {', '.join(OPTIONS)})" for key in unknown]
        if source not in SOURCES:
            problems.append(f"env_options.source: must be one of {', '.join(SOURCES)}, got {source!r}")
        for key, value in (("tools", tools), ("schema_in_prompt", schema_in_prompt), ("few_shot", few_shot),
                           ("use_evidence", use_evidence)):
            if not _is_bool(value):
                problems.append(f"env_options.{key}: must be true or false, got {value!r}")
        if not _is_int(max_rows, 1, 1000):
            problems.append(f"env_options.max_rows: must be an integer from 1 to 1000, got {max_rows!r}")
        if not _is_int(describe_rows, 0, 100):
            problems.append(f"env_options.describe_rows: must be an integer from 0 to 100, got {describe_rows!r}")
        if not _is_int(max_cell_chars, 8, 10_000):
            problems.append(f"env_options.max_cell_chars: must be an integer from 8 to 10000, got {max_cell_chars!r}")
        if (isinstance(time_limit_s, bool) or not isinstance(time_limit_s, (int, float))
                or not 0 < time_limit_s <= 600):
            problems.append(f"env_options.time_limit_s: must be a number of seconds in (0, 600], got {time_limit_s!r}")

        # data
        self.source = source if source in SOURCES else "builtin"
        self.data_dir: Path | None = None
        if data_dir is not None and not isinstance(data_dir, str):
            problems.append(f"env_options.data_dir: must be a path, got {data_dir!r}")
        elif data_dir is not None:
            self.data_dir = Path(data_dir).expanduser()
        if self.source == "builtin" and self.data_dir is None:
            self.data_dir = builtin_data.default_data_dir()
        if source in ("spider", "bird"):
            if self.data_dir is None:
                problems.append(f"env_options.data_dir: the {source} source needs the directory of its files "
                                f"(e.g. data_dir: ~/data/{source})")
            elif not self.data_dir.is_dir():
                problems.append(f"env_options.data_dir: no directory at {self.data_dir}")
        self.db_dir: Path | None = None
        if db_dir is not None:
            if not isinstance(db_dir, str):
                problems.append(f"env_options.db_dir: must be a path, got {db_dir!r}")
            else:
                self.db_dir = self._resolve(db_dir)
                if not self.db_dir.is_dir():
                    problems.append(f"env_options.db_dir: no directory at {self.db_dir}")
        self.split_files = self._split_files(splits, problems)

        # the parser writes the worked example's tool call
        self.parser: Any = None
        if few_shot is True and tools is True:
            try:
                self.parser = get_component("parser", parser)
            except RLFactoryError as exc:
                problems.append(f"env_options.parser: {exc}")
            else:
                if not callable(getattr(self.parser, "format_tool_call", None)):
                    problems.append(f"env_options.few_shot: the {parser!r} parser cannot write the example's tool "
                                    "call (it has no format_tool_call); set few_shot: false")
        if problems:
            raise ConfigError(problems, hint="see the options table in the rlfactory-plugin-nl2sql README")

        self.use_tools, self.few_shot, self.use_evidence = tools, few_shot, use_evidence
        self.schema_in_prompt = schema_in_prompt
        self.max_rows, self.describe_rows, self.max_cell_chars = max_rows, describe_rows, max_cell_chars
        self.time_limit_s = float(time_limit_s)
        self.tools = [ListTablesTool(self), DescribeTableTool(self), RunQueryTool(self)] if tools else []
        self._built = False
        self._build_lock = threading.Lock()
        self._example: list[Message] | None = None

    # ------------------------------------------------------------------ options

    def _resolve(self, path: str) -> Path:
        given = Path(path).expanduser()
        return given if given.is_absolute() or self.data_dir is None else self.data_dir / given

    def _split_files(self, splits: Any, problems: list[str]) -> dict[str, Path]:
        if splits is not None and not isinstance(splits, dict):
            problems.append(f"env_options.splits: must map split names to files, e.g. {{test: dev.json}}, "
                            f"got {splits!r}")
            splits = None
        merged: dict[str, Any] = {**DEFAULT_SPLITS[self.source], **(splits or {})}
        files: dict[str, Path] = {}
        for split, name in merged.items():
            if name is None:
                continue
            if not isinstance(split, str) or not isinstance(name, str) or not name.strip():
                problems.append(f"env_options.splits.{split}: must be a file name, got {name!r}")
                continue
            path = self._resolve(name)
            # the built-in files appear when the data is built; the others must exist now
            if self.source != "builtin" and self.data_dir is not None and self.data_dir.is_dir() \
                    and not path.is_file():
                problems.append(f"env_options.splits.{split}: no file {path}; set splits: {{{split}: FILE}} "
                                f"(relative to data_dir or absolute), or {{{split}: null}} to drop it")
            files[split] = path
        return files

    def display_limits(self, rows: int) -> QueryLimits:
        """The limits of a query a tool runs for the model (``rows`` shown at most)."""
        return QueryLimits(time_limit_s=self.time_limit_s, max_rows=rows, max_bytes=_RESULT_BYTES,
                           overflow="truncate")

    def _format(self) -> str:
        return "bird" if self.source == "bird" else "spider"

    def database_dirs(self) -> list[Path]:
        """Where db_ids are looked up: ``db_dir``, else the default places beside the split files."""
        if self.db_dir is not None:
            return [self.db_dir]
        dirs: list[Path] = []
        for path in self.split_files.values():
            dirs += database_dirs_for(path, self._format())
        if self.source == "builtin" and self.data_dir is not None:
            dirs.append(self.data_dir / "database")
        return list(dict.fromkeys(dirs))

    def _ensure_built(self) -> None:
        if self.source != "builtin" or self._built:
            return
        with self._build_lock:
            if not self._built:
                builtin_data.build(self.data_dir)
                self._built = True

    # ------------------------------------------------------------------ data

    @staticmethod
    def build_data(out_dir: Path | None = None, force: bool = False, progress: Any = None) -> Path:
        """Build the built-in dataset (``rlf data build nl2sql``); returns its directory."""
        return builtin_data.build(out_dir, force=force, progress=progress)

    def dataset(self, size: int | None = None, split: str = "train") -> list[dict[str, Any]]:
        """``size`` samples of ``split`` (all when ``size`` is None or larger): the first ones
        of the built-in split (already shuffled), or a fixed random subset of a Spider/BIRD
        file (those are ordered by database). Builds the built-in data on first use."""
        if split not in self.split_files:
            known = ", ".join(self.split_files) or "none"
            raise ConfigError([f"env_options.splits: the nl2sql env has no {split!r} split (splits: {known}); "
                               f"add it, e.g. splits: {{{split}: dev.json}}"])
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
            raise ConfigError([f"the number of samples must be a whole number >= 0, got {size!r}"])
        self._ensure_built()
        path = self.split_files[split]
        dirs = [self.db_dir] if self.db_dir is not None else None
        if self.source == "bird":
            samples = load_bird(path, db_dir=dirs[0] if dirs else None)
        else:
            samples = load_spider(path, db_dir=dirs[0] if dirs else None, source=self.source)
        if size is None or size >= len(samples):
            return samples
        if self.source == "builtin":
            return samples[:size]
        return random.Random(f"nl2sql:{split}").sample(samples, size)

    def resolve_database(self, sample: Sample) -> Path:
        """The database file of ``sample``: its ``db_path``, else its ``db_id`` looked up in
        :meth:`database_dirs`. ``ValueError`` (one line) when there is none."""
        label = f"nl2sql sample {sample.get('id', '?')}"
        given = sample.get("db_path")
        if given:
            path = Path(str(given)).expanduser()
            if not path.is_file():
                raise ValueError(f"{label}: its db_path {path} does not exist; fix the sample or give its db_id")
            return path
        db_id = sample.get("db_id")
        if not isinstance(db_id, str) or not db_id.strip():
            raise ValueError(f"{label}: needs a 'db_id' (or a 'db_path'), got keys {sorted(sample)}")
        self._ensure_built()
        dirs = self.database_dirs()
        path = database_path(dirs, db_id.strip())
        if path is None:
            shown = ", ".join(known_databases(dirs)[:8]) or "none"
            raise ValueError(f"{label}: unknown db_id {db_id!r}: no {db_id}/{db_id}.sqlite in "
                             f"{' or '.join(map(str, dirs)) or 'no database directory'} (databases there: {shown}); "
                             "check env_options.data_dir / db_dir")
        return path

    def data_fingerprint(self, samples: Sequence[Sample]) -> str:
        """The databases the episodes of ``samples`` open and the reward checks on (each
        sample's and its check copy), fingerprinted: ``eval.reuse_untrained`` keys on it."""
        paths = {self.resolve_database(sample) for sample in samples}
        paths |= {Path(str(sample["check_db_path"])) for sample in samples if sample.get("check_db_path")}
        return files_fingerprint(paths)

    # ------------------------------------------------------------------ episodes

    def _example_messages(self, db_path: Path) -> list[Message]:
        """The worked example on the built-in database, in the run parser's format."""
        if self._example is None:
            sql = builtin_data.EXAMPLE_SQL
            messages = [Message(role="user", content=f"Question: {builtin_data.EXAMPLE_QUESTION}")]
            if self.use_tools:
                result = format_table(run_query(db_path, sql, self.display_limits(self.max_rows)),
                                      self.max_cell_chars)
                call = ToolCall(name="run_query", arguments={"query": sql}, id="example")
                messages.append(Message(role="assistant", content=self.parser.format_tool_call(call)))
                messages += self.parser.render_tool_results([ToolResult(name="run_query", content=result,
                                                                        call_id="example")])
            messages.append(Message(role="assistant", content=f"<answer>{sql}</answer>"))
            self._example = messages
        return list(self._example)

    async def reset(self, sample: Sample) -> EnvReset:
        if not hasattr(sample, "get"):
            raise ValueError(f"an nl2sql sample must be a mapping with 'question' and 'db_id', got "
                             f"{type(sample).__name__}")
        question = sample.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"nl2sql sample {sample.get('id', '?')}: needs a 'question' (text), "
                             f"got keys {sorted(sample)}")
        db_path = await run_in_tool_thread(self.resolve_database, sample)
        try:
            tables = await run_in_tool_thread(read_schema, db_path)
        except QueryError as exc:
            raise ValueError(f"nl2sql sample {sample.get('id', '?')}: {exc}") from None
        db_id = str(sample.get("db_id") or Path(db_path).stem)
        system = INSTRUCTION if self.use_tools else NO_TOOLS_INSTRUCTION
        if self.schema_in_prompt:
            system += f"\n\nDatabase {db_id}, its tables and columns:\n{schema_text(tables)}"
        messages = [Message(role="system", content=system)]
        if self.few_shot and self.source == "builtin" and db_id == builtin_data.DB_ID:
            messages += await run_in_tool_thread(self._example_messages, db_path)
        text = f"Question: {question.strip()}"
        evidence = sample.get("evidence")
        if self.use_evidence and isinstance(evidence, str) and evidence.strip():
            text += f"\nHint: {evidence.strip()}"
        messages.append(Message(role="user", content=text))
        state = {"db_id": db_id, "db_path": str(db_path), "tool_turns": 0}
        return EnvReset(messages=messages, tools=list(self.tools), state=state)

    async def demonstration(self, sample: Sample, parser: Any) -> list[str] | None:
        """A worked episode for the cold start (``cold_start.source``): the gold SQL run with
        ``run_query`` (the call written by the run's ``parser``), then ``<answer>SQL</answer>``.
        The core replays these turns through the agent loop, so the query really runs and the
        model is trained on its real result. None without a gold query, or when the call
        cannot be written (no tools, a parser without ``format_tool_call``)."""
        gold = SQLExecutionReward.gold_sql(sample) if hasattr(sample, "get") else None
        if gold is None:
            return None
        answer = f"<answer>{gold}</answer>"
        if not self.use_tools:
            return [answer]
        if not callable(getattr(parser, "format_tool_call", None)):
            return None
        return [parser.format_tool_call(ToolCall(name="run_query", arguments={"query": gold})), answer]

    async def step(self, state: Any, turn: ParsedTurn, results: Sequence[ToolResult]) -> EnvStep:
        if turn.tool_calls or turn.errors:
            state["tool_turns"] += 1
            return EnvStep()  # the rollout shows the results (or the parse errors)
        sql, _ = extract_sql(turn.content)
        return EnvStep(done=True, final_answer=sql)

    async def close(self, state: Any) -> None:
        """Nothing per episode: every query opens and closes its own read-only connection."""

    def __repr__(self) -> str:
        return f"NL2SQLEnv(source={self.source!r}, data_dir={str(self.data_dir)!r}, tools={self.use_tools})"

