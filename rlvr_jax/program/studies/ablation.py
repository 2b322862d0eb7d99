"""The objective-bias study: every variant, several seeds, one table and plots.

The config is a training config (`settings_lib.default_config()`) plus an `ablation` section:
  variants: comma-separated names of `VARIANTS`.
  seeds: comma-separated `train.seed` values; every variant runs once per seed.
  kimi_length_weight: `reward.length_weight` of the "kimi_length" variant.
  warm_start: {steps, batch_size, learning_rate, seed}: when steps > 0, one supervised run on the
    task's demonstrations (the "sft" stage) before any RL, shared by every variant and seed.
  pass_at_k: {samples, ks}: when samples > 0, each finished run's final checkpoint is also
    evaluated with that many samples per held-out prompt (temperature 1): pass@k for each k of
    the comma-separated `ks`, and mean@n (`evaluation.evaluate`, as `rlvr_jax.eval` does).

Each variant is a few dotted overrides of the same base (`BASE` then `VARIANTS[name]`), so the
prompts (`data.*`, including `data.seed`), the rollout budget (steps x prompts x group size,
`max_new_tokens`) and the starting weights are the same everywhere; a seed changes the rollout
sampling. Expert iteration samples the same budget and trains only on its verified samples.

Outputs under the workdir: `runs/<variant>/seed_<s>/` (each an ordinary stage workdir, with a
`result.json` once finished: a rerun skips finished runs), `ablation.md` (the table),
`summary.json` (every number in the table, per seed too) and `plots/*.png`; with pass@k on,
each run's `pass_at_k.json` (computed once).

Host code: orchestration and arithmetic on the metrics ledgers (read with
`metrics.read_metrics`, the same rows the report plots); the math is the stages'. The command
line is `rlvr_jax.ablate`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ml_collections

from rlvr_jax.config_types import ConfigError
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.evals import evaluation, plots
from rlvr_jax.program.parts import build
from rlvr_jax.program.runtime import metrics
from rlvr_jax.program.stages import dispatch
from rlvr_jax.program.studies import ablation_stats as stats_lib

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
      pass_at_k_samples: samples per held-out prompt for pass@k after training (0: none).
      pass_at_k: the k of pass@k (those above the samples are dropped).
    """

    variants: tuple[str, ...]
    seeds: tuple[int, ...]
    kimi_length_weight: float = 0.5
    warm_start_steps: int = 0
    warm_start_batch_size: int = 32
    warm_start_learning_rate: float = 1e-3
    warm_start_seed: int = 0
    pass_at_k_samples: int = 0
    pass_at_k: tuple[int, ...] = (1,)

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
        if self.pass_at_k_samples < 0 or not self.pass_at_k or min(self.pass_at_k) < 1:
            raise ConfigError(
                f"ablation.pass_at_k: samples={self.pass_at_k_samples} must be >= 0 and "
                f"ks={self.pass_at_k} positive integers, e.g. samples=8, ks='1,8'"
            )


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
    known = {"variants", "seeds", "kimi_length_weight", "warm_start", "pass_at_k"}
    unknown = sorted(set(section) - known)
    if unknown:
        raise ConfigError(f"unknown setting ablation.{unknown[0]}; known: {sorted(known)}")
    warm = dict(section.get("warm_start") or {})
    unknown = sorted(set(warm) - {"steps", "batch_size", "learning_rate", "seed"})
    if unknown:
        raise ConfigError(f"unknown setting ablation.warm_start.{unknown[0]}")
    passk = dict(section.get("pass_at_k") or {})
    unknown = sorted(set(passk) - {"samples", "ks"})
    if unknown:
        raise ConfigError(f"unknown setting ablation.pass_at_k.{unknown[0]}; known: samples, ks")
    try:
        seeds = tuple(int(s) for s in _names(section.get("seeds", "0"), "seeds"))
    except ValueError as e:
        raise ConfigError(f"ablation.seeds={section.get('seeds')!r}: {e}") from e
    try:
        ks = tuple(int(k) for k in _names(passk.get("ks", "1"), "pass_at_k.ks"))
    except ValueError as e:
        raise ConfigError(f"ablation.pass_at_k.ks={passk.get('ks')!r}: {e}") from e
    settings = AblationSettings(
        variants=_names(section.get("variants", ",".join(VARIANTS)), "variants"),
        seeds=seeds,
        kimi_length_weight=float(section.get("kimi_length_weight", 0.5)),
        warm_start_steps=int(warm.get("steps", 0)),
        warm_start_batch_size=int(warm.get("batch_size", 32)),
        warm_start_learning_rate=float(warm.get("learning_rate", 1e-3)),
        warm_start_seed=int(warm.get("seed", 0)),
        pass_at_k_samples=int(passk.get("samples", 0)),
        pass_at_k=ks,
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


PASS_AT_K = "pass_at_k.json"


def heldout_pass_at_k(run_dir: Path, ablation: AblationSettings) -> dict[str, float] | None:
    """pass@k and mean@n of a finished run's final checkpoint on its held-out prompts, at
    temperature 1 (`evaluation.evaluate`); written to `run_dir/pass_at_k.json` and read back from
    it on a rerun. None when `ablation.pass_at_k_samples` is 0.

    Returns:
      {"pass@k" for each k <= samples, "mean@n", "greedy" (the greedy accuracy of the same
      checkpoint), "samples", "step" (the checkpoint's)}.
    """
    if not ablation.pass_at_k_samples:
        return None
    done = run_dir / PASS_AT_K
    if done.exists():
        return json.loads(done.read_text())
    params, model_cfg, tok, settings, step = build.restore_policy(run_dir)
    examples = build.load_examples(settings.data)[1]
    n = ablation.pass_at_k_samples
    options = evaluation.EvalOptions(num_samples=n, ks=ablation.pass_at_k)
    result = evaluation.evaluate(params, model_cfg, tok, settings, examples, options)
    sampled = result[evaluation.SAMPLED][evaluation.ALL]
    out = {k: float(v) for k, v in sampled.items() if k.startswith(("pass@", "mean@"))}
    out.update(
        greedy=float(result[evaluation.GREEDY][evaluation.ALL]["mean@1"]), samples=n, step=step
    )
    done.write_text(json.dumps(out, indent=1))
    return out


# ---------------------------------------------------------------------------------------------
# The study


def _train_all(
    base: ml_collections.ConfigDict,
    ablation: AblationSettings,
    workdir: Path,
    log: Callable[[str], None],
    finished_only: bool = False,
) -> tuple[dict[str, list[list[dict]]], dict[str, list[dict]], list[str]]:
    """Runs (or reads) every variant and seed: ({variant: records per seed}, {variant: stats
    per seed}, the "variant seed s" runs left out). With `finished_only`, runs without a
    `result.json` are left out rather than trained, and variants with none are dropped."""
    runs: dict[str, list[list[dict]]] = {}
    stats: dict[str, list[dict]] = {}
    missing = []
    for name in ablation.variants:
        runs[name], stats[name] = [], []
        for seed in ablation.seeds:
            run_dir = workdir / "runs" / name / f"seed_{seed}"
            if finished_only and not (run_dir / "result.json").exists():
                missing.append(f"{name} seed {seed}")
                continue
            t0 = time.time()
            config = variant_config(base, name, seed, ablation)
            result = run_one(config, run_dir, log=lambda _: None)
            records = metrics.read_metrics(run_dir)
            runs[name].append(records)
            passk = heldout_pass_at_k(run_dir, ablation)
            stats[name].append(stats_lib.run_stats(records, result, passk))
            log(
                f"{name} seed {seed}: held-out accuracy {stats[name][-1]['acc_before']:.3f} -> "
                f"{stats[name][-1]['acc_after']:.3f} ({time.time() - t0:.0f} s)"
            )
        if not runs[name]:
            del runs[name], stats[name]
    return runs, stats, missing


def run_ablation(
    config: Any,
    workdir: str | Path,
    log: Callable[[str], None] = print,
    finished_only: bool = False,
) -> dict[str, Any]:
    """Runs (or resumes) every variant and seed, then writes the table, summary and plots.

    Args:
      config: a training config with an `ablation` section (see `configs/ablation.py`).
      workdir: a local directory for the runs, the table, the summary and the plots.
      log: receives progress lines and, at the end, the table.
      finished_only: train nothing: the table and plots of the runs that finished (while the
        study still runs elsewhere, or after it stopped), the others named under the table.

    Returns:
      {"summary": per-variant statistics, "table": the Markdown, "plots": PNG paths,
      "warm_start": the warm start's result or None, "missing": the runs left out,
      "seconds": this call's wall time}.

    Raises:
      ConfigError: a bad variant; with `finished_only`, no finished run under `workdir`.
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
    warm_dir = workdir / "warm_start"
    warm = None
    if not finished_only or (warm_dir / "result.json").exists():
        warm = warm_start(base, ablation, warm_dir, log)
    if warm is not None:
        base.model.source = warm["source"]
        accuracy = [(warm[k] or {}).get("eval/accuracy") for k in ("eval_before", "eval_after")]
        log(f"warm start: {warm['source']}, held-out accuracy {accuracy[0]} -> {accuracy[1]}")
    runs, stats, missing = _train_all(base, ablation, workdir, log, finished_only)
    if not runs:
        raise ConfigError(f"{workdir}: no finished run of {ablation.variants} to report")
    summary = stats_lib.summarize(stats)
    table = stats_lib.markdown_table(summary, len(ablation.seeds))
    if missing:
        table += f"\nNot finished, left out ({len(missing)}): {', '.join(missing)}.\n"
    contrasts = stats_lib.contrast_table(summary)
    if contrasts:
        table += "\n" + contrasts
    (workdir / "ablation.md").write_text(table)
    G = int(base.rl.group_size)
    grad = {name: stats_lib.grad_norm_by_success(r, G) for name, r in runs.items()}
    plots_dir = workdir / "plots"
    plots_dir.mkdir(exist_ok=True)
    paths = plots.plot_curves(runs, plots_dir)
    for extra in (
        plots.plot_grad_norms(grad, G, stats_lib.STD_PAIRS, plots_dir),
        plots.plot_histograms(runs, G, plots_dir),
        plots.plot_lengths_by_variant(runs, plots_dir),
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
        "missing": missing,
        "seconds": time.time() - start,
    }
