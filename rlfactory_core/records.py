"""Recorded trajectories: what the run trained on and was evaluated on, token by token.

A run writes one zstd-compressed Parquet file per step and kind into its directory::

    trajectories/train/step-000012.parquet       # logging.record_train_groups whole groups
    trajectories/eval/step-000010.parquet        # every eval trajectory (logging.record_eval)
    trajectories/cold_start_eval/step-000000.parquet

Why Parquet: a step's trajectories are written once and never changed, so "appendable" means a
new file per step (written atomically: a reader sees a whole file or none, and a killed run
loses at most the step it was writing). Columnar storage lets a list of 100k trajectories read
only the small scalar columns (reward, stop reason, ...) without touching the token arrays,
zstd shrinks the token arrays ~4x, and any Arrow reader (pandas, polars, DuckDB) opens it
without this package. JSONL would have to parse every token to list a step.

**Schema** (:data:`SCHEMA_VERSION` 4; every file's metadata carries ``rlfactory.schema_version``;
files of versions 1 (before outcomes), 2 (before resampling) and 3 (before ``num_sequences``)
still read: their new columns read as null), one row per trajectory:

- ``step`` (the training step it belongs to), ``kind`` (``train``, ``eval``,
  ``cold_start_eval``), ``index`` (its row in the file), ``sample_id``, ``group`` (its group in
  the step's batch; -1 for eval), ``policy_version`` (the oldest weight version that sampled
  any of its tokens: the number of updates behind those weights, as the backend reported it;
  -1 if none did);
- ``reward``, ``rewards`` (each reward and component, ``name -> value``), ``reward_errors``,
  ``correct`` (null: no reward said), ``turn_rewards``, ``advantage`` (the trajectory's;
  null for eval);
- ``stop_reason``, ``outcome`` (the trajectory's class, :mod:`rlfactory_core.outcomes`; null where
  no reward layer classified it; ``ok`` or ``error`` in version 1 files), ``outcome_side``
  (``policy`` or ``infrastructure``), ``attempt`` (0: the rollout's own; 1, 2, ...: a resample
  of its member, :mod:`rlfactory_core.resampling`), ``replaced`` (true: an attempt a resample
  replaced, recorded beside its group's trajectories, not trained: no advantage),
  ``error`` (why the episode ended early, when it did),
  ``final_answer``, ``expected`` (JSON), ``num_turns``, ``num_tokens``, ``num_sequences`` (how
  many token sequences: more than one where the model family rewrote earlier turns) and
  ``sequence_turns`` (the first model turn of each), ``tool_error_kinds``;
- ``messages``: the conversation (``role``, ``content``, ``name``, ``tool_call_id``,
  ``tool_calls`` as JSON, ``turn``: -1 for the prompt's messages, few-shot turns included); ``tool_calls``: each call with ``name``, ``arguments`` (JSON),
  ``id``, ``turn``, ``result``, ``error`` (its kind), ``infrastructure`` (the result's mark:
  true, false or null), ``latency_s``;
- ``sequences``: the token sequences the trajectory is made of (one, unless its model family
  rewrote earlier turns: :class:`~rlfactory_core.types.Trajectory`), each with per-token
  arrays ``token_ids``, ``pieces`` (each token decoded alone: a character split over tokens
  shows as U+FFFD), ``segment`` (0 prompt, 1 model, 2 observation), ``turn`` (the model turn
  the token belongs to or follows; -1 for the prompt), ``loss_mask``, ``sampler_logprob``,
  ``trainer_logprob`` (the trainer's before the update; null where not computed: eval, tokens
  the model did not write), ``advantage`` (per token, turn rewards included) and
  ``policy_version`` (of the weights that sampled it; -1 for tokens the model did not write);
- ``metadata``: the trajectory's own metadata as JSON.

:class:`RunRecords` reads a run's records (and, for runs made before them, the text samples
``samples/step-N.jsonl``, as text-only trajectories). A torn or malformed file raises
:class:`RecordError` naming it, for that file only.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

from ._fs import fsync_dir, temp_path_beside
from .errors import RLFactoryError
from .outcomes import side_of

__all__ = ["SCHEMA_VERSION", "RECORDS_DIR", "RecordError", "RunRecords", "trajectory_records", "write_records",
           "SCALAR_COLUMNS", "scalar_schema", "PROMPT", "MODEL", "OBSERVATION"]

SCHEMA_VERSION = 4
#: the versions this rlfactory reads (the columns an older file lacks read as null)
_READABLE = {"1": 1, "2": 2, "3": 3, "4": 4}
RECORDS_DIR = "trajectories"
PROMPT, MODEL, OBSERVATION = 0, 1, 2
#: What a list of trajectories reads: everything but the conversation and the token arrays.
SCALAR_COLUMNS = ["step", "kind", "index", "sample_id", "group", "policy_version", "reward", "correct",
                  "advantage", "stop_reason", "outcome", "outcome_side", "attempt", "replaced", "num_turns",
                  "num_tokens", "num_sequences", "tool_error_kinds", "final_answer"]
_FILE = re.compile(r"^step-(\d{6,})\.(parquet|jsonl)$")


class RecordError(RLFactoryError):
    """A recorded-trajectory file that cannot be read (torn, malformed, another schema)."""


def _schema() -> Any:
    import pyarrow as pa

    floats, ints = pa.list_(pa.float32()), pa.list_(pa.int32())
    sequence = pa.struct([("token_ids", ints), ("pieces", pa.list_(pa.string())), ("segment", pa.list_(pa.int8())),
                          ("turn", pa.list_(pa.int16())), ("loss_mask", pa.list_(pa.int8())),
                          ("sampler_logprob", floats), ("trainer_logprob", floats), ("advantage", floats),
                          ("policy_version", ints)])
    message = pa.struct([("role", pa.string()), ("content", pa.string()), ("name", pa.string()),
                         ("tool_call_id", pa.string()), ("tool_calls", pa.string()), ("turn", pa.int16())])
    call = pa.struct([("name", pa.string()), ("arguments", pa.string()), ("id", pa.string()), ("turn", pa.int16()),
                      ("result", pa.string()), ("error", pa.string()), ("infrastructure", pa.bool_()),
                      ("latency_s", pa.float64())])
    return pa.schema([
        ("step", pa.int32()), ("kind", pa.string()), ("index", pa.int32()), ("sample_id", pa.string()),
        ("group", pa.int32()), ("policy_version", pa.int32()), ("reward", pa.float64()),
        ("rewards", pa.map_(pa.string(), pa.float64())), ("reward_errors", pa.list_(pa.string())),
        ("correct", pa.bool_()), ("turn_rewards", pa.list_(pa.float64())), ("advantage", pa.float64()),
        ("stop_reason", pa.string()), ("outcome", pa.string()), ("outcome_side", pa.string()),
        ("attempt", pa.int16()), ("replaced", pa.bool_()), ("error", pa.string()),
        ("final_answer", pa.string()), ("expected", pa.string()), ("num_turns", pa.int16()),
        ("num_tokens", pa.int32()), ("num_sequences", pa.int16()), ("sequence_turns", pa.list_(pa.int16())),
        ("tool_error_kinds", pa.list_(pa.string())),
        ("messages", pa.list_(message)), ("tool_calls", pa.list_(call)), ("sequences", pa.list_(sequence)),
        ("metadata", pa.string()),
    ], metadata={"rlfactory.schema_version": str(SCHEMA_VERSION)})


def scalar_schema() -> Any:
    """The schema of :meth:`RunRecords.scalars`: the record schema's :data:`SCALAR_COLUMNS`."""
    import pyarrow as pa

    schema = _schema()
    return pa.schema([schema.field(name) for name in SCALAR_COLUMNS])


# --------------------------------------------------------------------------- writing


def trajectory_records(trajectories: Sequence[Any], *, step: int, kind: str, scored: Any,
                       row_samples: Sequence[Any], tokenizer: Any,
                       rows: Iterable[int] | None = None, batch_rows: Sequence[Sequence[int]] | None = None,
                       advantages: Any = None, token_advantages: Any = None,
                       trainer_logprobs: Any = None, replaced: bool = False) -> list[dict[str, Any]]:
    """The records of ``trajectories[rows]`` (all by default), scored by ``scored`` (a
    :class:`~rlfactory_core.rewards.ScoredBatch` of all of them). ``row_samples``: each
    trajectory's sample (None where unknown), for its expected answer. For training rows, the
    batch's ``advantages`` ``[B]`` and ``token_advantages`` / ``trainer_logprobs`` ``[B, L]``,
    and ``batch_rows``: each trajectory's rows in the batch, one per sequence
    (:func:`rlfactory_core.training.batch.trajectory_rows`; default: row ``i`` is trajectory
    ``i``); ``replaced``: they are attempts a resample replaced. Each model token's
    ``policy_version`` is its segment's (:class:`~rlfactory_core.types.Segment`: the version
    the backend sampled it with)."""
    pieces = _PieceCache(tokenizer)
    records = []
    for index, row in enumerate(range(len(trajectories)) if rows is None else rows):
        trajectory, sample = trajectories[row], row_samples[row]
        expected = sample.get("answer", sample.get("answers")) if hasattr(sample, "get") else None
        parts = trajectory.sequences
        in_batch = [row] if batch_rows is None else list(batch_rows[row])
        sequences, first_turn, first_turns = [], 0, []
        for part, batch_row in zip(parts, in_batch if len(in_batch) == len(parts) else [None] * len(parts)):
            sequences.append(_sequence(
                part, pieces, first_turn,
                None if token_advantages is None or batch_row is None else token_advantages[batch_row].tolist(),
                None if trainer_logprobs is None or batch_row is None else trainer_logprobs[batch_row].tolist()))
            first_turns.append(first_turn)
            first_turn += sum(s.kind == "model" for s in part.segments)
        versions = [v for sequence in sequences for v in sequence["policy_version"] if v >= 0]
        error, outcome = trajectory.metadata.get("error"), scored.outcomes[row]
        records.append({
            "step": step, "kind": kind, "index": index, "sample_id": str(trajectory.sample_id),
            "group": -1 if kind != "train" or trajectory.group is None else int(trajectory.group),
            "policy_version": min(versions, default=-1),
            "reward": float(scored.totals[row]),
            "rewards": {str(k): float(v) for k, v in scored.components[row].items()},
            "reward_errors": list(scored.reward_errors[row]), "correct": scored.correct[row],
            "turn_rewards": [float(r) for r in trajectory.turn_rewards],
            "advantage": None if advantages is None else float(advantages[in_batch[0]]),
            "stop_reason": trajectory.stop_reason,
            "outcome": outcome, "outcome_side": None if outcome is None else side_of(outcome),
            "attempt": int(trajectory.metadata.get("attempt", 0)), "replaced": replaced,
            "error": None if error is None else str(error), "final_answer": trajectory.final_answer,
            "expected": None if expected is None else json.dumps(expected, ensure_ascii=False, default=str),
            "num_turns": trajectory.num_turns, "num_tokens": sum(len(q["token_ids"]) for q in sequences),
            "num_sequences": len(sequences), "sequence_turns": first_turns,
            "tool_error_kinds": sorted(trajectory.metadata.get("tool_errors", {})),
            "messages": _messages(trajectory), "tool_calls": _calls(trajectory),
            "sequences": sequences,
            "metadata": json.dumps({k: v for k, v in trajectory.metadata.items()}, ensure_ascii=False, default=str),
        })
    return records


def write_records(run_dir: str | os.PathLike[str], kind: str, step: int, records: Sequence[dict[str, Any]]) -> Path:
    """``records`` as ``RUN_DIR/trajectories/<kind>/step-<step>.parquet``, written whole or not
    at all (a temporary file beside it, renamed over it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory = Path(run_dir) / RECORDS_DIR / kind
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step-{step:06d}.parquet"
    table = pa.Table.from_pylist(list(records), schema=_schema())
    tmp = temp_path_beside(path, "tmp")
    try:
        pq.write_table(table, tmp, compression="zstd")
        with open(tmp, "rb") as f:  # on disk before the rename publishes it
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(directory)
    return path


class _PieceCache:
    """Each token id decoded alone, once per id."""

    def __init__(self, tokenizer: Any):
        self.tokenizer, self.known = tokenizer, {}

    def __call__(self, ids: Sequence[int]) -> list[str]:
        new = sorted({i for i in ids if i not in self.known})
        if new:
            self.known.update(zip(new, self.tokenizer.batch_decode([[i] for i in new])))
        return [self.known[i] for i in ids]


def _sequence(sequence: Any, pieces: _PieceCache, first_turn: int, token_advantages: list[float] | None,
              trainer_logprobs: list[float] | None) -> dict[str, list[Any]]:
    """One sequence's per-token arrays; its model turns are numbered from ``first_turn`` (the
    trajectory's turns in earlier sequences)."""
    ids = list(sequence.prompt_ids)
    segment, turn = [PROMPT] * len(ids), [-1] * len(ids)
    mask, sampler, versions = [0] * len(ids), [None] * len(ids), [-1] * len(ids)
    model_turn = first_turn - 1
    for part in sequence.segments:
        n = len(part.token_ids)
        ids.extend(part.token_ids)
        model = part.kind == "model"
        model_turn += model
        segment.extend([MODEL if model else OBSERVATION] * n)
        turn.extend([max(model_turn, 0)] * n)
        mask.extend([part.loss_mask] * n)
        sampler.extend(part.logprobs if model and part.logprobs is not None else [None] * n)
        versions.extend([part.policy_version if model and part.policy_version is not None else -1] * n)

    def on_model_tokens(values: list[float] | None) -> list[float | None]:
        if values is None:
            return [None] * len(ids)
        return [values[i] if segment[i] == MODEL and i < len(values) else None for i in range(len(ids))]

    trained = on_model_tokens(trainer_logprobs)
    if trainer_logprobs is not None and not any(mask):  # a row without loss: the update never scored it
        trained = [None] * len(ids)
    return {"token_ids": ids, "pieces": pieces(ids), "segment": segment, "turn": turn, "loss_mask": mask,
            "sampler_logprob": sampler, "trainer_logprob": trained, "advantage": on_model_tokens(token_advantages),
            "policy_version": versions}


def _messages(trajectory: Any) -> list[dict[str, Any]]:
    """The conversation, each message with its model turn: -1 for the prompt's (few-shot
    examples included), k for turn k's model message and the observation after it."""
    turns: list[int] = []
    for part in trajectory.all_segments:
        turn = (turns[-1] if turns else -1) + (part.kind == "model")
        turns += [turn] * part.num_messages
    turns = [-1] * max(0, len(trajectory.messages) - len(turns)) + turns
    return [_message(m, turn) for m, turn in zip(trajectory.messages, turns[-len(trajectory.messages):] or [])]


def _message(message: Any, turn: int) -> dict[str, Any]:
    calls = [{"name": c.name, "arguments": c.arguments, "id": c.id} for c in message.tool_calls]
    return {"role": str(message.role), "content": message.content if isinstance(message.content, str)
            else json.dumps(message.content, default=str), "name": message.name,
            "tool_call_id": message.tool_call_id,
            "tool_calls": json.dumps(calls, ensure_ascii=False, default=str) if calls else None, "turn": turn}


def _calls(trajectory: Any) -> list[dict[str, Any]]:
    """Each tool call with its result: by call id where the results have them, else in order."""
    by_id = {r.call_id: r for r in trajectory.tool_results if r.call_id}
    in_order = list(trajectory.tool_results)
    turns = trajectory.metadata.get("tool_call_turns")  # the agent loop's; else from the messages
    if not isinstance(turns, list) or len(turns) != len(trajectory.tool_calls):
        turns = []
        for turn, message in enumerate(m for m in trajectory.messages if m.role == "assistant"):
            turns += [turn] * len(message.tool_calls)
    calls = []
    for i, call in enumerate(trajectory.tool_calls):
        result = by_id.get(call.id) if call.id else None
        if result is None and not by_id and i < len(in_order):
            result = in_order[i]
        calls.append({"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False, default=str),
                      "id": call.id, "turn": turns[i] if i < len(turns) else None,
                      "result": None if result is None else result.content,
                      "error": None if result is None else result.error,
                      "infrastructure": None if result is None or not isinstance(result.infrastructure, bool)
                      else result.infrastructure,
                      "latency_s": None if result is None else float(result.latency_s)})
    return calls


# --------------------------------------------------------------------------- reading


def _upgraded(file: Any, columns: list[str] | None) -> Any:
    """An older file's table in today's schema: the columns it lacks (``outcome_side``; the
    calls' ``infrastructure``) as nulls."""
    import pyarrow as pa

    schema = _schema()
    have = set(file.schema_arrow.names)
    table = file.read(columns=[c for c in (columns or schema.names) if c in have])
    for name in columns or schema.names:
        if name not in have:
            table = table.append_column(schema.field(name), pa.nulls(table.num_rows, schema.field(name).type))
    if "tool_calls" in table.column_names:  # struct fields added since: cast fills them with nulls
        calls = table.column("tool_calls").to_pylist()
        upgraded = pa.array([None if c is None else [{**x, "infrastructure": x.get("infrastructure")} for x in c]
                             for c in calls], type=schema.field("tool_calls").type)
        table = table.set_column(table.column_names.index("tool_calls"), schema.field("tool_calls"), upgraded)
    return table.select([c for c in (columns or schema.names)])


class RunRecords:
    """The recorded trajectories of one run directory.

    ``kinds()`` and ``steps(kind)`` say what there is; ``list(kind, step)`` gives the scalar
    columns of a step's trajectories (:data:`SCALAR_COLUMNS`; ``scalars`` the same as an Arrow
    table), ``trajectory(kind, step, index)`` one whole record, read from its step's file
    alone. A run made before records has its eval text samples (``samples/step-N.jsonl``, kind
    ``eval``; ``samples/cold_start``, kind ``cold_start_eval``): their records have no
    ``sequences`` (``"text"`` holds the conversation as the model saw it) and
    ``"text_only": True``.
    """

    def __init__(self, run_dir: str | os.PathLike[str]):
        self.run_dir = Path(run_dir)

    def _dirs(self, kind: str) -> list[Path]:
        legacy = {"eval": self.run_dir / "samples", "cold_start_eval": self.run_dir / "samples" / "cold_start"}
        return [self.run_dir / RECORDS_DIR / kind] + ([legacy[kind]] if kind in legacy else [])

    def kinds(self) -> list[str]:
        found = {p.name for p in (self.run_dir / RECORDS_DIR).iterdir() if p.is_dir()} \
            if (self.run_dir / RECORDS_DIR).is_dir() else set()
        found |= {kind for kind in ("eval", "cold_start_eval") if self.steps(kind)}
        order = ["train", "eval", "cold_start_eval"]
        return sorted(found, key=lambda k: (order.index(k) if k in order else len(order), k))

    def files(self, kind: str) -> dict[int, Path]:
        """Step -> its file (a Parquet record beats a text sample of the same step)."""
        found: dict[int, Path] = {}
        for directory in reversed(self._dirs(kind)):
            if not directory.is_dir():
                continue
            with os.scandir(directory) as entries:  # is_file() from the directory entry: no stat per file
                for entry in entries:
                    match = _FILE.match(entry.name)
                    if match and entry.is_file():
                        found[int(match.group(1))] = Path(entry.path)
        return dict(sorted(found.items()))

    def steps(self, kind: str) -> list[int]:
        return list(self.files(kind))

    def path(self, kind: str, step: int) -> Path:
        """The file holding ``kind``'s trajectories at ``step`` (:class:`RecordError` when none)."""
        # the names the writers give first (the same precedence as files()), without listing a
        # directory of a thousand steps to open one
        for directory in self._dirs(kind):
            for suffix in (".parquet", ".jsonl"):
                path = directory / f"step-{step:06d}{suffix}"
                if path.is_file():
                    return path
        path = self.files(kind).get(step)  # a name written another way (more leading zeros)
        if path is None:
            raise RecordError(f"{self.run_dir.name}: no {kind} trajectories recorded at step {step}")
        return path

    def list(self, kind: str, step: int) -> list[dict[str, Any]]:
        """The scalar columns of every trajectory of ``kind`` at ``step``."""
        path = self.path(kind, step)
        if path.suffix == ".jsonl":
            return [{k: record.get(k) for k in SCALAR_COLUMNS} for record in self._text_samples(path, kind, step)]
        return self._read(path, SCALAR_COLUMNS).to_pylist()

    def scalars(self, kind: str, step: int) -> Any:
        """:meth:`list` as an Arrow table (schema :func:`scalar_schema`, the same for every
        step, text samples included): a tenth of the memory of the dicts, and filtered without
        a Python loop over 100k rows."""
        import pyarrow as pa

        path = self.path(kind, step)
        try:
            if path.suffix == ".jsonl":
                return pa.Table.from_pylist(self.list(kind, step), schema=scalar_schema())
            table = self._read(path, SCALAR_COLUMNS).replace_schema_metadata(None)
            return table if table.schema == scalar_schema() else table.cast(scalar_schema())
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            raise RecordError(f"{path}: a value of the wrong type ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''})") from None

    def trajectory(self, kind: str, step: int, index: int, *, tokens: bool = True) -> dict[str, Any]:
        """The whole record of trajectory ``index`` of ``kind`` at ``step``; with ``tokens=False``,
        all but its token arrays (``sequences`` is ``[]``; the rest of the file is not read)."""
        return self.trajectories(kind, step, [index], tokens=tokens)[0]

    def trajectories(self, kind: str, step: int, indices: Sequence[int], *, tokens: bool = True) -> list[dict[str, Any]]:
        """:meth:`trajectory` of each of ``indices`` (in that order), the step's file read once:
        an export of a step's 84 trajectories read it 84 times."""
        path = self.path(kind, step)
        if path.suffix == ".jsonl":
            records = self._text_samples(path, kind, step)
            by_index = {record["index"]: record for record in records}
            missing = next((index for index in indices if index not in by_index), None)
            if missing is not None:
                raise RecordError(f"{path.name}: no trajectory {missing} (it has {len(records)})")
            return [by_index[index] for index in indices]
        columns = None if tokens else [name for name in _schema().names if name != "sequences"]
        table = self._read(path, columns)
        # a record's index is its row (write_records keeps the order); looked up, to be sure
        rows: dict[int, int] = {}
        for at, value in enumerate(table.column("index").to_pylist()):
            rows.setdefault(value, at)
        missing = next((index for index in indices if index not in rows), None)
        if missing is not None:
            raise RecordError(f"{path.name}: no trajectory {missing} (it has {table.num_rows})")
        # slices, not Table.take: take imports pyarrow.compute, ~0.2 s on a server's first open
        records = [table.slice(rows[index], 1).to_pylist()[0] for index in indices]
        # a Parquet map reads back as (key, value) pairs
        return [{**record, "rewards": dict(record["rewards"] or ()), "sequences": record.get("sequences") or [],
                 "text_only": False} for record in records]

    def _read(self, path: Path, columns: list[str] | None) -> Any:
        import pyarrow.parquet as pq

        try:
            file = pq.ParquetFile(path)
            # the file's key-value metadata holds the schema's (without building the Arrow schema)
            version = (file.metadata.metadata or {}).get(b"rlfactory.schema_version", b"?").decode()
            if version not in _READABLE:
                raise RecordError(f"{path}: schema version {version}; this rlfactory reads versions "
                                  f"{', '.join(_READABLE)}")
            if _READABLE[version] == SCHEMA_VERSION:
                return file.read(columns=columns)
            return _upgraded(file, columns)
        except RecordError:
            raise
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a damaged file
            raise RecordError(f"{path}: not a readable trajectory record ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''})") from None

    @staticmethod
    def _text_samples(path: Path, kind: str, step: int) -> list[dict[str, Any]]:
        """A pre-records run's text samples, shaped like records (no token data)."""
        records = []
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise RecordError(f"{path}: cannot be read ({exc})") from None
        for number, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                sample = json.loads(line)
                if not isinstance(sample, dict):
                    raise ValueError("not an object")
            except ValueError:
                if number == len(lines) - 1:
                    continue  # torn by a kill while it was written
                raise RecordError(f"{path}:{number + 1}: not a JSON object") from None
            calls = [{"name": c.get("name"), "arguments": json.dumps(c.get("arguments"), ensure_ascii=False),
                      "id": "", "turn": None, "result": None, "error": None, "infrastructure": None, "latency_s": None}
                     for c in sample.get("tool_calls") or [] if isinstance(c, dict)]
            records.append({
                "step": step, "kind": kind, "index": len(records), "sample_id": str(sample.get("sample_id", "")),
                "group": -1, "policy_version": step, "reward": sample.get("reward"),
                "rewards": sample.get("rewards") or {}, "reward_errors": sample.get("reward_errors") or [],
                "correct": None, "turn_rewards": [], "advantage": None, "stop_reason": sample.get("stop_reason"),
                "outcome": None, "outcome_side": None, "error": None, "final_answer": sample.get("final_answer"),
                "expected": json.dumps(sample.get("expected"), ensure_ascii=False),
                "num_turns": sample.get("turns"), "num_tokens": None, "num_sequences": None, "sequence_turns": [],
                "tool_error_kinds": [],
                "messages": [], "tool_calls": calls, "sequences": [], "metadata": "{}",
                "text": sample.get("text", ""), "text_only": True,
            })
        return records
