"""Figures of metrics ledgers: the report of one run and the plots of the ablation study.

Host code. Every figure is drawn with matplotlib's object API on the Agg canvas, so nothing
touches pyplot's global backend: the trainer can draw at the end of a run on a headless machine,
and importing this module never changes another module's plotting.

Both consumers take the records of `metrics.read_metrics`; training curves come from the step
rows (`metrics.step_rows`), held-out curves from every record that carries the metric (the
evaluation before training, the periodic ones and the final one).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from rlvr_jax.config_types import NotFoundError
from rlvr_jax.program.runtime import metrics, useful

Records = Sequence[Mapping[str, Any]]
# One list of records per seed, by variant name.
Runs = Mapping[str, Sequence[Records]]

SUCCESS_HIST = "groups/success_hist"
ALL_CORRECT = "adv/frac_all_correct"
ALL_WRONG = "adv/frac_all_wrong"
EVAL_ACCURACY = "eval/accuracy"

# ---------------------------------------------------------------------------------------------
# Figures, files, curves


def new_figure(
    ncols: int = 1, nrows: int = 1, width: float = 7.0, height: float = 4.0, dpi: int = 100
) -> tuple[Figure, np.ndarray]:
    """A figure on its own Agg canvas and its (nrows, ncols) array of axes.

    Args:
      ncols, nrows: the grid of axes.
      width, height: inches per axes.
      dpi: pixels per inch of the saved PNG.
    """
    fig = Figure(figsize=(width * ncols, height * nrows), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def _step_axes(title: str) -> tuple[Figure, Axes]:
    """One axes over training steps, the report's figure shape (700 x 400 pixels)."""
    fig, axes = new_figure()
    ax = axes[0, 0]
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    return fig, ax


def save(fig: Figure, path: str | Path) -> Path:
    """Lays the figure out and writes it as a PNG; returns the path."""
    path = Path(path)
    fig.tight_layout()
    fig.savefig(path)
    return path


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average over the last `window` finite values (NaNs are skipped), the same
    length as `values`, so it plots against the same steps."""
    if window <= 1:
        return values
    out = np.full_like(values, np.nan)
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        chunk = chunk[np.isfinite(chunk)]
        if chunk.size:
            out[i] = chunk.mean()
    return out


def mean_curve(
    seed_runs: Sequence[Records], key: str, window: int = 1
) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps, smoothed mean over seeds) of a training metric, or None where no seed logged it.

    Seeds that stopped early shorten the curve to the steps every seed reached.
    """
    curves = [metrics.series(metrics.step_rows(r), key, drop_missing=True) for r in seed_runs]
    curves = [(s, v) for s, v in curves if v.size]
    if not curves:
        return None
    n = min(v.size for _, v in curves)
    mean = np.mean([v[:n] for _, v in curves], axis=0)
    return curves[0][0][:n], smooth(mean, window)


# ---------------------------------------------------------------------------------------------
# The report of one run


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
    LinePlot(
        "useful",
        "Verified useful trajectories (rows of groups whose rewards differ)",
        "per hour of step time",
        (useful.PER_HOUR,),
    ),
)


def line_figure(rows: Records, spec: LinePlot, window: int = 1) -> Figure | str:
    """The figure of `spec` over the step rows `rows`, or the reason it is skipped."""
    present = {k for r in rows for k in r}
    keys = [k for k in spec.keys if k in present]
    if spec.prefix:
        keys += sorted(k for k in present if k.startswith(spec.prefix) and k not in keys)
    if not keys:
        wanted = list(spec.keys) + ([f"{spec.prefix}*"] if spec.prefix else [])
        return f"no metric among {wanted}"
    fig, ax = _step_axes(spec.title)
    ax.set_ylabel(spec.ylabel)
    for key in keys:
        steps, values = metrics.series(rows, key)
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


def _success_heat_map(rows: Records) -> Figure:
    steps = np.asarray([r["step"] for r in rows], np.float64)
    bins = max(len(r[SUCCESS_HIST]) for r in rows)
    counts = np.zeros((bins, len(steps)))
    for j, r in enumerate(rows):
        col = np.asarray([math.nan if c is None else c for c in r[SUCCESS_HIST]], np.float64)
        counts[: len(col), j] = col
    total = np.nansum(counts, axis=0, keepdims=True)
    fractions = np.where(total > 0, counts / np.where(total > 0, total, 1), np.nan)
    fig, ax = _step_axes("Groups by number of correct samples")
    ax.grid(False)
    mesh = ax.pcolormesh(
        _edges(steps), np.arange(bins + 1) - 0.5, fractions, cmap="viridis", vmin=0, vmax=1
    )
    ax.set_ylabel("correct samples in the group")
    fig.colorbar(mesh, ax=ax, label="fraction of groups")
    return fig


def group_figure(rows: Records) -> Figure | str:
    """How many samples of each group were correct, over the step rows `rows`.

    With "groups/success_hist" (counts of groups with 0, 1, ..., G correct samples), a heat map
    of the fraction of groups in each bin; otherwise the all-wrong / mixed / all-correct
    fractions stacked. Groups with no variance (all correct, all wrong) give GRPO no signal.
    """
    hist_rows = [r for r in rows if isinstance(r.get(SUCCESS_HIST), list)]
    if hist_rows:
        return _success_heat_map(hist_rows)
    present = {k for r in rows for k in r}
    if ALL_CORRECT not in present or ALL_WRONG not in present:
        return f"no {SUCCESS_HIST!r} and not both of {[ALL_WRONG, ALL_CORRECT]}"
    steps, wrong = metrics.series(rows, ALL_WRONG)
    steps_c, correct = metrics.series(rows, ALL_CORRECT)
    if not np.array_equal(steps, steps_c):
        common = sorted(set(steps) & set(steps_c))
        wrong = wrong[np.isin(steps, common)]
        correct = correct[np.isin(steps_c, common)]
        steps = np.asarray(common, np.float64)
    mixed = np.clip(1.0 - wrong - correct, 0.0, 1.0)
    fig, ax = _step_axes("Groups by outcome")
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


def report_figures(records: Records, window: int = 1) -> dict[str, Figure | str]:
    """Every report figure of a run's records, by file stem; a string instead of a figure says
    why it is skipped."""
    rows = metrics.step_rows(records)
    out: dict[str, Figure | str] = {}
    for spec in LINE_PLOTS:
        out[spec.name] = line_figure(rows, spec, window)
    out["groups"] = group_figure(rows)
    return out


def make_report(
    workdir: str | Path,
    out_dir: str | Path | None = None,
    window: int = 1,
    log: Callable[[str], None] = print,
) -> dict[str, Path]:
    """Writes the report's PNGs of the run in `workdir`; returns {stem: path} of those written.

    Args:
      workdir: the run directory holding metrics.jsonl.
      out_dir: where the PNGs go (default `workdir/plots`).
      window: moving-average window drawn over the raw curves (1: raw only).
      log: receives one note per skipped plot and one summary line.
    """
    workdir = Path(workdir)
    records = metrics.read_metrics(workdir)
    rows = metrics.step_rows(records)
    if not rows:
        path = workdir / metrics.METRICS_FILE
        if path.is_file():
            raise NotFoundError(f"{path} holds no training step yet")
        raise NotFoundError(f"{path} does not exist: {str(workdir)!r} is not a run's workdir")
    out_dir = Path(out_dir) if out_dir is not None else workdir / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, fig in report_figures(records, window).items():
        if isinstance(fig, str):
            log(f"report: skipping {name}.png: {fig}")
            continue
        written[name] = save(fig, out_dir / f"{name}.png")
    log(f"report: wrote {len(written)} plots of {len(rows)} steps to {out_dir}")
    return written


# ---------------------------------------------------------------------------------------------
# The ablation study: variants x seeds


def _ablation_figure(ncols: int, nrows: int = 1, width: float = 4.2, height: float = 3.0):
    return new_figure(ncols, nrows, width=width, height=height, dpi=72)


def plot_curves(runs: Runs, out: Path, window: int = 10) -> list[Path]:
    """Training accuracy, held-out accuracy and lengths over steps, mean over seeds.

    Writes `out/accuracy.png` and `out/length.png`; returns their paths.
    """
    paths = []
    fig, axes = _ablation_figure(2)
    for name, seed_runs in runs.items():
        curve = mean_curve(seed_runs, "accuracy", window)
        if curve is not None:
            axes[0, 0].plot(*curve, label=name, lw=1.2)
        # Every record with the metric: before training, the periodic evaluations, the final one.
        evals = [metrics.series(r, EVAL_ACCURACY, drop_missing=True) for r in seed_runs]
        n = min(v.size for _, v in evals)
        if n:
            vals = np.asarray([v[:n] for _, v in evals])
            axes[0, 1].errorbar(
                evals[0][0][:n],
                vals.mean(0),
                yerr=vals.std(0),
                label=name,
                capsize=2,
                lw=1.2,
                marker="o",
                ms=3,
            )
    axes[0, 0].set(title=f"Accuracy of training samples ({window}-step mean)", xlabel="step")
    axes[0, 1].set(title="Held-out greedy accuracy (± std over seeds)", xlabel="step")
    axes[0, 1].legend(fontsize=7)
    paths.append(save(fig, out / "accuracy.png"))

    fig, axes = _ablation_figure(3)
    keys = ("length/mean", "length/correct", "length/incorrect")
    for ax, key in zip(axes[0], keys, strict=True):
        for name, seed_runs in runs.items():
            curve = mean_curve(seed_runs, key, window)
            if curve is not None:
                ax.plot(*curve, label=name, lw=1.2)
        ax.set(title=f"{key} (tokens, {window}-step mean)", xlabel="step")
    axes[0, 2].legend(fontsize=7)
    paths.append(save(fig, out / "length.png"))
    return paths


def seed_curves(
    seed_runs: Sequence[Records], key: str, window: int = 1
) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps, smoothed curves (seeds, steps)) of a training metric, or None where no seed logged
    it; seeds that stopped early shorten the curves to the steps every seed reached. A step where
    the metric is missing (e.g. the length of correct answers when none was) is NaN, and the
    smoothing skips it."""
    curves = []
    for records in seed_runs:
        rows = metrics.step_rows(records)
        steps = np.asarray([r["step"] for r in rows])
        values = np.asarray(
            [np.nan if r.get(key) is None else float(r[key]) for r in rows], np.float64
        )
        if np.isfinite(values).any():
            curves.append((steps, smooth(values, window)))
    if not curves:
        return None
    n = min(v.size for _, v in curves)
    return curves[0][0][:n], np.asarray([v[:n] for _, v in curves])


def plot_lengths_by_variant(runs: Runs, out: Path, window: int = 10) -> Path | None:
    """Mean length of the correct and of the incorrect training samples over steps, one panel per
    variant: the mean over seeds, shaded between the lowest and the highest seed; writes
    `out/length_by_variant.png` (None when no run logged the lengths)."""
    names = [n for n in runs if seed_curves(runs[n], "length/incorrect") is not None]
    if not names:
        return None
    ncols = min(4, len(names))
    nrows = math.ceil(len(names) / ncols)
    fig, axes = _ablation_figure(ncols, nrows, width=3.4, height=2.6)
    for i, name in enumerate(names):
        ax = axes[i // ncols, i % ncols]
        for key, label, color in (
            ("length/correct", "correct", "tab:green"),
            ("length/incorrect", "incorrect", "tab:red"),
        ):
            curves = seed_curves(runs[name], key, window)
            if curves is None:
                continue
            steps, values = curves
            with np.errstate(invalid="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN steps stay NaN
                ax.plot(steps, np.nanmean(values, 0), color=color, lw=1.2, label=label)
                lo, hi = np.nanmin(values, 0), np.nanmax(values, 0)
            ax.fill_between(steps, lo, hi, color=color, alpha=0.2, lw=0)
        ax.set(title=f"{name} ({len(runs[name])} seeds)", xlabel="step", ylabel="tokens")
        ax.grid(alpha=0.3)
    for j in range(len(names), nrows * ncols):
        axes[j // ncols, j % ncols].axis("off")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"Length of correct and incorrect samples ({window}-step mean; band: seed range)")
    return save(fig, out / "length_by_variant.png")


def plot_grad_norms(
    table: Mapping[str, np.ndarray],
    G: int,
    pairs: Sequence[tuple[str, str]],
    out: Path,
) -> Path | None:
    """Per-prompt gradient norm against the group's success count: raw, relative to the G/2
    groups, and the ratio of each (std-scaled, unscaled) pair against 1 / sqrt(p (1 - p)).

    Args:
      table: {variant: mean norm for 0..G correct samples} (NaN where no group had that many).
      G: the group size.
      pairs: (std-scaled, unscaled) variant names that differ only in the std division.
      out: the directory of `grad_norm_vs_success.png`.

    Returns:
      The PNG's path, or None when no variant logged the norms.
    """
    table = {k: v for k, v in table.items() if not np.all(np.isnan(v))}
    if not table:
        return None
    pairs = [(a, b) for a, b in pairs if a in table and b in table]
    fig, axes = _ablation_figure(3 if pairs else 2)
    k = np.arange(G + 1)
    for name, norms in table.items():
        axes[0, 0].plot(k, norms, marker="o", ms=3, label=name, lw=1.2)
        mid = norms[G // 2]
        if np.isfinite(mid) and mid > 0:
            axes[0, 1].plot(k, norms / mid, marker="o", ms=3, label=name, lw=1.2)
    axes[0, 0].set(title="Per-prompt gradient norm", xlabel=f"correct samples in the group of {G}")
    axes[0, 1].set(
        title=f"... relative to the {G // 2}/{G} groups", xlabel=f"correct samples of {G}"
    )
    axes[0, 0].legend(fontsize=7)
    if pairs:
        inner = k[1:-1]
        p = inner / G
        theory = 1 / np.sqrt(p * (1 - p))
        for a, b in pairs:
            ratio = table[a][1:-1] / table[b][1:-1]
            axes[0, 2].plot(
                inner, ratio / ratio[len(ratio) // 2], marker="o", ms=3, label=f"{a} / {b}", lw=1.2
            )
        axes[0, 2].plot(
            inner,
            theory / theory[len(theory) // 2],
            "k--",
            lw=1,
            label="1/sqrt(p(1-p)), binary reward",
        )
        axes[0, 2].set(
            title=f"std-scaled / unscaled (1 at {G // 2}/{G})", xlabel=f"correct samples of {G}"
        )
        axes[0, 2].legend(fontsize=7)
    return save(fig, out / "grad_norm_vs_success.png")


def plot_histograms(runs: Runs, G: int, out: Path) -> Path:
    """Fraction of groups with k correct samples, first vs last quarter of the steps, one panel
    per variant (seeds pooled); writes `out/success_hist.png`."""
    names = list(runs)
    ncols = min(3, len(names))
    nrows = math.ceil(len(names) / ncols)
    fig, axes = _ablation_figure(ncols, nrows, width=3.4, height=2.4)
    k = np.arange(G + 1)
    for i, name in enumerate(names):
        ax = axes[i // ncols, i % ncols]
        hists = [
            (r["step"], np.asarray(r[SUCCESS_HIST], np.float64))
            for records in runs[name]
            for r in metrics.step_rows(records)
            if r.get(SUCCESS_HIST) is not None
        ]
        if not hists:
            continue
        last = max(s for s, _ in hists)
        for label, keep, off in (
            ("first quarter", lambda s, n=last: s <= n / 4, -0.2),
            ("last quarter", lambda s, n=last: s > 3 * n / 4, 0.2),
        ):
            h = np.sum([h for s, h in hists if keep(s)], axis=0)
            ax.bar(k + off, h / max(h.sum(), 1), width=0.4, label=label)
        ax.set(title=name, xlabel="correct of G", xticks=k)
    for j in range(len(names), nrows * ncols):
        axes[j // ncols, j % ncols].axis("off")
    axes[0, 0].legend(fontsize=7)
    return save(fig, out / "success_hist.png")
