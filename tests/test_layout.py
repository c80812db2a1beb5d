"""The core's layout rules, read from the source with ``ast`` (nothing is imported):

- no module imports another module's ``_private`` name, by ``from m import _name`` or as
  ``m._name`` on an imported module (a private *module*, such as ``_fs.py``, may be
  imported inside the core);
- nothing but the CLI imports ``rlfactory_core.trainer``: tests, benchmarks, scripts and
  plugins reach ``train`` through ``rlfactory_core.testing`` (the one other module allowed
  to import it), so the trainer can change shape without breaking them;
- no import circles among the core's modules, function-local imports included (they are how
  a circle hides: it works until the first call in the wrong order);
- data moves one way: every core module belongs to a layer of :data:`LAYERS`, and imports
  only from its own layer and those before it;
- no module of the core is longer than 600 lines unless its docstring has a line starting
  ``Size:`` that says why;
- the trainer stays short after the change that shortened it: ``trainer.py`` at most 300
  lines, each schedule's loop (``loops/*.py``) at most 150, no function in them over 70
  lines, and no ``Size:`` exemption for them (new features go into the phases and modules
  the loop calls, not into the loop).

Each failure names the file and line and what to do.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "rlfactory_core"
CLI = ROOT / "cli" / "rlfactory_cli"
MAX_LINES = 600
TRAINER = "rlfactory_core.trainer"
# Who may import the trainer: the CLI runs it; rlfactory_core.testing hands `train` to tests.
TRAINER_IMPORTERS = ("cli/rlfactory_cli/", "rlfactory_core/testing.py", "rlfactory_core/trainer.py")
# Everything else first-party that could import it. The cookiecutter template is Jinja, not
# Python, until rendered; its rendered tests are checked where core tests render it.
TRAINER_SCAN = ("rlfactory_core", "cli", "tests", "bench", "scripts", "plugins", "contrib")
SKIP_PARTS = {".venv", "build", "dist", "__pycache__", "cookiecutter-rlfactory-plugin", ".git"}


@dataclass(frozen=True)
class Import:
    """One imported module (``target``) and, for ``from target import name``, the name."""

    source: str  # the importing file, relative to the repository
    line: int
    target: str  # absolute module name
    name: str | None  # the imported name, None for `import target` or a whole submodule
    local: bool  # inside a function: runs at call time, not import time


def module_name(path: Path) -> str:
    """The name Python imports a core or CLI file by (the CLI's package lives under cli/)."""
    parts = path.relative_to(CLI.parent if path.is_relative_to(CLI) else ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def core_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(CORE.rglob("*.py")) if "__pycache__" not in p.parts}


def python_files(*tops: str) -> list[Path]:
    files = []
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            if not SKIP_PARTS & set(path.relative_to(ROOT).parts):
                files.append(path)
    return files


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class ImportCollector(ast.NodeVisitor):
    """Every import of a file, with the absolute module it names, skipping ``if TYPE_CHECKING:``
    blocks (never run)."""

    def __init__(self, path: Path, package: str, known: set[str]):
        self.path, self.package, self.known = path, package, known
        self.rel = str(path.relative_to(ROOT))
        self.imports: list[Import] = []
        self.depth = 0
        self.aliases: dict[str, str] = {}  # local name -> module it is bound to
        self.tree: ast.AST | None = None

    def visit_FunctionDef(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.imports.append(Import(self.rel, node.lineno, alias.name, None, self.depth > 0))
            self.aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                alias.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            base = base[:len(base) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        for alias in node.names:
            submodule = f"{target}.{alias.name}"
            if submodule in self.known or self.is_module(submodule):
                self.imports.append(Import(self.rel, node.lineno, submodule, None, self.depth > 0))
                self.aliases[alias.asname or alias.name] = submodule
            else:
                self.imports.append(Import(self.rel, node.lineno, target, alias.name, self.depth > 0))

    @staticmethod
    def is_module(dotted: str) -> bool:
        base = CLI.parent if dotted.startswith("rlfactory_cli") else ROOT
        path = base.joinpath(*dotted.split("."))
        return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def collect(path: Path, known: set[str], source: str | None = None) -> ImportCollector:
    """The imports of ``path`` (of ``source`` when given, as if it were that file)."""
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    name = module_name(path) if path.is_relative_to(CORE) or path.is_relative_to(CLI) else ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    collector = ImportCollector(path, package, known)
    collector.visit(tree)
    collector.tree = tree
    return collector


FIRST_PARTY = ("rlfactory_core", "rlfactory_cli")


def private_uses(collector: ImportCollector) -> list[str]:
    """``file:line: ...`` for every private name of another first-party module the file
    imports (``from m import _x``) or reaches on an imported module (``m._x``)."""
    problems = []
    for imp in collector.imports:
        if imp.name and is_private(imp.name) and imp.target.split(".")[0] in FIRST_PARTY:
            problems.append(f"{imp.source}:{imp.line}: imports {imp.name} from {imp.target}, a name private to "
                            f"that module; make it public there (no leading '_', in its __all__) or move it to "
                            f"the module that uses it")
    modules = {local: target for local, target in collector.aliases.items() if target.split(".")[0] in FIRST_PARTY}
    for node in ast.walk(collector.tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and is_private(node.attr) and not collector.is_module(f"{modules[node.value.id]}.{node.attr}")):
            problems.append(f"{collector.rel}:{node.lineno}: uses {node.value.id}.{node.attr}, a name private to "
                            f"{modules[node.value.id]}; make it public there or move it")
    return problems


def test_no_module_imports_another_modules_private_name():
    """The core, the CLI, and the benchmarks and scripts that drive the core (a private name
    they reach breaks silently at the next rename). Tests may reach a private name to inject
    a fault (a monkeypatch); they are not scanned."""
    known = set(core_modules())
    problems = []
    for path in python_files("rlfactory_core", "cli/rlfactory_cli", "bench", "scripts"):
        problems += private_uses(collect(path, known))
    assert not problems, f"{len(problems)} private name(s) used across modules:\n" + "\n".join(problems)


def test_nothing_but_the_cli_imports_the_trainer():
    known = set(core_modules())
    problems = []
    for path in python_files(*TRAINER_SCAN):
        rel = str(path.relative_to(ROOT))
        if rel.startswith(TRAINER_IMPORTERS):
            continue
        try:
            collector = collect(path, known)
        except SyntaxError as exc:
            problems.append(f"{rel}:{exc.lineno}: does not parse ({exc.msg}); fix it")
            continue
        for imp in collector.imports:
            if imp.target == TRAINER or imp.target.startswith(TRAINER + ".") or (
                    imp.target == "rlfactory_core" and imp.name == "trainer"):
                problems.append(f"{imp.source}:{imp.line}: imports {TRAINER}; only the CLI may: import train "
                                f"from rlfactory_core.testing (tests, benchmarks, plugins), or the public module "
                                f"the code you need lives in (task, data, training, engines, evaluation)")
        for node in ast.walk(collector.tree):
            if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value in (TRAINER,) and getattr(node.func, "attr", getattr(node.func, "id", ""))
                    == "import_module"):
                problems.append(f"{rel}:{node.lineno}: imports {TRAINER} by name; only the CLI may: use "
                                f"rlfactory_core.testing's train")
    assert not problems, f"{len(problems)} import(s) of the trainer outside the CLI:\n" + "\n".join(problems)


def import_graph() -> dict[str, dict[str, list[Import]]]:
    """Core module -> core module it imports -> the import statements (module-level and local)."""
    modules = core_modules()
    known = set(modules)
    graph: dict[str, dict[str, list[Import]]] = {name: {} for name in modules}
    for name, path in modules.items():
        for imp in collect(path, known).imports:
            target = imp.target
            while target and target not in known:  # `from rlfactory_core.x import y.z`-style tails
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].setdefault(target, []).append(imp)
    return graph


def strongly_connected(graph: dict[str, dict[str, list[Import]]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module: the import circles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def one_circle(graph: dict[str, dict[str, list[Import]]], component: list[str]) -> list[str]:
    """A shortest circle through the component's first module, as the modules in order."""
    members, start = set(component), component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for succ in sorted(graph[node]):
            if succ == start:
                return paths[node] + [start]
            if succ in members and succ not in paths:
                paths[succ] = paths[node] + [succ]
                queue.append(succ)
    raise AssertionError(f"no circle through {start}")  # a component of 2+ modules always has one


def test_the_core_has_no_import_circles():
    graph = import_graph()
    problems = []
    for component in strongly_connected(graph):
        circle = one_circle(graph, component)
        steps = []
        for here, there in zip(circle, circle[1:]):
            imp = graph[here][there][0]
            where = "in a function" if all(i.local for i in graph[here][there]) else "at import time"
            steps.append(f"    {imp.source}:{imp.line}: {here} imports {there} ({where})")
        problems.append(f"circle among {', '.join(component)}:\n" + "\n".join(steps)
                        + "\n    break it: move what both need into a module of a lower layer (LAYERS), "
                          "or pass it in")
    assert not problems, f"{len(problems)} import circle(s) in rlfactory_core:\n" + "\n".join(problems)


def test_no_core_module_is_over_600_lines_without_a_reason():
    problems = []
    for name, path in core_modules().items():
        lines = len(path.read_text().splitlines())
        if lines <= MAX_LINES:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if not any(line.startswith("Size:") for line in doc.splitlines()):
            problems.append(f"{path.relative_to(ROOT)}:1: {lines} lines (over {MAX_LINES}); split it along a real "
                            f"seam, or say why it is one module on a docstring line starting 'Size:'")
    assert not problems, f"{len(problems)} module(s) too long:\n" + "\n".join(problems)


# The core's layers, in the order data flows through it (README, Layout). A module (or a
# package, by its top-level name) imports only from its own layer and the layers before it.
LAYERS = [
    ("leaves", {"types", "errors", "version", "text", "threads", "_fs", "_proc", "hookspecs", "logs", "datasets",
                "outcomes", "fingerprints"}),
    ("interfaces", {"interfaces", "tools"}),
    ("plugins", {"plugins", "default_plugins", "tool_resolution", "rewards", "parser_conformance"}),
    ("models", {"models"}),
    ("rollout", {"rollout"}),
    ("config", {"config_schema", "config"}),  # the run's config composes the sections the layers before it define
    ("task", {"task", "families", "data", "runs", "run_status", "metrics", "records"}),
    ("training", {"training"}),
    ("preflight", {"preflight", "stopping"}),
    ("engines", {"engines"}),
    ("evaluation", {"evaluation", "eval_reuse"}),
    ("trainer", {"run", "resampling", "steps", "stream", "loops", "trainer"}),
    ("the plugin API and the test kit", {"__init__", "testing"}),
]


def layer_of(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    for rank, (_, members) in enumerate(LAYERS):
        if top in members:
            return rank
    raise KeyError(top)


#: The trainer and the schedules' loops: (path glob, most lines), functions at most LOOP_FUNCTION_LINES.
LOOP_LIMITS = (("trainer.py", 300), ("loops/*.py", 150))
LOOP_FUNCTION_LINES = 70


def test_the_trainer_and_the_loops_stay_short():
    problems = []
    for pattern, most in LOOP_LIMITS:
        paths = sorted(CORE.glob(pattern))
        assert paths, pattern
        for path in paths:
            source = path.read_text()
            where = path.relative_to(ROOT)
            if len(source.splitlines()) > most:
                problems.append(f"{where}:1: {len(source.splitlines())} lines (at most {most}): move the feature into "
                                f"the phases (rlfactory_core/steps.py) or the modules they call")
            tree = ast.parse(source)
            doc = ast.get_docstring(tree) or ""
            if any(line.startswith("Size:") for line in doc.splitlines()):
                problems.append(f"{where}:1: no 'Size:' exemption here")
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > LOOP_FUNCTION_LINES:
                        problems.append(f"{where}:{node.lineno}: {node.name} is {length} lines (at most "
                                        f"{LOOP_FUNCTION_LINES})")
    assert not problems, "\n".join(problems)


def test_every_core_module_has_a_layer():
    missing = sorted({m.split(".")[1] for m in core_modules() if "." in m} - set().union(*(m for _, m in LAYERS)))
    assert not missing, f"add to a layer of LAYERS in tests/test_layout.py (and the README's Layout): {missing}"


def test_data_moves_one_way_through_the_core():
    """A module imports only from its own layer or an earlier one: a later layer (the
    trainer, the engines) may change without breaking what comes before it."""
    known = set(core_modules())
    problems = []
    for name, path in core_modules().items():
        here = layer_of(name)
        for imp in collect(path, known).imports:
            if imp.target in known and layer_of(imp.target) > here:
                problems.append(f"{imp.source}:{imp.line}: {name} ({LAYERS[here][0]}) imports {imp.target} "
                                f"({LAYERS[layer_of(imp.target)][0]}, a later layer); move what it needs down, "
                                f"or pass it in")
    assert not problems, f"{len(problems)} import(s) against the flow:\n" + "\n".join(problems)


def test_every_core_package_ships_in_the_distribution():
    """pyproject lists the packages explicitly (the CLI lives under cli/): a new subpackage
    missing there works in an editable install and is absent from a wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {".".join(path.parent.relative_to(ROOT).parts) for path in CORE.rglob("__init__.py")}
    assert not packages - listed, f"add to [tool.setuptools] packages in pyproject.toml: {sorted(packages - listed)}"
    assert not {p for p in listed if p.startswith("rlfactory_core")} - packages, "pyproject lists packages that are gone"


@pytest.mark.parametrize(("source", "expected"), [
    ("from ._fs import atomic_write\n", []),  # a private module's public name: allowed
    ("from . import _fs\n", []),  # a private module itself, inside the core: allowed
    ("from .tools import _DaemonThreadPool\n", ["imports _DaemonThreadPool from rlfactory_core.tools"]),
    ("from . import tools\nx = tools._DaemonThreadPool\n", ["uses tools._DaemonThreadPool"]),
    ("import rlfactory_core.tools as t\nx = t._DaemonThreadPool\n", ["uses t._DaemonThreadPool"]),
    ("def f():\n    from .plugins import _state\n", ["imports _state from rlfactory_core.plugins"]),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .plugins import _state\n", []),
])
def test_the_private_name_rule_reads_imports_as_python_does(source, expected):
    """The rule itself, on source placed as a new module of the core (the real modules it
    imports exist, so submodules are told apart from names)."""
    collector = collect(CORE / "layout_probe.py", set(core_modules()), source)
    assert [problem.split(": ", 1)[1].split(",")[0] for problem in private_uses(collector)] == expected


def test_circles_are_found_with_function_local_imports():
    def edge(local: bool) -> list[Import]:
        return [Import("x.py", 1, "t", None, local)]

    graph = {"a": {"b": edge(False)}, "b": {"c": edge(True)}, "c": {"a": edge(False)}, "d": {"a": edge(False)}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert one_circle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]
