"""The memory a generation will ask for, estimated from its shapes before anything is
allocated, and a refusal naming how many rows would fit when it exceeds the device's.

The estimate counts what grows with the rows: the KV caches (the target's, and a draft
model's or feature head's own; twice, since a loop update may hold the old and the new
cache at once), the vocabulary-wide rows of a round (the target's and the draft's laws over
``[root] + N`` nodes, with the warps' and the rule's temporaries) and the prefill's logits
over the prompt. Weights are left out: they are already in memory when this runs. It is an
estimate, within a small factor; its purpose is to refuse a call that cannot fit (a million
rows of a tiny model asked for 80 GB) with a message instead of the kernel's kill.
"""

from __future__ import annotations

import os

import jax
import numpy as np

__all__ = ["device_memory_bytes", "estimate_generate_bytes", "check_generate_memory"]

#: float32 arrays of [rows, N + 1, V] alive at once in a round: target logits and law, draft
#: law, warp temporaries (sorts for top-k / top-p), the rule's residuals
VOCAB_ROWS_ALIVE = 6


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
    prefill = rows * width * max(v, target_config.hidden_size) * 4
    return 2 * caches + vocab + prefill


def check_generate_memory(target_config, draft_config, *, rows: int, width: int, capacity: int,
                          tree_rows: int, what: str = "prompts", prompts: int | None = None) -> None:
    """``ValueError`` when :func:`estimate_generate_bytes` exceeds the device's memory
    (:func:`device_memory_bytes`), saying how many rows would fit and how to pass fewer
    (``what`` names the argument that sets the rows; ``prompts``, with ``what="rows"``: how
    many prompts there are, so that ``rows`` above them is named as such)."""
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
    need_text = (f"{rows} rows would need about {need / 2**30:.1f} GiB (KV caches of {capacity} slots, "
                 f"{tree_rows} vocabulary rows of {target_config.vocab_size} per round), more than the device's "
                 f"{limit / 2**30:.1f} GiB; about {fit} rows fit")
    if what == "rows" and prompts is not None and rows > prompts:
        raise ValueError(f"rows = {rows} exceeds the {prompts} prompt(s): {need_text}; expected rows <= "
                         f"{min(prompts, max(fit, 1))} (a row beyond the prompts decodes nothing)")
    raise ValueError(
        f"{what}: {need_text}: pass fewer prompts, or rows={max(fit, 1)} to decode "
        "them that many at a time (continuous batching)")
