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
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax import sampling, train
from rlvr_jax.data import datasets, templates
from rlvr_jax.data.datasets import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import Params
from rlvr_jax.program import eval_metrics
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.rewards import arithmetic

GREEDY, SAMPLED = "greedy", "sampled"
ALL = "all"


@dataclasses.dataclass(frozen=True)
class EvalOptions:
    """How to evaluate.

    Attributes:
      num_samples: n samples per prompt for pass@k and mean@n; 0 evaluates greedily only.
      ks: the k of pass@k (those above n are dropped).
      temperature, top_p: sampling values of the n samples.
      max_new_tokens: generation length; 0 keeps the settings' `rl.sampler.max_new_tokens`.
      batch_prompts: prompts per generation call; 0 keeps `eval.batch_prompts`.
      seed: sampling seed.
    """

    num_samples: int = 0
    ks: tuple[int, ...] = (1,)
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 0
    batch_prompts: int = 0
    seed: int = 0

    def __post_init__(self):
        if self.num_samples < 0 or self.max_new_tokens < 0 or self.batch_prompts < 0:
            raise ValueError(
                f"num_samples={self.num_samples}, max_new_tokens={self.max_new_tokens} and "
                f"batch_prompts={self.batch_prompts} must be >= 0"
            )
        if any(k < 1 for k in self.ks):
            raise ValueError(f"ks={self.ks} must be positive")
        sampling.sampling_params(1, self.temperature, self.top_p)  # validates the values


def load_named(
    specs: Sequence[str], data: settings_lib.DataSettings, data_path: str, split: str, num: int
) -> list[Example]:
    """Examples of named datasets, each spec "name" (read under `data_path`) or "name:path".

    Args:
      specs: dataset specs, e.g. ["aime", "amc"] or ["examples:/tmp/mine.jsonl"].
      data: the settings' data section (seed, level and filters of generated tasks).
      data_path: the directory or file for specs without a path.
      split: the split to read.
      num: keep the first `num` of each (0 keeps all; generated tasks need it).
    """
    out: list[Example] = []
    for spec in specs:
        name, _, path = spec.partition(":")
        examples, report = datasets.load(
            name,
            path or data_path or None,
            split,
            num=num or None,
            seed=data.seed,
            level=data.level,
            exclude_multiple_choice=data.exclude_multiple_choice,
            exclude_true_false=data.exclude_true_false,
        )
        if report is not None and report.num_skipped:
            print(report.summary())
        out += examples
    return out


@jax.jit
def _arithmetic_correct(
    table: arithmetic.DigitTable, rollout: sampling.Rollout, answers: arithmetic.Answers
) -> jax.Array:
    # The table is an argument, not a constant, so one program serves every evaluation.
    return arithmetic.make_reward_fn(table)(rollout, answers)[1]["correct"]


def _correct_in_graph(task: Any, rollout: sampling.Rollout, targets: Any, G: int) -> jax.Array:
    """Per-row correctness from an in-graph verifier (no shaping)."""
    if isinstance(task, train.ArithmeticTask):
        return _arithmetic_correct(task.table, rollout, targets)
    no_shaping = settings_lib.RewardSettings(verifier="arithmetic", format="none")
    T = rollout.tokens_NT.shape[1]
    return jax.jit(task.reward_fn(no_shaping, G, T))(rollout, targets)[1]["correct"]


def generate_and_score(
    params: Params,
    model_cfg: ModelConfig,
    task: Any,
    ids: Sequence[Sequence[int]],
    examples: Sequence[Example],
    sampler_cfg: sampling.SamplerConfig,
    G: int,
    buckets: Sequence[int],
    pad_id: int,
    batch_prompts: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """G responses per prompt and their verdicts.

    Returns:
      (correct_BG bool, lengths_BG int, truncated_BG bool) host arrays over the B prompts.
    """
    T = sampler_cfg.max_new_tokens
    B = batch_prompts
    sp = sampling.sampling_params(B * G, temperature, top_p)
    sampler_cfg = dataclasses.replace(sampler_cfg, prompt_group=G)  # one prefill per prompt
    correct, lengths, truncated = [], [], []
    for i, start in enumerate(range(0, len(ids), B)):
        chunk = list(range(start, min(start + B, len(ids))))
        real = len(chunk)
        chunk += [chunk[-1]] * (B - real)  # fixed shapes: pad with repeats, drop below
        chosen = [examples[j] for j in chunk]
        prompt_NP, lengths_N = sampling.bucket_and_pad([ids[j] for j in chunk], buckets, pad_id, G)
        key = jax.random.fold_in(jax.random.key(seed), i)
        # `sampling.generate` is jitted once for the module: calls with the same shapes and
        # sampler settings (greedy, then the n samples; every evaluation) compile nothing.
        rollout, _ = sampling.generate(
            params,
            jnp.asarray(prompt_NP),
            jnp.asarray(lengths_N),
            key,
            sp,
            None,
            model_cfg=model_cfg,
            cfg=sampler_cfg,
        )
        if task.in_graph:
            c = _correct_in_graph(task, rollout, task.targets(chosen, G), G)
        else:
            rows = [ex for ex in chosen for _ in range(G)]
            c = task.host_rewards(rollout, rows, G, T)[1]["correct"]
        c, n, f = jax.device_get((c, rollout.lengths_N, rollout.finish_N))
        correct.append(np.asarray(c).reshape(B, G)[:real] > 0.5)
        lengths.append(np.asarray(n).reshape(B, G)[:real])
        truncated.append(np.asarray(f).reshape(B, G)[:real] == sampling.FINISH_LENGTH)
    return tuple(np.concatenate(x) for x in (correct, lengths, truncated))


def _table(
    sources: Sequence[str], correct_BG, lengths_BG, truncated_BG, ks: Sequence[int]
) -> dict[str, dict[str, float]]:
    out = {ALL: eval_metrics.group_metrics(correct_BG, lengths_BG, truncated_BG, ks=ks)}
    out.update(eval_metrics.per_source(sources, correct_BG, lengths_BG, truncated_BG, ks=ks))
    return out


def evaluate(
    params: Params,
    model_cfg: ModelConfig,
    tok: Tokenizer,
    settings: settings_lib.Settings,
    examples: Sequence[Example],
    options: EvalOptions = EvalOptions(),
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Greedy accuracy and, with `options.num_samples`, pass@k and mean@n, per source.

    Returns:
      {"num_prompts", "num_too_long", "greedy": {"all" | source: metrics}, and "sampled" (same
      layout) when sampling}. Metrics are `eval_metrics.group_metrics` names: "mean@1" is the
      greedy accuracy, "pass@k", "mean@n", "length/mean", "length/truncated", ...
    """
    s = settings
    sampler_cfg = s.rl.sampler
    if not sampler_cfg.eos_ids:
        sampler_cfg = dataclasses.replace(sampler_cfg, eos_ids=tok.eos_ids, pad_id=tok.pad_id)
    if options.max_new_tokens:
        sampler_cfg = dataclasses.replace(sampler_cfg, max_new_tokens=options.max_new_tokens)
    template = templates.get_template(s.data.template)
    enc = templates.encode_prompts(examples, template, tok, s.data.buckets)
    if enc.num_too_long:
        log(f"eval: {enc.summary()}")
    task = train.build_task(s.reward, tok, model_cfg, enc.examples, s.data.template)
    common = dict(
        buckets=s.data.buckets,
        pad_id=tok.pad_id,
        batch_prompts=options.batch_prompts or s.eval.batch_prompts,
    )
    sources = [ex.source for ex in enc.examples]
    out: dict[str, Any] = {"num_prompts": len(enc.ids), "num_too_long": enc.num_too_long}
    try:
        greedy = dataclasses.replace(sampler_cfg, method="greedy")
        scored = generate_and_score(
            params, model_cfg, task, enc.ids, enc.examples, greedy, 1, **common
        )
        out[GREEDY] = _table(sources, *scored, ks=(1,))
        n = options.num_samples
        if n:
            sample = dataclasses.replace(sampler_cfg, method="sample")
            scored = generate_and_score(
                params,
                model_cfg,
                task,
                enc.ids,
                enc.examples,
                sample,
                n,
                temperature=options.temperature,
                top_p=options.top_p,
                seed=options.seed,
                **common,
            )
            ks = sorted({k for k in options.ks if k <= n}) or [1]
            out[SAMPLED] = _table(sources, *scored, ks=ks)
    finally:
        if not task.in_graph:
            task.close()
    return out


def format_table(result: dict[str, Any]) -> str:
    """The console table: one row per source (and "all"), greedy and sampled columns."""
    greedy, sampled = result[GREEDY], result.get(SAMPLED)
    cols = [
        ("prompts", lambda g, _: f"{int(g['prompts'])}"),
        ("greedy", lambda g, _: f"{g['mean@1']:.3f}"),
    ]
    if sampled:
        any_row = sampled[ALL]
        for name in [k for k in any_row if k.startswith(("mean@", "pass@"))]:
            cols.append((name, lambda _, r, name=name: f"{r[name]:.3f}"))
        cols.append((f"len@{int(any_row['samples'])}", lambda _, r: f"{r['length/mean']:.1f}"))
        cols.append(("trunc", lambda _, r: f"{r['length/truncated']:.3f}"))
    else:
        cols.append(("len", lambda g, _: f"{g['length/mean']:.1f}"))
        cols.append(("trunc", lambda g, _: f"{g['length/truncated']:.3f}"))
    names = [ALL, *[k for k in greedy if k != ALL]]
    rows = [["source", *[c[0] for c in cols]]]
    for name in names:
        rows.append([name, *[fn(greedy[name], (sampled or {}).get(name)) for _, fn in cols]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            [r[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True))]
        )
        for r in rows
    )


def _json_safe(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_result(result: dict[str, Any], path: str | Path) -> Path:
    """Writes the result as strict JSON (non-finite values as null)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_json_safe(result), indent=1, allow_nan=False) + "\n")
    return path


def main(argv: list[str]) -> None:
    from absl import app, flags, logging

    from rlvr_jax import export

    del argv
    logging.set_verbosity(logging.WARNING)  # orbax logs every restore stage at INFO
    f = flags.FLAGS
    if bool(f.workdir) == (f.config is not None):
        raise app.UsageError("give exactly one of --workdir=W (a run) or --config=C")
    step = None
    if f.workdir:
        if f.source:
            raise app.UsageError("--source goes with --config; --workdir evaluates its checkpoint")
        params, model_cfg, tok, settings, step = export.restore_policy(
            f.workdir, None if f.step < 0 else f.step
        )
        workdir, model = Path(f.workdir), f"{f.workdir} step {step}"
    else:
        config = f.config
        if f.source:
            config.model.source = f.source
        settings = settings_lib.settings_from_config(config)
        tok = train.build_tokenizer(settings.model)
        params, model_cfg = export.load_policy(settings.model, tok, settings.train.seed)
        stem = Path(f["config"].config_filename.split(":")[0]).stem
        workdir, model = Path("runs") / stem, settings.model.source
    if f.datasets:
        specs = [x for x in f.datasets.split(",") if x]
        examples = load_named(specs, settings.data, f.data_path, f.split, f.num_prompts)
        label = "+".join(spec.partition(":")[0] for spec in specs) + f"-{f.split}"
    else:
        examples = train.load_examples(settings.data)[1]
        label = "heldout"
    options = EvalOptions(
        num_samples=f.n,
        ks=tuple(int(k) for k in f.k.split(",") if k),
        temperature=f.temperature,
        top_p=f.top_p,
        max_new_tokens=f.max_new_tokens,
        batch_prompts=f.batch_prompts,
        seed=f.seed,
    )
    start = time.time()
    result = evaluate(params, model_cfg, tok, settings, examples, options)
    result.update(
        model=model,
        checkpoint_step=step,
        data=label,
        options=dataclasses.asdict(options),
        wall_s=time.time() - start,
    )
    out = (
        Path(f.out) if f.out else workdir / "eval" / f"{label}{f'-step{step}' if step else ''}.json"
    )
    write_result(result, out)
    print(format_table(result))
    print(f"wrote {out}")


def _define_flags() -> None:
    from absl import flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "Experiment config file (with --source).")
    flags.DEFINE_string("workdir", None, "A run's workdir: evaluates its checkpoint.")
    flags.DEFINE_string("source", "", "With --config: the model source to evaluate.")
    flags.DEFINE_integer("step", -1, "With --workdir: the checkpoint step (default the latest).")
    flags.DEFINE_string(
        "datasets", "", "Comma-separated 'name' or 'name:path' (default: held-out)."
    )
    flags.DEFINE_string("data_path", "", "Directory or file for --datasets names without a path.")
    flags.DEFINE_string("split", "test", "Split of the --datasets.")
    flags.DEFINE_integer("num_prompts", 0, "Keep the first N prompts of each dataset (0: all).")
    flags.DEFINE_integer("n", 0, "Samples per prompt for pass@k and mean@n (0: greedy only).")
    flags.DEFINE_string("k", "1", "Comma-separated k of pass@k.")
    flags.DEFINE_float("temperature", 1.0, "Sampling temperature of the n samples.")
    flags.DEFINE_float("top_p", 1.0, "Top-p of the n samples.")
    flags.DEFINE_integer("max_new_tokens", 0, "Generation length (0: the settings').")
    flags.DEFINE_integer("batch_prompts", 0, "Prompts per generation call (0: the settings').")
    flags.DEFINE_integer("seed", 0, "Sampling seed.")
    flags.DEFINE_string("out", "", "The JSON file (default: <workdir>/eval/<data>.json).")


if __name__ == "__main__":
    from absl import app

    _define_flags()
    app.run(main)
