"""The numbers of the objective-bias study (`studies.ablation`): per run, per variant over seeds,
and the Markdown tables.

Host code: arithmetic on the metrics ledgers (`metrics.read_metrics` records, the same rows the
report plots) and on each run's evaluations; nothing here trains or evaluates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlvr_jax.program.runtime import metrics, useful


def _lengths(
    by_step: Mapping[int, Mapping[str, Any]], steps: np.ndarray, n_rows: int
) -> tuple[float, float]:
    """Mean length of the correct and of the incorrect responses over `steps`, each step weighted
    by how many responses were correct (resp. incorrect) there; NaN where there were none."""
    n_ok = np.asarray([by_step[s]["accuracy"] * n_rows for s in steps])
    n_bad = n_rows - n_ok
    len_ok = np.asarray([by_step[s].get("length/correct") or 0.0 for s in steps])
    len_bad = np.asarray([by_step[s].get("length/incorrect") or 0.0 for s in steps])
    ok = float(np.sum(n_ok * len_ok) / np.sum(n_ok)) if np.sum(n_ok) else math.nan
    bad = float(np.sum(n_bad * len_bad) / np.sum(n_bad)) if np.sum(n_bad) else math.nan
    return ok, bad


def run_stats(
    records: Sequence[Mapping[str, Any]],
    result: Mapping[str, Any],
    pass_at_k: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The table's numbers for one run, from its ledger records and result.

    - lengths (len_correct, len_incorrect): means over the rollouts of the last quarter of the
      steps, weighted by how many responses were correct (resp. incorrect) at each step;
      len_*_first: the same over the first quarter; len_incorrect_growth: last minus first;
      len_gap: len_incorrect - len_correct (last quarter).
    - zero_variance: the mean over steps of the fraction of groups whose rewards are all equal.
    - successes_per_minute: verified-correct samples per minute of step time, from step 2 on
      (step 1 carries the compilation).
    - useful_per_hour: verified useful trajectories (rows of groups whose rewards differ) per
      hour of step time, from step 2 on (`useful.run_per_hour`); NaN for a ledger without them.

    Args:
      records: the run's `metrics.read_metrics` records (only the step rows are used).
      result: the run's `run_one` result (evaluations and rows per step).
      pass_at_k: the run's `heldout_pass_at_k`, copied in when given.
    """
    n_rows = result["rows_per_step"]
    rows = metrics.step_rows(records)
    steps, acc = metrics.series(rows, "accuracy", drop_missing=True)
    if steps.size == 0:
        raise ValueError("the run logged no training steps")
    by_step = {r["step"]: r for r in rows}
    last = steps[steps > steps.max() * 3 / 4] if steps.size >= 4 else steps
    first = steps[steps <= steps.max() / 4] if steps.size >= 4 else steps
    len_ok, len_bad = _lengths(by_step, last, n_rows)
    first_ok, first_bad = _lengths(by_step, first, n_rows)
    _, zero_var = metrics.series(rows, "adv/frac_zero_variance", drop_missing=True)
    t_steps, t = metrics.series(rows, metrics.STEP_TIME, drop_missing=True)
    timed = t_steps > 1 if t_steps.size > 1 else np.ones_like(t_steps, bool)
    ok_timed = np.asarray([by_step[s]["accuracy"] * n_rows for s in t_steps[timed]])
    seconds = float(np.sum(t[timed]))
    out = {
        "acc_before": result["eval_before"]["eval/accuracy"],
        "acc_after": result["eval_after"]["eval/accuracy"],
        "eval_length_after": result["eval_after"]["eval/length"],
        "len_correct": len_ok,
        "len_incorrect": len_bad,
        "len_correct_first": first_ok,
        "len_incorrect_first": first_bad,
        "len_incorrect_growth": len_bad - first_bad,
        "len_gap": len_bad - len_ok,
        "zero_variance": float(np.mean(zero_var)) if zero_var.size else math.nan,
        "successes": float(np.sum(acc) * n_rows),
        "successes_per_minute": float(60 * np.sum(ok_timed) / seconds) if seconds else math.nan,
        "step_seconds": seconds / max(int(np.sum(timed)), 1),
        "useful_per_hour": useful.run_per_hour(records),
    }
    for key, value in (pass_at_k or {}).items():
        if key.startswith(("pass@", "mean@")):
            out[key] = value
    return out


def _mean_std(xs: Sequence[float]) -> tuple[float, float, float]:
    """(mean, sample std, standard error of the mean) of the finite values; NaNs where none."""
    a = np.asarray([x for x in xs if not math.isnan(x)], np.float64)
    if a.size == 0:
        return math.nan, math.nan, math.nan
    sd = float(a.std(ddof=1)) if a.size > 1 else 0.0
    return float(a.mean()), sd, sd / math.sqrt(a.size)


def summarize(per_seed: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per variant: (mean, sample std, standard error) over seeds of every `run_stats` number
    (a number some seeds lack counts the others), and the seeds' own."""
    out = {}
    for name, stats in per_seed.items():
        row: dict[str, Any] = {"per_seed": list(stats)}
        for key in dict.fromkeys(k for s in stats for k in s):
            row[key] = _mean_std([s.get(key, math.nan) for s in stats])
        row["gain"] = _mean_std([s["acc_after"] - s["acc_before"] for s in stats])
        out[name] = row
    return out


def _fmt(x: float, digits: int = 3) -> str:
    return "n/a" if math.isnan(x) else f"{x:.{digits}f}"


def _pm(cell: tuple[float, ...], digits: int = 3, sign: str = "") -> str:
    """ "mean ± standard error" of a `summarize` cell."""
    if math.isnan(cell[0]):
        return "n/a"
    return f"{cell[0]:{sign}.{digits}f} ± {_fmt(cell[2], digits)}"


def _pass_keys(summary: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The pass@k columns some variant has, by k."""
    keys = {k for row in summary.values() for k in row if k.startswith("pass@")}
    return sorted(keys, key=lambda k: int(k.removeprefix("pass@")))


def markdown_table(summary: Mapping[str, Mapping[str, Any]], num_seeds: int) -> str:
    """The study's table: one row per variant, mean ± standard error over seeds."""
    passk = _pass_keys(summary)
    lines = [
        "| variant | held-out greedy | gain | "
        + "".join(f"{k} | " for k in passk)
        + "len. correct (first → last q.) | len. incorrect (first → last q.) "
        "| Δ len. incorrect | zero-var. groups | useful / h |",
        "|---" * (8 + len(passk)) + "|",
    ]
    for name, row in summary.items():
        n = len(row["per_seed"])
        cells = [
            name if n == num_seeds else f"{name} ({n} seed{'s' if n > 1 else ''})",
            _pm(row["acc_after"]),
            _pm(row["gain"], sign="+"),
            *(_pm(row.get(k, (math.nan,))) for k in passk),
            f"{_fmt(row['len_correct_first'][0], 1)} → {_pm(row['len_correct'], 1)}",
            f"{_fmt(row['len_incorrect_first'][0], 1)} → {_pm(row['len_incorrect'], 1)}",
            _pm(row["len_incorrect_growth"], 1, sign="+"),
            _pm(row["zero_variance"]),
            _pm(row["useful_per_hour"], 0),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    before = [row["acc_before"][0] for row in summary.values()]
    sampled = (
        " pass@k: unbiased estimator over the samples of `ablation.pass_at_k` per held-out prompt "
        "at temperature 1, final checkpoint."
        if passk
        else ""
    )
    lines += [
        "",
        f"Mean ± standard error over {num_seeds} seed(s) (sample std / sqrt(seeds)). Held-out "
        f"greedy: accuracy after training, before RL {_fmt(float(np.mean(before)))}; gain: "
        f"after minus before.{sampled} Lengths (tokens, end token included): training rollouts "
        "of the first and the last quarter of the steps (± for the last); Δ len. incorrect: "
        "last minus first. Zero-var. groups: mean fraction of groups whose rewards are all "
        "equal. Useful / h: verified useful trajectories (samples of groups whose rewards "
        "differ, the ones that give a gradient) per hour of step time (step 1, the "
        "compilation, excluded).",
    ]
    return "\n".join(lines) + "\n"


# (a, b, what differs): pairs of variants whose difference isolates one claim of the objective-
# bias analysis (Liu et al. 2025, "Understanding R1-Zero-Like Training").
CONTRASTS = (
    ("grpo", "dr_grpo", "both of Dr. GRPO's changes"),
    ("grpo", "grpo_no_std", "the std division"),
    ("curriculum", "no_std_curriculum", "the std division, with the curriculum"),
    ("grpo", "token_mean", "per-sequence vs token-mean aggregation, with std"),
    ("grpo_no_std", "dr_grpo", "per-sequence vs constant normaliser, without std"),
)
CONTRAST_KEYS = (
    ("acc_after", "held-out greedy", 3),
    ("len_incorrect", "len. incorrect", 1),
    ("len_incorrect_growth", "Δ len. incorrect", 1),
    ("len_gap", "incorrect − correct len.", 1),
    ("zero_variance", "zero-var. groups", 3),
)


def contrast_table(summary: Mapping[str, Mapping[str, Any]]) -> str:
    """The `CONTRASTS` whose two variants both ran: a − b of each `CONTRAST_KEYS` number, ± the
    standard error of the difference (sqrt(se_a² + se_b²), the runs being independent)."""
    pairs = [(a, b, what) for a, b, what in CONTRASTS if a in summary and b in summary]
    if not pairs:
        return ""
    lines = [
        "| a − b | what differs | " + " | ".join(label for _, label, _ in CONTRAST_KEYS) + " |",
        "|---" * (2 + len(CONTRAST_KEYS)) + "|",
    ]
    for a, b, what in pairs:
        cells = []
        for key, _, digits in CONTRAST_KEYS:
            (ma, _, sa), (mb, _, sb) = summary[a][key], summary[b][key]
            cells.append(_pm((ma - mb, math.nan, math.hypot(sa, sb)), digits, sign="+"))
        lines.append(f"| {a} − {b} | {what} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Difference of the variants' means ± its standard error.",
    ]
    return "\n".join(lines) + "\n"


def grad_norm_by_success(seed_runs: Sequence[Sequence[Mapping[str, Any]]], G: int) -> np.ndarray:
    """Mean per-group gradient norm for each number of successes 0..G (NaN where none), over
    the step rows of every seed's records."""
    sums, counts = np.zeros(G + 1), np.zeros(G + 1)
    for records in seed_runs:
        for r in metrics.step_rows(records):
            norms, rates = r.get("groups/grad_norm"), r.get("groups/success_rate")
            if norms is None or rates is None:
                continue
            k = np.rint(np.asarray(rates) * G).astype(int)
            np.add.at(sums, k, np.asarray(norms, np.float64))
            np.add.at(counts, k, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / counts, np.nan)


# (std-scaled, unscaled) pairs that differ only in the std division; their ratio of per-prompt
# gradient norms is the re-weighting, to set against 1 / sqrt(p (1 - p)).
STD_PAIRS = (("grpo", "grpo_no_std"), ("curriculum", "no_std_curriculum"))
