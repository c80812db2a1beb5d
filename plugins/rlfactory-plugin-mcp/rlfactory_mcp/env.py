"""The env ``mcp``: questions answered with the tools of any MCP servers.

Bring an MCP config file and a JSONL file of tasks; nothing else::

    rlf train --env mcp env_options.mcp_config=servers.json env_options.data=tasks.jsonl

Each task row has a ``question`` and its gold answer(s) (``answer``, ``answers`` or
``golden_answers``). An episode shows the system prompt and the question; the model calls
the servers' tools (through the run's parser) for as many turns as ``rollout.max_turns``
allows; a turn without a tool call ends the episode, and its answer is the text inside its
last ``<answer>...</answer>`` (or, with ``answer_tags: false``, the whole turn).

The reward is ``exact_match`` by default (``config_defaults``); any other, a model judge
(``qwq_judge``) included, is a config change. Evaluation uses ``test_data`` when given,
else a fixed held-out share (``test_fraction``) of ``data``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Sequence

from rlfactory_core import (ConfigError, EnvReset, EnvStep, Message, ParsedTurn, Sample, ToolResult,
                            last_tag_content)

from .client import MCPToolset, ServerOptions, load_mcp_tools

__all__ = ["MCPEnv", "DEFAULT_SYSTEM_PROMPT"]

DEFAULT_SYSTEM_PROMPT = ("Answer the question. Call the tools when they help; you may call them as often as you "
                         "need. Then give only the final answer inside <answer> and </answer>.")
_GOLD_KEYS = ("golden_answers", "answers", "answer")


class MCPEnv:
    """Tasks from a JSONL file, tools from an MCP config (see the module docstring).

    :param mcp_config: the MCP config: ``{"mcpServers": {...}}`` JSON, or RL-Factory's
        ``mcp_tools.pydata``.
    :param data: the tasks, JSONL: ``question`` plus gold answer(s).
    :param test_data: held-out tasks; default: ``test_fraction`` of ``data``, chosen by a
        hash of each task's id (fixed across runs, never in training).
    :param test_fraction: the held-out share of ``data`` when there is no ``test_data``.
    :param servers: per-server run options by server name (``"*"``: all): ``pool_size``
        (processes for servers that handle one call at a time), ``timeout_s``,
        ``connect_timeout_s``, ``probe_timeout_s``.
    :param tools: offer only these tools (names after namespacing); default all.
    :param system_prompt: the instruction before each question.
    :param answer_tags: read the answer from ``<answer>`` tags (else the final turn's text).
    :param log_dir: where the servers' stderr logs go (default: the temp directory).
    """

    name = "mcp"
    description = "Questions answered with the tools of any MCP servers (an MCP config file + a JSONL of tasks)."

    config_defaults: dict[str, Any] = {
        "rewards": [{"name": "exact_match"}],
        "rollout": {"max_turns": 4, "max_tokens_per_turn": 256},
        # The MCP client has its own per-call timeout, probe and restart (timeout_s 60 by
        # default); the manager's limit sits above it so that those run first.
        "tool_manager": {"options": {"timeout_s": 180}},
    }

    def __init__(self, mcp_config: str | None = None, data: str | None = None, test_data: str | None = None,
                 test_fraction: float = 0.1, servers: dict[str, dict[str, Any]] | None = None,
                 tools: list[str] | None = None, system_prompt: str = DEFAULT_SYSTEM_PROMPT,
                 answer_tags: bool = True, log_dir: str | None = None):
        problems = []
        if not mcp_config:
            problems.append("env_options.mcp_config: required, the MCP config file ({\"mcpServers\": {...}} JSON "
                            "or RL-Factory's mcp_tools.pydata)")
        elif not Path(mcp_config).expanduser().is_file():
            problems.append(f"env_options.mcp_config: no file at {mcp_config}")
        if not data:
            problems.append("env_options.data: required, a JSONL file of tasks ({\"question\": ..., \"answer\": ...})")
        for key, path in (("data", data), ("test_data", test_data)):
            if path and not Path(path).expanduser().is_file():
                problems.append(f"env_options.{key}: no file at {path}")
        if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)) or not 0 < test_fraction < 1:
            problems.append(f"env_options.test_fraction: must be a number between 0 and 1, got {test_fraction!r}")
        if servers is not None and not isinstance(servers, dict):
            problems.append(f"env_options.servers: must be an object of options by server name, got {servers!r}")
        elif servers:
            for server, options in servers.items():
                if isinstance(options, dict):
                    problems += ServerOptions.problems(f"env_options.servers.{server}", options)
                else:
                    problems.append(f"env_options.servers.{server}: must be an object of options, got {options!r}")
        if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, str) for t in tools)):
            problems.append(f"env_options.tools: must be a list of tool names, got {tools!r}")
        if not isinstance(system_prompt, str) or not system_prompt.strip():
            problems.append("env_options.system_prompt: must be a non-empty text")
        if problems:
            raise ConfigError(problems)
        self.data_files = {"train": Path(data).expanduser(), "test": Path(test_data).expanduser() if test_data else None}
        self.test_fraction = float(test_fraction)
        self.system_prompt, self.answer_tags = system_prompt.strip(), answer_tags
        self._samples: dict[str, list[dict[str, Any]]] | None = None
        self._read_samples()  # a bad task file is a startup error, not a surprise at the first eval
        self.toolset: MCPToolset = load_mcp_tools(Path(mcp_config).expanduser(), servers=servers, include=tools,
                                                  log_dir=log_dir)
        self.tools = list(self.toolset.tools)

    # ------------------------------------------------------------------ data

    def _read_samples(self) -> dict[str, list[dict[str, Any]]]:
        if self._samples is None:
            train = _read_tasks(self.data_files["train"])
            if self.data_files["test"] is not None:
                samples = {"train": train, "test": _read_tasks(self.data_files["test"])}
            else:
                held_out = [_held_out(row["id"], self.test_fraction) for row in train]
                samples = {"train": [row for row, out in zip(train, held_out) if not out],
                           "test": [row for row, out in zip(train, held_out) if out]}
                if not samples["test"] or not samples["train"]:
                    raise ConfigError([f"env_options.data: {len(train)} task(s) leave no "
                                       f"{'test' if not samples['test'] else 'training'} task with test_fraction "
                                       f"{self.test_fraction:g}; give test_data or more tasks"])
            self._samples = samples
        return self._samples

    def dataset(self, size: int | None = None, split: str = "train") -> list[dict[str, Any]]:
        """The first ``size`` tasks of ``split`` (``train`` or ``test``; all when None)."""
        samples = self._read_samples()
        if split not in samples:
            raise ConfigError([f"the mcp env has the splits train and test, not {split!r}"])
        return samples[split][:size] if size is not None else list(samples[split])

    # ------------------------------------------------------------------ episodes

    async def reset(self, sample: Sample) -> EnvReset:
        question = sample.get("question") if hasattr(sample, "get") else None
        if not question:
            raise ValueError(f"an mcp task needs a 'question', got keys {sorted(sample)}")
        messages = [Message(role="system", content=self.system_prompt), Message(role="user", content=str(question))]
        return EnvReset(messages=messages, tools=list(self.tools), state={"tool_calls": 0})

    async def step(self, state: Any, turn: ParsedTurn, results: Sequence[ToolResult]) -> EnvStep:
        if turn.tool_calls or turn.errors:
            state["tool_calls"] += len(turn.tool_calls)
            return EnvStep()
        return EnvStep(done=True, final_answer=self._answer(turn.content))

    def _answer(self, text: str) -> str:
        if not self.answer_tags:
            return text.strip()
        return last_tag_content(text, "answer")  # linear, whatever the model wrote

    async def close(self, state: Any) -> None:
        """Nothing per episode: the servers' sessions are shared and closed with the tools."""


def _read_tasks(path: Path) -> list[dict[str, Any]]:
    from rlfactory_core import read_jsonl_samples

    rows = read_jsonl_samples(path, path.stem)
    problems = []
    for number, row in enumerate(rows, 1):
        if not isinstance(row.get("question"), str) or not row["question"].strip():
            problems.append(f"{path}: task {number} ({row['id']}) needs a 'question' (text)")
        if not any(row.get(key) not in (None, "", []) for key in _GOLD_KEYS):
            problems.append(f"{path}: task {number} ({row['id']}) needs its gold answer(s): "
                            "'answer': \"...\" or 'answers': [...]")
    if not rows:
        problems.append(f"{path}: no tasks")
    if problems:
        raise ConfigError(problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else []))
    return rows


def _held_out(task_id: Any, fraction: float) -> bool:
    digest = hashlib.sha256(f"rlfactory-mcp-test:{task_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction
