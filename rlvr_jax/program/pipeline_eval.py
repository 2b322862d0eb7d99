"""The evaluation suite a pipeline runs after every stage, its table and its plot.

Every stage's weights are evaluated with the same settings (the pipeline's base config: its data,
prompt template, verifier, generation length), so the rows of the table differ only by the
weights: what a stage gained or lost is the difference between its row and the one above it.

The suite: greedy accuracy on the held-out prompts, overall and per data source; pass@k and
mean@n from n samples per prompt (`evaluation.evaluate`, the `rlvr_jax.eval` command's numbers);
the mean greedy response length and the truncation rate; and, from the same greedy responses, the
format rate (the task's "format" part, where the task has one) and the language-consistency rate
(`rewards.format.language_consistency` of each response against its prompt).

Host code: generation and verification are `evaluation`'s and the task's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlvr_jax import sampling
from rlvr_jax.data import templates
from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.single_turn import build_task
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import Params
from rlvr_jax.program import build, evaluation, plots
from rlvr_jax.program.settings import Settings
from rlvr_jax.rewards import format as format_lib

ACCURACY = "greedy acc."
LENGTH = "length"
TRUNCATED = "truncated"
FORMAT = "format rate"
LANGUAGE = "language consistency"


def response_text(tokens: Sequence[int], tok: Tokenizer) -> str:
    """A completion's text without its end token (the token the sampler stopped on)."""
    ids = list(tokens)
    if ids and ids[-1] in tok.eos_ids:
        ids = ids[:-1]
    return tok.decode(ids)


def greedy_rates(
    params: Params,
    model_cfg: ModelConfig,
    tok: Tokenizer,
    settings: Settings,
    examples: Sequence[Example],
) -> dict[str, float]:
    """Format and language-consistency rates of the greedy responses.

    Returns:
      {FORMAT: mean of the task's "format" part (absent when the task has none), LANGUAGE: mean
      language consistency of each response against its prompt text}.
    """
    s = settings
    template = templates.get_template(s.data.template)
    enc = templates.encode_prompts(examples, template, tok, s.data.buckets)
    greedy = dataclasses.replace(build.sampler_config(s, tok), method="greedy")
    with build_task(s.reward, tok, model_cfg.vocab_size, enc.examples, s.data.template) as task:

        def score(rollout: sampling.Rollout, prompt_ids: list[int]) -> dict[str, np.ndarray]:
            rows = [enc.examples[j] for j in prompt_ids]
            parts = task.score(rollout, rows)
            texts = [response_text(t, tok) for t in sampling.completions(rollout)]
            language = [
                format_lib.language_consistency(ex.prompt_text, text)
                for ex, text in zip(rows, texts, strict=True)
            ]
            out = {"language": np.asarray(language, np.float32)}
            if "format" in parts:
                out["format"] = np.asarray(parts["format"], np.float32)
            return out

        scored = sampling.generate_in_batches(
            params,
            enc.ids,
            score,
            model_cfg=model_cfg,
            cfg=greedy,
            batch_prompts=s.eval.batch_prompts,
            buckets=s.data.buckets,
            pad_id=tok.pad_id,
        )
    out = {FORMAT: float(np.mean(scored["format"]))} if "format" in scored else {}
    out[LANGUAGE] = float(np.mean(scored["language"]))
    return out


def summarize(result: Mapping[str, Any], rates: Mapping[str, float]) -> dict[str, float]:
    """One flat row of the table from an `evaluation.evaluate` result and `greedy_rates`."""
    greedy = result[evaluation.GREEDY]
    everything = greedy[evaluation.ALL]
    row = {ACCURACY: everything["mean@1"]}
    sources = [k for k in greedy if k != evaluation.ALL]
    if len(sources) > 1:
        row.update({f"acc. {src}": greedy[src]["mean@1"] for src in sources})
    sampled = result.get(evaluation.SAMPLED)
    if sampled:
        row.update(
            {k: v for k, v in sampled[evaluation.ALL].items() if k.startswith(("pass@", "mean@"))}
        )
    row[LENGTH] = everything["length/mean"]
    row[TRUNCATED] = everything["length/truncated"]
    row.update(rates)
    return row


def evaluate_source(
    source: str,
    settings: Settings,
    options: evaluation.EvalOptions,
    log: Callable[[str], None] = print,
) -> dict[str, float]:
    """The suite on the weights at `source` (any `model.source`), with `settings`' data, template,
    verifier and generation length: one table row (see `summarize`)."""
    model = dataclasses.replace(settings.model, source=source)
    tok = build.build_tokenizer(model)
    s = build.with_tokenizer_ids(dataclasses.replace(settings, model=model), tok)
    params, model_cfg = build.load_policy(model, tok, s.train.seed)
    examples = build.load_examples(s.data)[1]
    result = evaluation.evaluate(params, model_cfg, tok, s, examples, options, log=log)
    return summarize(result, greedy_rates(params, model_cfg, tok, s, examples))


# ---------------------------------------------------------------------------------------------
# The table and the plot


def _fmt(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, int):
        return str(x)
    return f"{x:.3f}" if abs(x) < 100 else f"{x:.1f}"


def metric_names(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every metric of the rows' evaluations, in first-seen order."""
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row["eval"]))
    return list(names)


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Stage x metric, one row per stage (stage 0 the starting model, then each stage, then any
    baseline branch), with the change in greedy accuracy over the row the stage started from.

    Args:
      rows: {"stage": label, "steps": int, "from": label of the row it started from or None,
        "eval": {metric: value}} each.
    """
    names = metric_names(rows)
    by_label = {r["stage"]: r for r in rows}
    head = ["stage", "steps", *names, "Δ acc."]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        start = by_label.get(r["from"]) if r["from"] else None
        delta = "" if start is None else f"{r['eval'][ACCURACY] - start['eval'][ACCURACY]:+.3f}"
        cells = [r["stage"], _fmt(r["steps"]), *(_fmt(r["eval"].get(n)) for n in names), delta]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_stages(
    rows: Sequence[Mapping[str, Any]], baselines: Sequence[Mapping[str, Any]], out: Path
) -> Path:
    """One panel per metric: the pipeline's stages in order (stage 0 first) as a line, each
    baseline branch as a point at the last stage's position, where it would compete."""
    names = metric_names([*rows, *baselines])
    ncols = min(len(names), 3)
    nrows = math.ceil(len(names) / ncols)
    fig, axes = plots.new_figure(ncols, nrows, width=4.2, height=3.0)
    x = np.arange(len(rows))
    for i, name in enumerate(names):
        ax = axes[i // ncols, i % ncols]
        y = [r["eval"].get(name, math.nan) for r in rows]
        ax.plot(x, y, marker="o", label="pipeline")
        for b in baselines:
            ax.plot([x[-1]], [b["eval"].get(name, math.nan)], marker="s", ls="", label=b["stage"])
        ax.set_title(name)
        ax.set_xticks(x, [r["stage"] for r in rows], rotation=30, fontsize=7)
        ax.grid(alpha=0.3)
        if i == 0:
            ax.legend(fontsize=7)
    for j in range(len(names), nrows * ncols):
        axes[j // ncols, j % ncols].set_visible(False)
    return plots.save(fig, out)
