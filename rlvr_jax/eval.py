"""Standalone evaluation: greedy accuracy, pass@k and mean@n from n samples, response lengths,
truncation, per data source.

Commands:
  python -m rlvr_jax.eval --workdir=runs/tiny [--n=8 --k=1,4,8]
  python -m rlvr_jax.eval --config=configs/qwen_small.py [--source=DIR] \\
      --datasets=aime,amc --data_path=../shared/data --n=16 --k=1,4,16

`--workdir` evaluates the latest (or `--step`) checkpoint of a run with the run's own settings
(`settings.json`); `--config` evaluates `model.source` (or `--source`) with a config's settings.
The prompts are the held-out examples of `data` (the ones the training loop evaluates on), or,
with `--datasets`, whole splits of named datasets (each "name" or "name:path"), reported per
source. The prompt template, verifier, generation length and prompt buckets are the settings'.

pass@k is the unbiased estimator of Chen et al. (2021) over n samples per prompt at
`--temperature` (`eval_metrics`); mean@n is the fraction of correct samples. The JSON goes to
`--out` or `<workdir>/eval/<data>[-step<N>].json`, and a table to the console.

Writing into a run's workdir (the default `--out`; with `--config`, `runs/<config name>`) takes the
workdir's lock (`program.runtime.workdir_lock`) for the whole evaluation: while a trainer runs there
the command refuses at once, naming its pid, with exit status 2. With `--out` outside the workdir it
only reads the checkpoints and takes no lock, so a running trainer's checkpoints can be evaluated.
An error in what was asked (a workdir that is not a run, a step it does not hold, a bad flag or
setting) is one line on stderr and exit status 2 (`program.runtime.user_errors`; `--verbose` adds
the traceback).

`--think_budgets=6,12,24` adds Qwen3's accuracy-against-thinking-budget curve
(`program.evals.thinking_budget`): greedy accuracy, the early-end rate (the share of thoughts the
budget ended), length and truncation at each budget, with the sampler's think tokens or, where
the settings set none, "<think>" and "</think>" as the tokenizer encodes them. `--template`
evaluates under another prompt template (e.g. "qwen3_non_thinking", or a "/no_think" flag).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from pathlib import Path

from absl import app, flags, logging
from ml_collections import config_flags

from rlvr_jax.data.hub_splits import HubSplitError
from rlvr_jax.program.evals import evaluation, thinking_budget
from rlvr_jax.program.parts import build
from rlvr_jax.program.runtime import compilation, config_file, user_errors, workdir_lock
from rlvr_jax.program.settings import SETTINGS_FILE, settings_from_config

config_file.guard(
    config_flags.DEFINE_config_file("config", None, "Experiment config file (with --source).")
)
flags.DEFINE_string("workdir", None, "A run's workdir: evaluates its checkpoint.")
flags.DEFINE_bool(
    "distributed",
    False,
    "Refused: the evaluation runs in one process; it reads a --distributed run's checkpoints.",
)
flags.DEFINE_string("source", "", "With --config: the model source to evaluate.")
flags.DEFINE_integer(
    "step",
    -1,
    "With --workdir: the checkpoint step; it must exist (default -1: the newest readable one, "
    "skipping unreadable newer ones with a warning).",
)
flags.DEFINE_string("datasets", "", "Comma-separated 'name' or 'name:path' (default: held-out).")
flags.DEFINE_string("data_path", "", "Directory or file for --datasets names without a path.")
flags.DEFINE_string(
    "split",
    "",
    "Split of the --datasets (default: 'test' from --data_path, each dataset's own on the hub: "
    "'train' for AIME 2024 and AMC, 'test' for MATH-500 and GSM8K).",
)
flags.DEFINE_integer("num_prompts", 0, "Keep the first N prompts of each dataset (0: all).")
flags.DEFINE_integer("n", 0, "Samples per prompt for pass@k and mean@n (0: greedy only).")
flags.DEFINE_string("k", "1", "Comma-separated k of pass@k.")
flags.DEFINE_float("temperature", 1.0, "Sampling temperature of the n samples.")
flags.DEFINE_float("top_p", 1.0, "Top-p of the n samples.")
flags.DEFINE_integer("max_new_tokens", 0, "Generation length (0: the settings').")
flags.DEFINE_integer("batch_prompts", 0, "Prompts per generation call (0: the settings').")
flags.DEFINE_integer("seed", 0, "Sampling seed.")
flags.DEFINE_string("template", "", "Prompt template instead of the settings' data.template.")
flags.DEFINE_string(
    "think_budgets", "", "Comma-separated thinking budgets for the accuracy-vs-budget curve."
)
flags.DEFINE_string("out", "", "The JSON file (default: <workdir>/eval/<data>.json).")
flags.DEFINE_string(
    "compile_cache",
    str(compilation.default_cache_dir()),
    compilation.CACHE_FLAG_HELP,
)
flags.DEFINE_bool(user_errors.VERBOSE_FLAG, False, user_errors.VERBOSE_HELP)


def main(argv: list[str]) -> None:
    del argv
    if flags.FLAGS.distributed:
        raise app.UsageError(
            "--distributed: rlvr_jax.eval runs in one process; run it on one host (worker 0 of "
            "a slice), where it reads the checkpoints of a run that trained over several"
        )
    logging.set_verbosity(logging.WARNING)  # orbax logs every restore stage at INFO
    f = flags.FLAGS
    compilation.enable_cache(f.compile_cache)
    try:
        budgets = [int(b) for b in f.think_budgets.split(",") if b.strip()]
    except ValueError:
        raise app.UsageError(
            f"--think_budgets={f.think_budgets!r} is not a list of integers"
        ) from None
    specs = [x for x in f.datasets.split(",") if x]
    try:  # before a model is loaded
        evaluation.check_named(specs, f.data_path, f.split)
    except HubSplitError as e:
        raise app.UsageError(f"--datasets={f.datasets} --split={f.split!r}: {e}") from None
    if bool(f.workdir) == (f.config is not None):
        raise app.UsageError("give exactly one of --workdir=W (a run) or --config=C")
    if f.workdir and f.source:
        raise app.UsageError("--source goes with --config; --workdir evaluates its checkpoint")
    run_dir = (
        Path(f.workdir)
        if f.workdir
        else Path("runs") / Path(f["config"].config_filename.split(":")[0]).stem
    )
    # A workdir without a run's settings holds no run to protect (restoring it fails, naming
    # it), and gets no lock file.
    writes_there = (not f.out or workdir_lock.inside(f.out, run_dir)) and (
        not f.workdir or (run_dir / SETTINGS_FILE).is_file()
    )
    with contextlib.ExitStack() as stack:
        if writes_there:
            try:
                stack.enter_context(workdir_lock.hold(run_dir, "evaluation"))
            except workdir_lock.WorkdirBusyError as e:
                print(
                    f"eval: {e} To evaluate a running run's checkpoints, pass --out=<a path "
                    "outside the workdir>.",
                    file=sys.stderr,
                )
                sys.exit(workdir_lock.BUSY_EXIT_STATUS)
        _evaluate(f, budgets, run_dir)


def _evaluate(f: flags.FlagValues, budgets: list[int], run_dir: Path) -> None:
    step = None
    if f.workdir:
        params, model_cfg, tok, settings, step = build.restore_policy(
            f.workdir, None if f.step < 0 else f.step
        )
        workdir, model = run_dir, f"{f.workdir} step {step}"
    else:
        config = f.config
        if f.source:
            config.model.source = f.source
        settings = settings_from_config(config)
        tok = build.build_tokenizer(settings.model)
        params, model_cfg = build.load_policy(settings.model, tok, settings.train.seed)
        workdir, model = run_dir, settings.model.source
    if f.template:
        settings = dataclasses.replace(
            settings, data=dataclasses.replace(settings.data, template=f.template)
        )
    if f.datasets:
        specs = [x for x in f.datasets.split(",") if x]
        examples = evaluation.load_named(specs, settings.data, f.data_path, f.split, f.num_prompts)
        label = "+".join(spec.partition(":")[0] for spec in specs) + (
            f"-{f.split}" if f.split else ""
        )
    else:
        examples = build.load_examples(settings.data)[1]
        label = "heldout"
    options = evaluation.EvalOptions(
        num_samples=f.n,
        ks=tuple(int(k) for k in f.k.split(",") if k),
        temperature=f.temperature,
        top_p=f.top_p,
        max_new_tokens=f.max_new_tokens,
        batch_prompts=f.batch_prompts,
        seed=f.seed,
    )
    start = time.time()
    result = evaluation.evaluate(params, model_cfg, tok, settings, examples, options)
    result.update(
        model=model,
        checkpoint_step=step,
        data=label,
        template=settings.data.template,
        options=dataclasses.asdict(options),
        wall_s=time.time() - start,
    )
    out = (
        Path(f.out) if f.out else workdir / "eval" / f"{label}{f'-step{step}' if step else ''}.json"
    )
    curve = ""
    if budgets:
        s = thinking_budget.with_think_tokens(build.with_tokenizer_ids(settings, tok), tok)
        if f.max_new_tokens:
            sampler = dataclasses.replace(s.rl.sampler, max_new_tokens=f.max_new_tokens)
            s = dataclasses.replace(s, rl=dataclasses.replace(s.rl, sampler=sampler))
        if f.batch_prompts:
            s = dataclasses.replace(
                s, eval=dataclasses.replace(s.eval, batch_prompts=f.batch_prompts)
            )
        points = thinking_budget.budget_curve(params, model_cfg, tok, s, examples, budgets)
        result["think_budget"] = [dataclasses.asdict(p) for p in points]
        curve = thinking_budget.markdown_table(points)
    evaluation.write_result(result, out)
    print(evaluation.format_table(result))
    if curve:
        print(curve, end="")
    print(f"wrote {out}")


if __name__ == "__main__":
    user_errors.run("eval", main)
