"""Training a head from cached target features (jaxspec.training.feature_cache,
jaxspec.training.head_cached) on a tiny target: the cache against direct forwards, resuming a
stopped build, the reduced-vocabulary objective against its definition, and a short run
that raises acceptance, resumes bit for bit and exports a loadable reduced head."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import tiny_pair

from jaxspec.nn.head import load_head
from jaxspec.nn.model import forward_features
from jaxspec.training.feature_cache import SHARD, build_feature_cache, load_feature_cache
from jaxspec.training.head_cached import coverage, frequent_ids, train_head_cached
from jaxspec.training.train import TrainConfig

V = 16


@pytest.fixture(scope="module")
def target():
    return tiny_pair(11, vocab_size=V, hidden_size=16, num_heads=2, num_layers=2)[0]


def _sequences(n=SHARD + 9, seed=0):
    rng = np.random.default_rng(seed)
    # a skewed law (ids 0-5 common), so that a reduced vocabulary has something to cover
    return [list(rng.choice(V, size=int(rng.integers(20, 90)), p=np.r_[np.full(6, 0.13), np.full(10, 0.022)]))
            for _ in range(n)]


@pytest.fixture(scope="module")
def cache(target, tmp_path_factory):
    return build_feature_cache(target, _sequences(), tmp_path_factory.mktemp("cache"), progress=False)


def test_cache_holds_the_targets_features_and_normalizers(target, cache):
    seqs = _sequences()
    assert cache.num_sequences == len(seqs) and cache.tokens.size == sum(map(len, seqs))
    for i in (0, SHARD, len(seqs) - 1):  # first shard, second shard
        at = np.flatnonzero(cache.seq == i)
        np.testing.assert_array_equal(cache.tokens[at], seqs[i])
        f = forward_features(target, jnp.asarray([seqs[i]], jnp.int32))
        np.testing.assert_allclose(cache.feats[at].astype(np.float32), np.asarray(f)[0], atol=2e-3, rtol=2e-3)
        lse = np.asarray(jax.nn.logsumexp(target.unembed(f), axis=-1))[0]
        np.testing.assert_allclose(cache.lse[at], lse, atol=1e-4)


def test_a_stopped_build_resumes_and_another_targets_folder_is_refused(target, tmp_path):
    seqs = _sequences()
    full = build_feature_cache(target, seqs, tmp_path, progress=False)
    (tmp_path / "shard_00001.npz").unlink()  # stopped after the first shard
    with pytest.raises(FileNotFoundError, match="shard_00001.npz is missing"):
        load_feature_cache(tmp_path)
    again = build_feature_cache(target, seqs, tmp_path, progress=False)
    np.testing.assert_array_equal(again.feats, full.feats)
    other = tiny_pair(12, vocab_size=V, hidden_size=16, num_heads=2, num_layers=2)[0]
    with pytest.raises(ValueError, match="holds a cache with target_digest"):
        build_feature_cache(other, seqs, tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"sequences\[1\] = \[3\]; expected at least 2 token ids"):
        build_feature_cache(target, [[1, 2], [3]], tmp_path / "x", progress=False)


def test_frequent_ids_and_coverage(target, cache):
    ids = frequent_ids(cache, 6)
    assert set(ids.tolist()) == set(range(6))  # the common ids of _sequences
    cov = coverage(target, cache, {6: ids, V: np.arange(V)})
    assert cov[V] == pytest.approx(1.0, abs=1e-5) and 0 < cov[6] < 1
    with pytest.raises(ValueError, match="k = 0; expected an integer from 1"):
        frequent_ids(cache, 0)


def test_training_raises_acceptance_resumes_and_exports_a_reduced_head(target, cache, tmp_path):
    cfg = TrainConfig(steps=60, batch_size=4, seq_len=16, lr=1e-2, warmup_steps=5, eval_every=30,
                      checkpoint_every=30, eval_windows=4)
    ids = frequent_ids(cache, 8)
    full = train_head_cached(target, cache, cfg, tmp_path / "a", draft_vocab=ids, unroll=2, progress=False)
    assert full.alpha_after > full.alpha_before + 0.05, (full.alpha_before, full.alpha_after)
    assert full.history[-1]["alpha"] <= full.history[-1]["coverage"] + 1e-6  # acceptance under its ceiling
    head = load_head(full.final_dir)
    np.testing.assert_array_equal(np.asarray(head.draft_vocab.get_value()), ids)
    half = train_head_cached(target, cache, cfg, tmp_path / "b", draft_vocab=ids, unroll=2, progress=False,
                             stop_at=30)
    assert half.final_dir is None
    done = train_head_cached(target, cache, cfg, tmp_path / "b", draft_vocab=ids, unroll=2, progress=False,
                             resume=True)
    for a, b in zip(jax.tree.leaves(jax.tree.map(np.asarray, full.model)),
                    jax.tree.leaves(jax.tree.map(np.asarray, done.model))):
        np.testing.assert_array_equal(a, b)
