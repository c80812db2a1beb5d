"""The ``sql_execution`` reward: execution accuracy, verified by running both queries.

For a trajectory of a sample with gold SQL (``query``, or BIRD's ``SQL``):

1. The predicted SQL is the trajectory's final answer (the nl2sql env takes it from the last
   ``<answer>`` pair, else the last ```` ```sql ```` block; an answer that still holds such a
   tag or block is unwrapped).
2. Both queries run in the sandbox (:mod:`rlfactory_nl2sql.sandbox`) on the episode's
   database (the env's ``state["db_path"]``, else the sample's ``db_path``), with this
   reward's ``time_limit_s``, ``max_rows`` and ``max_bytes`` (a result beyond them is an error,
   never a silently cut result). The gold result is cached per database and query.
3. When the sample names a **check database** (``check_db_path``, from a row's
   ``check_db_id``: the same schema with other facts, as every built-in question has), a
   query that matches is run there too, and counts only when it matches the gold SQL's
   result there as well: a constant (``SELECT 'Andorra la Vella'``) or a result copied from a
   tool call is right on one database only (component ``check_db_mismatch``).
4. The results match when they hold the same rows: as multisets (any order), or as lists
   when the gold query orders its result at the top level (an ``ORDER BY`` of the outermost
   query, found with sqlglot). Columns are compared by position, their names ignored; floats
   are rounded to ``float_digits`` decimals, and a whole float equals the integer (``2.0`` =
   ``2``).

Values, with ``f = format_score`` (0.1 by default):

* no answer (no ``<answer>`` pair or ```` ```sql ```` block): ``0``, not correct;
* the SQL fails (refused, SQL error, timeout, too many rows or bytes): ``0``, not correct;
* the SQL runs and returns a different result: ``f x F``, not correct;
* the SQL runs and returns the gold SQL's result: ``1 + f x F``, correct.

``F`` is 1 when the last model turn gives the SQL in the documented form (one of the two
above), else 0 (an answer taken from bare text by another env). So the best score is 1.1,
and with ``format_score: 0`` the value is execution accuracy itself (the env's evaluation
setting). ``correct`` drives ``reward/accuracy``: execution accuracy.

Components, each 1 or 0 per trajectory, so their logged means
(``reward/sql_execution/<component>``) are rates: ``execution_match``, ``format``,
``no_answer``, ``execution_error`` (the predicted SQL was refused or failed, timeouts aside),
``timeout`` and ``check_db_mismatch`` (right on the real database, wrong on the check copy).
The failure's kind and one-line message are also written to the
trajectory's ``metadata["sql_execution"]``. A sample without gold SQL: the reward does not
apply (``None``). A gold SQL that fails is a dataset problem: the reward raises, the reward
layer counts it in ``reward/errors`` and records the message in the scored batch's
``reward_errors`` (written with the eval samples).
"""

from __future__ import annotations

import math
import threading
from collections import Counter, OrderedDict
from typing import Any

from rlfactory_core import ConfigError, RewardOutput, Sample, Trajectory

from .sandbox import QueryLimits, QueryResult, require_sandbox, run_query
from .sqltext import QueryError, extract_sql, orders_rows

__all__ = ["SQLExecutionReward", "normalise_rows", "same_result", "GOLD_KEYS"]

#: The reward's options.
OPTIONS = ("format_score", "time_limit_s", "max_rows", "max_bytes", "float_digits")
#: Sample keys that hold the gold SQL, in order of preference (Spider's, BIRD's).
GOLD_KEYS = ("query", "SQL")
_GOLD_CACHE_SIZE = 4096


def _cell(value: Any, digits: int) -> Any:
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        rounded = round(value, digits)
        return int(rounded) if rounded.is_integer() and abs(rounded) < 2 ** 63 else rounded
    return value


def normalise_rows(rows: list[tuple[Any, ...]], digits: int = 6) -> list[tuple[Any, ...]]:
    """Rows with floats rounded to ``digits`` decimals and whole floats as integers."""
    return [tuple(_cell(v, digits) for v in row) for row in rows]


def same_result(predicted: list[tuple[Any, ...]], gold: list[tuple[Any, ...]], ordered: bool) -> bool:
    """Whether two normalised results hold the same rows: in order when ``ordered``, else as
    multisets (a row appearing twice must appear twice)."""
    if ordered:
        return predicted == gold
    return len(predicted) == len(gold) and Counter(predicted) == Counter(gold)


def _problems(format_score: Any, time_limit_s: Any, max_rows: Any, max_bytes: Any, float_digits: Any) -> list[str]:
    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    def integer(value: Any, low: int) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= low

    problems = []
    if not number(format_score) or not 0 <= format_score <= 1:
        problems.append(f"format_score must be a number in [0, 1] (0.1 by default), got {format_score!r}")
    if not number(time_limit_s) or not 0 < time_limit_s <= 600:
        problems.append(f"time_limit_s must be a number of seconds in (0, 600], got {time_limit_s!r}")
    if not integer(max_rows, 1):
        problems.append(f"max_rows must be an integer >= 1, got {max_rows!r}")
    if not integer(max_bytes, 1024):
        problems.append(f"max_bytes must be an integer >= 1024, got {max_bytes!r}")
    if not integer(float_digits, 0) or float_digits > 15:
        problems.append(f"float_digits must be an integer from 0 to 15, got {float_digits!r}")
    return problems


class SQLExecutionReward:
    """Execution accuracy plus a small format credit (see the module docstring).

    :param format_score: the credit for an answer in the documented form whose SQL runs.
    :param time_limit_s: time limit of each query (predicted and gold).
    :param max_rows: rows a result may have; more is an error (``too_many_rows``).
    :param max_bytes: bytes a result may have; more is an error (``too_large``).
    :param float_digits: decimals floats are compared to.
    """

    name = "sql_execution"
    description = ("Execution accuracy: 1 when the predicted SQL returns the gold SQL's rows (in order when the "
                   "gold orders them), plus a small format credit; errors and timeouts score 0.")

    def __init__(self, format_score: float = 0.1, time_limit_s: float = 5.0, max_rows: int = 10_000,
                 max_bytes: int = 16_000_000, float_digits: int = 6, **unknown: Any):
        require_sandbox()  # Python 3.11+: stop at startup, not at the first trajectory
        problems = _problems(format_score, time_limit_s, max_rows, max_bytes, float_digits)
        problems += [f"{key}: unknown option (options: {', '.join(OPTIONS)})" for key in unknown]
        if problems:
            raise ConfigError(problems, hint="see the sql_execution reward in the rlfactory-plugin-nl2sql README")
        self.format_score = float(format_score)
        self.float_digits = float_digits
        self.limits = QueryLimits(time_limit_s=float(time_limit_s), max_rows=max_rows, max_bytes=max_bytes,
                                  overflow="error")
        self._gold: OrderedDict[tuple[str, str], tuple[list[tuple[Any, ...]], bool]] = OrderedDict()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ parts

    @staticmethod
    def gold_sql(sample: Sample) -> str | None:
        """The sample's gold SQL, or None when it has none."""
        for key in GOLD_KEYS:
            value = sample.get(key) if hasattr(sample, "get") else None
            if isinstance(value, str) and value.strip():
                return value.strip()
        return None

    @staticmethod
    def database(sample: Sample, context: Any = None) -> str:
        """The episode's database: the env's ``state["db_path"]``, else the sample's ``db_path``."""
        state = getattr(context, "state", None)
        path = state.get("db_path") if isinstance(state, dict) else None
        path = path or (sample.get("db_path") if hasattr(sample, "get") else None)
        if not path:
            raise ValueError(f"sample {sample.get('id', '?')} has no database: run it in the nl2sql env "
                             "(which resolves its db_id) or give the sample a db_path")
        return str(path)

    @staticmethod
    def predicted_sql(trajectory: Trajectory) -> str:
        """The SQL of the trajectory's final answer ("" when there is none)."""
        answer = trajectory.final_answer
        if not isinstance(answer, str) or not answer.strip():
            return ""
        sql, form = extract_sql(answer)
        if form is None:
            sql = answer.strip()
            while sql.endswith(";"):
                sql = sql[:-1].rstrip()
        return sql

    @staticmethod
    def answer_form_ok(trajectory: Trajectory) -> bool:
        """Whether the last model turn gives the SQL in an ``<answer>`` pair or a ```sql block."""
        replies = [m.content for m in trajectory.messages if m.role == "assistant"]
        if not trajectory.num_turns or not replies:
            return False
        return extract_sql(replies[-1])[1] is not None

    def _gold_result(self, db_path: str, sql: str, sample: Sample) -> tuple[list[tuple[Any, ...]], bool]:
        key = (db_path, sql)
        with self._lock:
            if key in self._gold:
                self._gold.move_to_end(key)
                return self._gold[key]
        try:
            result = run_query(db_path, sql, self.limits)
        except QueryError as exc:
            raise RuntimeError(f"the gold SQL of sample {sample.get('id', '?')} failed on {db_path}: {exc}; "
                               "fix or drop this dataset row") from None
        entry = (normalise_rows(result.rows, self.float_digits), orders_rows(sql))
        with self._lock:
            self._gold[key] = entry
            while len(self._gold) > _GOLD_CACHE_SIZE:
                self._gold.popitem(last=False)
        return entry

    def _matches_on_check(self, check_path: str, predicted: str, gold: str, sample: Sample,
                          trajectory: Trajectory) -> bool:
        """Whether the predicted SQL also returns the gold SQL's result on the sample's check
        database (same schema, other facts): a constant or a copied result does not."""
        gold_rows, ordered = self._gold_result(check_path, gold, sample)
        try:
            result = run_query(check_path, predicted, self.limits)
        except QueryError as exc:
            trajectory.metadata["sql_execution"] = {"error_kind": exc.kind, "error": exc.message,
                                                    "database": "check"}
            return False
        if same_result(normalise_rows(result.rows, self.float_digits), gold_rows, ordered):
            return True
        trajectory.metadata["sql_execution"] = {"error_kind": "check_db_mismatch",
                                                "error": "the query returns the gold result on the real database "
                                                         "but not on the check copy (a constant or copied result?)"}
        return False

    # ------------------------------------------------------------------ score

    def score(self, trajectory: Trajectory, sample: Sample, context: Any = None) -> RewardOutput | None:
        """The reward of ``trajectory`` (see the module docstring). Blocking: the reward
        layer runs it in a thread."""
        gold = self.gold_sql(sample)
        if gold is None:
            return None
        db_path = self.database(sample, context)
        components = {"execution_match": 0.0, "format": 0.0, "no_answer": 0.0, "execution_error": 0.0,
                      "timeout": 0.0, "check_db_mismatch": 0.0}
        predicted = self.predicted_sql(trajectory)
        if not predicted:
            components["no_answer"] = 1.0
            return RewardOutput(value=0.0, components=components, correct=False)
        gold_rows, ordered = self._gold_result(db_path, gold, sample)
        try:
            result: QueryResult = run_query(db_path, predicted, self.limits)
        except QueryError as exc:
            components["timeout" if exc.kind == "timeout" else "execution_error"] = 1.0
            trajectory.metadata["sql_execution"] = {"error_kind": exc.kind, "error": exc.message}
            return RewardOutput(value=0.0, components=components, correct=False)
        match = same_result(normalise_rows(result.rows, self.float_digits), gold_rows, ordered)
        check_path = sample.get("check_db_path") if hasattr(sample, "get") else None
        if match and check_path:
            match = self._matches_on_check(str(check_path), predicted, gold, sample, trajectory)
            components["check_db_mismatch"] = float(not match)
        components["execution_match"] = float(match)
        components["format"] = float(self.answer_form_ok(trajectory))
        value = float(match) + self.format_score * components["format"]
        return RewardOutput(value=value, components=components, correct=match)
