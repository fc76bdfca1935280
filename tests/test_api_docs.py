"""The API reference (docs/api, Sphinx autodoc + napoleon) and the doctests of the docstrings
it documents.

* every public name of ``jaxspec._EXPORTS`` is documented in docs/api, once, and nothing
  else is documented as ``jaxspec.NAME`` (a name added to or dropped from the table fails
  here until the reference follows);
* the ``>>>`` examples of the documented modules run as doctests (ELLIPSIS and
  NORMALIZE_WHITESPACE, as ``doctest_optionflags`` in pyproject.toml);
* the reference builds with warnings as errors (``sphinx-build -W --keep-going``); skipped
  without the ``docs`` extra, which .ci/run installs before running this file again.
"""

import doctest
import importlib
import os
import pathlib
import re
import subprocess
import sys

import pytest

import jaxspec

ROOT = pathlib.Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api"
RST = sorted(API.glob("*.rst"))

#: ``.. autofunction:: jaxspec.NAME`` (class, data, exception, ...) and ``.. automodule:: MOD``
_DIRECTIVE = re.compile(r"^\.\. auto(\w+):: (\S+)\s*$", re.M)


def _directives():
    return [(kind, target, rst.name) for rst in RST for kind, target in _DIRECTIVE.findall(rst.read_text())]


def test_reference_documents_every_public_name_once():
    names = [t.removeprefix("jaxspec.") for kind, t, _ in _directives()
             if kind != "module" and t.count(".") == 1 and t.startswith("jaxspec.")]
    modules = {t for kind, t, _ in _directives() if kind == "module"}
    exported = {n for n, (_, attr) in jaxspec._EXPORTS.items() if attr is not None}
    exported_modules = {n: m for n, (m, attr) in jaxspec._EXPORTS.items() if attr is None}
    missing = sorted(exported - set(names))
    assert not missing, f"docs/api: public names with no `.. autoX:: jaxspec.NAME` entry: {missing}"
    extra = sorted(set(names) - exported)
    assert not extra, f"docs/api documents names that jaxspec._EXPORTS does not export: {extra}"
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, f"docs/api documents these names more than once: {twice}"
    missing = sorted(f"{n} ({m})" for n, m in exported_modules.items() if m not in modules)
    assert not missing, f"docs/api: exported modules with no `.. automodule::` entry: {missing}"


def _documented_modules():
    """The home modules of the public names, and the package itself (static: nothing is
    imported at collection). The members of an exported module (``jaxspec.exactness``
    re-exports its submodules' names) are added in the test."""
    return sorted({m for m, _ in jaxspec._EXPORTS.values()} | {"jaxspec", "jaxspec.decode.drafter"})


FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@pytest.mark.parametrize("module", _documented_modules())
def test_docstring_examples_run_as_doctests(module):
    mod = importlib.import_module(module)
    mods = {mod}
    if any(m == module and attr is None for m, attr in jaxspec._EXPORTS.values()):
        # an exported module's members are documented with it, wherever they are defined
        for name in getattr(mod, "__all__", ()):
            home = getattr(getattr(mod, name), "__module__", None)
            if home and home.startswith("jaxspec"):
                mods.add(sys.modules[home])
    tests = [t for m in sorted(mods, key=lambda m: m.__name__)
             for t in doctest.DocTestFinder(exclude_empty=True).find(m) if t.examples]
    out = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for t in tests:
        runner.run(t, out=out.append)
    failed, attempted = runner.summarize(verbose=False)
    assert not failed, f"{failed} of {attempted} doctest examples failed:\n" + "".join(out)


def test_reference_builds_without_warnings(tmp_path):
    pytest.importorskip("sphinx", reason="the docs extra is not installed (pip install -e '.[docs]'); "
                                         ".ci/run installs it and runs this test")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                        str(API), str(tmp_path / "html")], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, f"sphinx-build -W failed (exit {r.returncode}):\n{r.stderr}\n{r.stdout}"
    pages = {p.stem for p in (tmp_path / "html").glob("*.html")}
    assert {rst.stem for rst in RST} <= pages, f"pages not built: {sorted({r.stem for r in RST} - pages)}"
