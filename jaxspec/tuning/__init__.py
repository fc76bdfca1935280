"""Choosing the tree: the acceptance-optimal tree for a node budget
(:mod:`~jaxspec.tuning.optimize`) and the budget that pays on this device
(:mod:`~jaxspec.tuning.autotree`, which times decode's own round)."""
