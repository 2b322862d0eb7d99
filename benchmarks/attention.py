"""Dense against blockwise attention: compiled memory and time of forward + backward.

Command:
  python benchmarks/attention.py                       # T in 1024, 2048, 4096; all variants
  python benchmarks/attention.py --lengths 8192 --variants xla_blockwise,scan_checkpoint
  python benchmarks/attention.py --what layer --lengths 1024,2048

One process, every side: `jax.jit(jax.grad(loss))` of one causal attention call (`--what
attention`: gradients w.r.t. q, k, v) or of one decoder layer (`--what layer`: a 1-layer model's
`hidden_states`, gradients w.r.t. its parameters), where loss = sum(output * a fixed random
cotangent). Temp memory is `compiled.memory_analysis().temp_size_in_bytes`, the compiler's
scratch beyond arguments and outputs; time is the median wall time of `--runs` calls after a
warm-up. Rows of the batch carry 10% left padding so the key-validity mask is not trivial.

Variants: "dense" (`transformer.attention`, the whole masked (B, H, T, S) score matrix),
"xla_blockwise" (`attention.blockwise_attention`, custom VJP) and "scan_checkpoint" (attention
only: the same online softmax written as `lax.map` over query blocks of a `jax.checkpoint`ed
`lax.scan` over all key blocks, differentiated by JAX; defined here, for the comparison in
`model/attention.py`'s docstring).

Results on a 2-core CPU shared with another test job (load average 5 to 8, so times are
noisy; memory is exact), 2026-12-01, B=1, H=8, K=2, Dh=64, f32, blocks of 512, 3 runs:

  python benchmarks/attention.py --lengths 1024,2048,4096
       T  variant            temp MiB  median s  temp/dense  speedup
    1024  dense                  98.1     0.552       1.000    1.00x
    1024  xla_blockwise          47.1     0.371       0.480    1.49x
    1024  scan_checkpoint        98.6     0.648       1.005    0.85x
    2048  dense                 388.1     2.575       1.000    1.00x
    2048  xla_blockwise          52.1     1.499       0.134    1.72x
    2048  scan_checkpoint       160.7     2.205       0.414    1.17x
    4096  dense                1544.2    11.324       1.000    1.00x
    4096  xla_blockwise          55.3     3.149       0.036    3.60x
    4096  scan_checkpoint       285.1     9.407       0.185    1.20x

  python benchmarks/attention.py --what layer --lengths 1024,2048   (one decoder layer, D=512)
       T  variant            temp MiB  median s  temp/dense  speedup
    1024  dense                 179.1     1.496       1.000    1.00x
    1024  xla_blockwise          89.0     1.091       0.497    1.37x
    2048  dense                 551.2     4.550       1.000    1.00x
    2048  xla_blockwise         177.1     2.549       0.321    1.78x

Dense memory grows as T^2 (the f32 score matrix and its softmax are kept for the backward);
blockwise memory is a few block tiles plus O(T) buffers. The speedup is mostly causal block
skipping (about half of the (T, S) blocks are never computed). Not measured on a GPU or TPU.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rlvr_jax.model import attention as attention_lib  # noqa: E402
from rlvr_jax.model import transformer  # noqa: E402
from rlvr_jax.model.config import ModelConfig  # noqa: E402

MASK_VALUE = attention_lib.MASK_VALUE


def scan_checkpoint_attention(q_BTHd, k_BSKd, v_BSKd, valid_BS, block):
    """Causal blockwise attention left to autodiff: `lax.map` over query blocks, each a
    checkpointed `lax.scan` over every key block (a scan cannot skip the hidden ones)."""
    B, T, H, Dh = q_BTHd.shape
    K = k_BSKd.shape[2]
    n = -(-T // block)
    pad = n * block - T
    q = jnp.pad(q_BTHd, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(B, n, block, K, H // K, Dh)
    k, v = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (k_BSKd, v_BSKd))
    k, v = (x.reshape(B, n, block, K, Dh).transpose(1, 0, 2, 3, 4) for x in (k, v))
    valid = jnp.pad(valid_BS, ((0, 0), (0, pad))).reshape(B, n, block).transpose(1, 0, 2)
    scale = 1.0 / math.sqrt(Dh)

    @jax.checkpoint
    def query_block(xs):
        i, q_i = xs  # q_i (B, block, K, G, Dh)
        rows = i * block + jnp.arange(block)

        def key_block(state, ys):
            row_max, row_sum, acc = state
            j, k_j, v_j, valid_j = ys
            cols = j * block + jnp.arange(block)
            mask = valid_j[:, None, None, None, :] & (cols[None, :] <= rows[:, None])
            s = jnp.einsum("bqkgd,bskd->bkgqs", q_i, k_j) * scale
            s = jnp.where(mask, s, MASK_VALUE)
            new_max = jnp.maximum(row_max, s.max(-1))
            p = jnp.where(mask, jnp.exp(s - new_max[..., None]), 0.0)
            alpha = jnp.exp(row_max - new_max)
            acc = alpha[..., None] * acc + jnp.einsum("bkgqs,bskd->bkgqd", p, v_j)
            return (new_max, alpha * row_sum + p.sum(-1), acc), None

        shape = (B, K, H // K, block)
        init = (jnp.full(shape, MASK_VALUE), jnp.zeros(shape), jnp.zeros((*shape, Dh)))
        (_, row_sum, acc), _ = jax.lax.scan(key_block, init, (jnp.arange(n), k, v, valid))
        return acc / jnp.where(row_sum > 0, row_sum, 1.0)[..., None]  # (B, K, G, block, Dh)

    out = jax.lax.map(query_block, (jnp.arange(n), q.transpose(1, 0, 2, 3, 4, 5)))
    return out.transpose(1, 0, 4, 2, 3, 5).reshape(B, n * block, H, Dh)[:, :T]


def _attention_loss(variant, valid_BT, ct, block):
    cfg = ModelConfig("llama", 8, 8, 1, ct.shape[2], 1, ct.shape[3], 8)
    T = valid_BT.shape[1]
    if variant == "dense":
        mask_BTS = jnp.tril(jnp.ones((T, T), bool))[None] & valid_BT[:, None, :]
        attend = lambda q, k, v: transformer.attention(q, k, v, mask_BTS, cfg)
    elif variant == "xla_blockwise":
        attend = lambda q, k, v: attention_lib.blockwise_attention(
            q, k, v, valid_BT, 0, block, block
        )[0]
    else:
        attend = lambda q, k, v: scan_checkpoint_attention(q, k, v, valid_BT, block)
    return lambda q, k, v: jnp.sum(attend(q, k, v) * ct)


def attention_case(variant, T, args):
    """(jitted grad, its arguments) for one attention call."""
    keys = jax.random.split(jax.random.key(0), 4)
    B, H, K, Dh = args.batch, args.heads, args.kv_heads, args.head_dim
    q = jax.random.normal(keys[0], (B, T, H, Dh))
    k, v = (jax.random.normal(x, (B, T, K, Dh)) for x in keys[1:3])
    valid_BT = jnp.arange(T)[None, :] >= T // 10
    valid_BT = jnp.broadcast_to(valid_BT, (B, T))
    ct = jax.random.normal(keys[3], (B, T, H, Dh)) * valid_BT[:, :, None, None]
    loss = _attention_loss(variant, valid_BT, ct, args.block)
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2))), (q, k, v)


def layer_case(variant, T, args):
    """(jitted grad, its arguments) for a one-layer decoder."""
    H, K, Dh = args.heads, args.kv_heads, args.head_dim
    cfg = ModelConfig(
        "llama", 256, H * Dh, 1, H, K, Dh, 4 * H * Dh, attention=variant,
        attention_block=args.block,
    )  # fmt: skip
    params = transformer.init_params(jax.random.key(0), cfg)
    B = args.batch
    tokens_BT = jax.random.randint(jax.random.key(1), (B, T), 0, cfg.vocab_size)
    mask_BT = jnp.broadcast_to(jnp.arange(T)[None, :] >= T // 10, (B, T))
    positions_BT = transformer.positions_from_mask(mask_BT)
    ct = jax.random.normal(jax.random.key(2), (B, T, cfg.embed_dim)) * mask_BT[..., None]

    def loss(p):
        h, _ = transformer.hidden_states(p, tokens_BT, positions_BT, cfg, mask_BT=mask_BT)
        return jnp.sum(h * ct)

    return jax.jit(jax.grad(loss)), (params,)


def measure(fn, fn_args, runs):
    """(temp MiB, median seconds) of a jitted function."""
    compiled = fn.lower(*fn_args).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes / 2**20
    jax.block_until_ready(compiled(*fn_args))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*fn_args))
        times.append(time.perf_counter() - start)
    return temp, statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="1024,2048,4096", help="comma-separated T")
    parser.add_argument(
        "--variants", default="", help="comma-separated; default: all that apply to --what"
    )
    parser.add_argument("--what", choices=("attention", "layer"), default="attention")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv_heads", type=int, default=2)
    parser.add_argument("--head_dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=512)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    variants = ["dense", "xla_blockwise"] + (
        ["scan_checkpoint"] if args.what == "attention" else []
    )
    variants = args.variants.split(",") if args.variants else variants
    case = attention_case if args.what == "attention" else layer_case
    if args.what == "layer" and "scan_checkpoint" in variants:
        parser.error("scan_checkpoint is an attention-only variant")
    print(f"{args.what}: B={args.batch} H={args.heads} K={args.kv_heads} Dh={args.head_dim} "
          f"block={args.block} f32, {jax.default_backend()}")  # fmt: skip
    header = f"{'T':>6}  {'variant':<16} {'temp MiB':>10} {'median s':>9} {'temp/dense':>11}"
    print(header + f" {'speedup':>8}")
    for T in (int(x) for x in args.lengths.split(",")):
        rows = {v: measure(*case(v, T, args), args.runs) for v in variants}
        base = rows.get("dense")
        for v, (temp, secs) in rows.items():
            ratio = f"{temp / base[0]:>11.3f} {base[1] / secs:>7.2f}x" if base else ""
            print(f"{T:>6}  {v:<16} {temp:>10.1f} {secs:>9.3f} {ratio}")


if __name__ == "__main__":
    main()
