"""The plain RL step against the efficient one, on long-tailed answer lengths.

    python benchmarks/step_efficiency.py                          # imbalance 1, 2, 4, 8
    python benchmarks/step_efficiency.py --imbalance 4 --runs 5
    python benchmarks/step_efficiency.py --flops-only             # the FLOPs' causes, in seconds
    python benchmarks/step_efficiency.py --smollm2 --prompts 2 --max-new-tokens 1024 --slots 4

Both sides run in this process on the same prompts, key, weights and rewards:
- plain: the static sampler (every row decodes until the longest ends), then the padded update
  (each group's prompt once, `rl.shared_prompt_forward`);
- efficient: continuous batching in `--slots` decode slots (`sampling.continuous`), then the
  packed update (`rl.pack`), or the padded one where packing would not pay
  (`packing.worth_packing`, the RL stage's rule).

The model has random layers (`--layers`, `--dim`, vocabulary 512) and forced answer lengths
(`workloads.forced_length_model`), lognormal with the given imbalance (max / mean of the lengths,
as in a step of a reasoning run); the two rollouts are asserted identical. The update reads each
group's prompt as its first row's (a forced length needs a prompt per row); a row is correct
with probability 0.3 (a fixed draw), so some groups are all wrong.

With `--smollm2`, SmolLM2-135M-Instruct (the embedded weights) samples answers to GSM8K
questions asked step by step (../shared/data), at temperature 0.7: real lengths. Its two
rollouts agree where f32 rounding allows (the rows that part are counted), and both updates
train on the static sampler's rollout, so that they compute the same rows.

Columns: each update's FLOPs and those its real tokens need (each group's prompt once, every
completion token), counted from the layouts by `workloads.update_flops` (XLA's cost analysis
counts a loop body once, and the layers, the microbatches and the attention blocks are loops);
"eff / real", the efficient update's over the real need; the median wall seconds of rollout,
update (the host's packing plan included) and step over `--runs` after a warm-up; the useful
trajectories per hour of step time (rows of groups whose rewards differ,
`rl.outputs.useful_rows`), the same rows on both sides; and plain / efficient step time. Times
are noisy on a shared machine: read the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dataclasses  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from workloads import (  # noqa: E402
    forced_length_model,
    forcing_prompts,
    gsm8k_prompts,
    layout_flops,
    lognormal_lengths,
)

from rlvr_jax.model.config import PRESETS  # noqa: E402
from rlvr_jax.rl import packing as packing_lib  # noqa: E402
from rlvr_jax.rl import state as state_lib  # noqa: E402
from rlvr_jax.rl import train_step as ts  # noqa: E402
from rlvr_jax.rl.outputs import useful_rows  # noqa: E402
from rlvr_jax.sampling.config import SamplerConfig, sampling_params  # noqa: E402
from rlvr_jax.sampling.continuous import generate_continuous  # noqa: E402
from rlvr_jax.sampling.loop import generate, init_decode_cache  # noqa: E402


def _rollout_side(params, cfg, scfg, prompt, lengths, slots: int | None, temperature=1.0):
    """run() -> (seconds, rollout) of the static sampler (slots None) or continuous batching."""
    N, P = prompt.shape
    cache = {"c": init_decode_cache(cfg, scfg, N if slots is None else slots, P)}
    sp, key = sampling_params(N, temperature=temperature), jax.random.key(0)

    def run():
        start = time.perf_counter()
        if slots is None:
            r, cache["c"] = generate(
                params, prompt, lengths, key, sp, cache["c"], model_cfg=cfg, cfg=scfg
            )
        else:
            r, _, cache["c"] = generate_continuous(
                params, prompt, lengths, key, sp, cache["c"], model_cfg=cfg, cfg=scfg,
                num_slots=slots,
            )  # fmt: skip
        jax.block_until_ready(r)
        return time.perf_counter() - start, r

    return run


def _grouped(rollout, G: int):
    """`rollout` with each group's rows reading its first row's prompt."""
    first = lambda x: jnp.repeat(x[::G], G, axis=0)  # noqa: E731
    prompt, lengths = first(rollout.prompt_NP), first(rollout.prompt_lengths_N)
    return dataclasses.replace(rollout, prompt_NP=prompt, prompt_lengths_N=lengths)


def _smollm2_workload(args):
    """(params, cfg, end ids, None, prompt, prompt lengths) of SmolLM2 on GSM8K questions;
    sets `args.prompt_len` to the prompts' bucket."""
    params, cfg, tok, prompt, prompt_lengths = gsm8k_prompts(args.prompts * args.group, args.group)
    args.prompt_len = prompt.shape[1]
    cfg = cfg.replace(attention="xla_blockwise", attention_block=128)
    return params, cfg, tok.eos_ids, None, prompt, prompt_lengths


def _workload(args, imbalance: float):
    """(params, cfg, end id, wanted lengths, prompt, prompt lengths) at `imbalance`."""
    base = PRESETS["tiny"].replace(
        num_layers=args.layers,
        embed_dim=args.dim,
        mlp_dim=4 * args.dim,
        attention="xla_blockwise",
        attention_block=128,
    )
    T = args.max_new_tokens
    params, cfg, end = forced_length_model(base, T)
    rng = np.random.default_rng(int(imbalance * 10))
    want = lognormal_lengths(args.prompts * args.group, T, imbalance, rng)
    prompt, prompt_lengths = forcing_prompts(want, T, args.prompt_len, cfg.vocab_size, rng)
    return params, cfg, end, want, prompt, prompt_lengths


def _plan(args, cfg, prompt_lengths_N, mask_NT):
    """The efficient side's packing of the rows (None: the padded update), as the RL stage
    plans it: each group's prompt read as its first row's."""
    G, P, T = args.group, args.prompt_len, args.max_new_tokens
    N = len(prompt_lengths_N)
    packing = packing_lib.plan(
        np.repeat(np.asarray(prompt_lengths_N)[::G], G),
        np.asarray(mask_NT),
        P,
        length=args.pack_length,
        num_microbatches=args.microbatches,
        group_size=G,
        block=cfg.attention_block,
    )
    padded = packing_lib.padded_positions(N, P, T, G)
    return packing if packing_lib.worth_packing(packing, padded) else None


def flops(args, imbalance: float) -> dict:
    """The FLOPs of both updates and of the real need, and the packed update's waste by cause,
    from the layouts alone (the forced lengths are the rollout's: no model runs)."""
    _, cfg, _, want, _, prompt_lengths = _workload(args, imbalance)
    G, P, T = args.group, args.prompt_len, args.max_new_tokens
    packing = _plan(args, cfg, prompt_lengths, np.arange(T)[None, :] < want[:, None])
    p_B = np.asarray(prompt_lengths)[::G]
    out = layout_flops(cfg, p_B, want, P, T, packing, block=cfg.attention_block)
    out["imbalance"] = T / float(want.mean())
    out["tokens"] = int(p_B.sum() + want.sum())
    out["shape"] = None if packing is None else packing.src_MRL.shape
    return out


def measure(args, imbalance: float) -> dict:
    if args.smollm2:
        params, cfg, ends, want, prompt, prompt_lengths = _smollm2_workload(args)
    else:
        params, cfg, end, want, prompt, prompt_lengths = _workload(args, imbalance)
        ends = (end,)
    B, G, P, T = args.prompts, args.group, args.prompt_len, args.max_new_tokens
    N = B * G
    scfg = SamplerConfig(max_new_tokens=T, eos_ids=ends, pad_id=0)
    temperature = 0.7 if args.smollm2 else 1.0
    side = lambda slots: _rollout_side(  # noqa: E731
        params, cfg, scfg, prompt, prompt_lengths, slots, temperature
    )
    rollouts = {"plain": side(None), "efficient": side(args.slots)}
    rl = ts.RLConfig(group_size=G, sampler=scfg, num_microbatches=args.microbatches)
    sgd = optax.sgd(1e-3)
    update = ts.build_update(cfg, rl, sgd, optax.constant_schedule(1e-3))
    fresh = lambda: state_lib.init_train_state(  # noqa: E731
        jax.tree.map(jnp.copy, params), sgd, jax.random.key(1), False
    )
    _, ref = rollouts["plain"]()
    _, other = rollouts["efficient"]()
    same = int((np.asarray(other.tokens_NT) == np.asarray(ref.tokens_NT)).all(axis=1).sum())
    if want is None:  # real lengths: both updates train on one rollout
        print(f"  {same} of {N} rows identical in the two rollouts", flush=True)
        other = ref
    else:
        np.testing.assert_array_equal(np.asarray(ref.lengths_N), want, err_msg="not forced")
        assert same == N, f"{N - same} rows differ"
    lengths = np.asarray(ref.lengths_N)
    rewards = (np.random.default_rng(1).random(N) < 0.3).astype(np.float32)
    parts = {"correct": rewards}
    padded = packing_lib.padded_positions(N, P, T, G)
    plan = lambda r: _plan(args, cfg, r.prompt_lengths_N, r.mask_NT)  # noqa: E731

    first = plan(other)
    compiled = {
        side: update.lower(fresh(), _grouped(r, G), rewards, parts, packing).compile()
        for side, r, packing in (("plain", ref, None), ("efficient", other, first))
    }
    times = {side: {"rollout": [], "update": []} for side in compiled}
    for i in range(args.runs + 1):
        for side in compiled:
            seconds, r = rollouts[side]()
            r = ref if want is None else r
            rollout, state = _grouped(r, G), fresh()
            start = time.perf_counter()
            packing = None if side == "plain" else plan(r)
            jax.block_until_ready(compiled[side](state, rollout, rewards, parts, packing))
            if i:
                times[side]["rollout"].append(seconds)
                times[side]["update"].append(time.perf_counter() - start)
    out = {"imbalance": T / float(lengths.mean()), "useful": float(useful_rows(rewards, G))}
    p_B = np.asarray(_grouped(other, G).prompt_lengths_N)[::G]
    flops = layout_flops(cfg, p_B, lengths, P, T, first, block=cfg.attention_block)
    out["real"] = flops["real"]
    out["positions"] = (padded, padded if first is None else int(first.src_MRL.size))
    for side in compiled:
        r_s, u_s = (statistics.median(times[side][k]) for k in ("rollout", "update"))
        step = statistics.median(
            a + b for a, b in zip(times[side]["rollout"], times[side]["update"], strict=True)
        )
        used = "padded" if side == "plain" or first is None else "packed"
        out[side] = {"flops": flops[used], "rollout": r_s, "update": u_s}
        out[side]["step"] = step
    return out


def _print_flops(args) -> None:
    print(
        "| imbalance | real tokens | packed M x R x L | GFLOP plain / efficient / real "
        "| eff / real | prompts again | padding | attention blocks | unembedding |"
    )
    print("|---:|---:|---|---|---:|---:|---:|---:|---:|")
    for imbalance in (float(x) for x in args.imbalance.split(",")):
        r = flops(args, imbalance)
        need = r["real"]
        eff = r["padded"] if r["shape"] is None else r["packed"]
        shape = "padded" if r["shape"] is None else " x ".join(map(str, r["shape"]))
        waste = r.get("waste") if r["shape"] is not None else None
        parts = " | ".join(
            f"{waste[k] / need:.3f}" if waste else "-"
            for k in ("prompts again", "padding", "attention blocks", "unembedding")
        )
        print(
            f"| {r['imbalance']:.2f} | {r['tokens']} | {shape} "
            f"| {r['padded'] / 1e9:.1f} / {eff / 1e9:.1f} / {need / 1e9:.1f} "
            f"| {eff / need:.3f} | {parts} |",
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--imbalance", default="1,2,4,8")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--pack-length", type=int, default=0, help="rl.pack_length (0: chosen per step)")
    p.add_argument("--slots", type=int, default=16, help="decode slots of continuous batching")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument(
        "--smollm2",
        action="store_true",
        help="SmolLM2-135M on GSM8K questions (real lengths) instead of the random model",
    )
    p.add_argument(
        "--flops-only",
        action="store_true",
        help="only the FLOPs, from the layouts (no model runs), with the packed update's "
        "waste by cause as fractions of the real need",
    )
    args = p.parse_args()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    model = (
        "SmolLM2-135M on GSM8K"
        if args.smollm2
        else f"P={args.prompt_len}, {args.layers} layers of {args.dim}"
    )
    print(
        f"{jax.devices()[0].platform}, {os.cpu_count()} CPUs, load average {load}; {model}, "
        f"B={args.prompts} G={args.group} T={args.max_new_tokens}, {args.microbatches} "
        f"microbatches, {args.slots} slots, median of {args.runs}\n"
    )
    if args.flops_only:
        _print_flops(args)
        return
    print(
        "| imbalance | positions plain / efficient | GFLOP plain / efficient / real | eff / real "
        "| rollout s plain / eff | update s plain / eff | step s plain / eff "
        "| useful / h plain / eff | plain / efficient step |"
    )
    print("|---:|---|---|---:|---|---|---|---|---:|")
    for imbalance in [None] if args.smollm2 else (float(x) for x in args.imbalance.split(",")):
        r = measure(args, imbalance)
        a, b = r["plain"], r["efficient"]
        need = r["real"]
        per_hour = lambda side: 3600 * r["useful"] / side["step"]  # noqa: E731
        print(
            f"| {r['imbalance']:.2f} | {r['positions'][0]} / {r['positions'][1]} "
            f"| {a['flops'] / 1e9:.1f} / {b['flops'] / 1e9:.1f} / {need / 1e9:.1f} "
            f"| {b['flops'] / need:.2f} "
            f"| {a['rollout']:.2f} / {b['rollout']:.2f} | {a['update']:.2f} / {b['update']:.2f} "
            f"| {a['step']:.2f} / {b['step']:.2f} | {per_hour(a):.0f} / {per_hour(b):.0f} "
            f"| {a['step'] / b['step']:.2f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
