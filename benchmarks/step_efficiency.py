"""The padded update against the packed update (`rl.pack`) on long-tailed answer lengths.

Command (CPU):

    PYTHONPATH=. python benchmarks/step_efficiency.py                  # imbalance 1, 2, 4, 8
    PYTHONPATH=. python benchmarks/step_efficiency.py --imbalance 4 --runs 3

One process, both sides on the same rollout, weights and rewards: a random model (`--layers`,
`--dim`, vocabulary 512), B x G rows of a P-token prompt and at most T generated tokens whose
lengths are lognormal with the given imbalance (max / mean of the lengths, as a step of a
reasoning run has). For each side: the update's compiled FLOPs (XLA's cost analysis) against
the FLOPs its real tokens need (the padded update's FLOPs times real tokens over padded
positions), and the median wall time of `--runs` updates after one warm-up, each waited for.
The last column is the packed update's time over the padded one's. Times are noisy on a shared
machine: read the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlvr_jax.model import config as config_lib
from rlvr_jax.model import transformer as tf
from rlvr_jax.rl import packing as packing_lib
from rlvr_jax.rl import state as state_lib
from rlvr_jax.rl import train_step as ts
from rlvr_jax.sampling.config import SamplerConfig
from rlvr_jax.types import FINISH_EOS, FINISH_LENGTH, Rollout


def lognormal_lengths(n: int, T: int, imbalance: float, rng: np.random.Generator) -> np.ndarray:
    """n lengths in [1, T] whose max is T and whose mean is about T / imbalance."""
    if imbalance <= 1:
        return np.full(n, T)
    sigma = 0.3
    for _ in range(60):  # widen the spread until max / mean reaches the imbalance
        x = rng.lognormal(0.0, sigma, n)
        lengths = np.maximum(1, np.round(x / x.max() * T)).astype(int)
        if T / lengths.mean() >= imbalance:
            return lengths
        sigma *= 1.1
    return lengths


def make_rollout(B: int, G: int, P: int, T: int, imbalance: float, seed: int) -> Rollout:
    rng = np.random.default_rng(seed)
    N = B * G
    lengths = lognormal_lengths(N, T, imbalance, rng)
    mask = np.arange(T)[None, :] < lengths[:, None]
    return Rollout(
        prompt_NP=jnp.asarray(np.repeat(rng.integers(1, 512, (B, P)), G, axis=0), jnp.int32),
        prompt_lengths_N=jnp.full((N,), P, jnp.int32),
        tokens_NT=jnp.asarray(np.where(mask, rng.integers(1, 512, (N, T)), 0), jnp.int32),
        logp_NT=jnp.asarray(np.where(mask, -1.0, 0.0), jnp.float32),
        mask_NT=jnp.asarray(mask),
        injected_NT=jnp.zeros((N, T), bool),
        lengths_N=jnp.asarray(lengths, jnp.int32),
        finish_N=jnp.asarray(np.where(lengths == T, FINISH_LENGTH, FINISH_EOS), jnp.int32),
    )


def measure(args, imbalance: float) -> dict:
    cfg = config_lib.PRESETS["tiny"].replace(
        num_layers=args.layers,
        embed_dim=args.dim,
        mlp_dim=4 * args.dim,
        attention="xla_blockwise",
        attention_block=128,
    )
    B, G, P, T = args.prompts, args.group, args.prompt_len, args.max_new_tokens
    sampler = SamplerConfig(max_new_tokens=T, eos_ids=(1,), pad_id=0)
    rl = ts.RLConfig(group_size=G, sampler=sampler, num_microbatches=args.microbatches)
    sgd = optax.sgd(1e-3)
    update = ts.build_update(cfg, rl, sgd, optax.constant_schedule(1e-3))
    params = tf.init_params(jax.random.key(0), cfg)
    rollout = make_rollout(B, G, P, T, imbalance, seed=int(imbalance * 10))
    rewards = (np.arange(B * G) % 3 == 0).astype(np.float32)
    parts = {"correct": rewards}
    plan = packing_lib.plan(
        np.asarray(rollout.prompt_lengths_N),
        np.asarray(rollout.mask_NT),
        P,
        num_microbatches=args.microbatches,
    )
    plan = jax.tree.map(jnp.asarray, plan)
    real = P * B * G + int(np.asarray(rollout.lengths_N).sum())
    out = {"imbalance": T / float(np.mean(np.asarray(rollout.lengths_N))), "real": real}
    for name, packing in (("padded", None), ("packed", plan)):
        state = state_lib.init_train_state(params, sgd, jax.random.key(1), False)
        compiled = update.lower(state, rollout, rewards, parts, packing).compile()
        flops = compiled.cost_analysis()
        flops = flops[0] if isinstance(flops, list) else flops
        times = []
        for i in range(args.runs + 1):
            state = state_lib.init_train_state(
                jax.tree.map(jnp.copy, params), sgd, jax.random.key(1), False
            )
            start = time.perf_counter()
            jax.block_until_ready(compiled(state, rollout, rewards, parts, packing))
            if i:
                times.append(time.perf_counter() - start)
        out[name] = (float(flops.get("flops", 0.0)), statistics.median(times))
    out["positions"] = {"padded": B * G * (P + T), "packed": int(np.prod(plan.src_MRL.shape))}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--imbalance", default="1,2,4,8")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    print(
        f"{jax.devices()[0].platform}, {jax.device_count()} devices; B={args.prompts} "
        f"G={args.group} P={args.prompt_len} T={args.max_new_tokens}, {args.layers} layers of "
        f"{args.dim}, {args.microbatches} microbatches, median of {args.runs}"
    )
    head = (
        "imbalance",
        "positions pad/pack",
        "GFLOP pad",
        "GFLOP pack",
        "pack/real",
        "s pad",
        "s pack",
        "pack/pad time",
    )
    print(" | ".join(head))
    for imbalance in (float(x) for x in args.imbalance.split(",")):
        r = measure(args, imbalance)
        (f_pad, t_pad), (f_pack, t_pack) = r["padded"], r["packed"]
        need = f_pad * r["real"] / r["positions"]["padded"]
        print(
            f"{r['imbalance']:9.2f} | {r['positions']['padded']:>8}/{r['positions']['packed']:<8} "
            f"| {f_pad / 1e9:9.1f} | {f_pack / 1e9:10.1f} | {f_pack / need:9.2f} | {t_pad:5.2f} | "
            f"{t_pack:6.2f} | {t_pack / t_pad:13.2f}"
        )


if __name__ == "__main__":
    main()
