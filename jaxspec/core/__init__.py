"""The rule and its laws: tree topology (:mod:`~jaxspec.core.tree`), tree specs
(:mod:`~jaxspec.core.treespec`), warps and draft draws (:mod:`~jaxspec.core.sampling`), the
acceptance rule (:mod:`~jaxspec.core.acceptance`) and the numerical kernels they share
(:mod:`~jaxspec.core.numerics`). Imports nothing from :mod:`jaxspec.nn`."""
