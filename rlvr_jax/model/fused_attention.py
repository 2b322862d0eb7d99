"""The fused attention kernels, cuDNN on NVIDIA GPUs and Pallas splash on TPUs, and
`causal_attention`, which runs the implementation `attention.resolve_attention` chose for a
full causal pass (blockwise or one of these kernels).

Shapes: B batch rows, T tokens, H query heads, K kv heads, Dh head dim.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash

from rlvr_jax.model import sharding
from rlvr_jax.model.attention import _pad_axis, blockwise_attention

Array = jax.Array


# ---------------------------------------------------------------------------------------------
# Fused kernels (GPU, TPU)


def _real_run(valid_BT: Array) -> tuple[Array, Array, Array]:
    """Start, length (at least 1) and whether the real tokens of each row are one run."""
    T = valid_BT.shape[1]
    start_B = jnp.argmax(valid_BT, axis=1).astype(jnp.int32)
    length_B = jnp.sum(valid_BT, axis=1, dtype=jnp.int32)
    last_B = T - 1 - jnp.argmax(valid_BT[:, ::-1], axis=1)
    one_run_B = (length_B == 0) | (last_B - start_B + 1 == length_B)
    return start_B, jnp.maximum(length_B, 1), one_run_B


def cudnn_attention(
    q_BTHd: Array, k_BTKd: Array, v_BTKd: Array, valid_BT: Array, implementation: str = "cudnn"
) -> Array:
    """Causal self-attention through `jax.nn.dot_product_attention`'s cuDNN kernel.

    cuDNN expresses padding as sequence lengths, i.e. valid prefixes. Each row is rotated left
    by its leading padding so that its real tokens (a left-padded prompt followed by a
    right-padded completion: one run) form the prefix, attended causally with the run's length
    as query and key length, and rotated back. Causality by index is unchanged inside the run.
    A row whose real tokens are not one run cannot be expressed: its output is NaN, so that the
    misuse shows instead of silently attending across the gap. Outputs at padding are zero.

    Args:
      q_BTHd, k_BTKd, v_BTKd: bf16 or fp16 queries, keys, values of the same T tokens.
      valid_BT: the real tokens.
      implementation: "cudnn"; "xla" runs the same arrangement through XLA (tests on CPU).
    """
    T = q_BTHd.shape[1]
    start_B, length_B, one_run_B = _real_run(valid_BT.astype(bool))
    to_run_BT = (jnp.arange(T)[None, :] + start_B[:, None]) % T
    from_run_BT = (jnp.arange(T)[None, :] - start_B[:, None]) % T
    gather = lambda x, idx: jnp.take_along_axis(x, idx[:, :, None, None], axis=1)
    out = jax.nn.dot_product_attention(
        *(gather(x, to_run_BT) for x in (q_BTHd, k_BTKd, v_BTKd)),
        is_causal=True,
        query_seq_lengths=length_B,
        key_value_seq_lengths=length_B,
        implementation=implementation,
    )
    out = gather(out, from_run_BT)
    out = jnp.where(valid_BT[:, :, None, None], out, jnp.zeros((), out.dtype))
    return jnp.where(one_run_B[:, None, None, None], out, jnp.nan)


def _splash_call(q_BHTd, k_BKTd, v_BKTd, seg_BT, block: int, interpret: bool) -> Array:
    """The splash kernel over a batch, one example per `vmap` lane."""
    H, T = q_BHTd.shape[1], q_BHTd.shape[2]
    mask = splash.MultiHeadMask([splash.CausalMask((T, T))] * H)
    sizes = dict.fromkeys(("block_q", "block_kv", "block_kv_compute", "block_q_dkv"), block)
    sizes.update(dict.fromkeys(("block_kv_dkv", "block_kv_dkv_compute"), block))
    sizes.update(block_q_dq=block, block_kv_dq=block)
    kernel = splash.make_splash_mha(
        mask,
        block_sizes=splash.BlockSizes(**sizes),
        head_shards=1,
        q_seq_shards=1,
        interpret=interpret,
    )
    segments = splash.SegmentIds(q=seg_BT, kv=seg_BT)
    return jax.vmap(kernel)(q_BHTd, k_BKTd, v_BKTd, segment_ids=segments)


def pallas_attention(
    q_BTHd: Array,
    k_BTKd: Array,
    v_BTKd: Array,
    valid_BT: Array,
    block: int = 512,
    interpret: bool = False,
    segment_ids_BT: Array | None = None,
) -> Array:
    """Causal self-attention through jax's Pallas splash attention kernel (TPU).

    Padding is a segment id: real tokens are segment 1, padding segment 0, so a real query sees
    exactly the real keys of its causal prefix, whatever the padding pattern. A padding query
    sees padding keys (never an empty row: it sees itself); its output is junk, ignored
    downstream, and set to zero here. T is padded to a multiple of the kernel's block (128 lanes
    at least). Under an activation mesh the kernel runs per shard (`shard_map`): rows over the
    "batch" axes, heads over "tensor" when it divides both head counts.

    Args:
      q_BTHd, k_BTKd, v_BTKd: queries, keys, values of the same T tokens.
      valid_BT: the real tokens.
      block: the kernel's block size, rounded down to a multiple of 128.
      interpret: run the kernel in the Pallas interpreter (tests on CPU).
      segment_ids_BT: packed rows' segments (> 0 where real): a query sees its own segment's
        keys only (splash compares ids: branch 0 only, see `attention.BRANCHES`). None: one
        segment of the real tokens.
    """
    B, T, H, Dh = q_BTHd.shape
    block = max(128, min(block, -(-T // 128) * 128) // 128 * 128)
    Tp = -(-T // block) * block
    q = (q_BTHd * (1.0 / math.sqrt(Dh))).astype(q_BTHd.dtype)  # splash does not scale
    q, k, v = (_pad_axis(x, 1, Tp).transpose(0, 2, 1, 3) for x in (q, k_BTKd, v_BTKd))
    seg_BT = valid_BT.astype(jnp.int32)
    if segment_ids_BT is not None:
        seg_BT = jnp.where(valid_BT, segment_ids_BT.astype(jnp.int32), 0)
    seg_BT = _pad_axis(seg_BT, 1, Tp)
    call = functools.partial(_splash_call, block=block, interpret=interpret)
    mesh = jax.sharding.get_abstract_mesh()
    if sharding.has_row_axes(mesh):
        P = jax.sharding.PartitionSpec
        rows = sharding.logical_spec(("batch",), (B,), mesh)
        rows = rows[0] if len(rows) else None
        t = mesh.shape.get("tensor", 1)
        heads = "tensor" if t > 1 and H % t == 0 and k_BTKd.shape[2] % t == 0 else None
        spec = P(rows, heads)
        call = jax.shard_map(
            call, in_specs=(spec, spec, spec, P(rows)), out_specs=spec, check_vma=False
        )
    out = call(q, k, v, seg_BT).transpose(0, 2, 1, 3)[:, :T]
    return jnp.where(valid_BT[:, :, None, None], out, jnp.zeros((), out.dtype))


def causal_attention(
    q_BTHd: Array,
    k_BTKd: Array,
    v_BTKd: Array,
    valid_BT: Array,
    impl: str,
    block: int,
    segment_ids_BT: Array | None = None,
) -> Array:
    """Causal self-attention over one row's valid tokens by a resolved implementation other
    than "dense" ("xla_blockwise", "cudnn" or "pallas"); with `segment_ids_BT` (packed rows)
    each token attends where `attention.segment_visible` allows (not "cudnn": its lengths-based
    masking cannot express segments; "pallas" only with branch 0, plain segment ids)."""
    if impl == "xla_blockwise":
        segments = None if segment_ids_BT is None else (segment_ids_BT, segment_ids_BT)
        out = blockwise_attention(q_BTHd, k_BTKd, v_BTKd, valid_BT, 0, block, block, segments)
        return out[0]
    if impl == "cudnn":
        if segment_ids_BT is not None:
            raise ValueError(
                "packed rows need segment masking, which the cudnn attention cannot express; "
                "use model.attention='xla_blockwise' (or 'dense') with rl.pack"
            )
        return cudnn_attention(q_BTHd, k_BTKd, v_BTKd, valid_BT)
    if impl == "pallas":
        return pallas_attention(
            q_BTHd, k_BTKd, v_BTKd, valid_BT, block, segment_ids_BT=segment_ids_BT
        )
    raise ValueError(f"causal_attention: unknown implementation {impl!r}")
