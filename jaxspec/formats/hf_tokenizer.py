"""A Hugging Face ``tokenizer.json``, read with the ``tokenizers`` package (installed by the
``hf`` extra)::

    tok = HFTokenizer.from_file("/models/SmolLM2-360M")  # folder with tokenizer.json
    ids = tok.encode("def fibonacci(n):")            # list[int], no specials added
    tok.decode(ids)                                  # the text back (specials skipped)
    tok.vocab_size, tok.eos_id                       # eos_id from config.json / tokenizer_config.json

A model's tokenizer by its name or path, whichever kind it is (this one, the byte tokenizer
of the embedded models, a GGUF file's): :func:`jaxspec.formats.checkpoint.load_tokenizer`.

Nothing here touches the network: the file is read from local disk. ``tokenizers`` is
imported lazily, only when a ``tokenizer.json`` is loaded (GGUF files: :mod:`jaxspec.formats.gguf_tokenizer`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from jaxspec.formats.tokenizer import BaseTokenizer

__all__ = ["HFTokenizer", "TOKENIZER_FILE"]

TOKENIZER_FILE = "tokenizer.json"
_INSTALL_HINT = "install the 'tokenizers' extra: pip install 'jaxspec[tokenizers]' (or: pip install tokenizers)"


def _import_tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ImportError(f"reading {TOKENIZER_FILE} needs the 'tokenizers' package; {_INSTALL_HINT}") from None
    return tokenizers


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        d = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return d if isinstance(d, dict) else {}


class HFTokenizer(BaseTokenizer):
    """A ``tokenizers.Tokenizer`` with the same small interface as
    :class:`~jaxspec.formats.tokenizer.ByteTokenizer` (``encode`` / ``decode`` / ``vocab_size`` /
    ``bos_id`` / ``eos_id`` / ``pad_id`` / ``is_special``). ``encode(text, add_bos=False,
    add_eos=False)``: ids without the tokenizer's own post-processing specials (see
    :class:`~jaxspec.formats.tokenizer.BaseTokenizer`)."""

    def __init__(self, tokenizer, *, bos_id: int | None = None, eos_id: int | None = None,
                 pad_id: int | None = None, source: str = "<memory>"):
        self._tok = tokenizer
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.source = source
        self._special = {int(i) for i in (bos_id, eos_id, pad_id) if i is not None}
        try:
            for i, t in tokenizer.get_added_tokens_decoder().items():
                if t.special:
                    self._special.add(int(i))
        except AttributeError:  # older tokenizers
            pass

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> HFTokenizer:
        """Load ``tokenizer.json`` (a file, or a folder holding one). BOS / EOS / PAD ids
        come from the folder's ``config.json`` (``bos_token_id`` ...), else from the
        tokens named in ``tokenizer_config.json``."""
        p = Path(path)
        file = p if p.suffix == ".json" and not p.is_dir() else p / TOKENIZER_FILE
        if not file.is_file():
            raise FileNotFoundError(f"load_tokenizer: missing {file}")
        tokenizers = _import_tokenizers()
        try:
            tok = tokenizers.Tokenizer.from_file(str(file))
        except Exception as e:  # the Rust side raises its own Exception type
            raise ValueError(f"load_tokenizer: {file} is not a valid tokenizer file: {e}") from None
        folder = file.parent
        cfg = _read_json(folder / "config.json")
        tcfg = _read_json(folder / "tokenizer_config.json")
        ids: dict[str, int | None] = {}
        for name in ("bos", "eos", "pad"):
            v = cfg.get(f"{name}_token_id")
            if isinstance(v, list):
                v = v[0] if v else None
            if v is None:
                t = tcfg.get(f"{name}_token")
                if isinstance(t, dict):
                    t = t.get("content")
                v = tok.token_to_id(t) if isinstance(t, str) else None
            ids[name] = int(v) if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else None
        return cls(tok, bos_id=ids["bos"], eos_id=ids["eos"], pad_id=ids["pad"], source=str(file))

    @property
    def vocab_size(self) -> int:
        """Number of token ids (added tokens included); a model's ``vocab_size`` may be larger (padding)."""
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def vocab(self) -> dict[str, int]:
        """Token string -> id (added tokens included)."""
        return dict(self._tok.get_vocab(with_added_tokens=True))

    def _encode_text(self, text: str) -> list[int]:
        """Ids of ``text`` without the tokenizer's own post-processing specials."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def _source_name(self) -> str:
        return self.source

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` (list or int array, any shape flattened); specials and negative /
        out-of-vocabulary ids (padding of emitted-token buffers) are skipped."""
        if not hasattr(ids, "__array__"):
            ids = list(ids)
        arr = np.asarray(ids, dtype=np.int64).reshape(-1)
        arr = arr[(arr >= 0) & (arr < self.vocab_size)]
        return self._tok.decode([int(i) for i in arr], skip_special_tokens=True)

    def is_special(self, token_id: int) -> bool:
        return int(token_id) in self._special

    def __repr__(self) -> str:
        return f"HFTokenizer({self.source!r}, vocab_size={self.vocab_size})"
