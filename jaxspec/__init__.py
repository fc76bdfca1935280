"""jaxspec: lossless tree speculative decoding in JAX/XLA.

Public API (see DESIGN.md §5):

* tree topology: :func:`tree_mask`, :func:`tree_depths`, :func:`tree_positions`,
  :func:`tree_paths`, :func:`tree_children`, constructors :func:`chain`,
  :func:`branching`, :func:`from_parents`;
* the acceptance rule: :func:`speculative_accept` (pure, unbatched; vmap over keys);
* warps and draft draws: :mod:`jaxspec.sampling`;
* models: :class:`ModelConfig`, :func:`init_model`, :func:`forward_logits`,
  :class:`KVCache`, masks and the commit of accepted paths;
* statistics for exactness claims: :mod:`jaxspec.stats`.
"""

from jaxspec import sampling, stats
from jaxspec.acceptance import SCHEMES, AcceptResult, accept_probabilities, speculative_accept
from jaxspec.cache import KVCache, advance, commit, init_cache
from jaxspec.config import ModelConfig
from jaxspec.masks import causal_cache_mask, tree_cache_mask
from jaxspec.model import Transformer, decode_step, forward_logits, init_model, prefill
from jaxspec.sampling import (
    draw,
    draw_deterministic,
    draw_iid,
    draw_without_replacement,
    sample_categorical,
    sibling_laws,
    validate_warp_args,
    warp_logits,
    warp_probs,
)
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
