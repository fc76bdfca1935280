"""The model: configuration, the Llama-style transformer, its KV cache and attention
masks, checkpoints and tokenizers. Imports nothing from :mod:`jaxspec.core`."""
