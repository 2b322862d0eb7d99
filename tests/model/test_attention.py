"""Blockwise and fused attention equal the dense reference; the resolver picks the right kernel."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from rlvr_jax.model import attention as attn
from rlvr_jax.model import config as config_lib
from rlvr_jax.model import fused_attention as fused
from rlvr_jax.model import grouped, sharding
from rlvr_jax.model import transformer as tf

TINY = config_lib.PRESETS["tiny"]


# Inputs are host (numpy) arrays: random draws on the device would each compile a program.
def _normal(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _qkv(seed, B, T, S, H, K, Dh):
    return (
        _normal(seed, B, T, H, Dh),
        _normal(seed + 1, B, S, K, Dh),
        _normal(seed + 2, B, S, K, Dh),
    )


def _valid(B, S, padding):
    """Rows of real keys: left padding (prompts), right padding (completions), or both."""
    pads = np.arange(B) * 3 % max(S - 1, 1)
    idx = np.arange(S)[None, :]
    if padding == "left":
        return idx >= pads[:, None]
    if padding == "right":
        return idx < (S - pads)[:, None]
    return (idx >= pads[:, None]) & (idx < S - pads[::-1, None] // 2)


def _mask_BTS(valid_BS, T, offset):
    S = valid_BS.shape[1]
    mask = np.broadcast_to(valid_BS[:, None, :], (valid_BS.shape[0], T, S))
    if offset is None:
        return mask
    return mask & (np.arange(S)[None, :] <= np.arange(T)[:, None] + offset)[None]


def _dense(q, k, v, valid_BS, offset):
    """The reference: `transformer.attention` on the explicit (B, T, S) mask, and the lse."""
    mask = _mask_BTS(valid_BS, q.shape[1], offset)
    out = tf.attention(q, k, v, mask, TINY)
    B, T, H, Dh = q.shape
    K = k.shape[2]
    s = jnp.einsum("btkgd,bskd->btkgs", q.reshape(B, T, K, H // K, Dh), k) / math.sqrt(Dh)
    s = jnp.where(mask[:, :, None, None, :], s.astype(jnp.float32), -jnp.inf)
    return out, jax.nn.logsumexp(s, axis=-1).reshape(B, T, H)


def _value_and_grads(fn, q, k, v, ct, ct_lse=None):
    """fn's (out, lse) and the gradients w.r.t. q, k, v of <out, ct> (+ <lse, ct_lse>)."""

    def loss(q, k, v):
        out, lse = fn(q, k, v)
        total = jnp.sum(out.astype(jnp.float32) * ct)
        if ct_lse is not None:
            total += jnp.sum(jnp.where(ct_lse != 0, lse, 0.0) * ct_lse)
        return total, (out, lse)

    (_, (out, lse)), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(q, k, v)
    return out, lse, grads


CASES = [
    # (H, K, T, S, offset, block_q, block_k, padding)
    (2, 2, 32, 32, 0, 8, 8, "left"),  # H = K, blocks divide
    (4, 2, 37, 37, 0, 5, 7, "right"),  # GQA 2, blocks do not divide
    (8, 2, 20, 29, None, 16, 6, "left"),  # GQA 4, no causality, T != S
    # Prefill-like offset (13 new queries after 16 slots), a query block longer than T.
    (4, 2, 13, 29, 16, 64, 8, "both"),
]


@pytest.mark.parametrize("H,K,T,S,offset,bq,bk,padding", CASES)
def test_blockwise_equals_dense_values_and_gradients(H, K, T, S, offset, bq, bk, padding):
    B, Dh = 3, 16
    q, k, v = _qkv(0, B, T, S, H, K, Dh)
    valid = _valid(B, S, padding)
    sees_any_BT = np.any(_mask_BTS(valid, T, offset), axis=-1)
    assert not valid.all()  # padding is exercised (fully masked rows: below)
    # Cotangents on rows that see a key: dense spreads a masked row uniformly, blockwise zeroes it.
    ct = _normal(3, *q.shape) * sees_any_BT[:, :, None, None]
    ct_lse = _normal(4, B, T, H) * sees_any_BT[:, :, None]
    blockwise = lambda q, k, v: attn.blockwise_attention(q, k, v, valid, offset, bq, bk)
    dense = lambda q, k, v: _dense(q, k, v, valid, offset)
    out, lse, grads = _value_and_grads(blockwise, q, k, v, ct, ct_lse)
    ref_out, ref_lse, ref_grads = _value_and_grads(dense, q, k, v, ct, ct_lse)
    rows = sees_any_BT
    np.testing.assert_allclose(np.asarray(out)[rows], np.asarray(ref_out)[rows], atol=1e-5)
    np.testing.assert_allclose(np.asarray(lse)[rows], np.asarray(ref_lse)[rows], atol=1e-5)
    for name, g, ref in zip("qkv", grads, ref_grads, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(ref), atol=1e-5, err_msg=name)


def test_fully_masked_rows_are_zero_finite_and_send_no_gradient():
    B, T, H, K, Dh = 2, 12, 4, 2, 8
    q, k, v = _qkv(3, B, T, T, H, K, Dh)
    valid = np.arange(T)[None, :] >= np.array([[5], [T]])  # row 1: no real key
    ct = np.ones(q.shape, np.float32)  # also on the masked rows
    fn = lambda q, k, v: attn.blockwise_attention(q, k, v, valid, 0, 4, 4)
    out, lse, grads = _value_and_grads(fn, q, k, v, ct, np.ones((B, T, H), np.float32))
    masked = ~(np.cumsum(valid, axis=1) > 0)
    assert masked.sum() == 5 + T
    assert np.all(np.asarray(out)[masked] == 0) and np.all(np.asarray(lse)[masked] == -1e30)
    dq, dk, dv = (np.asarray(g) for g in grads)
    assert all(np.isfinite(g).all() for g in (dq, dk, dv))
    # Masked queries send nothing back: no query gradient, nothing into padding keys (so
    # nothing at all into the keys and values of the row without real keys).
    assert not dq[masked].any() and dq[~masked].all()
    real = valid
    assert not dk[~real].any() and not dv[~real].any() and dk[real].all() and dv[real].all()


def test_merging_disjoint_key_sets_equals_one_attention():
    B, T, H, K, Dh = 2, 9, 4, 2, 8
    q, k, v = _qkv(4, B, T, T, H, K, Dh)
    valid = _valid(B, T, "left")
    first = valid & (np.arange(T) % 3 == 0)[None]
    ct = _normal(5, *q.shape) * valid[:, :, None, None]

    def merged(q, k, v):
        a = attn.blockwise_attention(q, k, v, first, 0, 4, 4)
        b = attn.blockwise_attention(q, k, v, valid & ~first, 0, 4, 4)
        return attn.merge_attention([a, b])

    whole = lambda q, k, v: attn.blockwise_attention(q, k, v, valid, 0, 4, 4)
    out, lse, grads = _value_and_grads(merged, q, k, v, ct, ct[..., 0])
    ref_out, ref_lse, ref_grads = _value_and_grads(whole, q, k, v, ct, ct[..., 0])
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref_out), atol=1e-5)
    np.testing.assert_allclose(np.asarray(lse), np.asarray(ref_lse), atol=1e-5)
    for g, ref in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(ref), atol=1e-5)


def test_grouped_layout_equals_dense_grouped_attention():
    B, G, P, T, H, K, Dh = 2, 3, 7, 6, 4, 2, 8
    N = B * G
    q, kc, vc = _qkv(6, N, T, T, H, K, Dh)
    kp, vp = _normal(9, B, P, K, Dh), _normal(10, B, P, K, Dh)
    prompt_valid = _valid(B, P, "left")
    completion_valid = _valid(N, T, "right")
    mask_NTT = np.tril(np.ones((T, T), bool))[None] & completion_valid[:, None, :]
    ct = _normal(11, *q.shape)

    def grads(fn):
        loss = lambda *xs: jnp.sum(fn(*xs) * ct)
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4)))(q, kp, vp, kc, vc)

    blockwise = grads(
        lambda *xs: attn.grouped_attention(*xs, prompt_valid, completion_valid, block=4)
    )
    dense = grads(lambda *xs: grouped._grouped_attention(*xs, prompt_valid, mask_NTT, TINY))
    np.testing.assert_allclose(float(blockwise[0]), float(dense[0]), rtol=1e-5)
    for name, g, ref in zip(["q", "kp", "vp", "kc", "vc"], blockwise[1], dense[1], strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(ref), atol=1e-5, err_msg=name)


def test_bf16_stays_close_to_f32_dense():
    B, T, H, K, Dh = 2, 40, 4, 2, 16
    q, k, v = _qkv(8, B, T, T, H, K, Dh)
    valid = _valid(B, T, "left")
    rows = np.cumsum(valid, axis=1) > 0
    dense = jax.jit(lambda *x: _dense(*x, valid, 0)[0])
    ref = dense(q, k, v)
    half = [jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)]
    out, lse = jax.jit(lambda *x: attn.blockwise_attention(*x, valid, 0, 16, 16))(*half)
    assert out.dtype == jnp.bfloat16 and lse.dtype == jnp.float32
    err = np.abs(np.asarray(out, np.float32) - np.asarray(ref))[rows]
    dense_half = dense(*half)
    dense_err = np.abs(np.asarray(dense_half, np.float32) - np.asarray(ref))[rows]
    assert err.max() < 0.05 and err.mean() <= 2 * dense_err.mean(), (err.max(), dense_err.mean())


def test_cudnn_arrangement_equals_dense_through_xla():
    """The cuDNN path's rotation into valid prefixes, run by XLA's reference kernel on CPU."""
    B, T, H, K, Dh = 3, 16, 4, 2, 8
    q, k, v = _qkv(9, B, T, T, H, K, Dh)
    valid = _valid(B, T, "both")
    ct = _normal(12, *q.shape) * valid[:, :, None, None]
    fn = lambda q, k, v: (fused.cudnn_attention(q, k, v, valid, implementation="xla"), None)
    out, _, grads = _value_and_grads(fn, q, k, v, ct)
    ref, _, ref_grads = _value_and_grads(lambda *x: _dense(*x, valid, 0), q, k, v, ct)
    rows = valid
    np.testing.assert_allclose(np.asarray(out)[rows], np.asarray(ref)[rows], atol=1e-5)
    assert np.all(np.asarray(out)[~rows] == 0)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-5)
    holed = valid.copy()
    holed[0, 5] = False  # not one run: that row is poisoned, the others are not
    out = jax.jit(lambda *x: fused.cudnn_attention(*x, holed, implementation="xla"))(q, k, v)
    assert np.isnan(np.asarray(out[0])).all() and np.isfinite(np.asarray(out[1:])).all()


def test_pallas_splash_in_interpret_mode_equals_dense():
    """The splash kernel with padding as segment ids, run by the Pallas interpreter on CPU."""
    B, T, H, K, Dh = 2, 20, 4, 2, 16
    q, k, v = _qkv(11, B, T, T, H, K, Dh)
    valid = _valid(B, T, "both")
    ct = _normal(13, *q.shape) * valid[:, :, None, None]
    fn = lambda q, k, v: (fused.pallas_attention(q, k, v, valid, interpret=True), None)
    ref, _, ref_grads = _value_and_grads(lambda *x: _dense(*x, valid, 0), q, k, v, ct)
    rows = valid
    # Under an activation mesh the kernel runs per shard: rows over (data, fsdp), heads over
    # tensor.
    mesh = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=2, tensor=2), jax.devices()[:4])
    rows_spec = NamedSharding(mesh, PartitionSpec("fsdp"))
    for on_mesh in (False, True):
        args = [jax.device_put(x, rows_spec) for x in (q, k, v, ct)] if on_mesh else (q, k, v, ct)
        with sharding.activation_mesh(mesh if on_mesh else None):
            out, _, grads = _value_and_grads(fn, *args)
        np.testing.assert_allclose(np.asarray(out)[rows], np.asarray(ref)[rows], atol=1e-5)
        for g, r in zip(grads, ref_grads, strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-5)


def test_blockwise_backward_needs_far_less_memory_than_dense():
    B, T, H, K, Dh = 1, 2048, 4, 2, 32
    q = jax.ShapeDtypeStruct((B, T, H, Dh), jnp.float32)
    k = v = jax.ShapeDtypeStruct((B, T, K, Dh), jnp.float32)
    valid = np.ones((B, T), bool)

    def temp_bytes(fn):
        loss = lambda q, k, v: jnp.sum(fn(q, k, v))
        compiled = jax.jit(jax.grad(loss, (0, 1, 2))).lower(q, k, v).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    blockwise = temp_bytes(lambda q, k, v: attn.blockwise_attention(q, k, v, valid, 0, 256, 256)[0])
    dense = temp_bytes(lambda q, k, v: _dense(q, k, v, valid, 0)[0])
    scores = B * H * T * T * 4  # one f32 score matrix: 64 MiB
    assert dense >= scores and blockwise * 10 < dense, (blockwise, dense)


def _assert_close(x, ref, tol=1e-5):
    """|x - ref| <= tol x the scale of ref: large gradients carry f32 noise of their own size."""
    x, ref = np.asarray(x), np.asarray(ref)
    np.testing.assert_allclose(x, ref, rtol=0, atol=tol * max(1.0, np.abs(ref).max()))


def _cfg(**kwargs):
    return TINY.replace(vocab_size=64, **kwargs)


def _rows(seed, B, T, vocab):
    """Tokens, mask and positions of rows laid out as the trainer lays them: a left-padded
    prompt, then a right-padded completion."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((B, T), bool)
    for b in range(B):
        mask[b, rng.integers(0, T // 3) : T - rng.integers(0, T // 3)] = True
    tokens = np.where(mask, rng.integers(1, vocab, (B, T)), 0)
    return tokens, mask, np.maximum(np.cumsum(mask, axis=1) - 1, 0)


@pytest.fixture(scope="module")
def params():
    return tf.init_params(jax.random.key(0), _cfg())


def _dense_and_blockwise(loss, params):
    """`jax.value_and_grad(loss(cfg), has_aux=True)(params)` for dense and blockwise attention;
    blocks of 4 divide none of the lengths."""
    run = lambda cfg: jax.jit(jax.value_and_grad(loss(cfg), has_aux=True))(params)
    return run(_cfg(attention="dense")), run(_cfg(attention="xla_blockwise", attention_block=4))


def test_hidden_states_and_param_grads_equal_between_dense_and_blockwise(params):
    tokens, mask, positions = _rows(0, 3, 19, 64)
    ct = _normal(0, 3, 19, TINY.embed_dim) * mask[..., None]

    def loss(cfg):
        def fn(p):
            h, _ = tf.hidden_states(p, tokens, positions, cfg, mask_BT=mask)
            return jnp.sum(h * ct), h

        return fn

    ((_, h_dense), g_dense), ((_, h_block), g_block) = _dense_and_blockwise(loss, params)
    np.testing.assert_allclose(np.asarray(h_block)[mask], np.asarray(h_dense)[mask], atol=1e-5)
    for x, y in zip(jax.tree.leaves(g_block), jax.tree.leaves(g_dense), strict=True):
        _assert_close(x, y)


def test_grouped_hidden_states_and_param_grads_equal_between_dense_and_blockwise(params):
    B, G, P, T = 2, 3, 6, 7
    prompt_mask = _valid(B, P, "left")
    prompt = np.where(prompt_mask, np.arange(B * P).reshape(B, P) % 63 + 1, 0)
    p_pos = np.maximum(np.cumsum(prompt_mask, axis=1) - 1, 0)
    completion_mask = _valid(B * G, T, "right")
    completion = np.where(completion_mask, np.arange(B * G * T).reshape(-1, T) % 61 + 2, 0)
    c_pos = np.repeat(p_pos[:, -1:] + 1, G, axis=0) + np.arange(T)[None]
    ct = _normal(1, B * G, T, TINY.embed_dim) * completion_mask[..., None]

    def loss(cfg):
        def fn(p):
            args = (prompt, prompt_mask, p_pos, completion, completion_mask, c_pos, cfg)
            hp, hc = grouped.grouped_hidden_states(p, *args)
            return jnp.sum(hc * ct) + jnp.sum(hp * prompt_mask[..., None]), hc

        return fn

    ((_, h_dense), g_dense), ((_, h_block), g_block) = _dense_and_blockwise(loss, params)
    m = completion_mask
    np.testing.assert_allclose(np.asarray(h_block)[m], np.asarray(h_dense)[m], atol=1e-5)
    for x, y in zip(jax.tree.leaves(g_block), jax.tree.leaves(g_dense), strict=True):
        _assert_close(x, y)


RESOLVER_TABLE = [
    # (attention, backend, dtype, head_dim, layout) -> implementation
    ("auto", "cpu", "float32", 64, "causal", "xla_blockwise"),
    ("auto", "cpu", "bfloat16", 64, "causal", "xla_blockwise"),
    ("auto", "gpu", "bfloat16", 64, "causal", "cudnn"),
    ("auto", "gpu", "float16", 128, "causal", "cudnn"),
    ("auto", "gpu", "float32", 64, "causal", "xla_blockwise"),  # cuDNN flash: 16-bit only
    ("auto", "gpu", "bfloat16", 256, "causal", "xla_blockwise"),  # head dim too large
    ("auto", "gpu", "bfloat16", 12, "causal", "xla_blockwise"),  # not a multiple of 8
    ("auto", "gpu", "bfloat16", 64, "grouped", "xla_blockwise"),  # needs a differentiable lse
    ("auto", "rocm", "bfloat16", 64, "causal", "xla_blockwise"),
    ("auto", "tpu", "bfloat16", 64, "causal", "pallas"),
    ("auto", "tpu", "float32", 128, "causal", "pallas"),
    ("auto", "tpu", "float16", 128, "causal", "xla_blockwise"),
    ("auto", "tpu", "bfloat16", 128, "grouped", "xla_blockwise"),
    ("dense", "tpu", "bfloat16", 64, "causal", "dense"),
    ("dense", "cpu", "float32", 64, "grouped", "dense"),
    ("xla_blockwise", "gpu", "bfloat16", 64, "causal", "xla_blockwise"),
    ("cudnn", "gpu", "bfloat16", 64, "causal", "cudnn"),
    ("cudnn", "gpu", "bfloat16", 64, "grouped", "xla_blockwise"),
    ("pallas", "tpu", "bfloat16", 64, "causal", "pallas"),
    # Packed rows: cuDNN masks no segments, splash no shared-prompt branches.
    ("auto", "gpu", "bfloat16", 64, "packed", "xla_blockwise"),
    ("auto", "tpu", "bfloat16", 64, "packed", "xla_blockwise"),
    ("pallas", "tpu", "bfloat16", 64, "packed", "pallas"),
    ("dense", "tpu", "bfloat16", 64, "packed", "dense"),
]


@pytest.mark.parametrize("impl,backend,dtype,head_dim,layout,expected", RESOLVER_TABLE)
def test_resolver_choices(impl, backend, dtype, head_dim, layout, expected):
    cfg = TINY.replace(attention=impl, head_dim=head_dim, dtype=dtype)
    assert attn.resolve_attention(cfg, backend, layout=layout) == expected


@pytest.mark.parametrize(
    "impl,backend,dtype,match",
    [
        ("cudnn", "cpu", "bfloat16", "attention='cudnn' cannot run here: .*NVIDIA GPU.*'cpu'"),
        ("cudnn", "gpu", "float32", "attention='cudnn' cannot run here: .*dtype='float32'"),
        ("pallas", "gpu", "bfloat16", "attention='pallas' cannot run here: .*TPU.*'gpu'"),
        ("pallas", "cpu", "float32", "attention='pallas' cannot run here"),
    ],
)
def test_forced_kernels_that_cannot_run_are_named(impl, backend, dtype, match):
    cfg = TINY.replace(attention=impl, dtype=dtype)
    with pytest.raises(ValueError, match=match):
        attn.resolve_attention(cfg, backend)


def test_resolver_reads_the_dtype_and_backend_defaults():
    assert attn.resolve_attention(TINY) == "xla_blockwise"  # tests run on CPU
    gpu = TINY.replace(dtype="bfloat16")
    assert attn.resolve_attention(gpu, "gpu") == "cudnn"
    assert attn.resolve_attention(gpu, "gpu", dtype=jnp.float32) == "xla_blockwise"
    with pytest.raises(ValueError, match="layout='ragged'"):
        attn.resolve_attention(TINY, "cpu", layout="ragged")


def test_bad_attention_settings_are_named():
    with pytest.raises(ValueError, match="attention='flash'"):
        TINY.replace(attention="flash")
    with pytest.raises(ValueError, match="attention_block=0"):
        TINY.replace(attention_block=0)
    assert TINY.attention == "auto" and TINY.attention_block == 512


@pytest.mark.parametrize("packed", [False, True])
def test_query_chunks_at_a_traced_start_equal_the_whole_row(packed):
    """A row's queries cut into chunks (as over a "seq" mesh axis), each against all keys with
    its first position traced (`query_start`), give the whole row's outputs, log-sum-exps and
    gradients (dk, dv summed over the chunks). Blocks of 5 and 7 straddle the chunks' ends."""
    B, T, H, K, Dh, chunks = 2, 36, 4, 2, 16, 3
    n = T // chunks
    q, k, v = _qkv(5, B, T, T, H, K, Dh)
    valid = _valid(B, T, "both")
    segments = None
    if packed:
        br = attn.BRANCHES
        runs = [(br, 8), (br + 1, 6), (br + 2, 7), (2 * br, 9), (0, 6)]
        seg = np.concatenate([np.full(m, s) for s, m in runs]).astype(np.int32)
        seg = np.stack([seg, np.roll(seg, 3)])
        valid = valid & (seg > 0)
        segments = (seg, seg)
    ct, ct_lse = _normal(6, B, T, H, Dh), _normal(7, B, T, H)

    def whole(q, k, v):
        return attn.blockwise_attention(q, k, v, valid, 0, 5, 7, segments)

    def chunked(q, k, v, starts):
        parts = [
            attn.blockwise_attention(
                q[:, c * n : (c + 1) * n], k, v, valid, 0, 5, 7, segments, query_start=starts[c]
            )
            for c in range(chunks)
        ]
        return tuple(jnp.concatenate(x, axis=1) for x in zip(*parts, strict=True))

    def loss(fn):
        def total(q, k, v, *starts):
            out, lse = fn(q, k, v, *starts)
            return jnp.sum(out * ct) + jnp.sum(jnp.where(lse > attn.MASK_VALUE, lse, 0) * ct_lse)

        return jax.jit(jax.value_and_grad(total, (0, 1, 2)))

    starts = jnp.arange(chunks, dtype=jnp.int32) * n
    want, want_grads = loss(whole)(q, k, v)
    got, got_grads = loss(chunked)(q, k, v, starts)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(
        jax.jit(chunked)(q, k, v, starts)[0], jax.jit(whole)(q, k, v)[0], atol=1e-5
    )
    for name, g, ref in zip("qkv", got_grads, want_grads, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(ref), atol=1e-5, err_msg=name)
