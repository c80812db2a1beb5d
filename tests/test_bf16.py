"""``train.bf16``: auto turns bf16 autocast on only where bf16 matmuls are the fast ones (on an
AVX2 CPU torch emulates them, ~35x slower than float32; with AVX512-BF16 but no AMX they ran
1.75x slower)."""

from __future__ import annotations

import io
import sys

import pytest
import torch
from rich.console import Console

from rlfactory_core.config import load_config
from rlfactory_core.errors import ConfigError
from rlfactory_core.testing import train
from rlfactory_core.training.logprobs import bf16_autocast, bf16_warning, cpu_bf16_is_fast, native_bf16

CPU = torch.device("cpu")


def test_auto_follows_the_devices_native_bf16_and_explicit_settings_are_kept():
    assert bf16_autocast("auto", CPU) is native_bf16("cpu")
    flags = open("/proc/cpuinfo").read().split() if sys.platform == "linux" else []
    assert native_bf16("cpu") is (bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()) and "amx_bf16" in flags
                                  and "amx_tile" in flags)
    assert bf16_autocast(True, CPU) is True and bf16_autocast(False, CPU) is False
    assert bf16_warning("auto", CPU) is None and bf16_warning(False, CPU) is None
    warning = bf16_warning(True, CPU)
    assert (warning is None) is native_bf16("cpu")
    if warning is not None:
        assert "train.bf16=auto" in warning


def test_only_amx_makes_a_cpus_bf16_the_fast_choice():
    avx2 = {"fma", "avx", "avx2"}
    avx512_bf16 = avx2 | {"avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"}  # this project's Intel kind
    sapphire_rapids = avx512_bf16 | {"amx_bf16", "amx_tile", "amx_int8"}
    assert not cpu_bf16_is_fast(avx2)
    assert not cpu_bf16_is_fast(avx512_bf16)
    assert cpu_bf16_is_fast(sapphire_rapids)
    assert not cpu_bf16_is_fast(set())  # no /proc/cpuinfo (not Linux): float32


def test_the_setting_is_validated():
    assert load_config([], []).train.bf16 == "auto"
    assert load_config([], ["train.bf16=true"]).train.bf16 is True
    assert load_config([], ["train.bf16=false"]).train.bf16 is False
    with pytest.raises(ConfigError, match="train.bf16"):
        load_config([], ["train.bf16=sometimes"])


def test_a_run_asked_for_emulated_bf16_warns_at_its_start(tmp_path, tiny_model_dir, monkeypatch):
    import rlfactory_core.training.logprobs as logprobs

    monkeypatch.setattr(logprobs, "native_bf16", lambda device_type: False)  # as on an AVX2 CPU
    output = io.StringIO()
    config = load_config([], ["backend=hf", f"model.name={tiny_model_dir}", "train.bf16=true", "train.steps=1",
                              "grpo.prompts_per_step=1", "grpo.group_size=2", "data.eval_size=1", "eval.every=0",
                              "eval.save_samples=0", "rollout.max_turns=1", "rollout.max_tokens_per_turn=4",
                              "logging.live=off", "logging.tensorboard=false", f"run_dir={tmp_path / 'run'}"])
    train(config, console=Console(file=output, width=300))
    assert "warning: train.bf16=true on a cpu whose bf16 matmuls are slower than float32" in output.getvalue()
