"""Fingerprints of what the shipped tasks are evaluated on: the test splits, the answer
normalisation and the metrics.

Issue 21 asks for the learning gains to come from training, not from a test that got easier,
so these hashes were recorded in bench/README.md before any of its levers changed a line, and
re-running this script shows them unchanged:

    .venv/bin/python bench/eval_fingerprint.py
    .venv/bin/python bench/eval_fingerprint.py --all   # also the training and generalisation splits,
                                                       # the corpora and the task code (issue 40)

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
#: More splits per env, fingerprinted like the test split: the training split (what a test item
#: must not equal) and the splits that test beyond the training templates (issue 40).
MORE_SPLITS = {"deepsearch": ("train", "test_wordings", "test_composition", "test_counterfactual"),
               "nl2sql": ("train", "test_wordings", "test_skeletons"), "android": ("train", "test_layouts")}
#: Data files a score depends on beside the samples (hashed byte for byte), by env.
DATA_FILES = {"deepsearch": ("corpus.jsonl", "corpus_counterfactual.jsonl"),
              "nl2sql": ("database/world/world.sqlite", "database/world_perturbed/world_perturbed.sqlite")}
#: Code that decides what a model is shown or credited beyond the metrics: answer extraction,
#: the demonstrations the warm-up replays, the builders of the splits.
TASK_MODULES = (
    "rlfactory_deepsearch.env",  # extract_answer, search_plan (the demonstrations), the search tool
    "rlfactory_deepsearch.facts",  # the questions and passages
    "rlfactory_deepsearch.generalisation",  # the splits beyond the templates
    "rlfactory_nl2sql.env",  # extract_sql, the prompt, the demonstrations, the tools
    "rlfactory_nl2sql.facts",  # the facts and the check database's perturbation
    "rlfactory_nl2sql.data",  # the templates and the questions
    "rlfactory_nl2sql.generalisation",  # the splits beyond the templates
    "rlfactory_android.layout",  # the layouts of the simulated phone
    "rlfactory_android.checks",  # the success check with side effects
    "rlfactory_android.demonstrations",  # the warm-up's scripted solver
)
#: The modules whose code decides whether an answer counts (normalisation and metrics).
METRIC_MODULES = (
    "rlfactory_core.default_plugins.rewards",  # normalize_answer, same_answer, exact_match
    "rlfactory_nl2sql.reward",  # sql_execution: execution accuracy
    "rlfactory_android.reward",  # android_task: task success
    "rlfactory_android.tasks",  # the success checks of the android tasks
)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def split_fingerprint(env_name: str, split: str = "test") -> tuple[int, str]:
    env = get_component("env", env_name)()  # the env's default options, as `rlf train --env` uses
    build = getattr(env, "build_data", None)
    if build is not None:
        build()
    samples = env.dataset(None, split=split)
    # where a database lies is not what a test is (its contents are: DATA_FILES)
    canonical = "\n".join(json.dumps({k: v for k, v in dict(sample).items() if not k.endswith("_path")},
                                      sort_keys=True, default=str) for sample in samples)
    return len(samples), _sha(canonical.encode())


def _module_row(module_name: str) -> str:
    path = Path(importlib.import_module(module_name).__file__)
    return f"| `{module_name}` ({path.name}) | | `{_sha(path.read_bytes())}` |"


def main(argv: list[str]) -> None:
    print("| what | samples | sha256 (first 16) |\n|---|---|---|")
    for env_name in ENVS:
        count, digest = split_fingerprint(env_name)
        print(f"| `{env_name}` test split | {count} | `{digest}` |")
    for module_name in METRIC_MODULES:
        print(_module_row(module_name))
    if "--all" not in argv:
        sys.stdout.flush()
        return
    for env_name in ENVS:
        for split in MORE_SPLITS.get(env_name, ()):
            count, digest = split_fingerprint(env_name, split)
            print(f"| `{env_name}` {split} split | {count} | `{digest}` |")
        if env_name in DATA_FILES:
            data_dir = get_component("env", env_name)().build_data()
            for name in DATA_FILES[env_name]:
                print(f"| `{env_name}` {name} | | `{_sha((Path(data_dir) / name).read_bytes())}` |")
    for module_name in TASK_MODULES:
        print(_module_row(module_name))
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
