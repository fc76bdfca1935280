"""The package layout holds: no module reaches into another's private names, core and nn
(and formats) stay independent, every jaxspec name the docs use exists, the command line keeps its
subcommands and flags, and files written before the reorganisation (checkpoints, auto-tree
cache entries) still load.

Fast: ast scans, one small subprocess per import-closure check, tiny models; nothing is
compiled beyond what importing and initialising a tiny model needs.
"""

from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import importlib
import json
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "jaxspec"
SCANNED = (PKG, ROOT / "benchmarks")


def _py_files(*folders: Path) -> list[Path]:
    return sorted(p for f in folders for p in f.rglob("*.py") if "__pycache__" not in p.parts)


def _rel(path: Path | str) -> str:
    p = Path(path)
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


# =============================================================================== 1. private names


def _private(name: str) -> bool:
    """``_x`` is private; dunders (``__version__``, ``__main__``) are not."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _in_jaxspec(dotted: str | None) -> bool:
    return bool(dotted) and (dotted == "jaxspec" or dotted.startswith("jaxspec."))


def _module_of(path: str | Path) -> str | None:
    """Dotted name of a file under the repository (``jaxspec/core/tree.py`` ->
    ``jaxspec.core.tree``); None elsewhere (e.g. a planted file under tmp_path)."""
    try:
        rel = Path(path).resolve().relative_to(ROOT)
    except ValueError:
        return None
    parts = list(rel.with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts) or None


@functools.lru_cache(maxsize=None)
def _is_jaxspec_module(dotted: str) -> bool:
    """Is ``dotted`` a jaxspec module? The file tree first (``jaxspec/core/sampling.py``),
    then importlib for modules re-exported under another name (``jaxspec.sampling``, the
    lazy ``jaxspec.stats``)."""
    parts = dotted.split(".")
    if parts[0] != "jaxspec":
        return False
    base = ROOT.joinpath(*parts)
    if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
        return True
    parent, _, name = dotted.rpartition(".")
    if not parent:
        return False
    try:
        obj = getattr(importlib.import_module(parent), name)
    except Exception:  # noqa: BLE001 (not importable / no such attribute: not a module)
        return False
    return isinstance(obj, types.ModuleType) and _in_jaxspec(obj.__name__)


def _import_module_target(node: ast.AST) -> str | None:
    """``"jaxspec.x"`` for ``importlib.import_module("jaxspec.x")`` /
    ``import_module("jaxspec.x")`` with a literal name; else None."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    f = node.func
    named = (isinstance(f, ast.Attribute) and f.attr == "import_module") or (
        isinstance(f, ast.Name) and f.id == "import_module"
    )
    arg = node.args[0]
    if named and isinstance(arg, ast.Constant) and isinstance(arg.value, str) and _in_jaxspec(arg.value):
        return arg.value
    return None


def _resolve_from(node: ast.ImportFrom, own: str | None, is_pkg: bool) -> str | None:
    """Absolute module of ``from M import ...`` (relative imports resolved against ``own``)."""
    if node.level == 0:
        return node.module
    if own is None:
        return None
    pkg = own if is_pkg else own.rpartition(".")[0]
    for _ in range(node.level - 1):
        pkg = pkg.rpartition(".")[0]
    return f"{pkg}.{node.module}" if node.module else pkg


def private_imports(source: str, path: str) -> list[str]:
    """Every use, in ``source``, of a private name (``_x``, not a dunder) of *another*
    jaxspec module, as ``path:line: what``:

    * ``from jaxspec.x import _name`` (also relative imports);
    * importing a module whose dotted path has a private component (``import jaxspec.x._m``,
      ``from jaxspec.x._m import y``, ``import_module("jaxspec.x._m")``);
    * ``alias._name`` (and ``getattr(alias, "_name")``) where ``alias`` is bound to a jaxspec
      module by ``import jaxspec.x [as alias]``, ``from jaxspec.x import mod [as alias]``
      (``mod`` a module) or ``alias = importlib.import_module("jaxspec.x")``.

    A module's own private names are fine, as are private names of non-jaxspec modules.
    Bindings are per file (any scope): a jaxspec module alias is not expected to be reused
    as an ordinary variable name.
    """
    tree = ast.parse(source, filename=str(path))
    own = _module_of(path)
    is_pkg = Path(path).name == "__init__.py"
    where = _rel(path)
    out: list[str] = []
    aliases: dict[str, str] = {}  # local name -> the jaxspec module it is bound to

    def report(node: ast.AST, what: str) -> None:
        out.append(f"{where}:{node.lineno}: {what}")

    def private_module(dotted: str) -> bool:
        return any(_private(p) for p in dotted.split("."))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if not _in_jaxspec(a.name):
                    continue
                if private_module(a.name):
                    report(node, f"import {a.name}: private module")
                if a.asname:
                    aliases[a.asname] = a.name
                else:  # `import jaxspec.x.y` binds `jaxspec`
                    aliases["jaxspec"] = "jaxspec"
        elif isinstance(node, ast.ImportFrom):
            mod = _resolve_from(node, own, is_pkg)
            relative = node.level > 0
            if not relative and not _in_jaxspec(mod):
                continue
            if mod is not None and mod == own:
                continue  # its own names
            shown = mod if mod is not None else "." * node.level + (node.module or "")
            if mod is not None and private_module(mod):
                report(node, f"from {shown} import ...: private module")
            for a in node.names:
                if a.name == "*":
                    continue
                if _private(a.name):
                    report(node, f"from {shown} import {a.name}: private name of another module")
                elif mod is not None and _is_jaxspec_module(f"{mod}.{a.name}"):
                    aliases[a.asname or a.name] = f"{mod}.{a.name}"
        elif isinstance(node, ast.Call):
            target = _import_module_target(node)
            if target is not None and private_module(target):
                report(node, f"import_module({target!r}): private module")
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            target = _import_module_target(node.value)
            if target is not None:
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(t, ast.Name):
                        aliases[t.id] = target

    def owner_of(node: ast.Attribute) -> str | None:
        """The module whose attribute ``node.attr`` is read, when the chain below it is a
        module alias followed by attributes (``alias.sub.attr``)."""
        names = []
        v = node.value
        while isinstance(v, ast.Attribute):
            names.append(v.attr)
            v = v.value
        if not isinstance(v, ast.Name) or v.id not in aliases:
            return None
        return ".".join([aliases[v.id], *reversed(names)])

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = owner_of(node)
            if owner is not None and owner != own:
                report(node, f"{owner}.{node.attr}: private name of another module")
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and node.args[0].id in aliases
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
            and _private(node.args[1].value) and aliases[node.args[0].id] != own
        ):
            report(node, f"getattr({aliases[node.args[0].id]}, {node.args[1].value!r}): "
                         "private name of another module")
    return sorted(set(out), key=lambda s: (s.split(":")[0], int(s.split(":")[1]), s))


def private_imports_in(*folders: Path) -> list[str]:
    """:func:`private_imports` over every ``.py`` file under ``folders``."""
    out = []
    for p in _py_files(*folders):
        out += private_imports(p.read_text(encoding="utf-8"), str(p))
    return out


def test_no_cross_module_private_names():
    offences = private_imports_in(*SCANNED)
    assert not offences, "private names of other modules used:\n" + "\n".join(offences)


@pytest.mark.parametrize(
    "source, needle",
    [
        ("from jaxspec.core.acceptance import _walk\n", "from jaxspec.core.acceptance import _walk"),
        ("from jaxspec.core.acceptance import (\n    SCHEMES,\n    _walk as w,\n)\n", "import _walk"),
        ("import jaxspec.core.sampling as s\ns._x\n", "jaxspec.core.sampling._x"),
        ("from jaxspec.core import sampling\nsampling._clean(1)\n", "jaxspec.core.sampling._clean"),
        ("from jaxspec.core import sampling as sp\nsp._clean(1)\n", "jaxspec.core.sampling._clean"),
        ("from jaxspec import sampling\nsampling._clean(1)\n", "jaxspec.sampling._clean"),
        ("import importlib\nm = importlib.import_module('jaxspec.decode.generate')\nm._start\n",
         "jaxspec.decode.generate._start"),
        ("from importlib import import_module\nm = import_module('jaxspec.decode.generate')\nm._start()\n",
         "jaxspec.decode.generate._start"),
        ("import jaxspec.core.tree\njaxspec.core.tree._x\n", "jaxspec.core.tree._x"),
        ("import jaxspec\njaxspec._LAZY\n", "jaxspec._LAZY"),
        ("def f():\n    from jaxspec.nn import model\n    return model._rope(1)\n", "jaxspec.nn.model._rope"),
        ("import jaxspec.core._private\n", "import jaxspec.core._private: private module"),
        ("from jaxspec.core._private import x\n", "private module"),
        ("from jaxspec.core import tree\ngetattr(tree, '_x')\n", "getattr(jaxspec.core.tree, '_x')"),
    ],
)
def test_checker_reports_planted_offences(source, needle):
    found = private_imports(source, "planted.py")
    assert any(needle in f for f in found), (source, found)
    assert all(re.match(r"planted\.py:\d+: ", f) for f in found), found


@pytest.mark.parametrize(
    "source",
    [
        "def _helper():\n    return 1\n_helper()\nclass A:\n    _x = 1\nA._x\n",  # own private names
        "from jaxspec import __version__\nimport jaxspec\njaxspec.__version__\njaxspec.__name__\n",
        "import numpy as np\nnp._x\nimport os\nos._exit\nfrom numpy import _globals\n",
        "from jaxspec.core import tree as _tree\n_tree.tree_mask([-1])\n",  # a private alias is fine
        "from jaxspec.decode.round import RoundState\ns = RoundState(1, 2, 3, 4, 5)\ns._replace(tokens=1)\n",
        "from jaxspec.core import sampling\nsampling.draw\nx = object()\nx._y\n",
        "import importlib\nm = importlib.import_module('numpy')\nm._x\n",
        "from jaxspec.cli.__main__ import main\n",
    ],
)
def test_checker_passes_clean_sources(source):
    assert private_imports(source, "clean.py") == []


def test_checker_allows_a_modules_own_private_names():
    src = "from jaxspec.core.sampling import _x\nimport jaxspec.core.sampling as me\nme._y\n"
    assert private_imports(src, str(PKG / "core" / "sampling.py")) == []
    assert private_imports(src, str(PKG / "core" / "tree.py")) != []


def test_checker_over_a_directory_with_a_planted_module(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "clean.py").write_text("import numpy as np\n\n\ndef _own():\n    return np._x\n")
    (tmp_path / "pkg" / "planted.py").write_text(textwrap.dedent("""\
        import jaxspec.core.sampling as s
        from jaxspec.core.acceptance import _walk


        def f():
            return s._clean(1)
        """))
    found = private_imports_in(tmp_path)
    planted = str(tmp_path / "pkg" / "planted.py")
    assert found == [f"{planted}:2: from jaxspec.core.acceptance import _walk: private name of another module",
                     f"{planted}:6: jaxspec.core.sampling._clean: private name of another module"], found


# =============================================================================== 3. layering


def jaxspec_imports(source: str, path: str) -> list[tuple[int, str]]:
    """``(line, module)`` for every jaxspec module a file imports, at any scope:
    ``import M``, ``from M import a`` (``M`` and, for each name, ``M.a``, which may be a
    module), ``import_module("M")``."""
    tree = ast.parse(source, filename=str(path))
    own, is_pkg = _module_of(path), Path(path).name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if _in_jaxspec(a.name)]
        elif isinstance(node, ast.ImportFrom):
            mod = _resolve_from(node, own, is_pkg)
            if _in_jaxspec(mod):
                out.append((node.lineno, mod))
                out += [(node.lineno, f"{mod}.{a.name}") for a in node.names if a.name != "*"]
        elif (target := _import_module_target(node)) is not None:
            out.append((node.lineno, target))
    return out


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _forbidden_imports(folder_or_file: Path, forbidden, *, top_level_counts: bool) -> list[str]:
    """Imports of ``forbidden`` packages; with ``top_level_counts``, importing the package
    ``jaxspec`` itself counts too (its ``__init__`` imports every subpackage)."""
    files = [folder_or_file] if folder_or_file.is_file() else _py_files(folder_or_file)
    out = []
    for p in files:
        for line, mod in jaxspec_imports(p.read_text(encoding="utf-8"), str(p)):
            if any(_under(mod, f) for f in forbidden):
                out.append(f"{_rel(p)}:{line}: imports {mod}")
            elif top_level_counts and mod == "jaxspec":
                out.append(f"{_rel(p)}:{line}: imports the package jaxspec (its __init__ imports everything)")
    return out


@pytest.mark.parametrize(
    "where, forbidden",
    [("core", ("jaxspec.nn", "jaxspec.formats")), ("nn", ("jaxspec.core", "jaxspec.formats")),
     ("formats", ("jaxspec.core",))],
)
def test_core_and_nn_do_not_import_each_other(where, forbidden):
    """core, nn (model code) and formats (files and tokenizers, built on nn): core imports
    neither, nn imports neither, formats imports nn but not core."""
    bad = _forbidden_imports(PKG / where, forbidden, top_level_counts=True)
    assert not bad, "\n".join(bad)


def test_checks_imports_no_jaxspec_module():
    """checks.py imports no jaxspec module but jaxspec.errors (SettingError), which imports none."""
    allowed = {"jaxspec.errors", "jaxspec.errors.SettingError"}
    path = PKG / "checks.py"
    bad = [f"checks.py:{line}: imports {mod}" for line, mod in jaxspec_imports(path.read_text(), str(path))
           if mod not in allowed]
    errors = PKG / "errors.py"
    if errors.exists():
        bad += [f"errors.py:{line}: imports {mod}" for line, mod in jaxspec_imports(errors.read_text(), str(errors))]
    assert not bad, "\n".join(bad)


def test_only_the_cli_imports_the_cli():
    files = [p for p in _py_files(*SCANNED) if not (PKG / "cli") in p.parents]
    bad = [b for p in files for b in _forbidden_imports(p, ("jaxspec.cli",), top_level_counts=False)]
    assert not bad, "\n".join(bad)


def test_the_scan_sees_imports_inside_functions():
    src = "def f():\n    from jaxspec.nn import model\n    import jaxspec.nn.cache\n"
    assert [m for _, m in jaxspec_imports(src, "x.py")] == ["jaxspec.nn", "jaxspec.nn.model", "jaxspec.nn.cache"]
    src = "def f():\n    from jaxspec import nn\n"
    assert ("jaxspec.nn" in [m for _, m in jaxspec_imports(src, "x.py")])


_CLOSURE = r"""
import importlib, json, sys, types
stub = types.ModuleType("jaxspec")
stub.__path__ = [sys.argv[1]]  # the package's folder, without running jaxspec/__init__.py
sys.modules["jaxspec"] = stub
for name in sys.argv[3:]:
    importlib.import_module(name)
assert sys.modules["jaxspec"] is stub
print(json.dumps(sorted(k for k in sys.modules if k == sys.argv[2] or k.startswith(sys.argv[2] + "."))))
"""


@pytest.mark.parametrize("where, forbidden", [("core", "jaxspec.nn"), ("core", "jaxspec.formats"), ("nn", "jaxspec.core"),
                                              ("nn", "jaxspec.formats"), ("formats", "jaxspec.core")])
def test_import_closure_at_run_time(where, forbidden):
    """Import every module of one subpackage with the top-level package replaced by a bare
    stub (so ``jaxspec/__init__.py``, which imports everything, does not run): what the
    modules pull in at import time must not include the other subpackage. (Imports inside
    functions are covered by the ast scan above.) ``from jaxspec import X`` in these
    modules would fail here: it needs the whole package."""
    mods = [f"jaxspec.{where}.{p.stem}" for p in sorted((PKG / where).glob("*.py")) if p.stem != "__init__"]
    r = subprocess.run([sys.executable, "-c", _CLOSURE, str(PKG), forbidden, *mods],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [], f"{where} pulls in {r.stdout}"


def _module_files() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package."""
    return {_module_of(p): p for p in _py_files(PKG)}


def import_graph(files: dict[str, Path], *, top_level_only: bool) -> dict[str, dict[str, int]]:
    """Module -> {each jaxspec module it imports: the line of the first such import}
    (``from M import a`` counts as ``M.a`` when that is a module, else as ``M``; importing a
    package runs its ``__init__``). With ``top_level_only``, only the imports that run when
    the module is imported (not those inside functions or classes); else every import at any
    scope (a deferred import inside a function included)."""
    graph = {}
    for mod, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        if top_level_only:
            nodes, todo = [], list(tree.body)
            while todo:
                n = todo.pop()
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    continue
                nodes.append(n)
                for field in ("body", "orelse", "finalbody", "handlers"):
                    todo += [c for c in getattr(n, field, []) or [] if isinstance(c, ast.AST)]
        else:
            nodes = list(ast.walk(tree))
        out: dict[str, int] = {}
        for n in sorted((n for n in nodes if isinstance(n, (ast.Import, ast.ImportFrom))), key=lambda n: n.lineno):
            if isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            else:
                base = _resolve_from(n, mod, path.name == "__init__.py")
                if not _in_jaxspec(base):
                    continue
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in n.names]
            for m in targets:
                if m in files and m != mod:
                    out.setdefault(m, n.lineno)
        graph[mod] = out
    return graph


def import_cycles(graph) -> list[list[str]]:
    """The import cycles of ``graph`` (module -> the modules it imports): its strongly
    connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def cycle_path(graph, component: list[str]) -> list[str]:
    """One cycle through ``component`` (a strongly connected set of modules, as
    :func:`import_cycles` gives it): the shortest way from its first module back to it,
    ``[a, b, ..., a]``."""
    inside, start = set(component), component[0]
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w not in inside:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, v, start]
                if w not in came_from:
                    came_from[w] = v
                    nxt.append(w)
        frontier = nxt
    raise ValueError(f"{component} is not a cycle of the graph")


def describe_cycles(graph, files: dict[str, Path] | None = None) -> str:
    """Every cycle of ``graph``, one line each, as ``a (file:line) -> b (file:line) -> ... -> a``:
    each step names the line of the import it stands for (when ``graph`` records lines)."""
    lines = []
    for comp in import_cycles(graph):
        path = cycle_path(graph, comp)
        steps = []
        for a, b in zip(path, path[1:]):
            line = graph[a][b] if isinstance(graph[a], dict) else None
            where = f"{_rel(files[a])}:{line}" if files and line is not None else None
            steps.append(f"{a} ({where})" if where else a)
        more = f"  [all of: {', '.join(comp)}]" if len(comp) > len(path) - 1 else ""
        lines.append(" -> ".join([*steps, path[-1]]) + more)
    return "\n".join(lines)


def test_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert cycle_path(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    assert describe_cycles(graph) == "a -> b -> c -> a"
    assert import_cycles({"a": {"b"}, "b": set()}) == []
    assert describe_cycles({"a": {"b": 3}, "b": {"a": 7}}) == "a -> b -> a"


def test_the_graph_sees_deferred_imports_and_their_lines(tmp_path, monkeypatch):
    """A cycle closed only by an import inside a function (the kind the top-level graph
    misses) is found, and reported with the file and line of each import."""
    pkg = tmp_path / "jaxspec" / "demo"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("from jaxspec.demo.b import thing\n")
    (pkg / "b.py").write_text("thing = 1\n\n\ndef f():\n    from jaxspec.demo import a\n    return a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    files = {"jaxspec.demo.a": pkg / "a.py", "jaxspec.demo.b": pkg / "b.py"}
    assert import_cycles(import_graph(files, top_level_only=True)) == []
    graph = import_graph(files, top_level_only=False)
    assert graph == {"jaxspec.demo.a": {"jaxspec.demo.b": 1}, "jaxspec.demo.b": {"jaxspec.demo.a": 5}}
    assert describe_cycles(graph, files) == ("jaxspec.demo.a (jaxspec/demo/a.py:1) -> "
                                             "jaxspec.demo.b (jaxspec/demo/b.py:5) -> jaxspec.demo.a")


def test_no_import_cycles():
    """No module of jaxspec imports, at any scope (a deferred import inside a function
    included), a module that imports it back, directly or through others. A cycle is
    broken by moving the shared piece to the module that owns it, not by deferring an
    import: the rules share their types through core/rule_types.py, the int8 layer is
    nn/int8.py (the model imports it; nn/quant.py quantizes a model), load_tokenizer is in
    formats/checkpoint.py beside load_model, and script_main is in bench/__init__.py beside
    run_benchmark."""
    files = _module_files()
    assert len(files) > 50, files
    graph = import_graph(files, top_level_only=False)
    assert sum(map(len, graph.values())) > 100  # the scan sees the imports
    found = describe_cycles(graph, files)
    assert not found, "import cycles (each import named by file:line):\n" + found


#: modules allowed over MAX_MODULE_LINES (a module that grows past it is split instead)
MAX_MODULE_LINES = 600
LONG_MODULES: set[str] = set()  # none left


def test_modules_are_at_most_600_lines():
    long = {_rel(p): n for p in _py_files(PKG)
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    unexpected = {f: n for f, n in long.items() if f not in LONG_MODULES}
    assert not unexpected, f"modules over {MAX_MODULE_LINES} lines (split them): {unexpected}"


# =============================================================================== 4. docs


DOC_FILES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "benchmarks" / "README.md"])
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# jaxspec.a.b.c not part of a path, file name or longer word (jaxspec/core/tree.py,
# jaxspec.egg-info, myjaxspec.x); trailing punctuation and calls are not part of it
_DOTTED = re.compile(r"(?<![\w/.\-])jaxspec(?:\.[A-Za-z_]\w*)+(?![\w/\-])")
_FROM = re.compile(r"\bfrom\s+(jaxspec(?:\.\w+)*)\s+import\s+(\([^)]*\)?|[^\n`;#]*)")
_IMPORT = re.compile(r"(?:^|[`;])\s*import\s+([\w.]+(?:\s+as\s+\w+)?(?:\s*,\s*[\w.]+(?:\s+as\s+\w+)?)*)", re.M)


def _notebook_code(path: Path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    src = []
    for c in cells:
        if c.get("cell_type") == "code":
            s = c.get("source", "")
            src.append("".join(s) if isinstance(s, list) else s)
    return "\n".join(src)


def doc_names(text: str) -> list[str]:
    """Dotted jaxspec names a text uses: modules of ``import`` statements, ``M.a`` for each
    ``from M import a, b``, and every ``jaxspec.x.y`` written in prose or code."""
    names = list(_DOTTED.findall(text))
    for m in _FROM.finditer(text):
        module, rest = m.group(1), m.group(2).strip().strip("()")
        for piece in rest.split(","):
            word = re.match(r"\s*([A-Za-z_]\w*)", piece)
            if word and word.group(1) != "as":
                names.append(f"{module}.{word.group(1)}")
    for m in _IMPORT.finditer(text):
        for piece in m.group(1).split(","):
            mod = piece.split()[0] if piece.split() else ""
            if _in_jaxspec(mod):
                names.append(mod)
    return list(dict.fromkeys(n for n in names if n != "jaxspec"))


def resolve(name: str):
    """The object ``name`` (``jaxspec.x.y``) names: import its longest module prefix, then
    getattr the rest; AttributeError / ModuleNotFoundError when it does not exist."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        try:
            obj = importlib.import_module(prefix)
        except ModuleNotFoundError as e:
            if e.name is not None and not prefix.startswith(e.name):  # a real missing dependency
                raise
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(name)


def _doc_cases():
    cases = []
    for f in DOC_FILES:
        if f.is_file():
            cases += [(_rel(f), n) for n in doc_names(f.read_text(encoding="utf-8"))]
    for nb in NOTEBOOKS:
        cases += [(_rel(nb), n) for n in doc_names(_notebook_code(nb))]
    return cases


DOC_CASES = _doc_cases()


def test_doc_scan_finds_names():
    assert len(DOC_CASES) > 10 and any(f.endswith(".ipynb") for f, _ in DOC_CASES), DOC_CASES
    text = textwrap.dedent("""\
        See jaxspec.tree_mask(parents), or `jaxspec.core.tree.tree_depths`. In jaxspec/core/tree.py
        and jaxspec.egg-info nothing. `from jaxspec.exactness import (verify,
            exact_law as law)` and `import jax, jaxspec.stats`.
        """)
    assert doc_names(text) == ["jaxspec.tree_mask", "jaxspec.core.tree.tree_depths", "jaxspec.exactness",
                               "jaxspec.stats", "jaxspec.exactness.verify", "jaxspec.exactness.exact_law"]
    assert resolve("jaxspec.core.tree.tree_depths") is resolve("jaxspec.tree_depths")
    with pytest.raises(AttributeError):
        resolve("jaxspec.no_such_name")


@pytest.mark.parametrize("doc, name", DOC_CASES, ids=[f"{f}:{n}" for f, n in DOC_CASES])
def test_doc_name_is_importable(doc, name):
    try:
        resolve(name)
    except (AttributeError, ModuleNotFoundError) as e:
        pytest.fail(f"{doc} uses {name}, which does not exist ({type(e).__name__}: {e})")


def _design_api_block() -> list[str]:
    text = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    m = re.search(r"^#+[^\n]*Public API[^\n]*\n(.*?)^```[^\n]*\n(.*?)^```", text, re.S | re.M)
    assert m, "docs/DESIGN.md: no fenced block under a 'Public API' heading"
    return m.group(2).splitlines()


def test_design_public_api_names_exist():
    lines = [ln for ln in _design_api_block() if not ln.strip().startswith("command line")]
    names = list(dict.fromkeys(n for ln in lines for n in _DOTTED.findall(ln)))
    assert names, "docs/DESIGN.md Public API block names no jaxspec.NAME"
    missing = []
    for n in names:
        try:
            resolve(n)
        except (AttributeError, ModuleNotFoundError):
            missing.append(n)
    assert not missing, f"docs/DESIGN.md Public API: not in the package: {missing}"


def test_design_command_line_matches_the_cli():
    from jaxspec.cli import COMMANDS

    line = next((ln for ln in _design_api_block() if ln.strip().startswith("command line")), None)
    assert line is not None, "docs/DESIGN.md Public API block: no 'command line: jaxspec ...' line"
    listed = [w.strip() for w in line.split("jaxspec", 1)[1].split("|")]
    assert sorted(listed) == sorted(c.name for c in COMMANDS), (listed, [c.name for c in COMMANDS])


# =============================================================================== 5. CLI snapshot

# option strings of `jaxspec` and of each subcommand, and its positionals, taken from
# jaxspec.cli.build_parser() at the reorganisation (issue 20, step 1). A flag removed or
# renamed fails here; a flag added needs this snapshot updated (on purpose).
CLI_SNAPSHOT = {
    "": (["--debug", "--help", "--version", "-h"], []),
    "train": ([
        "--batch-size", "--checkpoint-every", "--clip-norm", "--context", "--eval-every", "--eval-windows",
        "--export", "--heads", "--help", "--hidden-size", "--intermediate-size", "--kv-heads", "--layers", "--lr",
        "--max-files", "--min-lr-ratio", "--no-progress", "--no-tie-embeddings", "--out", "--preset", "--resume",
        "--seed", "--seq-len", "--steps", "--stop-at", "--tie-embeddings", "--warmup-steps", "--weight-decay", "-h",
    ], []),
    "distill": ([
        "--batch-size", "--checkpoint-every", "--clip-norm", "--context", "--eval-every", "--eval-windows",
        "--export", "--heads", "--help", "--hidden-size", "--init", "--intermediate-size", "--kv-heads", "--layers",
        "--lr", "--max-compute-ratio", "--max-files", "--min-lr-ratio", "--no-progress", "--no-tie-embeddings",
        "--out", "--preset", "--resume", "--seed", "--seq-len", "--steps", "--stop-at", "--target",
        "--tie-embeddings", "--warmup-steps", "--weight-decay", "-h",
    ], []),
    "train-head": ([
        "--batch-size", "--checkpoint-every", "--clip-norm", "--eval-every", "--eval-windows", "--export",
        "--feature-layers", "--feature-weight", "--heads", "--help", "--hours", "--intermediate-size", "--kv-heads", "--lr",
        "--max-files", "--max-new-tokens", "--min-lr-ratio", "--no-progress", "--noise", "--out", "--per-category",
        "--recipe", "--resume", "--seed",
        "--seq-len", "--steps", "--stop-at", "--target", "--unroll", "--warmup-steps", "--weight-decay", "-h",
    ], []),
    "bench": (["--help", "--json", "--only", "--out", "--quick", "--rule", "--tiny", "-h"], []),
    "export": (["--dtype", "--help", "--max-shard-mb", "-h"], ["model", "out_dir"]),
    "generate": ([
        "--auto-budgets", "--auto-max-depth", "--baseline", "--chat", "--compare", "--draft", "--dtype", "--help",
        "--json",
        "--max-new-tokens", "--mesh", "--min-p", "--no-compile-cache", "--no-program-store", "--no-warmup", "--program-store", "--prompt",
        "--quantize", "--retune", "--rule", "--scheme", "--seed", "--target", "--temperature", "--top-k", "--top-p", "--tree", "--turns",
        "-h",
    ], []),
    "verify": ([
        "--alpha", "--chunk-size", "--draft", "--draft-min-p", "--draft-temperature", "--draft-top-k", "--draft-top-p",
        "--help", "--horizon", "--json", "--mesh", "--method", "--min-p", "--mutant", "--no-acceptance", "--no-compile-cache",
        "--no-program-store", "--no-progress", "--plots", "--program-store", "--prompt", "--prompt-bucket", "--quantize", "--rule", "--samples",
        "--scheme", "--seed", "--target", "--temperature", "--top-k", "--top-p", "--tree", "-h",
    ], []),
}
CLI_ORDER = ["train", "distill", "train-head", "bench", "export", "generate", "verify"]


def _cli_shape():
    from jaxspec.cli import COMMANDS, build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))

    def shape(p):
        opts = sorted(s for a in p._actions for s in a.option_strings)
        pos = [a.dest for a in p._actions if not a.option_strings and not isinstance(a, argparse._SubParsersAction)]
        return opts, pos

    return {"": shape(parser), **{n: shape(p) for n, p in sub.choices.items()}}, [c.name for c in COMMANDS]


def test_cli_subcommands_in_order():
    shape, order = _cli_shape()
    assert order == CLI_ORDER
    assert sorted(shape) == sorted(CLI_SNAPSHOT)


@pytest.mark.parametrize("name", list(CLI_SNAPSHOT))
def test_cli_flags_kept(name):
    shape, _ = _cli_shape()
    assert name in shape, f"subcommand {name!r} is gone"
    opts, pos = shape[name]
    want_opts, want_pos = CLI_SNAPSHOT[name]
    assert sorted(set(want_opts) - set(opts)) == [], f"jaxspec {name}: flags removed"
    assert sorted(set(opts) - set(want_opts)) == [], f"jaxspec {name}: flags added (update CLI_SNAPSHOT)"
    assert pos == want_pos, f"jaxspec {name}: positionals changed"


# =============================================================================== 6. old files load


@pytest.mark.parametrize("name", ["default-target", "default-draft"])
def test_embedded_models_load_from_the_package(name):
    """The embedded checkpoints (written before the reorganisation) load by name, from
    ``jaxspec/models/`` inside the package, and every file there is one the wheel ships
    (pyproject package-data: models/*/*.json, models/*/*.safetensors). (save_model /
    load_model round trips: tests/test_checkpoint.py.)"""
    import jaxspec
    from jaxspec.formats.checkpoint import MODELS_DIR, read_config, resolve_model_path

    pkg_dir = Path(jaxspec.__file__).resolve().parent
    assert Path(MODELS_DIR).resolve() == pkg_dir / "models"
    assert name in jaxspec.embedded_models()
    folder = resolve_model_path(name)
    assert folder.resolve() == pkg_dir / "models" / name
    files = sorted(p.name for p in folder.iterdir())
    assert files == ["config.json", "model.safetensors"], files
    model = jaxspec.load_model(name)
    assert isinstance(model, jaxspec.Transformer)
    cfg = read_config(name)
    assert model.config.vocab_size == cfg["vocab_size"] == jaxspec.ByteTokenizer().vocab_size
    assert model.config.num_hidden_layers == cfg["num_hidden_layers"]


def _old_fingerprint(model) -> str:
    """jaxspec/autotree.py's _model_fingerprint as of the commit before the reorganisation
    (whose ModelConfig had no eos_token_id field)."""
    from flax import nnx
    import numpy as np

    cfg = model.config.to_dict()
    del cfg["eos_token_id"]
    h = hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode())
    for path, var in nnx.to_flat_state(nnx.state(model)):
        arr = np.asarray(var.get_value())
        h.update("/".join(map(str, path)).encode())
        h.update(str((arr.shape, arr.dtype)).encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()[:16]


def test_auto_tree_reads_a_cache_entry_written_before_the_reorganisation(tmp_path, monkeypatch):
    """A cache file named and laid out exactly as the pre-reorganisation jaxspec/autotree.py
    wrote it (file name ``autotree-<cache_key>.json`` from its key recipe, body
    ``json.dumps(result.to_dict(), indent=1)``) is a cache hit of today's auto_tree: nothing
    is measured. The key recipe, the settings and the layout are literals here. Such entries
    timed every round with the token rule, so they are hits for ``rule="token"`` only (the
    default ``rule="auto"`` times chains with block verification: another key)."""
    import jax
    import numpy as np

    from jaxspec import Sampling
    from jaxspec.nn.config import ModelConfig
    from jaxspec.nn.model import init_model
    from jaxspec.tuning import autotree

    cfg = dict(vocab_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
               num_key_value_heads=1, max_position_embeddings=128)
    target = init_model(ModelConfig(hidden_size=64, **cfg), jax.random.key(0))
    draft = init_model(ModelConfig(hidden_size=32, **cfg), jax.random.key(1))
    stream = np.random.default_rng(0).integers(0, 64, size=4096).astype(np.int32)
    num_windows, window_len = 4, 32

    # the old held-out windows: eval_windows(stream, num_windows, window_len - 1)
    starts = np.linspace(0, stream.size - window_len, num_windows).astype(np.int64)
    windows = stream[starts[:, None] + np.arange(window_len)[None, :]].astype(np.int32)
    settings = {  # auto_tree(scheme="deterministic", sampling=Sampling(), budgets=(1, 3), max_depth=2, ...)
        "scheme": "deterministic", "target_warp": [1.0, None, None], "draft_warp": [1.0, None, None],
        "budgets": [1, 3], "max_depth": 2, "max_rank": 3, "num_draws": None, "key": None,
        "held_out": hashlib.sha256(windows.tobytes()).hexdigest()[:16],
        "batch_size": 1, "context_len": 64,
    }
    dev = jax.devices()[0]
    ident = {"version": 1, "target": _old_fingerprint(target), "draft": _old_fingerprint(draft),
             "settings": settings, "device_kind": dev.device_kind, "platform": dev.platform,
             "jax": jax.__version__}
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]
    rows = [
        {"budget": 1, "depth": 1, "parents": [-1], "predicted_tau": 1.5, "verify_s": 0.001,
         "round_s": 0.002, "tokens_per_s": 750.0, "speedup": 0.75},
        {"budget": 3, "depth": 2, "parents": [-1, -1, 0], "predicted_tau": 1.9, "verify_s": 0.0012,
         "round_s": 0.0019, "tokens_per_s": 1000.0, "speedup": 1.0},
    ]
    entry = {"parents": [-1, -1, 0], "budget": 3, "predicted_tau": 1.9, "predicted_speedup": 1.0,
             "tokens_per_s": 1000.0, "target_step_s": 0.001, "acceptance": [0.5, 0.2, 0.1], "rows": rows,
             "info": {**settings, "device": str(dev), "device_kind": dev.device_kind, "jax": jax.__version__,
                      "loops": 2, "repeats": 1, "measured_at": "2026-12-01T07:00:00+0000"}}
    path = tmp_path / f"autotree-{key}.json"
    path.write_text(json.dumps(entry, indent=1))

    def no_measuring(*a, **k):
        raise AssertionError("the old cache entry was not found: auto_tree measured")

    for name in ("measure_acceptance", "measure_round_cost", "measure_target_step"):
        monkeypatch.setattr(autotree, name, no_measuring)
    res = autotree.auto_tree(target, draft, scheme="deterministic", sampling=Sampling(temperature=1.0),
                             budgets=(1, 3), max_depth=2, held_out_tokens=stream, num_windows=num_windows,
                             window_len=window_len, loops=2, repeats=1, context_len=64,
                             cache_dir=tmp_path, progress=False, rule="token")
    assert res.from_cache and res.cache_path == str(path)
    assert res.parents == (-1, -1, 0) and res.budget == 3 and res.depth == 2
    assert res.acceptance == (0.5, 0.2, 0.1) and res.target_step_s == 0.001
    assert [r.parents for r in res.rows] == [(-1,), (-1, -1, 0)]
    assert res.info["measured_at"] == "2026-12-01T07:00:00+0000"
    assert autotree.cache_key(target, draft, settings) == key
