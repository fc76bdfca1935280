"""jaxspec: lossless tree speculative decoding in JAX/XLA.

Public API (see docs/DESIGN.md §5):

* tree topology: :func:`tree_mask`, :func:`tree_depths`, :func:`tree_positions`,
  :func:`tree_paths`, :func:`tree_children`, constructors :func:`chain`,
  :func:`branching`, :func:`from_parents`;
* the acceptance rule: :func:`speculative_accept` (pure, unbatched; vmap over keys);
* warps and draft draws: :mod:`jaxspec.core.sampling` (also ``jaxspec.sampling``);
* models: :class:`ModelConfig`, :func:`init_model`, :func:`forward_logits`,
  :class:`KVCache`, masks and the commit of accepted paths;
* generation: :func:`generate` (tree speculative) and :func:`generate_autoregressive`,
  on one device or a mesh (:func:`make_mesh`, :mod:`jaxspec.nn.sharding`);
  tree specs :class:`DynamicTree`, :func:`parse_tree`;
* checkpoints: :func:`load_model` (``"default-target"``, ``"default-draft"`` or a folder),
  :func:`save_model`; :class:`ByteTokenizer`;
* feature draft heads (EAGLE style): :class:`FeatureHead`, :func:`head_config`,
  :func:`init_head`, :func:`save_head`, :func:`load_head`; :func:`load_draft` loads a head
  or a draft model by name or folder;
* tree optimization: :func:`optimize_tree`, :func:`measure_acceptance`,
  :func:`branching_widths`; the tree for this device: :func:`auto_tree` (lazy,
  :mod:`jaxspec.tuning.autotree`);
* statistics for exactness claims: :mod:`jaxspec.exactness.stats`;
* faster random numbers on CPU, the same bits: :func:`use_unrolled_threefry`
  (:mod:`jaxspec.core.cpu_rng`; the command line calls it).
"""

#: the ``jaxspec`` subcommands, for the line below (tests/test_cli_robust.py checks them
#: against ``jaxspec.cli.main.COMMANDS``, which this module must not import)
_COMMAND_NAMES = ("train", "distill", "train-head", "bench", "export", "generate", "verify")


def _exit_130_on_ctrl_c_while_the_command_starts() -> None:
    """The ``jaxspec`` command (its console script, ``python -m jaxspec.cli``) imports this
    package, hence JAX, for seconds before :func:`jaxspec.cli.main` installs its SIGINT
    handling: a Ctrl-C meanwhile exits 130 with the one line ``jaxspec <cmd>: interrupted``,
    as at any later moment, not a KeyboardInterrupt traceback. ``main`` then replaces this
    handler. Any other program importing jaxspec is left alone."""
    import os
    import signal
    import sys

    argv, main_file = sys.argv, getattr(sys.modules.get("__main__"), "__file__", None) or ""
    script = os.path.basename(main_file) in ("jaxspec", "jaxspec.exe", "jaxspec-script.py")
    # python -m M: argv[0] is "-m" while M's packages are imported; M is in the original argv
    orig = getattr(sys, "orig_argv", [])
    module = argv[:1] == ["-m"] and len(orig) >= len(argv) and orig[len(orig) - len(argv)].removeprefix("-m") in (
        "jaxspec.cli", "jaxspec.cli.__main__")
    if not (script or module):
        return
    first = next((a for a in argv[1:] if not a.startswith("-")), None)
    name = f"jaxspec {first}" if first in _COMMAND_NAMES else "jaxspec"

    def interrupted(signum, frame):
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C: no second line
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        try:
            print(f"{name}: interrupted", file=sys.stderr, flush=True)
        except (OSError, ValueError, AttributeError):
            pass
        os._exit(130)  # no teardown: XLA's threads may be half-started

    try:
        signal.signal(signal.SIGINT, interrupted)
    except ValueError:  # not the main thread
        pass


_exit_130_on_ctrl_c_while_the_command_starts()

from jaxspec.core import sampling
from jaxspec.core.cpu_rng import use_unrolled_threefry
from jaxspec.core.acceptance import (
    AcceptResult,
    accept_probabilities,
    speculative_accept,
)
from jaxspec.core.sampling import (
    SCHEMES,
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
from jaxspec.core.tree import (
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
from jaxspec.core.treespec import DynamicTree, parse_tree
from jaxspec.decode.generate import GenerateResult, generate, generate_autoregressive
from jaxspec.decode.ngram import NgramDraft
from jaxspec.decode.round import RoundParts
from jaxspec.nn.cache import KVCache, advance, commit, init_cache
from jaxspec.nn.checkpoint import embedded_models, load_draft, load_model, save_model
from jaxspec.nn.config import ModelConfig
from jaxspec.nn.head import FeatureHead, head_config, init_head, load_head, save_head
from jaxspec.nn.masks import causal_cache_mask, tree_cache_mask
from jaxspec.nn.sharding import make_mesh
from jaxspec.nn.model import (
    Transformer,
    decode_step,
    forward_features,
    forward_logits,
    init_model,
    prefill,
)
from jaxspec.nn.tokenizer import ByteTokenizer
from jaxspec.tuning.optimize import (
    AcceptanceEstimate,
    OptimizedTree,
    branching_widths,
    expected_accepted,
    measure_acceptance,
    optimize_tree,
)

__version__ = "0.1.0"

__all__ = [
    "SCHEMES", "AcceptResult", "AcceptanceEstimate", "ByteTokenizer", "DynamicTree", "FeatureHead", "GenerateResult", "KVCache",
    "ModelConfig", "NgramDraft", "OptimizedTree", "RoundParts", "Transformer", "accept_probabilities", "advance", "branching",
    "branching_widths", "causal_cache_mask", "chain", "commit", "decode_step", "draw", "draw_deterministic",
    "draw_iid", "draw_without_replacement", "embedded_models", "expected_accepted", "forward_features", "forward_logits",
    "from_parents", "generate", "generate_autoregressive", "head_config", "init_cache", "init_head", "init_model",
    "load_draft", "load_head", "load_model",
    "make_mesh", "measure_acceptance", "optimize_tree", "parse_tree", "prefill", "sample_categorical", "sampling", "save_head",
    "save_model", "sibling_laws", "speculative_accept", "tree_cache_mask", "tree_children", "tree_depths",
    "tree_mask", "tree_paths", "tree_positions", "validate_parents", "validate_warp_args", "warp_logits",
    "use_unrolled_threefry", "warp_probs",
    # imported on first use (see _LAZY)
    "exactness", "mutants", "stats", "verify", "VerifyReport", "HFTokenizer", "load_tokenizer", "autotree",
    "auto_tree", "AutoTreeResult",
]

# Heavy, rarely needed on the decode path (scipy.stats, plotting, tokenizers): imported on
# first use. The exactness harness is the package jaxspec.exactness, not jaxspec.verify,
# because jaxspec.verify is the function.
_LAZY = {
    "exactness": ("jaxspec.exactness", None),
    "mutants": ("jaxspec.exactness.mutants", None),
    "stats": ("jaxspec.exactness.stats", None),
    "verify": ("jaxspec.exactness.harness", "verify"),
    "VerifyReport": ("jaxspec.exactness.report", "VerifyReport"),
    "HFTokenizer": ("jaxspec.nn.hf_tokenizer", "HFTokenizer"),
    "load_tokenizer": ("jaxspec.nn.hf_tokenizer", "load_tokenizer"),
    "autotree": ("jaxspec.tuning.autotree", None),
    "auto_tree": ("jaxspec.tuning.autotree", "auto_tree"),
    "AutoTreeResult": ("jaxspec.tuning.autotree", "AutoTreeResult"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        mod = importlib.import_module(module)
        return mod if attr is None else getattr(mod, attr)
    raise AttributeError(f"module 'jaxspec' has no attribute {name!r}")
