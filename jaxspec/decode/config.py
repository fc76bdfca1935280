"""The static configuration of a generation (:class:`SpecConfig`, :class:`ARConfig`:
hashable, so one compiled program per configuration) and the one place where generation
settings are validated and become one (:func:`build_config`, :func:`build_ar_config`)."""

from __future__ import annotations

import dataclasses

import jax
from flax import nnx
from jax.sharding import Mesh

from jaxspec.checks import is_int
from jaxspec.core import rules
from jaxspec.core import sampling as core_sampling
from jaxspec.core.sampling import Warp
from jaxspec.core.settings import Sampling, check_sampling, draft_law
from jaxspec.core.treespec import DynamicTree, StaticTree, resolve_tree
from jaxspec.decode.as_drafter import as_drafter
from jaxspec.decode.combinations import check_settings
from jaxspec.decode.drafter import Drafter, DraftRequest
from jaxspec.decode.inputs import position_limit
from jaxspec.decode.output_checks import check_drafter_scheme, check_rule_output, is_library_code
from jaxspec.decode.round import RoundConfig, RoundParts
from jaxspec.nn import sharding
from jaxspec.nn.model import Transformer, check_transformer

__all__ = ["SpecConfig", "ARConfig", "build_config", "build_ar_config"]


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
    parts: RoundParts = RoundParts()
    mesh: Mesh | None = None  # rows over "data", parameters and KV heads over "model"
    split_rows: bool = True  # False: rows are already per device (the harness's shard_map)
    rows: int | None = None  # decode at most this many prompts at once, refilling ended rows

    @property
    def round_config(self) -> RoundConfig:
        """The static description of one round of this generation."""
        return RoundConfig(self.tree, self.scheme, self.target_warp, self.draft_warp, self.parts)

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




def _check_parts(parts) -> RoundParts:
    if parts is None:
        return RoundParts()
    if not isinstance(parts, RoundParts):
        raise ValueError(
            f"parts = {parts!r}: expected None or a jaxspec.RoundParts (verify_mask, accept, commit, keys, draw)"
        )
    for name in ("verify_mask", "accept", "commit", "keys", "draw"):
        if not callable(getattr(parts, name)):
            raise ValueError(f"parts.{name} = {getattr(parts, name)!r}: expected a function")
    return parts


def _with_rule(parts: RoundParts, rule, scheme: str, spec) -> RoundParts:
    """``parts`` with the acceptance step of ``rule`` (checked against the scheme and the
    tree); a rule other than ``"token"`` or ``"auto"`` and a replaced ``parts.accept``
    conflict (``"auto"`` leaves a replaced acceptance step in place)."""
    if isinstance(rule, str) and rule == rules.AUTO and parts.accept is not RoundParts().accept:
        return parts
    accept = rules.check_rule(rule, scheme, spec)
    if accept is parts.accept or (isinstance(rule, str) and rule == "token"):
        return parts  # the default rule leaves a replaced parts.accept in place
    if parts.accept is not RoundParts().accept:
        raise ValueError(
            f"rule = {rules.rule_name(rule)!r} and parts.accept = {parts.accept!r}: both replace the "
            "acceptance step; pass one of them"
        )
    return dataclasses.replace(parts, accept=accept)


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


def _definition(draft):
    """A model's ``nnx.GraphDef`` (its params are not needed to build a configuration);
    ``None`` for a drafter."""
    return nnx.graphdef(draft) if isinstance(draft, nnx.Module) else None


def _check_graphdefs(graphdefs, draft) -> tuple:
    """``graphdefs`` of :func:`build_config` -> ``(target graphdef, drafter)``: the target's
    ``nnx.GraphDef`` and the draft model's or feature head's (a drafter is its own
    definition). Which models they describe cannot be checked without the traversal that
    passing them in avoids."""
    if not isinstance(graphdefs, tuple) or len(graphdefs) != 2:
        what = f"a tuple of {len(graphdefs)}" if isinstance(graphdefs, tuple) else f"a {type(graphdefs).__name__}"
        raise ValueError(f"graphdefs = {what}: expected (target graphdef, draft graphdef) from nnx.split")
    tdef = _check_graphdef("graphdefs[0]", graphdefs[0])
    if isinstance(draft, nnx.Module):
        return tdef, as_drafter(draft, _check_graphdef("graphdefs[1]", graphdefs[1]))[0]
    if graphdefs[1] is not draft:
        raise ValueError(f"graphdefs[1] = {graphdefs[1]!r}: expected the drafter itself, {draft!r} "
                         "(it is its own definition)")
    return tdef, as_drafter(draft)[0]


def _check_budget(max_new_tokens) -> int:
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens = {max_new_tokens!r}: expected an integer >= 1")
    return int(max_new_tokens)


def _check_prompt_length(prompt_length) -> None:
    if not is_int(prompt_length) or prompt_length < 1:
        raise ValueError(f"prompt_length = {prompt_length!r}: expected an integer >= 1")


def _check_positions(name: str, model, needed: int, what: str) -> None:
    limit = position_limit(model)
    if limit is not None and needed > limit:
        raise ValueError(
            f"{name}: {what} = {needed} exceeds max_position_embeddings = {limit}; "
            "shorten the prompt, max_new_tokens or the tree"
        )




def build_config(
    target: Transformer,
    draft,
    *,
    prompt_length: int,
    max_new_tokens: int,
    tree,
    scheme: str | None = None,
    rule="auto",
    sampling: Sampling | None = None,
    draft_sampling: Sampling | None = None,
    parts: RoundParts | None = None,
    mesh: Mesh | None = None,
    rows: int | None = None,
    graphdefs: tuple | None = None,
) -> tuple[SpecConfig, float, float]:
    """The static configuration :func:`generate` compiles for prompts padded to
    ``prompt_length`` tokens, with its arguments validated (``ValueError`` naming the
    argument). The one place where generation settings become a :class:`SpecConfig`:
    :func:`generate` and the exactness harness (:func:`jaxspec.exactness.verify`) both
    call it (``generate`` then pads it to its prompt bucket with :func:`bucket_config`, as
    ``verify(prompt_bucket=...)`` does), so the harness tests what ``generate`` runs.

    Arguments as in :func:`generate`; ``graphdefs``: ``(target graphdef, draft graphdef)``
    when the caller already split the models (``nnx.split``; an n-gram draft is its own
    definition), else they are computed here. Returns ``(config, temperature, draft_temperature)``:
    the temperatures (the draft's resolved by :func:`jaxspec.core.settings.draft_law`) are
    traced arguments of the compiled function, not part of the configuration, so that new
    temperatures do not recompile. Equal arguments give equal (hashable) configurations::

        cfg, t, dt = build_config(target, draft, prompt_length=3, max_new_tokens=8, tree=3)
        cfg.capacity      # 15 cache slots: 3 prompt + 8 new + 3 tree nodes + 1
        cfg == build_config(target, draft, prompt_length=3, max_new_tokens=8, tree="chain:3")[0]
    """
    check_transformer("target", target)
    _check_prompt_length(prompt_length)
    v = target.config.vocab_size
    m = _check_budget(max_new_tokens)
    spec = resolve_tree(tree)
    if graphdefs is None:
        tdef, drafter = nnx.graphdef(target), as_drafter(draft, _definition(draft))[0]
    else:
        tdef, drafter = _check_graphdefs(graphdefs, draft)
    mesh = _check_mesh(mesh, target)
    law = check_sampling("sampling", sampling, Sampling())
    draft_sampling = check_sampling("draft_sampling", draft_sampling)
    rows = _check_rows(rows)
    if scheme is not None:
        core_sampling.check_scheme(scheme)
    shown = {"tree": tree} if isinstance(tree, str) else None  # a spec is named as the caller wrote it
    check_settings(shown, tree=spec, scheme=scheme, rule=rule, mesh=mesh, rows=rows)  # before the drafter's own
    scheme = drafter.check(target, DraftRequest(spec, scheme, mesh, draft_sampling))  # the drafter's refusals
    check_drafter_scheme(drafter, scheme)  # a caller's drafter may answer None: named with its check
    check_settings(shown, tree=spec, scheme=scheme, rule=rule, vocab_size=v)  # with the scheme the drafter chose
    dlaw = draft_law(scheme, law, draft_sampling)
    capacity = int(prompt_length) + m + spec.cache_slots + 1
    for name, model in (("target", target), ("draft", drafter)):
        _check_positions(
            name, model, capacity, "prompt length + max_new_tokens + tree size + 1 (cache capacity)"
        )
    parts = _with_rule(_check_parts(parts), rule, scheme, spec)
    if not is_library_code(parts.accept):  # a caller's rule: its output checked once, before any loop
        name = "rule" if parts.accept is rule else "parts.accept"
        check_rule_output(parts.accept, scheme, spec.num_nodes, v, name)
    cfg = SpecConfig(tdef, drafter, spec, scheme, law.warp, dlaw.warp, m, capacity, parts=parts, mesh=mesh,
                     rows=rows)
    return cfg, law.temperature, dlaw.temperature


def build_ar_config(
    target: Transformer,
    *,
    prompt_length: int,
    max_new_tokens: int,
    sampling: Sampling | None = None,
    mesh: Mesh | None = None,
    graphdef=None,
) -> tuple[ARConfig, float]:
    """The static configuration :func:`generate_autoregressive` compiles for prompts padded
    to ``prompt_length`` tokens, with its arguments validated; ``(config, temperature)``
    (see :func:`build_config`; ``graphdef``: the target's, when the caller has it)."""
    check_transformer("target", target)
    _check_prompt_length(prompt_length)
    m = _check_budget(max_new_tokens)
    law = check_sampling("sampling", sampling, Sampling())
    capacity = int(prompt_length) + m
    _check_positions("target", target, capacity, "prompt length + max_new_tokens (cache capacity)")
    tdef = nnx.graphdef(target) if graphdef is None else _check_graphdef("graphdef", graphdef)
    return ARConfig(tdef, law.warp, m, capacity, mesh=_check_mesh(mesh, target)), law.temperature
