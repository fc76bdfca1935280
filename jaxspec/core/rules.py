"""The verification rules, which (rule, scheme, tree) combinations each may take, and
:func:`speculative_accept`, which checks its inputs and runs the rule asked for.

A rule (:class:`jaxspec.core.rule_types.Rule`) is a function with the signature of the
token-level rule :func:`jaxspec.core.token_rule.accept_core`::

    rule(key, parents int32[N], tokens int32[N], target_probs float32[N + 1, V],
         draft_probs float32[N + 1, V], scheme: str) -> AcceptResult

for one tree: pure, jit- and vmap-able, no input checks (the caller validated them), with
the conventions of docs/DESIGN.md §1 (row 0 is the law at the root, row ``i + 1`` the
law after node i; ``draft_probs[r]`` is the law the children of row ``r`` were drawn from).
It returns the accepted path and one extra token (:class:`~jaxspec.AcceptResult`).

Built-in rules (``rule=`` takes the name; ``"auto"``, the default of :func:`jaxspec.generate`
and :func:`jaxspec.verify`, is ``"block"`` on a static chain and ``"token"`` on every other
tree: block verification accepts at least as many tokens at about the same cost per round,
while traversal's longer loop costs more than it gains on this CPU; benchmarks/README.md,
rule_gains):

=============  ===============================================  =========================
name           what it does                                     lossless with (proved by
                                                                exact enumeration, tests/
                                                                test_rules_enumeration.py)
=============  ===============================================  =========================
``token``      token by token from the root (DESIGN §2)         every scheme, every tree
``block``      block verification of a chain: weights clipped   chains; every scheme
               at every step, the LAST passing position
``traversal``  traversal verification, leaf to root (on a       static chains and trees;
               chain it is block verification)                  every scheme
=============  ===============================================  =========================

A user's own function is accepted as ``rule=`` too; it is then the user's claim, which
:func:`jaxspec.verify` (``rule=``) tests exactly as it tests the built-in rules.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from jaxspec.checks import is_concrete
from jaxspec.core.block import block_accept, is_chain
from jaxspec.core.rule_types import AcceptResult, check_drawable, check_inputs
from jaxspec.core.sampling import SCHEMES, check_key
from jaxspec.core.token_rule import accept_core
from jaxspec.core.traversal import traversal_accept
from jaxspec.core.treespec import DynamicTree, StaticTree

__all__ = ["AUTO", "CHOICES", "RULES", "SUPPORTED", "check_rule", "resolve_rule", "rule_function", "rule_name",
           "speculative_accept", "tree_kind"]

RULES = ("token", "block", "traversal")
#: the automatic choice: block verification on a static chain, the token rule elsewhere
AUTO = "auto"
#: every name ``rule=`` and ``--rule`` take
CHOICES = (AUTO, *RULES)

#: (rule, tree kind) -> the schemes it is proved lossless with. Tree kinds: "chain" (a
#: static chain), "tree" (any other static tree), "dynamic" (a DynamicTree).
SUPPORTED: dict[tuple[str, str], tuple[str, ...]] = {
    ("token", "chain"): SCHEMES,
    ("token", "tree"): SCHEMES,
    ("token", "dynamic"): ("deterministic",),
    ("block", "chain"): SCHEMES,
    ("traversal", "chain"): SCHEMES,
    ("traversal", "tree"): SCHEMES,
}

_FUNCTIONS: dict[str, Callable] = {"token": accept_core, "block": block_accept, "traversal": traversal_accept}


def tree_kind(tree) -> str:
    """"chain", "tree" or "dynamic" for a StaticTree / DynamicTree / concrete parents."""
    if isinstance(tree, DynamicTree):
        return "dynamic"
    parents = tree.parents_array if isinstance(tree, StaticTree) else np.asarray(tree)
    return "chain" if is_chain(parents) else "tree"


def resolve_rule(rule, tree):
    """``rule`` with ``"auto"`` replaced by the rule it picks for ``tree`` (a StaticTree, a
    DynamicTree or concrete parents): ``"block"`` on a chain, ``"token"`` otherwise."""
    if isinstance(rule, str) and rule == AUTO:
        return "block" if tree_kind(tree) == "chain" else "token"
    return rule


def rule_name(rule) -> str:
    """The name a rule is reported under: its built-in name, or the function's name."""
    if isinstance(rule, str):
        return rule
    return f"custom:{getattr(rule, '__qualname__', getattr(rule, '__name__', repr(rule)))}"


def check_rule(rule, scheme: str, tree) -> Callable:
    """The acceptance function of ``rule`` for this ``scheme`` and ``tree`` (a StaticTree,
    a DynamicTree or concrete parents); ``ValueError`` naming the argument when the rule
    is unknown or not proved lossless for the combination. A callable ``rule`` is
    returned as it is (the caller's claim)."""
    if callable(rule) and not isinstance(rule, str):
        return rule
    if rule not in CHOICES:
        raise ValueError(
            f"rule = {rule!r}: expected one of {', '.join(CHOICES)} or a function with the signature "
            "of jaxspec.core.acceptance.accept_core"
        )
    rule = resolve_rule(rule, tree)
    kind = tree_kind(tree)
    schemes = SUPPORTED.get((rule, kind), ())
    if scheme not in schemes:
        offered = [f"{k} ({', '.join(s)})" for (r, k), s in SUPPORTED.items() if r == rule]
        what = {"chain": "a chain", "tree": "a branching static tree", "dynamic": "a dynamic tree"}[kind]
        raise ValueError(
            f"rule = {rule!r}: not supported on {what} with scheme = {scheme!r}; rule {rule!r} is lossless "
            f"on: {'; '.join(offered)}"
        )
    return _FUNCTIONS[rule]


def rule_function(rule: str) -> Callable:
    """The function of a built-in rule, without the combination check."""
    if rule not in _FUNCTIONS:
        raise ValueError(f"rule = {rule!r}: expected one of {', '.join(_FUNCTIONS)}")
    return _FUNCTIONS[rule]


def speculative_accept(key, parents, tokens, target_probs, draft_probs, *, scheme: str,
                       rule="token") -> AcceptResult:
    """Accept a path of a draft tree and emit ``accepted + 1`` tokens, losslessly.

    Args:
      key: a ``jax.random.key``; split internally into one key for the per-node uniforms
        and one for the residual/bonus draw.
      parents: int32[N] tree (``parents[i] < i``, -1 = child of the root). A concrete array
        (list, numpy) makes the tree a compile-time constant and is validated; a traced
        array (dynamic trees) is used as data, unvalidated.
      tokens: int32[N] the drafted token of each node.
      target_probs: float32[N + 1, V] target law; row 0 at the root, row i + 1 after node i.
      draft_probs: float32[N + 1, V] draft law the children of each row were drawn from
        (after the same warps, in float32). Rows of leaves are not used.
      scheme: ``"iid"``, ``"without_replacement"`` or ``"deterministic"``.
      rule: the verification rule: ``"token"`` (token by token, every tree), ``"block"``
        (block verification, chains), ``"traversal"``, or a function with the signature
        of :func:`~jaxspec.core.token_rule.accept_core` (a :class:`~jaxspec.core.rule_types.Rule`;
        :data:`SUPPORTED` lists the combinations each built-in rule is proved lossless on;
        others are refused).

    Returns:
      :class:`AcceptResult`. Unbatched and pure: batch with ``jax.vmap`` over split keys.

    Example (a chain of 2 where the draft equals the target accepts everything)::

        p = jnp.full((3, 4), 0.25)
        r = speculative_accept(jax.random.key(0), [-1, 0], jnp.array([1, 2]), p, p,
                               scheme="iid")
        # r.num_tokens == 3, r.tokens[:2] == [1, 2], r.tokens[2] = bonus token

    Raises:
      ValueError: for an unknown scheme, bad shapes or dtypes, out-of-range tokens, or
        (when the arrays are concrete) probability rows that do not sum to 1.
    """
    key = check_key(key)
    check_inputs(parents, tokens, target_probs, draft_probs, scheme)
    check_drawable(parents, tokens, draft_probs, scheme)
    if isinstance(rule, str) and rule == "token":
        return accept_core(key, parents, tokens, target_probs, draft_probs, scheme)
    if isinstance(rule, str) and not is_concrete(parents):
        raise ValueError(f"rule = {rule!r}: needs concrete parents (a static tree); traced parents take rule='token'")
    fn = check_rule(rule, scheme, parents)
    return fn(key, parents, tokens, target_probs, draft_probs, scheme)
