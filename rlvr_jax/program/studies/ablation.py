"""The objective-bias study: every variant, several seeds, one table and plots.

The config is a training config (`settings_lib.default_config()`) plus an `ablation` section:
  variants: comma-separated names of `VARIANTS`.
  seeds: comma-separated `train.seed` values; every variant runs once per seed.
  kimi_length_weight: `reward.length_weight` of the "kimi_length" variant.
  warm_start: {steps, batch_size, learning_rate, seed}: when steps > 0, one supervised run on the
    task's demonstrations (the "sft" stage) before any RL, shared by every variant and seed.

Each variant is a few dotted overrides of the same base (`BASE` then `VARIANTS[name]`), so the
prompts (`data.*`, including `data.seed`), the rollout budget (steps x prompts x group size,
`max_new_tokens`) and the starting weights are the same everywhere; a seed changes the rollout
sampling. Expert iteration samples the same budget and trains only on its verified samples.

Outputs under the workdir: `runs/<variant>/seed_<s>/` (each an ordinary stage workdir, with a
`result.json` once finished: a rerun skips finished runs), `ablation.md` (the table),
`summary.json` (every number in the table, per seed too) and `plots/*.png`.

Host code: orchestration and arithmetic on the metrics ledgers (read with
`metrics.read_metrics`, the same rows the report plots); the math is the stages'. The command
line is `rlvr_jax.ablate`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np

from rlvr_jax.config_types import ConfigError
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.evals import plots
from rlvr_jax.program.runtime import metrics, useful
from rlvr_jax.program.stages import dispatch

# Every variant starts from these values, so that a base config's own choices of stage,
# estimator, aggregation, length reward or sampler cannot leak into the comparison.
BASE: dict[str, Any] = {
    "train.stage": "rl",
    "rl.advantage.estimator": "grpo",
    "rl.advantage.std_scaling": "group",
    "rl.loss.aggregation": "seq_mean_token_mean",
    "rl.loss.policy_loss": "ppo_clip",
    "rl.critic.kind": "none",
    "reward.length_weight": 0.0,
    "data.sampler": "epoch",
    "curriculum.ordered": False,
}
KIMI = "kimi_length"  # its length weight comes from the ablation section

# name -> (what it changes relative to vanilla GRPO, overrides on top of BASE).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo": ("vanilla: group std scaling, seq_mean_token_mean", {}),
    "dr_grpo": (
        "Dr. GRPO: no std, constant normaliser (dr_grpo_constant)",
        {
            "rl.advantage.estimator": "dr_grpo",
            "rl.advantage.std_scaling": "none",
            "rl.loss.aggregation": "dr_grpo_constant",
        },
    ),
    "rloo": (
        "RLOO: leave-one-out baseline, no std",
        {"rl.advantage.estimator": "rloo", "rl.advantage.std_scaling": "none"},
    ),
    "grpo_no_std": ("GRPO without std scaling", {"rl.advantage.std_scaling": "none"}),
    "token_mean": ("GRPO, token_mean aggregation", {"rl.loss.aggregation": "token_mean"}),
    KIMI: ("GRPO + Kimi k1.5 length reward", {}),
    "curriculum": ("GRPO + success-rate curriculum", {"data.sampler": "curriculum"}),
    "no_std_curriculum": (
        "GRPO without std + success-rate curriculum",
        {"rl.advantage.std_scaling": "none", "data.sampler": "curriculum"},
    ),
    "difficulty_curriculum": (
        "GRPO + easy-to-hard curriculum over the difficulty levels",
        {"data.sampler": "curriculum", "curriculum.ordered": True},
    ),
    "per_task_curriculum": (
        "GRPO + easy-to-hard curriculum, each task of a mix on its own levels",
        {"data.sampler": "curriculum", "curriculum.ordered": True, "curriculum.per_source": True},
    ),
    "expert_iteration": (
        "expert iteration: SFT on verified samples (same sampling budget)",
        {
            "rl.advantage.estimator": "expert_iteration",
            "rl.advantage.std_scaling": "none",
            "rl.loss.policy_loss": "reinforce",
            "rl.loss.aggregation": "token_mean",
        },
    ),
    "kimi": (
        "Kimi k1.5's objective: mean baseline, squared log-ratio to the old policy (tau 0.1), "
        "two updates a rollout",
        {
            "rl.loss.policy_loss": "kimi",
            "rl.advantage.estimator": "dr_grpo",
            "rl.advantage.std_scaling": "none",
            "rl.loss.aggregation": "seq_mean_token_sum",
            "rl.mu": 2,
        },
    ),
    "ppo": (
        "PPO: a separate critic, GAE (gamma 1, lambda 0.95), token_mean",
        {
            "rl.advantage.estimator": "gae",
            "rl.advantage.std_scaling": "batch",
            "rl.critic.kind": "model",
            "rl.critic.learning_rate": 1e-3,
            "rl.loss.aggregation": "token_mean",
        },
    ),
}


@dataclasses.dataclass(frozen=True)
class AblationSettings:
    """The `ablation` section, parsed.

    Attributes:
      variants: names of `VARIANTS`, in table order.
      seeds: `train.seed` values.
      kimi_length_weight: the length reward weight of the "kimi_length" variant.
      warm_start_steps: supervised steps before RL (0: start from `model.source`).
      warm_start_batch_size, warm_start_learning_rate, warm_start_seed: of that run.
    """

    variants: tuple[str, ...]
    seeds: tuple[int, ...]
    kimi_length_weight: float = 0.5
    warm_start_steps: int = 0
    warm_start_batch_size: int = 32
    warm_start_learning_rate: float = 1e-3
    warm_start_seed: int = 0

    def __post_init__(self):
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown:
            raise ConfigError(
                f"ablation.variants: unknown variant {unknown[0]!r}; known: {sorted(VARIANTS)}"
            )
        if not self.variants or len(set(self.variants)) != len(self.variants):
            raise ConfigError(f"ablation.variants={self.variants}: give distinct names")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"ablation.seeds={self.seeds}: give distinct seeds")
        if self.warm_start_steps < 0:
            raise ConfigError(f"ablation.warm_start.steps={self.warm_start_steps} must be >= 0")


def _names(value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, Sequence):
        return tuple(str(v) for v in value)
    raise ConfigError(f"ablation.{what}={value!r}: expected a comma-separated string")


def split_config(config: Any) -> tuple[AblationSettings, ml_collections.ConfigDict]:
    """The ablation settings and the base training config (the config without `ablation`)."""
    base = ml_collections.ConfigDict(config.to_dict() if hasattr(config, "to_dict") else config)
    if "ablation" not in base:
        raise ConfigError("the config has no 'ablation' section (see configs/ablation.py)")
    section = base.ablation.to_dict()
    del base["ablation"]
    known = {"variants", "seeds", "kimi_length_weight", "warm_start"}
    unknown = sorted(set(section) - known)
    if unknown:
        raise ConfigError(f"unknown setting ablation.{unknown[0]}; known: {sorted(known)}")
    warm = dict(section.get("warm_start") or {})
    unknown = sorted(set(warm) - {"steps", "batch_size", "learning_rate", "seed"})
    if unknown:
        raise ConfigError(f"unknown setting ablation.warm_start.{unknown[0]}")
    try:
        seeds = tuple(int(s) for s in _names(section.get("seeds", "0"), "seeds"))
    except ValueError as e:
        raise ConfigError(f"ablation.seeds={section.get('seeds')!r}: {e}") from e
    settings = AblationSettings(
        variants=_names(section.get("variants", ",".join(VARIANTS)), "variants"),
        seeds=seeds,
        kimi_length_weight=float(section.get("kimi_length_weight", 0.5)),
        warm_start_steps=int(warm.get("steps", 0)),
        warm_start_batch_size=int(warm.get("batch_size", 32)),
        warm_start_learning_rate=float(warm.get("learning_rate", 1e-3)),
        warm_start_seed=int(warm.get("seed", 0)),
    )
    return settings, base


def override(config: ml_collections.ConfigDict, dotted: str, value: Any) -> None:
    """Sets the existing field `dotted` ("rl.loss.aggregation") of `config`; a misspelt section
    or field is a ConfigError rather than a new, silently ignored field."""
    *parents, leaf = dotted.split(".")
    node = config
    for p in parents:
        if p not in node:
            raise ConfigError(f"override {dotted!r}: the config has no section {p!r}")
        node = node[p]
    if leaf not in node:
        raise ConfigError(f"override {dotted!r}: the config has no field {leaf!r}")
    node[leaf] = value


def variant_config(
    base: ml_collections.ConfigDict, name: str, seed: int, ablation: AblationSettings
) -> ml_collections.ConfigDict:
    """The training config of one variant and seed: `BASE`, the variant's overrides, the seed."""
    if name not in VARIANTS:
        raise ConfigError(f"unknown variant {name!r}; known: {sorted(VARIANTS)}")
    c = copy.deepcopy(base)
    overrides = {**BASE, **VARIANTS[name][1], "train.seed": seed}
    if name == KIMI:
        overrides["reward.length_weight"] = ablation.kimi_length_weight
    for dotted, value in overrides.items():
        override(c, dotted, value)
    return c


def warm_start(
    base: ml_collections.ConfigDict,
    ablation: AblationSettings,
    workdir: Path,
    log: Callable[[str], None],
) -> dict[str, Any] | None:
    """Supervised fine-tuning on the task's demonstrations, once; `None` when disabled.

    Returns:
      {"source": the exported Hugging Face directory, "eval_before", "eval_after"}; read back
      from `workdir/result.json` when the run already finished.
    """
    if not ablation.warm_start_steps:
        return None
    done = workdir / "result.json"
    if done.exists():
        return json.loads(done.read_text())
    c = copy.deepcopy(base)
    c.train.stage = "sft"
    c.train.steps = ablation.warm_start_steps
    c.train.seed = ablation.warm_start_seed
    c.train.checkpoint_every = 0
    c.sft.batch_size = ablation.warm_start_batch_size
    c.sft.export = True
    c.optim.learning_rate = ablation.warm_start_learning_rate
    out = dispatch.run(settings_lib.settings_from_config(c), workdir, log=log)
    result = {
        "source": str(out["export"]),
        "eval_before": out["eval_before"],
        "eval_after": out["eval_after"],
    }
    done.write_text(json.dumps(result, indent=1))
    return result


def run_one(
    config: ml_collections.ConfigDict, run_dir: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """Trains one variant and seed (or reads the finished run's `result.json`)."""
    done = run_dir / "result.json"
    if done.exists():
        return json.loads(done.read_text())
    settings = settings_lib.settings_from_config(config)
    start = time.time()
    out = dispatch.run(settings, run_dir, log=log)
    result = {
        "eval_before": out["eval_before"],
        "eval_after": out["eval_after"],
        "steps": out["steps"],
        "run_seconds": time.time() - start,
        "rows_per_step": settings.train.batch_prompts * settings.rl.group_size,
        "group_size": settings.rl.group_size,
    }
    done.write_text(json.dumps(result, indent=1))
    return result


# ---------------------------------------------------------------------------------------------
# Statistics of the runs


def run_stats(records: Sequence[Mapping[str, Any]], result: Mapping[str, Any]) -> dict[str, Any]:
    """The table's numbers for one run, from its ledger records and result.

    - lengths: means over the rollouts of the last quarter of the steps, weighted by how many
      responses were correct (resp. incorrect) at each step.
    - zero_variance: the mean over steps of the fraction of groups whose rewards are all equal.
    - successes_per_minute: verified-correct samples per minute of step time, from step 2 on
      (step 1 carries the compilation).
    - useful_per_hour: verified useful trajectories (rows of groups whose rewards differ) per
      hour of step time, from step 2 on (`useful.run_per_hour`); NaN for a ledger without them.

    Args:
      records: the run's `metrics.read_metrics` records (only the step rows are used).
      result: the run's `run_one` result (evaluations and rows per step).
    """
    n_rows = result["rows_per_step"]
    rows = metrics.step_rows(records)
    steps, acc = metrics.series(rows, "accuracy", drop_missing=True)
    if steps.size == 0:
        raise ValueError("the run logged no training steps")
    by_step = {r["step"]: r for r in rows}
    last = steps[steps > steps.max() * 3 / 4] if steps.size >= 4 else steps
    n_ok = np.asarray([by_step[s]["accuracy"] * n_rows for s in last])
    n_bad = n_rows - n_ok
    len_ok = np.asarray([by_step[s].get("length/correct") or 0.0 for s in last])
    len_bad = np.asarray([by_step[s].get("length/incorrect") or 0.0 for s in last])
    _, zero_var = metrics.series(rows, "adv/frac_zero_variance", drop_missing=True)
    t_steps, t = metrics.series(rows, metrics.STEP_TIME, drop_missing=True)
    timed = t_steps > 1 if t_steps.size > 1 else np.ones_like(t_steps, bool)
    ok_timed = np.asarray([by_step[s]["accuracy"] * n_rows for s in t_steps[timed]])
    seconds = float(np.sum(t[timed]))
    return {
        "acc_before": result["eval_before"]["eval/accuracy"],
        "acc_after": result["eval_after"]["eval/accuracy"],
        "eval_length_after": result["eval_after"]["eval/length"],
        "len_correct": float(np.sum(n_ok * len_ok) / np.sum(n_ok)) if np.sum(n_ok) else math.nan,
        "len_incorrect": (
            float(np.sum(n_bad * len_bad) / np.sum(n_bad)) if np.sum(n_bad) else math.nan
        ),
        "zero_variance": float(np.mean(zero_var)) if zero_var.size else math.nan,
        "successes": float(np.sum(acc) * n_rows),
        "successes_per_minute": float(60 * np.sum(ok_timed) / seconds) if seconds else math.nan,
        "step_seconds": seconds / max(int(np.sum(timed)), 1),
        "useful_per_hour": useful.run_per_hour(records),
    }


def _mean_std(xs: Sequence[float]) -> tuple[float, float]:
    a = np.asarray([x for x in xs if not math.isnan(x)], np.float64)
    if a.size == 0:
        return math.nan, math.nan
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else 0.0


def summarize(per_seed: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per variant: mean and sample std over seeds of every `run_stats` number, and the seeds'."""
    out = {}
    for name, stats in per_seed.items():
        row: dict[str, Any] = {"per_seed": list(stats)}
        for key in stats[0]:
            row[key] = _mean_std([s[key] for s in stats])
        row["gain"] = _mean_std([s["acc_after"] - s["acc_before"] for s in stats])
        out[name] = row
    return out


def _fmt(x: float, digits: int = 3) -> str:
    return "n/a" if math.isnan(x) else f"{x:.{digits}f}"


def markdown_table(summary: Mapping[str, Mapping[str, Any]], num_seeds: int) -> str:
    """The study's table: one row per variant, mean ± std over seeds."""
    lines = [
        "| variant | what changes | held-out acc. after | gain | len. correct | len. incorrect "
        "| zero-var. groups | useful / h |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in summary.items():
        (acc, acc_sd), (gain, gain_sd) = row["acc_after"], row["gain"]
        lines.append(
            f"| {name} | {VARIANTS[name][0]} | {_fmt(acc)} ± {_fmt(acc_sd)} "
            f"| {gain:+.3f} ± {_fmt(gain_sd)} | {_fmt(row['len_correct'][0], 2)} "
            f"| {_fmt(row['len_incorrect'][0], 2)} | {_fmt(row['zero_variance'][0])} "
            f"| {_fmt(row['useful_per_hour'][0], 0)} |"
        )
    before = [row["acc_before"][0] for row in summary.values()]
    lines += [
        "",
        f"Mean ± sample std over {num_seeds} seed(s). Held-out accuracy: greedy, before RL "
        f"{_fmt(float(np.mean(before)))}. Lengths (tokens, end token included): training "
        "rollouts of the last quarter of the steps. Zero-var. groups: mean fraction of groups "
        "whose rewards are all equal. Useful / h: verified useful trajectories (samples of groups "
        "whose rewards differ, the ones that give a gradient) per hour of step time (step 1, "
        "the compilation, excluded).",
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


# ---------------------------------------------------------------------------------------------
# The study


def _train_all(
    base: ml_collections.ConfigDict,
    ablation: AblationSettings,
    workdir: Path,
    log: Callable[[str], None],
) -> tuple[dict[str, list[list[dict]]], dict[str, list[dict]]]:
    """Runs (or reads) every variant and seed: ({variant: records per seed}, {variant: stats
    per seed})."""
    runs: dict[str, list[list[dict]]] = {}
    stats: dict[str, list[dict]] = {}
    for name in ablation.variants:
        runs[name], stats[name] = [], []
        for seed in ablation.seeds:
            run_dir = workdir / "runs" / name / f"seed_{seed}"
            t0 = time.time()
            config = variant_config(base, name, seed, ablation)
            result = run_one(config, run_dir, log=lambda _: None)
            records = metrics.read_metrics(run_dir)
            runs[name].append(records)
            stats[name].append(run_stats(records, result))
            log(
                f"{name} seed {seed}: held-out accuracy {stats[name][-1]['acc_before']:.3f} -> "
                f"{stats[name][-1]['acc_after']:.3f} ({time.time() - t0:.0f} s)"
            )
    return runs, stats


def run_ablation(
    config: Any, workdir: str | Path, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Runs (or resumes) every variant and seed, then writes the table, summary and plots.

    Args:
      config: a training config with an `ablation` section (see `configs/ablation.py`).
      workdir: a local directory for the runs, the table, the summary and the plots.
      log: receives progress lines and, at the end, the table.

    Returns:
      {"summary": per-variant statistics, "table": the Markdown, "plots": PNG paths,
      "warm_start": the warm start's result or None, "seconds": this call's wall time}.
    """
    start = time.time()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ablation, base = split_config(config)
    for name in ablation.variants:  # fail on a bad override before anything trains
        variant = variant_config(base, name, ablation.seeds[0], ablation)
        if not settings_lib.settings_from_config(variant, check_devices=False).eval.in_stage:
            raise ConfigError(
                f"ablation variant {name!r}: eval.in_stage=False, but the ablation compares each "
                "run's own held-out accuracy before and after training; leave it on"
            )
    warm = warm_start(base, ablation, workdir / "warm_start", log)
    if warm is not None:
        base.model.source = warm["source"]
        accuracy = [(warm[k] or {}).get("eval/accuracy") for k in ("eval_before", "eval_after")]
        log(f"warm start: {warm['source']}, held-out accuracy {accuracy[0]} -> {accuracy[1]}")
    runs, stats = _train_all(base, ablation, workdir, log)
    summary = summarize(stats)
    table = markdown_table(summary, len(ablation.seeds))
    (workdir / "ablation.md").write_text(table)
    G = int(base.rl.group_size)
    grad = {name: grad_norm_by_success(r, G) for name, r in runs.items()}
    plots_dir = workdir / "plots"
    plots_dir.mkdir(exist_ok=True)
    paths = plots.plot_curves(runs, plots_dir)
    for extra in (
        plots.plot_grad_norms(grad, G, STD_PAIRS, plots_dir),
        plots.plot_histograms(runs, G, plots_dir),
    ):
        if extra is not None:
            paths.append(extra)
    (workdir / "summary.json").write_text(
        json.dumps(
            {
                "variants": summary,
                "per_seed": stats,
                "grad_norm_by_successes": {name: g.tolist() for name, g in grad.items()},
                "warm_start": warm,
            },
            indent=1,
            default=float,
        )
    )
    log(table)
    return {
        "summary": summary,
        "table": table,
        "plots": paths,
        "warm_start": warm,
        "seconds": time.time() - start,
    }
