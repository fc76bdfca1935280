"""jaxspec: lossless tree speculative decoding in JAX/XLA.

Public API (see docs/DESIGN.md §5):

* tree topology: :func:`tree_mask`, :func:`tree_depths`, :func:`tree_positions`,
  :func:`tree_paths`, :func:`tree_children`, constructors :func:`chain`,
  :func:`branching`, :func:`from_parents`;
* the acceptance rule: :func:`speculative_accept` (pure, unbatched; vmap over keys),
  :class:`AcceptResult`, :func:`accept_probabilities`, :data:`SCHEMES`;
* warps and draft draws: :mod:`jaxspec.sampling` (:mod:`jaxspec.core.sampling`);
* models: :class:`ModelConfig`, :func:`init_model`, :func:`forward_logits`,
  :class:`Transformer`, :class:`KVCache`, :func:`init_cache`, :func:`tree_cache_mask`;
* what is sampled: :class:`Sampling` (temperature, top-k, top-p, min-p), one frozen
  value for the target's law and one for the draft's; a refused setting raises
  :class:`SettingError` (a ``ValueError`` naming it);
* generation: :func:`generate` (tree speculative) and :func:`generate_autoregressive`,
  on one device or a mesh (:func:`make_mesh`, :mod:`jaxspec.nn.sharding`);
  tree specs :class:`DynamicTree`, :func:`parse_tree`; :class:`RoundParts`;
  drafters named by a string (``"ngram"``, ``"layers:8"``, ``"module:attr"``, a model name):
  :func:`parse_draft`;
* drafters: the protocol :class:`Drafter` (with :class:`DraftRequest`, :class:`Prompt`,
  :class:`Context`, :class:`DraftLaw`, :class:`Proposal`, :class:`Outcome`; docs/DRAFTERS.md),
  :class:`NgramDraft` (prompt lookup), :class:`LayerSkipDraft` (the target's first layers),
  :class:`MixedDraft` (prompt lookup and a feature head on two chains);
  a draft :class:`Transformer` or a :class:`FeatureHead` is passed as it is;
* checkpoints: :func:`load_model` (``"default-target"``, ``"default-draft"`` or a folder),
  :func:`save_model`, :func:`embedded_models`; :class:`ByteTokenizer`, :func:`load_tokenizer`;
* feature draft heads (EAGLE style): :class:`FeatureHead`, :func:`head_config`,
  :func:`init_head`, :func:`save_head`, :func:`load_head`; :func:`load_draft` loads a head
  or a draft model by name or folder;
* tree optimization: :func:`optimize_tree`, :func:`measure_acceptance`,
  :func:`branching_widths`, :func:`expected_accepted`; the tree for this device:
  :func:`auto_tree`;
* exactness: :func:`verify`, :class:`VerifyReport`, :mod:`jaxspec.stats`,
  :mod:`jaxspec.mutants`, :mod:`jaxspec.exactness`.

Importing jaxspec changes nothing in the process and imports nothing heavy: every name
above is imported on first use (PEP 562), so ``import jaxspec`` neither imports JAX nor
installs a signal handler, and the decode path never pulls in scipy, matplotlib or a
tokenizer library (tests/test_side_effects.py). Internals live in the subpackages
(:mod:`jaxspec.core`, :mod:`jaxspec.nn`, :mod:`jaxspec.formats`, :mod:`jaxspec.decode`, ...).
"""

import sys as _sys

__version__ = "0.1.0"

#: public name -> (module, attribute; None: the module itself), imported on first use
_EXPORTS = {
    # tree topology (jaxspec.core.tree) and specs
    **{n: ("jaxspec.core.tree", n) for n in (
        "branching", "chain", "from_parents", "tree_children", "tree_depths", "tree_mask", "tree_paths",
        "tree_positions")},
    "DynamicTree": ("jaxspec.core.treespec", "DynamicTree"),
    "parse_tree": ("jaxspec.core.treespec", "parse_tree"),
    "parse_draft": ("jaxspec.decode.draft_spec", "parse_draft"),
    # the acceptance rule
    "AcceptResult": ("jaxspec.core.rule_types", "AcceptResult"),
    "speculative_accept": ("jaxspec.core.rules", "speculative_accept"),
    "accept_probabilities": ("jaxspec.core.token_rule", "accept_probabilities"),
    "SCHEMES": ("jaxspec.core.sampling", "SCHEMES"),
    "Sampling": ("jaxspec.core.settings", "Sampling"),
    "SettingError": ("jaxspec.errors", "SettingError"),
    "sampling": ("jaxspec.core.sampling", None),
    # models, caches, checkpoints, tokenizers
    "ModelConfig": ("jaxspec.nn.config", "ModelConfig"),
    **{n: ("jaxspec.nn.model", n) for n in ("Transformer", "forward_logits", "init_model")},
    "KVCache": ("jaxspec.nn.cache", "KVCache"),
    "init_cache": ("jaxspec.nn.cache", "init_cache"),
    "tree_cache_mask": ("jaxspec.nn.masks", "tree_cache_mask"),
    "make_mesh": ("jaxspec.nn.sharding", "make_mesh"),
    **{n: ("jaxspec.formats.checkpoint", n) for n in ("embedded_models", "load_draft", "load_model", "save_model")},
    **{n: ("jaxspec.nn.head", n) for n in ("FeatureHead", "head_config", "init_head", "load_head", "save_head")},
    "ByteTokenizer": ("jaxspec.formats.tokenizer", "ByteTokenizer"),
    "HFTokenizer": ("jaxspec.formats.hf_tokenizer", "HFTokenizer"),
    "load_tokenizer": ("jaxspec.formats.checkpoint", "load_tokenizer"),
    # generation
    **{n: ("jaxspec.decode.generate", n) for n in ("GenerateResult", "generate", "generate_autoregressive")},
    "NgramDraft": ("jaxspec.decode.ngram", "NgramDraft"),
    "LayerSkipDraft": ("jaxspec.decode.layer_skip", "LayerSkipDraft"),
    "MixedDraft": ("jaxspec.decode.mixed_draft", "MixedDraft"),
    "RoundParts": ("jaxspec.decode.round", "RoundParts"),
    # the drafter protocol and what its methods read and return (jaxspec.decode.drafter)
    **{n: ("jaxspec.decode.drafter", n) for n in (
        "Drafter", "DraftRequest", "Prompt", "Context", "DraftLaw", "Proposal", "Outcome")},
    # tree optimization
    **{n: ("jaxspec.tuning.optimize", n) for n in (
        "AcceptanceEstimate", "OptimizedTree", "branching_widths", "expected_accepted", "measure_acceptance",
        "optimize_tree")},
    "autotree": ("jaxspec.tuning.autotree", None),
    "auto_tree": ("jaxspec.tuning.autotree", "auto_tree"),
    "AutoTreeResult": ("jaxspec.tuning.autotree", "AutoTreeResult"),
    # exactness (the harness package is jaxspec.exactness, not jaxspec.verify: jaxspec.verify is the function)
    "exactness": ("jaxspec.exactness", None),
    "mutants": ("jaxspec.exactness.mutants", None),
    "stats": ("jaxspec.exactness.stats", None),
    "verify": ("jaxspec.exactness.harness", "verify"),
    "VerifyReport": ("jaxspec.exactness.report", "VerifyReport"),
}

#: the subpackages, reachable as attributes (``jaxspec.nn.model``) after a bare ``import jaxspec``
_SUBPACKAGES = ("bench", "checks", "core", "decode", "errors", "exactness", "formats", "nn", "training", "tuning")

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS and name not in _SUBPACKAGES:
        raise AttributeError(f"module 'jaxspec' has no attribute {name!r}")
    module, attr = _EXPORTS.get(name, (f"jaxspec.{name}", None))
    value = _sys.modules.get(module)
    if value is None:
        import importlib  # noqa: PLC0415

        value = importlib.import_module(module)
    # not cached here: a name read for the first time while a test has patched its home
    # module would otherwise keep the patch for the rest of the process
    return value if attr is None else getattr(value, attr)


def __dir__():
    return sorted({*globals(), *__all__, *_SUBPACKAGES})
