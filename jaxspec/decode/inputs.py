"""The inputs of a generation, validated and shaped for a compiled program: prompts
(padded to a bucket of widths, so that nearby lengths share a program), stop tokens, and
the position limits of the models they must fit."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.checks import is_int
from jaxspec.nn.model import Transformer

__all__ = ["PROMPT_BUCKET", "prepare_prompts", "check_stop", "resolve_stop_tokens", "stop_array", "check_prompt_bucket",
           "bucket_width", "pad_prompts", "position_limit"]

#: the default ``prompt_bucket`` of :func:`jaxspec.generate` and
#: :func:`jaxspec.generate_autoregressive`: prompts padded to a multiple of 32 tokens share one
#: compiled program
PROMPT_BUCKET = 32


def prepare_prompts(prompts, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Prompts (``int32[B, T]`` or a list of token lists) validated against the vocabulary
    -> (int32[B, T] right-padded with 0, int32[B] lengths): what :func:`generate` compiles for."""
    if isinstance(prompts, (np.ndarray, jax.Array)):
        arr = np.asarray(prompts)
        if arr.ndim != 2:
            raise ValueError(
                f"prompts: expected int32[B, T] or a list of token lists, got an array of shape {arr.shape}"
            )
        if arr.dtype.kind not in "iu":
            raise ValueError(f"prompts: expected integer token ids, got dtype {arr.dtype}")
        if arr.shape[0] == 0 or arr.shape[1] == 0:
            raise ValueError(f"prompts: expected at least one row of at least one token, got shape {arr.shape}")
        bad = np.argwhere((arr < 0) | (arr >= vocab_size))
        if bad.size:
            i, t = (int(x) for x in bad[0])
            raise ValueError(f"prompts[{i}][{t}] = {int(arr[i, t])}: expected a token id in [0, {vocab_size})")
        return arr.astype(np.int32), np.full((arr.shape[0],), arr.shape[1], np.int32)
    elif isinstance(prompts, Sequence) and not isinstance(prompts, (str, bytes)):
        if len(prompts) == 0:
            raise ValueError("prompts: expected at least one prompt, got an empty list")
        rows = []
        for i, row in enumerate(prompts):
            if is_int(row) or not isinstance(row, (Sequence, np.ndarray, jax.Array)):
                raise ValueError(
                    f"prompts[{i}] = {row!r}: expected a list of token ids (prompts is a list of prompts)"
                )
            r = np.asarray(row)
            if r.size == 0:
                raise ValueError(f"prompts[{i}]: empty prompt; expected at least one token")
            if r.ndim != 1 or r.dtype.kind not in "iu":
                raise ValueError(f"prompts[{i}]: expected a 1-D sequence of integer token ids, got {row!r}")
            rows.append(r)
    else:
        raise ValueError(f"prompts: expected int32[B, T] or a list of token lists, got {type(prompts).__name__}")
    for i, r in enumerate(rows):
        bad = np.flatnonzero((r < 0) | (r >= vocab_size))
        if bad.size:
            t = int(bad[0])
            raise ValueError(f"prompts[{i}][{t}] = {int(r[t])}: expected a token id in [0, {vocab_size})")
    lens = np.asarray([r.shape[0] for r in rows], np.int32)
    out = np.zeros((len(rows), int(lens.max())), np.int32)
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
    return out, lens


def check_stop(stop_tokens, vocab_size: int) -> tuple[int, ...]:
    if not is_int(stop_tokens) and hasattr(stop_tokens, "__array__"):  # numpy / jax arrays
        arr = np.asarray(stop_tokens)
        if arr.ndim > 1:
            raise ValueError(f"stop_tokens: expected a token id or a 1-D sequence of them, got shape {arr.shape}")
        stop_tokens = arr.reshape(-1).tolist()  # numpy scalars -> Python numbers (checked below)
    if is_int(stop_tokens):
        stop_tokens = (stop_tokens,)
    if not isinstance(stop_tokens, Sequence) or isinstance(stop_tokens, str):  # arrays: lists above
        raise ValueError(f"stop_tokens = {stop_tokens!r}: expected a sequence of token ids")
    out = []
    for i, t in enumerate(list(stop_tokens)):
        if not is_int(t) or not 0 <= t < vocab_size:
            raise ValueError(f"stop_tokens[{i}] = {t!r}: expected a token id in [0, {vocab_size})")
        out.append(int(t))
    return tuple(sorted(set(out)))


def resolve_stop_tokens(stop_tokens, target: Transformer, tokenizer=None) -> tuple[int, ...]:
    """The stop tokens of a generation, validated, sorted and de-duplicated: ``None`` (the
    default of :func:`generate` and :func:`generate_autoregressive`) means the target's
    end-of-text ids, ``target.config.eos_token_ids``; where the config names none, the
    end-of-text id of ``tokenizer``, the target's own tokenizer as read from its files (a
    folder's ``tokenizer.json`` and ``tokenizer_config.json``, a GGUF file's; its ``eos_id``,
    when it is in the vocabulary), and ``()`` without either. The byte-level tokenizer is no
    model's own (every byte-level model shares its ids), so its ``eos_id`` is never taken.
    Anything else is taken as given, so ``()`` turns stopping off (rows then run to
    ``max_new_tokens``). ``jaxspec generate`` resolves its stop tokens here, with the
    target's tokenizer."""
    if stop_tokens is None:
        stop_tokens = target.config.eos_token_ids
        eos = getattr(tokenizer, "eos_id", None)
        if not stop_tokens and is_int(eos) and 0 <= eos < target.config.vocab_size and not _byte_level(tokenizer):
            stop_tokens = (eos,)
    return check_stop(stop_tokens, target.config.vocab_size)


def _byte_level(tokenizer) -> bool:
    from jaxspec.formats.tokenizer import ByteTokenizer  # noqa: PLC0415

    return isinstance(tokenizer, ByteTokenizer)


def position_limit(model) -> int | None:
    """The most positions of a model or a drafter: its config's ``max_position_embeddings``
    (a :class:`~jaxspec.nn.model.Transformer`'s, a draft model's or a feature head's
    :class:`~jaxspec.nn.config.ModelConfig`, a drafter's optional ``config``); ``None``
    where there is no such config (no limit)."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return limit if is_int(limit) else None


def stop_array(stop_tokens):
    """int32[n'] stop tokens padded with -1 (never a token) to a power of two >= 1, so that
    "no stop token" and "one stop token" share a compilation."""
    stop = np.asarray(stop_tokens, np.int32).reshape(-1)
    size = 1 if stop.size <= 1 else 1 << (stop.size - 1).bit_length()
    return jnp.asarray(np.concatenate([stop, np.full(size - stop.size, -1, np.int32)]))


def check_prompt_bucket(prompt_bucket) -> int | None:
    """``prompt_bucket`` validated: ``None`` or an integer >= 1 (``ValueError`` naming it)."""
    if prompt_bucket is not None and (not is_int(prompt_bucket) or prompt_bucket < 1):
        raise ValueError(f"prompt_bucket = {prompt_bucket!r}: expected an integer >= 1 or None")
    return None if prompt_bucket is None else int(prompt_bucket)


def bucket_width(width: int, bucket: int | None, room: int) -> int:
    """The padded prompt width a generation compiles for: ``width`` rounded up to a
    multiple of ``bucket``, but at most ``room`` columns more (what the models' positions
    leave), and ``width`` itself for ``bucket=None``::

        bucket_width(5, 32, 1000)    # 32
        bucket_width(33, 32, 1000)   # 64
        bucket_width(33, 32, 10)     # 43: 64 would pass max_position_embeddings
    """
    if bucket is None:
        return width
    return min(-(-width // bucket) * bucket, width + max(room, 0))


def pad_prompts(tokens: np.ndarray, width: int) -> np.ndarray:
    """Prompts ``int32[B, P]`` right-padded with 0 to ``width >= P`` columns: the prompt
    width a configuration compiles for (``SpecConfig.prompt_width``, chosen with its
    capacity by :func:`~jaxspec.decode.config.build_config` from ``prompt_bucket``). The
    padding columns are past every row's length, as in a ragged batch, so the law of the
    tokens is the same, and the tokens too up to the last bits of the longer attention sums."""
    if width == tokens.shape[1]:
        return tokens
    return np.pad(tokens, ((0, 0), (0, width - tokens.shape[1])))
