"""The memory a generation will ask for, estimated from its shapes before anything is
allocated, and a refusal naming how many rows would fit when it exceeds the device's.

The estimate counts what grows with the rows: the KV caches (the target's, and a draft
model's or feature head's own; twice, since a loop update may hold the old and the new
cache at once), the vocabulary-wide rows of a round (the target's and the draft's laws over
``[root] + N`` nodes, with the warps' and the rule's temporaries), and the prefill: its
logits over the prompt and, growing with the square of the prompt, each layer's attention
scores and their softmax, float32 ``[rows, heads, P, S]`` for a prompt padded to ``P``
tokens attending over the cache's ``S`` slots (:meth:`jaxspec.nn.model.Attention.attend`
materializes both). Weights are left out: they are already in memory when this runs. It is
an estimate, within a small factor; its purpose is to refuse a call that cannot fit (a
million rows of a tiny model asked for 80 GB; an 8,101-token prompt on SmolLM2, whose
prefill asked for 7.6 GB) with a message instead of the kernel's kill.
"""

from __future__ import annotations

import os

import jax
import numpy as np

__all__ = ["device_memory_bytes", "estimate_generate_bytes", "check_generate_memory"]

#: float32 arrays of [rows, N + 1, V] alive at once in a round: target logits and law, draft
#: law, warp temporaries (sorts for top-k / top-p), the rule's residuals
VOCAB_ROWS_ALIVE = 6

#: float32 arrays of [rows, heads, P, S] alive at once in a prefill's attention layer (the
#: scores, the masked scores, their softmax). Measured: XLA's CPU compilation of SmolLM2's
#: prefill (9 heads, an 8,128-token prompt over 8,192 slots) keeps 7.25 GB of temporaries,
#: 3.0 times the scores' 2.4 GB, with 2 layers as with 30 (``Compiled.memory_analysis``);
#: the GPU run of issue 50 asked for 7.6 GB at once
PREFILL_SCORES_ALIVE = 3


def device_memory_bytes() -> int | None:
    """The memory of the default device: its ``bytes_limit`` where JAX reports one (GPU,
    TPU), else the machine's physical memory (CPU); ``None`` when neither is known."""
    dev = jax.local_devices()[0]  # this process's own (another process's devices report nothing)
    try:
        stats = dev.memory_stats()
    except Exception:  # noqa: BLE001  (a backend without memory statistics)
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not a POSIX system
        return None


def _cache_bytes(config, rows: int, slots: int, layers: int | None = None) -> int:
    layers = config.num_hidden_layers if layers is None else layers
    item = np.dtype(config.param_dtype).itemsize
    return 2 * layers * rows * slots * config.num_key_value_heads * config.head_dim * item


def estimate_generate_bytes(target_config, draft_config, *, rows: int, width: int, capacity: int,
                            tree_rows: int) -> int:
    """Bytes a generation of ``rows`` rows asks for (module docstring): prompts ``width``
    wide, ``capacity`` cache slots, ``tree_rows`` rows of a round's vocabulary laws (``N +
    1``; 1 for target-only), ``draft_config`` the draft model's or head's configuration
    (``None``: a drafter without a cache of its own)."""
    v = target_config.vocab_size
    caches = _cache_bytes(target_config, rows, capacity)
    if draft_config is not None:
        caches += _cache_bytes(draft_config, rows, capacity)
    vocab = VOCAB_ROWS_ALIVE * rows * tree_rows * v * 4
    prefill = rows * width * max(v, target_config.hidden_size) * 4 + _scores_bytes(
        target_config, draft_config, rows=rows, width=width, capacity=capacity)
    return 2 * caches + vocab + prefill


def _scores_bytes(target_config, draft_config, *, rows: int, width: int, capacity: int) -> int:
    """The prefill's attention scores and softmax (module docstring), for the model with the
    most heads (the target's and the draft's prefills run one after the other)."""
    heads = max(c.num_attention_heads for c in (target_config, draft_config) if c is not None)
    return PREFILL_SCORES_ALIVE * rows * heads * width * capacity * 4


def _longest_prompt(target_config, draft_config, *, limit: int, width: int, capacity: int,
                    tree_rows: int) -> int:
    """The widest prompt whose one row fits in ``limit`` bytes (the cache keeps the room
    after the prompt, ``capacity - width``); 0 when none does."""
    def fits(w: int) -> bool:
        return estimate_generate_bytes(target_config, draft_config, rows=1, width=w, capacity=capacity - width + w,
                                       tree_rows=tree_rows) <= limit

    lo, hi = 0, width  # fits(lo) or lo == 0; not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def check_generate_memory(target_config, draft_config, *, rows: int, width: int, capacity: int,
                          tree_rows: int, what: str = "prompts", prompts: int | None = None,
                          prompt_length: int | None = None) -> None:
    """``ValueError`` when :func:`estimate_generate_bytes` exceeds the device's memory
    (:func:`device_memory_bytes`), saying how many rows would fit and how to pass fewer
    (``what`` names the argument that sets the rows; ``prompts``, with ``what="rows"``: how
    many prompts there are, so that ``rows`` above them is named as such). When not even
    one row fits, the refusal names the prompt's length (``prompt_length``: the longest
    prompt's tokens before padding to ``width``) and the longest that would fit."""
    limit = device_memory_bytes()
    if limit is None:
        return
    need = estimate_generate_bytes(target_config, draft_config, rows=rows, width=width, capacity=capacity,
                                   tree_rows=tree_rows)
    if need <= limit:
        return
    per_row = estimate_generate_bytes(target_config, draft_config, rows=1, width=width, capacity=capacity,
                                      tree_rows=tree_rows)
    fit = max(limit // per_row, 0)
    length = width if prompt_length is None else prompt_length
    padded = f" (padded to {width})" if length != width else ""
    scores = _scores_bytes(target_config, draft_config, rows=1, width=width, capacity=capacity)
    if fit == 0:
        longest = _longest_prompt(target_config, draft_config, limit=limit, width=width, capacity=capacity,
                                  tree_rows=tree_rows)
        raise ValueError(
            f"prompts: a prompt of {length} tokens{padded} needs about {per_row / 2**30:.1f} GiB for its one "
            f"row, more than the device's {limit / 2**30:.1f} GiB (its prefill's attention scores over "
            f"{width} x {capacity} positions alone: {scores / 2**30:.1f} GiB); expected a prompt of at most "
            f"about {longest} tokens")
    need_text = (f"{rows} rows would need about {need / 2**30:.1f} GiB (KV caches of {capacity} slots, "
                 f"{tree_rows} vocabulary rows of {target_config.vocab_size} per round, the prefill of "
                 f"prompts of {length} tokens{padded}), more than the device's {limit / 2**30:.1f} GiB; "
                 f"about {fit} rows fit")
    if what == "rows" and prompts is not None and rows > prompts:
        raise ValueError(f"rows = {rows} exceeds the {prompts} prompt(s): {need_text}; expected rows <= "
                         f"{min(prompts, max(fit, 1))} (a row beyond the prompts decodes nothing)")
    raise ValueError(
        f"{what}: {need_text}: pass fewer prompts, or rows={max(fit, 1)} to decode "
        "them that many at a time (continuous batching)")
