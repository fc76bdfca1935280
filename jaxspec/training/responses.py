"""The target's own answers to the training instructions, the data a draft head learns from.

Answers are sampled from the target at temperature 0 and 1 (no top-k or top-p) and written
one JSON line each, so a run stopped half way resumes where it stopped::

    write_responses("smollm2-135m", "runs/smollm2-head/responses.jsonl")
    # {"index": 17, "category": "code", "temperature": 1.0, "prompt_ids": [...], "response_ids": [...]}

The sampler is ``transformers``' ``generate`` on the same GGUF file (its own GGUF loader,
the reference of jaxspec's parity tests, tests/test_smollm2.py), batched, because on this
CPU it answers faster than jaxspec's batch decoding (benchmarks/README.md, ``cost_model``);
the answers are training data, so any sampler of the target's law serves. It needs the
``hf`` extra (torch, transformers, gguf). Prompt ids are jaxspec's own
(:meth:`~jaxspec.formats.gguf_tokenizer.GGUFTokenizer.encode_chat`), as ``jaxspec generate
--chat`` encodes a chat.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tqdm.auto import tqdm

from jaxspec.training.instructions import instructions

__all__ = ["TEMPERATURES", "read_responses", "write_responses"]

TEMPERATURES = (0.0, 1.0)


def read_responses(path: str | os.PathLike) -> list[dict]:
    """The records of a responses file (an absent file: none); a torn last line is dropped."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # the line a stopped run was writing
            break
    return out


def write_responses(target: str, out: str | os.PathLike, *, max_new_tokens: int = 160, batch_size: int = 8,
                    seed: int = 0, limit: int | None = None, progress: bool = True, model=None) -> list[dict]:
    """Answer every instruction of :func:`~jaxspec.training.instructions.instructions` (the
    first ``limit`` when given) at each temperature of :data:`TEMPERATURES` with the packaged
    GGUF target ``target``, appending to ``out`` the answers it does not hold yet; returns all
    records. ``model``: ``target`` as a ``transformers`` causal language model already loaded
    (float32, in eval mode), for several calls; ``None`` loads it from the GGUF file with
    ``transformers``' own loader, which takes tens of seconds."""
    import torch  # noqa: PLC0415 (the hf extra)
    import transformers  # noqa: PLC0415

    from jaxspec.formats.checkpoint import load_tokenizer  # noqa: PLC0415
    from jaxspec.formats.packaged import packaged_file  # noqa: PLC0415

    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"write_responses: max_new_tokens = {max_new_tokens!r}; expected a positive integer")
    if model is not None and not callable(getattr(model, "generate", None)):
        raise TypeError(f"write_responses: model = {type(model).__name__}; expected None or a transformers causal "
                        "language model (with .generate)")
    gguf = packaged_file(target)
    tok = load_tokenizer(target)
    eos = tok.eos_id
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = {(r["index"], r["temperature"]) for r in read_responses(out)}
    items = instructions()[:limit]
    todo = [(i, t) for t in TEMPERATURES for i in range(len(items)) if (i, t) not in done]
    if not todo:  # a finished run: no model to load (transformers' GGUF loader takes tens of seconds)
        return read_responses(out)
    if model is None:
        model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                                  dtype=torch.float32).eval()
    prompts = {i: tok.encode_chat(items[i][1]) for i, _ in todo}
    todo.sort(key=lambda it: (it[1], len(prompts[it[0]])))  # similar lengths share a batch: less padding
    bar = tqdm(total=len(todo), desc="responses", disable=not progress, dynamic_ncols=True)
    with out.open("a", encoding="utf-8") as f:
        for start in range(0, len(todo), batch_size):
            batch = todo[start:start + batch_size]
            temp = batch[0][1]
            ids = [prompts[i] for i, _ in batch]
            width = max(map(len, ids))
            pad = tok.pad_id if tok.pad_id is not None else eos
            input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])  # left padding
            mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
            torch.manual_seed(seed + start + int(temp * 1000))
            sample = dict(do_sample=True, temperature=temp, top_k=0, top_p=1.0) if temp > 0 else dict(do_sample=False)
            with torch.no_grad():
                gen = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                     eos_token_id=eos, pad_token_id=pad, **sample)
            for (i, t), row in zip(batch, gen[:, width:].tolist()):
                resp = row[:row.index(eos) + 1] if eos in row else row
                rec = {"index": i, "category": items[i][0], "temperature": t, "prompt_ids": prompts[i],
                       "response_ids": resp}
                f.write(json.dumps(rec) + "\n")
            f.flush()
            bar.update(len(batch))
    bar.close()
    return read_responses(out)
