"""The evaluation suite a pipeline runs after every stage, its table and its plot.

Every stage's weights are evaluated with the same settings (the pipeline's base config: its data,
prompt template, verifier, generation length), so the rows of the table differ only by the
weights: what a stage gained or lost is the difference between its row and the one above it.

The suite: greedy accuracy on the held-out prompts, overall and per data source; pass@k and
mean@n from n samples per prompt (`evaluation.evaluate`, the `rlvr_jax.eval` command's numbers);
the mean greedy response length and the truncation rate; and, from the same greedy responses, the
format rate (the task's "format" part, where the task has one) and the language-consistency rate
(`rewards.format.language_consistency` of each response against its prompt); for a multi-turn
task (tools), the tool-call rate and tool errors per episode instead. Where the pipeline
names prompt templates for thinking on and off (`pipeline.eval_modes`), greedy accuracy, length
and the rate of non-empty thinking blocks under each (`mode_rates`); where it names thinking
budgets, greedy accuracy and the early-end rate at each (`program.evals.thinking_budget`).

Host code: generation and verification are `evaluation`'s and the task's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlvr_jax.data import templates
from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.single_turn import build_task
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import Params
from rlvr_jax.program.evals import evaluation, plots, thinking_budget
from rlvr_jax.program.parts import build
from rlvr_jax.program.settings import Settings
from rlvr_jax.rewards import format as format_lib
from rlvr_jax.rewards.format import has_thought
from rlvr_jax.sampling.host import completions, generate_in_batches
from rlvr_jax.types import Rollout

ACCURACY = "greedy acc."
LENGTH = "length"
TRUNCATED = "truncated"
FORMAT = "format rate"
LANGUAGE = "language consistency"
TOOL_CALL_RATE = "tool-call rate"
TOOL_ERRORS = "tool errors"
# A table row's verified useful trajectories per hour of step time (an RL stage's), its column.
USEFUL_KEY = "useful_per_hour"
USEFUL_COLUMN = "useful / h"


def response_text(tokens: Sequence[int], tok: Tokenizer) -> str:
    """A completion's text without its end token (the token the sampler stopped on)."""
    ids = list(tokens)
    if ids and ids[-1] in tok.eos_ids:
        ids = ids[:-1]
    return tok.decode(ids)


def _greedy_scores(
    params: Params,
    model_cfg: ModelConfig,
    tok: Tokenizer,
    settings: Settings,
    examples: Sequence[Example],
) -> dict[str, np.ndarray]:
    """Per greedy response under the settings' template: the task's parts ("correct" and
    "format" where it has one), "language" (consistency with the prompt), "thought" (a
    non-empty thinking block) and "length" (tokens)."""
    s = settings
    template = templates.get_template(s.data.template)
    enc = templates.encode_prompts(examples, template, tok, s.data.buckets)
    greedy = dataclasses.replace(build.sampler_config(s, tok), method="greedy")
    with build_task(s.reward, tok, model_cfg.vocab_size, enc.examples, s.data.template) as task:

        def score(rollout: Rollout, prompt_ids: list[int]) -> dict[str, np.ndarray]:
            rows = [enc.examples[j] for j in prompt_ids]
            parts = task.score(rollout, rows)
            texts = [response_text(t, tok) for t in completions(rollout)]
            language = [
                format_lib.language_consistency(ex.prompt_text, text)
                for ex, text in zip(rows, texts, strict=True)
            ]
            out = {
                "correct": np.asarray(parts["correct"], np.float32),
                "language": np.asarray(language, np.float32),
                "thought": np.asarray([has_thought(t) for t in texts], np.float32),
                "length": np.asarray(rollout.lengths_N, np.float32),
            }
            if "format" in parts:
                out["format"] = np.asarray(parts["format"], np.float32)
            return out

        return generate_in_batches(
            params,
            enc.ids,
            score,
            model_cfg=model_cfg,
            cfg=greedy,
            batch_prompts=s.eval.batch_prompts,
            buckets=s.data.buckets,
            pad_id=tok.pad_id,
        )


def greedy_rates(
    params: Params,
    model_cfg: ModelConfig,
    tok: Tokenizer,
    settings: Settings,
    examples: Sequence[Example],
    scored: Mapping[str, np.ndarray] | None = None,
) -> dict[str, float]:
    """Format and language-consistency rates of the greedy responses (`scored`: those
    responses' `_greedy_scores`, when they were already generated).

    Returns:
      {FORMAT: mean of the task's "format" part (absent when the task has none), LANGUAGE: mean
      language consistency of each response against its prompt text}.
    """
    if scored is None:
        scored = _greedy_scores(params, model_cfg, tok, settings, examples)
    out = {FORMAT: float(np.mean(scored["format"]))} if "format" in scored else {}
    out[LANGUAGE] = float(np.mean(scored["language"]))
    return out


def mode_rates(
    params: Params,
    model_cfg: ModelConfig,
    tok: Tokenizer,
    settings: Settings,
    examples: Sequence[Example],
    modes: Sequence[tuple[str, str]],
    known: Mapping[str, Mapping[str, np.ndarray]] | None = None,
) -> dict[str, float]:
    """Greedy results under each (label, prompt template) of `modes`, e.g. thinking on and off
    ("qwen3_thinking" / "qwen3_non_thinking", or a plain template with "/think" or "/no_think"
    after the question). `known`: `_greedy_scores` already generated, by template; a mode with
    one of those templates is not generated again.

    Returns:
      {"<label> acc.": greedy accuracy, "<label> length": mean response tokens, "<label>
      thought rate": the share of responses with a non-empty thinking block} for each mode.
    """
    known = known or {}
    out = {}
    for label, template in modes:
        scored = known.get(template)
        if scored is None:
            data = dataclasses.replace(settings.data, template=template)
            s = dataclasses.replace(settings, data=data)
            scored = _greedy_scores(params, model_cfg, tok, s, examples)
        out[f"{label} acc."] = float(np.mean(scored["correct"] > 0.5))
        out[f"{label} length"] = float(np.mean(scored["length"]))
        out[f"{label} thought rate"] = float(np.mean(scored["thought"]))
    return out


def budget_rates(
    params: Params,
    model_cfg: ModelConfig,
    tok: Tokenizer,
    settings: Settings,
    examples: Sequence[Example],
    budgets: Sequence[int],
) -> dict[str, float]:
    """Greedy accuracy and early-end rate at each thinking budget (`thinking_budget`), under
    the settings' template: {"acc. budget <b>", "early end budget <b>"} for each budget."""
    s = thinking_budget.with_think_tokens(settings, tok)
    out = {}
    for p in thinking_budget.budget_curve(params, model_cfg, tok, s, examples, budgets):
        out[f"acc. budget {p.budget}"] = p.accuracy
        out[f"early end budget {p.budget}"] = p.early_end_rate
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
    episodes = result.get(evaluation.EPISODES)
    if episodes:
        row[TOOL_CALL_RATE] = episodes["tool_call_rate"]
        row[TOOL_ERRORS] = episodes["tool_errors"]
    row.update(rates)
    return row


def evaluate_source(
    source: str,
    settings: Settings,
    options: evaluation.EvalOptions,
    modes: Sequence[tuple[str, str]] = (),
    think_budgets: Sequence[int] = (),
    budget_mode: str = "",
    log: Callable[[str], None] = print,
) -> dict[str, float]:
    """The suite on the weights at `source` (any `model.source`), with `settings`' data, template,
    verifier and generation length: one table row (see `summarize`), with `mode_rates` for
    `modes` and `budget_rates` for `think_budgets` under the template of mode `budget_mode`
    (the settings' own for "")."""
    model = dataclasses.replace(settings.model, source=source)
    tok = build.build_tokenizer(model)
    s = build.with_tokenizer_ids(dataclasses.replace(settings, model=model), tok)
    params, model_cfg = build.load_policy(model, tok, s.train.seed)
    examples = build.load_examples(s.data)[1]
    result = evaluation.evaluate(params, model_cfg, tok, s, examples, options, log=log)
    if evaluation.EPISODES in result:
        # A multi-turn task: its episodes are the responses (the format and language rates of
        # single-turn responses would describe something else).
        row = summarize(result, {})
        known = {}
    else:
        scored = _greedy_scores(params, model_cfg, tok, s, examples)
        row = summarize(result, greedy_rates(params, model_cfg, tok, s, examples, scored))
        known = {s.data.template: scored}  # a mode under the base template reuses its responses
    row.update(mode_rates(params, model_cfg, tok, s, examples, modes, known))
    if think_budgets:
        template = dict(modes)[budget_mode] if budget_mode else s.data.template
        b = dataclasses.replace(s, data=dataclasses.replace(s.data, template=template))
        row.update(budget_rates(params, model_cfg, tok, b, examples, think_budgets))
    return row


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


def markdown_table(rows: Sequence[Mapping[str, Any]], headline: str = ACCURACY) -> str:
    """Stage x metric, one row per stage (stage 0 the starting model, then each stage, then any
    baseline branch), with the change in the `headline` metric over the row the stage started
    from (the last column, "Δ <headline>"). Where a stage trained with RL, a column after the
    steps gives each stage's verified useful trajectories per hour of step time (n/a for the
    others: the start, SFT).

    Args:
      rows: {"stage": label, "steps": int, "from": label of the row it started from or None,
        "eval": {metric: value}, optionally `USEFUL_KEY`: useful trajectories per hour} each.
      headline: the metric whose change is shown.
    """
    names = metric_names(rows)
    by_label = {r["stage"]: r for r in rows}
    useful = any(r.get(USEFUL_KEY) is not None for r in rows)
    head = ["stage", "steps", *([USEFUL_COLUMN] if useful else []), *names]
    head.append("Δ acc." if headline == ACCURACY else f"Δ {headline}")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        start = by_label.get(r["from"]) if r["from"] else None
        delta = "" if start is None else f"{r['eval'][headline] - start['eval'][headline]:+.3f}"
        cells = [r["stage"], _fmt(r["steps"])]
        if useful:
            rate = r.get(USEFUL_KEY)
            cells.append("n/a" if rate is None else f"{rate:.0f}")
        cells += [*(_fmt(r["eval"].get(n)) for n in names), delta]
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
