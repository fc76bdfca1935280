"""Multi-layer feature heads (EAGLE-3): the target's taps (jaxspec.nn.model.forward_taps)
against a hand-written forward, the fused head starting as the last-layer head, its file round
trip, the feature cache's taps, and a short training run that uses them; bad layer lists are
refused by name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from _tiny import tiny_pair

from jaxspec.nn.head import head_config, init_head, load_head, save_head
from jaxspec.nn.model import forward_features, forward_taps
from jaxspec.training.feature_cache import build_feature_cache, load_feature_cache
from jaxspec.training.head_cached import train_head_cached
from jaxspec.training.train import TrainConfig

V = 16


@pytest.fixture(scope="module")
def target():
    return tiny_pair(11, vocab_size=V, hidden_size=16, num_heads=2, num_layers=3)[0]


def _tokens(b=2, t=7, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, V, (b, t)), jnp.int32)


def test_taps_are_the_unit_rms_residuals_after_each_layer(target):
    toks = _tokens()
    feats, taps = forward_taps(target, toks, (0, 1))
    np.testing.assert_array_equal(np.asarray(feats), np.asarray(forward_features(target, toks)))
    assert taps.shape == (2, 7, 2, 16)
    # by hand: a target cut after layer i has the residual after layer i as its last residual,
    # and the final norm with unit weights is the same unit-RMS scaling (eps aside)
    for col, i in enumerate((0, 1)):
        cut = nnx.clone(target)
        cut.layers = cut.layers[: i + 1]
        cut.norm.weight.set_value(jnp.ones_like(cut.norm.weight[...]))
        want = forward_features(cut, toks)
        np.testing.assert_allclose(np.asarray(taps[:, :, col]), np.asarray(want), rtol=1e-4, atol=1e-4)
    rms = np.sqrt(np.mean(np.asarray(taps) ** 2, axis=-1))
    np.testing.assert_allclose(rms, 1.0, rtol=1e-3)


@pytest.mark.parametrize("layers", [(), (3,), (1, 0), (0, 0), (-1,), "0,1"])
def test_bad_layer_lists_are_refused_by_name(target, layers):
    with pytest.raises(ValueError, match=r"forward_taps: feature_layers = .*expected increasing layer indices from 0 "
                                         r"to 2 \(the target has 3 layers\)"):
        forward_taps(target, _tokens(), layers)


def test_a_fused_head_starts_as_the_last_layer_head_and_round_trips(target, tmp_path):
    toks = _tokens()
    feats, taps = forward_taps(target, toks, (0, 1))
    multi = init_head(head_config(target.config), jax.random.key(3), feature_layers=(0, 1))
    single = init_head(head_config(target.config), jax.random.key(3))
    np.testing.assert_array_equal(np.asarray(multi.unrolled(target, toks, feats, 3, taps)),
                                  np.asarray(single.unrolled(target, toks, feats, 3)))
    # after a change of the tap weights it no longer is, and a saved head reloads the same
    multi.fuse.kernel.set_value(multi.fuse.kernel[...] + 0.05)
    moved = np.asarray(multi.unrolled(target, toks, feats, 2, taps))
    assert not np.allclose(moved, np.asarray(single.unrolled(target, toks, feats, 2)))
    back = load_head(save_head(multi, tmp_path / "h", target=target))
    assert back.feature_layers == (0, 1)
    np.testing.assert_array_equal(np.asarray(back.unrolled(target, toks, feats, 2, taps)), moved)
    with pytest.raises(ValueError, match=r"FeatureHead: feature_layers = \[1, 0\]; expected None or increasing"):
        init_head(head_config(target.config), jax.random.key(0), feature_layers=[1, 0])


def _sequences(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return [list(rng.choice(V, size=int(rng.integers(20, 60)), p=np.r_[np.full(6, 0.13), np.full(10, 0.022)]))
            for _ in range(n)]


def test_the_cache_keeps_taps_and_a_multi_layer_head_trains_on_them(target, tmp_path):
    seqs = _sequences()
    cache = build_feature_cache(target, seqs, tmp_path / "c", feature_layers=(0, 1), progress=False)
    assert cache.feature_layers == (0, 1) and cache.taps.shape == (cache.tokens.size, 2, 16)
    at = np.flatnonzero(cache.seq == 3)
    _, taps = forward_taps(target, jnp.asarray([seqs[3]], jnp.int32), (0, 1))
    np.testing.assert_allclose(cache.taps[at].astype(np.float32), np.asarray(taps)[0], atol=3e-3, rtol=3e-3)
    assert load_feature_cache(tmp_path / "c").taps.shape == cache.taps.shape
    with pytest.raises(ValueError, match="holds a cache with feature_layers"):  # one folder, one set of layers
        build_feature_cache(target, seqs, tmp_path / "c", feature_layers=(1,), progress=False)
    cfg = TrainConfig(steps=40, batch_size=4, seq_len=16, lr=1e-2, warmup_steps=4, eval_every=20,
                      checkpoint_every=20, eval_windows=4)
    r = train_head_cached(target, cache, cfg, tmp_path / "run", feature_layers=(1,), unroll=2, progress=False)
    assert r.alpha_after > r.alpha_before + 0.05, (r.alpha_before, r.alpha_after)
    head = load_head(r.final_dir)
    assert head.feature_layers == (1,)
    assert np.abs(np.asarray(head.fuse.kernel[...])[:16]).max() > 0  # the tap's block was trained
    plain = build_feature_cache(target, seqs, tmp_path / "plain", progress=False)
    with pytest.raises(ValueError, match=r"feature_layers = \(1,\); expected layers the feature cache holds"):
        train_head_cached(target, plain, cfg, tmp_path / "run2", feature_layers=(1,), progress=False)


def test_a_selection_of_sequences_is_their_own_cache(target, tmp_path):
    from jaxspec.training.feature_cache import select_sequences

    seqs = _sequences(12)
    cache = build_feature_cache(target, seqs, tmp_path / "c", feature_layers=(1,), progress=False)
    part = select_sequences(cache, [7, 2])
    assert part.num_sequences == 2 and part.digest != cache.digest
    np.testing.assert_array_equal(part.tokens, np.r_[seqs[7], seqs[2]])
    np.testing.assert_array_equal(part.seq, np.r_[np.zeros(len(seqs[7])), np.ones(len(seqs[2]))])
    at = np.flatnonzero(cache.seq == 2)
    np.testing.assert_array_equal(part.taps[len(seqs[7]):], cache.taps[at])
    np.testing.assert_array_equal(part.lse[len(seqs[7]):], cache.lse[at])
    with pytest.raises(ValueError, match=r"select_sequences: ids = 2 indices; expected distinct sequence indices in 0..11"):
        select_sequences(cache, [3, 3])
    # every sequence in order: the same arrays (a copy of SmolLM2's cache with taps is 2.8 GB),
    # under the selection's own digest, as the copying path would name it
    whole = select_sequences(cache, range(12))
    assert whole.feats is cache.feats and whole.taps is cache.taps and whole.seq is cache.seq
    assert whole.digest not in (cache.digest, select_sequences(cache, [1, 0, *range(2, 12)]).digest)
