"""Argument checks every subpackage uses: plain Python and ``jax.core``, no other jaxspec
module but :mod:`jaxspec.errors`, so that ``core`` and ``nn`` can share them without
importing each other."""

from __future__ import annotations

import numbers

import jax
import numpy as np

from jaxspec.errors import SettingError

__all__ = ["is_int", "is_concrete", "SettingError"]


def is_int(x) -> bool:
    """True for a Python or numpy integer; ``bool`` (an ``int`` subclass) is not one."""
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def is_concrete(x) -> bool:
    """True when ``x`` holds values known in Python (not a tracer under jit/vmap)."""
    return not isinstance(x, jax.core.Tracer)
