"""Attention for training forwards that never holds a (T, S) score matrix.

Three implementations besides the dense reference (`transformer.attention`), chosen per call
site by `resolve_attention` from `ModelConfig.attention`:

* "xla_blockwise": pure JAX, flash-style. Queries are cut into blocks of `block_q` rows and keys
  into blocks of `block_k`; each query block runs an online softmax over its key blocks in f32,
  and key blocks that causality hides from the whole query block are never visited (the loop
  bound is per query block; on packed rows only the blocks of the query block's sequences'
  prefixes and of its own branches are visited, `_block_ranges`). The backward is written by
  hand (`jax.custom_vjp`): it keeps only q, k, v, the output and the log-sum-exp (O(T) per
  row) and recomputes each block's scores, FlashAttention-2 style (outer loop over key blocks,
  inner over the query blocks that can see them, dq accumulated in place). Grouped-query heads
  are a (K, G) split of H, so k and v are never repeated G times. The mask is never an array:
  key validity is a (B, S) vector and causality is `key j visible to query i iff
  j <= i + offset`, both applied per block.
* "cudnn": `jax.nn.dot_product_attention(implementation="cudnn")` on NVIDIA GPUs.
* "pallas": the splash attention kernel jax ships for TPUs, with segment ids for padding.

The two fused kernels, and `causal_attention`, which runs whichever of the three a full causal
pass resolved to, are in `fused_attention.py`.

Context parallelism (`split_over_seq`): a row whose tokens are split over the mesh's "seq"
axis runs in a `shard_map`, each device's query chunk against the keys and values all-gathered
over "seq"; the blockwise kernel takes the chunk's first key position as a traced
`query_start` (the static `causal_offset` of the unsplit paths is unchanged).

Fully masked query rows (a left-padding query) give a zero output, log-sum-exp `MASK_VALUE` and
zero gradients, never NaN. Two attentions over disjoint key sets merge exactly through their
log-sum-exps (`merge_attention`); the shared-prompt layout (`grouped_attention`) uses that, and
gradients flow through the log-sum-exp: in the backward its cotangent enters as
`D_i = rowsum(dO * O) - dlse_i`.

Why a custom VJP rather than `lax.scan` + `jax.checkpoint`: a scan over key blocks that autodiff
differentiates stores its per-step residuals (the probabilities of every key block of a query
block) for the backward, and it cannot skip the key blocks that causality hides (a scan has a
static length). Measured with `python benchmarks/attention.py --lengths 1024,2048,4096` (its
docstring defines the variants): one causal layer, B=1, H=8, K=2, Dh=64, f32, blocks of 512,
10% left padding, jit(grad) w.r.t. q, k, v; compiled temp memory
(`memory_analysis().temp_size_in_bytes`) and median wall time of 3 runs on a 2-core CPU shared
with another job (times are noisy), 2026-12-01:

  ======  ======================  ======================  ======================
  T       dense                   xla_blockwise (here)    scan_checkpoint
  ======  ======================  ======================  ======================
  1024    98.1 MiB, 0.55 s        47.1 MiB, 0.37 s        98.6 MiB, 0.65 s
  2048    388.1 MiB, 2.58 s       52.1 MiB, 1.50 s        160.7 MiB, 2.21 s
  4096    1544.2 MiB, 11.3 s      55.3 MiB, 3.15 s        285.1 MiB, 9.41 s
  ======  ======================  ======================  ======================

The custom VJP's memory is a few (B, H, block, block) tiles plus O(T) buffers (f32 gradients),
nearly flat in T; the scan's grows with T (one query block's probabilities over all keys), and
its time pays for the hidden blocks too.

Shapes: B batch rows, T queries, S keys, H query heads, K kv heads, G = H // K query heads per
kv head, Dh head dim. Inside the blockwise kernel the layout is heads-major: q (B, K, G, T, Dh),
k and v (B, K, S, Dh), so every block product is a batched matmul over (B, K).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from rlvr_jax.model import sharding
from rlvr_jax.model.config import ModelConfig

Array = jax.Array
# Finite rather than -inf, as in the dense reference: rows with no visible key stay finite.
MASK_VALUE = -1e30
LAYOUTS = ("causal", "grouped", "packed")
_CUDNN_DTYPES = ("bfloat16", "float16")
_PALLAS_DTYPES = ("bfloat16", "float32")


# ---------------------------------------------------------------------------------------------
# Choosing an implementation


def current_backend() -> str:
    """The default backend's name: "cpu", "gpu" (CUDA), "rocm" or "tpu"."""
    backend = jax.default_backend()
    if backend == "gpu" and "rocm" in jax.devices()[0].client.platform_version.lower():
        return "rocm"
    return backend


def _fused_unsupported(kind: str, backend: str, dtype: str, head_dim: int) -> str | None:
    """Why the fused kernel `kind` cannot run for these settings, or None when it can."""
    if kind == "cudnn":
        if backend != "gpu":
            return f"cuDNN attention needs an NVIDIA GPU; the backend is {backend!r}"
        if dtype not in _CUDNN_DTYPES:
            return f"cuDNN flash attention takes {_CUDNN_DTYPES}, not dtype={dtype!r}"
        if head_dim % 8 or head_dim > 128:
            return f"cuDNN flash attention needs head_dim <= 128 and a multiple of 8: {head_dim}"
        return None
    if backend != "tpu":
        return f"the Pallas splash attention kernel needs a TPU; the backend is {backend!r}"
    if dtype not in _PALLAS_DTYPES:
        return f"splash attention takes {_PALLAS_DTYPES}, not dtype={dtype!r}"
    return None


def resolve_attention(
    cfg: ModelConfig, backend: str | None = None, dtype: str | None = None, layout: str = "causal"
) -> str:
    """The implementation one attention call site runs: "dense", "xla_blockwise", "cudnn" or
    "pallas".

    "auto" takes the fused kernel of the backend (cuDNN on NVIDIA GPUs, splash on TPUs) where it
    applies and "xla_blockwise" elsewhere, CPU included. The "grouped" layout (completions over a
    shared prompt, merged through log-sum-exps) runs blockwise unless "dense" is asked for, also
    when a fused kernel is forced: the fused kernels return no log-sum-exp that carries a
    gradient (cuDNN drops the residual's cotangent; splash refuses to differentiate with
    `save_residuals`). The "packed" layout (the packed update's rows, `segment_visible`) runs
    blockwise under "auto": cuDNN cannot mask segments, and splash only plain ones (forced
    "pallas" takes those; `rl.packing.plan(group_size=1)`).

    Args:
      cfg: reads `attention` and `head_dim`.
      backend: "cpu", "gpu", "rocm" or "tpu"; None reads `current_backend()`.
      dtype: the dtype of q, k, v; None reads `cfg.dtype`.
      layout: "causal" (one row's tokens over its own valid prefix), "grouped" or "packed".

    Raises:
      ValueError: "cudnn" or "pallas" asked for where that kernel cannot run.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}; expected one of {LAYOUTS}")
    impl = cfg.attention  # one of config.ATTENTION_IMPLEMENTATIONS (checked there)
    if impl in ("dense", "xla_blockwise"):
        return impl
    backend = current_backend() if backend is None else backend
    dtype = jnp.dtype(cfg.dtype if dtype is None else dtype).name
    if impl == "auto":
        fused = {"gpu": "cudnn", "tpu": "pallas"}.get(backend)
        if fused is None or _fused_unsupported(fused, backend, dtype, cfg.head_dim):
            return "xla_blockwise"
        return "xla_blockwise" if layout in ("grouped", "packed") else fused
    reason = _fused_unsupported(impl, backend, dtype, cfg.head_dim)
    if reason:
        raise ValueError(f"attention={impl!r} cannot run here: {reason}")
    return "xla_blockwise" if layout == "grouped" else impl


# ---------------------------------------------------------------------------------------------
# Segments of packed rows

# A packed row's segment id is `sequence * BRANCHES + branch`. Branch 0 is a prefix that every
# branch of its sequence sees (a group's prompt, packed once); a branch b > 0 (one completion)
# sees the prefix and itself. With branch 0 only, ids are plain segment ids.
BRANCHES = 1 << 12


def segment_visible(q_seg: Array, k_seg: Array) -> Array:
    """Whether a key of segment id `k_seg` is visible to a query of `q_seg` (broadcast):
    the same sequence, and the key's branch is the shared prefix or the query's own."""
    same_sequence = q_seg // BRANCHES == k_seg // BRANCHES
    return same_sequence & ((k_seg % BRANCHES == 0) | (k_seg == q_seg))


# ---------------------------------------------------------------------------------------------
# Blockwise attention: the kernel, on padded heads-major arrays


def _visible(segs: tuple[Array, Array], q0: Array, k0: Array, bq: int, bk: int, offset):
    """The (B, 1, 1, bq, bk) mask of the query block starting at row q0 and the key block
    starting at key k0: a key is visible when `segment_visible` (padding is segment 0, which
    no query sees) and, with an offset, causality allows it."""
    q_seg_BT, k_seg_BS = segs[0], segs[1]
    q_seg = jax.lax.dynamic_slice_in_dim(q_seg_BT, q0, bq, axis=1)[:, :, None]
    k_seg = jax.lax.dynamic_slice_in_dim(k_seg_BS, k0, bk, axis=1)[:, None, :]
    visible = (segment_visible(q_seg, k_seg) & (k_seg > 0))[:, None, None]
    if offset is None:
        return visible
    rows, cols = q0 + jnp.arange(bq), k0 + jnp.arange(bk)
    return visible & (cols[None, :] <= rows[:, None] + offset)


def _key_blocks_seen(i: Array, bq: int, bk: int, nk: int, offset: int | None) -> int | Array:
    """How many leading key blocks query block i can see: the later ones are causally hidden."""
    if offset is None:
        return nk
    return jnp.clip(((i + 1) * bq + offset + bk - 1) // bk, 0, nk)


def _packed_bounds(seg_BT: Array) -> Array:
    """(B, T, 3) int32 per token of packed rows: where its sequence (`seg // BRANCHES`) begins,
    the last prefix (branch 0) position at or before it (-1: none), and where its branch's run
    begins; a run of padding (segment 0) is a sequence of its own.

    With each sequence and each branch a contiguous run, the prefix before the branches (as
    `rl.packing` lays them out), a query sees keys only in [its sequence's start, the last
    prefix position] and [its branch's start, itself]: a completion skips the other
    completions of its group packed before it, not just the other sequences."""
    index = jnp.arange(seg_BT.shape[1], dtype=jnp.int32)[None, :]

    def run_starts(x_BT):
        begins = jnp.concatenate([jnp.ones_like(x_BT[:, :1], bool), x_BT[:, 1:] != x_BT[:, :-1]], 1)
        return jax.lax.cummax(jnp.where(begins, index, 0), axis=1)

    last_prefix = jax.lax.cummax(jnp.where(seg_BT % BRANCHES == 0, index, -1), axis=1)
    return jnp.stack([run_starts(seg_BT // BRANCHES), last_prefix, run_starts(seg_BT)], axis=-1)


def _block_ranges(bounds_BT3: Array, bq: int, bk: int, nq: int, nk: int, offset: int):
    """Per query block, the key blocks it can see as two ranges, [start, prefix_end) (its
    sequences' prefixes) and [branch, last) (its own branches up to the causal diagonal), each
    (nq,) int32. They bound every row's `_packed_bounds` at the block's first query (the
    earliest of the block's): the minimum start and branch and the maximum prefix end over
    the rows. All three do not decrease with the block, which the backward relies on."""
    first_BN3 = bounds_BT3[:, ::bq]
    last = _key_blocks_seen(jnp.arange(nq), bq, bk, nk, offset)
    start = jnp.min(first_BN3[..., 0], axis=0) // bk
    prefix_end = jnp.minimum(jnp.max(first_BN3[..., 1], axis=0) // bk + 1, last)
    branch = jnp.min(first_BN3[..., 2], axis=0) // bk
    return start, prefix_end, branch


def _two_ranges(lo: Array, end1: Array, start2: Array, hi: Array):
    """(count, index): the union of [lo, end1) and [start2, hi) (start2 >= lo) in order, without
    repeats; index(k) is its k-th element."""
    n1 = jnp.maximum(end1 - lo, 0)
    start2 = jnp.maximum(start2, lo + n1)
    count = n1 + jnp.maximum(hi - start2, 0)
    return count, lambda k: jnp.where(k < n1, lo + k, start2 + k - n1)


def _first_query_block(j: Array, bq: int, bk: int, offset: int | None) -> int | Array:
    """The first query block that can see key block j."""
    if offset is None:
        return 0
    return jnp.maximum(j * bk - offset, 0) // bq


def _mm(spec: str, a: Array, b: Array) -> Array:
    """A block product accumulated in f32."""
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _block_scores(q_i: Array, k_j: Array, scale: float) -> Array:
    """(B, K, G, bq, bk) f32 scores of a query block against a key block."""
    return _mm("bkgqd,bksd->bkgqs", q_i, k_j) * scale


def _query_offset(offset: int | None, q_start: Array | None):
    """The causal offset of queries that start at key `q_start` (traced; None: at key 0)."""
    return offset if q_start is None or offset is None else offset + q_start


def _flash_forward(q, k, v, segs, q_start, offset, bq, bk):
    """Output (B, K, G, Tp, Dh) in q's dtype and log-sum-exp (B, K, G, Tp) in f32."""
    # The barriers keep XLA from fusing the producers of the inputs (RoPE, transposes, padding)
    # into the block loops: they would be recomputed for every block, and differently in a
    # rematerialised forward than in the first one (remat then changed gradients by 1e-6).
    q, k, v, segs = jax.lax.optimization_barrier((q, k, v, segs))
    offset = _query_offset(offset, q_start)
    B, K, G, Tp, Dh = q.shape
    nq, nk = Tp // bq, k.shape[2] // bk
    scale = 1.0 / math.sqrt(Dh)
    ranges = _block_ranges(segs[2], bq, bk, nq, nk, offset) if len(segs) > 2 else None

    def query_block(i, carry):
        out, lse = carry
        q_i = jax.lax.dynamic_slice_in_dim(q, i * bq, bq, axis=3)

        def key_block(j, state):
            row_max, row_sum, acc = state
            k_j = jax.lax.dynamic_slice_in_dim(k, j * bk, bk, axis=2)
            v_j = jax.lax.dynamic_slice_in_dim(v, j * bk, bk, axis=2)
            mask = _visible(segs, i * bq, j * bk, bq, bk, offset)
            s = jnp.where(mask, _block_scores(q_i, k_j, scale), MASK_VALUE)
            new_max = jnp.maximum(row_max, jnp.max(s, axis=-1))
            # Explicit zeros for hidden keys: a row with no visible key so far keeps a zero sum.
            p = jnp.where(mask, jnp.exp(s - new_max[..., None]), 0.0)
            alpha = jnp.exp(row_max - new_max)
            acc = alpha[..., None] * acc + _mm("bkgqs,bksd->bkgqd", p.astype(v.dtype), v_j)
            return new_max, alpha * row_sum + jnp.sum(p, axis=-1), acc

        init = (
            jnp.full((B, K, G, bq), MASK_VALUE, jnp.float32),
            jnp.zeros((B, K, G, bq), jnp.float32),
            jnp.zeros((B, K, G, bq, Dh), jnp.float32),
        )
        num_blocks = _key_blocks_seen(i, bq, bk, nk, offset)
        if ranges is None:
            row_max, row_sum, acc = jax.lax.fori_loop(0, num_blocks, key_block, init)
        else:  # packed rows: the key blocks of the block's prefixes and branches only
            start, prefix_end, branch = (x[i] for x in ranges)
            count, j = _two_ranges(start, prefix_end, branch, num_blocks)
            step = lambda n, state: key_block(j(n), state)  # noqa: E731
            row_max, row_sum, acc = jax.lax.fori_loop(0, count, step, init)
        seen = row_sum > 0
        row_sum = jnp.where(seen, row_sum, 1.0)
        out_i = (acc / row_sum[..., None]).astype(out.dtype)
        lse_i = jnp.where(seen, row_max + jnp.log(row_sum), MASK_VALUE)
        out = jax.lax.dynamic_update_slice_in_dim(out, out_i, i * bq, axis=3)
        return out, jax.lax.dynamic_update_slice_in_dim(lse, lse_i, i * bq, axis=3)

    init = (jnp.zeros(q.shape, q.dtype), jnp.zeros((B, K, G, Tp), jnp.float32))
    return jax.lax.fori_loop(0, nq, query_block, init)


def _flash_backward(q, k, v, segs, q_start, out, lse, d_out, d_lse, offset, bq, bk):
    """dq, dk, dv: an outer loop over key blocks, an inner one over the query blocks that see
    them; probabilities are recomputed from the saved log-sum-exp."""
    offset = _query_offset(offset, q_start)
    B, K, G, Tp, Dh = q.shape
    nq, nk = Tp // bq, k.shape[2] // bk
    scale = 1.0 / math.sqrt(Dh)
    f32 = jnp.float32
    # rowsum(dO * O) - dlse: the softmax backward's per-row term, lse's cotangent folded in.
    delta = jnp.sum(d_out.astype(f32) * out.astype(f32), axis=-1) - d_lse
    ranges = _block_ranges(segs[2], bq, bk, nq, nk, offset) if len(segs) > 2 else None

    def key_block(j, carry):
        dq, dk, dv = carry
        k_j = jax.lax.dynamic_slice_in_dim(k, j * bk, bk, axis=2)
        v_j = jax.lax.dynamic_slice_in_dim(v, j * bk, bk, axis=2)

        def query_block(i, state):
            dq, dk_j, dv_j = state
            sl = lambda x: jax.lax.dynamic_slice_in_dim(x, i * bq, bq, axis=3)
            q_i, do_i, lse_i, delta_i = sl(q), sl(d_out), sl(lse), sl(delta)
            mask = _visible(segs, i * bq, j * bk, bq, bk, offset)
            # Hidden entries may overflow in exp (lse = MASK_VALUE); `where` drops them.
            p = jnp.where(mask, jnp.exp(_block_scores(q_i, k_j, scale) - lse_i[..., None]), 0.0)
            dv_j += _mm("bkgqs,bkgqd->bksd", p.astype(v.dtype), do_i)
            dp = _mm("bkgqd,bksd->bkgqs", do_i, v_j)
            ds = (p * (dp - delta_i[..., None]) * scale).astype(q.dtype)
            dq_i = sl(dq) + _mm("bkgqs,bksd->bkgqd", ds, k_j)
            dq = jax.lax.dynamic_update_slice_in_dim(dq, dq_i, i * bq, axis=3)
            dk_j += _mm("bkgqs,bkgqd->bksd", ds, q_i)
            return dq, dk_j, dv_j

        zeros = jnp.zeros((B, K, bk, Dh), f32)
        first = _first_query_block(j, bq, bk, offset)
        if ranges is None:
            dq, dk_j, dv_j = jax.lax.fori_loop(first, nq, query_block, (dq, zeros, zeros))
        else:
            # The query blocks whose ranges (`_block_ranges`) hold j: as the bounds do not
            # decrease, those whose branch range does are [first, #(branch <= j)), and those
            # whose prefix range does are [#(prefix_end <= j), #(start <= j)).
            start, prefix_end, branch = ranges
            count, i = _two_ranges(
                first, jnp.sum(branch <= j), jnp.sum(prefix_end <= j), jnp.sum(start <= j)
            )
            step = lambda n, state: query_block(i(n), state)  # noqa: E731
            dq, dk_j, dv_j = jax.lax.fori_loop(0, count, step, (dq, zeros, zeros))
        put = lambda x, x_j: jax.lax.dynamic_update_slice_in_dim(x, x_j, j * bk, axis=2)
        return dq, put(dk, dk_j), put(dv, dv_j)

    init = (jnp.zeros(q.shape, f32), jnp.zeros(k.shape, f32), jnp.zeros(v.shape, f32))
    dq, dk, dv = jax.lax.fori_loop(0, nk, key_block, init)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


# q_start (None, or a traced int32 scalar) moves the queries to keys q_start ...: a chunk of a
# row split over the "seq" axis (`split_over_seq`). `offset` stays static.
@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _flash(q, k, v, segs, q_start, offset, bq, bk):
    return _flash_forward(q, k, v, segs, q_start, offset, bq, bk)


def _flash_fwd(q, k, v, segs, q_start, offset, bq, bk):
    out, lse = _flash_forward(q, k, v, segs, q_start, offset, bq, bk)
    return (out, lse), (q, k, v, segs, q_start, out, lse)


def _flash_bwd(offset, bq, bk, res, cotangents):
    q, k, v, segs, q_start, out, lse = jax.lax.optimization_barrier(res)  # see `_flash_forward`
    d_out, d_lse = cotangents
    dq, dk, dv = _flash_backward(q, k, v, segs, q_start, out, lse, d_out, d_lse, offset, bq, bk)
    return dq, dk, dv, (None,) * len(segs), None


_flash.defvjp(_flash_fwd, _flash_bwd)


# ---------------------------------------------------------------------------------------------
# Blockwise attention: public entry points


def _pad_axis(x: Array, axis: int, size: int, value=0) -> Array:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value)


def blockwise_attention(
    q_BTHd: Array,
    k_BSKd: Array,
    v_BSKd: Array,
    valid_BS: Array,
    causal_offset: int | None = 0,
    block_q: int = 512,
    block_k: int = 512,
    segments: tuple[Array, Array] | None = None,
    query_start: Array | None = None,
) -> tuple[Array, Array]:
    """Grouped-query attention with an online softmax over key blocks; no (T, S) array.

    Args:
      q_BTHd: queries; H must be a multiple of K.
      k_BSKd, v_BSKd: keys and values.
      valid_BS: which keys are real (False: padding, never attended to).
      causal_offset: query i sees key j iff j <= i + causal_offset (static); None: no causality.
      block_q, block_k: block sizes (static); they need not divide T or S (inputs are padded).
      segments: (q_seg_BT, k_seg_BS) int32 for packed rows (several sequences in one row): a
        query sees only the real keys `segment_visible` allows. None: every query one segment.
        With `query_start`, the first is the whole row's, (B, S).
      query_start: None, or a traced int32 scalar: the queries are the T tokens of the S keys'
        row from key `query_start` on (one device's chunk of a row split over the "seq" axis,
        `split_over_seq`), so query i sees key j iff j <= i + query_start + causal_offset.

    Returns:
      out_BTHd in q's dtype (zero for a query that sees no key) and the log-sum-exp of its
      scaled scores, lse_BTH in f32 (`MASK_VALUE` for such a query). Both are differentiable.
    """
    B, T, H, Dh = q_BTHd.shape
    S, K = k_BSKd.shape[1], k_BSKd.shape[2]
    bq, bk = min(block_q, T), min(block_k, S)
    Tp, Sp = -(-T // bq) * bq, -(-S // bk) * bk
    q = q_BTHd.reshape(B, T, K, H // K, Dh).transpose(0, 2, 3, 1, 4)
    k, v = (x.transpose(0, 2, 1, 3) for x in (k_BSKd, v_BSKd))
    q, k, v = _pad_axis(q, 3, Tp), _pad_axis(k, 2, Sp), _pad_axis(v, 2, Sp)
    bounds = None
    if query_start is not None and segments is not None:
        # A chunk of a packed row: the bounds (key positions) come from the whole row.
        take = lambda x: jax.lax.dynamic_slice_in_dim(x, query_start, T, axis=1)  # noqa: E731
        if causal_offset == 0:
            bounds = _pad_axis(take(_packed_bounds(segments[0].astype(jnp.int32))), 1, Tp)
        segments = (take(segments[0]), segments[1])
    segs = _segments(valid_BS, segments, T)
    segs = (_pad_axis(segs[0], 1, Tp), _pad_axis(segs[1], 1, Sp))
    if query_start is None and segments is not None and causal_offset == 0 and T == S:
        # Packed rows: a query block loops over the key blocks of its sequences' prefixes and
        # its own branches only, not over the whole causal prefix of the row.
        bounds = _packed_bounds(segs[0])
    if bounds is not None:
        segs = (*segs, bounds)
    out, lse = _flash(q, k, v, segs, query_start, causal_offset, bq, bk)
    out_BTHd = out[:, :, :, :T].transpose(0, 3, 1, 2, 4).reshape(B, T, H, Dh)
    return out_BTHd, lse[:, :, :, :T].transpose(0, 3, 1, 2).reshape(B, T, H)


def _segments(valid_BS: Array, segments: tuple[Array, Array] | None, T: int) -> tuple[Array, Array]:
    """(q_seg_BT, k_seg_BS) int32 with padding keys in segment 0: without packing every query
    is segment 1 and a key is 1 where it is real."""
    valid_BS = valid_BS.astype(bool)
    if segments is None:
        B = valid_BS.shape[0]
        return jnp.ones((B, T), jnp.int32), valid_BS.astype(jnp.int32)
    q_seg_BT, k_seg_BS = segments
    return q_seg_BT.astype(jnp.int32), jnp.where(valid_BS, k_seg_BS.astype(jnp.int32), 0)


def merge_attention(parts: list[tuple[Array, Array]]) -> tuple[Array, Array]:
    """Exact attention over the union of disjoint key sets, from each set's (out, lse).

    out = sum_i out_i * exp(lse_i - lse), lse = logsumexp_i lse_i. A set a row sees nothing of
    has lse_i = `MASK_VALUE` and weight 0 as soon as another set is visible.
    """
    lse = functools.reduce(jnp.logaddexp, [lse_i for _, lse_i in parts])
    out = sum(o.astype(jnp.float32) * jnp.exp(l_i - lse)[..., None] for o, l_i in parts)
    return out.astype(parts[0][0].dtype), lse


def grouped_attention(
    q_NTHd: Array,
    kp_BPKd: Array,
    vp_BPKd: Array,
    kc_NTKd: Array,
    vc_NTKd: Array,
    prompt_valid_BP: Array,
    completion_valid_NT: Array,
    block: int = 512,
    query_start: Array | None = None,
) -> Array:
    """Blockwise `grouped._grouped_attention`: completion row n = b * G + g over prompt b's
    real keys and its own causal prefix, one softmax over both.

    The prompt part runs the G completions of a prompt as one (G * T)-row query sequence against
    that prompt's keys, so the prompt keys are read per group and never repeated G times; the two
    parts are merged through their log-sum-exps. With `query_start` (`blockwise_attention`),
    the queries are a chunk of the completions, whose keys and validity are whole, (N, S, ...).
    """
    N, T, H, Dh = q_NTHd.shape
    B = kp_BPKd.shape[0]
    q_BMHd = q_NTHd.reshape(B, (N // B) * T, H, Dh)
    prompt = blockwise_attention(q_BMHd, kp_BPKd, vp_BPKd, prompt_valid_BP, None, block, block)
    own = blockwise_attention(
        q_NTHd, kc_NTKd, vc_NTKd, completion_valid_NT, 0, block, block, query_start=query_start
    )
    prompt = (prompt[0].reshape(N, T, H, Dh), prompt[1].reshape(N, T, H))
    return merge_attention([prompt, own])[0]


# ---------------------------------------------------------------------------------------------
# Context parallelism: a row split over the "seq" axis

# local(q_BTHd, k_BSKd, v_BSKd, keys, whole, query_start) -> out_BTHd: one device's attention,
# its T queries the S keys' tokens from `query_start` on; `keys` as gathered (B, S, ...).
LocalAttend = Callable[..., Array]


def split_over_seq(
    local: LocalAttend,
    q_BTHd: Array,
    k_BTKd: Array,
    v_BTKd: Array,
    keys: tuple[Array, ...] = (),
    whole: tuple[Array, ...] = (),
) -> Array:
    """Self-attention of rows whose T tokens are split over the mesh's "seq" axis
    (`sharding.constrain_tokens`), one `shard_map` over the mesh: rows over the other row
    axes, T over "seq", heads over "tensor" where it divides both head counts.

    Each device holds its chunk of T / seq queries and all-gathers the keys, the values and the
    key-side `keys` arrays ((B, T, ...): validity, segment ids) over "seq"; autodiff turns the
    gathers into reduce-scatters of dK and dV. `local` runs the chunk's attention with
    `query_start` = its index on "seq" x T / seq, the first query's key position. `whole`
    arrays (a shared prompt's keys (B, P, K, Dh), values and validity (B, P)) stay whole on
    every seq device: they must split over the rows as the queries do.
    """
    mesh = jax.sharding.get_abstract_mesh()
    P = jax.sharding.PartitionSpec
    seq = sharding.SEQ_AXIS
    B, _, H, _ = q_BTHd.shape
    t = mesh.shape.get("tensor", 1)
    heads = "tensor" if t > 1 and H % t == 0 and k_BTKd.shape[2] % t == 0 else None
    rows = sharding.token_rows(B)

    def spec(x: Array, split: bool) -> jax.sharding.PartitionSpec:
        if sharding.token_rows(x.shape[0]) != rows:
            raise ValueError(
                f"split_over_seq: an array of {x.shape[0]} rows splits over the mesh unlike "
                f"the {B} rows of the queries"
            )
        return P(rows, seq if split else None, *([heads] if x.ndim == 4 else []))

    def per_device(q, k, v, keys, whole):
        query_start = jax.lax.axis_index(seq) * q.shape[1]
        gather = lambda x: jax.lax.all_gather(x, seq, axis=1, tiled=True)  # noqa: E731
        keys = tuple(gather(x) for x in keys)
        return local(q, gather(k), gather(v), keys, whole, query_start)

    qkv = tuple(spec(x, True) for x in (q_BTHd, k_BTKd, v_BTKd))
    in_specs = (*qkv, tuple(spec(x, True) for x in keys), tuple(spec(x, False) for x in whole))
    call = jax.shard_map(per_device, in_specs=in_specs, out_specs=qkv[0], check_vma=False)
    return call(q_BTHd, k_BTKd, v_BTKd, keys, whole)


def causal_chunk_mask(valid_BS: Array, num_queries: int, query_start: Array) -> Array:
    """(B, T, S) mask of `num_queries` queries from key `query_start` on: the real keys of
    their causal prefix (the dense reference's mask, for one chunk of a split row)."""
    S = valid_BS.shape[1]
    rows = query_start + jnp.arange(num_queries)
    return (jnp.arange(S)[None, :] <= rows[:, None])[None] & valid_BS[:, None, :]
