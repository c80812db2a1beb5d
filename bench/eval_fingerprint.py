"""Fingerprints of what the shipped tasks are evaluated on: the test splits, the answer
normalisation and the metrics.

Issue 21 asks for the learning gains to come from training, not from a test that got easier,
so these hashes were recorded in bench/README.md before any of its levers changed a line, and
re-running this script shows them unchanged:

    .venv/bin/python bench/eval_fingerprint.py

For each env it builds the data if needed (as ``rlf data build`` does), loads the test split
exactly as evaluation does (``env.dataset(split="test")``) and hashes the samples in
canonical JSON (sorted keys), so the hash covers the questions and gold answers, not a file's
layout. The source files that decide whether an answer counts are hashed byte for byte.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
from pathlib import Path

from rlfactory_core import get_component

ENVS = ("deepsearch", "nl2sql", "android")
#: The modules whose code decides whether an answer counts (normalisation and metrics).
METRIC_MODULES = (
    "rlfactory_core.default_plugins.rewards",  # normalize_answer, same_answer, exact_match
    "rlfactory_nl2sql.reward",  # sql_execution: execution accuracy
    "rlfactory_android.reward",  # android_task: task success
    "rlfactory_android.tasks",  # the success checks of the android tasks
)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def test_split_fingerprint(env_name: str) -> tuple[int, str]:
    env = get_component("env", env_name)()  # the env's default options, as `rlf train --env` uses
    build = getattr(env, "build_data", None)
    if build is not None:
        build()
    samples = env.dataset(None, split="test")
    canonical = "\n".join(json.dumps(dict(sample), sort_keys=True, default=str) for sample in samples)
    return len(samples), _sha(canonical.encode())


def main() -> None:
    print("| what | samples | sha256 (first 16) |\n|---|---|---|")
    for env_name in ENVS:
        count, digest = test_split_fingerprint(env_name)
        print(f"| `{env_name}` test split | {count} | `{digest}` |")
    for module_name in METRIC_MODULES:
        path = Path(importlib.import_module(module_name).__file__)
        print(f"| `{module_name}` ({path.name}) | | `{_sha(path.read_bytes())}` |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
