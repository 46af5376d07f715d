"""The package's structure, measured from its source (docs/architecture.md).

* Layers, each importing only those below it (type-only imports too): ``core`` < ``llm`` < ``metrics`` <
  ``engine`` < ``adapters`` < ``workflows`` < ``cli`` (the package's ``__init__`` and ``__main__`` on top). The
  graph is built with ``ast`` from every module, counting the imports written inside functions and
  ``importlib.import_module`` calls on literal names, not ``if TYPE_CHECKING:`` blocks (checked on their own); it
  must have no cycle and no edge that goes up a layer.
* Only the adapters and the CLI import mlflow.
* Imports of the package's own modules inside functions, outside the CLI, are few and each has a reason
  (start-up time, an optional extra); none dodges a cycle.
* No module over 700 lines, no function over 100.
* One real import path per public name: every name in ``mlflow_ragjudge.__all__`` is bound by an import statement in
  ``__init__.py`` (mypy and editors see its type); no import hook on ``sys.meta_path``, no module under two names;
  every module path the docs, docstrings, examples and tests name is a real module.
* ``import mlflow_ragjudge`` loads neither mlflow nor scipy.
* The development tools beside the package (``tools/``: the offline judge's fit and reports) are not installed with
  it and no module of the package imports them; every dependency the package declares is imported by it.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
import tomllib
from fnmatch import fnmatchcase
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

PKG_DIR = Path(__file__).resolve().parents[1] / "mlflow_ragjudge"
PKG = PKG_DIR.name
ROOT = PKG_DIR.parent
#: top-level packages of development code beside the package, importable from the project's root, never installed
DEV_PACKAGES = ("tools",)
#: modules that left the package for tools/ (issue 35): fitting the offline judge and reporting on public data are
#: work on the project, not on a user's run
MOVED_OUT = {"workflows.offline_fit": "tools/offline_judge/fit.py",
             "workflows.offline_table": "tools/offline_judge/table.py",
             "workflows.public_data": "tools/offline_judge/public_data.py"}
LAYERS = ("core", "llm", "metrics", "engine", "adapters", "workflows", "cli")
#: the imports of the package's own modules that stay inside functions (outside the CLI), with why
ALLOWED_INNER = {
    ("mlflow_ragjudge.adapters.spark", "mlflow_ragjudge.adapters.run_log"):
        "Spark's Python workers import adapters.spark for its task functions: mlflow loads only on the driver, "
        "when the run is logged",
    ("mlflow_ragjudge.adapters.spark", "mlflow_ragjudge.adapters.traces"):
        "the same: the traces' sample is drawn on the driver, and adapters.traces imports mlflow",
    ("mlflow_ragjudge.llm.backends", "mlflow_ragjudge.llm.backends.openai"):
        "start-up time: the openai SDK loads only when an OpenAI-style judge is named",
    ("mlflow_ragjudge.llm.backends", "mlflow_ragjudge.llm.backends.anthropic"):
        "start-up time: the anthropic SDK loads only when an Anthropic judge is named",
}
MAX_INNER = 12


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in PKG_DIR.rglob("*.py"):
        parts = list(path.relative_to(PKG_DIR.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_pkg)
    return out


MODULES = _modules()


def _resolve(module: str, is_pkg: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(module: str) -> list[tuple[str, bool, int]]:
    """``(imported module, inside a function?, line)`` for every import of a module of the package."""
    path, is_pkg = MODULES[module]
    found: list[tuple[str, bool, int]] = []

    def add(target: str, inner: bool, line: int) -> None:
        if target in MODULES and target != module:
            found.append((target, inner, line))

    def visit(node: ast.AST, inner: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for c in child.orelse:
                    visit(c, inner)
                continue
            here = inner or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.ImportFrom):
                base = _resolve(module, is_pkg, child.level, child.module) if child.level else (child.module or "")
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    add(sub if sub in MODULES else base, here, child.lineno)
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, here, child.lineno)
            elif (isinstance(child, ast.Call) and child.args and isinstance(child.args[0], ast.Constant)
                  and isinstance(child.args[0].value, str)
                  and getattr(child.func, "attr", getattr(child.func, "id", None)) == "import_module"):
                add(child.args[0].value, here, child.lineno)
            visit(child, here)

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return found


GRAPH = {m: _imports(m) for m in MODULES}


def _layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("__main__", "spark"):
        # the package's own __init__ and __main__, and mlflow_ragjudge.spark (the public name of adapters.spark, an
        # optional extra's entry point kept out of __init__): the top
        return len(LAYERS)
    assert parts[1] in LAYERS, f"{module} is in no layer: put it in one of {LAYERS}"
    return LAYERS.index(parts[1])


def test_every_module_is_in_a_layer():
    for module in MODULES:
        _layer(module)


def test_no_import_goes_up_a_layer():
    up = [f"{a} (layer {LAYERS[_layer(a)] if _layer(a) < len(LAYERS) else 'top'}) imports {b} "
          f"({LAYERS[_layer(b)] if _layer(b) < len(LAYERS) else 'top'}) at line {line}"
          for a, targets in GRAPH.items() for b, _, line in targets if _layer(b) > _layer(a)]
    assert not up, "imports that go up a layer:\n" + "\n".join(up)


def test_type_only_imports_do_not_go_up_either():
    """``if TYPE_CHECKING:`` imports are left out of the graph (they never run), but a layer that names a type of a
    layer above it still depends on it: the metrics see the run's settings as ``metrics.spec.RunSettings``, a
    protocol, not as the engine's config."""
    up = []
    for module, (path, is_pkg) in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.If) and _is_type_checking(node)):
                continue
            for child in node.body:
                if isinstance(child, ast.ImportFrom):
                    base = _resolve(module, is_pkg, child.level, child.module) if child.level else (child.module or "")
                    if base.startswith(PKG) and _layer(base) > _layer(module):
                        up.append(f"{module}:{child.lineno} -> {base}")
    assert not up, f"type-only imports that go up a layer: {up}"


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def connect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            connect(v)
    return cycles


def test_the_import_graph_has_no_cycle_anywhere():
    """Every module is in the graph, the CLI's and the package's own ``__init__`` (now real imports) included."""
    assert {m for m in GRAPH if m.startswith(f"{PKG}.cli")} == {m for m in MODULES if m.startswith(f"{PKG}.cli")}
    assert any(b.startswith(f"{PKG}.engine") for b, _, _ in GRAPH[PKG])  # the public names' imports are edges
    cycles = _cycles({m: [b for b, _, _ in targets] for m, targets in GRAPH.items()})
    assert not cycles, f"import cycles: {cycles}"


#: the CLI's modules that hold sub-commands; what two of them share sits below them (cli/common.py, exits, parser,
#: reading, streams), so a command module imports no other
CLI_COMMANDS = ("evaluate", "labels", "sweep", "judge_report", "planning")


def test_the_cli_commands_do_not_import_each_other():
    commands = {f"{PKG}.cli.{c}" for c in CLI_COMMANDS}
    assert commands <= set(MODULES)
    crossing = [f"{a} -> {b}" for a in commands for b, _, _ in GRAPH[a] if b in commands]
    assert not crossing, f"a CLI command module imports another (move what they share to cli/common.py): {crossing}"


def test_a_cycle_in_the_cli_would_be_found():
    graph = {m: [b for b, _, _ in targets] for m, targets in GRAPH.items()}
    graph[f"{PKG}.cli.exits"] = [*graph[f"{PKG}.cli.exits"], f"{PKG}.cli.labels"]  # labels -> evaluate -> exits
    assert any(f"{PKG}.cli.exits" in c and f"{PKG}.cli.labels" in c for c in _cycles(graph))


def test_a_cycle_or_an_upward_import_would_be_found(tmp_path):
    """The checks above see what they claim to: an import inside a function and an import_module on a literal."""
    source = ("import importlib\n\ndef f():\n    from ..adapters import tracking\n\n"
              "def g():\n    importlib.import_module('mlflow_ragjudge.cli')\n")
    tree = ast.parse(source)
    calls = [n for n in ast.walk(tree) if isinstance(n, (ast.ImportFrom, ast.Call))]
    assert len(calls) == 2
    # the same walker, on a module that exists: core must not import the adapters; this synthetic one would
    MODULES["mlflow_ragjudge.core._probe"] = (tmp_path / "_probe.py", False)
    (tmp_path / "_probe.py").write_text(source, encoding="utf-8")
    try:
        found = _imports("mlflow_ragjudge.core._probe")
    finally:
        del MODULES["mlflow_ragjudge.core._probe"]
    assert ("mlflow_ragjudge.adapters.tracking", True, 4) in found and ("mlflow_ragjudge.cli", True, 7) in found


def test_imports_inside_functions_outside_the_cli_are_few_and_explained():
    inner = sorted({(a, b) for a, targets in GRAPH.items() for b, is_inner, _ in targets
                    if is_inner and _layer(a) < LAYERS.index("cli")})
    assert len(inner) <= MAX_INNER
    unexplained = [pair for pair in inner if pair not in ALLOWED_INNER]
    assert not unexplained, f"imports inside functions with no reason recorded (move them to the top): {unexplained}"


def test_only_the_adapters_and_the_cli_import_mlflow():
    offenders = []
    for module, (path, _) in MODULES.items():
        if _layer(module) in (LAYERS.index("adapters"), LAYERS.index("cli")):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f"{module}:{node.lineno}" for n in names if n == "mlflow" or n.startswith("mlflow.")]
    assert not offenders, f"mlflow imported outside the adapters and the CLI: {offenders}"


def test_no_module_over_700_lines_and_no_function_over_100():
    long_modules = {m: n for m, (p, _) in MODULES.items()
                    if (n := len(p.read_text(encoding="utf-8").splitlines())) > 700}
    assert not long_modules
    long_functions = []
    for module, (path, _) in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 100:
                long_functions.append(f"{module}.{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long_functions


# run in a fresh interpreter: what `import mlflow_ragjudge` adds to the import system, then every module of ours
_PROBE = """
import importlib, json, sys
before = list(sys.meta_path)
import mlflow_ragjudge
report = {"hooks": [repr(f) for f in sys.meta_path if f not in before  # six (through pandas) adds one of its own
                    and type(f).__module__.split(".")[0] == "mlflow_ragjudge"],
          "heavy": sorted(m for m in ("mlflow", "scipy", "pyspark", "torch", "openai", "anthropic")
                          if m in sys.modules)}
modules = json.loads(sys.argv[1])
for name in modules:
    importlib.import_module(name)
# a module is importable by its own path only: no shorter path to it (mlflow_ragjudge.scorers for adapters.scorers)
report["shortcuts"] = []
for leaf in sorted({m.rsplit(".", 1)[1] for m in modules if m.count(".") > 1} - {m.split(".")[1] for m in modules
                                                                                if "." in m}):
    try:
        importlib.import_module("mlflow_ragjudge." + leaf)
        report["shortcuts"].append(leaf)
    except ModuleNotFoundError:
        pass
ours = {k: m for k, m in sys.modules.items() if k == "mlflow_ragjudge" or k.startswith("mlflow_ragjudge.")}
names = {}
for key, module in ours.items():
    names.setdefault(id(module), []).append(key)
report["aliases"] = sorted(sorted(v) for v in names.values() if len(v) > 1)
report["misnamed"] = sorted(k for k, m in ours.items() if getattr(m, "__name__", k) != k)
report["unresolved"] = [n for n in mlflow_ragjudge.__all__ if getattr(mlflow_ragjudge, n, None) is None]
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    modules = sorted(m for m in MODULES if m != f"{PKG}.__main__")  # __main__ runs the CLI
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(modules)], capture_output=True, text=True,
                         check=True, cwd=PKG_DIR.parent).stdout
    return json.loads(out.splitlines()[-1])


def test_importing_the_package_loads_neither_mlflow_nor_scipy(probe):
    """pandas does load: ``evaluate_frame`` is a real import and the engine uses pandas (docs/architecture.md)."""
    assert probe["heavy"] == []


def test_the_package_installs_no_import_hook(probe):
    assert probe["hooks"] == []


def test_no_module_is_ours_under_two_names(probe):
    """Each module is in ``sys.modules`` once, under its own name, and ``mlflow_ragjudge.<file name>`` is not a
    second path to a module that lives deeper."""
    assert probe["shortcuts"] == []
    assert probe["aliases"] == [] and probe["misnamed"] == []
    assert probe["unresolved"] == []


def _init_imports() -> tuple[dict[str, str], dict[str, str], set[str]]:
    """``__init__.py``'s imports: name -> module at the top, name -> module under ``if TYPE_CHECKING:``, and the
    modules ``__getattr__`` imports."""
    tree = ast.parse((PKG_DIR / "__init__.py").read_text(encoding="utf-8"))
    top: dict[str, str] = {}
    typing_only: dict[str, str] = {}
    on_use: set[str] = set()

    def bound(node: ast.ImportFrom) -> dict[str, str]:
        base = _resolve(PKG, True, node.level, node.module)
        return {(a.asname or a.name): base for a in node.names}

    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level:
            top.update(bound(node))
        elif isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.body:
                assert isinstance(child, ast.ImportFrom) and child.level, ast.unparse(child)
                typing_only.update(bound(child))
        elif isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            for child in ast.walk(node):
                if isinstance(child, ast.ImportFrom):
                    base = _resolve(PKG, True, child.level, child.module)
                    on_use |= {f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in child.names}
    return top, typing_only, on_use


def _loads_mlflow(module: str) -> bool:
    """Whether importing the module imports mlflow: it or a module it imports at its top imports mlflow at its top."""
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        for node in ast.parse(MODULES[m][0].read_text(encoding="utf-8")).body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n == "mlflow" or n.startswith("mlflow.") for n in names):
                return True
        todo += [b for b, inner, _ in GRAPH[m] if not inner]
    return False


def test_every_public_name_is_a_real_import():
    """Each name of ``__all__`` is imported by name from the module that defines it -- no string table, so mypy and
    editors see its type. The few whose modules load mlflow are imported on first use (start-up time) and also
    under ``if TYPE_CHECKING:``, which is what mypy reads."""
    import mlflow_ragjudge as rj

    top, typing_only, on_use = _init_imports()
    assert set(rj.__all__) <= set(top) | set(typing_only), set(rj.__all__) - set(top) - set(typing_only)
    assert not set(top) & set(typing_only)
    for name, module in typing_only.items():
        assert module in on_use, f"{name}: __getattr__ does not import {module}"
        assert _loads_mlflow(module), f"{name}: {module} does not load mlflow, so import it at the top of __init__"
    for name, module in top.items():
        assert getattr(rj, name) is getattr(importlib.import_module(module), name.replace("__version__", "VERSION"))
    with pytest.raises(AttributeError):
        rj.no_such_name  # noqa: B018


def _imported_names(path: Path) -> list[tuple[str, int]]:
    """Every absolute module name a file imports (``import``, ``from ... import``, ``import_module`` on a literal)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append((node.module, node.lineno))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"):
            found.append((node.args[0].value, node.lineno))
    return found


def test_the_package_imports_nothing_from_the_development_tools():
    offenders = [f"{module}:{line} imports {name}" for module, (path, _) in MODULES.items()
                 for name, line in _imported_names(path) if name.split(".")[0] in DEV_PACKAGES]
    assert not offenders, f"the installed package cannot import what is not installed with it: {offenders}"


def test_the_development_tools_are_not_installed_and_the_fitting_is_not_in_the_package():
    include = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"][
        "packages"]["find"]["include"]
    # the packages setuptools' find would see from the root, and which of them its include patterns take
    found = [".".join(p.parent.relative_to(ROOT).parts) for p in ROOT.rglob("__init__.py")
             if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)]
    installed = sorted(p for p in found if any(fnmatchcase(p, pattern) for pattern in include))
    assert PKG in installed and f"{PKG}.workflows" in installed
    assert not [p for p in installed if p.split(".")[0] != PKG], f"installed beside the package: {installed}"
    assert {p.split(".")[0] for p in found} >= set(DEV_PACKAGES)
    still_in = [m for m in MOVED_OUT if f"{PKG}.{m}" in MODULES]
    assert not still_in, f"fitting code back in the package (the layers): {still_in}"
    assert all((ROOT / path).is_file() for path in MOVED_OUT.values())


def _distribution(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0]).lower()


def test_every_declared_dependency_is_imported_by_the_package():
    """A dependency no module imports is weight on every install (Hugging Face ``evaluate`` was one: it pulled in
    ``datasets`` and its tree). A reference implementation the tests check against belongs in the ``dev`` extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["local"],
                *project["optional-dependencies"]["spark"]]
    dists = packages_distributions()
    imported = {name.split(".")[0] for path, _ in MODULES.values() for name, _ in _imported_names(path)}
    provided = {_distribution(d) for name in imported for d in dists.get(name, [name])}
    unused = [r for r in declared if _distribution(r) not in provided]
    assert not unused, f"declared but never imported by the package: {unused}"


def _top_names(module: str) -> set[str]:
    """The names a module binds at its top (definitions, assignments, imports) and its submodules."""
    names: set[str] = set()
    for node in ast.parse(MODULES[module][0].read_text(encoding="utf-8")).body:
        nodes = [node]
        if isinstance(node, (ast.If, ast.Try)):
            nodes = [*node.body, *node.orelse, *(c for h in getattr(node, "handlers", []) for c in h.body)]
        for n in nodes:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(n.name)
            elif isinstance(n, ast.Assign):
                names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
            elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                names.add(n.target.id)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                names |= {(a.asname or a.name).split(".")[0] for a in n.names}
    return names | {m.rsplit(".", 1)[-1] for m in MODULES if m.rsplit(".", 1)[0] == module}


_DOTTED = re.compile(r"\bmlflow_ragjudge((?:\.[A-Za-z_]\w*)+)")
_FROM = re.compile(r"from (mlflow_ragjudge(?:\.\w+)*) import (\([^)]*\)|[\w, ]+)")
_FILE = re.compile(r"\bmlflow_ragjudge/[\w/]*(?:\.py\b|/)")


def _bad_references(text: str) -> list[str]:
    bad = []
    for m in _DOTTED.finditer(text):
        parts = [PKG, *m.group(1)[1:].split(".")]
        i = max(k for k in range(1, len(parts) + 1) if ".".join(parts[:k]) in MODULES)
        if i < len(parts) and not parts[i].startswith("__") and parts[i] not in _top_names(".".join(parts[:i])):
            bad.append(m.group(0))
    for m in _FROM.finditer(text):
        if m.group(1) not in MODULES:
            bad.append(m.group(0))
            continue
        names = re.findall(r"(?<!as )\b(?!as\b)\w+", m.group(2).split("#")[0])
        bad += [f"{m.group(1)}: {n}" for n in names if n not in _top_names(m.group(1))]
    root = PKG_DIR.parent
    bad += [m.group(0) for m in _FILE.finditer(text) if not (root / m.group(0)).exists()]
    return bad


def test_the_references_find_a_moved_module():
    assert _bad_references("see mlflow_ragjudge.scorers.Correctness") == ["mlflow_ragjudge.scorers.Correctness"]
    assert _bad_references("from mlflow_ragjudge.adapters.scorers import (Correctness,\n  Nope)") == [
        "mlflow_ragjudge.adapters.scorers: Nope"]
    assert _bad_references("from mlflow_ragjudge.client import JudgeClient") == [
        "mlflow_ragjudge.client", "from mlflow_ragjudge.client import JudgeClient"]
    assert _bad_references("[x](../mlflow_ragjudge/judges/faithfulness.py)") == [
        "mlflow_ragjudge/judges/faithfulness.py"]
    assert not _bad_references("`mlflow_ragjudge.adapters.scorers.Correctness`, mlflow_ragjudge.spark.evaluate_spark")


def test_every_module_path_the_docs_and_the_code_name_is_real():
    """docs/, README.md, the docstrings, experiments/, benchmarks/, scripts/ and tests/ name modules by their one
    real path (``mlflow_ragjudge.adapters.scorers``), never a path of before (``mlflow_ragjudge.scorers``)."""
    root = PKG_DIR.parent
    files = [*root.glob("docs/*.md"), root / "README.md", *PKG_DIR.rglob("*.py"), *root.glob("experiments/*.py"),
             *root.glob("benchmarks/*.py"), *root.glob("scripts/*"), *root.glob("tests/**/*.py")]
    bad = [f"{f.relative_to(root)}: {b}" for f in files if f.is_file() and f.name != Path(__file__).name
           for b in _bad_references(f.read_text(encoding="utf-8"))]
    assert not bad, "module paths that do not exist:\n" + "\n".join(bad)


def _installed_with(requirements: list[str]) -> set[str]:
    """The distributions installing ``requirements`` brings: them and, recursively, what their installed metadata
    requires (without extras)."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = _distribution(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            needs = requires(req.name) or []
        except PackageNotFoundError:
            continue
        for line in needs:
            sub = Requirement(line)
            if sub.marker is None or ("extra" not in str(sub.marker) and sub.marker.evaluate()):
                todo.append(sub)
    return seen


def test_every_library_the_package_imports_is_installed_with_it():
    """The mirror of the test above: a library a module imports must come with ``pip install mlflow-ragjudge`` (a
    declared dependency or one of theirs), or with the extra the module belongs to. tqdm came only through Hugging
    Face ``evaluate``; once that was removed, ``progress=True`` drew no bar on a fresh install. The ``local`` extra
    counts only its own distributions: transformers' tree brings half of the ecosystem (tqdm among it), which a
    user without the extra does not have."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    shipped = (_installed_with(project["dependencies"]) | _installed_with(extras["spark"])
               | {_distribution(r) for r in extras["local"]})
    dists = packages_distributions()
    missing = []
    for module, (path, _) in MODULES.items():
        for name, line in _imported_names(path):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top in (PKG, "__future__"):
                continue
            provided = {_distribution(d) for d in dists.get(top, [top])}
            if not provided & shipped:
                missing.append(f"{module}:{line} imports {top} ({', '.join(sorted(provided))})")
    assert not missing, f"imported but installed with neither the package nor its extra: {missing}"
