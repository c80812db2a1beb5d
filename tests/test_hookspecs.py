"""Docs and tests keep up with the hooks: PLUGINS.md is generated, every hook is documented
and exercised through the real plugin manager by some test."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlfactory_core import hookspecs

ROOT = Path(__file__).resolve().parent.parent
HOOKS = sorted(name for name, fn in vars(hookspecs).items() if name.startswith("rlfactory_") and inspect.isfunction(fn))


def test_plugins_md_is_up_to_date():
    result = subprocess.run([sys.executable, "scripts/generate_plugins_md.py", "--check"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_fully_documented(hook):
    fn = getattr(hookspecs, hook)
    doc = inspect.getdoc(fn) or ""
    for param in inspect.signature(fn).parameters:
        assert f":param {param}:" in doc, f"{hook}: parameter {param!r} is not documented"
    assert ":return:" in doc, f"{hook}: the return value is not documented"
    assert "Calling convention:" in doc, f"{hook}: the calling convention is not documented"
    assert re.search(r"Added in \d+\.\d+", doc), f"{hook}: the version it was added in is missing"
    plugins_md = (ROOT / "PLUGINS.md").read_text()
    assert f"### `{hook}`" in plugins_md


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_a_test(hook):
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py"))
    assert f'exercises_hook("{hook}")' in sources, (
        f"no test is marked @pytest.mark.exercises_hook({hook!r}); write one that calls it through the plugin manager"
    )


def test_importing_the_core_stays_light():
    code = ("import sys, rlfactory_core, rlfactory_core.plugins, rlfactory_core.models; "
            "rlfactory_core.plugins.plugin_infos(); "
            "print(sorted(m for m in ('torch', 'vllm', 'ray', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
