"""tests/long_tests.txt cannot drift: an entry naming no collected test stops the run
(tests/conftest.py, ``stale_long_entries``)."""

from conftest import STALE_LONG, stale_long_entries


def test_no_entry_is_stale(request):
    """Every entry of tests/long_tests.txt whose file this run collected whole names a
    collected test (the doc-block tests are named by line: editing a doc moves them)."""
    stale = request.config.stash.get(STALE_LONG, [])
    assert not stale, f"tests/long_tests.txt names tests that were not collected (renamed or removed?): {stale}"


def test_stale_entries_literal():
    ids = ["tests/test_a.py::test_one[x]", "tests/test_a.py::test_two", "notebooks/01.ipynb::"]
    entries = ["tests/test_a.py::test_one", "tests/test_a.py::test_one[y", "tests/test_a.py::test_renamed",
               "tests/test_b.py::test_elsewhere", "notebooks/", "other/"]
    # test_b.py and other/ were not collected: not judged; the renamed test and the missing
    # parameter are
    assert stale_long_entries(entries, ids) == ["tests/test_a.py::test_one[y", "tests/test_a.py::test_renamed"]
    assert stale_long_entries(entries, []) == []


def test_every_entry_names_a_test_that_exists():
    """Each entry's file exists (a collected run then checks the test itself)."""
    import pathlib  # noqa: PLC0415

    from conftest import LONG  # noqa: PLC0415

    root = pathlib.Path(__file__).parent.parent
    missing = [e for e in LONG if not (root / e.split("::")[0]).exists()]
    assert not missing, missing


def test_unmarked_extra_skips_literal():
    from conftest import unmarked_extra_skip  # noqa: PLC0415

    reason = "could not import 'torch': No module named 'torch'"
    assert "not marked `real`" in unmarked_extra_skip(reason, marked_real=False)
    assert unmarked_extra_skip(reason, marked_real=True) is None
    assert unmarked_extra_skip("could not import 'sphinx': No module named 'sphinx'", marked_real=False) is None
    assert unmarked_extra_skip("needs 8 devices", marked_real=False) is None


def _pytest_with_conftest(folder, *files):
    """pytest over ``files`` in ``folder`` with tests/conftest.py as its plugin: its stdout."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).parent), "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", "-o",
                        "addopts=", "-o", "markers=real", "-rfsE", *files], cwd=folder, env=env,
                       capture_output=True, text=True, timeout=300)
    return r.stdout + r.stderr


#: a module that exists nowhere, under a package name the guard knows (the skip reason names it)
MISSING = "jinja2.not_a_module_of_jinja2"


def test_a_skip_for_want_of_an_extra_fails_unless_marked_real(tmp_path):
    """Three tests: the unmarked one that skips for want of an extra fails, the marked one and
    an ordinary skip stay skipped. A module skipped whole without ``pytestmark`` is an error."""
    (tmp_path / "test_x.py").write_text(
        "import pytest\n\n"
        f"def test_unmarked():\n    pytest.importorskip({MISSING!r})\n\n"
        f"@pytest.mark.real\ndef test_marked():\n    pytest.importorskip({MISSING!r})\n\n"
        "def test_other_skip():\n    pytest.skip('not today')\n")
    out = _pytest_with_conftest(tmp_path, "test_x.py")
    assert "1 failed, 2 skipped" in out, out
    assert "test_unmarked: skipped for want of 'jinja2' but not marked `real`" in out, out
    (tmp_path / "test_y.py").write_text(f"import pytest\n\npytest.importorskip({MISSING!r})\n")
    (tmp_path / "test_z.py").write_text(f"import pytest\n\npytestmark = pytest.mark.real\npytest.importorskip({MISSING!r})\n")
    out = _pytest_with_conftest(tmp_path, "test_y.py", "test_z.py")
    assert "test_y.py: skipped for want of 'jinja2'" in out and "1 skipped" in out and "1 error" in out, out
