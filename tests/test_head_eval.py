"""Teacher-forced acceptance of a head (jaxspec.training.head_eval) against the decoder it
predicts: on the target's greedy answer, the tokens a greedy chain:k round commits by the
table equal what jaxspec.generate commits per round; depth 1 at T = 1 equals the overlap of
the two laws computed by hand; bad inputs are refused by name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import tiny_head, tiny_pair

import jaxspec
from jaxspec.nn.head import head_config, init_head
from jaxspec.nn.model import forward_features
from jaxspec.training.head_eval import acceptance_by_depth


@pytest.fixture(scope="module")
def pair():
    target = tiny_pair(5, vocab_size=6, hidden_size=16, num_heads=2, num_layers=2)[0]
    return target, tiny_head(target, seed=1)


@pytest.fixture(scope="module")
def multi(pair):
    """A multi-layer head whose taps matter: its fuse moved off the identity start."""
    target = pair[0]
    head = init_head(head_config(target.config), jax.random.key(7), feature_layers=(0,))
    w = head.fuse.kernel[...]
    head.fuse.kernel.set_value(w + 0.3 * jax.random.normal(jax.random.key(8), w.shape))
    return target, head


PROMPTS = [[1, 2, 3, 0, 4], [5, 1, 1, 2]]


@pytest.mark.parametrize("kind,k", [("last", 1), ("last", 3), ("multi", 2)])
def test_greedy_chain_tokens_are_what_greedy_decoding_commits_per_round(pair, multi, kind, k):
    """For a multi-layer head this also checks the decoder: the taps it passes and fuses give
    the drafts that teacher forcing (forward_taps) predicts."""
    target, head = pair if kind == "last" else multi
    greedy = jaxspec.Sampling(temperature=0.0)
    ar = jaxspec.generate_autoregressive(jax.random.key(0), target, PROMPTS, max_new_tokens=30, sampling=greedy)
    seqs = [p + np.asarray(ar.tokens[i, : int(ar.lengths[i])]).tolist() for i, p in enumerate(PROMPTS)]
    acc = acceptance_by_depth(head, target, seqs, [len(p) for p in PROMPTS], depths=3, greedy=True)
    spec = jaxspec.generate(jax.random.key(0), target, head, PROMPTS, max_new_tokens=30, tree=f"chain:{k}",
                            sampling=greedy)
    np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(ar.tokens))
    per_round = float(np.sum(spec.lengths)) / float(np.sum(spec.rounds))
    assert acc["chain_tokens"][k - 1] == pytest.approx(per_round, abs=1e-9)
    assert 0 < acc["depth_1"] < 1  # the table is not trivial: some drafts accepted, some not
    assert acc["positions"] == 60


def test_depth_one_at_t1_is_the_overlap_of_the_laws(pair):
    target, head = pair
    seq = [1, 2, 3, 0, 4, 4, 1, 0, 2]
    acc = acceptance_by_depth(head, target, [seq], [4], depths=1)
    toks = jnp.asarray([seq], jnp.int32)
    feats = forward_features(target, toks)
    p = jax.nn.softmax(target.unembed(feats), -1)[0]
    q = jax.nn.softmax(head.logits(target, head.teacher_forced(target, toks, feats)), -1)[0]
    want = np.mean(np.asarray(jnp.sum(jnp.minimum(p, q), -1))[3:8])  # positions drafting tokens 4 .. 8
    assert acc["depth_1"] == pytest.approx(float(want), rel=1e-5)
    assert "chain_tokens" not in acc and acc["positions"] == 5


@pytest.mark.parametrize("seqs, lens, match", [
    ([[1, 2, 3]], [3], r"sequences\[0\] \(3 ids\) with prompt_len 3; expected ids in 0..5 and 1 <= prompt_len"),
    ([[1, 9, 3]], [1], r"sequences\[0\] \(3 ids\) with prompt_len 1; expected ids in 0..5"),
    ([[1, 2, 3]], [1, 1], "1 sequences and 2 prompt_lens"),
])
def test_bad_inputs_are_refused(pair, seqs, lens, match):
    with pytest.raises(ValueError, match=match):
        acceptance_by_depth(*pair, seqs, lens)
