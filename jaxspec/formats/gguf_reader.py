"""Opening a GGUF file with ``gguf.GGUFReader``, its damage named: the one place both the
model loader (:mod:`jaxspec.formats.gguf`) and the tokenizer loader
(:mod:`jaxspec.formats.gguf_tokenizer`) open a file. Light: ``gguf`` and numpy only, imported
when a file is opened::

    reader = open_reader(Path("m.gguf"), "load_gguf")
    # a file cut short:  ValueError("load_gguf: m.gguf: truncated: tensor 'blk.1.ffn_up.weight'
    #                    needs 24576 bytes at offset 380928, the file has 271680")
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["open_reader"]


def open_reader(path: Path, fn: str):
    """``gguf.GGUFReader(path)``, or ``ValueError`` naming ``fn`` and the file: a file cut
    short says which tensor's bytes are missing (``truncated: tensor 'T' needs N bytes at
    offset O, the file has M``) instead of numpy's reshape error; any other damage is "not a
    valid GGUF file" with gguf's reason (a file cut short before its tensor list cannot be told
    from a damaged one)."""
    import gguf
    import numpy as np

    class Checked(gguf.GGUFReader):
        def _build_tensors(self, start_offs, fields):
            size = len(self.data)
            for field in fields:
                try:
                    _, name, _, dims, raw_type, offset = field.parts
                    block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(raw_type[0]))]
                    need = int(np.prod(dims, dtype=np.int64)) * type_size // block
                    at = int(start_offs + offset[0])
                    name = bytes(name).decode("utf-8", errors="replace")
                except (ValueError, KeyError, TypeError, IndexError):  # gguf's own check below names it
                    continue
                if at + need > size:
                    raise _Truncated(f"truncated: tensor {name!r} needs {need} bytes at offset {at}, "
                                     f"the file has {size}")
            return super()._build_tensors(start_offs, fields)

    try:
        return Checked(path)
    except _Truncated as e:
        raise ValueError(f"{fn}: {path}: {e}") from None
    except (ValueError, IndexError, KeyError, OverflowError) as e:
        raise ValueError(f"{fn}: {path} is not a valid GGUF file (damaged, or cut short in its header or "
                         f"metadata): {e}") from None


class _Truncated(Exception):
    pass
