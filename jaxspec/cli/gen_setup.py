"""What ``jaxspec generate`` checks and loads before it decodes: the drafter its
``--draft`` names, the prompt's ids, the room the context leaves, the tokenizers, and
``--tree auto``'s measurement."""

from __future__ import annotations

import sys

from jaxspec.cli.common import CLIError

__all__ = ["DEFAULT_TARGET", "DEFAULT_DRAFT", "auto_budgets", "prompt_ids", "lookup_draft", "modelless_drafter", "draft_name",
           "default_draft_and_tree", "packaged_draft", "check_room", "check_same_tokenizer", "auto_tree_for"]

DEFAULT_TARGET, DEFAULT_DRAFT = "default-target", "default-draft"  # the embedded pair


def auto_budgets(s: str | None) -> tuple[int, ...] | None:
    """``--auto-budgets`` "4,8,16" -> (4, 8, 16); None stays None (the default list)."""
    if s is None:
        return None
    try:
        vals = tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        vals = ()
    if not vals or min(vals) < 1:
        raise CLIError(f"--auto-budgets = {s!r}: expected comma-separated node counts >= 1, e.g. 4,8,16")
    return vals


def prompt_ids(args, tok) -> tuple[list[int], str]:
    """The prompt's token ids and the text they encode: ``--prompt`` as raw text, or
    ``--chat``'s message rendered by the tokenizer's chat template with the assistant's turn
    opened (the template's own special tokens, BOS included, as the model was trained)."""
    if args.prompt is not None:
        ids = tok.encode(args.prompt)
        if not ids:
            raise CLIError("--prompt: expected a non-empty prompt")
        return ids, args.prompt
    if not args.chat.strip():
        raise CLIError("--chat: expected a non-empty message")
    if getattr(tok, "chat_template", None) is None:
        raise CLIError(f"--chat: the target {args.target} has no chat template (its tokenizer carries none); "
                       "pass the raw text with --prompt")
    messages = [{"role": "user", "content": args.chat}]
    try:
        return tok.encode_chat(messages), tok.apply_chat_template(messages, add_generation_prompt=True)
    except ValueError as e:
        raise CLIError(f"--chat: {e}") from None


def lookup_draft(args):
    """The drafter without a model of its own: :class:`~jaxspec.NgramDraft` for ``--draft
    ngram[:...]``, :class:`~jaxspec.LayerSkipDraft` for ``--draft layers:K`` (None for a
    model, or with ``--baseline``); a malformed spec is a :class:`CLIError` naming the flag."""
    return None if args.baseline else modelless_drafter(args.draft)


def modelless_drafter(draft: str | None):
    """The drafter a ``--draft`` value names when it needs no model file (``ngram[:...]``,
    ``layers:K``, a user's ``module:attr`` or ``file.py:attr``:
    :func:`jaxspec.decode.draft_spec.drafter_spec`), else None (a model: a folder, even one
    called ngram, a name or a file)."""
    if draft is None:
        return None
    from jaxspec.decode.draft_spec import drafter_spec

    try:
        return drafter_spec(draft)
    except ValueError as e:
        raise CLIError(f"--draft: {e}") from None


def draft_name(args) -> str:
    """``--draft``, or, without one, the embedded draft for the embedded target (the
    default ``--target``); another ``--target`` without ``--draft`` is a :class:`CLIError`
    (the embedded draft drafts for no other model) asking for ``--draft`` or ``--baseline``."""
    if args.draft is not None:
        return args.draft
    from jaxspec.formats.checkpoint import resolve_model_path
    from jaxspec.formats.gguf import is_gguf_source

    if not is_gguf_source(args.target) and (
            resolve_model_path(args.target).resolve() == resolve_model_path(DEFAULT_TARGET).resolve()):
        return DEFAULT_DRAFT
    raise CLIError(
        f"--target {args.target}: expected a --draft for it (a draft model sharing its tokenizer, or "
        f"'ngram' for prompt lookup, which needs no model), or --baseline for target-only sampling; "
        f"{DEFAULT_DRAFT} drafts only for {DEFAULT_TARGET}"
    )


def packaged_draft(target: str) -> tuple[str | None, str | None]:
    """The drafter a packaged target drafts with by default and its tree
    (:class:`jaxspec.formats.packaged.PackagedModel` ``draft`` and ``tree``; e.g. ``smollm2-135m``
    -> ``("smollm2-135m-head", "chain:1")``), or ``(None, None)``: one rule for
    ``jaxspec generate`` and ``jaxspec verify``."""
    from jaxspec.formats.packaged import PACKAGED_MODELS, is_packaged_name

    entry = PACKAGED_MODELS[target] if is_packaged_name(target) else None
    if entry is None or entry.draft is None:
        return None, None
    return entry.draft, entry.tree


def default_draft_and_tree(args, default_tree: str) -> None:
    """Fill in ``--draft`` and ``--tree`` when they are not given: a packaged target with a
    drafter of its own (:class:`jaxspec.formats.packaged.PackagedModel` ``draft``, e.g.
    ``smollm2-135m`` -> ``smollm2-135m-head``) gets that drafter and the tree chosen for it;
    otherwise ``--tree`` is ``default_tree`` and ``--draft`` is left to :func:`draft_name`."""
    draft, tree = packaged_draft(args.target)
    own = draft is not None and not args.baseline
    if own and args.draft is None:
        args.draft = draft
    if args.tree is None:
        args.tree = tree if own and args.draft == draft and tree else default_tree


def _context(target, draft) -> tuple[int, str]:
    """The smallest position limit of the models (the library's rule,
    :func:`jaxspec.decode.inputs.position_limit`) and the words naming whose it is."""
    from jaxspec.decode.inputs import position_limit

    limits = {name: n for name, m in (("target", target), ("draft", draft))
              if m is not None and (n := position_limit(m)) is not None}  # an n-gram draft has none
    ctx = min(limits.values())
    whose = " and the ".join(f"{name}'s" for name, n in limits.items() if n == ctx)
    return ctx, f"the {whose} context of {ctx} tokens (max_position_embeddings)"


def check_room(args, prompt_len: int, target, draft, tree, auto: bool) -> None:
    """Refuse, before compiling, a prompt and ``--max-new-tokens`` that do not fit the
    context of the target (and of the draft), with the library's capacity rule
    (:func:`jaxspec.decode.config.cache_capacity`: the prompt, the new tokens and, when
    speculating, the tree's slots + 1), in the flags' words. ``--tree auto`` checks the
    prompt here and its budgets in :func:`auto_tree_for`."""
    from jaxspec.decode.config import cache_capacity, speculation_slots

    ctx, context = _context(target, draft)
    if draft is None:  # --baseline: prompt + new tokens
        spec, tree_words = None, ""
    elif auto:  # the smallest candidate tree
        from jaxspec.tuning.autotree import DEFAULT_BUDGETS

        spec = min(args.auto_budgets or DEFAULT_BUDGETS)
        tree_words = f"the smallest --tree auto candidate ({spec} nodes + 1)"
    else:
        spec, slots = tree, speculation_slots(tree) - 1
        tree_words = f"--tree {args.tree} ({slots} slots + 1)"
        if cache_capacity(1, 1, tree) > ctx:  # not even a 1-token prompt and one new token fit
            raise CLIError(
                f"--tree {args.tree}: {slots} tree slots + 1; expected at most {ctx - 3} slots, so that the "
                f"tree, a 1-token prompt and one new token fit {context}"
            )
    room = ctx - cache_capacity(prompt_len, 0, spec)  # the most new tokens that fit
    if room < 1:
        parts = "the prompt, at least one new token and " + tree_words if tree_words else \
            "the prompt and at least one new token"
        if getattr(args, "chat", None) is not None:  # the message in its chat template
            raise CLIError(
                f"--chat: the message in the chat template is {prompt_len} tokens; at most {prompt_len + room - 1} "
                f"fit (shorten the message by at least {1 - room} tokens), so that {parts} fit {context}"
            )
        raise CLIError(
            f"--prompt: {prompt_len} tokens; expected at most {prompt_len + room - 1} tokens, so that "
            f"{parts} fit {context}"
        )
    if not auto and args.max_new_tokens > room:
        parts = f", this {prompt_len}-token prompt and {tree_words}" if tree_words else \
            f" and this {prompt_len}-token prompt"
        raise CLIError(
            f"--max-new-tokens = {args.max_new_tokens}: expected <= {room}, so that the new tokens{parts} "
            f"fit {context}"
        )


def check_same_tokenizer(tok, dtok, args) -> None:
    """Refuse a draft whose tokenizer differs from the target's (ids would mean other text)."""
    from jaxspec.formats.tokenizer import ByteTokenizer

    def what(t):
        return "the byte-level tokenizer (no tokenizer.json)" if isinstance(t, ByteTokenizer) else t.source

    if isinstance(tok, ByteTokenizer) and isinstance(dtok, ByteTokenizer):
        return
    same = (
        type(tok) is type(dtok)
        and tok.vocab_size == dtok.vocab_size
        and tok.vocab() == dtok.vocab()
    )
    if not same:
        raise CLIError(
            f"--draft {args.draft}: its vocabulary differs from the target's ({what(dtok)}, "
            f"{dtok.vocab_size} tokens vs {what(tok)}, {tok.vocab_size} tokens); speculative decoding "
            "needs a draft and a target that share one tokenizer"
        )


def auto_tree_for(args, target, draft, tok, prompt_len: int, sampling):
    """Run (or read from the cache) :func:`jaxspec.tuning.autotree.auto_tree`; report to stderr."""
    import jax

    from jaxspec.formats.tokenizer import ByteTokenizer
    from jaxspec.tuning.autotree import DEFAULT_BUDGETS, auto_tree

    from jaxspec.decode.config import cache_capacity

    ctx = _context(target, draft)[0]
    asked = args.auto_budgets or DEFAULT_BUDGETS
    room = ctx - cache_capacity(prompt_len, args.max_new_tokens, 0)  # the nodes generate's cache has room for
    budgets = tuple(sorted({n for n in asked if cache_capacity(prompt_len, args.max_new_tokens, n) <= ctx}))
    if not budgets:
        most = ctx - cache_capacity(prompt_len, 0, min(asked))  # the most new tokens with the smallest budget
        raise CLIError(
            f"--tree auto: no budget in {list(asked)} fits the context of {ctx} tokens with a "
            f"{prompt_len}-token prompt and --max-new-tokens {args.max_new_tokens} (room for {room} nodes); "
            f"expected --max-new-tokens <= {most} for the smallest budget, {min(asked)}"
        )
    held_out = None
    if not isinstance(tok, ByteTokenizer):  # held-out text in the model's own tokens
        from jaxspec.training.corpus import load_corpus

        val = load_corpus().val
        text = bytes(val[val < 256].astype("uint8")[:400_000]).decode("utf-8", errors="replace")
        held_out = tok.encode(text)
    res = auto_tree(
        target, draft, scheme=args.scheme, rule=args.rule,  # the rule generate will use
        sampling=sampling, budgets=budgets, max_depth=args.auto_max_depth,
        key=jax.random.key(0),  # the tuning draws, independent of --seed: one cache entry
        held_out_tokens=held_out, retune=args.retune, progress=True,
    )
    if res.from_cache:
        how = f"cached in {res.cache_path}"
    else:
        how = "measured, not cached" if res.cache_path is None else f"measured, saved to {res.cache_path}"
    print(
        f"-- auto tree ({how}):\n{res.table()}\n-- picked {res.budget} nodes, depth {res.depth}: "
        f"parents:{','.join(map(str, res.parents))}; predicted tau {res.predicted_tau:.2f}, "
        f"predicted speedup {res.predicted_speedup:.2f}x over target-only",
        file=sys.stderr,
    )
    if res.predicted_speedup < 1.0:
        print("-- note: no candidate is predicted to beat target-only decoding on this device; "
              "measuring the pick anyway", file=sys.stderr)
    return res


