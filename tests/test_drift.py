"""The float drift between the verification forward and one-token forwards
(jaxspec/exactness/drift.py): both match the full causal forward on the default pair in
float32, chunk boundaries and positions included."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.exactness.drift import forward_drift, teacher_forced_logits
from jaxspec.exactness.harness import default_pair
from jaxspec.nn.model import forward_logits


@pytest.mark.parametrize("k", [0, 1, 3])
def test_one_token_and_chunked_forwards_match_the_full_forward(k):
    target, _ = default_pair(0)
    ids = [1, 2, 3, 0, 3, 1, 1, 2, 0, 3, 3, 2]
    one, chunked = teacher_forced_logits(target, ids, 3, k)
    n = ((len(ids) - 2) // (k + 1)) * (k + 1)
    assert one.shape == chunked.shape == (n, 4)
    full = np.asarray(forward_logits(target, jnp.asarray([ids], jnp.int32)))[0, 2:2 + n]  # laws after ids[2:]
    np.testing.assert_allclose(one, full, atol=1e-5)
    np.testing.assert_allclose(chunked, full, atol=1e-5)
    d = forward_drift(target, ids[:3], np.asarray([ids[3:]]), k)
    assert d["positions"] == n and d["chunk"] == k + 1 and d["max_abs_dlogit"] < 1e-5 and d["argmax_flips"] == 0
