"""Per-device memory of the RL update and rollout for real model sizes on simulated TPU slices.

Command (CPU, nothing is allocated: the programs are compiled on ShapeDtypeStructs):
  python benchmarks/memory.py
  python benchmarks/memory.py --models=qwen2.5-7b --rows=8 --length=1024 --mesh=1,8,1
  python benchmarks/memory.py --no_table --microbatches=8 --search=64x1024,128x1024
  python benchmarks/memory.py --models=qwen2.5-7b,qwen3-8b --long=4096,8192,16384,32768
  python benchmarks/memory.py --models=qwen2.5-7b,qwen3-8b --long=16384,32768 --chip=v5p-8
  python benchmarks/memory.py --models=qwen2.5-0.5b,qwen3-0.6b --long=4096,16384 --chip=v5e-1
  python benchmarks/memory.py --models=qwen2.5-7b,qwen3-8b --long=16384 --lora=64 --lora_base=int8
  python benchmarks/memory.py --models=qwen3-30b-a3b --long=4096,16384 --chip=v5p-16
  python benchmarks/memory.py --models=qwen3-8b,qwen3-32b --chip=v5p-64 --rows=512 \
      --length=4096 --project='1,32,1;1,8,4;1,4,8'

`--lora=R` (and `--lora_base=int8`) measures the same programs for a LoRA policy: rank-R f32
adapters on every projection over the frozen bf16 (or int8) base, Adam state for the adapters
only, and the base itself as the KL reference (no copy).

`--long` prints the long-answer table instead: for each model and generated length, the fewest
microbatches (1, 2, 4, 8) of one group of G rows whose update fits the chip (`--chip`: v5e-N,
N chips of 16 GiB; v5p-N, N / 2 chips of 95 GiB, `CHIPS`), what holds its peak, and the rollout
rows that fit.

`--project` prints, for each model and each mesh given, the per-chip memory of the update (the
fewest microbatches that fit) and of the rollout of `--rows` rows on `--chip`, and the step time
projected from the data sheet at `--utilisation` (`projected_seconds` says what it counts).

Eight fake CPU devices stand in for the eight 16 GiB chips of a v5e-8; the programs are the ones
`train_step.build_update` and `build_rollout` jit, with the shardings of
`sharding_plan.plan_step`, and
`compiled.memory_analysis()` gives each device's arguments (parameters, optimizer state, rollout),
outputs, temporaries and their total (outputs aliased to donated arguments counted once).
The search for the largest rows x generated length that fits compiles the update only (with
remat): at the table's size the rollout needs a fraction of the update's memory.

Setup: bf16 parameters and activations, f32 Adam moments (`OptimConfig`), no KL reference, FSDP
over the 8 devices, prompts of `--prompt` tokens, G = 8, one minibatch and `--microbatches`
gradient-accumulation chunks (default 1: the whole batch's activations at once).

Caveats: this is XLA:CPU's buffer assignment, not the TPU compiler's. XLA:CPU computes bf16 dots
in f32, so its temporaries are an upper bound of a TPU's; its fusion and rematerialisation
choices differ too. Use the figures to compare settings and to size a run, then confirm on the
TPU with the same script (`--platform=tpu` runs it on the real chips).

One CPU artefact is switched off by default: to run bf16 dots in f32, XLA:CPU converts each
layer's weights to f32 inside the layer scan, and its while-loop invariant code motion then
hoists that convert out of the loop, converting the whole (L, ...) stack at once and keeping it
alive through the forward pass. For Qwen2.5-7B that is three f32 (28, 448, 18944) MLP stacks,
2.7 GiB per device that a TPU (bf16 dots, nothing to convert) never allocates; the benchmark
compiles with `--xla_disable_hlo_passes=while-loop-invariant-code-motion` on CPU, and
`--cpu_hoisting` keeps the pass (measured: Qwen2.5-7B update, 8 x 1024, 16.25 GiB with it,
14.19 GiB without).

What remains at small sizes is the optimizer update, where the peak then sits (Qwen2.5-7B,
8 x 1024): XLA:CPU does not fuse AdamW's elementwise chain, so the (28, 448, 18944) MLP stacks
get f32 intermediates (clipped gradients, updates) of 0.9 GiB each, four of them (3.5 GiB) live
at the peak next to the bf16 gradients; a compiler that fuses each leaf's update into one pass
would not allocate them (not confirmed on a TPU here).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import workloads  # noqa: E402  (benchmarks/, this script's directory)

from rlvr_jax.model import lora as lora_lib  # noqa: E402
from rlvr_jax.model import sharding  # noqa: E402
from rlvr_jax.model.config import PRESETS  # noqa: E402
from rlvr_jax.model.transformer import count_params, param_shapes  # noqa: E402
from rlvr_jax.rl import memory as memory_lib  # noqa: E402
from rlvr_jax.rl import sharding_plan  # noqa: E402
from rlvr_jax.rl import state as state_lib  # noqa: E402
from rlvr_jax.rl import train_step as ts  # noqa: E402
from rlvr_jax.sampling.config import SamplerConfig
from rlvr_jax.types import Rollout

GiB = 1 << 30
HBM = 16 * GiB  # one TPU v5e chip
G = 8


def _rollout_shapes(N: int, P: int, T: int) -> Rollout:
    s = jax.ShapeDtypeStruct
    return Rollout(
        prompt_NP=s((N, P), jnp.int32),
        prompt_lengths_N=s((N,), jnp.int32),
        tokens_NT=s((N, T), jnp.int32),
        logp_NT=s((N, T), jnp.float32),
        mask_NT=s((N, T), bool),
        injected_NT=s((N, T), bool),
        lengths_N=s((N,), jnp.int32),
        finish_N=s((N,), jnp.int32),
    )


@dataclasses.dataclass
class Memory:
    arguments: int
    outputs: int
    temps: int
    total: int
    compile_s: float


def _memory(compiled, seconds: float) -> Memory:
    m = memory_lib.program_memory(compiled)
    return Memory(m.arguments, m.outputs, m.temps, m.total, seconds)


def measure(
    name: str,
    mesh,
    *,
    remat: bool,
    rows: int,
    prompt: int,
    length: int,
    what: str,
    logprob_chunk: int = 512,
    microbatches: int = 1,
    attention: str = "auto",
    lora_rank: int = 0,
    lora_base: str = "model",
):
    """Compiles the update or the rollout of `rows` rows and returns its per-device Memory.

    With `lora_rank`, the policy is the frozen base (bf16, or int8 with `lora_base="int8"`) with
    f32 adapters of that rank on every projection (alpha = rank), and the optimizer holds the
    adapters' state only.
    """
    cfg = PRESETS[name].replace(
        dtype="bfloat16", param_dtype="bfloat16", remat=remat, attention=attention
    )
    cfg = cfg.replace(max_position_embeddings=max(cfg.max_position_embeddings, prompt + length))
    sampler = SamplerConfig(max_new_tokens=length, eos_ids=(0,), layer_loop="scan")
    rl = ts.RLConfig(
        group_size=G,
        sampler=sampler,
        logprob_chunk=logprob_chunk,
        num_microbatches=microbatches,
    )
    ocfg = state_lib.OptimConfig()
    optimizer = state_lib.make_optimizer(ocfg)
    params = _policy_shapes(cfg, lora_rank, lora_base)
    state = jax.eval_shape(
        lambda p: state_lib.init_train_state(p, optimizer, jax.random.key(0), False), params
    )
    plan = sharding_plan.plan_step(state, cfg, mesh, rows)
    t0 = time.time()
    if what == "update":
        fn = ts.build_update(cfg, rl, optimizer, state_lib.learning_rate_schedule(ocfg), plan)
        rollout = _rollout_shapes(rows, prompt, length)
        rep = plan.replicated
        lowered = fn.lower(
            memory_lib.abstract_like(state, plan.state),
            memory_lib.abstract_like(rollout, rep),
            jax.ShapeDtypeStruct((rows,), jnp.float32, sharding=rep),
            {"correct": jax.ShapeDtypeStruct((rows,), jnp.float32, sharding=rep)},
        )
    else:
        fn = ts.build_rollout(cfg, rl, plan)
        batch = ts.Batch(
            jax.ShapeDtypeStruct((rows, prompt), jnp.int32),
            jax.ShapeDtypeStruct((rows,), jnp.int32),
        )
        key = jax.eval_shape(lambda: jax.random.key(0))
        lowered = fn.lower(
            memory_lib.abstract_like(state.params, plan.state.params),
            memory_lib.abstract_like(batch, plan.rows),
            jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=plan.replicated),
        )
    compiled = lowered.compile()
    return _memory(compiled, time.time() - t0), count_params(params)


def _policy_shapes(cfg, lora_rank: int, lora_base: str):
    """The policy's parameter shapes: the plain model, or a base with adapters."""
    params = param_shapes(cfg)
    if not lora_rank:
        return params

    def attach(p):
        if lora_base == "int8":
            p = lora_lib.quantize_int8(p)
        adapters = lora_lib.init_lora(
            jax.random.key(0), cfg, lora_lib.LoraConfig(rank=lora_rank, alpha=float(lora_rank))
        )
        return dataclasses.replace(p, lora=adapters)

    return jax.eval_shape(attach, params)


@dataclasses.dataclass(frozen=True)
class Chip:
    """A TPU slice as its data sheet gives it: chips, and per chip HBM bytes, HBM bytes/s, dense
    bf16 FLOP/s and inter-chip interconnect bytes/s (all links together)."""

    devices: int
    hbm: int
    bandwidth: float
    flops: float
    ici: float


V5E = dict(hbm=16 * GiB, bandwidth=819e9, flops=197e12, ici=1600e9 / 8)
V5P = dict(hbm=95 * GiB, bandwidth=2765e9, flops=459e12, ici=4800e9 / 8)
# A slice's name counts TensorCores: a v5e chip has one, a v5p chip two (v5p-8 is 4 chips).
CHIPS = {
    "v5e-1": Chip(1, **V5E),
    "v5e-8": Chip(8, **V5E),
    "v5e-16": Chip(16, **V5E),
    "v5e-32": Chip(32, **V5E),
    "v5e-64": Chip(64, **V5E),
    "v5e-256": Chip(256, **V5E),
    "v5p-8": Chip(4, **V5P),
    "v5p-16": Chip(8, **V5P),
    "v5p-64": Chip(32, **V5P),
}


def _breakdown(
    name: str, m: Memory, rows: int, devices: int, seq: int, length: int, prompt: int, chunk: int
):
    """What holds the update's peak: the compiled arguments (parameters, optimizer state,
    rollout), and by arithmetic the remat checkpoints (one bf16 (rows, P + T, D) residual per
    layer boundary, split over all devices: by rows, by tokens over "seq", by width where rows
    run out) and one log-prob chunk step of f32 logits with their gradient (`rows` x `chunk`
    tokens from each seq device, the vocabulary split over the devices); the rest of the
    temporaries is one layer's recomputed working set and the optimizer update. `rows`: one
    microbatch's."""
    cfg = PRESETS[name]
    checkpoints = cfg.num_layers * rows * (prompt + length) * cfg.embed_dim * 2 / devices
    logits = 2 * rows * chunk * seq * cfg.vocab_size * 4 / devices
    rest = max(m.total - m.arguments - checkpoints - logits, 0)
    gib = lambda b: f"{b / GiB:.2f}"  # noqa: E731
    return f"{gib(m.arguments)} | {gib(checkpoints)} | {gib(logits)} | {gib(rest)}"


def long_context(
    models: list[str],
    lengths: list[int],
    chip: str,
    prompt: int,
    chunk: int,
    expert: int = 1,
    seq: int = 1,
    update_only: bool = False,
    **lora,
):
    """The long-answer table: for each model and generated length, the fewest microbatches of
    one group (G rows) whose update (remat) fits the chip, what holds its peak, and how many
    rollout rows fit next to the parameters. FSDP over the devices (over those the expert and
    seq axes leave, with `expert` or `seq` > 1: `seq` splits the update's rows over devices).
    `update_only` leaves the rollout out. `lora`: `measure`'s `lora_rank` and `lora_base`."""
    devices, hbm = CHIPS[chip].devices, CHIPS[chip].hbm
    mesh = sharding.make_mesh(sharding.MeshConfig(1, -1, 1, expert=expert, seq=seq))
    policy = "bf16 parameters, f32 Adam"
    if lora.get("lora_rank"):
        policy = (
            f"LoRA rank {lora['lora_rank']} on every projection over a "
            f"{'int8' if lora.get('lora_base') == 'int8' else 'bf16'} base, f32 adapters and Adam"
        )
    layout = f"fsdp={devices // (expert * seq)}" + "".join(
        f", {name}={n}" for name, n in (("seq", seq), ("expert", expert)) if n > 1
    )
    print(
        f"{chip}: {devices} simulated devices of {hbm / GiB:.0f} GiB, {layout}; update of "
        f"G={G} rows (one prompt of {prompt} tokens) with remat, {policy}, "
        f"log-prob chunk {chunk}; rollout rows that fit by extrapolating the compiled {G}-row "
        "rollout (all but its parameters grows with rows)\n"
    )
    print(
        "| model | generated | microbatches | update GiB | fits | arguments | remat checkpoints "
        "| logits | layer + optimizer | rollout GiB (8 rows) | rollout rows that fit |"
    )
    print("|---" * 11 + "|")
    longest = {}
    for name in models:
        for length in lengths:
            fits, m, micro = False, None, None
            for micro in (c for c in (1, 2, 4, 8) if G % c == 0):
                m, _ = measure(
                    name,
                    mesh,
                    remat=True,
                    rows=G,
                    prompt=prompt,
                    length=length,
                    what="update",
                    logprob_chunk=chunk,
                    microbatches=micro,
                    **lora,
                )
                if m.total <= hbm:
                    fits = True
                    break
            rollout = "not compiled (--update_only) | "
            if not update_only:
                r, _ = measure(
                    name,
                    mesh,
                    remat=False,
                    rows=G,
                    prompt=prompt,
                    length=length,
                    what="rollout",
                    **lora,
                )
                cfg = PRESETS[name].replace(dtype="bfloat16", param_dtype="bfloat16")
                lora_base = lora.get("lora_base", "model")
                shapes = _policy_shapes(cfg, lora.get("lora_rank", 0), lora_base)
                params = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(shapes)) / devices
                per_row = max(r.total - params, 1) / G
                rollout_rows = int((hbm - params) // per_row) // devices * devices
                rollout = f"{r.total / GiB:.2f} | {max(rollout_rows, 0)}"
            parts = _breakdown(name, m, G // micro, devices, seq, length, prompt, chunk)
            print(
                f"| {name} | {length} | {micro} | {m.total / GiB:.2f} | "
                f"{'yes' if fits else 'no'} | {parts} | {rollout} |",
                flush=True,
            )
            if fits:
                longest[name] = length
    print(f"\nLongest generated length whose update fits a {chip} chip:", longest)


def projected_seconds(
    cfg,
    chip: Chip,
    sizes: dict,
    rows: int,
    prompt: int,
    length: int,
    microbatches: int,
    utilisation: float,
) -> dict:
    """Projected seconds of one step's update and rollout (every row runs to `length`; all rows
    in one batch), each rate at `utilisation` of the data sheet's peak; compute and transfers
    are taken to overlap (a phase takes its slowest part).

    Update: FLOPs, the forward and backward of the shared-prompt layout
    (`workloads.update_flops`) plus one more forward for remat, over all chips. Transfers per
    chip: the FSDP gathers of the weights (forward, remat, backward) and the reduce-scatter of
    their gradients, per microbatch; tensor parallelism's six all-reduces of the activations per
    layer (two each in the forward, the remat and the backward); the gradients' all-reduce over
    "data". Rollout: the prompts' prefill FLOPs, then per decode step the slowest of: the FSDP
    gather of the weights (W / tensor x (fsdp - 1) / fsdp bytes: the rollout runs on the
    training layout), the HBM reads (the gathered weights and the chip's KV cache at the mean
    position), and the FLOPs (2 per parameter per row, and attention). Also the rollout if the
    weights were gathered once per rollout into a second copy (W / tensor bytes per chip).
    """
    D, L, H, K, Dh = cfg.embed_dim, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    data, fsdp, tensor = sizes["data"], sizes["fsdp"], sizes["tensor"]
    B, N, P, T = rows // G, rows, prompt, length
    tri = lambda n: n * (n + 1) / 2  # noqa: E731
    u, chips = utilisation, chip.devices
    n_params = count_params(param_shapes(cfg))
    weights = 2 * n_params / tensor  # bf16 bytes of the weights one chip computes with

    positions = B * P + N * T
    flops = (4 / 3) * workloads.update_flops(
        cfg, positions, N * T, B * tri(P) + N * (T * P + tri(T))
    )
    part = lambda n: (n - 1) / n  # noqa: E731  (an all-gather's share that arrives)
    moved = {
        "fsdp": microbatches * 4 * weights * part(fsdp),
        "tensor": 6 * L * 2 * (positions / (data * fsdp)) * D * 2 * part(tensor),
        "data": 2 * weights / fsdp * part(data),
    }
    update = {"FLOPs": flops / chips / chip.flops, "interconnect": sum(moved.values()) / chip.ici}

    mean_position = P + T / 2
    kv = N * L * 2 * K * Dh * 2 * mean_position / chips
    decode = {
        "interconnect": weights * part(fsdp) / chip.ici,
        "HBM": (weights + kv) / chip.bandwidth,
        "FLOPs": (2 * n_params + 4 * H * Dh * L * mean_position) * N / chips / chip.flops,
    }
    prefill = (2 * n_params * B * P + 4 * H * Dh * L * B * tri(P)) / chips / chip.flops
    once = max(decode["HBM"], decode["FLOPs"]) * T + decode["interconnect"]
    slowest = lambda d: max(d, key=d.get)  # noqa: E731
    return {
        "update TFLOP": flops / 1e12,
        "update": max(update.values()) / u,
        "update bound": slowest(update),
        "rollout": (T * max(decode.values()) + prefill) / u,
        "rollout bound": slowest(decode),
        "rollout, gathered once": (once + prefill) / u,
        "copy GiB": weights / GiB,
        "update parts": {k: v / u for k, v in update.items()},
        "decode step parts": {k: v / u for k, v in decode.items()},
    }


def projection(
    models: list[str],
    chip_name: str,
    meshes: list[tuple[int, int, int]],
    rows: int,
    prompt: int,
    length: int,
    chunk: int,
    utilisation: float,
) -> None:
    """For each model and mesh: the per-chip memory of the update (fewest microbatches that
    fit) and of the rollout of `rows` rows, compiled, and the step time projected from them."""
    chip = CHIPS[chip_name]
    print(
        f"{chip_name}: {chip.devices} simulated chips of {chip.hbm / GiB:.0f} GiB; {rows} rows "
        f"(G={G}), prompts of {prompt} tokens, {length} generated; update with remat, log-prob "
        f"chunk {chunk}; step times PROJECTED at {utilisation:.0%} of the data sheet's "
        f"{chip.flops / 1e12:.0f} TFLOP/s, {chip.bandwidth / 1e9:.0f} GB/s HBM and "
        f"{chip.ici / 1e9:.0f} GB/s interconnect per chip, every row to the cap\n"
    )
    print(
        "| model | mesh (data, fsdp, tensor) | microbatches | update GiB | rollout GiB | fits "
        "| update TFLOP | update s (bound by) | rollout s (bound by) | step s "
        "| rollout s, weights gathered once (copy GiB) |"
    )
    print("|---" * 11 + "|")
    for name in models:
        cfg = PRESETS[name]
        for data, fsdp, tensor in meshes:
            mesh_cfg = sharding.MeshConfig(data, fsdp, tensor)
            mesh = sharding.make_mesh(mesh_cfg)
            sizes = mesh_cfg.sizes(chip.devices)
            shards = sizes["data"] * sizes["fsdp"]
            m = micro = None
            for micro in (c for c in (1, 2, 4, 8, 16, 32) if rows % (c * shards) == 0):
                m, _ = measure(
                    name,
                    mesh,
                    remat=True,
                    rows=rows,
                    prompt=prompt,
                    length=length,
                    what="update",
                    logprob_chunk=chunk,
                    microbatches=micro,
                )
                if m.total <= chip.hbm:
                    break
            r, _ = measure(
                name, mesh, remat=False, rows=rows, prompt=prompt, length=length, what="rollout"
            )
            t = projected_seconds(cfg, chip, sizes, rows, prompt, length, micro, utilisation)
            fits = m.total <= chip.hbm and r.total <= chip.hbm
            print(
                f"| {name} | {sizes['data']}, {sizes['fsdp']}, {sizes['tensor']} | {micro} | "
                f"{m.total / GiB:.2f} | {r.total / GiB:.2f} | {'yes' if fits else 'no'} | "
                f"{t['update TFLOP']:.0f} | {t['update']:.1f} ({t['update bound']}) | "
                f"{t['rollout']:.1f} ({t['rollout bound']}) | {t['update'] + t['rollout']:.1f} | "
                f"{t['rollout, gathered once']:.1f} ({t['copy GiB']:.1f}) |",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="qwen2.5-0.5b,qwen2.5-7b,qwen3-8b")
    ap.add_argument("--mesh", default="1,8,1", help="data,fsdp,tensor")
    ap.add_argument("--rows", type=int, default=64, help="N = prompts x G for the table")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--length", type=int, default=1024, help="generated tokens for the table")
    ap.add_argument(
        "--search",
        default="8x256,16x1024,32x1024,32x2048,64x2048,128x2048",
        help="rows x length candidates, smallest first: the last whose update fits is reported",
    )
    ap.add_argument("--no_table", action="store_true", help="only the search")
    ap.add_argument("--logprob_chunk", type=int, default=512)
    ap.add_argument("--microbatches", type=int, default=1, help="rl.num_microbatches")
    ap.add_argument(
        "--cpu_hoisting",
        action="store_true",
        help="keep XLA:CPU's while-loop invariant code motion (see the module docstring)",
    )
    ap.add_argument("--platform", default="cpu")
    ap.add_argument(
        "--long",
        default="",
        help="generated lengths for the long-answer table (e.g. 4096,8192,16384,32768)",
    )
    ap.add_argument("--chip", default="v5e-8", choices=sorted(CHIPS))
    ap.add_argument("--lora", type=int, default=0, help="LoRA rank (0: full fine-tuning)")
    ap.add_argument("--lora_base", default="model", choices=("model", "int8"))
    ap.add_argument("--expert", type=int, default=1, help="mesh.expert for --long (MoE models)")
    ap.add_argument("--seq", type=int, default=1, help="mesh.seq for --long: split a row's tokens")
    ap.add_argument("--update_only", action="store_true", help="--long without the rollout")
    ap.add_argument(
        "--project",
        default="",
        help="meshes data,fsdp,tensor separated by ';' (e.g. '1,32,1;1,8,4'): per-chip memory "
        "of --rows rows x --length on --chip, and the step time projected at --utilisation",
    )
    ap.add_argument("--utilisation", type=float, default=0.4)
    args = ap.parse_args()
    if args.platform == "cpu" and not args.cpu_hoisting:
        flag = "--xla_disable_hlo_passes=while-loop-invariant-code-motion"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
    lora = dict(lora_rank=args.lora, lora_base=args.lora_base)
    sizes = dict(logprob_chunk=args.logprob_chunk, microbatches=args.microbatches, **lora)
    jax.config.update("jax_platforms", args.platform)
    if args.platform == "cpu":
        simulated = args.long or args.project
        jax.config.update("jax_num_cpu_devices", CHIPS[args.chip].devices if simulated else 8)
    if args.project:
        meshes = [tuple(int(x) for x in m.split(",")) for m in args.project.split(";")]
        projection(
            args.models.split(","),
            args.chip,
            meshes,
            args.rows,
            args.prompt,
            args.length,
            args.logprob_chunk,
            args.utilisation,
        )
        return
    if args.long:
        lengths = [int(x) for x in args.long.split(",")]
        long_context(
            args.models.split(","),
            lengths,
            args.chip,
            args.prompt,
            args.logprob_chunk,
            args.expert,
            args.seq,
            args.update_only,
            **lora,
        )
        return
    mesh = sharding.make_mesh(sharding.MeshConfig(*(int(x) for x in args.mesh.split(","))))
    print(
        f"mesh {dict(mesh.shape)} on {jax.device_count()} {jax.devices()[0].platform} devices; "
        f"bf16 params/activations, f32 Adam moments, no reference model, G={G}, "
        f"prompt {args.prompt} tokens, log-prob chunk {args.logprob_chunk}, "
        f"{args.microbatches} microbatch(es); per-device GiB from compiled.memory_analysis()"
        f"{'' if args.cpu_hoisting or args.platform != 'cpu' else ' (CPU loop hoisting off)'}\n",
        flush=True,
    )
    header = (
        "| model | params | program | remat | rows x length | arguments | outputs | temps "
        "| total | fits 16 GiB | compile s |"
    )
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    gib = lambda b: f"{b / GiB:.2f}"  # noqa: E731
    best, tried = {}, []
    for name in args.models.split(","):
        rows = []
        table = () if args.no_table else (("update", False), ("update", True), ("rollout", False))
        for what, remat in table:
            m, n = measure(
                name,
                mesh,
                remat=remat,
                rows=args.rows,
                prompt=args.prompt,
                length=args.length,
                what=what,
                **sizes,
            )
            rows.append(m)
            print(
                f"| {name} | {n / 1e9:.2f}B | {what} | {'yes' if remat else 'no'} | "
                f"{args.rows} x {args.length} | {gib(m.arguments)} | {gib(m.outputs)} | "
                f"{gib(m.temps)} | {gib(m.total)} | {'yes' if m.total <= HBM else 'no'} | "
                f"{m.compile_s:.0f} |",
                flush=True,
            )
        best[name] = None
        for cand in filter(None, args.search.split(",")):
            r, t = (int(x) for x in cand.split("x"))
            m, _ = measure(
                name,
                mesh,
                remat=True,
                rows=r,
                prompt=args.prompt,
                length=t,
                what="update",
                **sizes,
            )
            tried.append((name, r, t, m.total))
            if m.total > HBM:
                break
            best[name] = (r, t, m.total)
    print(
        f"\nUpdate (with remat, {args.microbatches} microbatch(es)) per device, trying "
        f"{args.search} in turn up to the first that does not fit 16 GiB:\n"
    )
    print("| model | rows x length | update total GiB | fits 16 GiB |")
    print("|---|---|---|---|")
    for name, r, t, total in tried:
        print(f"| {name} | {r} x {t} | {gib(total)} | {'yes' if total <= HBM else 'no'} |")
    print(
        "\nLargest that fits:",
        {n: None if b is None else f"{b[0]} x {b[1]}" for n, b in best.items()},
    )


if __name__ == "__main__":
    main()
