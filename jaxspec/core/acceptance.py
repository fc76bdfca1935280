"""The acceptance rule's names where users have always imported them from. This module
defines nothing: it re-exports, and nothing in :mod:`jaxspec.core` imports it (so it
closes no import cycle).

* :class:`AcceptResult`, :func:`accept_result`, :func:`tree_structure`: the shared types of
  every rule, :mod:`jaxspec.core.rule_types`;
* :func:`accept_core` (the token rule), :func:`accept_probabilities`, :func:`choose_path`:
  :mod:`jaxspec.core.token_rule`; :func:`node_accept_probs`, :func:`row_residual`: its
  closed-form residual laws, :mod:`jaxspec.core.residual`;
* :func:`speculative_accept`: the registry of rules, :mod:`jaxspec.core.rules`.
"""

from __future__ import annotations

from jaxspec.core.residual import node_accept_probs, row_residual
from jaxspec.core.rule_types import AcceptResult, TreeStructure, accept_result, tree_structure
from jaxspec.core.rules import speculative_accept
from jaxspec.core.token_rule import accept_core, accept_probabilities, choose_path

__all__ = ["AcceptResult", "TreeStructure", "accept_core", "accept_probabilities", "accept_result", "choose_path",
           "node_accept_probs", "row_residual", "speculative_accept", "tree_structure"]
