"""What training reports: FLOPs per token, the next-token loss, and how close a draft is to
its target (KL, the overlap ``sum_v min(p, q)`` that is one draft token's acceptance at
temperature 1), over ``int32[N, T + 1]`` windows of held-out text."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxspec.nn.config import ModelConfig
from jaxspec.nn.model import Transformer, forward_logits

__all__ = ["flops_per_token", "token_nll", "kl_per_position", "overlap_per_position", "eval_lm_batch",
           "eval_pair_batch", "window_chunks", "evaluate_loss", "evaluate_pair", "acceptance_alpha"]


def flops_per_token(config: ModelConfig, context: int) -> int:
    """Forward FLOPs (2 per multiply-add) for one token attending over ``context`` tokens:
    all projections, the LM head and attention scores/values (embedding lookup is free)."""
    d, h, kv, hd = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
    proj = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * config.intermediate_size
    attn = 2 * h * hd * context
    return 2 * (config.num_hidden_layers * (proj + attn) + d * config.vocab_size)


def token_nll(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Next-token cross entropy per position: logits [B, T, V], targets int [B, T] -> [B, T]."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets)  # [B, T]


def kl_per_position(target_logits: jax.Array, draft_logits: jax.Array) -> jax.Array:
    """KL(softmax(target) || softmax(draft)) per position: [B, T, V] x2 -> [B, T]."""
    lp = jax.nn.log_softmax(target_logits.astype(jnp.float32), axis=-1)
    lq = jax.nn.log_softmax(draft_logits.astype(jnp.float32), axis=-1)
    return jnp.sum(jnp.exp(lp) * (lp - lq), axis=-1)


def overlap_per_position(target_logits: jax.Array, draft_logits: jax.Array) -> jax.Array:
    """sum_v min(p, q) per position (acceptance probability at temperature 1)."""
    p = jax.nn.softmax(target_logits.astype(jnp.float32), axis=-1)
    q = jax.nn.softmax(draft_logits.astype(jnp.float32), axis=-1)
    return jnp.sum(jnp.minimum(p, q), axis=-1)


@nnx.jit
def eval_lm_batch(model: Transformer, batch: jax.Array) -> jax.Array:
    """Summed next-token cross entropy of a batch of windows ``int32[B, T + 1]``."""
    return jnp.sum(token_nll(forward_logits(model, batch[:, :-1]), batch[:, 1:]))


@nnx.jit
def eval_pair_batch(target: Transformer, draft: Transformer, batch: jax.Array):
    """Summed KL(target || draft), overlap and draft cross entropy of a batch of windows."""
    tl = forward_logits(target, batch[:, :-1])
    dl = forward_logits(draft, batch[:, :-1])
    return (
        jnp.sum(kl_per_position(tl, dl)),
        jnp.sum(overlap_per_position(tl, dl)),
        jnp.sum(token_nll(dl, batch[:, 1:])),
    )


def window_chunks(windows: np.ndarray, size: int):
    """``windows`` in device batches of ``size`` rows (the last may be smaller)."""
    for i in range(0, len(windows), size):
        yield jnp.asarray(windows[i : i + size])


def evaluate_loss(model: Transformer, windows: np.ndarray, batch_size: int = 16) -> float:
    """Mean next-token cross entropy (nats/byte) over ``int32[N, T+1]`` windows."""
    total = sum(float(eval_lm_batch(model, b)) for b in window_chunks(windows, batch_size))
    return total / (windows.shape[0] * (windows.shape[1] - 1))


def evaluate_pair(target, draft, windows, batch_size=16) -> dict[str, float]:
    """``val_kl``, ``alpha`` (overlap) and the draft's ``val_loss``, per position of ``windows``."""
    sums = np.zeros(3)
    for b in window_chunks(windows, batch_size):
        sums += np.array([float(x) for x in eval_pair_batch(target, draft, b)])
    kl, alpha, nll = (float(x) for x in sums / (windows.shape[0] * (windows.shape[1] - 1)))
    return {"val_kl": kl, "alpha": alpha, "val_loss": nll}


def acceptance_alpha(target: Transformer, draft: Transformer, windows: np.ndarray, batch_size: int = 16) -> float:
    """Mean over all positions of ``windows`` (``int32[N, T+1]``; the last token is unused) of
    ``sum_v min(p, q)``: the per-position acceptance probability of one draft token at
    temperature 1."""
    return evaluate_pair(target, draft, windows, batch_size)["alpha"]
