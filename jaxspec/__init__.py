"""jaxspec: lossless tree speculative decoding in JAX/XLA."""

from jaxspec.tree import (
    branching,
    chain,
    from_parents,
    tree_children,
    tree_depths,
    tree_mask,
    tree_paths,
    tree_positions,
    validate_parents,
)

__version__ = "0.1.0"
