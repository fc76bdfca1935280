"""The target's own answers to a list of instructions, sampled with jaxspec's decoder and
stored as token shards (:mod:`jaxspec.training.shards`): the data a draft head learns from.

Every instruction is answered under each sampling setting that applies to it (by default
greedy, T = 1, and T = 0.7 for every third instruction: the laws users serve with). Answers
are decoded in batches of ``rows`` rows, ``segment`` tokens at a time: after each segment the
rows that ended are written and the others go back to the queue with their answer so far
as part of their prompt, so a batch never idles on its longest answer, and a stopped run
loses at most the segment in flight. Continuing an answer from its prefix samples the same
law as decoding it at once, so the records are samples of the target's law::

    write_answers(target, tokenizer, items, "runs/head/answers", model_digest="sha256:...")
    records = read_shards("runs/head/answers")   # Record(tokens, prompt_len, instruction, setting, ended)

A record is complete when it ends with a stop token or reaches ``max_new_tokens``. The folder's
``meta.json`` names the model's digest, the settings, the budget and the seed; a run on a
folder made with other values is refused (:class:`~jaxspec.training.shards.ShardWriter`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence

import numpy as np
from tqdm.auto import tqdm

from jaxspec.training.shards import Record, ShardWriter, read_shards

__all__ = ["SETTINGS", "Setting", "write_answers", "jobs_for"]


@dataclasses.dataclass(frozen=True)
class Setting:
    """One sampling setting: its law (``Sampling`` fields) and which instructions it answers
    (those whose index is a multiple of ``every``)."""

    temperature: float
    every: int = 1

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


#: greedy and T = 1 for every instruction, T = 0.7 for every third. No top-p: on this CPU a
#: nucleus over 49,152 ids (a sort per row and step) makes a step 2.5x as slow (measured:
#: 54 against 22 s for 32 rows of 128 tokens on SmolLM2)
SETTINGS = (Setting(0.0), Setting(1.0), Setting(0.7, every=3))


def jobs_for(num_items: int, settings: Sequence[Setting]) -> list[tuple[int, int]]:
    """Every ``(instruction, setting)`` pair the run answers."""
    return [(i, s) for s, st in enumerate(settings) for i in range(num_items) if i % st.every == 0]


def write_answers(target, tokenizer, items: Sequence[tuple[str, list[dict]]], out: str | os.PathLike, *,
                  model_digest: str, settings: Sequence[Setting] = SETTINGS, max_new_tokens: int = 256,
                  segment: int = 128, rows: int = 64, shard_records: int = 256, seed: int = 0,
                  stop_tokens: Sequence[int] | None = None, progress: bool = True,
                  deadline: float | None = None) -> list[Record]:
    """Answers ``items`` (``[(category, messages)]``, or ``[(category, text)]`` for a base
    model's plain prompts) with ``target`` through ``tokenizer``'s chat template, appending shards to ``out``; returns every record in ``out``.

    ``stop_tokens``: default the tokenizer's end-of-text id. ``deadline``: a ``time.time()``
    after which no new segment starts (the records so far are written; run again to go on)."""
    import jax  # noqa: PLC0415

    from jaxspec.core.settings import Sampling  # noqa: PLC0415
    from jaxspec.decode.generate import generate_autoregressive  # noqa: PLC0415

    for name, v in (("max_new_tokens", max_new_tokens), ("segment", segment), ("rows", rows),
                    ("shard_records", shard_records)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"write_answers: {name} = {v!r}; expected a positive integer")
    stops = tuple(int(s) for s in (stop_tokens if stop_tokens is not None else (tokenizer.eos_id,)))
    writer = ShardWriter(out, meta={
        "model": model_digest, "vocab_size": int(target.config.vocab_size), "settings": [s.to_dict() for s in settings],
        "max_new_tokens": max_new_tokens, "stop_tokens": list(stops), "seed": seed, "num_instructions": len(items)})
    done = {(r.instruction, r.setting) for r in read_shards(out)}
    todo = [j for j in jobs_for(len(items), settings) if j not in done]
    # a chat (a list of messages) through the template; a plain text (a base model's prompt) as it is
    prompts = {i: tokenizer.encode(items[i][1]) if isinstance(items[i][1], str) else tokenizer.encode_chat(items[i][1])
               for i in {i for i, _ in todo}}
    # the queue: (instruction, setting, answer so far); shorter prompts first within a setting,
    # so a batch's rows have similar widths (less padding)
    queue = sorted(((i, s, ()) for i, s in todo), key=lambda j: (j[1], len(prompts[j[0]])))
    bar = tqdm(total=len(todo), desc="answers", unit="answer", disable=not progress, dynamic_ncols=True)
    pending: list[Record] = []
    tokens_out, t0, step = 0, time.time(), 0
    while queue and (deadline is None or time.time() < deadline):
        s = queue[0][1]
        batch = [j for j in queue if j[1] == s][:rows]
        taken = set(map(id, batch))
        queue = [j for j in queue if id(j) not in taken]
        budget = min(segment, min(max_new_tokens - len(a) for _, _, a in batch))
        sampling = Sampling(temperature=settings[s].temperature)
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), s), step)
        res = generate_autoregressive(key, target, [prompts[i] + list(a) for i, _, a in batch],
                                      max_new_tokens=budget, sampling=sampling, stop_tokens=stops)
        step += 1
        toks, lens = np.asarray(res.tokens), np.asarray(res.lengths)
        back = []
        for (i, s_, a), row, n in zip(batch, toks, lens):
            ans = a + tuple(int(t) for t in row[:n])
            tokens_out += int(n)
            ended = n > 0 and int(row[n - 1]) in stops
            if ended or len(ans) >= max_new_tokens:
                pending.append(Record(tokens=tuple(prompts[i]) + ans, prompt_len=len(prompts[i]), instruction=i,
                                      setting=s_, ended=bool(ended)))
                bar.update(1)
            else:
                back.append((i, s_, ans))
        queue = back + queue  # unfinished answers first: they free their rows soonest
        if len(pending) >= shard_records:
            writer.write(pending)
            pending = []
        bar.set_postfix(tok_s=f"{tokens_out / (time.time() - t0):.0f}")
    writer.write(pending)
    bar.close()
    return read_shards(out)
