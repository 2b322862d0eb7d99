"""Plots of a run's metrics ledger: `python -m rlvr_jax.report --workdir W`.

Host code. Reads `W/metrics.jsonl` (written by `program.metrics.MetricsWriter`) and writes one
PNG per topic into `W/plots/`: reward and accuracy, response length, KL, clip fractions,
entropy, the distribution of per-group success, and step timing. A topic whose metrics the run
did not record is skipped with a printed note.

Figures are drawn with matplotlib's object API on the Agg canvas, so nothing touches pyplot's
global backend (the trainer can call `make_report` at the end of a run on a headless machine).
The command line uses argparse rather than absl flags so that importing this module never
defines process-wide flags next to `main.py`'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from rlvr_jax.program.metrics import read_metrics

SUCCESS_HIST = "groups/success_hist"
ALL_CORRECT = "adv/frac_all_correct"
ALL_WRONG = "adv/frac_all_wrong"


@dataclasses.dataclass(frozen=True)
class LinePlot:
    """One figure of metric curves over steps.

    Attributes:
      name: the file stem (`plots/<name>.png`).
      title: the figure title.
      ylabel: the y axis label.
      keys: the metrics to draw; missing ones are left out, all missing skips the figure.
      logy: a logarithmic y axis (values <= 0 are not drawn).
      prefix: also draw every metric whose name starts with this (e.g. "time/").
    """

    name: str
    title: str
    ylabel: str
    keys: tuple[str, ...] = ()
    logy: bool = False
    prefix: str | None = None


LINE_PLOTS = (
    LinePlot("reward", "Reward and accuracy", "mean over samples", ("reward/mean", "accuracy")),
    LinePlot(
        "length",
        "Response length",
        "tokens",
        ("length/mean", "length/p95", "length/correct", "length/incorrect"),
    ),
    LinePlot("kl", "KL to the reference", "KL (per token)", ("kl/mean",), logy=True),
    LinePlot(
        "clip", "Clipped ratio fractions", "fraction of tokens", ("clip/frac_low", "clip/frac_high")
    ),
    LinePlot("entropy", "Policy entropy", "nats per token", ("entropy/mean",)),
    LinePlot("timing", "Step timing", "seconds", prefix="time/"),
)


def _series(entries: Sequence[dict[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the scalar metric `key`; null and non-numeric values become NaN."""
    steps, values = [], []
    for entry in entries:
        if key in entry:
            v = entry[key]
            steps.append(entry["step"])
            values.append(float(v) if isinstance(v, int | float) else math.nan)
    return np.asarray(steps, np.float64), np.asarray(values, np.float64)


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average over the last `window` finite values (NaNs are skipped)."""
    if window <= 1:
        return values
    out = np.full_like(values, np.nan)
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        chunk = chunk[np.isfinite(chunk)]
        if chunk.size:
            out[i] = chunk.mean()
    return out


def _new_figure(title: str) -> tuple[Figure, Any]:
    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    return fig, ax


def line_figure(entries: Sequence[dict[str, Any]], spec: LinePlot, window: int = 1) -> Figure | str:
    """The figure of `spec`, or the reason it is skipped."""
    present = {k for e in entries for k in e}
    keys = [k for k in spec.keys if k in present]
    if spec.prefix:
        keys += sorted(k for k in present if k.startswith(spec.prefix) and k not in keys)
    if not keys:
        wanted = list(spec.keys) + ([f"{spec.prefix}*"] if spec.prefix else [])
        return f"no metric among {wanted}"
    fig, ax = _new_figure(spec.title)
    ax.set_ylabel(spec.ylabel)
    for key in keys:
        steps, values = _series(entries, key)
        if spec.logy:
            values = np.where(values > 0, values, np.nan)
        if window > 1:
            (raw,) = ax.plot(steps, values, alpha=0.25, linewidth=0.8)
            ax.plot(steps, smooth(values, window), label=key, color=raw.get_color())
        else:
            ax.plot(steps, values, label=key)
    if spec.logy:
        ax.set_yscale("log")
    ax.legend(loc="best", fontsize="small")
    return fig


def _edges(steps: np.ndarray) -> np.ndarray:
    """Cell edges around each step (midpoints between neighbours) for a heat map."""
    if len(steps) == 1:
        return np.array([steps[0] - 0.5, steps[0] + 0.5])
    mid = (steps[1:] + steps[:-1]) / 2
    return np.concatenate([[2 * steps[0] - mid[0]], mid, [2 * steps[-1] - mid[-1]]])


def group_figure(entries: Sequence[dict[str, Any]]) -> Figure | str:
    """How many samples of each group were correct, over time.

    With "groups/success_hist" (counts of groups with 0, 1, ..., G correct samples), a heat map
    of the fraction of groups in each bin; otherwise the all-wrong / mixed / all-correct
    fractions stacked. Groups with no variance (all correct, all wrong) give GRPO no signal.
    """
    hist_entries = [e for e in entries if isinstance(e.get(SUCCESS_HIST), list)]
    if hist_entries:
        steps = np.asarray([e["step"] for e in hist_entries], np.float64)
        bins = max(len(e[SUCCESS_HIST]) for e in hist_entries)
        counts = np.zeros((bins, len(steps)))
        for j, e in enumerate(hist_entries):
            col = np.asarray([math.nan if c is None else c for c in e[SUCCESS_HIST]], np.float64)
            counts[: len(col), j] = col
        total = np.nansum(counts, axis=0, keepdims=True)
        fractions = np.where(total > 0, counts / np.where(total > 0, total, 1), np.nan)
        fig, ax = _new_figure("Groups by number of correct samples")
        ax.grid(False)
        mesh = ax.pcolormesh(
            _edges(steps), np.arange(bins + 1) - 0.5, fractions, cmap="viridis", vmin=0, vmax=1
        )
        ax.set_ylabel("correct samples in the group")
        fig.colorbar(mesh, ax=ax, label="fraction of groups")
        return fig
    present = {k for e in entries for k in e}
    if ALL_CORRECT not in present or ALL_WRONG not in present:
        return f"no {SUCCESS_HIST!r} and not both of {[ALL_WRONG, ALL_CORRECT]}"
    steps, wrong = _series(entries, ALL_WRONG)
    steps_c, correct = _series(entries, ALL_CORRECT)
    if not np.array_equal(steps, steps_c):
        common = sorted(set(steps) & set(steps_c))
        wrong = wrong[np.isin(steps, common)]
        correct = correct[np.isin(steps_c, common)]
        steps = np.asarray(common, np.float64)
    mixed = np.clip(1.0 - wrong - correct, 0.0, 1.0)
    fig, ax = _new_figure("Groups by outcome")
    ax.stackplot(
        steps,
        np.nan_to_num(wrong),
        np.nan_to_num(mixed),
        np.nan_to_num(correct),
        labels=["all wrong", "mixed", "all correct"],
        colors=["#d62728", "#7f7f7f", "#2ca02c"],
        alpha=0.8,
    )
    ax.set_ylim(0, 1)
    ax.set_ylabel("fraction of groups")
    ax.legend(loc="upper right", fontsize="small")
    return fig


def figures(entries: Sequence[dict[str, Any]], window: int = 1) -> dict[str, Figure | str]:
    """Every report figure by file stem; a string instead of a figure says why it is skipped."""
    out: dict[str, Figure | str] = {}
    for spec in LINE_PLOTS:
        out[spec.name] = line_figure(entries, spec, window)
    out["groups"] = group_figure(entries)
    return out


def make_report(
    workdir: str | Path,
    out_dir: str | Path | None = None,
    window: int = 1,
    log: Callable[[str], None] = print,
) -> dict[str, Path]:
    """Writes the report's PNGs; returns {stem: path} of those written.

    Args:
      workdir: the run directory holding metrics.jsonl.
      out_dir: where the PNGs go (default `workdir/plots`).
      window: moving-average window drawn over the raw curves (1: raw only).
      log: receives one note per skipped plot and one summary line.
    """
    workdir = Path(workdir)
    entries = read_metrics(workdir)
    if not entries:
        raise FileNotFoundError(f"no metrics entries in {workdir / 'metrics.jsonl'}")
    out_dir = Path(out_dir) if out_dir is not None else workdir / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, fig in figures(entries, window).items():
        if isinstance(fig, str):
            log(f"report: skipping {name}.png: {fig}")
            continue
        path = out_dir / f"{name}.png"
        fig.tight_layout()
        fig.savefig(path)
        written[name] = path
    log(f"report: wrote {len(written)} plots of {len(entries)} steps to {out_dir}")
    return written


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
    make_report(args.workdir, args.out, args.smooth)


if __name__ == "__main__":
    main()
