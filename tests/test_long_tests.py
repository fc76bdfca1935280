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
