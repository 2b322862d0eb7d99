"""Time to the first training step, cold (empty compile cache) and warm (the cache of a previous
launch), for the tiny GRPO config and the SmolLM2 demo.

  python benchmarks/startup.py                       # both configs, 3 launches each way
  python benchmarks/startup.py --configs=tiny --repeats=5

Each launch is `python -m rlvr_jax.main --config=<config> --config.train.steps=1` in a fresh
process and a fresh workdir; the figures come from the metrics ledger's "startup" record (see
`program/compilation.py`): seconds from the start of `main` to the end of the first step (the
evaluation before training included), seconds spent compiling, programs compiled and programs
read back from the cache. A cold launch gets an empty cache directory; the warm launch after it
reuses that directory. Cold and warm launches alternate, and the table gives medians and the
cold / warm ratio.
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
CONFIGS = {"tiny": "configs/tiny.py", "demo": "configs/demo.py"}


def launch(config: str, workdir: Path, cache: Path) -> dict:
    """One launch; its startup record."""
    cmd = [
        sys.executable, "-m", "rlvr_jax.main", f"--config={config}", f"--workdir={workdir}",
        f"--compile_cache={cache}", "--config.train.steps=1",
        "--config.train.use_tensorboard=False",
    ]  # fmt: skip
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
    records = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in records if r["record"] == "startup")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="tiny,demo", help=f"of {sorted(CONFIGS)}")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for name in args.configs.split(","):
        runs = {"cold": [], "warm": []}
        for i in range(args.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                cache = Path(tmp) / "cache"
                for kind in ("cold", "warm"):
                    r = launch(CONFIGS[name], Path(tmp) / f"{kind}{i}", cache)
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
                )
            }  # fmt: skip
            for kind, rs in runs.items()
        }
        rows.append((name, med))
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


if __name__ == "__main__":
    main()
