"""Samples: JSONL files or an env's own dataset, and the order a run visits them in."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any, Collection, Sequence

from .config import RunConfig
from .errors import ConfigError, RLFactoryError, one_line
from .interfaces import accepts, member

__all__ = ["read_jsonl_samples", "load_samples", "batch_indices", "indices_at", "untrained_positions"]


def read_jsonl_samples(path: str | os.PathLike[str], id_prefix: str) -> list[dict[str, Any]]:
    """Samples from a JSONL file, one JSON object a line (blank lines skipped); a row without
    an ``id`` gets ``<id_prefix>-<line>``. A bad line raises :class:`ConfigError` naming it."""
    samples = []
    try:
        lines = Path(path).expanduser().read_text(encoding="utf-8").splitlines()  # ~ as preflight reads it
    except OSError as exc:
        raise ConfigError([f"cannot read the samples file {str(path)!r}: {exc}"]) from exc
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError([f"{path}:{number}: not valid JSON ({exc.msg})"],
                              hint="one JSON object per line") from exc
        if not isinstance(row, dict):
            raise ConfigError([f"{path}:{number}: a sample must be a JSON object, got {type(row).__name__}"])
        row.setdefault("id", f"{id_prefix}-{number}")
        samples.append(row)
    return samples


def load_samples(config: RunConfig, env: Any, split: str, size: int | None, *,
                 files: bool = True) -> list[dict[str, Any]]:
    """Samples of ``split`` from the config's JSONL file (unless ``files`` is false: an
    ``eval.splits`` split is always the env's), else the env's own ``dataset``."""
    path = (config.data.train_file if split == "train" else config.data.eval_file) if files else None
    if path:
        samples = read_jsonl_samples(path, split)
        return samples[:size] if size else samples
    dataset = member("env", env, "dataset")
    if dataset is None:
        raise ConfigError([f"data.{'train' if split == 'train' else 'eval'}_file: the {config.env!r} env has no "
                           "built-in data; give a JSONL file"])
    if not accepts("env", dataset, "split"):
        # Without splits, evaluation would run on training samples: refuse rather than guess.
        raise ConfigError([f"data.eval_file: the {config.env!r} env's dataset() has no split; give JSONL files "
                           "(data.train_file, data.eval_file)"])
    # No size: the env's own default, e.g. all of a fixed dataset's split (a generator like
    # the arithmetic env picks its own number).
    try:
        return list(dataset(split=split) if size is None else dataset(size=size, split=split))
    except RLFactoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. a split the env does not have (`rlf eval --split dev`)
        raise ConfigError([f"{'data' if files else 'eval.splits'}: the {config.env!r} env cannot give its {split!r} "
                           f"split ({one_line(exc)})"],
                          hint="`rlf eval --split` takes the env's splits (train, test); or give JSONL files "
                               "(data.train_file, data.eval_file)") from exc


def untrained_positions(start: int, count: int, trained: Collection[int] = ()) -> list[int]:
    """The next ``count`` data positions from ``start`` that are not in ``trained`` (prompts an
    asynchronous schedule trained ahead of one still in flight: a resumed run, in any mode,
    skips them)."""
    positions: list[int] = []
    while len(positions) < count:
        if start not in trained:
            positions.append(start)
        start += 1
    return positions


def indices_at(num_samples: int, positions: Sequence[int], seed: int, shuffle: bool = True) -> list[int]:
    """The sample indices at global data ``positions`` (any order, gaps allowed: an
    asynchronous schedule's chunk skips prompts trained already), as :func:`batch_indices`
    gives them, one contiguous run at a time."""
    out: list[int] = []
    start = 0
    while start < len(positions):
        end = start + 1
        while end < len(positions) and positions[end] == positions[end - 1] + 1:
            end += 1
        out += batch_indices(num_samples, end - start, seed, positions[start], shuffle=shuffle)
        start = end
    return out


def batch_indices(num_samples: int, count: int, seed: int, position: int, shuffle: bool = True) -> list[int]:
    """``count`` sample indices starting at global ``position``: epoch ``e`` visits the
    samples in a permutation fixed by (seed, e), or in file order without ``shuffle``."""
    out = []
    while len(out) < count:
        epoch, offset = divmod(position, num_samples)
        order = list(range(num_samples))
        if shuffle:
            random.Random(f"{seed}:{epoch}").shuffle(order)
        take = min(count - len(out), num_samples - offset)
        out.extend(order[offset:offset + take])
        position += take
    return out
