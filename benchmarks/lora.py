"""LoRA applied unmerged against merged weights: time and memory of forward + backward.

Command:
  python benchmarks/lora.py                              # T in 64, 256; rank 16; every variant
  python benchmarks/lora.py --lengths 512 --rank 64 --runs 5

One process, every side: `jax.jit(jax.grad(loss))` of a small decoder's logits, loss =
sum(logits * a fixed random cotangent), gradients w.r.t. the adapters (the base closed over),
adapters on all seven projections. Temp memory is `compiled.memory_analysis()
.temp_size_in_bytes`, GFLOP the compiler's `cost_analysis()` count (both independent of the
machine's load); time is the median wall time of `--runs` calls after a warm-up, the variants
taking turns run by run.

Variants:
  unmerged         `transformer.forward(..., lora=lora)`: x @ W + scale * (x @ A) @ B (what the
                   model does).
  merge_per_layer  the same layer scan with W + scale * A @ B formed for one layer at a time
                   inside the scan body (`lora.merge_layers` on the layer's slice), then the
                   plain layer; defined here for the comparison.
  merge_all        `forward(lora.merge_lora(params, lora))`: every layer merged before the scan.
  full_finetune    the plain forward, gradients w.r.t. all parameters (context only).

Results: see `model/lora.py`'s docstring.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rlvr_jax.model import lora as lora_lib  # noqa: E402
from rlvr_jax.model import transformer  # noqa: E402
from rlvr_jax.model.config import ModelConfig  # noqa: E402

VARIANTS = ("unmerged", "merge_per_layer", "merge_all", "full_finetune")


def merge_per_layer_logits(params, lora, tokens_BT, positions_BT, cfg):
    """`forward` with the adapters merged one layer at a time inside the scan body."""
    B, T = tokens_BT.shape
    x = params.embed[tokens_BT].astype(cfg.dtype)
    attend = transformer._self_attend(jnp.ones((B, T), bool), cfg)
    rope = transformer.rope_tables(positions_BT, cfg, x.dtype)

    def body(x, xs):
        w, ad = xs
        w = lora_lib.merge_layers(w, ad)
        return transformer._layer(x, w, rope, attend, None, None, cfg)[0], None

    x, _ = jax.lax.scan(body, x, (params.layers, lora))
    h = transformer.rms_norm(x, params.final_norm, cfg.norm_eps)
    return transformer.logits_from_hidden(params, h, cfg)


def case(variant, T, args):
    """(jitted grad, its arguments) of one variant."""
    cfg = ModelConfig(
        "llama", args.vocab, args.embed, args.layers, args.heads, args.kv_heads,
        args.embed // args.heads, args.mlp,
    )  # fmt: skip
    params = transformer.init_params(jax.random.key(0), cfg)
    lora_cfg = lora_lib.LoraConfig(rank=args.rank, alpha=2.0 * args.rank)
    lora = lora_lib.init_lora(jax.random.key(1), cfg, lora_cfg)
    lora = jax.tree.map(lambda x: x + 0.01, lora)  # B nonzero, as after a few steps
    B = args.batch
    tokens_BT = jax.random.randint(jax.random.key(2), (B, T), 0, cfg.vocab_size)
    positions_BT = jnp.broadcast_to(jnp.arange(T), (B, T))
    ct = jax.random.normal(jax.random.key(3), (B, T, cfg.vocab_size))

    def logits(p, ad):
        if variant == "unmerged":
            return transformer.forward(p, tokens_BT, positions_BT, cfg, lora=ad)[0]
        if variant == "merge_per_layer":
            return merge_per_layer_logits(p, ad, tokens_BT, positions_BT, cfg)
        if variant == "merge_all":
            return transformer.forward(lora_lib.merge_lora(p, ad), tokens_BT, positions_BT, cfg)[0]
        return transformer.forward(p, tokens_BT, positions_BT, cfg)[0]

    if variant == "full_finetune":
        return jax.jit(jax.grad(lambda p: jnp.sum(logits(p, None) * ct))), (params,)
    # The base is an argument (not a baked-in constant) but is not differentiated.
    grad = jax.grad(lambda ad, p: jnp.sum(logits(p, ad) * ct))
    return jax.jit(grad), (lora, params)


def compile_case(fn, fn_args):
    """(compiled, its arguments, (temp MiB, GFLOP)), after one warm-up call."""
    compiled = fn.lower(*fn_args).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes / 2**20
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    jax.block_until_ready(compiled(*fn_args))
    return compiled, fn_args, (temp, cost["flops"] / 1e9)


def measure(cases, runs):
    """{variant: (temp MiB, GFLOP, median seconds)}. The variants take turns, run by run, so that a
    change in the machine's load hits each of them alike."""
    times = {v: [] for v in cases}
    for _ in range(runs):
        for v, (compiled, fn_args, _) in cases.items():
            start = time.perf_counter()
            jax.block_until_ready(compiled(*fn_args))
            times[v].append(time.perf_counter() - start)
    return {v: (*cases[v][2], statistics.median(t)) for v, t in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="64,256", help="comma-separated T")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--embed", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv_heads", type=int, default=2)
    parser.add_argument("--mlp", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    variants = args.variants.split(",")
    for v in variants:
        if v not in VARIANTS:
            parser.error(f"--variants: {v!r} is not one of {VARIANTS}")
    print(f"L={args.layers} D={args.embed} H={args.heads} K={args.kv_heads} F={args.mlp} "
          f"V={args.vocab} B={args.batch} rank={args.rank}, f32, {jax.default_backend()}, "
          f"medians of {args.runs}")  # fmt: skip
    head = f"{'T':>5}  {'variant':<16} {'temp MiB':>9} {'GFLOP':>7} {'median s':>9}"
    print(head + f" {'time/unmerged':>14}")
    for T in (int(x) for x in args.lengths.split(",")):
        rows = measure({v: compile_case(*case(v, T, args)) for v in variants}, args.runs)
        base = rows.get("unmerged")
        for v, (temp, gflop, secs) in rows.items():
            ratio = f"{secs / base[2]:>13.2f}x" if base else ""
            print(f"{T:>5}  {v:<16} {temp:>9.1f} {gflop:>7.2f} {secs:>9.4f} {ratio}")


if __name__ == "__main__":
    main()
