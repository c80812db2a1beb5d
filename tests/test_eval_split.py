"""Evaluation during training: which split it reads (``data.eval_split``, ``data.eval_size``)
and its per-question-kind accuracy."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlfactory_core.config import load_config
from rlfactory_core.errors import ConfigError
from rlfactory_core.evaluation import accuracy_by_kind
from rlfactory_core.testing import train


def test_accuracy_by_kind_counts_judged_trajectories_of_samples_that_name_a_kind():
    samples = [{"kind": "region"}, {"kind": "region"}, {"kind": "capital"}, {"question": "no kind"},
               {"kind": "capital"}]
    trajectories = [SimpleNamespace(group=i) for i in range(5)]
    correct = [True, False, True, True, None]  # the last one no reward judged
    assert accuracy_by_kind("eval/reward/accuracy", trajectories, samples, correct) == {
        "eval/reward/accuracy/kind/capital": 1.0, "eval/reward/accuracy/kind/region": 0.5}
    assert accuracy_by_kind("p", trajectories, [{}] * 5, correct) == {}


def test_eval_split_and_size_are_validated():
    config = load_config([], ["data.eval_split=validation", "data.eval_size=null"])
    assert (config.data.eval_split, config.data.eval_size) == ("validation", None)
    assert load_config([], []).data.eval_split == "test"
    with pytest.raises(ConfigError) as caught:
        load_config([], ["data.eval_split=", "data.eval_size=0"])
    text = str(caught.value)
    assert "data.eval_split" in text and "data.eval_size" in text


def test_a_run_evaluates_on_the_configured_split(tmp_path):
    # The arithmetic env has no validation split: the run asks for it, before loading any model.
    config = load_config([], ["data.eval_split=validation", f"run_dir={tmp_path / 'run'}", "logging.live=off"])
    with pytest.raises(ConfigError, match="cannot give its 'validation' split"):
        train(config)
