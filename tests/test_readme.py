"""The README's examples run as written and print what the README says (docs that cannot rot).

Convention for README.md's Python examples:

* every ```` ```python ```` block is a self-contained program (its own imports). It runs on
  its own, in a fresh interpreter (``sys.executable``), with a temporary folder as the
  working directory and ``JAX_PLATFORMS=cpu``; it must exit with status 0;
* the block is followed directly (blank lines allowed, nothing else) by a
  ```` ```text ```` block: exactly what the program prints on stdout. Lines are compared
  after stripping trailing whitespace, with doctest's ELLIPSIS rule: ``...`` in the
  expected text matches any text (for output that is not reproducible, e.g. across
  backends). Stderr (JAX warnings, progress bars) is not compared. The keys are fixed, so on
  the CPU backend sampled output is deterministic.

The python blocks of docs/*.md that are followed by a ```` ```text ```` block are run the same
way. Also: the Quickstart has exactly the two commands ``.ci/run`` relies on, and every file
the docs link to or cite under ``results/`` exists and is tracked by git (or about to be:
untracked but not ignored). The README's length and the headline table's size are not
checked: they protect no behaviour (issue 36, point 8).
"""

from __future__ import annotations

import doctest
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

_BLOCK = re.compile(r"^```python\n(.*?)^```\n(?:[ \t]*\n)*(?:^```text\n(.*?)^```\n)?", re.S | re.M)


def python_blocks(text: str) -> list[tuple[int, str, str | None]]:
    """``(line number, code, expected stdout or None)`` for each ```python block."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2)) for m in _BLOCK.finditer(text)]


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))
#: docs/*.md blocks followed by a ```text block follow the README's convention and run too
DOC_BLOCKS = [(doc.name, line, code, want) for doc in sorted((ROOT / "docs").glob("*.md"))
              for line, code, want in python_blocks(doc.read_text(encoding="utf-8")) if want is not None]


def test_block_parser():
    text = "x\n```python\nprint(1)\n```\n\n```text\n1\n```\n```python\npass\n```\nno output\n"
    assert python_blocks(text) == [(2, "print(1)\n", "1\n"), (9, "pass\n", None)]


def test_readme_has_python_blocks_each_with_its_output():
    assert len(BLOCKS) >= 5
    missing = [line for line, _, want in BLOCKS if want is None]
    assert not missing, f"README.md: the python blocks at lines {missing} have no ```text output block after them"


def _skip_without_what_it_needs(code: str) -> None:
    """A block on a packaged GGUF model (docs/REAL_MODELS.md) needs the ``gguf`` extra and the
    package carrying the file, which CI's last stage installs; without them it is skipped."""
    if not _needs_a_packaged_model(code):
        return
    for module in ("gguf", "tokenizers", "jinja2"):
        pytest.importorskip(module)
    from jaxspec.formats.packaged import packaged_file

    try:
        packaged_file("smollm2-135m")
    except FileNotFoundError as e:
        pytest.skip(str(e))


def _needs_a_packaged_model(code: str) -> bool:
    return "smollm2-135m" in code


def _real_if_needed(block: tuple):
    """A block on a packaged model is marked ``real``: CI's last stage, which installs what it
    needs, runs it (``-m real``)."""
    return pytest.param(*block, marks=pytest.mark.real) if _needs_a_packaged_model(block[-2]) else block


def _check_block(doc: str, line: int, code: str, want: str | None, tmp_path) -> None:
    _skip_without_what_it_needs(code)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, f"{doc} block at line {line} failed:\n{r.stderr[-4000:]}"
    got = "\n".join(s.rstrip() for s in r.stdout.splitlines()) + "\n"
    expected = "\n".join(s.rstrip() for s in (want or "").splitlines()) + "\n"
    assert doctest.OutputChecker().check_output(expected, got, doctest.ELLIPSIS), (
        f"{doc} block at line {line} printed\n{got}\nbut it says\n{expected}")


@pytest.mark.parametrize("line, code, want", [_real_if_needed(b) for b in BLOCKS], ids=[f"line{line}" for line, _, _ in BLOCKS])
def test_readme_block_prints_what_the_readme_says(line, code, want, tmp_path):
    _check_block("README.md", line, code, want, tmp_path)


@pytest.mark.parametrize("doc, line, code, want", [_real_if_needed(b) for b in DOC_BLOCKS],
                         ids=[f"{d}:{line}" for d, line, _, _ in DOC_BLOCKS])
def test_doc_block_prints_what_the_doc_says(doc, line, code, want, tmp_path):
    _check_block(f"docs/{doc}", line, code, want, tmp_path)


def test_docs_have_runnable_blocks():
    assert any(d == "RULES.md" for d, *_ in DOC_BLOCKS)


def test_quickstart_has_exactly_two_commands():
    text = README.read_text(encoding="utf-8")
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    fences = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(fences) == 1
    commands = [line for line in fences[0].splitlines() if line.strip()]
    assert len(commands) == 2
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert commands[1] in ci  # CI runs the second command verbatim


# ---------------------------------------------------------------------------------- files

DOCS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md",
        ROOT / "benchmarks" / "results" / "HISTORY.md"]


def _committable() -> set[str]:
    """Tracked files, plus untracked ones git does not ignore (a doc added in the same
    change as the file it links to); a tracked file deleted from the work tree is out."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    return {f for f in out if (ROOT / f).exists()}


def _in_repo(path: str, files: set[str]) -> bool:
    path = path.rstrip("/")
    return path in files or any(f.startswith(path + "/") for f in files)


def _rel(path: Path) -> str:
    return path.resolve().relative_to(ROOT).as_posix()


def test_cited_result_files_exist():
    """Every `…results/…` path the docs cite as a figure's source is in the repository (a
    cited file that git ignores or nobody committed would leave a figure untraceable).
    A path starting with ``benchmarks/`` is from the repository root, else from the doc's
    folder (``results/x.json`` in benchmarks/README.md)."""
    files = _committable()
    cited = []
    for doc in DOCS:
        if not doc.is_file():
            continue
        base = doc.parent.resolve().relative_to(ROOT).as_posix()
        for path in re.findall(r"`([^` ]*results/[^` ]*)`", doc.read_text(encoding="utf-8")):
            if "<" in path or "*" in path or "DIR" in path:  # a pattern, not a file
                continue
            full = path if path.startswith("benchmarks/") else os.path.normpath(f"{base}/{path}")
            cited.append(full)
            assert _in_repo(full, files), f"{_rel(doc)} cites {path!r}, which is not a tracked file or folder"
    assert len(cited) >= 10


def test_linked_files_exist():
    """Every relative markdown link ``[text](path)`` of the docs points to a file or folder
    of the repository (anchors ``#...`` are dropped; web links are not checked)."""
    files = _committable()
    links = 0
    for doc in DOCS:
        if not doc.is_file():
            continue
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (doc.parent / target.split("#", 1)[0]).resolve()
            assert path.is_relative_to(ROOT), f"{_rel(doc)} links outside the repository: {target}"
            links += 1
            assert path == ROOT or _in_repo(_rel(path), files), (
                f"{_rel(doc)} links to {target!r}, which is not a tracked file or folder")
    assert links >= 10


def test_readme_links_results_json():
    """The headline table links each figure to its file under benchmarks/results/."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Headline results", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("|") and not r.startswith("|---")][1:]
    assert rows, "README.md: the headline table has no rows"
    for row in rows:
        assert re.search(r"\]\(benchmarks/results/[^)]+\)", row), f"headline row without a results link: {row}"
