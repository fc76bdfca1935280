"""Packaging: the optional extras install what their features need, and no more (the hint of a
missing tokenizers package: tests/test_checkpoint.py::test_hf_tokenizer_not_installed)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]


def _names(reqs) -> set[str]:
    return {r.split(">")[0].split("=")[0].split("<")[0].strip() for r in reqs}


def test_tokenizer_files_need_only_the_tokenizers_extra():
    """Reading a tokenizer.json needs the tokenizers package, not torch: its own small extra."""
    assert _names(EXTRAS["tokenizers"]) == {"tokenizers"}
    assert {"torch", "transformers", "tokenizers"} <= _names(EXTRAS["hf"])


def test_the_test_extra_runs_notebooks():
    """nbmake runs the notebooks in the suite; `jupyter execute` (nbclient) and a kernel run one by hand."""
    assert {"nbmake", "nbclient", "ipykernel"} <= _names(EXTRAS["test"])
