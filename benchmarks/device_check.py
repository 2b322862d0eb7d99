"""The first run on an accelerator: one table of what the chip does with the project's programs.

    bash benchmarks/device_check.sh                    # a GPU or TPU: SmolLM2 in bf16, < 5 min
    python benchmarks/device_check.py --model tiny     # the same code on a CPU in seconds

Rows, all in bf16 on the default device:
- attention parity: the backend's fused kernel (`model.attention="auto"`: cuDNN on a GPU,
  splash on a TPU; on a CPU, which has none, the dense reference) against the blockwise path,
  forward and gradients, as the largest difference over the largest reference value;
- decode: the static sampler's time per decode step (the difference of two generation lengths,
  prefill excluded) and the bytes a step reads (parameters and the filled KV cache) over it,
  against the chip's memory bandwidth;
- update: the padded GRPO update's FLOPs (counted from its layout, `workloads.layout_flops`)
  over its time, against the chip's peak;
- packed / padded: the two updates' times on the same rollout, cut to lognormal lengths
  (imbalance about 4);
- mismatch: the sampler's log-probs against the update's (`mismatch/mean`, `mismatch/max`,
  `mismatch/kl` of that update), on the model's own samples.

Peaks come from the device kind (`PEAKS`); a CPU's are measured here (a copy and a matmul).
Times are medians of `--runs`, after compilation.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from workloads import layout_flops  # noqa: E402

from rlvr_jax.model import attention as attention_lib  # noqa: E402
from rlvr_jax.model import fused_attention, transformer  # noqa: E402
from rlvr_jax.model.config import PRESETS  # noqa: E402
from rlvr_jax.rl import packing as packing_lib  # noqa: E402
from rlvr_jax.rl import state as state_lib  # noqa: E402
from rlvr_jax.rl import train_step as ts  # noqa: E402
from rlvr_jax.sampling.config import SamplerConfig, sampling_params  # noqa: E402
from rlvr_jax.sampling.host import bucket_and_pad  # noqa: E402
from rlvr_jax.sampling.loop import generate, init_decode_cache  # noqa: E402
from rlvr_jax.types import FINISH_EOS, FINISH_LENGTH  # noqa: E402

# (memory bandwidth bytes/s, dense bf16 FLOP/s) by a substring of `device.device_kind`.
PEAKS = {
    "H200": (4.8e12, 989e12),
    "H100": (3.35e12, 989e12),
    "A100": (2.0e12, 312e12),
    "L4": (0.3e12, 121e12),
    "v6": (1.64e12, 918e12),
    "v5 lite": (0.819e12, 197e12),
    "v5e": (0.819e12, 197e12),
    "v5p": (2.765e12, 459e12),
    "v4": (1.2e12, 275e12),
}


def _median_time(fn, runs: int) -> float:
    fn()  # compile and warm up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def peaks(device) -> tuple[float, float, str]:
    """(bandwidth, FLOP/s, where from) of `device`."""
    for key, (bandwidth, flops) in PEAKS.items():
        if key.lower() in device.device_kind.lower():
            return bandwidth, flops, f"{device.device_kind} (data sheet)"
    x = jnp.ones((4096, 4096), jnp.bfloat16)
    copy = _median_time(lambda: x + 1, 3)
    matmul = _median_time(lambda: x @ x, 3)
    return 2 * x.nbytes / copy, 2 * 4096**3 / matmul, f"{device.device_kind} (measured here)"


def attention_parity(T: int, Dh: int) -> tuple[str, float, float]:
    """(kernel, forward and gradient differences relative to the largest reference value)."""
    B, H, K = 2, 8, 2
    cfg = PRESETS["tiny"].replace(attention="auto", head_dim=Dh, dtype="bfloat16")
    kernel = attention_lib.resolve_attention(cfg, layout="causal")
    rng = np.random.default_rng(0)
    draw = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.bfloat16)  # noqa: E731
    q, k, v, ct = draw(B, T, H, Dh), draw(B, T, K, Dh), draw(B, T, K, Dh), draw(B, T, H, Dh)
    valid = jnp.asarray(np.arange(T)[None, :] >= np.array([[0], [T // 4]]))  # left padding

    def fused(q, k, v):
        if kernel == "xla_blockwise":
            mask = jnp.tril(jnp.ones((T, T), bool))[None] & valid[:, None, :]
            return transformer.attention(q, k, v, mask, cfg)
        return fused_attention.causal_attention(q, k, v, valid, kernel, 512)

    def blockwise(q, k, v):
        return fused_attention.causal_attention(q, k, v, valid, "xla_blockwise", 512)

    def with_grads(f):
        loss = lambda *a: jnp.sum((f(*a) * ct).astype(jnp.float32) * valid[:, :, None, None])  # noqa: E731
        out = jax.jit(f)(q, k, v) * valid[:, :, None, None]
        return out, jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)

    (out_a, g_a), (out_b, g_b) = with_grads(fused), with_grads(blockwise)
    rel = lambda a, b: float(  # noqa: E731
        jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))
        / jnp.max(jnp.abs(b.astype(jnp.float32)))
    )
    name = "dense (no fused kernel here)" if kernel == "xla_blockwise" else kernel
    return name, rel(out_a, out_b), max(rel(a, b) for a, b in zip(g_a, g_b, strict=True))


def load_model(name: str):
    """(params in bf16, cfg, prompts as token ids)."""
    if name == "tiny":
        cfg = PRESETS["tiny"]
        params = transformer.init_params(jax.random.key(0), cfg)
        rng = np.random.default_rng(0)
        prompts = [rng.integers(1, cfg.vocab_size, int(n)).tolist() for n in rng.integers(8, 24, 8)]
    else:
        from rlvr_jax.data import datasets
        from rlvr_jax.data.tokenizer import Tokenizer
        from rlvr_jax.model import gguf

        path = gguf.embedded_model_path()
        params, cfg = gguf.load_gguf(path)
        tok = Tokenizer.from_gguf(path)
        prompts = [
            tok.encode(
                tok.apply_chat_template(
                    [{"role": "user", "content": f"What is {ex.prompt_text}? Think step by step."}],
                    add_generation_prompt=True,
                )
            )
            for ex in datasets.arithmetic_examples(8, 0, level=(2, 3))
        ]
    cfg = cfg.replace(dtype="bfloat16")
    to_bf16 = lambda x: x.astype(jnp.bfloat16) if x.dtype == jnp.float32 else x  # noqa: E731
    return jax.tree.map(to_bf16, params), cfg, prompts


def decode(params, cfg, prompts, B: int, G: int, T: int, runs: int):
    """(seconds per decode step, bytes read per step, the T-token rollout)."""
    ids = [p for p in prompts[:B] for _ in range(G)]
    prompt, lengths = bucket_and_pad(ids, (max(map(len, ids)),), pad_id=0)
    N, P = prompt.shape
    times, out = {}, None
    for t in (T // 2, T):
        scfg = SamplerConfig(max_new_tokens=t, pad_id=0)
        cache = {"c": init_decode_cache(cfg, scfg, N, P)}

        def run(scfg=scfg, cache=cache):
            r, cache["c"] = generate(
                params, prompt, lengths, jax.random.key(0), sampling_params(N), cache["c"],
                model_cfg=cfg, cfg=scfg,
            )  # fmt: skip
            return r

        times[t] = _median_time(run, runs)
        out = run()
    step = (times[T] - times[T // 2]) / (T - T // 2)
    weights = sum(x.nbytes for x in jax.tree.leaves(params))
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2  # k and v, bf16
    filled = N * (P + 0.75 * T)  # mean filled prefix over the second half's steps
    return step, weights + kv_per_token * filled, out


def cut(rollout, imbalance: float, seed: int = 0):
    """`rollout` with each row cut to a lognormal length (max T, mean about T / imbalance)."""
    N, T = rollout.tokens_NT.shape
    rng = np.random.default_rng(seed)
    x = rng.lognormal(0.0, 1.0, N)
    lengths = np.clip(np.round(x / x.max() * T), 1, T).astype(np.int32)
    for _ in range(40):
        if T / lengths.mean() >= imbalance:
            break
        x = x**1.2
        lengths = np.clip(np.round(x / x.max() * T), 1, T).astype(np.int32)
    mask = np.arange(T)[None, :] < lengths[:, None]
    return dataclasses.replace(
        rollout,
        tokens_NT=jnp.where(mask, rollout.tokens_NT, 0),
        logp_NT=jnp.where(mask, rollout.logp_NT, 0.0),
        mask_NT=jnp.asarray(mask),
        lengths_N=jnp.asarray(lengths),
        finish_N=jnp.asarray(np.where(lengths == T, FINISH_LENGTH, FINISH_EOS), jnp.int32),
    )


def updates(params, cfg, rollout, G: int, runs: int) -> dict:
    """The padded and packed updates on `rollout`: FLOPs (`workloads.layout_flops`), median
    seconds, metrics."""
    N, T = rollout.tokens_NT.shape
    P = rollout.prompt_NP.shape[1]
    rl = ts.RLConfig(group_size=G, sampler=SamplerConfig(max_new_tokens=T, pad_id=0))
    sgd = optax.sgd(1e-4)
    update = ts.build_update(cfg, rl, sgd, optax.constant_schedule(1e-4))
    rewards = (np.random.default_rng(1).random(N) < 0.4).astype(np.float32)
    parts = {"correct": rewards}
    fresh = lambda: state_lib.init_train_state(  # noqa: E731
        jax.tree.map(jnp.copy, params), sgd, jax.random.key(1), False
    )
    packing = packing_lib.plan(
        np.asarray(rollout.prompt_lengths_N), np.asarray(rollout.mask_NT), P, group_size=G
    )
    p_B = np.asarray(rollout.prompt_lengths_N)[::G]
    flops = layout_flops(
        cfg, p_B, np.asarray(rollout.lengths_N), P, T, packing, block=cfg.attention_block
    )
    out = {}
    for side, plan in (("padded", None), ("packed", packing)):
        compiled = update.lower(fresh(), rollout, rewards, parts, plan).compile()
        _, result = compiled(fresh(), rollout, rewards, parts, plan)
        run = lambda c=compiled, p=plan: c(fresh(), rollout, rewards, parts, p)  # noqa: E731
        out[side] = (flops[side], _median_time(run, runs), jax.device_get(result.metrics))
    out["positions"] = (packing_lib.padded_positions(N, P, T, G), int(packing.src_MRL.size))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="smollm2", choices=("smollm2", "tiny"))
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--attention-length", type=int, default=2048)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    device = jax.devices()[0]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"jax {jax.__version__}, {device.platform}: {device.device_kind}, load average {load}")
    bandwidth, peak, source = peaks(device)
    rows = [("peaks", f"{bandwidth / 1e9:.0f} GB/s, {peak / 1e12:.1f} TFLOP/s bf16", source)]
    kernel, fwd, grad = attention_parity(args.attention_length, 128)
    rows.append(
        (
            "attention parity, bf16",
            f"forward {fwd:.1e}, gradients {grad:.1e}",
            f"{kernel} against xla_blockwise, T={args.attention_length}, Dh=128",
        )
    )
    params, cfg, prompts = load_model(args.model)
    B, G, T = args.prompts, args.group, args.max_new_tokens
    step, bytes_per_step, rollout = decode(params, cfg, prompts, B, G, T, args.runs)
    rows.append(
        (
            "decode step",
            f"{step * 1e3:.2f} ms, {bytes_per_step / step / 1e9:.1f} GB/s "
            f"({bytes_per_step / step / bandwidth:.0%} of peak)",
            f"{args.model}, batch {B * G}, {bytes_per_step / 1e6:.0f} MB a step",
        )
    )
    r = updates(params, cfg, cut(rollout, 4.0), G, args.runs)
    (f_pad, s_pad, m_pad), (f_pack, s_pack, _) = r["padded"], r["packed"]
    rows.append(
        (
            "update (padded)",
            f"{s_pad:.3f} s, {f_pad / s_pad / 1e12:.2f} TFLOP/s "
            f"({f_pad / s_pad / peak:.0%} of peak)",
            f"{f_pad / 1e9:.1f} GFLOP from the layout, {B * G} rows of {T} new tokens",
        )
    )
    rows.append(
        (
            "packed / padded update",
            f"{s_pack / s_pad:.2f}x time, {f_pack / f_pad:.2f}x FLOPs",
            f"positions {r['positions'][0]} / {r['positions'][1]}, lengths cut to imbalance ~4",
        )
    )
    rows.append(
        (
            "sampler/trainer mismatch, bf16",
            f"mean {m_pad['mismatch/mean']:.2e}, max {m_pad['mismatch/max']:.2e}, "
            f"kl {m_pad['mismatch/kl']:.2e}",
            "abs(log pi_sampler - log pi_update) over the sampled tokens",
        )
    )
    print("\n| check | result | setting |\n|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
