"""Every first-party plugin installs on its own (`pip install plugins/NAME`): a normal,
non-editable wheel, installed into an empty directory, is found through its entry point,
registers its components and is listed by `rlf plugins list`."""

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
PLUGIN_DIRS = sorted([*REPO_ROOT.glob("plugins/*/pyproject.toml"), *REPO_ROOT.glob("contrib/rlfactory-plugin-*/pyproject.toml")])


@pytest.mark.slow
@pytest.mark.parametrize("pyproject", PLUGIN_DIRS, ids=lambda path: path.parent.name)
def test_the_plugin_installs_on_its_own_from_a_wheel(pyproject, tmp_path):
    project = tomllib.loads(pyproject.read_text())["project"]
    [(entry_name, module)] = project["entry-points"]["rlfactory"].items()
    copy = tmp_path / "source"
    shutil.copytree(pyproject.parent, copy, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "tests"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    built = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--wheel-dir",
                            str(tmp_path / "dist"), str(copy)], capture_output=True, text=True, cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    [wheel] = (tmp_path / "dist").glob("*.whl")
    site = tmp_path / "site"
    installed = subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
                               capture_output=True, text=True, cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr
    # The installed copy (first on the path) is the one the plugin manager loads.
    script = ("import sys, importlib; from rlfactory_core.plugins import get_plugin_manager; "
              "pm = get_plugin_manager(); plugin = pm.get_plugin(sys.argv[1]); "
              "print(importlib.import_module(sys.argv[2]).__file__, plugin is not None)")
    shown = subprocess.run([sys.executable, "-c", script, entry_name, module], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(site)}, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    module_file, loaded = shown.stdout.split()
    assert Path(module_file).is_relative_to(site) and loaded == "True"
    assert project["name"] in {path.name.split("-0")[0].replace("_", "-") for path in (tmp_path / "dist").glob("*.whl")}
    listed = subprocess.run([sys.executable, "-m", "rlfactory_cli", "plugins", "list", "--json"], capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": str(site)}, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    [row] = [row for row in json.loads(listed.stdout) if row["name"] == entry_name]
    assert row["status"] == "ok" and row["distribution"] == project["name"] and row["components"], row
