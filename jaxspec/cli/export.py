"""``jaxspec export MODEL OUT_DIR``: write a jaxspec model as a Hugging Face Llama folder.

::

    jaxspec export default-target out/default-target            # float32, one safetensors file
    jaxspec export runs/draft/final out/draft --dtype bfloat16 --max-shard-mb 500

``OUT_DIR`` gets ``config.json`` (``LlamaForCausalLM``) and ``model.safetensors`` (or
shards + index) that ``transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)`` loads
with the same logits, plus ``generation_config.json`` with the token ids. The byte-level
tokenizer of the embedded models has no ``tokenizer.json``: encode text as UTF-8 bytes
(``jaxspec.formats.tokenizer.ByteTokenizer``). A source folder's ``tokenizer.json`` (and
``tokenizer_config.json`` / ``special_tokens_map.json``) is copied along; those files left in
``OUT_DIR`` by an earlier export of another model are removed (listed under ``"removed"``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys

from jaxspec.cli.common import (
    CLIError,
    Handler,
    check_output_dir,
    command,
    positive_int,
)

__all__ = ["export_command"]

_TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "jaxspec_tokenizer")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@command("export", help="write a model as a Hugging Face Llama folder (config.json + safetensors)")
def export_command(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("model", metavar="MODEL", help="embedded model name (default-target, default-draft) or folder")
    p.add_argument("out_dir", metavar="OUT_DIR",
                   help="folder to write (created; existing weights and tokenizer files replaced)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="stored dtype (default float32)")
    p.add_argument("--max-shard-mb", type=positive_int, default=None,
                   help="split the weights into shards of at most this many MB (with an index)")

    def run(args: argparse.Namespace) -> int:
        from jaxspec.formats.checkpoint import (
            load_model,
            read_config,
            resolve_model_path,
            save_model,
        )

        out = check_output_dir("OUT_DIR", args.out_dir)  # an empty path too, before resolving MODEL
        src = resolve_model_path(args.model)
        if out.exists() and out.resolve() == src.resolve():
            raise CLIError(f"OUT_DIR {str(out)!r} is the source folder; choose another")
        model = load_model(args.model)  # float32: the stored dtype is chosen below
        src_cfg = read_config(args.model)
        extra = {k: src_cfg[k] for k in _TOKEN_KEYS if k in src_cfg}
        shard = None if args.max_shard_mb is None else args.max_shard_mb * 1_000_000
        save_model(model, out, dtype=args.dtype, max_shard_bytes=shard, extra_config=extra)
        gen_cfg = {k: extra[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if extra.get(k) is not None}
        (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2, sort_keys=True) + "\n")
        removed = []
        for name in _TOKENIZER_FILES:
            if (src / name).is_file():
                shutil.copyfile(src / name, out / name)
            elif (out / name).is_file() or (out / name).is_symlink():  # stale: from another model
                (out / name).unlink()
                removed.append(name)
        print(json.dumps({"model": args.model, "out_dir": str(out), "dtype": args.dtype,
                          "params": model.config.num_params(),
                          "files": sorted(p.name for p in out.iterdir()), "removed": removed}))
        print(f"export: wrote {out} (LlamaForCausalLM, {args.dtype})"
              + (f"; removed stale {', '.join(removed)}" if removed else ""), file=sys.stderr)
        return 0

    return run
