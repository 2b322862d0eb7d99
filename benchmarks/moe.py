"""MoE dispatch: sorted tokens with grouped matmuls against every-expert-on-every-token and a
capacity-based dispatch, forward and forward + backward of one MoE block.

Command:
  python benchmarks/moe.py                      # the default shapes below
  python benchmarks/moe.py --tokens 64 1024 --runs 5

One process, every side, the same weights and tokens: `jax.jit` of one layer's `moe.moe_mlp`
body (router, dispatch, combine) on N tokens of width D, E experts of width F, top k, f32.
"fwd" times the output; "fwd+bwd" `jax.grad` of sum(output * a fixed random cotangent) w.r.t.
the tokens and every weight (RL trains through the dispatch). Time is the median wall time of
`--runs` calls after a warm-up, the variants taking turns run by run; GFLOP is the compiler's
`cost_analysis()` count of the fwd+bwd program.

Variants:
  ragged    `moe.ragged_experts` (what the model does with moe_dispatch="ragged"): assignments
            sorted by expert, `jax.lax.ragged_dot` per weight, no token dropped.
  dense     `moe.dense_experts` (moe_dispatch="dense"): all E experts on all N tokens.
  capacity  defined here for the comparison: each expert takes at most
            C = ceil(capacity_factor x N x k / E) tokens, scattered into an (E, C, D) buffer, one
            batched matmul per weight, gathered back; assignments past C are dropped (their
            share printed). Not shipped: which tokens drop depends on the rest of the batch.

Results: see docs/model.md ("Mixture of experts").
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

from rlvr_jax.model import moe  # noqa: E402
from rlvr_jax.model.config import ModelConfig  # noqa: E402

VARIANTS = ("ragged", "blocked", "dense", "capacity")


def capacity_experts(h_ND, routing, w, capacity_factor):
    """Capacity-based dispatch (GShard-style slots, scatter/gather rather than one-hot
    matmuls): returns the experts' weighted sum (N, D) and the share of dropped assignments."""
    N, D = h_ND.shape
    E = w.gate.shape[0]
    k = routing.experts_Nk.shape[1]
    C = max(1, math.ceil(capacity_factor * N * k / E))
    expert_A = routing.experts_Nk.reshape(N * k)
    order_A = jnp.argsort(expert_A, stable=True)
    sorted_e = expert_A[order_A]
    starts_E = jnp.cumsum(jnp.bincount(expert_A, length=E)) - jnp.bincount(expert_A, length=E)
    slot_A = jnp.arange(N * k) - starts_E[sorted_e]
    kept_A = slot_A < C
    # Dropped assignments go to a spare row E*C that nothing reads.
    dest_A = jnp.where(kept_A, sorted_e * C + slot_A, E * C)
    buf = jnp.zeros((E * C + 1, D), h_ND.dtype).at[dest_A].set(h_ND[order_A // k])
    x_ECD = buf[: E * C].reshape(E, C, D)
    g = jnp.einsum("ecd,edf->ecf", x_ECD, w.gate)
    u = jnp.einsum("ecd,edf->ecf", x_ECD, w.up)
    y_ECD = jnp.einsum("ecf,efd->ecd", jax.nn.silu(g) * u, w.down)
    y_AD = jnp.concatenate([y_ECD.reshape(E * C, D), jnp.zeros((1, D), h_ND.dtype)])[dest_A]
    inverse_A = jnp.zeros_like(order_A).at[order_A].set(jnp.arange(N * k, dtype=order_A.dtype))
    y_NkD = y_AD[inverse_A].reshape(N, k, D)
    dropped = 1.0 - jnp.mean(kept_A.astype(jnp.float32))
    return jnp.einsum("nkd,nk->nd", y_NkD, routing.weights_Nk), dropped


def block(variant, cfg, capacity_factor):
    """(h_ND, w) -> (out_ND, dropped share) of one MoE block with `variant`'s dispatch."""

    def run(h_ND, w):
        routing = moe.route(h_ND, w.router, cfg)
        if variant == "capacity":
            return capacity_experts(h_ND, routing, w, capacity_factor)
        return moe.DISPATCH[variant](h_ND, routing, w), jnp.float32(0)

    return run


def measure(args, N: int) -> list[tuple]:
    cfg = ModelConfig(
        model_type="qwen3_moe",
        vocab_size=8,
        embed_dim=args.embed,
        num_layers=1,
        num_heads=1,
        num_kv_heads=1,
        head_dim=8,
        mlp_dim=8,
        num_experts=args.experts,
        num_experts_per_tok=args.top_k,
        moe_mlp_dim=args.width,
        norm_topk_prob=True,
    )
    w = jax.tree.map(lambda x: x[0], moe.init_moe(jax.random.key(0), cfg, 0.05, jnp.float32))
    w = type(w)(**{**w.__dict__, "router": w.router * 20})  # a spread, uneven routing
    h = jax.random.normal(jax.random.key(1), (N, cfg.embed_dim))
    cot = jax.random.normal(jax.random.key(2), (N, cfg.embed_dim))
    progs = {}
    for v in VARIANTS:
        f = block(v, cfg, args.capacity_factor)
        fwd = jax.jit(f)
        grad = jax.jit(jax.grad(lambda h, w, f=f: jnp.sum(f(h, w)[0] * cot), argnums=(0, 1)))
        flops = grad.lower(h, w).compile().cost_analysis().get("flops", float("nan"))
        progs[v] = (fwd, grad, flops)
        jax.block_until_ready((fwd(h, w), grad(h, w)))
    times = {(v, p): [] for v in VARIANTS for p in ("fwd", "fwd+bwd")}
    for _ in range(args.runs):
        for v in VARIANTS:
            fwd, grad, _ = progs[v]
            for phase, fn in (("fwd", fwd), ("fwd+bwd", grad)):
                t0 = time.perf_counter()
                jax.block_until_ready(fn(h, w))
                times[v, phase].append(time.perf_counter() - t0)
    rows = []
    base = {p: statistics.median(times["ragged", p]) for p in ("fwd", "fwd+bwd")}
    for v in VARIANTS:
        fwd_s = statistics.median(times[v, "fwd"])
        both_s = statistics.median(times[v, "fwd+bwd"])
        dropped = float(progs[v][0](h, w)[1])
        rows.append(
            (N, v, fwd_s * 1e3, both_s * 1e3, both_s / base["fwd+bwd"], progs[v][2] / 1e9, dropped)
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[16, 512, 2048])
    ap.add_argument("--embed", type=int, default=256)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--capacity-factor", type=float, default=1.25)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    print(
        f"D={args.embed} E={args.experts} k={args.top_k} F={args.width} f32, "
        f"capacity factor {args.capacity_factor}, median of {args.runs}, {jax.devices()[0]}"
    )
    print("| tokens N | dispatch | fwd ms | fwd+bwd ms | fwd+bwd / ragged | GFLOP | dropped |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for N in args.tokens:
        for N_, v, f_ms, b_ms, ratio, gflop, drop in measure(args, N):
            print(
                f"| {N_} | {v} | {f_ms:.2f} | {b_ms:.2f} | {ratio:.2f}x | {gflop:.3f} | "
                f"{drop:.1%} |"
            )


if __name__ == "__main__":
    main()
