"""Plots of a run's metrics ledger: `python -m rlvr_jax.report --workdir W`.

Reads `W/metrics.jsonl` (written by `program.runtime.metrics.MetricsWriter`) and writes one PNG per
topic into `W/plots/` (or `--out`): reward and accuracy, response length, KL, clip fractions,
entropy, the distribution of per-group success, step timing, and verified useful trajectories
per hour (`program.runtime.useful`). A topic whose metrics the run did not record is skipped
with a printed note. The figures are `program.evals.plots`'s.

The command line uses argparse rather than absl flags so that importing this module never
defines process-wide flags next to `main.py`'s.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from rlvr_jax.program.evals import plots
from rlvr_jax.program.runtime import user_errors


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: `python -m rlvr_jax.report --workdir W [--out DIR] [--smooth N]`."""
    parser = argparse.ArgumentParser(prog="python -m rlvr_jax.report", description=__doc__)
    parser.add_argument("--workdir", required=True, help="run directory with metrics.jsonl")
    parser.add_argument("--out", default=None, help="output directory (default: WORKDIR/plots)")
    parser.add_argument(
        "--smooth", type=int, default=1, help="moving-average window over the curves (1: none)"
    )
    args = parser.parse_args(argv)
    if args.smooth < 1:
        parser.error(f"--smooth={args.smooth} must be at least 1")
    plots.make_report(args.workdir, args.out, args.smooth)


if __name__ == "__main__":
    user_errors.call("report", main)
