"""Instructions written by the target itself (Magpie, arXiv 2406.08464): given only its chat
template's text up to where a user's message begins, a chat model samples a user's message.

Each batch of rows starts from that user-turn prefix followed by an *opener*, a few words
that steer the message towards one category of the task mix (``"Write a Python function
that"``, ``"Translate into French:"``; the empty opener is plain Magpie). The model writes the
rest of the message and ends its turn; a message that does not end within the token budget
is dropped. Kept messages pass :func:`~jaxspec.training.filters.keep_reason` and are neither
exact nor near duplicates (:class:`~jaxspec.training.filters.MinHashDedup`) of the seed
instructions (:mod:`jaxspec.training.instructions`), of the task-mix prompts
(:mod:`jaxspec.bench.tasks`, held out), or of a message kept before::

    build_instructions(target, tokenizer, "runs/head/instructions.jsonl", per_category=500)
    items = read_instructions("runs/head/instructions.jsonl")   # [(category, messages)], seeds first

The file holds one JSON line per batch (its index, the messages kept, the count dropped for
each reason), so a stopped run resumes at the next batch, with the same seeds, and gives the
same set as an unstopped one.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from jaxspec.training.filters import MinHashDedup, keep_reason
from jaxspec.training.responses import read_responses

__all__ = ["OPENERS", "SAMPLING", "user_turn_prefix", "turn_stop_ids", "build_instructions", "read_instructions",
           "held_out_texts", "seeded_dedup"]

#: per category, the openers a user's message starts from ("" lets the model choose freely)
OPENERS: dict[str, tuple[str, ...]] = {
    "chat": ("", "", "How do I", "What is", "Can you give me advice on", "Explain", "Write a short story about",
             "What are some", "Why do", "Write a poem about", "I need help with", "Give me ideas for"),
    "code": ("Write a Python function that", "Write a Python program that", "Write a JavaScript function that",
             "How do I", "Write a C function that", "Write a Rust function that", "Explain what this code does:\n\n",
             "Write a SQL query that", "Fix the bug in this Python code:\n\n", "Write a Python class that"),
    "math": ("Solve:", "A train travels", "What is", "If a shop sells", "Calculate", "Tom has", "Find x if",
             "A rectangle has", "How many", "Sarah buys"),
    "summary": ("Summarize the following text:\n\n", "Summarize this article in a few sentences.\n\n",
                "Give me a short summary of this paragraph:\n\n", "Summarize in one sentence:\n\n"),
    "context": ("Read the text and answer the question.\n\nText:", "Based on the passage below, answer the question.\n\n",
                "Answer the question using the text.\n\n", "Context:"),
    "translation": ("Translate into French:", "Translate into Spanish:", "Translate into German:",
                    "Translate into Italian:", "Translate the following sentence into Portuguese:",
                    "How do you say this in French:", "Translate into English:"),
}

#: the instructions' law: Magpie's T = 1 with no nucleus (a top-p over 49,152 ids, a sort per
#: row and step, makes a SmolLM2 step 2.5x as slow on this CPU); the filters drop the noise
SAMPLING = {"temperature": 1.0}

_SENTINEL = "\x00jaxspec-magpie\x00"


def _render(tokenizer, messages, where: str) -> tuple[str, str]:
    """The template's text before and after ``_SENTINEL`` in the last message."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=False)
    if text.count(_SENTINEL) != 1:
        raise ValueError(f"{where}: the chat template of {tokenizer.source} does not place a user's message in its "
                         "text verbatim; instructions cannot be sampled from it")
    head, tail = text.split(_SENTINEL)
    return head, tail


def _ids(tokenizer, text: str) -> list[int]:
    """``text``'s ids, its control tokens as single ids, no BOS or EOS added."""
    return tokenizer.encode(text, add_bos=False, add_eos=False)


def user_turn_prefix(tokenizer, *, system: str | None = None, history: Sequence[dict] = ()) -> list[int]:
    """Ids of the chat template's text up to where the next user message begins (after an
    optional ``system`` message and earlier ``history`` turns)."""
    msgs = ([{"role": "system", "content": system}] if system else []) + list(history)
    head, _ = _render(tokenizer, msgs + [{"role": "user", "content": _SENTINEL}], "user_turn_prefix")
    return _ids(tokenizer, head)


def turn_stop_ids(tokenizer) -> tuple[int, ...]:
    """The ids that end a user's turn: the template's first special token after a user's
    message (``<|im_end|>`` in ChatML), and the end-of-text id."""
    _, tail = _render(tokenizer, [{"role": "user", "content": _SENTINEL}], "turn_stop_ids")
    ids = _ids(tokenizer, tail)
    stops = [i for i in ids[:3] if tokenizer.is_special(i)][:1]
    if tokenizer.eos_id is not None:
        stops.append(int(tokenizer.eos_id))
    if not stops:
        raise ValueError(f"turn_stop_ids: the chat template of {tokenizer.source} ends a user's turn with no special "
                         f"token ({tail[:40]!r}) and the tokenizer has no end-of-text id")
    return tuple(dict.fromkeys(int(s) for s in stops))


def held_out_texts() -> list[str]:
    """The task-mix prompts' user messages: never kept as training instructions."""
    from jaxspec.bench.tasks import TASKS  # noqa: PLC0415

    return [m["content"] for prompts in TASKS.values() for msgs in prompts for m in msgs if m["role"] == "user"]


def _seed_texts() -> list[tuple[str, list[dict]]]:
    from jaxspec.training.instructions import instructions  # noqa: PLC0415

    return instructions()


def read_instructions(path: str | os.PathLike, *, seeds: bool = True) -> list[tuple[str, list[dict]]]:
    """``[(category, messages)]``: the seed instructions (when ``seeds``), then every message
    kept in ``path``'s batches in order (an absent file: the seeds alone)."""
    out = list(_seed_texts()) if seeds else []
    for batch in _read_batches(Path(path)):
        out += [(cat, [{"role": "user", "content": text}]) for cat, text in batch["kept"]]
    return out


def _read_batches(path: Path) -> list[dict]:
    """The batches written so far; a torn last line (a stopped run's) is dropped."""
    return read_responses(path)  # the same JSON-lines reading as the responses file's


def seeded_dedup() -> MinHashDedup:
    """A :class:`MinHashDedup` holding the task-mix prompts (held out) and the seed
    instructions: a message it refuses is one of them or near one."""
    d = MinHashDedup()
    for text in held_out_texts():
        d.add(text)
    for _, msgs in _seed_texts():
        for m in msgs:
            if m["role"] == "user":
                d.add(m["content"])
    return d


def _batch_plan(index: int, rows: int, open_categories: Sequence[str]) -> list[tuple[str, str]]:
    """The (category, opener) of each row of batch ``index``: the categories still open in
    turn, and within a category its openers in turn, so the plan depends only on the batch's
    index and on which categories the batches before it filled (a resumed run replays it)."""
    n = len(open_categories)
    out = []
    for j in range(rows):
        k = index * rows + j
        cat = open_categories[k % n]
        openers = OPENERS[cat]
        out.append((cat, openers[(k // n) % len(openers)]))
    return out


def build_instructions(target, tokenizer, out: str | os.PathLike, *, per_category: int = 500, rows: int = 64,
                       max_tokens: int = 112, seed: int = 0, progress: bool = True) -> list[tuple[str, list[dict]]]:
    """Samples instructions from ``target`` (a :class:`~jaxspec.nn.model.Transformer`) through
    its ``tokenizer``'s chat template until each category holds about ``per_category`` kept
    messages, appending batches of ``rows`` rows to ``out``; returns :func:`read_instructions`.

    A stopped run resumes at the first batch not in ``out``. Batch ``i`` samples with
    ``jax.random.fold_in(key(seed), i)`` at :data:`SAMPLING`, ``max_tokens`` tokens at most."""
    import jax  # noqa: PLC0415

    from jaxspec.core.settings import Sampling  # noqa: PLC0415
    from jaxspec.decode.generate import generate_autoregressive  # noqa: PLC0415

    for name, v in (("per_category", per_category), ("rows", rows), ("max_tokens", max_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"build_instructions: {name} = {v!r}; expected a positive integer")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    prefix = user_turn_prefix(tokenizer)
    stops = turn_stop_ids(tokenizer)
    # at a keep rate far below one in two a category may never fill: stop after twice the
    # rows that a rate of one in two would need
    max_batches = -(-2 * 2 * per_category * len(OPENERS) // rows)
    done = _read_batches(out)
    dedup = seeded_dedup()
    kept = Counter()
    for b in done:  # the state of the run so far, rebuilt in order
        for cat, text in b["kept"]:
            dedup.add(text)
            kept[cat] += 1
    sampling = Sampling(**SAMPLING)
    bar = tqdm(total=max_batches, initial=len(done), desc="instructions", disable=not progress, dynamic_ncols=True)
    with out.open("a", encoding="utf-8") as f:
        for i in range(len(done), max_batches):
            open_cats = [c for c in OPENERS if kept[c] < per_category]
            if not open_cats:
                break
            batch = _batch_plan(i, rows, open_cats)
            prompts = [prefix + (_ids(tokenizer, op) if op else []) for _, op in batch]
            res = generate_autoregressive(jax.random.fold_in(jax.random.key(seed), i), target, prompts,
                                          max_new_tokens=max_tokens, sampling=sampling, stop_tokens=stops)
            toks, lens = np.asarray(res.tokens), np.asarray(res.lengths)
            rec = {"batch": i, "kept": [], "dropped": Counter()}
            for (cat, op), row, n in zip(batch, toks, lens):
                if kept[cat] >= per_category:
                    rec["dropped"]["category_full"] += 1
                    continue
                if n == 0 or int(row[n - 1]) not in stops:
                    rec["dropped"]["unfinished"] += 1
                    continue
                text = (op + tokenizer.decode(row[: n - 1].tolist())).strip()
                reason = keep_reason(text)
                if reason is None and not dedup.add(text):
                    reason = "duplicate"
                if reason is not None:
                    rec["dropped"][reason] += 1
                    continue
                rec["kept"].append((cat, text))
                kept[cat] += 1
            f.write(json.dumps(rec) + "\n")
            f.flush()
            bar.update(1)
            bar.set_postfix(kept=sum(kept.values()))
    bar.close()
    return read_instructions(out)
