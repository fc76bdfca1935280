"""Which generation settings go together: one table, asked by every front end.

Each :class:`Combination` names the settings it relates, says when it refuses them and
what would be accepted instead. :func:`check_settings` runs the rows whose settings are
all known and raises the first refusal as a :class:`~jaxspec.checks.SettingError`:

* :func:`jaxspec.generate` (through :func:`jaxspec.decode.config.build_config`) and
  :func:`jaxspec.verify` ask it with every setting;
* the command line asks it before loading any model, with what the flags say (the
  vocabulary is not known yet: those rows wait for the library's call), and renders the
  error in its flags (``--scheme iid and --tree dynamic:...: expected ...``);
* :func:`jaxspec.auto_tree` asks it with ``auto=True``.

The settings are the library's argument names (``tree`` parsed, ``scheme``, ``rule``,
``mesh``, ``rows``, ``on_round``, ``vocab_size``), plus ``auto`` (the tree is chosen by
timing) and ``draft``, the drafter's kind: ``"model"``, ``"head"``, ``"lookup"``,
``"layers"`` or ``"yours"``.

What one drafter can serve (a tree kind, a scheme, a mesh) is not here: each drafter says
it in its :meth:`~jaxspec.Drafter.check`, which the library calls right after this table.

Example::

    >>> check_settings(tree=parse_tree("dynamic:depth=3,topk=2,nodes=6"), scheme="iid")
    SettingError: scheme = 'iid' and tree = DynamicTree(...): a dynamic tree ranks fixed
    candidates; expected scheme 'deterministic' (its default)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from jaxspec.errors import SettingError
from jaxspec.core import rules
from jaxspec.core.treespec import DynamicTree, StaticTree

__all__ = ["Combination", "TABLE", "AUTO_TREE_RULES", "check_settings", "refusal"]

#: the rules a tree chosen by timing (``auto_tree``, ``--tree auto``) can be verified with:
#: those every candidate tree takes
AUTO_TREE_RULES = (rules.AUTO, "token", "traversal")


class Combination(NamedTuple):
    """One row of the table: ``settings`` (names, in the order a message names them),
    ``refuses(known) -> bool`` and ``expected(known) -> str``, both reading the settings
    by name from ``known``."""

    settings: tuple[str, ...]
    refuses: Callable[[Mapping[str, Any]], bool]
    expected: Callable[[Mapping[str, Any]], str]


def _dynamic(k) -> bool:
    return isinstance(k["tree"], DynamicTree)


def _builtin_rule_error(k) -> str | None:
    """Why a built-in rule is not lossless on this tree and scheme (None when it is, or
    when the rule is the caller's own function: their claim, tested by ``verify``)."""
    rule = k["rule"]
    if callable(rule) and not isinstance(rule, str):
        return None
    try:
        rules.check_rule(rule, k["scheme"], k["tree"])
    except ValueError as e:
        return str(e).split(": ", 1)[1]  # check_rule names the rule itself; the row names the settings
    return None


def _too_many_siblings(k) -> bool:
    tree, v = k["tree"], k["vocab_size"]
    if isinstance(tree, DynamicTree):
        return tree.topk > v
    return k["scheme"] != "iid" and tree.max_siblings > v


def _siblings_expected(k) -> str:
    tree, v = k["tree"], k["vocab_size"]
    if isinstance(tree, DynamicTree):
        return f"a dynamic tree's topk ({tree.topk}) exceeds the vocabulary ({v} tokens); expected topk <= {v}"
    return (f"a node has {tree.max_siblings} children, more than the {v} distinct tokens of the vocabulary that "
            f"scheme {k['scheme']!r} draws them from; expected scheme 'iid' or a narrower tree")


#: every refused combination of generation settings, in the order they are checked
TABLE: tuple[Combination, ...] = (
    Combination(("scheme", "tree"),
                lambda k: _dynamic(k) and k["scheme"] not in (None, "deterministic"),
                lambda k: "a dynamic tree ranks fixed candidates; expected scheme 'deterministic' (its default)"),
    Combination(("tree", "scheme", "vocab_size"), _too_many_siblings, _siblings_expected),
    Combination(("rule", "tree", "scheme"),
                lambda k: k["scheme"] is not None and _builtin_rule_error(k) is not None,
                lambda k: _builtin_rule_error(k)),
    Combination(("rows", "mesh"),
                lambda k: k["rows"] is not None and k["mesh"] is not None,
                lambda k: "continuous batching runs on one device; expected mesh None, or rows None to split "
                          "every prompt's row over the mesh"),
    Combination(("rows", "on_round"),
                lambda k: k["rows"] is not None and k["on_round"] is not None,
                lambda k: "on_round streams the rows of one batch, and with continuous batching a row changes "
                          "prompts; expected on_round None (or rows None)"),
    Combination(("auto", "mesh"),
                lambda k: k["auto"] and k["mesh"] is not None,
                lambda k: "a tree is chosen by timing trees on one device; expected a tree such as 'chain:4' "
                          "with a mesh"),
    Combination(("auto", "draft"),
                lambda k: k["auto"] and k["draft"] != "model",
                lambda k: "a tree is chosen by timing a draft model's trees; expected a tree such as 'chain:4' "
                          "with this drafter"),
    Combination(("auto", "rule"),
                lambda k: k["auto"] and not (isinstance(k["rule"], str) and k["rule"] in AUTO_TREE_RULES),
                lambda k: "a tree is chosen among branching trees and chains by timing named rules; expected rule "
                          "'auto' (block verification on the chains among them), 'token' or 'traversal' (or a "
                          "chain such as 'chain:4' with rule 'block', or with your own rule function)"),
)


def refusal(known: Mapping[str, Any]) -> tuple[Combination, str] | None:
    """The first row of :data:`TABLE` that refuses ``known`` (rows with a setting missing
    from ``known`` are skipped) and its ``expected`` text; ``None`` when none does."""
    for row in TABLE:
        if all(name in known for name in row.settings) and row.refuses(known):
            return row, row.expected(known)
    return None


def check_settings(shown: Mapping[str, Any] | None = None, **known) -> None:
    """Raise the first refusal of :data:`TABLE` for the settings ``known`` as a
    :class:`~jaxspec.checks.SettingError` naming them (``vocab_size`` is read but named only
    as the tree's bound). ``shown``: the values to name instead of ``known``'s (a tree
    spec as the caller wrote it, rather than the parsed tree)."""
    for name in ("tree",):
        if name in known and not isinstance(known[name], (StaticTree, DynamicTree)):
            raise TypeError(f"check_settings: {name} must be a parsed tree (resolve_tree), got {known[name]!r}")
    found = refusal(known)
    if found is None:
        return
    row, expected = found
    shown = {**known, **(shown or {})}
    raise SettingError({name: shown[name] for name in row.settings if name != "vocab_size"}, expected)
