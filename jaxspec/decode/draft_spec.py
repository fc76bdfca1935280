"""Drafters named by a string, as ``jaxspec generate --draft`` and ``jaxspec verify --draft``
take them, beside :func:`~jaxspec.core.treespec.parse_tree` for trees::

    parse_draft("ngram")                     # NgramDraft(): prompt lookup
    parse_draft("ngram:max=4,min=2")         # NgramDraft(max_ngram=4, min_ngram=2)
    parse_draft("layers:8")                  # LayerSkipDraft(8): the target's first 8 layers
    parse_draft("lookup+default-head")       # (MixedDraft, head params): lookup and a head on two chains
    parse_draft("ngram:4+smollm2-135m-head") # the same with NgramDraft(max_ngram=4)
    parse_draft("my_drafters:Bigram")        # a user's drafter: module my_drafters, attribute Bigram
    parse_draft("path/to/drafters.py:make")  # the same from a file
    parse_draft("smollm2-135m-head")         # a model or head by name or folder (load_draft)

``module:attr`` names a drafter instance, or a zero-argument callable (a class, a function)
that returns one. A module that is not importable from ``sys.path`` is looked for as a
``.py`` file under the current folder (the command line runs from its own script folder,
where a user's module is not). Errors name the spec and what was expected.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path

from jaxspec.decode.drafter import DRAFTER_METHODS, check_drafter

__all__ = ["parse_draft", "drafter_spec", "parse_ngram", "parse_layers", "parse_mixed", "is_mixed_spec"]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_ngram(spec: str):
    """``"ngram"``, ``"ngram:4"`` (max_ngram) or ``"ngram:max=4,min=2,candidates=32"``."""
    from jaxspec.decode.ngram import NgramDraft  # noqa: PLC0415

    kind, sep, body = spec.strip().partition(":")
    if kind.strip().lower() != "ngram":
        raise ValueError(f"draft spec = {spec!r}: expected 'ngram', 'ngram:K' or 'ngram:max=K,min=J'")
    if not sep or not body.strip():
        return NgramDraft()
    names = {"max": "max_ngram", "max_ngram": "max_ngram", "min": "min_ngram", "min_ngram": "min_ngram",
             "candidates": "candidates"}
    kw = {}
    for i, item in enumerate(body.split(",")):
        key, eq, val = item.partition("=")
        if not eq and i == 0:
            key, val = "max", key
        key = key.strip().lower()
        if key not in names:
            raise ValueError(f"draft spec = {spec!r}: unknown field {key!r}; expected max=, min= or candidates=")
        try:
            kw[names[key]] = int(val.strip())
        except ValueError:
            raise ValueError(f"draft spec = {spec!r}: {key} = {val.strip()!r} is not an integer") from None
    try:
        return NgramDraft(**kw)
    except ValueError as e:
        raise ValueError(f"draft spec = {spec!r}: {e}") from None


def parse_layers(spec: str):
    """``"layers:K"``: :class:`~jaxspec.decode.layer_skip.LayerSkipDraft` of the target's first K layers."""
    from jaxspec.decode.layer_skip import LayerSkipDraft  # noqa: PLC0415

    kind, _, value = spec.strip().partition(":")
    if kind.strip().lower() != "layers":
        raise ValueError(f"draft spec = {spec!r}: expected 'layers:K' (the target's first K layers draft)")
    try:
        k = int(value.strip())
    except ValueError:
        raise ValueError(f"draft spec = {spec!r}: expected 'layers:K' with an integer K >= 1") from None
    try:
        return LayerSkipDraft(k)
    except ValueError as e:
        raise ValueError(f"draft spec = {spec!r}: {e}") from None


def is_mixed_spec(spec: str) -> bool:
    """``spec`` names a :class:`~jaxspec.decode.mixed_draft.MixedDraft`: ``LOOKUP+HEAD``,
    ``LOOKUP`` being ``lookup`` or an n-gram spec (``ngram``, ``ngram:4``, ...)."""
    lookup, plus, _ = spec.strip().partition("+")
    return bool(plus) and lookup.strip().partition(":")[0].strip().lower() in ("lookup", "ngram")


def parse_mixed(spec: str):
    """``"lookup+HEAD"`` (or ``"ngram[:...]+HEAD"``): ``(MixedDraft, params)``, prompt lookup
    and the feature head ``HEAD`` (a name or folder :func:`~jaxspec.formats.checkpoint.load_draft`
    loads as a head) on a tree of two chains."""
    from jaxspec.decode.mixed_draft import MixedDraft  # noqa: PLC0415
    from jaxspec.formats.checkpoint import load_draft  # noqa: PLC0415
    from jaxspec.nn.head import FeatureHead  # noqa: PLC0415

    lookup_spec, plus, head_spec = spec.strip().partition("+")
    if not plus or not is_mixed_spec(spec):
        raise ValueError(f"draft spec = {spec!r}: expected 'lookup+HEAD' (prompt lookup and a feature head, "
                         "such as 'lookup+default-head')")
    head_spec = head_spec.strip()
    if not head_spec:
        raise ValueError(f"draft spec = {spec!r}: no head after '+'; expected 'lookup+HEAD', HEAD a feature "
                         "head's name or folder (such as 'default-head')")
    lookup_spec = lookup_spec.strip()
    is_plain = lookup_spec.lower() == "lookup"
    lookup = parse_ngram("ngram") if is_plain else parse_ngram(lookup_spec)
    try:
        head = load_draft(head_spec)
    except (OSError, ValueError) as e:
        raise ValueError(f"draft spec = {spec!r}: loading the head {head_spec!r} failed: {e}") from None
    if not isinstance(head, FeatureHead):
        raise ValueError(f"draft spec = {spec!r}: {head_spec!r} is a {type(head).__name__}; expected a feature head "
                         "after '+' (such as 'default-head' or 'smollm2-135m-head')")
    return MixedDraft.of(head, lookup, name=head_spec)


def _user_module(spec: str, module: str):
    if module.endswith(".py"):
        path = Path(module)
    else:
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module.split(".")[0] and e.name != module:
                raise ValueError(f"draft spec = {spec!r}: importing {module!r} failed: {e}") from None
            path = Path.cwd().joinpath(*module.split(".")).with_suffix(".py")
            if not path.is_file():
                raise ValueError(f"draft spec = {spec!r}: no module {module!r} on sys.path, and no file {path}") from None
    if not path.is_file():
        raise ValueError(f"draft spec = {spec!r}: no file {path}; expected a Python file that defines the drafter")
    name = "jaxspec_user_drafter_" + re.sub(r"\W", "_", str(path.resolve()))
    if name in sys.modules:  # loaded once per process, as an import is
        return sys.modules[name]
    loader_spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = mod
    try:
        loader_spec.loader.exec_module(mod)
    except Exception as e:
        del sys.modules[name]
        raise ValueError(f"draft spec = {spec!r}: running {path} raised {type(e).__name__}: {e}") from None
    return mod


def _user_drafter(spec: str, module: str, attr: str):
    mod = _user_module(spec, module)
    if not hasattr(mod, attr):
        names = sorted(n for n in vars(mod) if not n.startswith("_"))[:12]
        raise ValueError(f"draft spec = {spec!r}: {module} has no attribute {attr!r} (it has {', '.join(names)})")
    obj = getattr(mod, attr)
    is_drafter = not isinstance(obj, type) and all(callable(getattr(obj, m, None)) for m in DRAFTER_METHODS)
    if not is_drafter:
        if not callable(obj):
            raise ValueError(f"draft spec = {spec!r}: {attr} is a {type(obj).__name__}; expected a drafter or a "
                             "zero-argument callable returning one")
        try:
            obj = obj()
        except TypeError as e:
            raise ValueError(f"draft spec = {spec!r}: calling {attr}() failed ({e}); expected a drafter or a "
                             "zero-argument callable returning one") from None
    return check_drafter(f"draft spec = {spec!r}: {attr}", obj)


def drafter_spec(spec: str):
    """The drafter ``spec`` names when it needs no model file (``ngram[...]``, ``layers:K``,
    ``module:attr``, ``file.py:attr``), or pairs one with a head (``lookup+HEAD``: the pair
    ``(MixedDraft, params)``, :func:`parse_mixed`); ``None`` when it names a model or head (a
    name, a folder or a file: an existing path always names a model)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"draft spec = {spec!r}: expected a non-empty string such as 'ngram', 'layers:8', "
                         "'module:attr' or a model name or folder")
    s = spec.strip()
    if Path(s).exists():
        return None
    if is_mixed_spec(s):
        return parse_mixed(s)
    head, sep, tail = s.partition(":")
    kind = head.strip().lower()
    if kind == "ngram":
        return parse_ngram(s)
    if kind == "layers":
        return parse_layers(s)
    if sep and _IDENT.match(tail.strip()) and (head.endswith(".py") or all(map(_IDENT.match, head.split(".")))):
        return _user_drafter(s, head.strip(), tail.strip())
    return None


def parse_draft(spec: str):
    """What ``spec`` names, ready to pass as ``jaxspec.generate``'s ``draft``: a drafter
    (:func:`drafter_spec`), else the model or feature head it names
    (:func:`jaxspec.formats.checkpoint.load_draft`)."""
    drafter = drafter_spec(spec)
    if drafter is not None:
        return drafter
    from jaxspec.formats.checkpoint import load_draft  # noqa: PLC0415

    return load_draft(os.fspath(spec).strip())
