"""Recipes as pipelines: ordered stages, each from the previous one's weights, evaluated after each.

The config is a training config (`settings.default_config()`, the base every stage starts from)
plus a `pipeline` section:
  stages: a list of {"name": str, "overrides": {dotted field: value}, "rejection_samples": int,
    "fusion": {"think_fraction": float, "switch": str, "seed": int}}, in order. Each stage's
    config is the base with its overrides (a misspelt field fails before anything trains), its
    `model.source` the previous stage's exported weights (the first stage keeps the base's).
    `rejection_samples` > 0 makes an SFT stage rejection-sampled: before it trains, that many
    answers per training prompt are sampled from its starting weights and the verified ones
    become its demonstrations (`program.studies.rejection`). `fusion` makes an SFT stage train on
    Qwen3-style thinking and non-thinking rows built from its training examples
    (`sft.traces`, `sft.fusion`): `think_fraction` of the examples with a thought become
    thinking rows (1.0: a long-CoT cold start), their answers written with `sft.response_format`.
    Both together are Qwen3's fusion stage: the thinking rows' thoughts and answers are the
    stage's starting model's own, `rejection_samples` answers per training prompt sampled in
    thinking mode (the row's "/think" flag or `enable_thinking`) and verified
    (`sft.traces.traces_from_samples`); a prompt with no verified thinking answer keeps only its
    non-thinking row.
  A stage with `train.stage="rm"` trains a reward model (`program.stages.rm_stage`) from the current
    policy's weights; it is not a policy stage: the next stage starts from the same weights as
    it did, and it has no row in the table (its pairwise accuracy goes to the log and to
    `pipeline.json`). A later stage reads it with `reward.rm_path="@<its name>"`.
  baseline: "" (none) or a stage's name: the equal-compute branch, that stage's config alone
    for as many steps as the whole pipeline took, from the starting model (attribution: did the
    sequence of stages beat spending the same steps on one of them?).
  eval_samples, eval_ks: the suite's n samples per prompt and the k of pass@k (0: greedy only).
  eval_temperature: the temperature of those samples.
  eval_modes: {label: prompt template}: greedy accuracy, length and the rate of non-empty
    thinking blocks under each template (thinking on and off: `pipeline_eval.mode_rates`).
  headline: the metric whose change over the row before is the table's last column and the
    log line of each stage (default "greedy acc."; e.g. "think acc." with `eval_modes`).
  eval_think_budgets: thinking budgets (comma-separated) at which greedy accuracy and the
    early-end rate are measured, under the template of `eval_budget_mode` (a key of
    `eval_modes`; "": the base template): `program.evals.thinking_budget`.

Every stage is an ordinary stage workdir, `<workdir>/<index>_<name>/` (checkpoints, ledger,
settings), which ends with `hf/` (its weights, the next stage's `model.source`) and
`stage.json` (its steps, its evaluation and, for an RL stage, its verified useful
trajectories per hour of step time). A rerun skips the stages with a `stage.json` and
resumes a partly trained one from its newest checkpoint (`dispatch.run`). The starting model's
evaluation is `<workdir>/0_start/stage.json`; the baseline runs in `<workdir>/baseline_<name>/`.
At the end: `<workdir>/pipeline.md` (the stage x metric table, `pipeline_eval`), `pipeline.json`
and `pipeline.png`.

Host code: orchestration of the stages; the command line is `rlvr_jax.pipeline`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import ml_collections

from rlvr_jax.config_types import ConfigError
from rlvr_jax.data import templates
from rlvr_jax.model import hf
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.evals.evaluation import EvalOptions
from rlvr_jax.program.parts import build
from rlvr_jax.program.runtime import metrics, useful
from rlvr_jax.program.stages import dispatch
from rlvr_jax.program.studies import pipeline_eval, rejection
from rlvr_jax.program.studies.ablation import override
from rlvr_jax.sft import fusion, traces

EXPORT = "hf"
DONE = "stage.json"
START = "0_start"


@dataclasses.dataclass(frozen=True)
class FusionData:
    """A stage's Qwen3-style SFT rows (`sft.fusion.fusion_demonstrations` on
    `sft.traces.traces_from_examples` of its training examples).

    Attributes:
      think_fraction: the share of examples with a thought that become thinking rows.
      switch: "flag" (/think and /no_think in the question) or "enable_thinking".
      seed: the draw of each row's mode.
    """

    think_fraction: float = 0.5
    switch: str = "flag"
    seed: int = 0

    def __post_init__(self):
        if not 0.0 <= self.think_fraction <= 1.0:
            raise ConfigError(f"fusion.think_fraction={self.think_fraction} must be in [0, 1]")
        if self.switch not in fusion.SWITCHES:
            raise ConfigError(f"fusion.switch={self.switch!r}; expected one of {fusion.SWITCHES}")


@dataclasses.dataclass(frozen=True)
class PipelineStage:
    """One stage of a pipeline.

    Attributes:
      name: its label and workdir suffix (letters, digits, "_" and "-").
      overrides: (dotted field, value) pairs applied to the base config.
      rejection_samples: answers sampled per training prompt for a rejection-sampled SFT stage
        (0: the stage's demonstrations are its config's).
      fusion: thinking-mode fusion data for an SFT stage (None: the stage's demonstrations are
        its config's).
    """

    name: str
    overrides: tuple[tuple[str, Any], ...] = ()
    rejection_samples: int = 0
    fusion: FusionData | None = None


@dataclasses.dataclass(frozen=True)
class PipelineSettings:
    """The `pipeline` section, parsed (see the module docstring)."""

    stages: tuple[PipelineStage, ...]
    baseline: str = ""
    eval_samples: int = 0
    eval_ks: tuple[int, ...] = (1,)
    eval_temperature: float = 1.0
    eval_modes: tuple[tuple[str, str], ...] = ()
    eval_think_budgets: tuple[int, ...] = ()
    eval_budget_mode: str = ""
    headline: str = pipeline_eval.ACCURACY

    def __post_init__(self):
        names = [s.name for s in self.stages]
        if not names:
            raise ConfigError("pipeline.stages is empty")
        if len(set(names)) != len(names):
            raise ConfigError(f"pipeline.stages: names {names} repeat")
        for n in names:
            if not n or not n.replace("_", "").replace("-", "").isalnum():
                raise ConfigError(f"pipeline.stages: name {n!r} is not a plain word")
        if self.baseline and self.baseline not in names:
            raise ConfigError(f"pipeline.baseline={self.baseline!r} names no stage of {names}")
        if any(s.rejection_samples < 0 for s in self.stages) or self.eval_samples < 0:
            raise ConfigError("pipeline: rejection_samples and eval_samples must be >= 0")
        if self.eval_budget_mode and self.eval_budget_mode not in dict(self.eval_modes):
            raise ConfigError(
                f"pipeline.eval_budget_mode={self.eval_budget_mode!r} names no key of "
                f"eval_modes {sorted(dict(self.eval_modes))}"
            )
        if any(b < 1 for b in self.eval_think_budgets):
            raise ConfigError(f"pipeline.eval_think_budgets={self.eval_think_budgets}: each >= 1")

    def eval_options(self, batch_prompts: int) -> EvalOptions:
        """The suite's options: n samples at `eval_temperature`, pass@k for each k."""
        return EvalOptions(
            num_samples=self.eval_samples,
            ks=self.eval_ks,
            temperature=self.eval_temperature,
            batch_prompts=batch_prompts,
        )


_STAGE_KEYS = {"name", "overrides", "rejection_samples", "fusion"}
_FUSION_KEYS = {f.name for f in dataclasses.fields(FusionData)}
_KEYS = {
    "stages",
    "baseline",
    "eval_samples",
    "eval_ks",
    "eval_temperature",
    "eval_modes",
    "eval_think_budgets",
    "eval_budget_mode",
    "headline",
}


def _plain(raw: Any) -> dict[str, Any]:
    return raw.to_dict() if hasattr(raw, "to_dict") else dict(raw)


def _ints(key: str, raw: Any) -> tuple[int, ...]:
    """`pipeline.<key>`: comma-separated ints ("1,4,8") or a sequence of them."""
    items = raw.split(",") if isinstance(raw, str) else raw
    try:
        return tuple(int(k) for k in items if str(k).strip())
    except (TypeError, ValueError):
        raise ConfigError(f"pipeline.{key}={raw!r} is not a list of integers") from None


def _stage(i: int, raw: Any) -> PipelineStage:
    raw = _plain(raw)
    unknown = sorted(set(raw) - _STAGE_KEYS)
    if unknown:
        raise ConfigError(f"pipeline.stages[{i}]: unknown key {unknown[0]!r}")
    overrides = _plain(raw.get("overrides") or {})
    fusion_data = None
    if raw.get("fusion") is not None:
        fields = _plain(raw["fusion"])
        unknown = sorted(set(fields) - _FUSION_KEYS)
        if unknown:
            raise ConfigError(f"pipeline.stages[{i}].fusion: unknown key {unknown[0]!r}")
        try:
            fusion_data = FusionData(**fields)
        except TypeError as e:  # a value of the wrong type, compared with a number
            raise ConfigError(f"pipeline.stages[{i}].fusion={fields}: {e}") from None
    return PipelineStage(
        name=str(raw.get("name", "")),
        overrides=tuple(overrides.items()),
        rejection_samples=int(raw.get("rejection_samples", 0)),
        fusion=fusion_data,
    )


def split_config(config: Any) -> tuple[PipelineSettings, ml_collections.ConfigDict]:
    """The pipeline settings and the base training config (the config without `pipeline`)."""
    base = ml_collections.ConfigDict(config.to_dict() if hasattr(config, "to_dict") else config)
    if "pipeline" not in base:
        raise ConfigError("the config has no 'pipeline' section (see configs/pipelines/)")
    section = base.pipeline
    del base["pipeline"]
    unknown = sorted(set(section.keys()) - _KEYS)
    if unknown:
        raise ConfigError(f"unknown setting pipeline.{unknown[0]}; known: {sorted(_KEYS)}")
    settings = PipelineSettings(
        stages=tuple(_stage(i, s) for i, s in enumerate(section.get("stages", ()))),
        baseline=str(section.get("baseline", "")),
        eval_samples=int(section.get("eval_samples", 0)),
        eval_ks=_ints("eval_ks", section.get("eval_ks", "1")),
        eval_temperature=float(section.get("eval_temperature", 1.0)),
        eval_modes=tuple(_plain(section.get("eval_modes") or {}).items()),
        eval_think_budgets=_ints("eval_think_budgets", section.get("eval_think_budgets", "")),
        eval_budget_mode=str(section.get("eval_budget_mode", "")),
        headline=str(section.get("headline", pipeline_eval.ACCURACY)),
    )
    return settings, base


def stage_config(
    base: ml_collections.ConfigDict, stage: PipelineStage, source: str
) -> ml_collections.ConfigDict:
    """The training config of one stage: the base, its overrides, then `source` as its weights
    (the stage exports them at the end: `sft.export` is set)."""
    c = copy.deepcopy(base)
    for dotted, value in stage.overrides:
        override(c, dotted, value)
    c.model.source = source
    c.sft.export = True
    return c


def stage_dir(workdir: Path, index: int, stage: PipelineStage) -> Path:
    """`<workdir>/<index>_<name>`, stages counted from 1 (0 is the starting model)."""
    return workdir / f"{index}_{stage.name}"


def export_policy(run_dir: Path) -> Path:
    """Writes `<run_dir>/hf` from the run's newest checkpoint (the SFT stage exports itself),
    replacing an older export."""
    out = run_dir / EXPORT
    params, cfg, tok, _, _ = build.restore_policy(run_dir)
    if jax.process_index() == 0:
        hf.save_hf(params, cfg, out, tokenizer=tok, overwrite=True)
    return out


def _read_done(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / DONE
    return json.loads(path.read_text()) if path.is_file() else None


def _write_done(run_dir: Path, record: Mapping[str, Any]) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / (DONE + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, default=float))
    tmp.replace(run_dir / DONE)
    return dict(record)


def read_samples(path: Path) -> dict[str, list[str]]:
    """Rejection-sampled responses by example id (`program.studies.rejection`'s rows,
    "<id>/rs<i>")."""
    samples: dict[str, list[str]] = {}
    for line in path.read_text().split("\n"):
        if line.strip():
            row = json.loads(line)
            samples.setdefault(row["id"].rpartition("/rs")[0], []).append(row["response"])
    return samples


def write_fusion_data(
    config: ml_collections.ConfigDict,
    spec: FusionData,
    out: Path,
    samples: Path | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """The fusion rows of a stage's training examples, written to `out` (once: a rerun reads the
    file it wrote). With `samples` (a rejection-sampling file), the thinking rows' thoughts and
    answers are the sampled ones; otherwise they come from the data (`sft.traces`)."""
    if out.is_file():
        return out
    settings = settings_lib.settings_from_config(config)
    train_ex = build.load_examples(settings.data)[0]
    answer_format = settings.sft.response_format
    if samples is None:
        stage_traces = traces.traces_from_examples(train_ex, answer_format)
    else:
        stage_traces = traces.traces_from_samples(train_ex, read_samples(samples), answer_format)
    rows = fusion.fusion_demonstrations(
        stage_traces,
        switch=spec.switch,
        think_fraction=spec.think_fraction,
        seed=spec.seed,
    )
    thinking = int(fusion.choose_modes(stage_traces, spec.think_fraction, spec.seed).sum())
    with_thought = sum(bool(t.thought) for t in stage_traces)
    origin = "the data" if samples is None else "verified samples"
    log(
        f"fusion data: {thinking} thinking and {len(rows) - thinking} non-thinking rows; "
        f"{with_thought} of {len(rows)} prompts have a thought from {origin}"
    )
    tmp = fusion.write_demonstrations(rows, out.with_suffix(".tmp"))
    return tmp.replace(out)


class StageStoppedError(RuntimeError):
    """A stage stopped before its last step (a termination signal): rerun to resume it."""


def run_one_stage(
    config: ml_collections.ConfigDict,
    stage: PipelineStage,
    run_dir: Path,
    label: str,
    evaluate: Callable[[str], dict[str, float]],
    log: Callable[[str], None],
    headline: str = pipeline_eval.ACCURACY,
) -> dict[str, Any]:
    """Trains one stage in `run_dir` (or reads its `stage.json`), exports it and evaluates it
    (the log line names greedy accuracy and the `headline` metric).

    Returns:
      {"stage": label, "steps", "source" (its exported weights), "started_from", "eval",
      "seconds", "useful_per_hour" (`stage_useful_per_hour`)}.

    Raises:
      StageStoppedError: the stage stopped early; its checkpoint is saved and a rerun resumes it.
    """
    done = _read_done(run_dir)
    if done is not None:
        log(f"{label}: done ({done['steps']} steps), skipped")
        return done
    start = time.time()
    run_dir.mkdir(parents=True, exist_ok=True)
    demos = None
    if stage.rejection_samples:
        demos = run_dir / "rejection.jsonl"
        if not demos.is_file():
            settings = settings_lib.settings_from_config(config)
            switch = None if stage.fusion is None else stage.fusion.switch
            rejection.sample_demonstrations(
                settings, stage.rejection_samples, demos, log=log, thinking_switch=switch
            )
        config.sft.path = str(demos)
    if stage.fusion is not None:
        out = write_fusion_data(config, stage.fusion, run_dir / "fusion.jsonl", demos, log)
        config.sft.path = str(out)
    settings = settings_lib.settings_from_config(config)
    out = dispatch.run(settings, run_dir, log=log)
    # An SFT stage exports its weights only once it reached its last step.
    if out["export"] is None if "export" in out else out["steps"] < settings.train.steps:
        raise StageStoppedError(f"{label} stopped at step {out['steps']}; rerun to resume it")
    source = out.get("export") or export_policy(run_dir)
    record = {
        "stage": label,
        "steps": int(out["steps"]),
        "source": str(source),
        "started_from": settings.model.source,
        "eval": evaluate(str(source)),
        "seconds": time.time() - start,
        pipeline_eval.USEFUL_KEY: stage_useful_per_hour(run_dir),
    }
    for name in dict.fromkeys((pipeline_eval.ACCURACY, headline)):
        log(f"{label}: {record['steps']} steps, {name} {record['eval'][name]:.3f}")
    return _write_done(run_dir, record)


def stage_useful_per_hour(run_dir: Path) -> float | None:
    """A stage's verified useful trajectories per hour of step time, from its ledger
    (`useful.run_per_hour`); None for a stage that logged none (SFT)."""
    rate = useful.run_per_hour(metrics.read_metrics(run_dir))
    return None if math.isnan(rate) else rate


REF = "@"


def resolve_stage_refs(
    config: ml_collections.ConfigDict, run_dirs: Mapping[str, Path]
) -> ml_collections.ConfigDict:
    """The config with `reward.rm_path="@<stage>"` replaced by that earlier stage's workdir."""
    ref = str(config.reward.rm_path)
    if ref.startswith(REF):
        name = ref.removeprefix(REF)
        if name not in run_dirs:
            raise ConfigError(
                f"reward.rm_path={ref!r} names no earlier stage; earlier: {sorted(run_dirs)}"
            )
        config.reward.rm_path = str(run_dirs[name])
    return config


def run_reward_model_stage(
    config: ml_collections.ConfigDict, run_dir: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """Trains a reward-model stage in `run_dir` (or reads its `stage.json`).

    Returns:
      {"stage", "steps", "started_from", "kind": "rm", "eval": its held-out pairwise accuracy,
      loss and margin after training, "seconds"}.

    Raises:
      StageStoppedError: it stopped before its last step; a rerun resumes it.
    """
    label = run_dir.name
    done = _read_done(run_dir)
    if done is not None:
        log(f"{label}: done ({done['steps']} steps), skipped")
        return done
    start = time.time()
    settings = settings_lib.settings_from_config(config)
    out = dispatch.run(settings, run_dir, log=log)
    if out["steps"] < settings.train.steps:
        raise StageStoppedError(f"{label} stopped at step {out['steps']}; rerun to resume it")
    after = out["eval_after"] or {}
    accuracy = after.get("eval/accuracy")
    log(f"{label}: reward model, {out['steps']} steps, held-out pairwise accuracy {accuracy}")
    record = {
        "stage": label,
        "steps": int(out["steps"]),
        "started_from": settings.model.source,
        "kind": "rm",
        "eval": dict(after),
        "seconds": time.time() - start,
    }
    return _write_done(run_dir, record)


def _check_stages(base: ml_collections.ConfigDict, ps: PipelineSettings) -> None:
    """Fails on a bad override or setting of any stage before anything trains."""
    kinds: dict[str, str] = {}
    for stage in ps.stages:
        s = settings_lib.settings_from_config(stage_config(base, stage, base.model.source))
        ref = s.reward.rm_path
        if ref.startswith(REF) and kinds.get(ref.removeprefix(REF)) != "rm":
            raise ConfigError(
                f"pipeline stage {stage.name!r}: reward.rm_path={ref!r} names no earlier "
                f"reward-model stage; earlier: {kinds}"
            )
        kinds[stage.name] = s.train.stage
        if s.train.stage == "rm" and stage.name == ps.baseline:
            raise ConfigError(f"pipeline.baseline={ps.baseline!r} is a reward-model stage")
        if stage.rejection_samples and s.train.stage != "sft":
            raise ConfigError(
                f"pipeline stage {stage.name!r}: rejection_samples needs train.stage='sft', "
                f"not {s.train.stage!r}"
            )
        if stage.fusion is not None and s.train.stage != "sft":
            raise ConfigError(
                f"pipeline stage {stage.name!r}: fusion data needs train.stage='sft', "
                f"not {s.train.stage!r}"
            )
        sampled = stage.fusion is not None and stage.rejection_samples
        thinking_on = sampled and stage.fusion.switch == "enable_thinking"
        if thinking_on and not templates.get_template(s.data.template).chat:
            raise ConfigError(
                f"pipeline stage {stage.name!r}: fusion samples with enable_thinking need a "
                f"chat template, not data.template={s.data.template!r}"
            )
    for label, template in ps.eval_modes:
        try:
            templates.get_template(template)
        except ValueError as e:
            raise ConfigError(f"pipeline.eval_modes.{label}: {e}") from None


def run_pipeline(
    config: Any, workdir: str | Path, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Runs (or resumes) every stage and the baseline branch, then writes the table and plot.

    Args:
      config: a training config with a `pipeline` section (see `configs/pipelines/`).
      workdir: a local directory for the stages, the table and the plot.
      log: receives progress lines and, at the end, the table.

    Returns:
      {"rows": the pipeline's rows (stage 0 first), "baselines": the baseline rows,
      "reward_models": the reward-model stages' records, "table":
      the Markdown, "plot": the PNG path, "seconds": this call's wall time}.

    Raises:
      StageStoppedError: a stage stopped early (a termination signal); a rerun resumes it.
    """
    start_time = time.time()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ps, base = split_config(config)
    _check_stages(base, ps)
    eval_settings = settings_lib.settings_from_config(base)
    options = ps.eval_options(eval_settings.eval.batch_prompts)

    def evaluate(source: str) -> dict[str, float]:
        return pipeline_eval.evaluate_source(
            source,
            eval_settings,
            options,
            modes=ps.eval_modes,
            think_budgets=ps.eval_think_budgets,
            budget_mode=ps.eval_budget_mode,
            log=lambda _: None,
        )

    first = str(base.model.source)
    start = _read_done(workdir / START)
    if start is None:
        record = {"stage": START, "steps": 0, "source": first, "started_from": None}
        start = _write_done(workdir / START, {**record, "eval": evaluate(first)})
    if ps.headline not in start["eval"]:
        raise ConfigError(
            f"pipeline.headline={ps.headline!r} is not a metric of the evaluation; "
            f"its metrics: {sorted(start['eval'])}"
        )
    rows, reward_models, source = [start], [], first
    run_dirs: dict[str, Path] = {}
    for i, stage in enumerate(ps.stages, start=1):
        run_dir = run_dirs[stage.name] = stage_dir(workdir, i, stage)
        config_i = resolve_stage_refs(stage_config(base, stage, source), run_dirs)
        if config_i.train.stage == "rm":
            reward_models.append(run_reward_model_stage(config_i, run_dir, log))
            continue
        rows.append(
            run_one_stage(config_i, stage, run_dir, run_dir.name, evaluate, log, ps.headline)
        )
        source = rows[-1]["source"]

    baselines = []
    if ps.baseline:
        stage = next(s for s in ps.stages if s.name == ps.baseline)
        total = sum(r["steps"] for r in rows)
        c = resolve_stage_refs(stage_config(base, stage, first), run_dirs)
        c.train.steps = total
        c.sft.epochs = 0  # the step count is the budget
        label = f"baseline_{stage.name}"
        baselines.append(
            run_one_stage(c, stage, workdir / label, label, evaluate, log, ps.headline)
        )

    table_rows = [
        {**r, "from": None if i == 0 else rows[i - 1]["stage"]} for i, r in enumerate(rows)
    ] + [{**b, "from": START} for b in baselines]
    table = pipeline_eval.markdown_table(table_rows, ps.headline)
    (workdir / "pipeline.md").write_text(table)
    (workdir / "pipeline.json").write_text(
        json.dumps(
            {"rows": rows, "baselines": baselines, "reward_models": reward_models},
            indent=1,
            default=float,
        )
    )
    plot = pipeline_eval.plot_stages(rows, baselines, workdir / "pipeline.png")
    log(table)
    return {
        "rows": rows,
        "baselines": baselines,
        "reward_models": reward_models,
        "table": table,
        "plot": plot,
        "seconds": time.time() - start_time,
    }
