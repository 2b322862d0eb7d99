"""Learned rewards as reward parts next to a task's verifier: a reward model and a judge.

Each is a `Task` that wraps the task of `reward.verifier` and adds one part to its `score`:

- `RewardModelTask`: "preference", the trained reward model's score of (prompt, response)
  (`rewards.reward_model`), one jitted forward over the rollout's rows on the mesh the rollout
  and the reward model's weights live on;
- `JudgeTask`: "judge", the verdict a language model gives when asked to grade the response
  (`rewards.judge`), sampled greedily through the project's own sampler.

`shape_rewards` weighs the parts with `reward.rm_weight` and `reward.judge_weight` next to the
verifier's ("correct" keeps weight 1; a reward from the learned parts alone needs a task whose
"correct" part is 0, which no built-in task is). The loop sees one task and one path: a wrapped
task has no JAX verifier (`jax_parts` is None), so its step takes the host path, rollout ->
parts -> update.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.task import MultiTurnTask, Task, response_texts
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import Params
from rlvr_jax.rewards import judge as judge_lib
from rlvr_jax.rewards import reward_model as rm_lib
from rlvr_jax.rewards.config import RewardSettings
from rlvr_jax.sampling.config import SamplerConfig
from rlvr_jax.sampling.host import generate_in_batches
from rlvr_jax.types import Rollout

# Module level: one program per (architecture, normalisation, shapes) for every task and call.
_rollout_scores = jax.jit(rm_lib.rollout_scores, static_argnames=("cfg", "norm"))


class _WrappedTask(Task):
    """A task that adds one part to another task's parts."""

    part: str = ""

    def __init__(self, inner: Task):
        if isinstance(inner, MultiTurnTask):
            raise ValueError(
                f"learned rewards wrap single-turn tasks; {inner.name!r} is multi-turn"
            )
        self.inner = inner
        self.name = inner.name
        self.max_turns = inner.max_turns
        self.sandbox_backend = inner.sandbox_backend

    def targets(self, examples_N: Sequence[Example]) -> Any:
        return self.inner.targets(examples_N)

    def part_scores(self, rollout: Rollout, examples_N: Sequence[Example]) -> np.ndarray:
        """The added part, (N,) f32 on the host."""
        raise NotImplementedError

    def part_names(self) -> tuple[str, ...] | None:
        inner = self.inner.part_names()
        return None if inner is None else (*inner, self.part)

    def score(self, rollout: Rollout, examples_N: Sequence[Example]) -> dict[str, np.ndarray]:
        parts = dict(self.inner.score(rollout, examples_N))
        parts[self.part] = np.asarray(self.part_scores(rollout, examples_N), np.float32)
        return parts

    def stats(self) -> dict[str, float]:
        return self.inner.stats()

    def close(self) -> None:
        self.inner.close()


class RewardModelTask(_WrappedTask):
    """`inner`'s parts and "preference", the reward model's score of each row.

    Args:
      inner: the verifier's task.
      params: the reward model, placed where the rollouts are (the policy's mesh).
      model_cfg: its decoder's architecture.
      norm: `reward.rm_norm`.
    """

    part = "preference"

    def __init__(
        self, inner: Task, params: rm_lib.RewardModelParams, model_cfg: ModelConfig, norm: str
    ):
        super().__init__(inner)
        rm_lib.normalize_scores(np.zeros(1, np.float32), norm)  # an unknown name fails here
        self.params = params
        self.model_cfg = model_cfg
        self.norm = norm

    def part_scores(self, rollout: Rollout, examples_N: Sequence[Example]) -> np.ndarray:
        del examples_N
        scores_N = _rollout_scores(self.params, rollout, cfg=self.model_cfg, norm=self.norm)
        return np.asarray(jax.device_get(scores_N))


def _bucket(n: int) -> int:
    """The power of two (at least 16) that holds n: few prompt shapes, few compilations."""
    return max(16, 1 << (n - 1).bit_length())


class JudgeTask(_WrappedTask):
    """`inner`'s parts and "judge", a language model's verdict on each response.

    Args:
      inner: the verifier's task.
      params: the judge's weights.
      model_cfg: its architecture.
      tok: its tokenizer (encodes the grading prompt, decodes the response and the verdict).
      reward: the judge settings (`reward.judge_*`).
      batch_prompts: grading prompts per sampler call.
    """

    part = "judge"

    def __init__(
        self,
        inner: Task,
        params: Params,
        model_cfg: ModelConfig,
        tok: Tokenizer,
        reward: RewardSettings,
        batch_prompts: int = 32,
    ):
        super().__init__(inner)
        judge_lib.check_template(reward.judge_template)
        self.params = params
        self.model_cfg = model_cfg
        self.tok = tok
        self.reward = reward
        self.batch_prompts = batch_prompts
        self.sampler = SamplerConfig(
            max_new_tokens=reward.judge_tokens,
            method="greedy",
            eos_ids=tuple(tok.eos_ids),
            pad_id=tok.pad_id,
        )
        self.counts = {"judge/checks": 0, "judge/no_verdict": 0}

    def verdict_texts(self, prompts: Sequence[str]) -> list[str]:
        """The judge's answers to grading prompts (greedy, `judge_tokens` at most)."""
        ids = [self.tok.encode(p) for p in prompts]
        tokens, lengths = generate_in_batches(
            self.params,
            ids,
            lambda r, _: (r.tokens_NT, r.lengths_N),
            model_cfg=self.model_cfg,
            cfg=self.sampler,
            batch_prompts=min(self.batch_prompts, len(ids)),
            buckets=(_bucket(max(map(len, ids))),),
            pad_id=self.tok.pad_id,
        )
        return [
            self.tok.decode(tokens[i, : lengths[i]], skip_special_tokens=True)
            for i in range(len(ids))
        ]

    def part_scores(self, rollout: Rollout, examples_N: Sequence[Example]) -> np.ndarray:
        r = self.reward
        prompts = [
            judge_lib.grading_prompt(r.judge_template, ex.prompt_text, text)
            for ex, text in zip(examples_N, response_texts(self.tok, rollout), strict=True)
        ]
        verdicts = [
            judge_lib.parse_verdict(t, r.judge_verdict, r.judge_max_score)
            for t in self.verdict_texts(prompts)
        ]
        self.counts["judge/checks"] += len(verdicts)
        self.counts["judge/no_verdict"] += sum(v is None for v in verdicts)
        return np.asarray([0.0 if v is None else v for v in verdicts], np.float32)

    def stats(self) -> dict[str, float]:
        return {**self.inner.stats(), **{k: float(v) for k, v in self.counts.items()}}


def with_learned_rewards(
    task: Task,
    reward: RewardSettings,
    reward_model: tuple[rm_lib.RewardModelParams, ModelConfig] | None = None,
    judge: tuple[Params, ModelConfig, Tokenizer] | None = None,
    batch_prompts: int = 32,
) -> Task:
    """`task` wrapped with the learned parts whose models are given (the judge outermost).

    Args:
      task: the verifier's task.
      reward: the settings (normalisation, judge template and verdict).
      reward_model: the reward model's weights and architecture, or None.
      judge: the judge's weights, architecture and tokenizer, or None.
      batch_prompts: the judge's grading prompts per sampler call.
    """
    if reward_model is not None:
        task = RewardModelTask(task, *reward_model, norm=reward.rm_norm)
    if judge is not None:
        task = JudgeTask(task, *judge, reward=reward, batch_prompts=batch_prompts)
    return task
