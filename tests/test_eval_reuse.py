"""The untrained model's eval, kept by one run and reused by the next (rlfactory_core.eval_reuse):
through real runs on a tiny model, and the key's parts one by one."""

from __future__ import annotations

import json
import logging
import os

import pytest

from rlfactory_core import eval_reuse, run as run_module
from rlfactory_core.config import load_config
from rlfactory_core.eval_reuse import CACHE_ENV, UntrainedEvals, reuse_enabled, reused_config
from rlfactory_core.metrics import read_metrics
from rlfactory_core.records import RunRecords
from rlfactory_core.testing import ScriptedBackend, scripted_backend, train
from rlfactory_core.models import load_tokenizer

SMALL_RUN = ["backend=hf", "grpo.prompts_per_step=2", "grpo.group_size=2", "data.eval_size=4", "eval.every=1",
             "eval.save_samples=2", "rollout.max_turns=2", "rollout.max_tokens_per_turn=24", "logging.live=off",
             "logging.tensorboard=false", "train.steps=1"]


class Env:
    name = "fingerprinted"

    def __init__(self, data: str | None = ""):
        self.data = data

    def data_fingerprint(self, samples):
        return self.data


class Bare:
    name = "bare"


def _evals(tmp_path, model_dir, *overrides, env=Env()):
    return UntrainedEvals(load_config([], list(overrides)), env, model_dir, root=tmp_path / "evals")


def test_the_key_changes_with_what_changes_the_eval_and_not_with_the_seed_of_a_greedy_eval(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"1234")
    samples = [{"question": "What is 2+2?", "answer": "4"}]
    key = _evals(tmp_path, model).key("eval", samples)
    assert key and key == _evals(tmp_path, model, "train.seed=7", "train.steps=99", "run_dir=x",
                                 "cold_start.source=demonstrations", "eval.every=3").key("eval", samples)
    changed = [
        _evals(tmp_path, model, "rollout.max_turns=7").key("eval", samples),
        _evals(tmp_path, model, "env_options={questions_per_episode: 2}").key("eval", samples),
        _evals(tmp_path, model, "eval.temperature=0.5").key("eval", samples),
        _evals(tmp_path, model, "logging.record_eval=false").key("eval", samples),
        _evals(tmp_path, model).key("eval-test", samples),  # another split: other files
        _evals(tmp_path, model).key("eval", [{"question": "What is 2+3?", "answer": "5"}]),
        _evals(tmp_path, model, env=Env("corpus v2")).key("eval", samples),
    ]
    assert key not in changed and len(set(changed)) == len(changed)
    # a sampled eval keys on the seed too
    sampled = [_evals(tmp_path, model, "eval.temperature=0.5", f"train.seed={s}").key("eval", samples) for s in (0, 1)]
    assert sampled[0] != sampled[1]
    # the model's files: a rewritten file is another model
    os.utime(model / "weights.bin", ns=(1, 1))
    assert _evals(tmp_path, model).key("eval", samples) != key
    # an env that cannot fingerprint what it reads is never reused
    assert _evals(tmp_path, model, env=Env(None)).key("eval", samples) is None
    assert _evals(tmp_path, model, env=Bare()).key("eval", samples) is None


class Failing(Env):
    def data_fingerprint(self, samples):
        raise ValueError("nl2sql sample s1: unknown db_id 'nowhere'")


def test_a_failing_fingerprint_means_no_reuse_not_a_failed_run(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="rlfactory.eval"):
        assert _evals(tmp_path, tmp_path, env=Failing()).key("eval", [{"question": "?"}]) is None
    assert "data_fingerprint failed: nl2sql sample s1: unknown db_id 'nowhere'" in caplog.text


def test_the_config_part_drops_only_what_cannot_touch_the_eval():
    greedy = reused_config(load_config([], []))
    assert "seed" not in greedy["train"] and "steps" not in greedy["train"] and "lr" in greedy["train"]
    assert not {"run_dir", "cold_start", "checkpoint"} & set(greedy)
    assert "record_eval" in greedy["logging"] and "live" not in greedy["logging"]
    assert "seed" in reused_config(load_config([], ["eval.temperature=1.0"]))["train"]


def test_an_entry_round_trips_a_damaged_one_is_removed_and_the_first_of_two_is_kept(tmp_path, caplog):
    evals = _evals(tmp_path, tmp_path)
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    (run_a / "samples").mkdir(parents=True)
    (run_a / "samples" / "step-000000.jsonl").write_text("line\n")
    evals.store("k", run_a, {"eval/reward/mean": 0.25}, [run_a / "samples" / "step-000000.jsonl"])
    evals.store("k", run_a, {"eval/reward/mean": 0.75}, [])  # a second run's store: the first is kept
    metrics, origin = evals.load("k", run_b)
    assert metrics == {"eval/reward/mean": 0.25} and origin["run_dir"] == str(run_a)
    assert (run_b / "samples" / "step-000000.jsonl").read_text() == "line\n"
    assert evals.load("other", run_b) is None
    (tmp_path / "evals" / "k" / "files" / "samples" / "step-000000.jsonl").unlink()
    with caplog.at_level(logging.WARNING, logger="rlfactory.eval"):
        assert evals.load("k", run_b) is None
    assert "damaged" in caplog.text and not (tmp_path / "evals" / "k").exists()
    # an entry that names a file outside it is refused, not copied
    (tmp_path / "evals" / "bad").mkdir()
    (tmp_path / "evals" / "bad" / "entry.json").write_text(json.dumps(
        {"format": 1, "metrics": {}, "files": ["../../escape"]}))
    assert evals.load("bad", run_b) is None and not (tmp_path / "escape").exists()


def test_a_store_that_cannot_write_is_a_warning(tmp_path, caplog):
    (tmp_path / "evals").write_text("a file where the directory would go")
    evals = _evals(tmp_path, tmp_path)
    with caplog.at_level(logging.WARNING, logger="rlfactory.eval"):
        evals.store("k", tmp_path, {"eval/reward/mean": 0.5}, [])
    assert "could not be kept" in caplog.text


def test_a_second_run_reuses_the_first_runs_untrained_eval_files_and_all(tmp_path, tiny_model_dir, monkeypatch,
                                                                          capsys):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "evals"))
    evaluated: list[int] = []
    real_run_eval = run_module.run_eval

    async def counted(step, *args, **kwargs):
        evaluated.append(step)
        return await real_run_eval(step, *args, **kwargs)

    monkeypatch.setattr(run_module, "run_eval", counted)
    runs = {}
    for name, extra in (("first", ["train.seed=0"]), ("second", ["train.seed=1"]),
                        ("off", ["train.seed=1", "eval.reuse_untrained=false"])):
        evaluated.clear()
        runs[name] = tmp_path / name
        config = load_config([], [*SMALL_RUN, f"model.name={tiny_model_dir}", f"run_dir={runs[name]}",
                                  "eval.reuse_untrained=true", *extra])
        capsys.readouterr()
        train(config)
        runs[name, "evaluated"], runs[name, "out"] = list(evaluated), capsys.readouterr().out
    # the eval before training ran in the first run and in the one with reuse off, not in the second
    assert runs["first", "evaluated"] == [0, 1] and runs["second", "evaluated"] == [1]
    assert runs["off", "evaluated"] == [0, 1]
    before = {name: {k: v for k, v in read_metrics(runs[name])[0].items() if k != "time"}
              for name in ("first", "second", "off")}
    assert before["first"]["step"] == 0 and "eval/reward/mean" in before["first"]
    assert before["second"] == before["first"] == before["off"]  # greedy: the same eval, run or reused
    for name in ("samples/step-000000.jsonl", "trajectories/eval/step-000000.parquet"):
        assert (runs["second"] / name).read_bytes() == (runs["first"] / name).read_bytes()
    assert len(RunRecords(runs["second"]).list("eval", 0)) == 4
    assert f"eval before training (eval) reused from {runs['first']}" in runs["second", "out"]
    assert "reused" not in runs["first", "out"] + runs["off", "out"]
    assert len(list((tmp_path / "evals").iterdir())) == 1


def test_a_scripted_backend_turns_reuse_off(tiny_model_dir):
    assert reuse_enabled()
    with scripted_backend(ScriptedBackend(load_tokenizer(tiny_model_dir), lambda text: "4")):
        assert not reuse_enabled()
    assert reuse_enabled() and os.environ[CACHE_ENV] != "off"
