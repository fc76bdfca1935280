"""How often a feature head's drafts are accepted along the target's own answers, by draft
depth, teacher forced: the measure of a head on held-out prompts without running the decoder::

    acc = acceptance_by_depth(head, target, sequences, prompt_lens, depths=3, greedy=True)
    acc["depth_1"], acc["depth_2"], acc["depth_3"]   # acceptance at each depth
    acc["chain_tokens"][k - 1]                        # tokens a chain:k round commits (greedy)

At depth ``s`` the draft of token ``p + 1`` is the head's, computed as drafting computes it
after the ``s - 1`` tokens before ``p + 1`` were drafted and accepted
(:meth:`~jaxspec.nn.head.FeatureHead.unrolled`). Only answer tokens count (the positions
after ``prompt_len``).

* ``greedy=True`` (answers decoded at T = 0): a draft is accepted when the head's most
  likely id is the target's. Greedy decoding accepts exactly these drafts, so
  ``chain_tokens[k - 1]`` (answer tokens over rounds, walking each answer round by round) is
  what a ``chain:k`` round of greedy speculative decoding commits on these answers.
* ``greedy=False`` (answers sampled at T = 1): the acceptance probability of a draft drawn
  from the head's law, ``sum_v min(p(v), q(v))``, given the true tokens before it. At depth
  1 this is the round's first acceptance rate; deeper, the true prefix stands in for the
  accepted one (which rejection sampling draws from ``min(p, q)``, not ``p``), an
  approximation.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.nn.head import FeatureHead
from jaxspec.nn.model import Transformer, forward_features, forward_taps

__all__ = ["acceptance_by_depth"]


@functools.partial(nnx.jit, static_argnums=(3, 4))
def _scores(head: FeatureHead, target: Transformer, tokens, depths: int, greedy: bool):
    """``int32[B, T]`` -> ``float32[S, B, T]``: at depth s and position p, the acceptance of
    the draft of token ``p + 1`` (module docstring)."""
    if head.feature_layers is None:
        feats, taps = forward_features(target, tokens), None
    else:
        feats, taps = forward_taps(target, tokens, head.feature_layers)
    preds = head.unrolled(target, tokens, feats, depths, taps)  # [S, B, T, D]
    tl = target.unembed(feats)  # [B, T, V]
    out = []
    for s in range(depths):
        ql = head.logits(target, preds[s])
        if greedy:
            out.append((jnp.argmax(ql, -1) == jnp.argmax(tl, -1)).astype(jnp.float32))
        else:
            out.append(jnp.sum(jnp.minimum(jax.nn.softmax(tl, -1), jax.nn.softmax(ql, -1)), -1))
    return jnp.stack(out)


def _check(sequences, prompt_lens, vocab: int, depths) -> None:
    if isinstance(depths, bool) or not isinstance(depths, int) or not 1 <= depths <= 8:
        raise ValueError(f"acceptance_by_depth: depths = {depths!r}; expected an integer from 1 to 8")
    if len(sequences) != len(prompt_lens) or not sequences:
        raise ValueError(f"acceptance_by_depth: {len(sequences)} sequences and {len(prompt_lens)} prompt_lens; "
                         "expected as many of each, at least one")
    for i, (s, n) in enumerate(zip(sequences, prompt_lens)):
        a = np.asarray(s)
        if a.ndim != 1 or not 1 <= n < a.size or a.min() < 0 or a.max() >= vocab:
            raise ValueError(f"acceptance_by_depth: sequences[{i}] ({a.size} ids) with prompt_len {n}; expected ids "
                             f"in 0..{vocab - 1} and 1 <= prompt_len < its length")


def _chain_walk(sc: np.ndarray, lo: int, hi: int, k: int) -> tuple[int, int]:
    """Greedy ``chain:k`` decoding of one answer, from its accepted-draft table ``sc [S, T]``:
    a round rooted at position p accepts the leading depths j with ``sc[j - 1, p + j - 1]``
    and commits them plus one token. Returns (answer tokens committed, rounds)."""
    p, tokens, rounds = lo, 0, 0
    while p < hi:
        run = 0
        while run < k and p + run < hi and sc[run, p + run] > 0.5:
            run += 1
        step = min(1 + run, hi - p)
        tokens, rounds, p = tokens + step, rounds + 1, p + step
    return tokens, rounds


def acceptance_by_depth(head: FeatureHead, target: Transformer, sequences: Sequence[Sequence[int]],
                        prompt_lens: Sequence[int], *, depths: int = 3, greedy: bool = False,
                        batch_size: int = 4, bucket: int = 64) -> dict:
    """Teacher-forced acceptance of ``head``'s drafts at depths ``1 .. depths`` over the
    answer tokens of ``sequences`` (prompt + answer ids; ``prompt_lens`` the prompts'
    lengths): ``{"depth_s": mean, ..., "chain_tokens": [k = 1 .. depths] (greedy only),
    "positions": answer tokens counted}``. Sequences are padded to a multiple of ``bucket``
    (few compilations) and run ``batch_size`` at a time."""
    _check(sequences, prompt_lens, target.config.vocab_size, depths)
    sums = np.zeros(depths)
    counts = np.zeros(depths)
    chain_tokens, chain_rounds = np.zeros(depths), np.zeros(depths)
    n_pos = 0
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    for start in range(0, len(order), batch_size):
        group = order[start:start + batch_size]
        t = -(-max(len(sequences[i]) for i in group) // bucket) * bucket
        batch = np.zeros((len(group), t), np.int32)
        for r, i in enumerate(group):
            batch[r, : len(sequences[i])] = sequences[i]
        sc = np.asarray(_scores(head, target, jnp.asarray(batch), depths, greedy), np.float64)  # [S, B, T]
        for r, i in enumerate(group):
            lo, hi = prompt_lens[i] - 1, len(sequences[i]) - 1  # positions p drafting answer token p + 1
            for s in range(depths):
                a = max(lo, s)  # depth s + 1 reaches position p >= s
                sums[s] += sc[s, r, a:hi].sum()
                counts[s] += max(0, hi - a)
            if greedy:
                for k in range(depths):
                    tok, rounds = _chain_walk(sc[:, r], lo, hi, k + 1)
                    chain_tokens[k] += tok
                    chain_rounds[k] += rounds
            n_pos += hi - lo
    out = {f"depth_{s + 1}": float(sums[s] / max(counts[s], 1)) for s in range(depths)}
    if greedy:
        out["chain_tokens"] = [float(t / max(r, 1)) for t, r in zip(chain_tokens, chain_rounds)]
    out["positions"] = int(n_pos)
    return out
