"""The rule and its laws: tree topology (:mod:`~jaxspec.core.tree`), tree specs
(:mod:`~jaxspec.core.treespec`), warps and draft draws (:mod:`~jaxspec.core.sampling`), the
verification rules -- their shared types (:mod:`~jaxspec.core.rule_types`), the token rule
(:mod:`~jaxspec.core.token_rule`, its residual laws :mod:`~jaxspec.core.residual`), block
(:mod:`~jaxspec.core.block`) and traversal (:mod:`~jaxspec.core.traversal`) verification, the
registry and :func:`~jaxspec.core.rules.speculative_accept` (:mod:`~jaxspec.core.rules`;
:mod:`~jaxspec.core.acceptance` re-exports the names users import from it) -- and the
numerical kernels they share (:mod:`~jaxspec.core.numerics`). Imports nothing from
:mod:`jaxspec.nn`."""
