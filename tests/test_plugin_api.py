"""The plugin API: one import (``rlfactory_core``), declared interfaces, a version.

First-party plugins and contrib are read with ``ast`` (the template as ``rlf plugins new``
renders it, with every component kind) and held to the API; the interface table is checked against the core's own
reads of optional members; the version check runs through the real plugin manager in
tests/test_plugins.py.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

import rlfactory_core
from rlfactory_core import interfaces, testing
from rlfactory_core.version import API_ATTRIBUTE, PLUGIN_API_VERSION, api_version_problem

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "contrib" / "cookiecutter-rlfactory-plugin"
#: where first-party plugin code lives: each plugin's package and tests
PLUGIN_SOURCES = sorted([*ROOT.glob("plugins/*/"), *ROOT.glob("contrib/rlfactory-plugin-*/")])
ALLOWED = {"rlfactory_core": rlfactory_core, "rlfactory_core.testing": testing}


@pytest.fixture(scope="module")
def rendered_template(tmp_path_factory) -> Path:
    """The template rendered with every component kind: what a plugin author starts from."""
    from rlfactory_cli.scaffold import TEMPLATE_KINDS, create_plugin

    return create_plugin("apicheck", kinds=TEMPLATE_KINDS, output_dir=tmp_path_factory.mktemp("template"))


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _python_files(root: Path) -> list[Path]:
    skip = {".venv", "build", "dist", "__pycache__"}
    return [p for p in sorted(root.rglob("*.py")) if not skip & set(p.relative_to(root).parts)]


def _import_problems(path: Path, root: Path = ROOT) -> list[str]:
    problems = []
    where = path.relative_to(root)
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "rlfactory_core" and alias.name not in ALLOWED:
                    problems.append(f"{where}:{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "rlfactory_core":
                continue
            module = ALLOWED.get(node.module)
            if module is None:
                problems.append(f"{where}:{node.lineno}: from {node.module} import ...")
                continue
            for alias in node.names:
                if alias.name not in module.__all__:
                    problems.append(f"{where}:{node.lineno}: from {node.module} import {alias.name} "
                                    f"(not in {node.module}.__all__)")
    return sorted(problems, key=lambda p: int(p.split(":")[1]))


def test_plugins_and_contrib_import_only_the_plugin_api(rendered_template):
    files = [p for root in PLUGIN_SOURCES for p in _python_files(root)]
    assert len(files) > 50, "the scan found too few files: has the plugin layout moved?"
    problems = [p for path in files for p in _import_problems(path)]
    template_files = _python_files(rendered_template)
    assert len(template_files) >= 6, "the rendered template has too few modules"
    problems += [f"{TEMPLATE.relative_to(ROOT)} (rendered): {p}" for path in template_files
                 for p in _import_problems(path, rendered_template)]
    assert not problems, (
        "first-party plugins import only `rlfactory_core` (the plugin API) and, in tests, "
        "`rlfactory_core.testing`; import these names from there (or export them there, see "
        "PLUGINS.md 'Moving a plugin to the 0.2 layout'):\n" + "\n".join(problems))


def test_the_scan_names_file_and_line_of_a_deep_import(tmp_path):
    module = tmp_path / "plugin.py"
    module.write_text("from rlfactory_core import hookimpl\n\n"
                      "def f():\n    from rlfactory_core.models import load_tokenizer\n"
                      "import rlfactory_core.trainer\nfrom rlfactory_core import trainer\n")
    assert _import_problems(module, tmp_path) == ["plugin.py:4: from rlfactory_core.models import ...",
                        "plugin.py:5: import rlfactory_core.trainer",
                        "plugin.py:6: from rlfactory_core import trainer (not in rlfactory_core.__all__)"]


def test_every_exported_name_resolves():
    for module in ALLOWED.values():
        missing = [name for name in module.__all__ if not hasattr(module, name)]
        assert not missing, f"{module.__name__}.__all__ names what it does not have: {missing}"
        assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        rlfactory_core.no_such_name  # noqa: B018


def test_the_plugin_api_loads_heavy_names_only_on_use():
    code = ("import sys, rlfactory_core\n"
            "from rlfactory_core import hookimpl, Message, ConfigError, get_component, function_tool, member\n"
            "heavy = ('torch', 'vllm', 'ray', 'transformers', 'rlfactory_core.rollout', 'rlfactory_core.models')\n"
            "print(sorted(m for m in heavy if m in sys.modules))\n"
            "from rlfactory_core import SamplingParams\n"
            "print(SamplingParams.__module__.startswith('rlfactory_core.rollout'))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split("\n")[:2] == ["[]", "True"]


def test_every_first_party_plugin_declares_the_api_it_supports(rendered_template):
    first_party = {p.name for p in PLUGIN_SOURCES}
    checked = set()
    for dist in importlib.metadata.distributions():
        if dist.metadata["Name"] not in first_party:
            continue
        for ep in dist.entry_points.select(group="rlfactory"):
            plugin = ep.load()
            assert isinstance(getattr(plugin, API_ATTRIBUTE, None), str), (
                f"{dist.metadata['Name']}: {ep.value} declares no {API_ATTRIBUTE} = '...' (see PLUGINS.md)")
            assert api_version_problem(plugin) is None, f"{dist.metadata['Name']}: {api_version_problem(plugin)}"
            checked.add(dist.metadata["Name"])
    assert checked == first_party, f"not installed, so not checked: {sorted(first_party - checked)}"
    template = _parse(rendered_template / "rlfactory_plugin_apicheck" / "__init__.py")
    assert any(isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)]
               == [API_ATTRIBUTE] for node in template.body), f"the template's package declares no {API_ATTRIBUTE}"


@pytest.mark.parametrize(("declared", "problem"), [
    (">=1.0,<2", None),
    (None, None),
    (">=99", r"needs plugin API '>=99' but rlfactory \S+ provides plugin API 1\.3: upgrade rlfactory"),
    ("<1.0", r"needs plugin API '<1.0' .*: upgrade the plugin"),
    ("==0.9", r"upgrade the plugin"),
    ("~=99.0", r"upgrade rlfactory"),
    ("1.0", r"declares rlfactory_api = '1.0', which is not a version range: write e.g. rlfactory_api = "),
    (1.0, r"declares rlfactory_api = 1.0, which is not a version range: write it as a string"),
])
def test_api_version_problem_says_what_to_do(declared, problem):
    assert PLUGIN_API_VERSION == "1.3"

    class Plugin:
        rlfactory_api = declared

    found = api_version_problem(Plugin)
    if problem is None:
        assert found is None
    else:
        assert found is not None and re.search(problem, found), found
        assert "\n" not in found


def test_optional_members_default_in_one_place():
    class Bare:
        pass

    class Explicit:
        tools = ["t"]
        config_defaults = None  # None means "not set": the default applies

    assert interfaces.member("env", Bare(), "tools") == ()
    assert interfaces.member("env", Explicit(), "tools") == ["t"]
    assert interfaces.member("env", Explicit, "config_defaults") == {}
    assert interfaces.member("env", Bare, "shows_images") is False
    assert interfaces.member("reward", Bare(), "close") is None
    with pytest.raises(KeyError, match="env member 'tool' .* is not declared"):
        interfaces.member("env", Bare(), "tool")

    class Env:
        def __init__(self, parser="qwen3"):
            pass

    assert interfaces.accepts("env", Env, "parser")
    assert not interfaces.accepts("env", Bare, "parser")
    assert not interfaces.accepts("reward", len, "context")  # a signature that cannot be read


def _member_reads() -> list[tuple[str, int, str, str, str]]:
    """(file, line, function, kind, name) of every member()/accepts() call in the core."""
    reads = []
    for path in sorted((ROOT / "rlfactory_core").rglob("*.py")) + sorted((ROOT / "cli").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("member", "accepts") and len(node.args) == 3):
                kind, _, name = node.args
                if isinstance(kind, ast.Constant) and isinstance(name, ast.Constant):
                    reads.append((str(path.relative_to(ROOT)), node.lineno, node.func.id, kind.value, name.value))
    return reads


def test_the_core_reads_optional_members_only_as_declared():
    reads = _member_reads()
    assert len(reads) >= 8, "the core's reads of optional members were not found"
    declared = {(m.kind, m.name): m for m in interfaces.MEMBERS}
    problems = []
    for where, line, function, kind, name in reads:
        member = declared.get((kind, name))
        if member is None or (member.form == "parameter") != (function == "accepts"):
            problems.append(f"{where}:{line}: {function}({kind!r}, ..., {name!r}) is not declared in "
                            f"rlfactory_core.interfaces.MEMBERS")
    assert not problems, "\n".join(problems)


def test_the_core_reads_optional_members_through_the_interface_table():
    # getattr(component, "shows_images", False) scattered through the core is how the
    # contract came to be partly hidden: every read of an optional member goes through
    # member()/accepts(), so its default is the one in MEMBERS.
    optional = {m.name for m in interfaces.MEMBERS if not m.required and m.form != "parameter"}
    parameters = {m.name for m in interfaces.MEMBERS if m.form == "parameter"}
    problems = []
    for path in sorted((ROOT / "rlfactory_core").rglob("*.py")) + sorted((ROOT / "cli").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in optional):
                problems.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.func.id}(..., {node.args[1].value!r})"
                                f" -> rlfactory_core.interfaces.member(KIND, obj, {node.args[1].value!r})")
            # "context" in inspect.signature(fn).parameters: an optional parameter read by hand
            if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant)
                    and node.left.value in parameters and isinstance(node.ops[0], (ast.In, ast.NotIn))
                    and isinstance(node.comparators[0], ast.Attribute)
                    and node.comparators[0].attr == "parameters"):
                problems.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.left.value!r} in ...parameters"
                                f" -> rlfactory_core.interfaces.accepts(KIND, fn, {node.left.value!r})")
    assert not problems, ("optional component members are read with interfaces.member() and accepts() (their "
                          "defaults are declared once, in MEMBERS):\n" + "\n".join(problems))


def test_plugins_md_renders_every_interface_member():
    text = (ROOT / "PLUGINS.md").read_text()
    for member in interfaces.MEMBERS:
        assert member.signature.replace("|", "\\|") in text, f"PLUGINS.md does not show {member.kind}.{member.name}"
    assert "## Moving a plugin to the 0.2 layout" in text
    assert f"`rlfactory_core.PLUGIN_API_VERSION` is `{PLUGIN_API_VERSION}`" in text
