"""Training the embedded models: the stdlib text corpus (:mod:`~jaxspec.training.corpus`),
target training and draft distillation (:mod:`~jaxspec.training.train`)."""
