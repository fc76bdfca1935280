"""What :func:`jaxspec.generate` and :func:`jaxspec.generate_autoregressive` return:
:class:`GenerateResult`, and the names its :meth:`~GenerateResult.summary` prints under."""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np

__all__ = ["GenerateResult", "SUMMARY_KEYS"]


class GenerateResult(NamedTuple):
    """Output of :func:`generate` / :func:`generate_autoregressive` (a pytree).

    Attributes:
      tokens:             int32[B, max_new_tokens] generated tokens, -1 after ``lengths[b]``.
      lengths:            int32[B] tokens generated per row (a stop token is included).
      rounds:             int32[B] rounds in which the row was still active.
      target_calls:       int32[B] target forward passes spent on the row after the prompt
                          prefill (one verification per round; ``lengths`` when autoregressive).
      draft_calls:        int32[B] draft forward passes after the prefill (per round: D for
                          a static tree of depth D, depth + 1 for a DynamicTree; 0 when
                          autoregressive).
      tau:                float32[B] ``lengths / target_calls``: tokens per target call
                          (``tokens_per_target_call`` in :meth:`summary`).
      accepted_per_depth: int32[B, D] accepted draft nodes at depth ``d + 1`` over the row's
                          rounds (all of a round's accepted nodes, even those cut by a stop
                          token or the budget; so ``lengths <= sum(accepted) + target_calls``,
                          with equality unless a round was cut).
    """

    tokens: jax.Array
    lengths: jax.Array
    rounds: jax.Array
    target_calls: jax.Array
    draft_calls: jax.Array
    tau: jax.Array
    accepted_per_depth: jax.Array

    def summary(self) -> dict:
        """Batch statistics as plain Python numbers (blocks on the device), under the names
        ``jaxspec generate --json`` prints them with (:data:`SUMMARY_KEYS`, in this order)::

          num_tokens:             tokens generated, summed over rows (``lengths``). ``tokens``
                                  names only lists of token ids, never a count.
          target_calls, draft_calls, rounds: the per-row fields of those names, summed over rows.
          loop_rounds:            iterations of the generation loop: the most ``rounds`` of any
                                  row (rows run in lockstep, so wall time per round divides by this).
          tokens_per_target_call: ``num_tokens / target_calls`` (tau; per row: the field ``tau``).
          accept_rate_per_depth:  for depth d + 1, accepted nodes at that depth / ``rounds``.

        Every count is a sum over rows, as ``rounds`` is (the denominator of
        ``accept_rate_per_depth``; for speculative decoding it equals ``target_calls``); the
        one batch maximum has its own name, ``loop_rounds``. With one row they agree.
        """
        lengths = np.asarray(self.lengths)
        tcalls = np.asarray(self.target_calls)
        acc = np.asarray(self.accepted_per_depth)
        rounds = np.asarray(self.rounds)
        return {
            "num_tokens": int(lengths.sum()),
            "target_calls": int(tcalls.sum()),
            "draft_calls": int(np.asarray(self.draft_calls).sum()),
            "rounds": int(rounds.sum()),
            "loop_rounds": int(rounds.max(initial=0)),
            "tokens_per_target_call": float(lengths.sum() / max(tcalls.sum(), 1)),
            "accept_rate_per_depth": (acc.sum(axis=0) / max(rounds.sum(), 1)).tolist(),
        }


#: the keys of :meth:`GenerateResult.summary`, in order (``jaxspec generate --json`` has each)
SUMMARY_KEYS = ("num_tokens", "target_calls", "draft_calls", "rounds", "loop_rounds",
                "tokens_per_target_call", "accept_rate_per_depth")
