"""One long row's update over a "seq" mesh axis: compiled per-device memory against FSDP alone.

Command:
  python benchmarks/seq_split.py                                   # qwen3-8b, 2 layers, 16k
  python benchmarks/seq_split.py --layers 36 --lengths 16384,32768  # all of its layers
  python benchmarks/seq_split.py --preset tiny --layers 2 --lengths 4096,8192
  python benchmarks/seq_split.py --preset qwen3-0.6b --layers 4 --lengths 8192 --time 3

Compiles (never runs) `jax.jit(jax.grad(loss))` of one row's teacher-forced log-probs
(`logprobs.next_token_logprobs`, the update's flat forward and backward: remat, blockwise
attention, bf16 compute and parameters, log-prob chunks of 512; loss = their sum) on fake CPU
devices (`--devices`, default 8), for each mesh of `--meshes` (fsdp x seq; fsdp = devices /
seq). The first 512 tokens are the prompt (the first scored position, a multiple of every seq).
Prints the compiler's per-device temporaries (`memory_analysis().temp_size_in_bytes`: the
activations, checkpoints and gathered weights beyond the arguments and outputs) and the
arguments (the parameters' and the row's shards). With seq = 1 the row cannot be split over
the rows; the compiler splits its residual stream on D over "fsdp" instead.

Results (XLA:CPU, 2026-12-04), quoted in docs/scaling.md:

  python benchmarks/seq_split.py --layers 36 --lengths 16384,32768
  qwen3-8b, 36 layers, bf16, one row, 8 devices
        T  fsdp  seq   temp GiB   args GiB
    16384     8    1      10.92       1.91
    16384     4    2       8.06       1.91
    16384     2    4       6.75       1.91
    16384     1    8       6.57       1.91
    32768     8    1      18.37       1.91
    32768     4    2      12.63       1.91
    32768     2    4       9.78       1.91
    32768     1    8       8.65       1.91

  python benchmarks/seq_split.py --preset smollm2-135m --layers 4 --lengths 4096 --time 2
  (the 8 fake devices share 2 cores: the time is all devices' work together)
  smollm2-135m, 4 layers, bf16, one row, 8 devices
        T  fsdp  seq   temp GiB   args GiB   median s  / seq 1
     4096     8    1       0.22       0.01     44.496    1.00x
     4096     4    2       0.13       0.01     22.094    0.50x
     4096     2    4       0.16       0.01     13.920    0.31x
     4096     1    8       0.22       0.01      8.568    0.19x
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROMPT = 512  # the first scored position: a multiple of every seq size


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="qwen3-8b")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lengths", default="16384")
    p.add_argument("--meshes", default="1,2,4,8", help="seq sizes; fsdp takes the rest")
    p.add_argument("--devices", type=int, default=8)
    p.add_argument(
        "--time", type=int, default=0, help="also run each mesh's program this many times"
    )
    return p.parse_args()


def _compiled(cfg, T: int, fsdp: int, seq: int):
    """One row's log-prob gradient on an fsdp x seq mesh, compiled; with its parameter and row
    shardings."""
    import jax
    import jax.numpy as jnp

    from rlvr_jax.model import sharding
    from rlvr_jax.model import transformer as tf
    from rlvr_jax.rl import logprobs, sharding_plan

    mesh = sharding.make_mesh(sharding.MeshConfig(fsdp=fsdp, seq=seq))
    params = tf.param_shapes(cfg)
    shardings = sharding_plan.param_shardings(cfg, mesh, params)
    rows = sharding.rows_sharding(mesh, 1)

    def loss(params, tokens_NT):
        positions_NT = jnp.broadcast_to(jnp.arange(T), tokens_NT.shape)
        with sharding.activation_mesh(mesh):
            logp, _ = logprobs.next_token_logprobs(
                params, tokens_NT, positions_NT, cfg, None, PROMPT, 512
            )
        return jnp.sum(logp)

    tokens = jax.ShapeDtypeStruct((1, T), jnp.int32, sharding=rows)
    grad = jax.jit(jax.grad(loss), in_shardings=(shardings, rows), out_shardings=shardings)
    return grad.lower(params, tokens).compile(), shardings, rows


def _seconds(cfg, compiled, shardings, rows, T: int, runs: int) -> float:
    """The median wall time of `runs` calls of `compiled` on random weights and tokens (after
    one call that is not counted)."""
    import statistics
    import time

    import jax

    from rlvr_jax.model import transformer as tf

    params = jax.device_put(tf.init_params(jax.random.key(0), cfg), shardings)
    tokens = jax.device_put(jax.random.randint(jax.random.key(1), (1, T), 0, cfg.vocab_size), rows)
    jax.block_until_ready(compiled(params, tokens))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(compiled(params, tokens))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    args = _args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    flag = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    from rlvr_jax.model import config as config_lib

    cfg = config_lib.PRESETS[args.preset].replace(
        num_layers=args.layers,
        dtype="bfloat16",
        param_dtype="bfloat16",
        remat=True,
        attention="xla_blockwise",
        attention_block=512,
    )
    print(f"{args.preset}, {args.layers} layers, bf16, one row, {args.devices} devices")
    timed = f"  {'median s':>9}  {'/ seq 1':>7}" if args.time else ""
    print(f"{'T':>7}  {'fsdp':>4}  {'seq':>3}  {'temp GiB':>9}  {'args GiB':>9}{timed}")
    for T in (int(x) for x in args.lengths.split(",")):
        first = None
        for seq in (int(x) for x in args.meshes.split(",")):
            fsdp = args.devices // seq
            compiled, shardings, rows = _compiled(cfg, T, fsdp, seq)
            memory = compiled.memory_analysis()
            temp = memory.temp_size_in_bytes / 2**30
            held = memory.argument_size_in_bytes / 2**30
            line = f"{T:>7}  {fsdp:>4}  {seq:>3}  {temp:>9.2f}  {held:>9.2f}"
            if args.time:
                seconds = _seconds(cfg, compiled, shardings, rows, T, args.time)
                first = first or seconds
                line += f"  {seconds:>9.3f}  {seconds / first:>6.2f}x"
            print(line, flush=True)


if __name__ == "__main__":
    main()
