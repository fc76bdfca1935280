"""File formats: Hugging Face checkpoint folders (safetensors, ``config.json`` and the model
families it names), GGUF files, packaged model files, and tokenizers (jaxspec's byte
tokenizer, a ``tokenizer.json``, a GGUF file's tokenizer and chat template). Builds
:mod:`jaxspec.nn` models from them; imports nothing from :mod:`jaxspec.core`."""
