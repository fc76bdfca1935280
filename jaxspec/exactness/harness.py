"""Exactness verification as a product: does *this* decoder configuration reproduce the
target's law? (docs/DESIGN.md §4.)

:func:`verify` runs the real decoder (:func:`jaxspec.generate`) on ``S`` copies of one
prompt (a batch of identical prompts is a batch of independent samples), keeps the first
``L`` emitted tokens, and tests them against the **exact** law, enumerated from the
target's own :func:`~jaxspec.nn.model.forward_logits` and :func:`~jaxspec.core.sampling.warp_probs`
over the prefix tree of depth ``L`` of the target's support::

    report = verify(tree="branch:2,2", scheme="iid", num_samples=10**6)
    report.passed                 # every test above its Bonferroni threshold
    print(report.summary())       # the tests, TV bound, smallest detectable TV, acceptance
    report.save_plots("plots/")   # marginals.png, joint.png, acceptance.png
    report.to_json()

Tests (all fixed before any sample is drawn; family-wise ``alpha`` split by Bonferroni):

* χ² goodness of fit of the joint law of the ``L`` tokens, and of each position's
  marginal, against the exact law;
* two-sample χ² of the speculative counts against target-only sampling
  (:func:`~jaxspec.generate_autoregressive`, same sample count), and the target-only
  counts against the exact law (a control on the enumeration itself);
* acceptance per depth of the *first* round (a separate one-round run): exact binomial
  tests of the number of rows with an accepted node at depth ``d`` against its exact
  expectation, enumerated over every draft draw of the tree from the models' rows
  (static trees; skipped, with a note, for dynamic trees or when too many draws).

Plus the total-variation distance to the exact law with a ``1 - alpha`` upper confidence
bound and the smallest TV the joint test could have detected
(:func:`~jaxspec.exactness.stats.min_detectable_tv`, power 0.9).

Power (fixed before any sample is drawn, never tuned on outcomes): a χ² test whose law has
more than one cell but whose cells were all pooled into one (dof 0: p = 1 whatever the
samples), a binomial test whose most extreme outcome cannot reach its threshold, or a
smallest detectable TV >= 1 (TV never exceeds 1) makes the report ``"inconclusive"``
instead of ``"passed"`` (:attr:`VerifyReport.verdict`); ``samples_needed`` says how many
samples these rules need.

Cells: token sequences of positive exact probability (``V**L`` of them at most, only
``top_k**L`` under a top-k), plus one "outside the support" cell whose observations are a
certain rejection. A law of more than :data:`MAX_CELLS` cells (any real vocabulary without
a small ``top_k``) is not enumerated: ``method="auto"`` then tests the same samples with
the conditional PIT and hashed two-sample cells (:mod:`jaxspec.exactness.sampled`, a
:class:`~jaxspec.exactness.sampled_report.SampledReport`); ``method="enumerate"`` refuses it.

Modules: the exact reference values come from :mod:`jaxspec.exactness.exact_laws`, the sample
counts from :mod:`jaxspec.exactness.sample_counts`, the report (text, JSON, plots) is
:mod:`jaxspec.exactness.report`; every public name is importable from here too.

Sampling, streaming and sharding. Samples come in *blocks* of ``chunk_size`` rows; block
``g`` of run ``r`` (speculative, target-only, first round) uses the key
``fold_in(fold_in(key(seed), r), g)``. Each step runs one block per device under
``shard_map`` over a 1-D mesh ``("chains",)`` of all visible devices; every block is reduced
on its device to integer counts (joint cells, per-position tokens, accepted nodes per
depth) and ``psum``-ed, so host memory is flat in ``S`` and a block's computation has the
same shapes on any number of devices: the counts are a function of ``(seed, chunk_size)``
only, identical on 1 and on 8 devices (idle devices of the last step get empty blocks).
Rows past ``S`` in the last block are masked out.

Multi-host (e.g. a TPU pod slice or several GPU hosts): start every process with::

    import jax
    jax.distributed.initialize()      # coordinator/process ids from the environment
    from jaxspec.exactness.harness import verify
    report = verify(target, draft, num_samples=10**9, chunk_size=1 << 16)
    if jax.process_index() == 0:
        print(report.summary())

Every process must call :func:`verify` with the same arguments and the same model weights.
The mesh then spans ``jax.devices()`` (all hosts); block indices and replicated inputs
are built with ``jax.make_array_from_callback``; the ``psum``-ed counts are fully
replicated, so every process reads the same report.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.checks import is_int
from jaxspec.errors import SettingError
from jaxspec.core import rules
from jaxspec.core.settings import Sampling, check_sampling
from jaxspec.core.treespec import DynamicTree
from jaxspec.decode import generate as gen
from jaxspec.decode.as_drafter import as_drafter
from jaxspec.decode.output_checks import check_drafter_output
from jaxspec.decode.config import default_tree
from jaxspec.decode.round import RoundParts
from jaxspec.exactness import mutants, stats
from jaxspec.exactness.exact_laws import (
    MAX_ACCEPT_TERMS,
    MAX_CELLS,
    ExactLaw,
    exact_law,
    expected_acceptance,
)
from jaxspec.exactness.law_tests import evidence, law_tests
from jaxspec.exactness.report import TestResult, VerifyReport
from jaxspec.exactness.sample_counts import count_samples, finish_timings
from jaxspec.exactness.sampled import METHODS, choose_method, run_sampled
from jaxspec.exactness.sampled_report import SampledReport
from jaxspec.nn import sharding
from jaxspec.nn.config import ModelConfig
from jaxspec.nn.model import Transformer, init_model

__all__ = [
    "MAX_CELLS",
    "DEFAULT_TREE",
    "DEFAULT_SCHEME",
    "DEFAULT_PROMPT",
    "TestResult",
    "VerifyReport",
    "SampledReport",
    "METHODS",
    "verify",
    "default_pair",
    "default_chunk",
    "sample_cost",
    "exact_law",
    "expected_acceptance",
    # also re-exported from the modules verify is built from
    "MAX_ACCEPT_TERMS",
    "ExactLaw",
]

#: the default configuration is :func:`jaxspec.generate`'s: its tree, its scheme (the
#: drafter's default, None here), its rule ("auto") and its prompt padding, so that a bare
#: ``verify()`` tests what a bare ``generate()`` runs
DEFAULT_TREE = gen.DEFAULT_TREE
DEFAULT_SCHEME = None
#: the configuration a mutant runs on when no tree is given: one where it has something to
#: break (two siblings per node and two levels; a chain for block verification's mutants)
MUTANT_CONFIG = {"token": ("branch:2,2", "iid"), "traversal": ("branch:2,2", "iid"), "block": ("chain:3", "iid")}
DEFAULT_PROMPT = (1, 2, 3)


# --------------------------------------------------------------------------- default pair


def _pair_config(vocab_size: int = 4, hidden_size: int = 16) -> ModelConfig:
    return ModelConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                       num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, rope_theta=10.0,
                       max_position_embeddings=64)


def default_pair(seed: int = 0, *, vocab_size: int = 4, hidden_size: int = 16, head_scale: float = 4.0,
                 mix: float = 0.5) -> tuple[Transformer, Transformer]:
    """Tiny random ``(target, draft)`` with a small vocabulary (exact laws enumerable).

    One layer, two heads. The LM heads are scaled by ``head_scale`` so that next-token laws
    are sharp and depend on the context; the draft's parameters are
    ``(1 - mix) * target + mix * other`` for an independent ``other``, so acceptance is
    neither ~0 nor ~1.
    """
    cfg = _pair_config(vocab_size, hidden_size)

    def make(key):
        m = init_model(cfg, key)
        m.lm_head.kernel[...] = m.lm_head.kernel[...] * head_scale
        return m

    target = make(jax.random.key(seed))
    other = make(jax.random.key(seed + 1000))
    gdef, t_state = nnx.split(target)
    _, o_state = nnx.split(other)
    draft = nnx.merge(gdef, jax.tree.map(lambda a, b: (1.0 - mix) * a + mix * b, t_state, o_state))
    return target, draft


# --------------------------------------------------------------------------- configuration


@dataclasses.dataclass(frozen=True)
class _Setup:
    """The compiled configurations of one verification and its validated warps."""

    spec_cfg: gen.SpecConfig
    first_cfg: gen.SpecConfig  # the same, with a budget of one token: one round
    ar_cfg: gen.ARConfig
    temperature: float
    draft_temperature: float
    target_warp: dict
    draft_warp: dict
    widths: dict  # the padded prompt width each configuration compiles for (generate's prompt_bucket)


#: what a temperature-0 run shows (its report's ``config["scope"]``)
GREEDY_SCOPE = ("temperature 0: the target law is one cell (the greedy sequence), so this run tests greedy "
                "equality only; decoders broken in the law at other temperatures (e.g. the depth-row and "
                "causal-mask mutants) pass it. Run at a temperature > 0 to test the sampling law.")


def _setup(target, drafter, prompt, horizon, tree, scheme, sampling, draft_sampling, rule="token", parts=None,
           prompt_bucket=None, mesh=None) -> _Setup:
    """What :func:`jaxspec.generate` (``max_new_tokens = horizon``, and ``1`` for the
    first-round run) and :func:`jaxspec.generate_autoregressive` compile for copies of
    ``prompt``: built, and validated, by :func:`jaxspec.decode.generate.build_config` (once:
    the first-round configuration is the same with a budget of 1, the first round of the
    same program) and :func:`~jaxspec.decode.generate.build_ar_config`, with the prompt
    padded to ``prompt_bucket`` (``None``: the prompt's own width, what
    ``generate(..., prompt_bucket=None)`` compiles)."""
    settings = dict(tree=tree, scheme=scheme, rule=rule, parts=parts, sampling=sampling, draft_sampling=draft_sampling,
                    prompt_bucket=prompt_bucket, mesh=mesh)
    t = len(prompt)
    spec_cfg, t_temp, d_temp = gen.build_config(target, drafter, prompt_length=t, max_new_tokens=horizon, **settings)
    # the first-round run differs only in its budget (and so its cache, by the same amount)
    first_cfg = dataclasses.replace(spec_cfg, max_new_tokens=1, capacity=spec_cfg.capacity - (spec_cfg.max_new_tokens - 1))
    ar_cfg, _ = gen.build_ar_config(target, prompt_length=t, max_new_tokens=horizon, sampling=sampling,
                                    prompt_bucket=prompt_bucket, mesh=mesh)
    t_warp, d_warp = spec_cfg.target_warp, spec_cfg.draft_warp
    return _Setup(spec_cfg, first_cfg, ar_cfg, t_temp, d_temp,
                  dict(temperature=t_temp, top_k=t_warp.top_k, top_p=t_warp.top_p, min_p=t_warp.min_p),
                  dict(temperature=d_temp, top_k=d_warp.top_k, top_p=d_warp.top_p, min_p=d_warp.min_p),
                  {"spec": spec_cfg.prompt_width, "first": first_cfg.prompt_width, "ar": ar_cfg.prompt_width})


# --------------------------------------------------------------------------- verify


def _check_count(name, x, minimum=1):
    if not is_int(x) or x < minimum:
        raise ValueError(f"{name} = {x!r}: expected an integer >= {minimum}")
    return int(x)


def _check_prompt(prompt, v: int) -> tuple[int, ...]:
    if isinstance(prompt, (str, bytes)) or not isinstance(prompt, (Sequence, np.ndarray)):
        raise ValueError(f"prompt = {prompt!r}: expected a sequence of token ids")
    out = tuple(prompt)
    if not out:
        raise ValueError("prompt: expected at least one token, got an empty prompt")
    for i, t in enumerate(out):
        if not is_int(t) or not 0 <= t < v:
            raise ValueError(f"prompt[{i}] = {t!r}: expected a token id in [0, {v})")
    return tuple(int(t) for t in out)


#: the default block size (rows per device per step): the most on CPU / on an accelerator,
#: and the least a costly configuration is cut down to
CHUNK_MAX = {"cpu": 1 << 14, "accelerator": 1 << 16}
CHUNK_MIN = {"cpu": 1 << 8, "accelerator": 1 << 12}
#: a block may cost this many times the default tiny pair's block before it is cut
#: (about 2 s on a 2-core CPU)
CHUNK_SLACK = 3.0


def sample_cost(target: ModelConfig, draft: ModelConfig | None, num_nodes: int, horizon: int) -> float:
    """Relative cost of one speculative sample: ``horizon`` rounds of ``num_nodes + 1``
    tree rows, each paying a fixed overhead, both models' parameters, and the
    vocabulary-wide sampling steps (warps, draws, residuals, ~``V**1.2``). The constants
    were fitted on this project's 2-core CPU (V = 4 to 1000, 5 k to 5.3 M parameters: within
    a few per cent of the measured samples/s); only ratios of this cost are used."""
    v = target.vocab_size
    draft_params = 0 if draft is None else draft.num_params()  # None: a drafter without a model
    per_row = 79e3 + target.num_params() + draft_params + 3594.0 * v**1.2
    return float((num_nodes + 1) * horizon * per_row)


def default_chunk(devices, target: Transformer, draft, num_nodes: int, horizon: int) -> int:
    """The block size ``verify`` uses when ``chunk_size`` is None: :data:`CHUNK_MAX`, halved
    while a block would cost more than :data:`CHUNK_SLACK` times the default tiny pair's
    (about 0.7 s a block on a 2-core CPU) by :func:`sample_cost`, down to :data:`CHUNK_MIN`,
    so that a block of a large vocabulary or model still takes seconds, not minutes, and the
    progress bar moves. A function of the configuration only, so a
    run's counts stay a function of its arguments (``config["chunk_size"]`` records it)."""
    kind = "cpu" if devices[0].platform == "cpu" else "accelerator"
    ref = _pair_config()  # the default pair, its default tree (6 nodes) and horizon (3)
    draft_config = getattr(draft, "config", None)  # a model's or a head's; None for other drafters
    ratio = sample_cost(target.config, draft_config, num_nodes, horizon) / sample_cost(ref, ref, 6, 3)
    chunk = CHUNK_MAX[kind]
    while chunk > CHUNK_MIN[kind] and chunk * ratio > CHUNK_SLACK * CHUNK_MAX[kind]:
        chunk //= 2
    return chunk


def verify(
    target: Transformer | None = None,
    draft=None,
    *,
    tree=None,
    scheme: str | None = DEFAULT_SCHEME,
    rule="auto",
    sampling: Sampling | None = None,
    draft_sampling: Sampling | None = None,
    prompt: Sequence[int] | None = None,
    horizon: int = 3,
    num_samples: int = 10**6,
    chunk_size: int | None = None,
    seed: int = 0,
    mutant: str | None = None,
    parts: RoundParts | None = None,
    alpha: float = 1e-3,
    check_acceptance: bool = True,
    devices: Sequence | None = None,
    mesh=None,
    progress: bool = True,
    prompt_bucket: int | None = gen.PROMPT_BUCKET,
    method: str = "auto",
) -> VerifyReport | SampledReport:
    """Test that speculative decoding with this configuration samples the target's law.

    Args:
      target, draft: the target and its draft (both or neither; default :func:`default_pair`):
        a draft model, a feature head, or any drafter of the :class:`~jaxspec.Drafter`
        protocol, as :func:`jaxspec.generate` takes.
      tree, scheme, rule, sampling, draft_sampling: as in :func:`jaxspec.generate`,
        with its defaults (``tree=None``: the drafter's own ``tree``, else
        :data:`DEFAULT_TREE`, or with a ``mutant`` the configuration it breaks,
        :data:`MUTANT_CONFIG`).
        ``rule`` may be a function with the signature of
        :func:`jaxspec.core.acceptance.accept_core` (your own rule): it is sampled and
        tested like the built-in ones; its acceptance is observed, not compared with an
        expectation (the harness enumerates the token and block rules' only).
      prompt: token ids (default :data:`DEFAULT_PROMPT`).
      horizon: ``L``, the number of emitted tokens whose joint law is tested.
      num_samples: ``S`` samples for each run (speculative, target-only, first round).
      chunk_size: rows per block, i.e. per device per step (default :func:`default_chunk`:
        2^14 on CPU, 2^16 on accelerators, less for costly models or vocabularies, down to
        2^8 / 2^12; at most ``S``); memory grows with it, never with ``S``. The counts
        depend on ``seed`` and ``chunk_size``, not on the number of devices.
      seed: sampling seed (the default models are fixed).
      mutant: a name in :data:`jaxspec.exactness.mutants.MUTANTS`: run a deliberately broken decoder.
      parts: a round with replaced steps (:class:`~jaxspec.decode.round.RoundParts`, as in
        :func:`jaxspec.generate`): test your own verification mask, commit, key split or
        draft draws (your own acceptance step is ``rule=``). The acceptance test compares
        with the rule's exact expectation; pass ``check_acceptance=False`` for parts meant
        to accept differently.
      alpha: family-wise error rate, split over the tests by Bonferroni.
      check_acceptance: also run one-round decoding and test acceptance per depth (the
        enumeration path; the sampled path reports the speculative run's acceptance per
        depth, observed, at no extra cost).
      devices: devices of the 1-D mesh (default ``jax.devices()``).
      mesh: instead of ``devices``, a :class:`jax.sharding.Mesh` with axes ``"data"``
        and/or ``"model"`` (:func:`jaxspec.make_mesh`): blocks of samples over ``data``, and
        each block's forwards split over ``model`` as :func:`jaxspec.generate` splits them
        (:mod:`jaxspec.nn.sharding`).
      progress: tqdm progress bars on stderr.
      prompt_bucket: pad the prompt as :func:`jaxspec.generate` does with this
        ``prompt_bucket`` and test that program: by default ``generate``'s
        (:data:`jaxspec.decode.generate.PROMPT_BUCKET`, 32 columns). ``None``: the program of
        the prompt's own width, what ``generate(..., prompt_bucket=None)`` runs, whose tokens
        are the padded program's token for token (``tests/test_prompt_bucket.py``) at a
        lower cost per sample (a short prompt's prefill and cache stay small).
      method: ``"enumerate"`` (the exact joint law, at most :data:`MAX_CELLS` cells:
        a :class:`VerifyReport`), ``"sampled"`` (no enumeration, any vocabulary: the
        conditional PIT and hashed two-sample tests of :mod:`jaxspec.exactness.sampled`, a
        :class:`~jaxspec.exactness.sampled_report.SampledReport`), or ``"auto"``
        (enumeration where the law's cells fit, else sampled).

    Raises:
      ValueError: bad input (named), or ``method="enumerate"`` on a law with more than
        :data:`MAX_CELLS` cells.
    """
    t_start = time.perf_counter()
    if not isinstance(method, str) or method not in METHODS:
        raise SettingError({"method": method}, f"expected one of {', '.join(map(repr, METHODS))}")
    run = _prepare(target, draft, tree, scheme, rule, sampling, draft_sampling, prompt, horizon, num_samples,
                   chunk_size, seed, mutant, parts, alpha, devices, mesh, prompt_bucket, method)
    if run.method == "sampled":
        return run_sampled(run, _draw, alpha=alpha, progress=progress, t_start=t_start,
                           config=_config(run, method="sampled", method_reason=run.method_reason))
    timings = {}
    t0 = time.perf_counter()
    law = exact_law(run.target, run.prompt, run.horizon, **run.setup.target_warp)
    timings["exact_law_s"] = time.perf_counter() - t0
    # the exact expectations, hence the set of tests, are fixed before any sample is drawn
    acc_exp, acc_note = _acceptance_expectation(run, timings) if check_acceptance else (None, "")
    counts = _draw(run, law, check_acceptance, progress, timings)
    spec, ar, first = counts["spec"], counts["ar"], counts.get("first")
    tests, a_test = law_tests(law, spec, ar, None if first is None else first["accepted"], acc_exp, alpha=alpha,
                              num_samples=run.num_samples)
    timings["total_s"] = time.perf_counter() - t_start
    timings = finish_timings(timings, run.num_samples)
    return VerifyReport(
        config=_config(run, method="enumerate", method_reason=run.method_reason), tests=tuple(tests), alpha=alpha, alpha_per_test=a_test, num_samples=run.num_samples,
        cells=law.cells, exact=law.probs, spec_counts=spec["joint"], ar_counts=ar["joint"],
        exact_marginals=law.marginals, spec_marginals=spec["marginals"], ar_marginals=ar["marginals"],
        acceptance_observed=None if first is None else first["accepted"] / run.num_samples,
        acceptance_expected=acc_exp, acceptance_samples=0 if first is None else run.num_samples,
        acceptance_note=acc_note, tokens_per_round=float(spec["tokens"] / max(spec["rounds"], 1)), timings=timings,
        **evidence(law, spec, ar, acc_exp, alpha=alpha, a_test=a_test, num_samples=run.num_samples),
    )


@dataclasses.dataclass(frozen=True)
class _Run:
    """One verification's validated inputs and compiled configurations."""

    target: Transformer
    draft: object  # as given
    drafter: object  # as_drafter(draft): the drafter and its params
    dparams: object
    tree: object  # as given (a spec string is reported as written)
    rule: object  # as reported (a mutant's: the rule it breaks)
    prompt: tuple[int, ...]
    horizon: int
    num_samples: int
    seed: int
    mutant: str | None
    prompt_bucket: int | None
    setup: _Setup
    mesh: object
    devices: tuple
    chunk: int
    method: str  # "enumerate" or "sampled", as resolved
    method_reason: str


def _prepare(target, draft, tree, scheme, rule, sampling, draft_sampling, prompt, horizon, num_samples,
             chunk_size, seed, mutant, parts, alpha, devices, mesh, prompt_bucket, method) -> _Run:
    """Every argument checked, and the configurations :func:`jaxspec.generate` compiles for
    them built, before anything is enumerated or sampled."""
    if (target is None) != (draft is None):
        raise ValueError("target/draft: pass both models, or neither for the default pair")
    if target is None:
        target, draft = default_pair(0)
    v = target.config.vocab_size
    horizon = _check_count("horizon", horizon)
    prompt_bucket = gen.check_prompt_bucket(prompt_bucket)
    num_samples = _check_count("num_samples", num_samples)
    seed = _check_count("seed", seed, minimum=0)
    stats.check_alpha(alpha, "alpha")
    drafter, dparams = as_drafter(draft)  # once, here: the configuration takes the drafter
    accept = rule  # what the round runs (a mutant's own acceptance step), rule what is reported
    if mutant is not None:
        mutants.check_mutant(mutant)
        if parts is not None:
            raise ValueError("mutant/parts: pass one of them (a mutant brings its own parts)")
        broken, own = mutants.MUTANT_RULE[mutant], mutants.mutant_rule(mutant)
        if own is not None and not (isinstance(rule, str) and rule in (rules.AUTO, broken)):
            raise ValueError(f"rule = {rules.rule_name(rule)!r} and mutant = {mutant!r}: the mutant is an acceptance "
                             f"step of its own (a broken {broken!r} rule); expected rule 'auto' or {broken!r}")
        parts = mutants.round_parts(mutant)
        if isinstance(rule, str) and rule == rules.AUTO:
            rule = broken  # a mutant runs with the rule it breaks
        accept = rule if own is None else own
    if tree is None:  # generate's default, or the configuration the mutant breaks
        tree, mutant_scheme = MUTANT_CONFIG[mutants.MUTANT_RULE[mutant]] if mutant is not None else \
            (default_tree(drafter), None)
        scheme = mutant_scheme if scheme is None else scheme
    prompt = _check_prompt(DEFAULT_PROMPT if prompt is None else prompt, v)
    method, method_reason = choose_method(method, check_sampling("sampling", sampling, Sampling()), v, horizon)
    if mesh is not None and devices is not None:
        raise ValueError("devices/mesh: pass one of them (a mesh names its devices)")
    mesh = None if mesh is None else sharding.full_mesh(mesh)  # checked with the configuration, drafter included
    setup = _setup(target, drafter, prompt, horizon, tree, scheme, sampling, draft_sampling, accept, parts,
                   prompt_bucket, mesh)
    if mutant is not None and mutants.MUTANT_RULE[mutant] != "token":
        label = mutants.MUTANT_RULE[mutant]
        kinds = ("chain",) if label == "block" else ("chain", "tree")
        if rules.tree_kind(setup.spec_cfg.tree) not in kinds:
            raise ValueError(f"mutant = {mutant!r}: breaks {label} verification, which runs on "
                             f"{' and '.join(k + 's' for k in kinds)} only, got tree = {tree!r}")
    if mutant in mutants.DRAW_MUTANTS and setup.spec_cfg.scheme == "deterministic":
        raise ValueError(f"mutant = {mutant!r}: breaks the draft's random draws, which the scheme 'deterministic' "
                         "(fixed choices, e.g. --draft ngram) does not make: use scheme iid or without_replacement "
                         "with a drafter that draws (a model, a head, layer skip)")
    setup, mesh, devices = _placement(setup, target, mesh, devices)
    chunk = (default_chunk(devices, target, draft, setup.spec_cfg.num_nodes, horizon) if chunk_size is None
             else _check_count("chunk_size", chunk_size))
    chunk = min(chunk, num_samples)  # never the device count: counts depend on (seed, chunk) only
    return _Run(target, draft, drafter, dparams, tree, rule, prompt, horizon, num_samples, seed, mutant, prompt_bucket,
                setup, mesh, devices, chunk, method, method_reason)



def _placement(setup: _Setup, target, mesh, devices) -> tuple[_Setup, object, tuple]:
    """The devices the blocks run on: ``devices`` (a 1-D mesh), or ``mesh`` (already full,
    :func:`jaxspec.nn.sharding.full_mesh`: its ``data`` axis; its ``model`` axis splits each
    block's forwards as generate splits them)."""
    if mesh is not None:  # the configurations were built on it (build_config checked it, the drafter's part too)
        devices = tuple(mesh.devices.flat)
        setup = dataclasses.replace(setup, **{f: dataclasses.replace(getattr(setup, f), split_rows=False)
                                              for f in ("spec_cfg", "first_cfg", "ar_cfg")})
    devices = tuple(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("devices: expected at least one device")
    return setup, mesh, devices


def _rule_names(run: _Run) -> tuple[str, str]:
    """The rule as resolved ("auto" -> its pick) and the rule the acceptance is compared
    with (a mutant's: the rule it breaks)."""
    resolved = rules.rule_name(rules.resolve_rule(run.rule, run.setup.spec_cfg.tree))
    if run.mutant is not None and mutants.MUTANT_RULE[run.mutant] != "token":
        return resolved, mutants.MUTANT_RULE[run.mutant]
    return resolved, resolved


def _acceptance_expectation(run: _Run, timings: dict) -> tuple[np.ndarray | None, str]:
    """The first round's exact acceptance per depth where it is enumerated, else None and
    a note saying why it is observed only."""
    cfg, label = run.setup.spec_cfg, _rule_names(run)[1]
    if isinstance(cfg.tree, DynamicTree):
        return None, "acceptance expectation not enumerated for dynamic trees (observed only)"
    if not isinstance(run.draft, nnx.Module):
        return None, "acceptance expectation not enumerated for a drafter other than a model (observed only)"
    if label not in ("token", "block"):
        return None, f"acceptance expectation not enumerated for rule {label!r} (observed only)"
    t0 = time.perf_counter()
    try:
        return expected_acceptance(run.target, run.draft, run.prompt, cfg.tree, cfg.scheme, run.setup.target_warp,
                                   run.setup.draft_warp, rule=label), ""
    except ValueError as e:
        return None, f"acceptance expectation not enumerated: {e}"
    finally:
        timings["expected_acceptance_s"] = time.perf_counter() - t0


def _draw(run: _Run, law: ExactLaw | None, check_acceptance: bool, progress: bool, timings: dict) -> dict:
    """The counts of the speculative, target-only and (with ``check_acceptance``)
    first-round runs, each ``num_samples`` rows in blocks over the devices. Without a
    ``law`` (the sampled path) the speculative and target-only runs keep their tokens
    (``samples`` int32[S, L]) instead of joint cells."""
    setup, spec_cfg = run.setup, run.setup.spec_cfg
    states = (nnx.split(run.target)[1], run.dparams)  # the draft's params (None for a drafter without)
    check_drafter_output(spec_cfg.draft_def, states[1], run.target, tree=spec_cfg.tree, scheme=spec_cfg.scheme,
                         warp=spec_cfg.draft_warp, batch=run.chunk, width=setup.widths["spec"],
                         capacity=spec_cfg.capacity, budget=spec_cfg.max_new_tokens)
    if run.mesh is not None:
        states = (sharding.shard_state(states[0], run.target.config, run.mesh),
                  sharding.shard_params(states[1], getattr(spec_cfg.draft_def, "config", None), run.mesh))
    temps = (setup.temperature, setup.draft_temperature)
    base = jax.random.key(run.seed)
    levels = None if law is None else tuple((jnp.asarray(p), jnp.asarray(t)) for p, t in law.levels)
    common = dict(prompt=run.prompt, horizon=run.horizon, vocab=run.target.config.vocab_size, levels=levels,
                  num_samples=run.num_samples, chunk=run.chunk, devices=run.devices, progress=progress, mesh=run.mesh)
    runs = [("spec", "speculative", spec_cfg, gen.speculative_program, states, temps),
            ("ar", "target_only", setup.ar_cfg, gen.autoregressive_program, states[:1], temps[:1])]
    if check_acceptance:
        runs.append(("first", "first_round", setup.first_cfg, gen.speculative_program, states, temps))
    counts = {}
    for i, (kind, name, cfg, program, st, tt) in enumerate(runs):
        counts[kind], timings[name] = count_samples(kind, cfg, program, st, tt, jax.random.fold_in(base, i),
                                                    desc=name.replace("_", " "), width=setup.widths[kind], **common)
    return counts


def _config(run: _Run, **extra) -> dict:
    """The report's ``config``: what was tested, as resolved (and ``extra``: the method)."""
    setup, spec_cfg = run.setup, run.setup.spec_cfg
    t_warp, d_warp = setup.target_warp, setup.draft_warp
    return extra | {
        "tree": run.tree if isinstance(run.tree, str) else str(spec_cfg.tree),
        "tree_resolved": str(spec_cfg.tree),
        "scheme": spec_cfg.scheme,
        "drafter": type(spec_cfg.draft_def).__name__,
        "rule": _rule_names(run)[0],
        # at temperature 0 the target law is a single sequence: the tests can only see whether
        # the decoder emits it, not whether it would sample the law at any other temperature
        "scope": (GREEDY_SCOPE if setup.temperature == 0.0 else None),
        "temperature": setup.temperature,
        "top_k": t_warp["top_k"],
        "top_p": t_warp["top_p"],
        "min_p": t_warp["min_p"],
        "draft_temperature": setup.draft_temperature,
        "draft_top_k": d_warp["top_k"],
        "draft_top_p": d_warp["top_p"],
        "draft_min_p": d_warp["min_p"],
        "prompt": list(run.prompt),
        "horizon": run.horizon,
        "vocab_size": run.target.config.vocab_size,
        "num_samples": run.num_samples,
        "chunk_size": run.chunk,
        "prompt_bucket": run.prompt_bucket,
        "devices": len(run.devices),
        "mesh": (sharding.mesh_shape(run.mesh) if run.mesh is not None else {"data": len(run.devices), "model": 1}),
        "platform": run.devices[0].platform,
        "seed": run.seed,
        "mutant": run.mutant,
        "mutant_bug": None if run.mutant is None else mutants.describe(run.mutant),
    }
