"""The offline training corpus: the running interpreter's standard-library Python source.

Every machine with Python has it, so training needs no download. Files are the ``.py``
files under ``sysconfig.get_paths()["stdlib"]`` in sorted (POSIX relative path) order,
minus third-party, test and generated-data directories (:data:`EXCLUDED_DIRS`). Each file is
one document, tokenized as ``[BOS] + utf8 bytes + [EOS]`` and concatenated per split::

    corpus = load_corpus()                     # ~9 MB of bytes on CPython 3.11
    corpus.train, corpus.val                   # uint16[n_train], uint16[n_val]
    sampler = BatchSampler(corpus.train, batch_size=16, seq_len=256, seed=0)
    batch = sampler.next()                     # int32[16, 257]: inputs [:, :-1], targets [:, 1:]
    state = sampler.get_state()                # JSON-able; set_state(state) resumes the stream

The validation split is held out by module: a file is in ``val`` iff the first 8 bytes of
``sha256(relative path)`` read as a fraction are below ``val_fraction`` — fixed, independent
of the file order, of the other files and of the Python version.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sysconfig
from pathlib import Path

import numpy as np

from jaxspec.formats.tokenizer import BOS_ID, EOS_ID

__all__ = [
    "EXCLUDED_DIRS",
    "Corpus",
    "BatchSampler",
    "stdlib_root",
    "list_source_files",
    "is_validation",
    "load_corpus",
    "eval_windows",
]

# Directory names skipped anywhere below the stdlib root.
EXCLUDED_DIRS = frozenset(
    {
        "site-packages",
        "dist-packages",
        "__pycache__",
        "test",
        "tests",
        "idlelib",
        "lib2to3",
        "turtledemo",
        "ensurepip",
        "encodings",  # generated codec tables
        "pydoc_data",  # one generated 750 kB string literal
    }
)


def stdlib_root() -> Path:
    """The standard-library directory of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def list_source_files(root: str | os.PathLike | None = None) -> list[str]:
    """Sorted POSIX paths (relative to ``root``) of the corpus ``.py`` files."""
    root = stdlib_root() if root is None else Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"corpus: stdlib directory {str(root)!r} does not exist")
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS and not d.startswith("config-")]
        rel = Path(dirpath).relative_to(root)
        out.extend((rel / f).as_posix() for f in filenames if f.endswith(".py"))
    return sorted(out)


def is_validation(relpath: str, val_fraction: float) -> bool:
    """Whether the module at ``relpath`` belongs to the held-out split (fixed hash)."""
    h = int.from_bytes(hashlib.sha256(relpath.encode("utf-8")).digest()[:8], "little")
    return h < val_fraction * 2.0**64


@dataclasses.dataclass(frozen=True)
class Corpus:
    """Token streams of the two splits and the files that made them."""

    train: np.ndarray  # uint16[n_train]
    val: np.ndarray  # uint16[n_val]
    train_files: tuple[str, ...]
    val_files: tuple[str, ...]
    root: str

    @property
    def digest(self) -> str:
        """Short fingerprint of the split contents (recorded in training checkpoints)."""
        h = hashlib.sha256()
        for arr in (self.train, self.val):
            h.update(np.int64(arr.size).tobytes())
            h.update(arr.tobytes())
        return h.hexdigest()[:16]


def load_corpus(
    root: str | os.PathLike | None = None,
    *,
    val_fraction: float = 0.05,
    max_files: int | None = None,
) -> Corpus:
    """Read and tokenize the corpus. ``max_files`` keeps the first files of each split
    (sorted order), for quick experiments and tests."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"load_corpus: val_fraction = {val_fraction!r}; expected a number in (0, 1)")
    if max_files is not None and (isinstance(max_files, bool) or not isinstance(max_files, int) or max_files < 1):
        raise ValueError(f"load_corpus: max_files = {max_files!r}; expected a positive integer or None")
    root = stdlib_root() if root is None else Path(root)
    files = list_source_files(root)
    splits: dict[str, list[str]] = {"train": [], "val": []}
    for f in files:
        splits["val" if is_validation(f, val_fraction) else "train"].append(f)
    if max_files is not None:
        splits = {k: v[:max_files] for k, v in splits.items()}
    for name, fs in splits.items():
        if not fs:
            raise ValueError(f"load_corpus: the {name} split of {str(root)!r} is empty ({len(files)} files found)")
    streams = {name: _tokenize_files(root, fs) for name, fs in splits.items()}
    return Corpus(
        train=streams["train"],
        val=streams["val"],
        train_files=tuple(splits["train"]),
        val_files=tuple(splits["val"]),
        root=str(root),
    )


def _tokenize_files(root: Path, files: list[str]) -> np.ndarray:
    parts = []
    for f in files:
        data = np.frombuffer((root / f).read_bytes(), dtype=np.uint8).astype(np.uint16)
        parts += [np.array([BOS_ID], np.uint16), data, np.array([EOS_ID], np.uint16)]
    return np.concatenate(parts)


class BatchSampler:
    """Random windows of ``seq_len + 1`` tokens from one token stream.

    Offsets are uniform over all windows that fit, drawn from a numpy ``Generator``
    (PCG64) seeded with ``seed``; :meth:`get_state` / :meth:`set_state` save and restore
    the generator, so a resumed run draws exactly the batches it would have drawn.
    """

    def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int, seed: int):
        for name, v in (("batch_size", batch_size), ("seq_len", seq_len)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"BatchSampler: {name} = {v!r}; expected a positive integer")
        if tokens.ndim != 1 or tokens.size < seq_len + 1:
            raise ValueError(
                f"BatchSampler: token stream of shape {tokens.shape} is too short for seq_len = {seq_len}"
            )
        self.tokens = tokens
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.rng = np.random.default_rng(seed)

    def next(self) -> np.ndarray:
        """``int32[batch_size, seq_len + 1]``."""
        starts = self.rng.integers(0, self.tokens.size - self.seq_len, size=self.batch_size)
        idx = starts[:, None] + np.arange(self.seq_len + 1)[None, :]
        return self.tokens[idx].astype(np.int32)

    def get_state(self) -> dict:
        return self.rng.bit_generator.state

    def set_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state


def eval_windows(tokens: np.ndarray, num_windows: int, seq_len: int) -> np.ndarray:
    """``int32[num_windows, seq_len + 1]`` evenly spaced over the stream (deterministic)."""
    if tokens.size < seq_len + 1:
        raise ValueError(f"eval_windows: token stream of {tokens.size} tokens is shorter than seq_len + 1 = {seq_len + 1}")
    starts = np.linspace(0, tokens.size - seq_len - 1, num_windows).astype(np.int64)
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    return tokens[idx].astype(np.int32)
