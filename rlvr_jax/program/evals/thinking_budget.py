"""Accuracy against the thinking budget: how much of a model's accuracy survives a shorter thought.

Qwen3 reports accuracy as a function of the thinking budget: the sampler ends the thinking block
after a number of tokens by injecting its closing text (`SamplerConfig.think_budget`, with
`think_open`, `think_close` and `think_stop`), and the model answers from there. `budget_curve`
evaluates greedy accuracy at each budget on the same prompts, with the rate at which the budget
ended the thought early (rows where the sampler injected the stop text: the model had not closed
its block by itself) and the mean response length.

With greedy decoding the tokens before the budget is reached do not depend on the budget, so the
early-end rate can only fall as the budget grows. The budget counts every token after the opening
until the closing sequence is complete, so with a closing text of several tokens (a character
tokenizer's "</think>") a thought ends early unless the budget also covers its closing tokens.

`with_think_tokens` fills the think token settings from the texts "<think>" and "</think>" where
the config sets none (the `rlvr_jax.eval --think_budgets` command and the pipelines use it).

Host code: generation and verification are the sampler's and the task's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from rlvr_jax.data import templates
from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.single_turn import build_task
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import Params
from rlvr_jax.program.parts import build
from rlvr_jax.program.settings import Settings
from rlvr_jax.sampling.host import generate_in_batches
from rlvr_jax.sft.fusion import THINK_CLOSE, THINK_OPEN
from rlvr_jax.types import FINISH_LENGTH, Rollout


@dataclasses.dataclass(frozen=True)
class BudgetPoint:
    """Greedy results at one thinking budget.

    Attributes:
      budget: tokens allowed inside the thinking block (0: no budget).
      accuracy: the share of prompts answered correctly.
      early_end_rate: the share of responses whose thinking block the budget ended.
      length: mean generated tokens (injected ones included).
      truncated: the share of responses that hit `max_new_tokens`.
    """

    budget: int
    accuracy: float
    early_end_rate: float
    length: float
    truncated: float


def with_think_tokens(settings: Settings, tok: Tokenizer) -> Settings:
    """The settings with `rl.sampler`'s think_open, think_close and think_stop filled from the
    texts "<think>", "</think>" and "\\n</think>" where the config sets none."""
    cfg = settings.rl.sampler
    if cfg.think_open and cfg.think_close and cfg.think_stop:
        return settings
    try:
        cfg = dataclasses.replace(
            cfg,
            think_open=tuple(tok.encode(THINK_OPEN)),
            think_close=tuple(tok.encode(THINK_CLOSE)),
            think_stop=tuple(tok.encode("\n" + THINK_CLOSE)),
        )
    except ValueError as e:
        raise ValueError(
            "a thinking budget needs rl.sampler.think_open, think_close and think_stop, or a "
            f"tokenizer that encodes {THINK_OPEN!r}, {THINK_CLOSE!r} and a line break: {e}"
        ) from None
    return dataclasses.replace(settings, rl=dataclasses.replace(settings.rl, sampler=cfg))


def budget_curve(
    params: Params,
    model_cfg: ModelConfig,
    tok: Tokenizer,
    settings: Settings,
    examples: Sequence[Example],
    budgets: Sequence[int],
) -> list[BudgetPoint]:
    """Greedy accuracy and early-end rate at each thinking budget (one sampler program each).

    Args:
      params, model_cfg, tok: the policy.
      settings: data template, buckets, verifier, and `rl.sampler` with `think_open`,
        `think_close` and `think_stop` set (its own `think_budget` is replaced).
      examples: the prompts.
      budgets: the budgets, each >= 0 (0: none).

    Raises:
      ValueError: a positive budget without the think token settings.
    """
    s = settings
    template = templates.get_template(s.data.template)
    enc = templates.encode_prompts(examples, template, tok, s.data.buckets)
    greedy = dataclasses.replace(build.sampler_config(s, tok), method="greedy")
    points = []
    with build_task(s.reward, tok, model_cfg.vocab_size, enc.examples, s.data.template) as task:

        def score(rollout: Rollout, prompt_ids: list[int]):
            rows = [enc.examples[j] for j in prompt_ids]
            forced_N = jax.device_get(rollout.injected_NT).any(axis=1)
            return (
                task.score(rollout, rows)["correct"],
                forced_N,
                rollout.lengths_N,
                (rollout.finish_N == FINISH_LENGTH),
            )

        for budget in budgets:
            cfg = dataclasses.replace(greedy, think_budget=int(budget))
            correct, forced, lengths, truncated = generate_in_batches(
                params,
                enc.ids,
                score,
                model_cfg=model_cfg,
                cfg=cfg,
                batch_prompts=s.eval.batch_prompts,
                buckets=s.data.buckets,
                pad_id=tok.pad_id,
            )
            points.append(
                BudgetPoint(
                    budget=int(budget),
                    accuracy=float(np.mean(correct > 0.5)),
                    early_end_rate=float(np.mean(forced)),
                    length=float(np.mean(lengths)),
                    truncated=float(np.mean(truncated)),
                )
            )
    return points


def markdown_table(points: Sequence[BudgetPoint]) -> str:
    """One row per budget: accuracy, early-end rate, length, truncation."""
    lines = [
        "| thinking budget | accuracy | early-end rate | length | truncated |",
        "|---|---|---|---|---|",
    ]
    for p in points:
        budget = str(p.budget) if p.budget else "none"
        lines.append(
            f"| {budget} | {p.accuracy:.3f} | {p.early_end_rate:.3f} | {p.length:.1f} "
            f"| {p.truncated:.3f} |"
        )
    return "\n".join(lines) + "\n"
