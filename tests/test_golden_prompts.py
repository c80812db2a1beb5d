"""The embedded model's prompts, pinned: every shipped env's opening prompt ids, rendered
by the family a run picks for the embedded model (``template``: its chat template) with the
env's default tool-call format. The recipes were tuned on these ids; a change of the core
that moves one id fails here. Re-record only for an intended change (and re-run the
recipes, saying so in the commit): ``RLF_RECORD_GOLDEN=1 pytest tests/test_golden_prompts.py``.

The pins are sha256 digests of the ids of each env's first two training samples' prompts
(with their lengths, to say how far off a failure is). Recorded when model families came
in, and checked equal to the ids the code before them (commit ec8c275: the chat template
with the parser's tools prompt) gives for the same samples."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path

import pytest

from rlfactory_core.config import load_config
from rlfactory_core.data import load_samples
from rlfactory_core.families import build_family, choose_family
from rlfactory_core.interfaces import member
from rlfactory_core.models import load_tokenizer
from rlfactory_core.testing import build_task

GOLDEN = Path(__file__).parent / "data" / "golden_prompts.json"
#: the shipped envs and the options that make them run offline here (their defaults otherwise)
ENVS = {
    "arithmetic": [],
    "nl2sql": [],
    "deepsearch": [],
    "android": ["env_options={backend: simulated}"],
}


async def _prompts(env: str, overrides: list[str], model_dir) -> dict:
    config = load_config([], [f"env={env}", f"model.name={model_dir}", *overrides])
    task = build_task(config)
    try:
        tokenizer = load_tokenizer(model_dir)
        choice = choose_family(config, tokenizer)
        family = build_family(config, task, tokenizer)
        pins = []
        for sample in load_samples(config, task.env, "train", 2):
            reset = await task.env.reset(sample)
            _, ids = family.prompt(reset.messages, reset.tools)
            await task.env.close(reset.state)
            pins.append({"tokens": len(ids), "sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest()})
        return {"family": choice.name, "format": config.parser, "prompts": pins}
    finally:
        await task.close()


@pytest.mark.parametrize("env", sorted(ENVS))
def test_the_embedded_models_prompts_are_as_the_recipes_were_tuned_on(env, default_model_dir):
    got = asyncio.run(_prompts(env, ENVS[env], default_model_dir))
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if os.environ.get("RLF_RECORD_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps({**golden, env: got}, indent=1, sort_keys=True) + "\n")
        pytest.skip("recorded")
    assert env in golden, f"no pin for {env}: record it (RLF_RECORD_GOLDEN=1)"
    assert got["family"] == "template", "the embedded model renders with its own chat template"
    assert got == golden[env]
