"""CHANGELOG.md keeps the Keep a Changelog 1.1.0 layout: ``## [Unreleased]`` first, then
releases ``## [X.Y.Z] - YYYY-MM-DD`` newest first; under each, only the six kinds of change
(``### Added`` / ``Changed`` / ``Deprecated`` / ``Removed`` / ``Fixed`` / ``Security``), each
at most once and none empty."""

import pathlib
import re

CHANGELOG = pathlib.Path(__file__).resolve().parent.parent / "CHANGELOG.md"
KINDS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")


def test_changelog_follows_keep_a_changelog():
    text = CHANGELOG.read_text(encoding="utf-8")
    assert text.startswith("# Changelog\n"), "CHANGELOG.md: expected '# Changelog' as its first line"
    releases = re.split(r"^## ", text, flags=re.M)[1:]
    assert releases, "CHANGELOG.md: no '## [Unreleased]' section"
    assert releases[0].startswith("[Unreleased]\n"), "CHANGELOG.md: the first section must be '## [Unreleased]'"
    for rel in releases[1:]:
        assert re.match(r"\[\d+\.\d+\.\d+\] - \d{4}-\d{2}-\d{2}\n", rel), f"CHANGELOG.md: bad release heading {rel.splitlines()[0]!r}"
    for rel in releases:
        title = rel.splitlines()[0]
        kinds = re.split(r"^### ", rel, flags=re.M)[1:]
        names = [k.splitlines()[0].strip() for k in kinds]
        assert set(names) <= set(KINDS), f"CHANGELOG.md [{title}]: unknown kinds {sorted(set(names) - set(KINDS))}"
        assert len(names) == len(set(names)), f"CHANGELOG.md [{title}]: a kind appears twice: {names}"
        assert names == sorted(names, key=KINDS.index), f"CHANGELOG.md [{title}]: kinds out of order: {names}"
        for k in kinds:
            assert re.search(r"^- \S", k, flags=re.M), f"CHANGELOG.md [{title}] ### {k.splitlines()[0]}: no entry"
