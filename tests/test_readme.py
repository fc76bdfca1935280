"""The README's Python examples run as written (docs that cannot rot)."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 3
    namespace: dict = {}
    for block in blocks:  # later blocks reuse names from earlier ones, as a reader would
        exec(compile(block, str(README), "exec"), namespace)
    assert int(namespace["out"].lengths[0]) > 0


def test_quickstart_has_exactly_two_commands():
    text = README.read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    fences = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(fences) == 1
    commands = [line for line in fences[0].splitlines() if line.strip()]
    assert len(commands) == 2
    ci = (README.parent / ".ci" / "run").read_text()
    assert commands[1] in ci  # CI runs the second command verbatim


def test_readme_tree_example_prints_what_its_comments_say():
    """The first block's commented outputs (the 6-node mask, the depths, the size of
    branching((3, 2, 1))) are what it prints, character for character."""
    import contextlib
    import io

    block = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[0]
    lines = block.splitlines()
    prints = [line for line in lines if line.startswith("print(")]
    assert len(prints) == 3
    # the mask's rows are the comment lines under the first print; the other two prints
    # carry their output as a trailing comment
    expected = [line[2:] for line in lines if line.startswith("# ")]
    expected += [line.rsplit("# ", 1)[1] for line in prints[1:]]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(block, str(README), "exec"), {})
    assert buf.getvalue().splitlines() == expected


def test_cited_result_files_exist():
    """Every `…results/…` path the READMEs cite as a figure's source is in the repository
    (a cited file that git ignores or nobody committed would leave a figure untraceable)."""
    import subprocess

    root = README.parent
    tracked = set(subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True,
                                 check=True).stdout.splitlines())
    cited = []
    for doc, base in ((README, ""), (root / "benchmarks" / "README.md", "benchmarks/")):
        for path in re.findall(r"`([^` ]*results/[^` ]*)`", doc.read_text()):
            if "<" in path or "*" in path:  # a pattern, not a file
                continue
            full = path if path.startswith("benchmarks/") else base + path
            cited.append(full)
            assert any(f == full.rstrip("/") or f.startswith(full.rstrip("/") + "/") for f in tracked), (
                f"{doc.name} cites {path!r}, which is not a tracked file or folder")
    assert len(cited) >= 10
