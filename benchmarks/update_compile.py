"""Compile and step seconds of the RL update, with and without the shared-prompt forward.

  python benchmarks/update_compile.py                      # tiny and SmolLM2-135M, 3 each
  python benchmarks/update_compile.py --models=tiny --repeats=5

`rl.shared_prompt_forward` (on by default) runs each group's prompt once in the update's forward
and backward (`grouped.grouped_hidden_states`); off, every row runs its own prompt. For each
model both programs are built, lowered and compiled from scratch (a new jit object, the persistent
compile cache off) in alternation, `--repeats` times, in this one process; then each compiled
update runs `--steps` times on fresh copies of the state. The table gives medians: trace and lower
seconds, XLA compile seconds, the update's step seconds, and the shared / flat ratios.

The update is the GRPO default (Adam, one pass, no KL), on random weights of the preset's
architecture and a synthetic rollout: B prompts x G samples, P-token prompts, T generated tokens
(every row full length), f32, XLA's default optimisation level (as `python -m rlvr_jax.main`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.model import config as config_lib
from rlvr_jax.model import transformer as tf
from rlvr_jax.rl import state as state_lib
from rlvr_jax.rl import train_step as ts
from rlvr_jax.sampling.config import SamplerConfig
from rlvr_jax.types import Rollout

# (preset, B prompts, G samples, P prompt tokens, T generated tokens)
WORKLOADS = {
    "tiny": ("tiny", 4, 4, 32, 64),
    "smollm2": ("smollm2-135m", 2, 4, 64, 64),
}


def _rollout(B: int, G: int, P: int, T: int, vocab: int) -> Rollout:
    rng = np.random.default_rng(0)
    N = B * G
    lengths = np.repeat(rng.integers(P // 2, P + 1, B), G).astype(np.int32)
    prompt = np.repeat(rng.integers(1, vocab, (B, P)), G, axis=0).astype(np.int32)
    prompt = np.where(np.arange(P)[None, :] >= P - lengths[:, None], prompt, 0)
    return Rollout(
        prompt_NP=jnp.asarray(prompt),
        prompt_lengths_N=jnp.asarray(lengths),
        tokens_NT=jnp.asarray(rng.integers(1, vocab, (N, T)), jnp.int32),
        logp_NT=jnp.asarray(-rng.random((N, T)), jnp.float32),
        mask_NT=jnp.ones((N, T), bool),
        injected_NT=jnp.zeros((N, T), bool),
        lengths_N=jnp.full((N,), T, jnp.int32),
        finish_N=jnp.zeros((N,), jnp.int32),
    )


def _measure(name: str, repeats: int, steps: int) -> dict[str, dict[str, list[float]]]:
    preset, B, G, P, T = WORKLOADS[name]
    cfg = config_lib.PRESETS[preset]
    ocfg = state_lib.OptimConfig(learning_rate=1e-6, total_steps=100)
    optimizer = state_lib.make_optimizer(ocfg)
    schedule = state_lib.learning_rate_schedule(ocfg)
    params = tf.init_params(jax.random.key(0), cfg)
    state = state_lib.init_train_state(params, optimizer, jax.random.key(1), use_reference=False)
    rollout = _rollout(B, G, P, T, cfg.vocab_size)
    rewards = np.asarray(np.arange(B * G) % 2, np.float32)
    parts = {"correct": rewards}
    sampler = SamplerConfig(max_new_tokens=T)
    out: dict[str, dict[str, list[float]]] = {}
    for _ in range(repeats):
        for shared in (True, False):
            rl = ts.RLConfig(group_size=G, sampler=sampler, shared_prompt_forward=shared)
            update = ts.build_update(cfg, rl, optimizer, schedule)
            t0 = time.perf_counter()
            lowered = update.lower(state, rollout, rewards, parts)
            t1 = time.perf_counter()
            compiled = lowered.compile()
            t2 = time.perf_counter()
            times = []
            for _ in range(steps):
                fresh = jax.tree.map(jnp.copy, state)
                s = time.perf_counter()
                jax.block_until_ready(compiled(fresh, rollout, rewards, parts))
                times.append(time.perf_counter() - s)
            row = out.setdefault("shared" if shared else "flat", {})
            row.setdefault("lower", []).append(t1 - t0)
            row.setdefault("compile", []).append(t2 - t1)
            row.setdefault("step", []).append(statistics.median(times))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,smollm2", help="of " + ",".join(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    jax.config.update("jax_enable_compilation_cache", False)
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, {args.repeats} repeats\n")
    print("| model (B x G, P, T) | forward | lower s | compile s | step s | compile shared/flat |")
    print("|---|---|---:|---:|---:|---:|")
    for name in [m for m in args.models.split(",") if m]:
        preset, B, G, P, T = WORKLOADS[name]
        res = _measure(name, args.repeats, args.steps)
        med = {k: {m: statistics.median(v) for m, v in r.items()} for k, r in res.items()}
        ratio = med["shared"]["compile"] / med["flat"]["compile"]
        for kind in ("shared", "flat"):
            m = med[kind]
            cell = f"{ratio:.2f}x" if kind == "shared" else ""
            print(
                f"| {preset} ({B} x {G}, {P}, {T}) | {kind} | {m['lower']:.2f} | "
                f"{m['compile']:.2f} | {m['step']:.3f} | {cell} |"
            )


if __name__ == "__main__":
    main()
