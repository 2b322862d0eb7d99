"""Evaluation: greedy held-out accuracy during training, and pass@k / mean@n per data source.

`heldout_evaluator` is what the stages call before, during and after training: greedy accuracy,
response length and truncation on the held-out prompts. `evaluate` is the `rlvr_jax.eval`
command's: greedy accuracy and, with n samples per prompt, pass@k (the unbiased estimator of Chen
et al. 2021, `eval_metrics`) and mean@n, per data source. Both generate through
`generate_and_score` and verify through the task interface, in-graph or pool alike; a
multi-turn task (`MultiTurnTask`: tools) is evaluated on its episodes (`rl.multiturn`), the
tools running as they do in training.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from rlvr_jax.data import datasets, hub_splits, templates
from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.single_turn import build_task
from rlvr_jax.envs.task import MultiTurnTask, Task
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import Params
from rlvr_jax.program.evals import eval_metrics
from rlvr_jax.program.parts.build import sampler_config
from rlvr_jax.program.settings import DataSettings, Settings
from rlvr_jax.rl import multiturn
from rlvr_jax.sampling.config import SamplerConfig, check_sampling_values, sampling_params
from rlvr_jax.sampling.host import generate_in_batches
from rlvr_jax.types import FINISH_LENGTH, Rollout

GREEDY, SAMPLED, EPISODES = "greedy", "sampled", "episodes"
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
        check_sampling_values(1, self.temperature, self.top_p)


def check_named(specs: Sequence[str], data_path: str, split: str) -> None:
    """Raises `datasets.HubSplitError` when a spec read from the hub (no path of its own and no
    `data_path`) asks for a split its dataset lacks: before a model is loaded to evaluate it."""
    for spec in specs:
        name, path = datasets.parse_spec(spec)
        if not (path or data_path) and name in datasets.SOURCES:
            hub_splits.check_source(name, split)


def load_named(
    specs: Sequence[str], data: DataSettings, data_path: str, split: str, num: int
) -> list[Example]:
    """Examples of named datasets, each spec "name" (read under `data_path`) or "name:path".

    Args:
      specs: dataset specs, e.g. ["aime", "amc"] or ["examples:/tmp/mine.jsonl"].
      data: the settings' data section (seed, level and filters of generated tasks).
      data_path: the directory or file for specs without a path.
      split: the split to read; "" reads "test" from local JSONL and each dataset's own split
        from the hub (AIME 2024 and AMC have only "train", MATH-500 only "test").
      num: keep the first `num` of each (0 keeps all; generated tasks need it).
    """
    out: list[Example] = []
    for spec in specs:
        name, path = datasets.parse_spec(spec)
        examples, report = datasets.load(
            name,
            path or data_path or None,
            split,
            num=num or None,
            seed=data.seed,
            level=data.levels or data.level,
            weights=data.weights if name == data.name else (),
            task_config=data.task_config if name == data.name else "",
            exclude_multiple_choice=data.exclude_multiple_choice,
            exclude_true_false=data.exclude_true_false,
        )
        if report is not None and report.num_skipped:
            print(report.summary())
        out += examples
    return out


def generate_and_score(
    params: Params,
    model_cfg: ModelConfig,
    task: Task,
    ids: Sequence[Sequence[int]],
    examples: Sequence[Example],
    sampler_cfg: SamplerConfig,
    G: int,
    buckets: Sequence[int],
    pad_id: int,
    batch_prompts: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    episodes: list[dict[str, np.ndarray]] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """G responses per prompt (G episodes for a multi-turn task) and their verdicts.

    `episodes`: for a multi-turn task, each batch's per-episode counts are appended to it
    (`episodes_and_score`; `episode_metrics` sums them up).

    Returns:
      (correct_BG bool, lengths_BG int, truncated_BG bool) host arrays over the B prompts.
    """
    if isinstance(task, MultiTurnTask):
        # The task's own rollout, as in the RL stage (`rl_stage.build_rollout_source`).
        correct, lengths, finish = episodes_and_score(
            params,
            model_cfg,
            task,
            examples,
            sampler_cfg,
            G,
            buckets,
            pad_id,
            batch_prompts,
            temperature,
            top_p,
            seed,
            episodes,
        )
        return (
            correct.reshape(-1, G) > 0.5,
            lengths.reshape(-1, G),
            finish.reshape(-1, G) == FINISH_LENGTH,
        )

    def score(rollout: Rollout, prompt_ids: list[int]):
        rows = [examples[j] for j in prompt_ids for _ in range(G)]
        return task.score(rollout, rows)["correct"], rollout.lengths_N, rollout.finish_N

    # `generate` is jitted once for the module: calls with the same shapes and sampler
    # settings (greedy, then the n samples; every evaluation) compile nothing.
    correct, lengths, finish = generate_in_batches(
        params,
        ids,
        score,
        model_cfg=model_cfg,
        cfg=sampler_cfg,
        batch_prompts=batch_prompts,
        buckets=buckets,
        pad_id=pad_id,
        group_size=G,
        sp=sampling_params(batch_prompts * G, temperature, top_p),
        seed=seed,
    )
    return (
        correct.reshape(-1, G) > 0.5,
        lengths.reshape(-1, G),
        finish.reshape(-1, G) == FINISH_LENGTH,
    )


def episodes_and_score(
    params: Params,
    model_cfg: ModelConfig,
    task: MultiTurnTask,
    examples: Sequence[Example],
    sampler_cfg: SamplerConfig,
    G: int,
    buckets: Sequence[int],
    pad_id: int,
    batch_prompts: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    episodes: list[dict[str, np.ndarray]] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """G episodes of every example (`rl.multiturn.run_episodes`, the task's environments and
    tool-call stops, `task.turn_tokens` a round) and their verdicts by `task.score`.

    Batches hold `batch_prompts` examples, the last one padded by repeating its last example
    (fixed shapes); batch i samples with fold_in(key(seed), i). Each batch's per-episode
    "tool_calls", "tool_errors" and "turns" (padding rows left out) are appended to `episodes`
    when it is given.

    Returns:
      (correct_N, lengths_N, finish_N) host arrays, row p * G + g for episode g of example p.
    """
    T, B = sampler_cfg.max_new_tokens, batch_prompts
    stops = (*sampler_cfg.stop_sequences, *task.stop_sequences)
    cfg = dataclasses.replace(
        sampler_cfg,
        max_new_tokens=min(task.turn_tokens or T, T),
        prompt_group=1,
        stop_sequences=stops,
    )
    episode_cfg = multiturn.EpisodeConfig(
        max_new_tokens=T,
        max_turns=task.max_turns,
        tool_workers=task.tool_workers,
        response_format=task.response_format,
    )
    context_buckets = (*buckets, max(buckets) + T)
    sp = sampling_params(B * G, temperature, top_p)
    key = jax.random.key(seed)
    out = []
    for i, start in enumerate(range(0, len(examples), B)):
        chosen = list(examples[start : start + B])
        real = len(chosen)
        chosen += [chosen[-1]] * (B - real)
        decode = multiturn.sampler_decode(
            params, model_cfg, cfg, context_buckets, pad_id, jax.random.fold_in(key, i), sp
        )
        envs = [task.environment() for _ in range(B * G)]
        rollout, stats = multiturn.run_episodes(
            decode, envs, chosen, task.tok, episode_cfg, buckets, pad_id
        )
        if episodes is not None:
            episodes.append(
                {
                    "tool_calls": stats.tool_calls_N[: real * G],
                    "tool_errors": stats.tool_errors_N[: real * G],
                    "turns": stats.turns_N[: real * G],
                }
            )
        rows = [ex for ex in chosen for _ in range(G)]
        correct = task.score(rollout, rows)["correct"]
        lengths, finish = jax.device_get((rollout.lengths_N, rollout.finish_N))
        out.append([np.asarray(a)[: real * G] for a in (correct, lengths, finish)])
    return tuple(np.concatenate(parts) for parts in zip(*out, strict=True))


def episode_metrics(episodes: Sequence[Mapping[str, np.ndarray]]) -> dict[str, float]:
    """What the episodes of `episodes_and_score` did: "tool_call_rate" (the share of episodes
    with a tool call), and "tool_calls", "tool_errors" and "turns" per episode."""
    calls, errors, turns = (
        np.concatenate([np.asarray(e[k], np.float64) for e in episodes])
        for k in ("tool_calls", "tool_errors", "turns")
    )
    return {
        "tool_call_rate": float(np.mean(calls > 0)),
        "tool_calls": float(np.mean(calls)),
        "tool_errors": float(np.mean(errors)),
        "turns": float(np.mean(turns)),
    }


def breakdowns(examples: Sequence[Example]) -> list[list[str]]:
    """The groupings a table reports, one label per prompt each: by source, and by source and
    difficulty ("rg:leg_counting/level2") where a source holds several difficulties."""
    sources = [ex.source for ex in examples]
    levels: dict[str, set] = {}
    for ex in examples:
        levels.setdefault(ex.source, set()).add(ex.difficulty)
    out = [sources]
    if any(len(v) > 1 for v in levels.values()):
        out.append(
            [
                f"{ex.source}/level{ex.difficulty:g}"
                if len(levels[ex.source]) > 1 and ex.difficulty is not None
                else ex.source
                for ex in examples
            ]
        )
    return out


def _table(
    groupings: Sequence[Sequence[str]], correct_BG, lengths_BG, truncated_BG, ks: Sequence[int]
) -> dict[str, dict[str, float]]:
    out = {ALL: eval_metrics.group_metrics(correct_BG, lengths_BG, truncated_BG, ks=ks)}
    for labels in groupings:
        out.update(eval_metrics.per_source(labels, correct_BG, lengths_BG, truncated_BG, ks=ks))
    return out


def evaluate(
    params: Params,
    model_cfg: ModelConfig,
    tok: Tokenizer,
    settings: Settings,
    examples: Sequence[Example],
    options: EvalOptions = EvalOptions(),
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Greedy accuracy and, with `options.num_samples`, pass@k and mean@n, per source.

    Returns:
      {"num_prompts", "num_too_long", "greedy": {"all" | source: metrics}, "sampled" (same
      layout) when sampling, and "episodes" (`episode_metrics` of the greedy episodes) for a
      multi-turn task}. Metrics are `eval_metrics.group_metrics` names: "mean@1" is the
      greedy accuracy, "pass@k", "mean@n", "length/mean", "length/truncated", ...
    """
    s = settings
    sampler_cfg = sampler_config(s, tok)
    if options.max_new_tokens:
        sampler_cfg = dataclasses.replace(sampler_cfg, max_new_tokens=options.max_new_tokens)
    template = templates.get_template(s.data.template)
    enc = templates.encode_prompts(examples, template, tok, s.data.buckets)
    if enc.num_too_long:
        log(f"eval: {enc.summary()}")
    task = build_task(s.reward, tok, model_cfg.vocab_size, enc.examples, s.data.template)
    common = dict(
        buckets=s.data.buckets,
        pad_id=tok.pad_id,
        batch_prompts=options.batch_prompts or s.eval.batch_prompts,
    )
    sources = breakdowns(enc.examples)
    out: dict[str, Any] = {"num_prompts": len(enc.ids), "num_too_long": enc.num_too_long}
    try:
        greedy = dataclasses.replace(sampler_cfg, method="greedy")
        episodes: list[dict[str, np.ndarray]] = []
        scored = generate_and_score(
            params, model_cfg, task, enc.ids, enc.examples, greedy, 1, **common, episodes=episodes
        )
        out[GREEDY] = _table(sources, *scored, ks=(1,))
        if episodes:
            out[EPISODES] = episode_metrics(episodes)
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
    tail = ""
    if EPISODES in result:
        tail = "\ngreedy episodes: " + ", ".join(
            f"{k} {v:.3f}" for k, v in result[EPISODES].items()
        )
    table = "\n".join(
        "  ".join(
            [r[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True))]
        )
        for r in rows
    )
    return table + tail


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


def heldout_evaluator(
    model_cfg: ModelConfig,
    settings: Settings,
    task: Task,
    tok: Tokenizer,
    ids: Sequence[Sequence[int]],
    examples: Sequence[Example],
) -> Callable[[Params], dict[str, float]]:
    """`evaluate(params)`: greedy accuracy, response length and truncation on the held-out
    prompts (`eval/accuracy`, `eval/length`, `eval/truncated`, `eval/num_prompts`), and the
    accuracy per source and per difficulty (`eval/<source>/accuracy`,
    `eval/<source>/level<d>/accuracy`) where the prompts hold several of them; for a
    multi-turn task, `eval/tool_call_rate`, `eval/tool_calls`, `eval/tool_errors` and
    `eval/turns` (`episode_metrics`)."""
    greedy = dataclasses.replace(sampler_config(settings, tok), method="greedy")
    groupings = [g for g in breakdowns(examples) if len(set(g)) > 1]

    def evaluate(params: Params) -> dict[str, float]:
        episodes: list[dict[str, np.ndarray]] = []
        correct, lengths, truncated = generate_and_score(
            params,
            model_cfg,
            task,
            ids,
            examples,
            greedy,
            1,
            settings.data.buckets,
            tok.pad_id,
            settings.eval.batch_prompts,
            episodes=episodes,
        )
        out = {
            "eval/accuracy": float(np.mean(correct)),
            "eval/length": float(np.mean(lengths)),
            "eval/truncated": float(np.mean(truncated)),
            "eval/num_prompts": float(len(correct)),
        }
        if episodes:
            out.update({f"eval/{k}": v for k, v in episode_metrics(episodes).items()})
        for labels in groupings:
            table = eval_metrics.per_source(labels, correct)
            out.update({f"eval/{k}/accuracy": v["mean@1"] for k, v in table.items()})
        return out

    return evaluate
