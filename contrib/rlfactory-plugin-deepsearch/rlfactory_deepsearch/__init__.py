"""RLFactory plugin: the ``deepsearch`` env, the Search-R1 task, runnable offline.

Installing this distribution (``make install`` does by default) registers:

* the env ``deepsearch`` (:mod:`rlfactory_deepsearch.env`): ``rlf train --env deepsearch``;
* the parser ``search_r1`` (:mod:`rlfactory_deepsearch.parser`): Search-R1's own
  ``<search> query </search>`` / ``<information>`` tags, which small models follow far more
  reliably than JSON tool calls;
* the reward ``search_r1`` (:mod:`rlfactory_deepsearch.reward`): exact match plus RL-Factory's
  Search-R1 format terms, the env's training reward;
* the command ``rlf retriever serve`` (:mod:`rlfactory_deepsearch.cli_retriever`): a retriever
  server speaking Search-R1's ``/retrieve`` API.

The dataset (``rlf data build deepsearch``) is built from the PyPI package ``countryinfo``
(:mod:`rlfactory_deepsearch.data`); Search-R1's own files load too
(:mod:`rlfactory_deepsearch.search_r1_format`).
"""

from __future__ import annotations

from rlfactory_core import hookimpl

from .env import DeepSearchEnv, SearchTool
from .parser import SearchR1Parser
from .reward import SearchR1Reward

#: the plugin API versions this plugin works with (checked when rlfactory loads it)
rlfactory_api = ">=1.3,<2"  # CALL_ERRORS came in 1.3

__all__ = ["DeepSearchEnv", "SearchTool", "SearchR1Parser", "SearchR1Reward", "rlfactory_register_envs",
           "rlfactory_register_parsers", "rlfactory_register_rewards", "rlfactory_register_commands"]


@hookimpl
def rlfactory_register_envs(register):
    register(DeepSearchEnv)


@hookimpl
def rlfactory_register_parsers(register):
    register(SearchR1Parser())


@hookimpl
def rlfactory_register_rewards(register):
    register(SearchR1Reward)


@hookimpl
def rlfactory_register_commands(app):
    from .cli_retriever import app as retriever_app

    app.add_typer(retriever_app, name="retriever")
