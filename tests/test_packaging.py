"""Packaging: the optional extras install what their features need, and no more."""

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


def test_missing_tokenizers_names_the_small_extra(tmp_path, monkeypatch):
    """Without the package, reading a tokenizer.json says which extra to install."""
    import sys  # noqa: PLC0415

    import pytest  # noqa: PLC0415

    from jaxspec.nn.hf_tokenizer import HFTokenizer  # noqa: PLC0415

    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'jaxspec\[tokenizers\]'"):
        HFTokenizer.from_file(tmp_path / "tokenizer.json")


def test_the_test_extra_runs_notebooks():
    """nbmake runs the notebooks in the suite; `jupyter execute` (nbclient) and a kernel run one by hand."""
    assert {"nbmake", "nbclient", "ipykernel"} <= _names(EXTRAS["test"])
