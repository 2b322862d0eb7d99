"""Single-turn tasks: one response per prompt, checked by its verifier.

* `ArithmeticTask`: the integer answer read from the tokens in JAX (`rewards.arithmetic`), so the
  RL step is one XLA program.
* `MathTask`: the final answer extracted from the decoded text and compared with `rewards.math`
  in the verifier pool (process isolation, a deadline per item).
* `CountdownTask`: an arithmetic expression over the given numbers, parsed without eval
  (`rewards.countdown`), in the pool.
* `ReasoningGymTask`: a reasoning-gym task's own scorer (`rewards.rg_scoring`), in the pool,
  with the `eval` of the scorers that make one inside the sandbox (`reward.sandbox_backend`).
* `CodeTestsTask` (`envs.code`): a program run against the problem's hidden unit tests in the
  sandbox (`rewards.code_tests`, `reward.sandbox_backend`).

`build_task` picks one from `RewardSettings.verifier` (the multi-turn "math_tool" and "swe"
included: `envs.tool_math`, `envs.swe`) and checks its sandbox (`task.check_sandbox`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
import numpy as np

from rlvr_jax.config_types import ConfigError
from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.code import CodeTestsTask
from rlvr_jax.envs.swe import SweTask
from rlvr_jax.envs.task import JaxParts, Task, check_sandbox, response_texts
from rlvr_jax.envs.tool_math import MathToolTask
from rlvr_jax.rewards import arithmetic, countdown, rg_scoring
from rlvr_jax.rewards import math as math_reward
from rlvr_jax.rewards.config import RewardSettings
from rlvr_jax.rewards.format import mode_reward, r1_format_reward
from rlvr_jax.rewards.pool import VerifierPool
from rlvr_jax.types import FINISH_LENGTH, Rollout


def _arithmetic_parts(
    table: arithmetic.DigitTable, rollout: Rollout, answers: arithmetic.Answers
) -> dict[str, jax.Array]:
    ended_N = rollout.finish_N != FINISH_LENGTH
    return arithmetic.arithmetic_reward(
        rollout.tokens_NT, rollout.mask_NT, ended_N, answers, table
    )[1]


# The table is an argument, not a constant, so one program serves every task and call.
_arithmetic_parts_jit = jax.jit(_arithmetic_parts)


class ArithmeticTask(Task):
    """Integer answers checked in JAX over tokens: parts "correct" and "format" (a number, then
    an end token)."""

    name = "arithmetic"

    def __init__(self, table: arithmetic.DigitTable, width: int):
        self.table = table
        self.width = width

    @property
    def jax_parts(self) -> JaxParts:
        return functools.partial(_arithmetic_parts, self.table)

    def targets(self, examples_N: Sequence[Example]) -> arithmetic.Answers:
        return arithmetic.encode_answers([int(ex.answer) for ex in examples_N], self.width)

    def part_names(self) -> tuple[str, ...]:
        return ("correct", "format")

    def score(self, rollout: Rollout, examples_N: Sequence[Example]) -> dict[str, np.ndarray]:
        parts = _arithmetic_parts_jit(self.table, rollout, self.targets(examples_N))
        return {k: np.asarray(v) for k, v in jax.device_get(parts).items()}

    @classmethod
    def build(cls, tok: Tokenizer, vocab_size: int, examples: Sequence[Example]) -> ArithmeticTask:
        """The task for `examples`, whose gold answers must all be integers.

        Raises:
          ConfigError: naming the first example whose answer is not an integer.
        """
        bad = next((ex for ex in examples if not ex.answer.lstrip("-").isdigit()), None)
        if bad is not None:
            raise ConfigError(
                f"reward.verifier='arithmetic' needs integer answers; example {bad.id!r} has "
                f"{bad.answer!r} (use reward.verifier='math')"
            )
        width = max(len(ex.answer.lstrip("-")) for ex in examples)
        return cls(arithmetic.DigitTable.from_tokenizer(tok, vocab_size), width)


class PoolTask(Task):
    """A verifier `fn(response_text, gold) -> float` run in a `VerifierPool` on decoded text,
    with a "format" part when `reward.format` is "r1" (the R1 template) or "mode" (the thinking
    mode each prompt asked for)."""

    def __init__(
        self,
        fn: Callable[[str, str], float],
        warmup: tuple[str, str] | None,
        tok: Tokenizer,
        reward: RewardSettings,
        think_in_prompt: bool,
    ):
        self.tok = tok
        self.reward = reward
        self.think_in_prompt = think_in_prompt
        self.pool = VerifierPool(
            fn, num_workers=reward.workers, deadline_s=reward.deadline_s, warmup=warmup
        )

    def texts(self, rollout: Rollout) -> list[str]:
        """The decoded responses (special tokens dropped)."""
        return response_texts(self.tok, rollout)

    def format_part(self, texts: Sequence[str], examples_N: Sequence[Example]) -> np.ndarray | None:
        """The "format" part of each response, or None when `reward.format` sets none."""
        if self.reward.format == "r1":
            scores = [r1_format_reward(t, think_in_prompt=self.think_in_prompt) for t in texts]
        elif self.reward.format == "mode":
            scores = [
                mode_reward(t, bool(ex.meta["think"]))
                for t, ex in zip(texts, examples_N, strict=True)
            ]
        else:
            return None
        return np.asarray(scores, np.float32)

    def has_format(self) -> bool:
        """Whether `score` returns a "format" part (`format_part`)."""
        return self.reward.format in ("r1", "mode")

    def part_names(self) -> tuple[str, ...]:
        return ("correct", "format") if self.has_format() else ("correct",)

    def score(self, rollout: Rollout, examples_N: Sequence[Example]) -> dict[str, np.ndarray]:
        texts = self.texts(rollout)
        golds = [(t, ex.answer) for t, ex in zip(texts, examples_N, strict=True)]
        parts = {"correct": np.asarray(self.pool.map(golds), np.float32)}
        fmt = self.format_part(texts, examples_N)
        if fmt is not None:
            parts["format"] = fmt
        return parts

    def stats(self) -> dict[str, float]:
        return self.pool.stats.as_dict()

    def close(self) -> None:
        self.pool.close()


class MathTask(PoolTask):
    """Final answers (boxed, or the last number) checked for mathematical equivalence."""

    name = "math"

    def __init__(self, tok: Tokenizer, reward: RewardSettings, think_in_prompt: bool):
        super().__init__(math_reward.score, math_reward.WARMUP, tok, reward, think_in_prompt)


class CountdownTask(PoolTask):
    """An expression over the given numbers that reaches the target, parsed without eval."""

    name = "countdown"

    def __init__(self, tok: Tokenizer, reward: RewardSettings, think_in_prompt: bool):
        super().__init__(countdown.score, countdown.WARMUP, tok, reward, think_in_prompt)


class ReasoningGymTask(PoolTask):
    """reasoning-gym tasks scored by their own scorers: parts "correct" (a score of 1) and
    "rg_score" (the scorer's value, partial credit included; logged, not weighted)."""

    name = "reasoning_gym"

    def __init__(
        self, tok: Tokenizer, reward: RewardSettings, think_in_prompt: bool, evaluates: bool
    ):
        """`evaluates`: some of the tasks' scorers evaluate the answer's text (`rg_scoring`'s
        "sandbox" placement), which then runs in `reward.sandbox_backend`."""
        super().__init__(rg_scoring.score, rg_scoring.WARMUP, tok, reward, think_in_prompt)
        self.sandbox_backend = reward.sandbox_backend if evaluates else None

    @classmethod
    def build(
        cls,
        tok: Tokenizer,
        reward: RewardSettings,
        examples: Sequence[Example],
        think_in_prompt: bool,
    ) -> ReasoningGymTask:
        """The task for `examples`, which must all be reasoning-gym examples.

        Raises:
          ConfigError: naming the first example that is not one.
        """
        bad = next((ex for ex in examples if "rg_task" not in ex.hidden), None)
        if bad is not None:
            raise ConfigError(
                f"reward.verifier='reasoning_gym' needs reasoning-gym examples; {bad.id!r} is not "
                "one (use data.name='reasoning_gym:<task>')"
            )
        evaluates = any(
            rg_scoring.SCORERS.get(ex.hidden["rg_task"]) == rg_scoring.SANDBOX for ex in examples
        )
        return cls(tok, reward, think_in_prompt, evaluates)

    def part_names(self) -> tuple[str, ...]:
        return ("correct", "rg_score", "format") if self.has_format() else ("correct", "rg_score")

    def score(self, rollout: Rollout, examples_N: Sequence[Example]) -> dict[str, np.ndarray]:
        texts = self.texts(rollout)
        backend = self.reward.sandbox_backend
        items = [
            (t, ex.hidden["rg_task"], ex.hidden["rg_entry"], ex.hidden["rg_config"], backend)
            for t, ex in zip(texts, examples_N, strict=True)
        ]
        raw = np.asarray(self.pool.map(items), np.float32)
        parts = {"correct": (raw >= 1.0).astype(np.float32), "rg_score": raw}
        fmt = self.format_part(texts, examples_N)
        if fmt is not None:
            parts["format"] = fmt
        return parts


def build_task(
    reward: RewardSettings,
    tok: Tokenizer,
    vocab_size: int,
    examples: Sequence[Example],
    template_name: str,
) -> Task:
    """The task `reward.verifier` names, for `examples` (checked where the verifier needs it),
    with its sandbox checked (`task.check_sandbox`): every stage builds its task here, so a run
    whose task executes model output refuses to start where its sandbox cannot.

    Args:
      reward: the reward settings.
      tok: the tokenizer (digit tokens, decoding).
      vocab_size: the model's vocabulary size.
      examples: every example the task will score (train and eval).
      template_name: the prompt template (R1-Zero's opens the think block in the prompt).

    Raises:
      ConfigError: examples the verifier cannot score.
      SandboxUnavailableError: a task that executes model output with `reward.sandbox_backend`
        "bwrap" where bubblewrap cannot start.
    """
    task = _verifier_task(reward, tok, vocab_size, examples, template_name == "r1_zero")
    try:
        check_sandbox(task)
    except BaseException:
        task.close()
        raise
    return task


def _verifier_task(
    reward: RewardSettings,
    tok: Tokenizer,
    vocab_size: int,
    examples: Sequence[Example],
    think_in_prompt: bool,
) -> Task:
    if reward.verifier == "math":
        return MathTask(tok, reward, think_in_prompt)
    if reward.verifier == "countdown":
        return CountdownTask(tok, reward, think_in_prompt)
    if reward.verifier == "math_tool":
        return MathToolTask(tok, reward)
    if reward.verifier == "swe":
        return SweTask.build(tok, reward, examples)
    if reward.verifier == "reasoning_gym":
        return ReasoningGymTask.build(tok, reward, examples, think_in_prompt)
    if reward.verifier == "code_tests":
        return CodeTestsTask.build(tok, reward, examples)
    return ArithmeticTask.build(tok, vocab_size, examples)
