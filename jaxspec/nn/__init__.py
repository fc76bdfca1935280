"""The model: configuration, the Llama-style transformer, its KV cache and attention
masks, rope, sharding, quantization and the feature draft head. Reads no model files
(those are :mod:`jaxspec.formats`); imports nothing from :mod:`jaxspec.core`."""
