"""The tokenizer and chat template carried by a GGUF file, rebuilt with ``tokenizers``.

A GGUF file has no ``tokenizer.json``: it stores the vocabulary as metadata under llama.cpp's
keys (``tokenizer.ggml.tokens``, ``merges`` or ``scores``, ``token_type``, ``pre``, the special
ids, ``add_bos_token``, ``add_space_prefix``) and the chat template as ``tokenizer.chat_template``.
:func:`load_gguf_tokenizer` reads them with ``gguf.GGUFReader`` and builds the tokenizer llama.cpp
would run on them::

    tok = load_gguf_tokenizer(packaged_file("smollm2-135m"))   # or any path to a .gguf file
    tok.encode("Hello world")                    # [19556, 905]: list[int]; BOS only if the file says so
    tok.add_bos, tok.bos_id, tok.eos_id          # (False, 1, 2)
    tok.decode([19556, 905])                     # 'Hello world'
    messages = [{"role": "user", "content": "Hi"}]
    tok.apply_chat_template(messages)            # '<|im_start|>system\\n...<|im_end|>\\n<|im_start|>assistant\\n'
    tok.encode_chat(messages)                    # the ids of that text, its control tokens as single ids

Two tokenizer models (``tokenizer.ggml.model``):

- ``gpt2``: byte-level BPE (SmolLM2, Llama 3, Qwen 2): the file's merges, the pre-tokenizer
  regexes of its ``tokenizer.ggml.pre`` kind (:data:`PRE_TOKENIZER_SPLITS`, llama.cpp's lists).
- ``llama``: SentencePiece BPE (Llama 2, Gemma): merges rebuilt from the piece scores (the best
  score merges first, as llama.cpp's SPM tokenizer does), byte fallback to the ``<0xNN>`` tokens,
  and a ``▁`` prefix on each run of text at the start or after a special token when
  ``add_space_prefix`` (the default) holds.

Control tokens (``token_type`` 3) become special added tokens, matched whole in the text and
skipped by :meth:`~GGUFTokenizer.decode`; user-defined ones (4) are matched whole and decoded.
The chat template renders in a sandboxed ``jinja2`` environment set up the way ``transformers``
sets up its own, so :meth:`~GGUFTokenizer.apply_chat_template` renders what
``transformers``' ``apply_chat_template(..., tokenize=False)`` renders. The template is a
stranger's code: the sandbox bounds ``range``, ``*``, ``**`` and the rendered length
(``TEMPLATE_MAX_*``), and any failure of it (a limit, a recursion, an undefined name, no text
at all) is a ``ValueError`` "the chat template of FILE failed: ...".

``gguf``, ``tokenizers`` and ``jinja2`` are imported when a file is loaded (the ``gguf`` extra).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from jaxspec.formats.hf_tokenizer import HFTokenizer
from jaxspec.formats.tokenizer import check_utf8

__all__ = [
    "GGUFTokenizer",
    "load_gguf_tokenizer",
    "PRE_TOKENIZER_SPLITS",
    "TOKENIZER_MODELS",
    "GGUF_INSTALL_HINT",
]

GGUF_INSTALL_HINT = "install the 'gguf' extra: pip install 'jaxspec[gguf]'"

#: ``tokenizer.ggml.model`` values this module builds
TOKENIZER_MODELS = ("gpt2", "llama")

# llama.cpp's token types (``tokenizer.ggml.token_type``)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _kinds(names: str, splits: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    return {name: splits for name in names.split()}


#: ``tokenizer.ggml.pre`` kind -> the regexes llama.cpp splits text with, in order (each one
#: splits the pieces of the one before; matches and the text between them both stay pieces)
PRE_TOKENIZER_SPLITS: dict[str, tuple[str, ...]] = {
    **_kinds("default", (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")),
    **_kinds("gpt2 gpt-2 phi-2 roberta-bpe mpt olmo jais", (_GPT2,)),
    **_kinds("smollm starcoder refact command-r codeshell exaone minerva-7b", (r"\p{N}", _GPT2)),
    **_kinds("llama3 llama-v3 llama-bpe falcon3 dbrx smaug-bpe", (_LLAMA3,)),
    **_kinds("qwen2 stablelm2 megrez deepseek-r1-qwen", (_QWEN2,)),
    **_kinds("falcon", (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]")),
}
# kinds whose whole pre-token, when it is in the vocabulary, is one token without merging
# (llama.cpp's ``ignore_merges``; ``"ignore_merges": true`` in Llama 3's tokenizer.json)
_IGNORE_MERGES = frozenset("llama3 llama-v3 llama-bpe falcon3".split())
# kinds llama.cpp adds BOS for when the file has no ``tokenizer.ggml.add_bos_token``
_BOS_BY_DEFAULT = frozenset("llama3 llama-v3 llama-bpe falcon3".split())


def _import(name: str):
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise ImportError(f"reading a GGUF file's tokenizer needs the {name!r} package; {GGUF_INSTALL_HINT}") from None


def _read_metadata(path: Path) -> dict[str, Any]:
    """The file's ``tokenizer.*`` keys and ``general.architecture``, as Python values."""
    from jaxspec.formats.gguf_reader import open_reader

    _import("gguf")
    reader = open_reader(path, "load_gguf_tokenizer")  # a truncated file names the tensor cut short
    return {
        key: field.contents()
        for key, field in reader.fields.items()
        if key.startswith("tokenizer.") or key == "general.architecture"
    }


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map, the spelling of byte-level vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelling, extra = {}, 0
    for b in range(256):
        if b in printable:
            spelling[b] = chr(b)
        else:
            spelling[b] = chr(256 + extra)
            extra += 1
    return spelling


def _spm_merges(vocab: dict[str, int], scores: Sequence[float]) -> list[tuple[str, str]]:
    """The merges a SentencePiece vocabulary implies: every split of a piece into two pieces,
    best score of the merged piece first (llama.cpp's SPM tokenizer merges the adjacent pair whose
    concatenation has the highest score), ties by the merged piece's id."""
    ranked = []
    for piece, i in vocab.items():
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                ranked.append((-float(scores[i]), i, vocab[left], (left, right)))
    ranked.sort()
    return [pair for *_, pair in ranked]


def _split_merge(merge: str) -> tuple[str, str]:
    cut = merge.find(" ", 1)  # llama.cpp's rule: the first space after the first character
    if cut < 0:
        raise ValueError(f"load_gguf_tokenizer: tokenizer.ggml.merges holds {merge!r}; expected 'left right'")
    return merge[:cut], merge[cut + 1 :]


class GGUFTokenizer(HFTokenizer):
    """:class:`~jaxspec.formats.hf_tokenizer.HFTokenizer` built from a GGUF file's metadata, plus the
    file's BOS / EOS framing and chat template.

    Attributes beyond :class:`HFTokenizer`'s: ``model`` (``"gpt2"`` or ``"llama"``), ``pre`` (the
    pre-tokenizer kind, ``None`` for ``llama``), ``add_bos`` / ``add_eos`` (what :meth:`encode`
    adds by default), ``unk_id``, ``chat_template`` (``str`` or ``None``) and ``n_tokens``.
    """

    def __init__(self, tokenizer, *, n_tokens: int, model: str, pre: str | None, add_bos: bool, add_eos: bool,
                 bos_id: int | None, eos_id: int | None, pad_id: int | None, unk_id: int | None,
                 tokens: Sequence[str], chat_template: str | None, source: str):
        super().__init__(tokenizer, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, source=source)
        self.n_tokens, self.model, self.pre = int(n_tokens), model, pre
        self.add_bos, self.add_eos = bool(add_bos), bool(add_eos)
        self.unk_id = unk_id
        self.chat_template = chat_template
        self._token_strings = {name: tokens[i] for name, i in
                               (("bos", bos_id), ("eos", eos_id), ("unk", unk_id), ("pad", pad_id)) if i is not None}
        self._template = None  # compiled on first use

    @property
    def vocab_size(self) -> int:
        """Number of token ids in the file (``len(tokenizer.ggml.tokens)``)."""
        return self.n_tokens

    def encode(self, text: str, *, add_bos: bool | None = None, add_eos: bool | None = None) -> list[int]:
        """Ids of ``text``; control tokens written in it are single ids. BOS / EOS frame the ids
        when ``add_bos`` / ``add_eos`` say so, by default when the file does (``self.add_bos``,
        ``self.add_eos``), as llama.cpp and ``transformers`` do."""
        return super().encode(text, add_bos=self.add_bos if add_bos is None else add_bos,
                              add_eos=self.add_eos if add_eos is None else add_eos)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        """The file's chat template rendered over ``messages`` (a non-empty list of dicts with
        ``str`` ``role`` and ``content``): what ``transformers``' ``apply_chat_template(messages,
        tokenize=False, add_generation_prompt=...)`` returns."""
        where = "GGUFTokenizer.apply_chat_template"
        messages = _check_messages(messages, where)
        if self.chat_template is None:
            raise ValueError(f"{where}: {self.source} has no chat template (no tokenizer.chat_template key)")
        failed = f"{where}: the chat template of {self.source} failed"
        if self._template is None:
            self._template = _compile_template(self.chat_template, failed)
        names = {f"{name}_token": text for name, text in self._token_strings.items()}
        try:
            return _render(self._template, dict(messages=messages, tools=None, documents=None,
                                                add_generation_prompt=bool(add_generation_prompt), **names))
        except _Refused as e:  # raise_exception(...) in the template: it refuses these messages
            raise ValueError(f"{where}: the chat template of {self.source} refuses messages: {e}") from None
        except RecursionError:
            raise ValueError(f"{failed}: it recursed too deeply (a macro that calls itself?)") from None
        except MemoryError:
            raise ValueError(f"{failed}: it ran out of memory") from None
        except Exception as e:  # noqa: BLE001 - the template is the file's code: any failure is its own
            raise ValueError(f"{failed}: {type(e).__name__}: {e}") from None

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> list[int]:
        """Ids of :meth:`apply_chat_template`'s text, its control tokens as single ids and no BOS
        beyond the template's own: ``transformers``' ``apply_chat_template(messages)``."""
        ids = self._encode_text(self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt))
        if not ids:
            raise ValueError(f"GGUFTokenizer.encode_chat: the chat template of {self.source} failed: it rendered "
                             "no text for these messages")
        return ids

    def __repr__(self) -> str:
        return f"GGUFTokenizer({self.source!r}, model={self.model!r}, pre={self.pre!r}, vocab_size={self.vocab_size})"


def _check_messages(messages, where: str) -> list[dict[str, Any]]:
    """A copy of ``messages`` as plain dicts (keys whose value is ``None`` dropped, as
    ``transformers`` does), or ``ValueError`` naming the bad message."""
    expected = "expected a non-empty list of dicts with str 'role' and 'content'"
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"{where}: messages = {_short(messages)}; {expected}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValueError(f"{where}: messages[{i}] = {_short(m)}; {expected}")
        for key in ("role", "content"):
            if not isinstance(m.get(key), str):
                raise ValueError(f"{where}: messages[{i}][{key!r}] = {_short(m.get(key))}; expected a str")
            check_utf8(m[key], f"{where}: messages[{i}][{key!r}]")
        out.append({k: v for k, v in m.items() if v is not None})
    return out


def _short(value: Any, limit: int = 80) -> str:
    r = repr(value)
    return r if len(r) <= limit else r[: limit - 3] + "..."


#: limits of the sandbox a chat template renders in: the longest ``range`` (jinja2's sandbox
#: refuses longer ones), the longest string or list a ``*`` may build, the largest power a
#: ``**`` may compute, and the most characters a rendering may produce
TEMPLATE_MAX_RANGE = 100_000
TEMPLATE_MAX_ITEMS = 1_000_000
TEMPLATE_MAX_POWER_BITS = 4096
TEMPLATE_MAX_CHARS = 4_000_000


class _Refused(Exception):
    """``raise_exception(message)`` in a template: it refuses the messages."""


def _render(template, context: dict) -> str:
    """``template`` rendered over ``context``, stopped past :data:`TEMPLATE_MAX_CHARS`."""
    out, n = [], 0
    for piece in template.generate(**context):
        n += len(piece)
        if n > TEMPLATE_MAX_CHARS:
            raise OverflowError(f"it rendered more than {TEMPLATE_MAX_CHARS} characters")
        out.append(piece)
    return "".join(out)


def _compile_template(source: str, failed: str):
    """The template in a sandboxed environment set up as ``transformers``' chat templates are:
    ``trim_blocks`` / ``lstrip_blocks``, loop controls, a ``tojson`` that leaves non-ASCII and HTML
    characters alone, ``raise_exception`` and ``strftime_now``; with the limits above on ``range``,
    ``*`` and ``**`` (the file's template is code a stranger wrote). ``failed`` starts the message
    of a template that does not parse."""
    jinja2 = _import("jinja2")
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

    class Limited(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context, operator, left, right):
            if operator == "**" and all(isinstance(x, int) for x in (left, right)) and right > 0 and \
                    abs(left) > 1 and right * max(abs(left), 2).bit_length() > TEMPLATE_MAX_POWER_BITS:
                raise SecurityError(f"{left!r} ** {right!r} exceeds the sandbox's {TEMPLATE_MAX_POWER_BITS} bits")
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > TEMPLATE_MAX_ITEMS:
                        raise SecurityError(f"a {type(seq).__name__} of {len(seq)} times {n} exceeds the sandbox's "
                                            f"{TEMPLATE_MAX_ITEMS} items")
            return super().call_binop(context, operator, left, right)

    def raise_exception(message):
        raise _Refused(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def bounded_range(*args):
        r = range(*args)
        if len(r) > TEMPLATE_MAX_RANGE:
            raise SecurityError(f"range({', '.join(map(repr, args))}) has {len(r)} items; the sandbox allows {TEMPLATE_MAX_RANGE}")
        return r

    env = Limited(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["range"] = bounded_range
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ValueError(f"{failed}: it does not parse: {e}") from None


def _token_id(meta: dict[str, Any], key: str, n_tokens: int, default: int | None, where: str) -> int | None:
    """A special token's id; one outside the vocabulary is ignored with a warning, as llama.cpp does."""
    value = meta.get(f"tokenizer.ggml.{key}", default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n_tokens:
        warnings.warn(f"{where}: tokenizer.ggml.{key} = {value!r} is not an id in [0, {n_tokens}); ignored",
                      stacklevel=3)
        return default if default is not None and default < n_tokens else None
    return int(value)


def load_gguf_tokenizer(path: str | os.PathLike) -> GGUFTokenizer:
    """The tokenizer of the GGUF file at ``path`` (see the module docstring).

    ``FileNotFoundError`` for a missing file; ``ValueError`` naming the key for a file whose
    ``tokenizer.ggml.model`` is not one of :data:`TOKENIZER_MODELS`, whose ``tokenizer.ggml.pre``
    is not in :data:`PRE_TOKENIZER_SPLITS`, or whose metadata is missing or inconsistent.
    """
    where = "load_gguf_tokenizer"
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"{where}: path = {path!r}; expected a path to a .gguf file")
    path = Path(os.fspath(path)).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{where}: no GGUF file at {str(path)!r}")
    meta = _read_metadata(path)
    where = f"{where}: {path}"
    model = meta.get("tokenizer.ggml.model")
    if model not in TOKENIZER_MODELS:
        raise ValueError(f"{where}: tokenizer.ggml.model = {model!r} is not supported; expected one of "
                         f"{list(TOKENIZER_MODELS)} (gpt2: byte-level BPE, llama: SentencePiece)")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise ValueError(f"{where}: no tokenizer.ggml.tokens (the vocabulary)")
    # llama.cpp names empty tokens rather than dropping them, so that every id keeps its place
    tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    n = len(tokens)
    types = meta.get("tokenizer.ggml.token_type") or [_NORMAL] * n
    if len(types) != n:
        raise ValueError(f"{where}: tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
    tokenizers = _import("tokenizers")
    spm = model == "llama"
    ids = {name: _token_id(meta, f"{name}_token_id", n, default, where) for name, default in
           (("bos", 1 if spm else None), ("eos", 2 if spm else None), ("unknown", 0 if spm else None),
            ("padding", None))}
    if spm:
        pre = None
        tok = _spm_tokenizer(tokenizers, meta, tokens, ids["unknown"], where)
    else:
        pre = meta.get("tokenizer.ggml.pre") or "default"  # llama.cpp's choice for files without the key
        if pre not in PRE_TOKENIZER_SPLITS:
            raise ValueError(f"{where}: tokenizer.ggml.pre = {pre!r} is not a supported pre-tokenizer kind; "
                             f"expected one of {sorted(PRE_TOKENIZER_SPLITS)}")
        tok = _byte_level_tokenizer(tokenizers, meta, tokens, types, pre, where)
    # control tokens (and the named specials) are matched whole and skipped by decode; user-defined
    # tokens are matched whole and decoded
    named = {i for i in ids.values() if i is not None}
    tok.add_special_tokens([tokenizers.AddedToken(tokens[i], normalized=False, special=True)
                            for i in range(n) if types[i] == _CONTROL or i in named])
    tok.add_tokens([tokenizers.AddedToken(tokens[i], normalized=False, special=False)
                    for i in range(n) if types[i] == _USER_DEFINED and i not in named])
    if tok.get_vocab_size(with_added_tokens=True) > n:
        raise ValueError(f"{where}: the rebuilt tokenizer has {tok.get_vocab_size(with_added_tokens=True)} ids for "
                         f"{n} tokens (a control token missing from the vocabulary?)")
    default_bos = spm or pre in _BOS_BY_DEFAULT
    template = meta.get("tokenizer.chat_template")
    return GGUFTokenizer(
        tok, n_tokens=n, model=model, pre=pre,
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", default_bos)) and ids["bos"] is not None,
        add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)) and ids["eos"] is not None,
        bos_id=ids["bos"], eos_id=ids["eos"], pad_id=ids["padding"], unk_id=ids["unknown"], tokens=tokens,
        chat_template=template if isinstance(template, str) and template else None, source=str(path),
    )


def _byte_level_tokenizer(tokenizers, meta: dict[str, Any], tokens: list[str], types: Sequence[int], pre: str,
                          where: str):
    """Byte-level BPE: the file's merges over GPT-2's byte alphabet, split by ``pre``'s regexes."""
    from tokenizers import Regex, decoders, models, pre_tokenizers

    merges = meta.get("tokenizer.ggml.merges")
    if not isinstance(merges, list):
        raise ValueError(f"{where}: a gpt2 tokenizer needs tokenizer.ggml.merges; the file has none")
    spelling = _byte_alphabet()
    alphabet = set(spelling.values())
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        # a normal token outside the byte alphabet is raw text: spell it in bytes so merges reach it;
        # control / user-defined tokens are matched in the raw text as they are
        if types[i] in (_NORMAL, _BYTE, _UNUSED) and not set(t) <= alphabet:
            t = "".join(spelling[b] for b in t.encode("utf-8"))
        vocab[t] = i
    bpe = models.BPE(vocab, [_split_merge(m) for m in merges], ignore_merges=pre in _IGNORE_MERGES)
    tok = tokenizers.Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_TOKENIZER_SPLITS[pre]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def _spm_tokenizer(tokenizers, meta: dict[str, Any], tokens: list[str], unk_id: int | None, where: str):
    """SentencePiece BPE: merges from the scores, ``▁`` for spaces, byte fallback."""
    from tokenizers import decoders, models, normalizers

    scores = meta.get("tokenizer.ggml.scores")
    if not isinstance(scores, list) or len(scores) != len(tokens):
        raise ValueError(f"{where}: a llama (SentencePiece) tokenizer needs tokenizer.ggml.scores, one per token")
    vocab = {t: i for i, t in enumerate(tokens)}
    unk = tokens[unk_id] if unk_id is not None else None
    bpe = models.BPE(vocab, _spm_merges(vocab, scores), unk_token=unk, fuse_unk=True, byte_fallback=True)
    tok = tokenizers.Tokenizer(bpe)
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    # llama.cpp: a " " before each run of text that starts the input or follows a special token,
    # then every space spelled "▁"; the text is one piece (no pre-tokenizer)
    replace = normalizers.Replace(" ", "\u2581")
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), replace]) if prefix else replace
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + ([decoders.Strip(content=" ", left=1, right=0)] if prefix else []))
    return tok
