"""The static configuration of a generation (:class:`SpecConfig`, :class:`ARConfig`:
hashable, so one compiled program per configuration) and the one pass where generation
settings are validated and become one (:func:`build_config`, :func:`build_ar_config`):
the drafter's own check, the settings table (:mod:`jaxspec.decode.combinations`), the
acceptance step of ``rule=``, and the cache capacity with the prompt bucket, each once."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from flax import nnx
from jax.sharding import Mesh

from jaxspec.checks import is_int
from jaxspec.core import rules
from jaxspec.core import sampling as core_sampling
from jaxspec.core.sampling import Warp
from jaxspec.core.settings import Sampling, check_draft_sampling, check_sampling, draft_law
from jaxspec.core.token_rule import accept_core
from jaxspec.core.treespec import DynamicTree, StaticTree, resolve_tree
from jaxspec.decode.combinations import check_settings
from jaxspec.decode.defaults import DEFAULT_TREE
from jaxspec.decode.drafter import DRAFTER_METHODS, Drafter, DraftRequest
from jaxspec.decode.inputs import bucket_width, check_prompt_bucket, position_limit
from jaxspec.decode.output_checks import check_drafter_scheme, check_rule_output, is_library_code
from jaxspec.decode.round import RoundConfig, RoundParts
from jaxspec.nn import sharding
from jaxspec.nn.model import Transformer, check_transformer

__all__ = ["SpecConfig", "ARConfig", "build_config", "build_ar_config", "speculation_slots", "cache_capacity",
           "default_tree"]


def speculation_slots(tree) -> int:
    """The cache slots a speculative generation keeps beyond the prompt and the new tokens:
    the tree's (``cache_slots``: its nodes, and a dynamic tree's scratch) and one for the
    root. ``tree``: a parsed tree, or an int ``n`` for a static tree of ``n`` nodes (the
    candidate budgets of ``--tree auto``)."""
    return (int(tree) if is_int(tree) else tree.cache_slots) + 1


def cache_capacity(prompt_length: int, max_new_tokens: int, tree=None) -> int:
    """The one capacity rule: a generation's cache holds the (padded) prompt, the new
    tokens and, when speculating (``tree`` not None), :func:`speculation_slots` more. The
    command line computes the room it reports from it."""
    return int(prompt_length) + int(max_new_tokens) + (0 if tree is None else speculation_slots(tree))


def default_tree(drafter) -> str:
    """The tree of a generation given ``tree=None``: the drafter's own ``tree`` (the tree it
    drafts best, e.g. ``"chain:1"`` for ``smollm2-135m-head``), else :data:`DEFAULT_TREE`."""
    return getattr(drafter, "tree", None) or DEFAULT_TREE


@dataclasses.dataclass(frozen=True)
class SpecConfig:
    """Static configuration of one compiled speculative generation (hashable)."""

    target_def: nnx.GraphDef
    draft_def: Drafter  # the drafter (jaxspec.decode.drafter); its params are a traced argument
    tree: StaticTree | DynamicTree
    scheme: str
    target_warp: Warp
    draft_warp: Warp
    max_new_tokens: int
    capacity: int
    accept: Callable = accept_core  # the acceptance step: the function of rule= (jaxspec.core.rules)
    parts: RoundParts = RoundParts()
    mesh: Mesh | None = None  # rows over "data", parameters and KV heads over "model"
    split_rows: bool = True  # False: rows are already per device (the harness's shard_map)
    rows: int | None = None  # decode at most this many prompts at once, refilling ended rows

    @property
    def round_config(self) -> RoundConfig:
        """The static description of one round of this generation."""
        return RoundConfig(self.tree, self.scheme, self.target_warp, self.draft_warp, self.draft_def, self.accept,
                           self.parts)

    @property
    def prompt_width(self) -> int:
        """The padded prompt width the configuration compiles for (its prompt bucket)."""
        return self.capacity - self.max_new_tokens - speculation_slots(self.tree)

    @property
    def num_nodes(self) -> int:
        return self.tree.num_nodes

    @property
    def stat_depth(self) -> int:
        """Columns of ``accepted_per_depth``."""
        if isinstance(self.tree, StaticTree):
            return self.tree.depth
        return min(self.tree.depth, self.tree.num_nodes)

    @property
    def draft_calls_per_round(self) -> int:
        """The drafter's forwards per round (its optional ``forwards(tree)``; 0 without one)."""
        forwards = getattr(self.draft_def, "forwards", None)
        return int(forwards(self.tree)) if callable(forwards) else 0


@dataclasses.dataclass(frozen=True)
class ARConfig:
    """Static configuration of one compiled target-only generation (hashable)."""

    target_def: nnx.GraphDef
    warp: Warp
    max_new_tokens: int
    capacity: int
    mesh: Mesh | None = None
    split_rows: bool = True

    @property
    def prompt_width(self) -> int:
        """The padded prompt width the configuration compiles for (its prompt bucket)."""
        return self.capacity - self.max_new_tokens


def _check_parts(parts) -> RoundParts:
    if parts is None:
        return RoundParts()
    if not isinstance(parts, RoundParts):
        raise ValueError(
            f"parts = {parts!r}: expected None or a jaxspec.RoundParts (verify_mask, commit, keys, draw; the "
            "acceptance step is rule=)"
        )
    for name in (f.name for f in dataclasses.fields(RoundParts)):
        if not callable(getattr(parts, name)):
            raise ValueError(f"parts.{name} = {getattr(parts, name)!r}: expected a function")
    return parts


def _accept(rule, scheme: str, spec, vocab_size: int) -> Callable:
    """The acceptance step of ``rule`` (a built-in name, already checked against the tree
    and the scheme by the settings table, or a caller's function, whose output is checked
    once here, before any loop)."""
    accept = rules.check_rule(rule, scheme, spec)
    if not is_library_code(accept):
        check_rule_output(accept, scheme, spec.num_nodes, vocab_size, "rule")
    return accept


def _check_mesh(mesh, target) -> Mesh | None:
    """``mesh`` validated against the target (None stays None; a drafter checks its own
    part, :meth:`~jaxspec.decode.drafter.Drafter.check`)."""
    if mesh is None:
        return None
    mesh = sharding.check_mesh(mesh)  # jax.make_mesh's Explicit axes made Auto
    sharding.check_model_on_mesh("target", target.config, mesh)
    return mesh


def _check_rows(rows) -> int | None:
    if rows is None:
        return None
    if not is_int(rows) or rows < 1:
        raise ValueError(f"rows = {rows!r}: expected None or an integer >= 1 (the prompts decoded at a time)")
    return int(rows)


def _check_graphdef(name: str, graphdef) -> nnx.GraphDef:
    if not isinstance(graphdef, nnx.GraphDef):
        raise ValueError(f"{name} = {type(graphdef).__name__}: expected an nnx.GraphDef (the first half of nnx.split)")
    return graphdef


def _check_drafter(drafter) -> Drafter:
    """``drafter`` if it is a drafter (what :func:`~jaxspec.decode.as_drafter.as_drafter`
    returns first); a model is refused with the call that turns it into one."""
    if all(callable(getattr(drafter, m, None)) for m in DRAFTER_METHODS):
        return drafter
    raise ValueError(
        f"draft = {type(drafter).__name__}: expected a drafter (jaxspec.Drafter); build_config takes what "
        "jaxspec.decode.as_drafter.as_drafter(draft)[0] returns for a model, a feature head or a drafter "
        "(jaxspec.generate and jaxspec.verify call it)"
    )


def _check_on_round(on_round):
    if on_round is not None and not callable(on_round):
        raise ValueError(
            f"on_round = {on_round!r}: expected None or a function f(tokens, lengths) called "
            "once per round"
        )
    return on_round


def _check_budget(max_new_tokens) -> int:
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens = {max_new_tokens!r}: expected an integer >= 1")
    return int(max_new_tokens)


def _check_prompt_length(prompt_length) -> None:
    if not is_int(prompt_length) or prompt_length < 1:
        raise ValueError(f"prompt_length = {prompt_length!r}: expected an integer >= 1")


def _capacity(models, prompt_length: int, max_new_tokens: int, tree, bucket: int | None, what: str) -> int:
    """The cache capacity of a generation, computed once: :func:`cache_capacity` for the
    prompt padded to its bucket (:func:`~jaxspec.decode.inputs.bucket_width`, at most what
    the models' positions leave), checked against each model's ``max_position_embeddings``
    (``models``: ``(name, model or drafter)`` pairs; ``ValueError`` naming the first that is
    short)."""
    needed = cache_capacity(prompt_length, max_new_tokens, tree)
    limits = {name: position_limit(m) for name, m in models}
    for name, limit in limits.items():
        if limit is not None and needed > limit:
            raise ValueError(
                f"{name}: {what} = {needed} exceeds max_position_embeddings = {limit}; "
                "shorten the prompt, max_new_tokens or the tree"
            )
    known = [x for x in limits.values() if x is not None]
    room = (min(known) if known else 2**31 - 1) - needed
    return needed + bucket_width(int(prompt_length), bucket, room) - int(prompt_length)


def build_config(
    target: Transformer,
    drafter: Drafter,
    *,
    prompt_length: int,
    max_new_tokens: int,
    tree=None,
    scheme: str | None = None,
    rule="auto",
    sampling: Sampling | None = None,
    draft_sampling: Sampling | dict | None = None,
    parts: RoundParts | None = None,
    mesh: Mesh | None = None,
    rows: int | None = None,
    on_round=None,
    prompt_bucket: int | None = None,
    target_def: nnx.GraphDef | None = None,
) -> tuple[SpecConfig, float, float]:
    """The static configuration :func:`generate` compiles for prompts of ``prompt_length``
    tokens, with its arguments validated (``ValueError`` naming the argument). The one pass
    where generation settings become a :class:`SpecConfig`: :func:`generate` and the
    exactness harness (:func:`jaxspec.exactness.verify`) both call it, so the harness tests
    what ``generate`` runs. In order, each once: the arguments' own checks, the drafter's
    :meth:`~jaxspec.Drafter.check` (its refusals, and the scheme it serves), the settings
    table (:func:`~jaxspec.decode.combinations.check_settings`, every setting at once), the
    acceptance step of ``rule``, and the cache capacity with the prompt padded to
    ``prompt_bucket`` (:attr:`SpecConfig.prompt_width`; pad the prompts with
    :func:`~jaxspec.decode.inputs.pad_prompts`).

    Arguments as in :func:`generate`, except ``drafter``: the drafter, as
    :func:`~jaxspec.decode.as_drafter.as_drafter` returns it (its params are not needed to
    build a configuration), and ``prompt_bucket``, whose default here is ``None`` (the
    prompt's own width). ``target_def``: the target's ``nnx.GraphDef`` when the caller has
    split it already (else computed here). Returns ``(config, temperature, draft_temperature)``:
    the temperatures (the draft's resolved by :func:`jaxspec.core.settings.draft_law`) are
    traced arguments of the compiled function, not part of the configuration, so that new
    temperatures do not recompile. Equal arguments give equal (hashable) configurations::

        drafter = as_drafter(draft)[0]
        cfg, t, dt = build_config(target, drafter, prompt_length=3, max_new_tokens=8, tree=3)
        cfg.capacity      # 15 cache slots: 3 prompt + 8 new + 3 tree nodes + 1
        cfg == build_config(target, drafter, prompt_length=3, max_new_tokens=8, tree="chain:3")[0]
    """
    check_transformer("target", target)
    drafter = _check_drafter(drafter)
    _check_prompt_length(prompt_length)
    v = target.config.vocab_size
    m = _check_budget(max_new_tokens)
    spec = resolve_tree(default_tree(drafter) if tree is None else tree)
    mesh = _check_mesh(mesh, target)
    law = check_sampling("sampling", sampling, Sampling())
    draft_sampling = check_draft_sampling(draft_sampling)
    rows = _check_rows(rows)
    on_round = _check_on_round(on_round)
    bucket = check_prompt_bucket(prompt_bucket)
    if scheme is not None:
        core_sampling.check_scheme(scheme)
    served = drafter.check(target, DraftRequest(spec, scheme, mesh, draft_sampling))  # the drafter's refusals
    served = check_drafter_scheme(drafter, served)  # a caller's drafter may answer None: named with its check
    shown = {"tree": tree} if isinstance(tree, str) else None  # a spec is named as the caller wrote it
    # the table, once, with every setting: the scheme asked for (a dynamic tree refuses "iid" even where the
    # drafter would serve "deterministic"), else the one the drafter serves
    check_settings(shown, tree=spec, scheme=served if scheme is None else scheme, rule=rule, mesh=mesh, rows=rows,
                   on_round=on_round, vocab_size=v)
    dlaw = draft_law(served, law, draft_sampling)
    accept = _accept(rule, served, spec, v)
    parts = _check_parts(parts)
    capacity = _capacity((("target", target), ("draft", drafter)), prompt_length, m, spec, bucket,
                         "prompt length + max_new_tokens + tree size + 1 (cache capacity)")
    tdef = nnx.graphdef(target) if target_def is None else _check_graphdef("target_def", target_def)
    cfg = SpecConfig(tdef, drafter, spec, served, law.warp, dlaw.warp, m, capacity, accept=accept, parts=parts,
                     mesh=mesh, rows=rows)
    return cfg, law.temperature, dlaw.temperature


def build_ar_config(
    target: Transformer,
    *,
    prompt_length: int,
    max_new_tokens: int,
    sampling: Sampling | None = None,
    mesh: Mesh | None = None,
    prompt_bucket: int | None = None,
    graphdef=None,
) -> tuple[ARConfig, float]:
    """The static configuration :func:`generate_autoregressive` compiles for prompts of
    ``prompt_length`` tokens padded to ``prompt_bucket``, with its arguments validated;
    ``(config, temperature)`` (see :func:`build_config`; ``graphdef``: the target's, when
    the caller has it)."""
    check_transformer("target", target)
    _check_prompt_length(prompt_length)
    m = _check_budget(max_new_tokens)
    law = check_sampling("sampling", sampling, Sampling())
    capacity = _capacity((("target", target),), prompt_length, m, None, check_prompt_bucket(prompt_bucket),
                         "prompt length + max_new_tokens (cache capacity)")
    tdef = nnx.graphdef(target) if graphdef is None else _check_graphdef("graphdef", graphdef)
    return ARConfig(tdef, law.warp, m, capacity, mesh=_check_mesh(mesh, target)), law.temperature
