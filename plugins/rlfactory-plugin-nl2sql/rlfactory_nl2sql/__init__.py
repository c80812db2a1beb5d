"""RLFactory plugin: the ``nl2sql`` env and the ``sql_execution`` reward.

Installing this distribution (``make install`` does by default) registers:

* the env ``nl2sql`` (:mod:`rlfactory_nl2sql.env`): questions over SQLite databases answered
  with one SQL query, with the tools ``list_tables``, ``describe_table`` and ``run_query``
  running in a read-only sandbox (:mod:`rlfactory_nl2sql.sandbox`): ``rlf train --env nl2sql``;
* the reward ``sql_execution`` (:mod:`rlfactory_nl2sql.reward`): runs the predicted and the
  gold SQL and compares their results (execution accuracy), plus a small format credit.

Data: a countries database with questions and gold SQL built offline from the PyPI packages
``countryinfo`` and ``pycountry`` (``rlf data build nl2sql``, :mod:`rlfactory_nl2sql.data`),
or Spider's and BIRD's own files (:mod:`rlfactory_nl2sql.formats`).
"""

from __future__ import annotations

from rlfactory_core import hookimpl

from .env import DescribeTableTool, ListTablesTool, NL2SQLEnv, RunQueryTool
from .reward import SQLExecutionReward
from .sandbox import QueryLimits, QueryResult, run_query
from .sqltext import QueryError, extract_sql, orders_rows

#: the plugin API versions this plugin works with (checked when rlfactory loads it)
rlfactory_api = ">=1.3,<2"  # ToolResult.infrastructure came in 1.3

__all__ = [
    "NL2SQLEnv",
    "SQLExecutionReward",
    "ListTablesTool",
    "DescribeTableTool",
    "RunQueryTool",
    "QueryError",
    "QueryLimits",
    "QueryResult",
    "run_query",
    "extract_sql",
    "orders_rows",
    "rlfactory_register_envs",
    "rlfactory_register_rewards",
]


@hookimpl
def rlfactory_register_envs(register):
    register(NL2SQLEnv)


@hookimpl
def rlfactory_register_rewards(register):
    register(SQLExecutionReward)
