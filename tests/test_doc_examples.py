"""Usage examples in the docstrings of ``jaxspec/*.py``, run as written (same code, same
arguments) and held to the result each docstring states.

Examples that another test already runs with the stated result are not repeated here:

* optimize (module): ``optimize_tree([.6, .2, .1], 6, 3)`` -> test_optimize.py::test_literal_example
* optimize.expected_accepted (chain of 5, [0.7]) -> test_optimize.py::test_expected_accepted_by_hand
* autotree.tabulate -> test_autotree.py::test_docstring_example
* masks (module) -> test_masks.py::test_tree_cache_mask_literal, ::test_causal_cache_mask_literal
* tree (module), tree_paths, tree_children -> test_tree.py::test_mask_branching_literal,
  ::test_depths_paths_children
* treespec (module), relabeled tree -> test_generate.py::test_static_tree_breadth_first_relabel;
  ``"4"``, ``"parents:-1,0,0,1"``, ``"dynamic:..."`` ->
  test_generate.py::test_resolve_and_parse_tree, ::test_parse_dynamic_tree
* config ``ModelConfig.from_dict`` (HF keys, unknown ignored) ->
  test_model.py::test_config_defaults_and_dict_roundtrip
* sampling.top_p_mask, warp_probs, sibling_laws, draw_deterministic -> test_sampling.py::
  test_top_p_boundary_and_ties, ::test_warp_order_temperature_then_top_k_then_top_p,
  ::test_sibling_laws_literal_and_duplicates, ::test_deterministic_draw
* stats.total_variation, min_detectable_tv, bonferroni -> test_stats.py::test_distances_and_bounds,
  ::test_bonferroni_table_and_str
* tokenizer ``encode("é!")``, ``decode([195])`` -> test_tokenizer.py::test_literal_example,
  ::test_decode_invalid_utf8_is_replaced
"""

import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import tiny_pair

import jaxspec
from jaxspec.tuning import autotree
from jaxspec.exactness import stats
from jaxspec.core.rules import speculative_accept
from jaxspec.nn.config import ModelConfig
from jaxspec.tuning.optimize import branching_widths, measure_acceptance, node_probabilities, optimize_tree
from jaxspec.core.sampling import (
    draw_without_replacement,
    sample_categorical,
    top_k_mask,
    validate_warp_args,
    warp_probs,
)
from jaxspec.formats.tokenizer import ByteTokenizer
from jaxspec.core.tree import tree_depths, validate_parents
from jaxspec.core.treespec import DynamicTree, resolve_tree

from jaxspec.decode import generate as gen

F, T = False, True


def _py(x):
    """Arrays -> nested lists, so that ``==`` compares values exactly."""
    return np.asarray(x).tolist() if isinstance(x, (np.ndarray, jax.Array)) else x


def _level_sizes(tree):
    return [end - start for start, end in tree.levels]


# (docstring example, expected value as the docstring states it); compared with ``==``.
EXACT = [
    pytest.param(
        lambda: ModelConfig(vocab_size=8, hidden_size=32, intermediate_size=64,
                            num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2).head_dim,
        8, id="config.ModelConfig.head_dim"),
    pytest.param(  # (257,) for the embedded models: test_checkpoint.py::test_embedded_models
        lambda: ModelConfig(vocab_size=8, hidden_size=32, intermediate_size=64,
                            num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2).eos_token_ids,
        (), id="config.ModelConfig.eos_token_ids"),
    pytest.param(lambda: node_probabilities([-1, -1, 0], [.6, .3]), [.6, .3, .36],
                 id="optimize.node_probabilities"),
    pytest.param(lambda: branching_widths(6, 3),
                 [(1, 1, 4), (1, 5), (2, 1, 1), (2, 2), (3, 1), (6,)],
                 id="optimize.branching_widths"),
    pytest.param(lambda: top_k_mask([1., 3., 3., 3.], 2), [F, T, T, F], id="sampling.top_k_mask"),
    pytest.param(lambda: stats.chisquare_two_sample([40, 60], [400, 600]).pvalue, 1.0,
                 id="stats.chisquare_two_sample"),
    pytest.param(lambda: stats.table([12, 8], [10, 10]),
                 "cell    observed      expected  (o-e)/sqrt(e)\n"
                 "   0          12         10.00          +0.63\n"
                 "   1           8         10.00          -0.63",
                 id="stats.table"),
    pytest.param(lambda: ByteTokenizer().encode("a", add_bos=True), [256, 97],
                 id="tokenizer.ByteTokenizer.encode-add_bos"),
    pytest.param(lambda: ByteTokenizer().decode([256, 195, 169, 33]), "é!",
                 id="tokenizer.ByteTokenizer.decode-skips-specials"),
    # treespec module: "original parents [-1, 0, -1, 1] depths [1, 2, 1, 3]"
    pytest.param(lambda: tree_depths([-1, 0, -1, 1]), [1, 2, 1, 3], id="treespec.original-depths"),
    # treespec module: the accepted forms of ``generate(tree=...)``
    pytest.param(lambda: resolve_tree(4).parents, (-1, 0, 1, 2), id="treespec.resolve_tree-chain"),
    pytest.param(lambda: _level_sizes(resolve_tree((3, 2, 1))), [3, 6, 6],
                 id="treespec.resolve_tree-branching"),
    pytest.param(lambda: resolve_tree([-1, 0, 0, 1]).parents, (-1, 0, 0, 1),
                 id="treespec.resolve_tree-parents"),
    pytest.param(lambda: resolve_tree(DynamicTree(depth=4, topk=4, num_nodes=16)),
                 DynamicTree(4, 4, 16), id="treespec.resolve_tree-dynamic"),
    pytest.param(lambda: resolve_tree("chain:4"), resolve_tree(4),
                 id="treespec.resolve_tree-chain:4"),
    pytest.param(lambda: resolve_tree("branch:3,2,1"), resolve_tree((3, 2, 1)),
                 id="treespec.resolve_tree-branch:3,2,1"),
]


@pytest.mark.parametrize("example, expected", EXACT)
def test_inline_example(example, expected):
    assert _py(example()) == expected


def test_acceptance_speculative_accept():
    p = jnp.full((3, 4), 0.25)
    r = speculative_accept(jax.random.key(0), [-1, 0], jnp.array([1, 2]), p, p,
                           scheme="iid")
    # r.num_tokens == 3, r.tokens[:2] == [1, 2], r.tokens[2] = bonus token
    assert int(r.num_tokens) == 3
    assert _py(r.tokens[:2]) == [1, 2]
    assert 0 <= int(r.tokens[2]) < 4


def test_sampling_module_example():
    probs = warp_probs(jnp.log(jnp.array([0.1, 0.4, 0.2, 0.3])), top_k=2)
    # keeps tokens 1 and 3: [0, 4/7, 0, 3/7]
    np.testing.assert_allclose(probs, [0, 4 / 7, 0, 3 / 7], atol=1e-6)
    assert _py(probs == 0) == [T, F, T, F]
    tokens, laws = draw_without_replacement(jax.random.key(0), probs, 2)
    # tokens is a permutation of [1, 3]; laws[0] = probs, laws[1] = one-hot(tokens[1])
    assert sorted(_py(tokens)) == [1, 3]
    np.testing.assert_array_equal(laws[0], probs)
    np.testing.assert_array_equal(laws[1], jax.nn.one_hot(tokens[1], 4))


def test_sampling_validate_warp_args():
    msg = "temperature = -1.0: expected a finite number >= 0 (0 means greedy)"
    with pytest.raises(jaxspec.SettingError, match=f"^{re.escape(msg)}$"):
        validate_warp_args(temperature=-1.0)


def test_sampling_sample_categorical():
    x = sample_categorical(jax.random.key(0), jnp.array([0., 2., 0., 1.]))  # 1 or 3
    assert int(x) in (1, 3)


def test_stats_module_example():
    counts = np.bincount(np.random.default_rng(0).integers(0, 4, 10_000), minlength=4)
    r = stats.chisquare_gof(counts, np.full(4, 0.25))
    assert re.fullmatch(r"chi2=\S+ dof=3 p=\S+ n=10000", str(r))  # print(r)
    assert r.pvalue > stats.bonferroni(1e-4, m=1), str(r) + "\n" + r.table()


def test_stats_chisquare_gof_pooling():
    r = stats.chisquare_gof([50, 30, 15, 3, 2], [.5, .3, .15, .03, .02])
    # cells 3 and 4 (expected 3 and 2) form one cell of expected 5; dof = 3
    assert r.pooled_cells == (3, 4) and r.dof == 3
    np.testing.assert_allclose(r.expected, [50, 30, 15, 5])


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(0, vocab_size=8)


def test_optimize_measure_acceptance(pair):
    target, draft = pair
    windows = np.random.default_rng(0).integers(0, 8, size=(2, 8)).astype(np.int32)
    est = measure_acceptance(target, draft, windows, max_rank=4, scheme="deterministic")
    tree = optimize_tree(est.mean, budget=32, max_depth=8).parents
    assert est.mean.shape == (4,) and np.all((est.mean >= 0) & (est.mean <= 1))
    assert validate_parents(tree).shape == (32,) and int(tree_depths(tree).max()) <= 8


def test_generate_build_config(pair):
    target, draft = pair
    from jaxspec.decode.as_drafter import as_drafter

    drafter = as_drafter(draft)[0]
    cfg, t, dt = gen.build_config(target, drafter, prompt_length=3, max_new_tokens=8, tree=3)
    assert cfg.capacity == 15  # 3 prompt + 8 new + 3 tree nodes + 1
    assert cfg == gen.build_config(target, drafter, prompt_length=3, max_new_tokens=8,
                                   tree="chain:3")[0]
    hash(cfg)


def test_autotree_module_example(monkeypatch, tmp_path):
    """The example as written, except that the device timings are replaced by a made-up
    linear cost (real ones take seconds to minutes on CPU and are not deterministic; they
    are exercised in test_autotree.py) and the cache lives in ``tmp_path``. The final
    ``generate`` call (a compile of the 6-layer pair) is only bound to the signature; its
    ``tree=res.parents`` is checked to read as explicit parents."""
    monkeypatch.setenv("JAXSPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotree, "measure_target_step", lambda target, **kw: 1e-3)
    monkeypatch.setattr(autotree, "measure_round_cost", lambda target, draft, tree, **kw:
                        autotree.RoundCost(1e-3, 1e-3 + 1e-4 * tree.num_nodes))

    def example():
        return jaxspec.auto_tree(target, draft, scheme="deterministic", sampling=jaxspec.Sampling(temperature=1.0),
                                 budgets=(2, 4, 8), max_depth=6, key=jax.random.key(0))

    target = jaxspec.load_model("default-target")
    draft = jaxspec.load_model("default-draft")
    res = example()
    # the first call measures, later calls read the cache
    assert not res.from_cache and res.cache_path.startswith(str(tmp_path))
    assert res.target_step_s == 1e-3  # the stand-in timings were used
    again = example()
    assert again.from_cache and again == res
    assert [r.budget for r in res.rows] == [2, 4, 8] and res.budget in (2, 4, 8)
    head = res.table().splitlines()[0]  # N, depth, predicted tau, round ms, tokens/s, speedup
    for column in ("N", "depth", "pred tau", "round ms", "tokens/s", "speedup"):
        assert column in head
    inspect.signature(jaxspec.generate).bind(
        jax.random.key(1), target, draft, [[256, 100]], max_new_tokens=32, tree=res.parents,
        scheme="deterministic")
    assert resolve_tree(res.parents).parents == res.parents and len(res.parents) == res.budget
