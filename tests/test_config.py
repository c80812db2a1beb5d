"""The run config: defaults, presets, files, overrides, and every error reported at once."""

import pytest
import yaml

from rlfactory_core.config import PRESETS, RunConfig, describe, load_config, parse_overrides
from rlfactory_core.errors import ConfigError


def test_defaults_validate_and_are_cpu_sized():
    config = load_config()
    assert isinstance(config, RunConfig)
    assert config.env == "arithmetic" and config.rewards[0].name == "exact_match"
    assert config.grpo.group_size >= 2 and config.train.bf16


def test_layers_apply_in_order(tmp_path):
    first = tmp_path / "a.yaml"
    first.write_text(yaml.safe_dump({"train": {"lr": 3e-6, "steps": 7}, "grpo": {"group_size": 6}}))
    second = tmp_path / "b.yaml"
    second.write_text(yaml.safe_dump({"train": {"steps": 9}}))
    config = load_config([first, second], ["grpo.group_size=5", "rollout.sampling.temperature=0.5"],
                         preset="cpu-smoke", flags={"env": "arithmetic"})
    assert config.train.lr == 3e-6  # file over preset
    assert config.train.steps == 9  # later file over earlier
    assert config.grpo.group_size == 5  # override over file
    assert config.rollout.sampling.temperature == 0.5
    assert config.rollout.max_tokens_per_turn == PRESETS["cpu-smoke"]["rollout"]["max_tokens_per_turn"]


def test_preset_can_be_named_in_a_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("preset: cpu-smoke\ntrain:\n  steps: 3\n")
    config = load_config([path])
    assert config.train.steps == 3 and config.grpo.group_size == PRESETS["cpu-smoke"]["grpo"]["group_size"]


def test_override_values_are_yaml():
    tree, problems = parse_overrides(["train.lr=1e-6", "rewards=[{name: exact_match, weight: 2}]",
                                      "model.lora.enabled=true", "run_dir="])
    assert not problems
    assert tree["train"]["lr"] == 1e-6 and tree["model"]["lora"]["enabled"] is True
    assert tree["rewards"] == [{"name": "exact_match", "weight": 2}]
    assert tree["run_dir"] == ""


def test_every_problem_is_reported_at_once(tmp_path):
    bad_file = tmp_path / "bad.yaml"
    bad_file.write_text("train:\n  lr: -1\n  stepz: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config([bad_file, tmp_path / "missing.yaml"],
                    ["grpo.group_size=1", "grpo.advantage_norm=median", "nonsense", "rollout.max_turns=x"])
    errors = info.value.errors
    text = "\n".join(errors)
    assert any(e.startswith("train.lr:") for e in errors)
    assert any(e.startswith("train.stepz: unknown key") for e in errors)
    assert any(e.startswith("grpo.group_size:") for e in errors)
    assert any(e.startswith("grpo.advantage_norm:") for e in errors)
    assert any(e.startswith("rollout.max_turns:") for e in errors)
    assert "missing.yaml" in text and "does not exist" in text
    assert "'nonsense': an override is KEY=VALUE" in text
    assert len(errors) == 7
    assert all("\n" not in e for e in errors)


def test_unknown_preset_and_bad_yaml(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        load_config([path], preset="laptop")
    text = "\n".join(info.value.errors)
    assert "unknown preset 'laptop'" in text and "not valid YAML" in text


def test_cross_field_rules():
    with pytest.raises(ConfigError, match="each reward may appear once"):
        load_config([], ["rewards=[{name: exact_match}, {name: exact_match}]"])
    with pytest.raises(ConfigError, match="mini_batches"):
        load_config([], ["grpo.prompts_per_step=1", "grpo.group_size=2", "grpo.mini_batches=3"])
    with pytest.raises(ConfigError, match="at least one reward"):
        load_config([], ["rewards=[]"])
    with pytest.raises(ConfigError, match="eval.rewards: each reward may appear once"):
        load_config([], ["eval.rewards=[{name: f1}, {name: f1}]"])
    assert load_config([]).eval.rewards is None  # evaluation uses the training rewards
    assert [r.name for r in load_config([], ["eval.rewards=[{name: f1}]"]).eval.rewards] == ["f1"]


def test_presets_are_valid():
    for name in PRESETS:
        load_config(preset=name)


def test_describe_lists_every_leaf_key_with_help():
    rows = {key: (default, help_text) for key, default, help_text in describe()}
    for key in ("train.lr", "grpo.clip_high", "rollout.sampling.temperature", "model.lora.r", "logging.wandb_project"):
        assert key in rows and rows[key][1]
    assert rows["grpo.group_size"][0] == "4"


def test_ray_engine_options_are_checked_up_front():
    config = load_config([], ["engine=ray", "ray.trainer.workers=2", "ray.judge.rewards=[exact_match]"])
    assert config.ray.trainer.workers == 2 and config.ray.placement == "colocated"
    with pytest.raises(ConfigError, match="ray engine trains all weights"):
        load_config([], ["engine=ray", "model.lora.enabled=true"])
    with pytest.raises(ConfigError, match=r"ray.judge.rewards: \['qwq_judge'\] are not in rewards"):
        load_config([], ["engine=ray", "ray.judge.rewards=[qwq_judge]"])
    with pytest.raises(ConfigError, match="ray.rollout.workers must be at least 1"):
        load_config([], ["engine=ray", "ray.rollout.workers=0"])
    with pytest.raises(ConfigError) as info:
        load_config([], ["ray.trainer.cpus=0", "ray.placement=spread", "ray.unknown=1"])
    text = str(info.value)
    assert "ray.trainer.cpus" in text and "ray.placement" in text and "ray.unknown" in text
    rows = {key for key, _, _ in describe()}
    assert {"ray.trainer.gpus", "ray.judge.rewards", "ray.tool_actors.names", "ray.address"} <= rows


def test_weights_trained_in_full_must_be_float32():
    with pytest.raises(ConfigError) as info:
        load_config([], ["model.dtype=bfloat16"])
    (error,) = info.value.errors
    assert error.startswith("model.dtype:") and "float32" in error and "model.lora.enabled" in error
    # a bf16 base under LoRA adapters is fine (peft keeps the adapters in float32)
    assert load_config([], ["model.dtype=bfloat16", "model.lora.enabled=true"]).model.dtype == "bfloat16"
    assert load_config(preset="gpu").model.dtype == "float32"


def test_eval_splits_are_checked_up_front(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError) as raised:
        load_config([], ["eval.splits=[test, test, 'a b']"])
    assert any("eval.splits" in e and "test named twice" in e for e in raised.value.errors)
    for bad in ("[..]", "['a/b']", "[reward]", "[cold_start]"):
        with pytest.raises(ConfigError, match="eval.splits"):
            load_config([], [f"eval.splits={bad}"])
    assert load_config([], ["eval.splits=[test]"]).eval.splits == ["test"]
    # a split the env does not have: one line naming it, before anything runs
    from rlfactory_core.testing import train

    config = load_config([], [f"model.name={tiny_model_dir}", "backend=hf", f"run_dir={tmp_path / 'run'}",
                              "eval.splits=[nope]", "logging.live=off"])
    with pytest.raises(ConfigError, match=r"eval.splits: the 'arithmetic' env cannot give its 'nope' split"):
        train(config)
    assert not (tmp_path / "run").exists()


def test_every_problem_comes_at_once_fields_and_checks_across_settings():
    from rlfactory_core.config import validate_config

    config, problems = validate_config({"train": {"lr": "fast"},
                                        "grpo": {"prompts_per_step": 1, "group_size": 2, "mini_batches": 5},
                                        "rollout": {"max_tokens_per_turn": 100, "max_trajectory_tokens": 50}})
    assert config is None and len(problems) == 3
    assert problems[0].startswith("train.lr: Input should be a valid number")
    assert problems[1].startswith("grpo.mini_batches (5) is more than the trajectories per step (2 ")
    assert problems[2] == "rollout.max_trajectory_tokens must be at least rollout.max_tokens_per_turn"
    # a rule about a setting that is itself invalid is not checked against its default instead
    config, problems = validate_config({"grpo": {"group_size": "x", "mini_batches": 500}})
    assert len(problems) == 1 and problems[0].startswith("grpo.group_size:")
