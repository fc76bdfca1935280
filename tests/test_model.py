"""Model spec: tree verification == per-path causal logits == prefill/decode logits.

Tiny random float32 models (GQA 4 heads / 2 kv heads). Every consistency test compares
against ``forward_logits`` (the cache-free path), which itself is checked against an
independent float64 numpy transcription of HF Llama. A power test shows the tree test
fails for a causal triangle over the flattened tree.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec.nn.cache import commit, init_cache
from jaxspec.nn.config import ModelConfig
from jaxspec.nn.masks import causal_cache_mask, tree_cache_mask
from jaxspec.nn.model import Transformer, decode_step, forward_logits, init_model, prefill
from jaxspec.core.tree import chain, tree_depths, tree_mask, tree_paths, tree_positions

TOL = 1e-5
CFG = ModelConfig(
    vocab_size=8, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, rope_theta=10.0,
)
TREE = np.array([-1, -1, 0, 0, 1, 2, 2, 5, 5], np.int32)  # siblings at depths 1, 2, 3
PREFIXES = ([3, 1, 4, 1, 5], [2, 6, 5])  # two rows, different lengths


@pytest.fixture(autouse=True)
def _exact_matmuls():
    # float32 matmuls at full precision on every backend (GPUs may default to TF32).
    with jax.default_matmul_precision("highest"):
        yield


CAP = 20  # cache capacity used throughout (one compile per shape)
REF_SHAPE = (24, 16)  # reference batches are padded to this shape (one compile)

# Jitted entry points (eager dispatch compiles every op per shape: far slower on CPU).
_fwd = nnx.jit(forward_logits)
_prefill = nnx.jit(prefill, static_argnames="capacity")
_decode = nnx.jit(decode_step)
_call = nnx.jit(lambda m, tokens, positions, cache, mask: m(tokens, positions, cache, mask))


@pytest.fixture(scope="module")
def model():
    return init_model(CFG, jax.random.key(0))


def _pad(seqs, fill=0, shape=None):
    shape = shape or (len(seqs), max(len(s) for s in seqs))
    out = np.full(shape, fill, np.int32)
    for b, s in enumerate(seqs):
        out[b, : len(s)] = s
    return jnp.asarray(out), jnp.asarray([len(s) for s in seqs], jnp.int32)


def _reference_last(model, seqs):
    """forward_logits at the last real token of each sequence, in one right-padded call."""
    assert len(seqs) <= REF_SHAPE[0] and max(map(len, seqs)) <= REF_SHAPE[1]
    tokens, _ = _pad(seqs, shape=REF_SHAPE)
    logits = np.asarray(_fwd(model, tokens))  # [R, T, V]
    return logits[np.arange(len(seqs)), [len(s) - 1 for s in seqs]]


def _node_tokens(key, n):
    return jax.random.randint(key, (len(PREFIXES), n), 0, CFG.vocab_size, jnp.int32)


def _tree_forward(model, parents, node_tokens, *, mask_tree=None, positions=None, call=_call):
    """Prefill PREFIXES, then one forward over the N tree nodes. Returns (logits, cache)."""
    tokens, lengths = _pad(PREFIXES, fill=7)
    _, cache = _prefill(model, tokens, lengths, CAP)
    tm = tree_mask(parents) if mask_tree is None else mask_tree
    pos = tree_positions(parents, cache.lengths) if positions is None else positions
    mask = tree_cache_mask(cache.lengths, tm, CAP)
    return call(model, node_tokens, pos, cache, mask)


def _tree_reference(model, parents, node_tokens):
    """[B, N, V]: forward_logits(prefix + root-to-node path) at the node."""
    paths = np.asarray(tree_paths(parents))
    toks = np.asarray(node_tokens)
    seqs = [
        list(PREFIXES[b]) + [int(toks[b, j]) for j in paths[i] if j >= 0]
        for b in range(len(PREFIXES))
        for i in range(len(parents))
    ]
    return _reference_last(model, seqs).reshape(len(PREFIXES), len(parents), -1)


# --------------------------------------------------------------------------- reference
def _np_llama(model: Transformer, tokens) -> np.ndarray:
    """Float64 numpy transcription of HF ``LlamaForCausalLM`` (one sequence, [T] -> [T, V])."""
    cfg = model.config
    p = lambda x: np.asarray(x[...], np.float64)  # noqa: E731
    h_, kv_, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    t = len(tokens)

    def rms(x, w):
        return w * (x / np.sqrt(np.mean(x * x, -1, keepdims=True) + cfg.rms_norm_eps))

    def rotate_half(x):
        return np.concatenate([-x[..., hd // 2 :], x[..., : hd // 2]], -1)

    def lin(mod, x):
        y = x @ p(mod.kernel)
        return y + p(mod.bias) if getattr(mod, "bias", None) is not None else y

    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2) / hd))
    freqs = np.outer(np.arange(t), inv_freq)
    emb = np.concatenate([freqs, freqs], -1)
    cos, sin = np.cos(emb)[None], np.sin(emb)[None]  # [1, T, hd]
    causal = np.tril(np.ones((t, t), bool))

    x = p(model.embed_tokens.embedding)[np.asarray(tokens)]
    for layer in model.layers:
        a = layer.self_attn
        h = rms(x, p(layer.input_layernorm.weight))
        q = lin(a.q_proj, h).reshape(t, h_, hd).transpose(1, 0, 2)  # [H, T, hd]
        k = lin(a.k_proj, h).reshape(t, kv_, hd).transpose(1, 0, 2)
        v = lin(a.v_proj, h).reshape(t, kv_, hd).transpose(1, 0, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = np.repeat(k, h_ // kv_, axis=0), np.repeat(v, h_ // kv_, axis=0)  # repeat_kv
        s = np.where(causal, q @ k.transpose(0, 2, 1) * hd**-0.5, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        o = (w / w.sum(-1, keepdims=True)) @ v  # [H, T, hd]
        x = x + lin(a.o_proj, o.transpose(1, 0, 2).reshape(t, h_ * hd))
        h = rms(x, p(layer.post_attention_layernorm.weight))
        g = lin(layer.mlp.gate_proj, h)
        x = x + lin(layer.mlp.down_proj, g / (1 + np.exp(-g)) * lin(layer.mlp.up_proj, h))
    x = rms(x, p(model.norm.weight))
    head = p(model.embed_tokens.embedding).T if model.lm_head is None else p(model.lm_head.kernel)
    return x @ head


@pytest.mark.parametrize("variant", ["base", "tied+bias"])
def test_forward_logits_matches_numpy_hf_llama(model, variant):
    m = model
    if variant != "base":
        cfg = dataclasses.replace(CFG, tie_word_embeddings=True, attention_bias=True)
        m = init_model(cfg, jax.random.key(1))
        # non-zero biases so that they matter
        for proj in ("q_proj", "k_proj", "v_proj"):
            mod = getattr(m.layers[0].self_attn, proj)
            mod.bias[...] = jax.random.normal(jax.random.key(2), mod.bias.shape)
    tokens = [1, 5, 2, 7, 0, 3, 3]
    got = np.asarray(_fwd(m, jnp.asarray([tokens])))[0]
    np.testing.assert_allclose(got, _np_llama(m, tokens), atol=2e-5, rtol=0)


# --------------------------------------------------------------------------- tree verify
@pytest.mark.parametrize("parents", [chain(5), TREE], ids=["chain", "tree"])
def test_tree_verify_equals_per_path_causal(model, parents):
    node_tokens = _node_tokens(jax.random.key(3), len(parents))
    logits, cache = _tree_forward(model, parents, node_tokens)
    assert logits.dtype == jnp.float32 and logits.shape == (2, len(parents), CFG.vocab_size)
    np.testing.assert_array_equal(np.asarray(cache.lengths), [5, 3])  # forward never commits
    ref = _tree_reference(model, parents, node_tokens)
    assert np.abs(np.asarray(logits) - ref).max() <= TOL


def test_tree_verify_power_causal_triangle_and_flat_positions(model):
    """The test above can fail: a causal triangle over the flattened tree, or positions
    from the flat index instead of depth, change the logits of deep nodes."""
    n = len(TREE)
    node_tokens = _node_tokens(jax.random.key(3), n)
    ref = _tree_reference(model, TREE, node_tokens)
    deep = np.asarray(tree_depths(TREE)) >= 2

    tril, _ = _tree_forward(model, TREE, node_tokens, mask_tree=jnp.tril(jnp.ones((n, n), bool)))
    assert np.abs(np.asarray(tril) - ref)[:, deep].max() > 1e-3

    flat_pos = jnp.asarray([[len(p) + i for i in range(n)] for p in PREFIXES], jnp.int32)
    flat, _ = _tree_forward(model, TREE, node_tokens, positions=flat_pos)
    assert np.abs(np.asarray(flat) - ref)[:, deep].max() > 1e-3


def test_tree_verify_jit_traced_parents_no_retrace(model):
    node_tokens = _node_tokens(jax.random.key(4), len(TREE))
    eager, _ = _tree_forward(model, TREE, node_tokens, call=lambda m, *a: m(*a))

    tokens, lengths = _pad(PREFIXES, fill=7)
    _, cache = _prefill(model, tokens, lengths, CAP)
    graphdef, state = nnx.split(model)
    traces = []

    @jax.jit
    def verify(state, parents, node_tokens, cache):
        traces.append(1)
        m = nnx.merge(graphdef, state)
        pos = tree_positions(parents, cache.lengths)
        mask = tree_cache_mask(cache.lengths, tree_mask(parents), cache.capacity)
        return m(node_tokens, pos, cache, mask)

    jitted, _ = verify(state, jnp.asarray(TREE), node_tokens, cache)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(eager), atol=TOL, rtol=0)
    # another topology with the same N: same compiled function, correct logits
    other = jnp.asarray([-1, 0, 0, 1, -1, 4, 2, 6, 3], jnp.int32)
    logits, _ = verify(state, other, node_tokens, cache)
    assert len(traces) == 1
    ref = _tree_reference(model, np.asarray(other), node_tokens)
    assert np.abs(np.asarray(logits) - ref).max() <= TOL


# --------------------------------------------------------------------------- commit
def test_commit_path_then_decode_equals_scratch(model):
    node_tokens = _node_tokens(jax.random.key(5), len(TREE))
    _, cache = _tree_forward(model, TREE, node_tokens)
    paths = [[0, 2, 5], [1, 4]]  # root-to-leaf / root-to-node paths, different lengths
    offsets = jnp.asarray([[0, 2, 5], [1, 4, -1]], jnp.int32)
    cache = jax.jit(commit)(cache, offsets, jnp.asarray([3, 2], jnp.int32))
    np.testing.assert_array_equal(np.asarray(cache.lengths), [8, 5])

    toks = np.asarray(node_tokens)
    seqs = [list(PREFIXES[b]) + [int(toks[b, j]) for j in paths[b]] for b in range(2)]
    for bonus in ([6, 1], [2, 0]):  # two decode steps after the commit
        logits, cache = _decode(model, cache, jnp.asarray(bonus, jnp.int32))
        seqs = [s + [t] for s, t in zip(seqs, bonus)]
        assert np.abs(np.asarray(logits) - _reference_last(model, seqs)).max() <= TOL
    np.testing.assert_array_equal(np.asarray(cache.lengths), [10, 7])


# --------------------------------------------------------------------------- prefill/decode
def test_prefill_then_decode_equals_full_forward(model):
    full = [[1, 2, 3, 4, 5, 6, 7, 0], [4, 4, 2, 5, 1, 0]]
    prompt_lens = [4, 2]
    tokens, lengths = _pad([f[:n] for f, n in zip(full, prompt_lens)], fill=5, shape=(2, 5))
    logits, cache = _prefill(model, tokens, lengths, CAP)
    ref = [_reference_last(model, [f[: i + 1] for i in range(len(f))]) for f in full]
    for b, n in enumerate(prompt_lens):
        assert np.abs(np.asarray(logits[b, :n]) - ref[b][:n]).max() <= TOL
    for step in range(4):
        token = jnp.asarray([full[b][prompt_lens[b] + step] for b in range(2)], jnp.int32)
        out, cache = _decode(model, cache, token)
        for b, n in enumerate(prompt_lens):
            assert np.abs(np.asarray(out[b]) - ref[b][n + step]).max() <= TOL
    np.testing.assert_array_equal(np.asarray(cache.lengths), [8, 6])


def test_batch_rows_are_independent(model):
    prompts = [[1, 2, 3, 4, 5], [6, 1], [0, 7, 3]]
    conts = [[2, 2], [5, 3], [1, 6]]

    def run(ps, cs, fill):
        tokens, lengths = _pad(ps, fill=fill, shape=(len(ps), 5))
        logits, cache = _prefill(model, tokens, lengths, CAP)
        outs = [np.asarray(logits)]
        for step in range(2):
            out, cache = _decode(model, cache, jnp.asarray([c[step] for c in cs], jnp.int32))
            outs.append(np.asarray(out))
        return outs

    batched = run(prompts, conts, fill=7)
    batched_other_pad = run(prompts, conts, fill=2)
    for b, (p, c) in enumerate(zip(prompts, conts)):
        alone = run([p], [c], fill=0)
        n = len(p)
        np.testing.assert_allclose(batched[0][b, :n], alone[0][0, :n], atol=1e-6, rtol=0)
        np.testing.assert_allclose(batched_other_pad[0][b, :n], alone[0][0, :n], atol=1e-6, rtol=0)
        for step in (1, 2):
            np.testing.assert_allclose(batched[step][b], alone[step][0], atol=1e-6, rtol=0)
            np.testing.assert_allclose(batched_other_pad[step][b], alone[step][0], atol=1e-6, rtol=0)


def test_fully_masked_row_is_finite(model):
    cache = init_cache(CFG, 2, CAP)
    n = len(TREE)
    mask = jnp.zeros((2, n, CAP), bool).at[0].set(causal_cache_mask(jnp.array([0]), n, CAP)[0])
    pos = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (2, n))
    logits, _ = _call(model, jnp.ones((2, n), jnp.int32), pos, cache, mask)
    assert np.isfinite(np.asarray(logits)).all()


# --------------------------------------------------------------------------- variants
def _param_paths(m):
    return {tuple(p) for p, _ in nnx.to_flat_state(nnx.state(m, nnx.Param))}


@pytest.mark.parametrize("variant", ["tied", "bias", "bf16"])
def test_variants(variant):
    kw = {"tied": dict(tie_word_embeddings=True), "bias": dict(attention_bias=True), "bf16": dict(dtype="bfloat16")}
    cfg = dataclasses.replace(CFG, num_hidden_layers=1, **kw[variant])
    m = init_model(cfg, jax.random.key(7))
    paths = _param_paths(m)
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(m, nnx.Param)))
    assert n_params == cfg.num_params()
    assert (("lm_head", "kernel") in paths) == (variant != "tied")
    assert (("layers", 0, "self_attn", "q_proj", "bias") in paths) == (variant == "bias")
    assert ("layers", 0, "self_attn", "o_proj", "bias") not in paths
    assert {("embed_tokens", "embedding"), ("norm", "weight"), ("layers", 0, "mlp", "gate_proj", "kernel"),
            ("layers", 0, "input_layernorm", "weight"), ("layers", 0, "post_attention_layernorm", "weight")} <= paths
    assert m.layers[0].self_attn.q_proj.kernel.shape == (cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim)

    seq = jnp.asarray([[1, 2, 3, 4, 5]], jnp.int32)
    logits, cache = _prefill(m, seq[:, :3], jnp.asarray([3]), capacity=6)
    out, cache = _decode(m, cache, seq[:, 3])
    ref = _fwd(m, seq[:, :4])
    assert logits.dtype == out.dtype == ref.dtype == jnp.float32
    assert np.isfinite(np.asarray(out)).all() and np.isfinite(np.asarray(logits)).all()
    tol = TOL if variant != "bf16" else 1e-2
    assert np.abs(np.asarray(out[0]) - np.asarray(ref[0, 3])).max() <= tol
    if variant == "bf16":
        assert m.embed_tokens.embedding.dtype == jnp.bfloat16
        assert m.layers[0].mlp.up_proj.kernel.dtype == jnp.bfloat16
        assert cache.k.dtype == jnp.bfloat16


def test_forward_shape_errors_name_the_argument(model):
    cache = init_cache(CFG, 2, 6)
    tok = jnp.zeros((2, 3), jnp.int32)
    with pytest.raises(ValueError, match="attention_mask"):
        model(tok, tok, cache, jnp.ones((2, 3, 5), bool))
    with pytest.raises(ValueError, match="positions"):
        model(tok, tok[:, :2], cache, jnp.ones((2, 3, 6), bool))
    with pytest.raises(ValueError, match="capacity"):
        prefill(model, tok, jnp.asarray([3, 3]), capacity=2)


# --------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "change, field",
    [
        (dict(vocab_size=0), "vocab_size"),
        (dict(hidden_size=-4), "hidden_size"),
        (dict(num_hidden_layers=1.5), "num_hidden_layers"),
        (dict(num_key_value_heads=3), "num_key_value_heads"),
        (dict(hidden_size=30, head_dim=None), "hidden_size"),
        (dict(head_dim=7, hidden_size=30), "head_dim"),
        (dict(dtype="float16"), "dtype"),
        (dict(rope_theta=0.0), "rope_theta"),
        (dict(rms_norm_eps=-1.0), "rms_norm_eps"),
        (dict(rope_theta=float("inf")), "rope_theta"),
        (dict(rms_norm_eps=1e300), "rms_norm_eps"),  # every logit would be 0
        (dict(tie_word_embeddings="yes"), "tie_word_embeddings"),
    ],
)
def test_config_validation_names_field(change, field):
    with pytest.raises(ValueError, match=field) as e:
        dataclasses.replace(CFG, **change)
    assert repr(next(iter(change.values())))[:3] in str(e.value)  # the bad value is shown


def test_config_defaults_and_dict_roundtrip():
    cfg = ModelConfig(vocab_size=10, hidden_size=24, intermediate_size=8, num_hidden_layers=1,
                      num_attention_heads=6, num_key_value_heads=None, dtype=jnp.bfloat16)
    assert cfg.head_dim == 4 and cfg.num_key_value_heads == 6 and cfg.dtype == "bfloat16"
    assert cfg.rope_theta == 10000.0 and cfg.rms_norm_eps == 1e-6 and cfg.max_position_embeddings == 2048
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    hf = dict(CFG.to_dict(), architectures=["LlamaForCausalLM"], torch_dtype="bfloat16",
              hidden_act="silu", rope_scaling=None, model_type="llama")
    del hf["dtype"], hf["head_dim"]
    assert ModelConfig.from_dict(hf) == CFG
    with pytest.raises(ValueError, match="rope_scaling"):
        ModelConfig.from_dict(dict(hf, rope_scaling={"rope_type": "llama3", "factor": 8.0}))
    with pytest.raises(ValueError, match="vocab_size"):
        ModelConfig.from_dict({k: v for k, v in hf.items() if k != "vocab_size"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        CFG.vocab_size = 9
    hash(CFG)


def test_entry_points_name_bad_tokens_lengths_and_a_full_cache():
    model = init_model(CFG, jax.random.key(0))
    with pytest.raises(ValueError, match=r"forward_logits: tokens.dtype = float32; expected integer token ids"):
        forward_logits(model, jnp.zeros((1, 3), jnp.float32))
    with pytest.raises(ValueError, match=r"prefill: tokens.dtype = float32"):
        prefill(model, jnp.zeros((1, 3), jnp.float32), jnp.array([3]), capacity=4)
    with pytest.raises(ValueError, match=r"prefill: lengths\[0\] = 5; expected a prompt length in \[0, T = 2\]"):
        prefill(model, jnp.array([[1, 2]]), jnp.array([5]), capacity=4)
    _, cache = prefill(model, jnp.array([[1, 2]]), jnp.array([2]), capacity=3)
    with pytest.raises(ValueError, match=r"decode_step: token.dtype = float32"):
        decode_step(model, cache, jnp.array([1.0]))
    _, cache = decode_step(model, cache, jnp.array([3]))  # fills the third and last slot
    with pytest.raises(ValueError, match=r"decode_step: cache.lengths\[0\] = 3: the cache is full \(capacity 3\)"):
        decode_step(model, cache, jnp.array([4]))
    with pytest.raises(ValueError, match=r"init_cache: dtype = int8; expected a floating dtype"):
        init_cache(CFG, 1, 4, dtype="int8")
