"""A feature-level draft head (EAGLE style): one decoder layer that drafts from the
target's own features.

The head at position p reads the pair (the target's feature at ``p - 1``, the embedding of
token ``p``) and predicts the target's feature at p; the target's frozen LM head turns that
prediction into the draft law of token ``p + 1``::

    x_p   = fc([embed(token_p), feature_{p-1}])          [B, T, 2D] -> [B, T, D]
    h_p   = norm(layer(x_p))                              one decoder layer, own KV cache
    q_p+1 = softmax(target.unembed(h_p))                 the target's LM head, frozen

A head with a **reduced draft vocabulary** (EAGLE-3, arXiv 2503.01840) drafts only the K
target ids of its :class:`DraftVocab` (``int32[K]``, e.g. the K most frequent tokens of what
the target says): its logits are the target's LM head at those rows
(:meth:`~jaxspec.nn.model.Transformer.unembed_rows`, a K / V share of the full head's cost),
``-inf`` elsewhere, so its law q is zero outside them. The acceptance rule is lossless for
any q; a reduced vocabulary only bounds acceptance by the target's mass on the K ids.

"Feature" is the target's last residual after its final norm
(:meth:`jaxspec.nn.model.Transformer.features`), the input of its LM head, so a perfect
head reproduces the target's law exactly. The embedding table and the LM head are the
target's: the head owns only ``fc``, the layer and its norm. Position 0 has no previous
feature and reads zeros, in training and in decoding alike.

The head's width is the target's (``hidden_size``); its layer may be narrower in heads and
MLP (:func:`head_config`). On disk a head is a folder with ``config.json`` (the head's
:class:`~jaxspec.nn.config.ModelConfig` under ``"jaxspec_head"``, plus the digest of the
target it was trained on) and ``model.safetensors``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxspec.nn.cache import KVCache
from jaxspec.nn.config import ModelConfig
from jaxspec.nn.model import FORWARD_SCOPE, DecoderLayer, RMSNorm, Transformer, check_tap_layers, write_and_attend

__all__ = [
    "HEAD_KEY",
    "DraftVocab",
    "FeatureHead",
    "head_config",
    "init_head",
    "whole_vocab",
    "check_head_for", "check_head_config_for",
    "target_digest",
    "is_head_folder",
    "recorded_target_digest",
    "save_head",
    "load_head",
]

#: the ``config.json`` key that marks a folder as a feature head (its ModelConfig dict)
HEAD_KEY = "jaxspec_head"
#: the ``config.json`` key of a reduced-vocabulary head's K (absent: the whole vocabulary)
DRAFT_VOCAB_KEY = "draft_vocab_size"
#: the ``config.json`` key of the dtype floating-point tensors are stored in, when not the head's own
STORAGE_KEY = "storage_dtype"
#: the config.json key of the tree the head drafts best (FeatureHead.preferred_tree)
TREE_KEY = "tree"
#: the config.json key of a multi-layer head's target layers (FeatureHead.feature_layers)
LAYERS_KEY = "feature_layers"
_F32 = jnp.float32


def head_config(target: ModelConfig, *, num_attention_heads: int | None = None,
                num_key_value_heads: int | None = None, intermediate_size: int | None = None) -> ModelConfig:
    """The configuration of a head for ``target``: the target's width, vocabulary, RoPE and
    context, one layer; heads and MLP width the target's unless given."""
    d = target.to_dict()
    d.update(num_hidden_layers=1, tie_word_embeddings=False)
    if num_attention_heads is not None:
        d["num_attention_heads"] = num_attention_heads
    if num_key_value_heads is not None:
        d["num_key_value_heads"] = num_key_value_heads
    if intermediate_size is not None:
        d["intermediate_size"] = intermediate_size
    return ModelConfig.from_dict(d)


class DraftVocab(nnx.Variable):
    """The target ids a reduced-vocabulary head drafts, ``int32[K]`` (distinct, in range);
    fixed when the head is made, never trained (training differentiates ``nnx.Param`` only)."""


class FeatureHead(nnx.Module):
    """One decoder layer over ``fc([embed(token), feature])``; see the module docstring.

    Forward (the same cache contract as :class:`~jaxspec.nn.model.Transformer`: the new K/V
    go to slots ``cache.lengths[b] + t``, lengths unchanged)::

        h, cache = head(target, feats, tokens, positions, cache, attention_mask)
        # feats float32[B, T, D] (the target's feature at each token's previous position),
        # tokens/positions int32[B, T], attention_mask bool[B, T, S] -> h float32[B, T, D]
        logits = head.logits(target, h)   # float32[B, T, V] (-inf outside a reduced vocabulary)

    ``draft_vocab_size`` K (default None: the whole vocabulary) makes a reduced-vocabulary
    head; its ids (:class:`DraftVocab`) start as ``0 .. K-1`` and are set by
    :func:`init_head` or loaded by :func:`load_head`.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, draft_vocab_size: int | None = None,
                 feature_layers: tuple[int, ...] | None = None):
        if not isinstance(config, ModelConfig):
            raise ValueError(f"FeatureHead: config = {type(config).__name__}; expected a ModelConfig")
        if config.num_hidden_layers != 1:
            raise ValueError(
                f"FeatureHead: config.num_hidden_layers = {config.num_hidden_layers}; expected 1 (see head_config)"
            )
        pd = config.param_dtype
        d = config.hidden_size
        self.config = config
        self.fc = nnx.Linear(2 * d, d, use_bias=True, dtype=pd, param_dtype=pd, rngs=rngs)
        self.layers = nnx.List([DecoderLayer(config, rngs=rngs)])
        self.norm = RMSNorm(d, config.rms_norm_eps, pd)
        # a multi-layer head (EAGLE-3) fuses taps of the target's low and middle layers with
        # its features: fuse([tap_1 .. tap_k, feature]) -> D, first k blocks zero and the last
        # the identity at init, so it starts as the last-layer head and learns what the taps add
        if feature_layers is not None and not (
                isinstance(feature_layers, (tuple, list)) and feature_layers
                and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in feature_layers)
                and list(feature_layers) == sorted(set(feature_layers))):
            raise ValueError(f"FeatureHead: feature_layers = {feature_layers!r}; expected None or increasing target "
                             "layer indices such as (1, 14)")
        self.feature_layers = None if feature_layers is None else tuple(feature_layers)
        self.fuse = nnx.data(None)
        if self.feature_layers is not None:
            k = len(self.feature_layers)
            w = jnp.concatenate([jnp.zeros((k * d, d), pd), jnp.eye(d, dtype=pd)], axis=0)
            self.fuse = nnx.data(nnx.Linear((k + 1) * d, d, use_bias=False, dtype=pd, param_dtype=pd, rngs=rngs))
            self.fuse.kernel.set_value(w)
        if draft_vocab_size is not None and (isinstance(draft_vocab_size, bool) or not isinstance(draft_vocab_size, int)
                                             or not 1 <= draft_vocab_size <= config.vocab_size):
            raise ValueError(f"FeatureHead: draft_vocab_size = {draft_vocab_size!r}; expected None or an integer "
                             f"from 1 to the vocabulary's {config.vocab_size}")
        self.draft_vocab = None if draft_vocab_size is None else DraftVocab(jnp.arange(draft_vocab_size, dtype=jnp.int32))
        # the tree this head drafts best (a parse_tree spec chosen by measurement, saved in its
        # config.json as "tree"); jaxspec.generate(tree=None) drafts it. None: the library default
        self.preferred_tree: str | None = None

    @property
    def draft_vocab_size(self) -> int | None:
        """K, the ids a reduced-vocabulary head drafts; None for the whole vocabulary."""
        return None if self.draft_vocab is None else int(self.draft_vocab.get_value().shape[0])

    def draft_logits(self, target: Transformer, h) -> jax.Array:
        """The logits over the ids the head drafts: float32 ``[B, T, K]`` at ``draft_vocab``'s
        K ids with a reduced vocabulary (the target's LM head at those rows), else ``[B, T, V]``."""
        if self.draft_vocab is None:
            return target.unembed(h)
        return target.unembed_rows(h, self.draft_vocab.get_value())

    def logits(self, target: Transformer, h) -> jax.Array:
        """The draft logits of features ``h [B, T, D]``: float32 ``[B, T, V]``, the target's
        LM head; with a reduced vocabulary its K rows, ``-inf`` at the other ids."""
        rows = self.draft_logits(target, h)  # [B, T, K]
        if self.draft_vocab is None:
            return rows
        full = jnp.full((*rows.shape[:-1], self.config.vocab_size), -jnp.inf, rows.dtype)
        return full.at[..., self.draft_vocab.get_value()].set(rows)

    def fused(self, feats, taps=None) -> jax.Array:
        """The feature a true pair reads: the target's ``feats [B, T, D]`` for a last-layer
        head; for a multi-layer head ``fuse([taps, feats])``, ``taps [B, T, k, D]`` the
        target's :func:`~jaxspec.nn.model.forward_taps` at ``feature_layers``."""
        if self.fuse is None:
            return feats.astype(_F32)
        b, t, k, d = taps.shape
        x = jnp.concatenate([taps.reshape(b, t, k * d), feats], axis=-1).astype(self.config.param_dtype)
        return self.fuse(x).astype(_F32)

    def inputs(self, target: Transformer, feats, tokens):
        """The layer's input ``fc([embed(tokens), feats])``: float32 ``[B, T, D]``."""
        x = jnp.concatenate([target.embed(tokens), feats.astype(_F32)], axis=-1)  # [B, T, 2D]
        return self.fc(x.astype(self.config.param_dtype)).astype(_F32)

    def __call__(self, target: Transformer, feats, tokens, positions, cache: KVCache, attention_mask):
        with jax.named_scope(FORWARD_SCOPE):
            x = self.inputs(target, feats, tokens)
            x, cache = write_and_attend(self.layers, x, positions, cache, attention_mask)
            return self.norm(x), cache

    def teacher_forced(self, target: Transformer, tokens, feats, taps=None):
        """Training and evaluation without a cache: ``tokens int32[B, T]`` and the target's
        features ``float32[B, T, D]`` at those tokens -> the head's prediction of each
        position's feature ``float32[B, T, D]``, position p reading ``feats[:, p - 1]``
        (zeros at p = 0) under a causal mask; ``taps [B, T, k, D]`` for a multi-layer head
        (:meth:`fused`)."""
        return self.unrolled(target, tokens, feats, 1, taps)[0]

    def unrolled(self, target: Transformer, tokens, feats, steps: int, taps=None) -> jax.Array:
        """The head's predictions at draft depths ``1 .. steps`` along the true sequence, each
        computed as drafting computes it: ``float32[steps, B, T, D]``.

        Depth 1 is :meth:`teacher_forced`. At depth ``s`` position p reads the depth ``s - 1``
        prediction at ``p - 1`` (in drafting, a drafted node reads its parent's predicted
        feature) and attends to what the head's cache holds when it drafts that node: the
        entries of true pairs at ``j <= p - s + 1`` (written when the round forwarded the
        target's features) and the drafted entries of its ancestors, depth ``k`` at
        ``j = p - s + k`` for ``k = 2 .. s`` (itself at ``k = s``). So every depth is one
        forward over the sequence with its K/V kept for the deeper ones, EAGLE-3's
        "training-time test". Positions ``p < s - 1`` have fewer than ``s - 1`` true
        predecessors, so a chain of that depth cannot reach them in drafting; their rows are
        computed but mean nothing (training and evaluation leave them out). Depth 1 reads the
        true pairs' :meth:`fused` features (``taps`` for a multi-layer head), deeper depths the
        head's own predictions, as drafting does."""
        b, t = tokens.shape
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        i = jnp.arange(t)
        layer = self.layers[0]
        ks, vs, preds = [], [], []
        inputs = self.fused(feats, taps)
        for s in range(1, steps + 1):
            prev = jnp.concatenate([jnp.zeros_like(inputs[:, :1]), inputs[:, :-1]], axis=1)  # [B, T, D]
            x = self.inputs(target, prev, tokens)
            q, k, v = layer.project(x, positions)
            ks.append(k)
            vs.append(v)
            blocks = [i[None, :] <= i[:, None] - (s - 1)]  # true pairs, [T, T]
            blocks += [i[None, :] == i[:, None] - (s - k) for k in range(2, s + 1)]  # the ancestors and itself
            mask = jnp.broadcast_to(jnp.concatenate(blocks, axis=1), (b, t, s * t))  # [B, T, s*T]
            pred = self.norm(layer.finish(x, q, jnp.concatenate(ks, axis=1), jnp.concatenate(vs, axis=1), mask))
            preds.append(pred)
            inputs = pred
        return jnp.stack(preds)


def init_head(config: ModelConfig, key: jax.Array, *, draft_vocab=None,
              feature_layers: tuple[int, ...] | None = None) -> FeatureHead:
    """A randomly initialised :class:`FeatureHead` (``key`` from ``jax.random.key``);
    ``draft_vocab`` (distinct target ids, any integer sequence) makes it a reduced-vocabulary
    head drafting those ids; ``feature_layers`` (target layer indices, e.g. ``(1, 14)``) a
    multi-layer head (:meth:`FeatureHead.fused`)."""
    if draft_vocab is None:
        return FeatureHead(config, rngs=nnx.Rngs(params=key), feature_layers=feature_layers)
    ids = np.asarray(draft_vocab)
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"init_head: draft_vocab = {ids.dtype}{list(ids.shape)}; expected a non-empty 1-D "
                         "sequence of integer token ids")
    _check_draft_ids(ids, config.vocab_size, "init_head: draft_vocab has")
    head = FeatureHead(config, rngs=nnx.Rngs(params=key), draft_vocab_size=int(ids.size),
                       feature_layers=feature_layers)
    head.draft_vocab.set_value(jnp.asarray(ids, jnp.int32))
    return head


def whole_vocab(head: FeatureHead) -> FeatureHead:
    """A copy of ``head`` that drafts from the whole vocabulary: the same trained weights, its
    logits the target's full LM head (no :class:`DraftVocab`). It shows what a reduced draft
    vocabulary gains or loses: the same predictions, at the full LM head's cost per draft
    token. ``head`` itself is left as it is; a head without reduction is copied as it is."""
    out = nnx.clone(head)
    out.draft_vocab = None
    return out


def check_head_for(name: str, head, target: Transformer) -> FeatureHead:
    """``head`` if it is a :class:`FeatureHead` that fits ``target`` (width, vocabulary),
    else ``ValueError`` naming ``name``."""
    if not isinstance(head, FeatureHead):
        raise ValueError(f"{name}: expected a jaxspec FeatureHead, got {type(head).__name__}")
    check_head_config_for(name, head.config, target, head.feature_layers)
    return head


def check_head_config_for(name: str, config: ModelConfig, target: Transformer,
                          feature_layers: tuple[int, ...] | None = None) -> None:
    """``ValueError`` naming ``name`` unless a head of ``config`` (and ``feature_layers``, a
    multi-layer head's) fits ``target`` (width, vocabulary, layers)."""
    for field in ("hidden_size", "vocab_size"):
        hv, tv = getattr(config, field), getattr(target.config, field)
        if hv != tv:
            raise ValueError(f"{name}: {field} = {hv}; expected the target's {field} = {tv} (a head reads the "
                             "target's features and logits through its LM head)")
    if feature_layers is not None:
        check_tap_layers(name, feature_layers, target.config.num_hidden_layers)


def target_digest(target: Transformer) -> str:
    """A short digest of the target's weights: a saved head records the target it was
    trained on. A W8A8 copy (:func:`jaxspec.nn.quant.quantize_model`) answers with the digest
    of the float weights it was made from."""
    recorded = getattr(target, "float_digest", None)
    if recorded is not None:
        return recorded
    h = hashlib.sha256()
    for path, var in sorted(nnx.to_flat_state(nnx.state(target)), key=lambda pv: str(pv[0])):
        h.update(str(path).encode())
        h.update(np.ascontiguousarray(np.asarray(var[...])).tobytes())
    return h.hexdigest()[:16]


def _tensor_names(state) -> dict[str, tuple]:
    """Safetensors name (the module path joined by dots) -> the path in the state."""
    return {".".join(str(p) for p in path): path for path, _ in nnx.to_flat_state(state)}


def is_head_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder whose ``config.json`` marks a feature head."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return False
    try:
        return HEAD_KEY in json.loads(cfg.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False


def recorded_target_digest(path: str | os.PathLike) -> str | None:
    """The :func:`target_digest` of the target the head in folder ``path`` was trained on,
    as :func:`save_head` recorded it; None when the folder records none."""
    meta = json.loads((Path(path) / "config.json").read_text())
    digest = meta.get("target_digest")
    return digest if isinstance(digest, str) else None


def save_head(head: FeatureHead, out_dir: str | os.PathLike, *, target: Transformer | None = None,
              extra: dict | None = None, storage_dtype: str | None = None) -> Path:
    """Write ``config.json`` and ``model.safetensors`` to ``out_dir`` (created); the
    target's digest is recorded when ``target`` is given. ``storage_dtype`` (``"float16"``)
    stores the floating-point tensors at that precision, half the size on disk, and
    :func:`load_head` casts them back to the head's parameter dtype. Returns the folder."""
    if storage_dtype not in (None, "float16"):
        raise ValueError(f"save_head: storage_dtype = {storage_dtype!r}; expected None or 'float16'")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {HEAD_KEY: head.config.to_dict(), **(extra or {})}
    if storage_dtype is not None:
        meta[STORAGE_KEY] = storage_dtype
    if head.draft_vocab is not None:
        meta[DRAFT_VOCAB_KEY] = head.draft_vocab_size
    if target is not None:
        meta["target_digest"] = target_digest(target)
    if head.preferred_tree is not None:
        meta[TREE_KEY] = head.preferred_tree
    if head.feature_layers is not None:
        meta[LAYERS_KEY] = list(head.feature_layers)
    flat = dict(nnx.to_flat_state(nnx.state(head)))
    tensors = {name: np.ascontiguousarray(np.asarray(flat[path].get_value()))
               for name, path in _tensor_names(nnx.state(head)).items()}
    if storage_dtype is not None:
        tensors = {k: v.astype(storage_dtype) if np.issubdtype(v.dtype, np.floating) else v for k, v in tensors.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "jaxspec-head"})
    (out / "config.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return out


def load_head(path: str | os.PathLike) -> FeatureHead:
    """The :class:`FeatureHead` saved in ``path`` (:func:`save_head`); errors name the
    folder and the tensor."""
    folder = Path(path)
    if not is_head_folder(folder):
        raise ValueError(f"load_head: {os.fspath(path)!r}: expected a folder whose config.json has {HEAD_KEY!r} "
                         "(written by jaxspec train-head or save_head)")
    meta = json.loads((folder / "config.json").read_text())
    config = ModelConfig.from_dict(meta[HEAD_KEY])
    k = meta.get(DRAFT_VOCAB_KEY)
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= config.vocab_size):
        raise ValueError(f"load_head: {folder / 'config.json'}: {DRAFT_VOCAB_KEY} = {k!r}; expected an integer "
                         f"from 1 to the vocabulary's {config.vocab_size}")
    layers = meta.get(LAYERS_KEY)
    if layers is not None and (not isinstance(layers, list) or not layers
                               or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers)
                               or layers != sorted(set(layers))):
        raise ValueError(f"load_head: {folder / 'config.json'}: {LAYERS_KEY} = {layers!r}; expected a list of "
                         "increasing target layer indices")
    graphdef, state = nnx.split(nnx.eval_shape(
        lambda: FeatureHead(config, rngs=nnx.Rngs(params=jax.random.key(0)), draft_vocab_size=k,
                            feature_layers=None if layers is None else tuple(layers))))
    shapes = {path: var.get_value() for path, var in nnx.to_flat_state(state)}
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"load_head: missing {weights}")
    pure = nnx.to_pure_dict(state)
    with safe_open(str(weights), framework="numpy") as f:
        stored = set(f.keys())
        names = _tensor_names(state)
        missing = sorted(set(names) - stored)
        if missing:
            raise ValueError(f"load_head: {weights} lacks tensor {missing[0]!r} ({len(missing)} missing)")
        stored_as = meta.get(STORAGE_KEY)
        for name, path in names.items():
            a, want = f.get_tensor(name), shapes[path]
            if stored_as is not None and a.dtype == np.dtype(stored_as) and np.issubdtype(np.dtype(want.dtype), np.floating):
                a = a.astype(want.dtype)  # saved at a lower precision (save_head's storage_dtype)
            if a.shape != tuple(want.shape) or a.dtype != want.dtype:
                raise ValueError(f"load_head: {weights}: tensor {name!r} is {a.dtype}{list(a.shape)}; "
                                 f"expected {want.dtype}{list(want.shape)}")
            if not np.isfinite(a).all():
                raise ValueError(f"load_head: {weights}: tensor {name!r} has non-finite values")
            node = pure
            for p in path[:-1]:
                node = node[p]
            node[path[-1]] = jnp.asarray(a)
    nnx.replace_by_pure_dict(state, pure)
    head = nnx.merge(graphdef, state)
    tree = meta.get(TREE_KEY)
    if tree is not None:  # parsed where it is used (jaxspec.generate names it as its tree)
        if not isinstance(tree, str) or not tree.strip():
            raise ValueError(f"load_head: {folder / 'config.json'}: {TREE_KEY} = {tree!r}; expected a tree spec "
                             "string such as 'chain:1'")
        head.preferred_tree = tree
    if head.draft_vocab is not None:
        _check_draft_ids(np.asarray(head.draft_vocab.get_value()), config.vocab_size,
                         f"load_head: {weights}: tensor 'draft_vocab' holds")
    return head


def _check_draft_ids(ids: np.ndarray, vocab_size: int, where: str) -> None:
    """``ValueError`` starting with ``where`` unless ``ids`` are distinct ids of the vocabulary."""
    if ids.min() < 0 or ids.max() >= vocab_size or np.unique(ids).size != ids.size:
        raise ValueError(f"{where} ids outside 0..{vocab_size - 1} or repeated ids; expected distinct ids of the "
                         "target's vocabulary")
