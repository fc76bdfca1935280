"""jaxspec: lossless tree speculative decoding in JAX/XLA.

Public API (see docs/DESIGN.md §5):

* tree topology: :func:`tree_mask`, :func:`tree_depths`, :func:`tree_positions`,
  :func:`tree_paths`, :func:`tree_children`, constructors :func:`chain`,
  :func:`branching`, :func:`from_parents`;
* the acceptance rule: :func:`speculative_accept` (pure, unbatched; vmap over keys);
* warps and draft draws: :mod:`jaxspec.sampling`;
* models: :class:`ModelConfig`, :func:`init_model`, :func:`forward_logits`,
  :class:`KVCache`, masks and the commit of accepted paths;
* generation: :func:`generate` (tree speculative) and :func:`generate_autoregressive`;
  tree specs :class:`DynamicTree`, :func:`parse_tree`;
* checkpoints: :func:`load_model` (``"default-target"``, ``"default-draft"`` or a folder),
  :func:`save_model`; :class:`ByteTokenizer`;
* tree optimization: :func:`optimize_tree`, :func:`measure_acceptance`,
  :func:`branching_widths`; the tree for this device: :func:`auto_tree` (lazy,
  :mod:`jaxspec.autotree`);
* statistics for exactness claims: :mod:`jaxspec.stats`.
"""

from jaxspec import sampling
from jaxspec.acceptance import SCHEMES, AcceptResult, accept_probabilities, speculative_accept
from jaxspec.cache import KVCache, advance, commit, init_cache
from jaxspec.checkpoint import embedded_models, load_model, save_model
from jaxspec.config import ModelConfig
from jaxspec.generate import GenerateResult, generate, generate_autoregressive
from jaxspec.masks import causal_cache_mask, tree_cache_mask
from jaxspec.model import Transformer, decode_step, forward_logits, init_model, prefill
from jaxspec.optimize import (
    AcceptanceEstimate,
    OptimizedTree,
    branching_widths,
    expected_accepted,
    measure_acceptance,
    optimize_tree,
)
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
from jaxspec.tokenizer import ByteTokenizer
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
from jaxspec.treespec import DynamicTree, parse_tree

__version__ = "0.1.0"

# Heavy, rarely needed on the decode path (scipy.stats, plotting): imported on first use.
_LAZY = {
    "exactness": ("jaxspec.exactness", None),
    "mutants": ("jaxspec.mutants", None),
    "stats": ("jaxspec.stats", None),
    "verify": ("jaxspec.exactness", "verify"),
    "VerifyReport": ("jaxspec.exactness", "VerifyReport"),
    "HFTokenizer": ("jaxspec.hf_tokenizer", "HFTokenizer"),
    "load_tokenizer": ("jaxspec.hf_tokenizer", "load_tokenizer"),
    "autotree": ("jaxspec.autotree", None),
    "auto_tree": ("jaxspec.autotree", "auto_tree"),
    "AutoTreeResult": ("jaxspec.autotree", "AutoTreeResult"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        mod = importlib.import_module(module)
        return mod if attr is None else getattr(mod, attr)
    raise AttributeError(f"module 'jaxspec' has no attribute {name!r}")
