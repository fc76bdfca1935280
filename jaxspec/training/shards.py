"""Token records on disk in compact, versioned shards: what a long data-generation run
writes, commits and resumes from.

A shard folder holds ``meta.json`` (the format version, the model's digest, the sampling
settings, the seed: everything that makes two runs' records comparable) and files
``shard_00000.npz``, ``shard_00001.npz`` ...; each shard is written to a temporary name and
renamed into place, so a stopped run leaves only whole shards::

    w = ShardWriter("runs/answers", meta={"model": "sha256:...", "settings": [...]})
    w.write([Record(tokens=[...], prompt_len=31, instruction=7, setting=1, ended=True)])
    records = read_shards("runs/answers")        # every record of every shard, in order

Ids are stored as uint16 when the vocabulary fits (SmolLM2's 49,152 ids: 2 bytes a token),
else uint32. A writer opened on a folder whose ``meta.json`` differs refuses, naming the
first key that differs: records sampled from another model or other settings never mix.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

__all__ = ["FORMAT_VERSION", "Record", "ShardWriter", "read_shards", "read_meta", "file_digest", "count_tokens"]

FORMAT_VERSION = 1
META = "meta.json"


@dataclasses.dataclass(frozen=True)
class Record:
    """One sequence: ``tokens[:prompt_len]`` the prompt (chat-templated), the rest the
    target's answer; ``instruction`` indexes the run's instruction list, ``setting`` its
    sampling settings (``meta["settings"]``); ``ended``: the answer reached a stop token
    (``False``: it was cut at the token budget)."""

    tokens: tuple[int, ...]
    prompt_len: int
    instruction: int
    setting: int
    ended: bool

    @property
    def answer(self) -> tuple[int, ...]:
        return self.tokens[self.prompt_len:]


def file_digest(path: str | os.PathLike, *, chunk: int = 1 << 20) -> str:
    """``sha256:<hex>`` of a file's bytes (a model file's identity in ``meta.json``)."""
    import hashlib  # noqa: PLC0415

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return "sha256:" + h.hexdigest()


def read_meta(folder: str | os.PathLike) -> dict | None:
    p = Path(folder) / META
    return json.loads(p.read_text(encoding="utf-8")) if p.exists() else None


def _shard_paths(folder: Path) -> list[Path]:
    return sorted(folder.glob("shard_[0-9][0-9][0-9][0-9][0-9].npz"))


class ShardWriter:
    """Appends shards to ``folder`` (created if absent); ``meta`` (JSON-able) is written on
    the first open and must match on every later one."""

    def __init__(self, folder: str | os.PathLike, meta: dict):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        meta = {"format": FORMAT_VERSION, **json.loads(json.dumps(meta))}  # JSON round trip: tuples -> lists
        old = read_meta(self.folder)
        if old is None:
            tmp = self.folder / (META + ".tmp")
            tmp.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
            os.replace(tmp, self.folder / META)
        elif old != meta:
            key = next(k for k in sorted(set(old) | set(meta)) if old.get(k) != meta.get(k))
            raise ValueError(f"{self.folder / META}: {key} = {_short(old.get(key))} on disk, {_short(meta.get(key))} "
                             "in this run; records of other settings never share a folder (use another folder)")
        self.meta = meta
        self.next_index = len(_shard_paths(self.folder))

    def write(self, records: Sequence[Record]) -> Path | None:
        """Writes ``records`` as the next shard (none: nothing written); returns its path."""
        if not records:
            return None
        vocab = int(self.meta.get("vocab_size", 1 << 32))
        dtype = np.uint16 if vocab <= (1 << 16) else np.uint32
        lens = np.array([len(r.tokens) for r in records], dtype=np.int64)
        flat = np.fromiter((t for r in records for t in r.tokens), dtype=np.int64, count=int(lens.sum()))
        if flat.size and (flat.min() < 0 or flat.max() >= min(vocab, np.iinfo(dtype).max + 1)):
            raise ValueError(f"ShardWriter.write: token id {int(flat.max()) if flat.max() >= vocab else int(flat.min())} "
                             f"outside [0, {vocab})")
        arrays = dict(
            tokens=flat.astype(dtype),
            offsets=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
            prompt_len=np.array([r.prompt_len for r in records], dtype=np.int32),
            instruction=np.array([r.instruction for r in records], dtype=np.int32),
            setting=np.array([r.setting for r in records], dtype=np.int8),
            ended=np.array([r.ended for r in records], dtype=bool),
        )
        path = self.folder / f"shard_{self.next_index:05d}.npz"
        tmp = path.with_name(path.stem + ".tmp.npz")
        np.savez_compressed(tmp, **arrays)
        os.replace(tmp, path)
        self.next_index += 1
        return path


def read_shards(folder: str | os.PathLike) -> list[Record]:
    """Every record of every whole shard in ``folder``, shard by shard (an absent folder: none)."""
    folder = Path(folder)
    out: list[Record] = []
    for path in _shard_paths(folder):
        with np.load(path) as z:
            toks, offs = z["tokens"].astype(np.int64), z["offsets"]
            for i in range(len(offs) - 1):
                out.append(Record(tokens=tuple(int(t) for t in toks[offs[i]:offs[i + 1]]),
                                  prompt_len=int(z["prompt_len"][i]), instruction=int(z["instruction"][i]),
                                  setting=int(z["setting"][i]), ended=bool(z["ended"][i])))
    return out


def count_tokens(records: Iterable[Record], *, answers_only: bool = True) -> int:
    return sum(len(r.answer) if answers_only else len(r.tokens) for r in records)


def _short(value, limit: int = 80) -> str:
    r = repr(value)
    return r if len(r) <= limit else r[: limit - 3] + "..."
