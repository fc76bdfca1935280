"""Where the rule meets the model: draft proposals (:mod:`~jaxspec.decode.draft`), the one
speculative round (:mod:`~jaxspec.decode.round`) and the generation loop
(:mod:`~jaxspec.decode.generate`)."""
