"""Packed rows (several sequences in one row, told apart by segment ids) give each sequence the
hidden states and gradients it has alone, in every attention implementation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.model import attention as attn
from rlvr_jax.model import config as config_lib
from rlvr_jax.model import fused_attention
from rlvr_jax.model import transformer as tf

CFG = config_lib.PRESETS["tiny"].replace(vocab_size=64)
LENGTHS = (5, 7, 3, 4)
# Row 0: sequences 0 and 2 then padding; row 1: sequence 1 then 3, then padding.
LAYOUT = (((0, 0), (2, 5)), ((1, 0), (3, 7)))
L = 12


def _sequences():
    rng = np.random.default_rng(0)
    return [rng.integers(1, CFG.vocab_size, n) for n in LENGTHS]


def _packed(seqs):
    """(tokens, positions, segment ids) of the two packed rows of `LAYOUT`."""
    tokens, positions, segments = (np.zeros((len(LAYOUT), L), np.int32) for _ in range(3))
    for r, row in enumerate(LAYOUT):
        for seg, (n, start) in enumerate(row, start=1):
            end = start + len(seqs[n])
            tokens[r, start:end] = seqs[n]
            positions[r, start:end] = np.arange(len(seqs[n]))
            segments[r, start:end] = seg
    return tokens, positions, segments


def _alone(seqs):
    """(tokens, positions, mask) of each sequence in its own right-padded row."""
    T = max(LENGTHS)
    tokens, positions = np.zeros((len(seqs), T), np.int32), np.zeros((len(seqs), T), np.int32)
    mask = np.zeros((len(seqs), T), bool)
    for n, s in enumerate(seqs):
        tokens[n, : len(s)], positions[n, : len(s)], mask[n, : len(s)] = s, np.arange(len(s)), True
    return tokens, positions, mask


def _cotangents(seqs):
    """A cotangent per real token, laid out both ways."""
    rng = np.random.default_rng(1)
    per_seq = [rng.standard_normal((len(s), CFG.embed_dim)).astype(np.float32) for s in seqs]
    packed = np.zeros((len(LAYOUT), L, CFG.embed_dim), np.float32)
    for r, row in enumerate(LAYOUT):
        for n, start in row:
            packed[r, start : start + len(seqs[n])] = per_seq[n]
    alone = np.zeros((len(seqs), max(LENGTHS), CFG.embed_dim), np.float32)
    for n, c in enumerate(per_seq):
        alone[n, : len(c)] = c
    return packed, alone


@pytest.fixture(scope="module")
def params():
    return tf.init_params(jax.random.key(0), CFG)


@pytest.mark.parametrize("impl", ["dense", "xla_blockwise"])
def test_packed_hidden_states_and_grads_equal_each_sequence_alone(params, impl):
    cfg = CFG.replace(attention=impl, attention_block=4)  # blocks cross segment boundaries
    seqs = _sequences()
    p_tokens, p_positions, p_segments = _packed(seqs)
    a_tokens, a_positions, a_mask = _alone(seqs)
    ct_packed, ct_alone = _cotangents(seqs)

    def packed(p):
        h, _ = tf.hidden_states(
            p, p_tokens, p_positions, cfg, mask_BT=p_segments > 0, segment_ids_BT=p_segments
        )
        return jnp.sum(h * ct_packed), h

    def alone(p):
        h, _ = tf.hidden_states(p, a_tokens, a_positions, cfg, mask_BT=a_mask)
        return jnp.sum(h * ct_alone), h

    (_, h_p), g_p = jax.jit(jax.value_and_grad(packed, has_aux=True))(params)
    (_, h_a), g_a = jax.jit(jax.value_and_grad(alone, has_aux=True))(params)
    h_p, h_a = np.asarray(h_p), np.asarray(h_a)
    for r, row in enumerate(LAYOUT):
        for n, start in row:
            got = h_p[r, start : start + LENGTHS[n]]
            np.testing.assert_allclose(got, h_a[n, : LENGTHS[n]], atol=1e-5)
    for x, y in zip(jax.tree.leaves(g_p), jax.tree.leaves(g_a), strict=True):
        scale = max(1.0, float(np.abs(np.asarray(y)).max()))
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=1e-5 * scale)


@pytest.mark.parametrize("impl", ["dense", "xla_blockwise"])
def test_branches_see_their_shared_prefix_and_themselves(params, impl):
    # One packed row: prompt A, then two completions of A as branches 1 and 2, then prompt B
    # with one completion (branch 0: a plain segment). Each completion's hidden states are
    # those of its prompt and itself alone.
    cfg = CFG.replace(attention=impl, attention_block=4)
    rng = np.random.default_rng(5)
    a, a1, a2, b, b1 = (rng.integers(1, CFG.vocab_size, n) for n in (3, 4, 2, 2, 3))
    B = attn.BRANCHES
    parts = [(a, 1 * B, 0), (a1, 1 * B + 1, 3), (a2, 1 * B + 2, 3), (b, 2 * B, 0), (b1, 2 * B, 2)]
    tokens = np.concatenate([x for x, _, _ in parts])[None]
    segments = np.concatenate([np.full(len(x), s) for x, s, _ in parts])[None]
    positions = np.concatenate([first + np.arange(len(x)) for x, _, first in parts])[None]
    h, _ = tf.hidden_states(
        params, tokens, positions, cfg, mask_BT=segments > 0, segment_ids_BT=segments
    )
    starts = np.cumsum([0] + [len(x) for x, _, _ in parts])
    for prompt, completion, k in ((a, a1, 1), (a, a2, 2), (b, b1, 4)):
        whole = np.concatenate([prompt, completion])[None]
        alone, _ = tf.hidden_states(params, whole, np.arange(whole.shape[1])[None], cfg)
        got = np.asarray(h)[0, starts[k] : starts[k + 1]]
        np.testing.assert_allclose(got, np.asarray(alone)[0, len(prompt) :], atol=1e-5)


def _qkv(seed, B, T, H, K, Dh):
    rng = np.random.default_rng(seed)
    draw = lambda *shape: rng.standard_normal(shape, dtype=np.float32)  # noqa: E731
    return draw(B, T, H, Dh), draw(B, T, K, Dh), draw(B, T, K, Dh)


def _segment_mask(segments):
    T = segments.shape[1]
    same = segments[:, :, None] == segments[:, None, :]
    return same & (segments[:, None, :] > 0) & np.tril(np.ones((T, T), bool))[None]


@pytest.mark.parametrize("kernel", ["blockwise", "pallas"])
def test_segment_kernels_equal_the_dense_segment_mask(kernel):
    B, T, H, K, Dh = 2, 20, 4, 2, 16
    q, k, v = _qkv(3, B, T, H, K, Dh)
    segments = np.zeros((B, T), np.int32)
    segments[0, :6], segments[0, 6:15], segments[1, :20] = 1, 2, 3
    segments[1, 9:] = 4  # a row with no padding
    valid = segments > 0
    ct = np.random.default_rng(4).standard_normal(q.shape).astype(np.float32)
    ct *= valid[:, :, None, None]
    mask = _segment_mask(segments)

    def dense(q, k, v):
        return jnp.sum(tf.attention(q, k, v, mask, CFG) * ct)

    def fused(q, k, v):
        if kernel == "blockwise":
            out = attn.blockwise_attention(q, k, v, valid, 0, 8, 8, (segments, segments))[0]
        else:
            out = fused_attention.pallas_attention(
                q, k, v, valid, interpret=True, segment_ids_BT=segments
            )
        return jnp.sum(out * ct)

    ref = jax.jit(jax.grad(dense, (0, 1, 2)))(q, k, v)
    got = jax.jit(jax.grad(fused, (0, 1, 2)))(q, k, v)
    for g, r in zip(got, ref, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-5)
    np.testing.assert_allclose(float(jax.jit(fused)(q, k, v)), float(dense(q, k, v)), rtol=1e-5)


def test_cudnn_refuses_segments():
    q, k, v = _qkv(5, 1, 8, 2, 2, 8)
    segments = np.ones((1, 8), np.int32)
    with pytest.raises(ValueError, match="cudnn attention cannot express"):
        fused_attention.causal_attention(q, k, v, segments > 0, "cudnn", 8, segments)


def _branch_rows():
    """Two packed rows of segment ids: prompts with branches, plain sequences and padding."""
    B = attn.BRANCHES
    runs = (
        # Prompt (3), branches of 5, 6 and 3 tokens; a plain sequence (4); padding (3).
        [(B, 3), (B + 1, 5), (B + 2, 6), (B + 3, 3), (2 * B, 4), (0, 3)],
        # A plain sequence (2); prompt (2), branches of 7 and 9 tokens; padding (4).
        [(B, 2), (2 * B, 2), (2 * B + 1, 7), (2 * B + 2, 9), (0, 4)],
    )
    return np.array([np.concatenate([np.full(n, s) for s, n in row]) for row in runs], np.int32)


def test_blockwise_attention_skips_the_key_blocks_no_query_of_a_block_sees():
    B = attn.BRANCHES
    # Sequence 1: a prompt (2) and branches of 3 and 5; then sequence 2 (2 tokens), padding.
    seg = np.array([[B, B, B + 1, B + 1, B + 1, B + 2, B + 2, B + 2, B + 2, B + 2, 2 * B, 2 * B]])
    seg = np.concatenate([seg, np.zeros((1, 4), np.int32)], axis=1)
    bounds = np.asarray(attn._packed_bounds(jnp.asarray(seg)))[0]
    # (sequence start, last prefix position so far, branch start) per token.
    np.testing.assert_array_equal(bounds[:, 0], [0] * 10 + [10, 10] + [12] * 4)
    np.testing.assert_array_equal(bounds[:, 1], [0, 1] + [1] * 8 + [10, 11, 12, 13, 14, 15])
    np.testing.assert_array_equal(bounds[:, 2], [0, 0, 2, 2, 2, 5, 5, 5, 5, 5, 10, 10] + [12] * 4)
    # Blocks of 2: query block 4 (tokens 8, 9 of branch 2) sees the prompt's block 0 and its
    # branch's blocks 2 to 4, not block 1 (branch 1).
    start, prefix_end, branch = map(
        np.asarray, attn._block_ranges(jnp.asarray(bounds[None]), 2, 2, 8, 8, 0)
    )
    np.testing.assert_array_equal(start, [0, 0, 0, 0, 0, 5, 6, 6])
    np.testing.assert_array_equal(prefix_end, [1, 1, 1, 1, 1, 6, 7, 8])
    np.testing.assert_array_equal(branch, [0, 1, 1, 2, 2, 5, 6, 6])
    count, index = attn._two_ranges(start[4], prefix_end[4], branch[4], 5)
    assert [int(index(k)) for k in range(int(count))] == [0, 2, 3, 4]
    # Overlapping or empty ranges give each block once.
    count, index = attn._two_ranges(1, 3, 2, 5)
    assert [int(index(k)) for k in range(int(count))] == [1, 2, 3, 4]
    count, index = attn._two_ranges(2, 1, 3, 5)
    assert [int(index(k)) for k in range(int(count))] == [3, 4]


@pytest.mark.parametrize("block", [2, 3, 4])
def test_blockwise_branches_equal_the_dense_branch_mask(block):
    # Blocks that skip a branch between a prompt and a later branch, in rows laid out unlike
    # each other (the ranges bound both rows), forward and gradients.
    segments = _branch_rows()
    R, T = segments.shape
    q, k, v = _qkv(7, R, T, 4, 2, 8)
    valid = segments > 0
    ct = np.random.default_rng(8).standard_normal(q.shape).astype(np.float32)
    ct *= valid[:, :, None, None]
    mask = np.asarray(attn.segment_visible(segments[:, :, None], segments[:, None, :]))
    mask &= valid[:, None, :] & np.tril(np.ones((T, T), bool))[None]

    def dense(q, k, v):
        return jnp.sum(tf.attention(q, k, v, mask, CFG) * ct)

    def blockwise(q, k, v):
        segs = (segments, segments)
        return jnp.sum(attn.blockwise_attention(q, k, v, valid, 0, block, block, segs)[0] * ct)

    ref = jax.jit(jax.grad(dense, (0, 1, 2)))(q, k, v)
    got = jax.jit(jax.grad(blockwise, (0, 1, 2)))(q, k, v)
    for g, r in zip(got, ref, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-5)
    np.testing.assert_allclose(float(jax.jit(blockwise)(q, k, v)), float(dense(q, k, v)), rtol=1e-5)
