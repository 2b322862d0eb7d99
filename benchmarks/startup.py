"""Time to the first training step, cold (empty compile cache) and warm (the cache of a previous
launch), for the tiny GRPO config and the SmolLM2 demo.

  python benchmarks/startup.py                       # both configs, 3 launches each way
  python benchmarks/startup.py --configs=tiny --repeats=5

Each launch is `python -m rlvr_jax.main --config=<config> --config.train.steps=1` in a fresh
process and a fresh workdir; the figures come from the metrics ledger's "startup" record (see
`program/runtime/compilation.py`): seconds from the start of `main` to the end of the first step
(the evaluation before training included), seconds spent compiling, programs compiled and programs
read back from the cache. A cold launch gets an empty cache directory; the warm launch after it
reuses that directory. Cold and warm launches alternate, and the table gives medians and the
cold / warm ratio. The weight cache (`model/weight_cache.py`) follows the compile cache: a cold
launch gets an empty one, the warm launch after it the one the cold launch filled.

A first, smaller table times loading the embedded SmolLM2 model alone, each in a fresh process:
imports, `load_tokenizer("embedded")`, then `load_model("embedded")` (weights on the device),
with the weight cache off, cold (an empty cache directory, which the load fills) and warm.

  python benchmarks/startup.py --configs= --load_repeats=5   # the loading table only

A second table splits the warm launches' time to the first step into the record's phases: the
set-up (imports, loading, building the stage), the evaluation before training, the wait for the
programs compiled ahead, and the first step itself.

`--ahead` compares, cold, compiling the step ahead of the loop on a thread during the evaluation
before training (`train.compile_ahead=True`, the default) with compiling it at its first call
(False), alternating launches. "tiny_host" is the tiny config with a host verifier (math), whose
step is two programs, the rollout and the update, compiled ahead on two threads:

  python benchmarks/startup.py --configs=tiny,tiny_host --load_repeats=0 --ahead
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# name -> (config, flags): the fused step (tiny, demo) and the host path (rollout, host verifier,
# update: two programs).
CONFIGS = {
    "tiny": ("configs/tiny.py",),
    "tiny_host": ("configs/tiny.py", "--config.reward.verifier=math"),
    "demo": ("configs/demo.py",),
}
# The startup record's phases (`program/runtime/run.py`); the set-up is what they leave.
PHASES = ("eval_before", "compile_wait", "first_step")
LOAD_KINDS = ("off", "cold", "warm")
# Run in a fresh interpreter: prints the seconds of each phase as one JSON line.
_LOAD_SCRIPT = """
import json, time
t0 = time.perf_counter()
import jax
from rlvr_jax.data.tokenizer import load_tokenizer
from rlvr_jax.model.loading import load_model
t1 = time.perf_counter()
load_tokenizer("embedded")
t2 = time.perf_counter()
jax.block_until_ready(load_model("embedded")[0])
t3 = time.perf_counter()
print(json.dumps({"imports": t1 - t0, "tokenizer": t2 - t1, "model": t3 - t2, "total": t3 - t0}))
"""


def _env(weights: Path | str) -> dict[str, str]:
    return {
        **os.environ,
        "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
        "RLVR_JAX_WEIGHT_CACHE": str(weights),
    }


def load_launch(weights: Path | str) -> dict[str, float]:
    """Seconds of each phase of loading the embedded model in a fresh process."""
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD_SCRIPT],
        cwd=ROOT,
        env=_env(weights),
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise RuntimeError(f"loading the embedded model failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def load_table(repeats: int) -> None:
    """Off, cold and warm loads interleaved, `repeats` of each; prints the medians."""
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in LOAD_KINDS}
    for i in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            for kind in LOAD_KINDS:
                r = load_launch("none" if kind == "off" else Path(tmp) / "weights")
                runs[kind].append(r)
                print(f"load {kind} {i}: " + ", ".join(f"{k} {v:.2f} s" for k, v in r.items()))
    print(f"\nloading the embedded model, medians of {repeats} fresh processes each way\n")
    print("| weight cache | imports s | tokenizer s | model s | total s | off / this |")
    print("|---|---:|---:|---:|---:|---:|")
    off = statistics.median(r["total"] for r in runs["off"])
    for kind, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(
            f"| {kind} | {med['imports']:.2f} | {med['tokenizer']:.2f} | {med['model']:.2f} | "
            f"{med['total']:.2f} | {off / med['total']:.2f}x |"
        )
    print()


def launch(name: str, workdir: Path, cache: Path, weights: Path, *extra: str) -> dict:
    """One launch of `CONFIGS[name]` (`extra`: more flags); its startup record, with the set-up
    ("startup/setup_seconds") that its phases leave."""
    config, *flags = CONFIGS[name]
    cmd = [
        sys.executable, "-m", "rlvr_jax.main", f"--config={config}", *flags, f"--workdir={workdir}",
        f"--compile_cache={cache}", "--config.train.steps=1",
        "--config.train.use_tensorboard=False", *extra,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(weights), capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
    records = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    r = next(r for r in records if r["record"] == "startup")
    r["startup/setup_seconds"] = r["startup/seconds"] - sum(
        r[f"startup/{p}_seconds"] for p in PHASES
    )
    return r


def ahead_table(configs: str, repeats: int) -> None:
    """Cold launches with the step compiled ahead of the loop and without, alternating."""
    rows = []
    for name in filter(None, configs.split(",")):
        runs = {True: [], False: []}
        for i in range(repeats):
            for ahead in (True, False):
                with tempfile.TemporaryDirectory() as tmp:
                    flag = f"--config.train.compile_ahead={ahead}"
                    r = launch(name, Path(tmp) / "run", Path(tmp) / "c", Path(tmp), flag)
                runs[ahead].append(r["startup/seconds"])
                print(f"{name} ahead={ahead} {i}: first step after {runs[ahead][-1]:.1f} s")
        rows.append((name, *(statistics.median(runs[a]) for a in (True, False))))
    print(f"\nmedians of {repeats} cold launches each way\n")
    print("| config | ahead: first step s | at first call: first step s | ahead / at call |")
    print("|---|---:|---:|---:|")
    for name, on, off in rows:
        print(f"| {name} | {on:.1f} | {off:.1f} | {on / off:.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="tiny,demo", help=f"of {sorted(CONFIGS)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--load_repeats", type=int, default=3, help="0 skips the loading table")
    ap.add_argument("--ahead", action="store_true", help="the compile-ahead table only")
    args = ap.parse_args()
    if args.ahead:
        ahead_table(args.configs, args.repeats)
        return
    if args.load_repeats:
        load_table(args.load_repeats)
    rows = []
    for name in filter(None, args.configs.split(",")):
        runs = {"cold": [], "warm": []}
        for i in range(args.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                cache = Path(tmp) / "cache"
                for kind in ("cold", "warm"):
                    r = launch(name, Path(tmp) / f"{kind}{i}", cache, Path(tmp) / "w")
                    runs[kind].append(r)
                    print(
                        f"{name} {kind} {i}: first step after {r['startup/seconds']:.1f} s, "
                        f"{r['startup/programs_compiled']} compiled in "
                        f"{r['startup/compile_seconds']:.1f} s, "
                        f"{r['startup/programs_from_cache']} from the cache",
                        flush=True,
                    )
        med = {
            kind: {
                k: statistics.median(r[k] for r in rs)
                for k in (
                    "startup/seconds",
                    "startup/compile_seconds",
                    "startup/programs_compiled",
                    "startup/programs_from_cache",
                    "startup/setup_seconds",
                    *(f"startup/{p}_seconds" for p in PHASES),
                )
            }  # fmt: skip
            for kind, rs in runs.items()
        }
        rows.append((name, med))
    if not rows:
        return
    print(f"\nmedians of {args.repeats} launches each way\n")
    print(
        "| config | cold: first step s | cold: compile s | warm: first step s | "
        "warm: compile s | warm: programs from cache | cold / warm |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, med in rows:
        cold, warm = med["cold"], med["warm"]
        print(
            f"| {name} | {cold['startup/seconds']:.1f} | {cold['startup/compile_seconds']:.1f} | "
            f"{warm['startup/seconds']:.1f} | {warm['startup/compile_seconds']:.1f} | "
            f"{warm['startup/programs_from_cache']:.0f} | "
            f"{cold['startup/seconds'] / warm['startup/seconds']:.2f}x |"
        )
    print("\nwhere the warm launches' time to the first step goes (medians, s)\n")
    print("| config | first step after | set-up | eval before | compile wait | first step |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, med in rows:
        warm = med["warm"]
        cells = " | ".join(f"{warm[f'startup/{p}_seconds']:.1f}" for p in ("setup", *PHASES))
        print(f"| {name} | {warm['startup/seconds']:.1f} | {cells} |")


if __name__ == "__main__":
    main()
