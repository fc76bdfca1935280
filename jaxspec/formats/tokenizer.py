"""Byte-level tokenizer of the embedded default models.

Ids 0-255 are the UTF-8 bytes; the specials follow; the vocabulary is padded to a
multiple of 8 (264) for tidy shapes::

    id   0 .. 255   one byte each
    id   256        BOS  (start of a document)
    id   257        EOS  (end of a document)
    id   258        PAD
    id   259 .. 263 reserved (never produced by encode; skipped by decode)

Example::

    tok = ByteTokenizer()
    tok.encode("é!")                 # [195, 169, 33]
    tok.encode("a", add_bos=True)    # [256, 97]
    tok.decode([256, 195, 169, 33])  # "é!"  (specials skipped)
    tok.decode([195])                # "\ufffd"  (invalid UTF-8 -> replacement char)

The default models are trained on random windows of a concatenation of
``[BOS] + bytes + [EOS]`` documents, so prompts work with or without a leading BOS.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

__all__ = ["BaseTokenizer", "ByteTokenizer", "check_utf8", "BOS_ID", "EOS_ID", "PAD_ID", "VOCAB_SIZE", "NUM_BYTES"]

NUM_BYTES = 256
BOS_ID = 256
EOS_ID = 257
PAD_ID = 258
VOCAB_SIZE = 264  # 259 used ids, padded to a multiple of 8


def check_utf8(text: str, what: str) -> None:
    """Refuse a str that is not valid UTF-8 text: a lone surrogate (``"\\udcff"``, what Python
    decodes undecodable bytes into) has no UTF-8 form, and ``tokenizers`` raised a bare
    ``TypeError`` on it. ``what`` names the text (``"HFTokenizer.encode: text"``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start:e.end]
        raise ValueError(f"{what} is not valid UTF-8: {bad!r} at position {e.start} is a lone surrogate, which "
                         "has no UTF-8 form") from None


class BaseTokenizer:
    """What every tokenizer shares: :meth:`encode` checks ``text``, tokenizes it with the
    subclass's ``_encode_text`` (no specials) and frames the ids with BOS / EOS on request.

    Subclasses (:class:`ByteTokenizer`, :class:`~jaxspec.formats.hf_tokenizer.HFTokenizer`) provide
    ``_encode_text(text) -> list[int]``, ``decode``, ``is_special`` and the attributes
    ``vocab_size``, ``bos_id``, ``eos_id``, ``pad_id`` (``None``: the tokenizer has none).
    """

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Ids of ``text``, optionally framed by BOS / EOS (``ValueError`` if the tokenizer
        has none)."""
        where = f"{type(self).__name__}.encode"
        if not isinstance(text, str):
            raise ValueError(f"{where}: text is a {type(text).__name__}; expected a str")
        check_utf8(text, f"{where}: text")
        ids = self._encode_text(text)
        for flag, name in ((add_bos, "bos"), (add_eos, "eos")):
            if flag and getattr(self, f"{name}_id") is None:
                raise ValueError(f"{where}: add_{name}=True but {self._source_name()} has no {name} token")
        if add_bos:
            ids.insert(0, self.bos_id)
        if add_eos:
            ids.append(self.eos_id)
        return ids

    def _encode_text(self, text: str) -> list[int]:
        raise NotImplementedError

    def _source_name(self) -> str:
        """Names the tokenizer in error messages."""
        return type(self).__name__


@dataclasses.dataclass(frozen=True)
class ByteTokenizer(BaseTokenizer):
    """UTF-8 bytes plus BOS / EOS / PAD (see the module docstring for the id layout)."""

    vocab_size: int = VOCAB_SIZE
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    pad_id: int = PAD_ID

    def _encode_text(self, text: str) -> list[int]:
        """The UTF-8 bytes of ``text`` as ids."""
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        """Bytes of ``ids`` decoded as UTF-8 (``errors="replace"``); ids >= 256 are skipped.

        Accepts a list, a numpy / jax int array (any shape is flattened) or any iterable
        of ints. Negative ids (e.g. ``-1`` padding of emitted-token buffers) are skipped too.
        """
        if not hasattr(ids, "__array__"):
            ids = list(ids)
        arr = np.asarray(ids, dtype=np.int64).reshape(-1)
        arr = arr[(arr >= 0) & (arr < NUM_BYTES)]
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def is_special(self, token_id: int) -> bool:
        """True for ids that are not bytes (BOS, EOS, PAD, reserved)."""
        return not 0 <= int(token_id) < NUM_BYTES
