"""The defaults of a generation, declared once, in a module that imports nothing: the
library reads them, and the command line reads them before it imports JAX."""

from __future__ import annotations

__all__ = ["DEFAULT_TREE", "DEFAULT_SCHEME"]

#: the tree of :func:`jaxspec.generate`, :func:`jaxspec.verify` and ``jaxspec generate`` when
#: none is given and the drafter names none (its optional ``tree``): the fastest measured on
#: the default pair (benchmarks/README.md, decode_speed)
DEFAULT_TREE = "chain:4"

#: the sibling scheme of a drafter that draws its tokens (a draft model, a feature head, the
#: target's first layers) when none is asked for; a dynamic tree and fixed choices (prompt
#: lookup) take ``"deterministic"``
DEFAULT_SCHEME = "without_replacement"
