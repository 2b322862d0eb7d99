"""The task interface: what the loop, the evaluator and the SFT stage know of a verifier.

A task turns a rollout of some examples into reward parts ("correct" always; "format" and others
where the task has them). Every task answers on the host (`Task.score`), so the evaluator, the
difficulty filter and dynamic sampling have one path; a task whose verifier is a JAX function of
the tokens also offers it (`Task.jax_parts`), and then the RL step fuses rollout, reward and update
into one XLA program. Shaping (format weight, Kimi's length reward, DAPO's overlong penalty) is
the same for every task: `shape_rewards` over the parts, jittable. A host task that names its
parts before scoring (`Task.part_names`) lets the RL stage compile its update ahead of the first
step (`host_part_shapes`).

Multi-turn environments fit the same interface (`MultiTurnTask`): their rollout alternates
sampled tokens with observation tokens (marked injected, so the loss leaves them out), made by
`rl.multiturn` from one `Environment` per row, and `score` is the episode's final verifier over
the whole trajectory; `Task.max_turns` is 1 for the single-turn tasks.

A task that executes model output (a program, a tool call, an `eval` of an answer) names the
sandbox backend it runs it in (`Task.sandbox_backend`, from `reward.sandbox_backend`);
`check_sandbox` refuses it where that backend cannot start, when the task is built (before a
stage compiles its steps), and logs what the sandbox protects against once per process.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.environment import Demonstrator, Environment, ToolResponseFormat
from rlvr_jax.rewards import sandbox, shaping
from rlvr_jax.rewards.config import RewardSettings
from rlvr_jax.types import Rollout

Array = jax.Array
# parts(rollout, targets) -> {"correct": (N,), ...}, jittable.
JaxParts = Callable[[Rollout, Any], dict[str, Array]]
# The backends `check_sandbox` has described in this process's log.
_LOGGED_BACKENDS: set[str] = set()


class Task(abc.ABC):
    """A verifiable task. Subclasses set `name` and implement `score`.

    Attributes:
      name: the `reward.verifier` value that selects it.
      max_turns: model turns per episode (1: the response is the whole episode).
      sandbox_backend: the `rewards.sandbox` backend the task runs model output in
        (`reward.sandbox_backend`); None for a task that never executes model output.
    """

    name: str = ""
    max_turns: int = 1
    sandbox_backend: str | None = None

    @property
    def jax_parts(self) -> JaxParts | None:
        """The verifier as a jittable function of (rollout, `targets(...)`), or None when it
        runs on the host."""
        return None

    def targets(self, examples_N: Sequence[Example]) -> Any:
        """Per-row inputs of `jax_parts` (a pytree with a leading N axis), or None."""
        del examples_N
        return None

    @abc.abstractmethod
    def score(self, rollout: Rollout, examples_N: Sequence[Example]) -> dict[str, np.ndarray]:
        """Unweighted reward parts of each row, as host arrays: {"correct": (N,) f32, ...}.

        A check that fails (a verifier timeout, a malformed answer) scores 0 and is counted in
        `stats()`, never raised.
        """

    def part_names(self) -> tuple[str, ...] | None:
        """The names `score` returns, in its order, when they are known before any scoring (the
        host path then compiles its update ahead of the first step, `host_part_shapes`); None
        when they are not."""
        return None

    def stats(self) -> dict[str, float]:
        """Counters of the host verifier (checks, timeouts, crashes) for the metrics ledger."""
        return {}

    def close(self) -> None:  # noqa: B027 (a task without resources has nothing to release)
        """Releases the task's resources (verifier processes)."""

    def __enter__(self) -> Task:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class MultiTurnTask(Task):
    """A task whose episodes run over several turns with an environment (tools).

    The RL step and the evaluator make its rollouts with `rl.multiturn.run_episodes` (one
    `environment()` per row) instead of one decode; `score` then reads the rollout it made.

    Attributes:
      tok: encodes prompts and observations, decodes turns.
      stop_sequences: token sequences that end a tool call (the sampler stops the row there).
      turn_tokens: tokens per decode round; 0 for the whole generation length.
      tool_workers: threads that run the environments' steps.
      overlap_tools: the RL rollout's rounds do not wait for running tools
        (`rl.multiturn.EpisodeConfig.overlap_tools`).
      response_format: how observations are wrapped (the chat template's tool turn).
    """

    tok: Tokenizer
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    turn_tokens: int = 0
    tool_workers: int = 8
    overlap_tools: bool = False
    response_format: ToolResponseFormat = ToolResponseFormat()

    @abc.abstractmethod
    def environment(self) -> Environment:
        """A fresh episode (its `reset` takes the example)."""

    def demonstration(self, example: Example) -> Demonstrator | None:
        """A scripted gold episode of `example` for a supervised cold start
        (`envs.demonstrations`): an environment and the policy that plays it; None where the
        task has no script for the example (the default)."""
        del example
        return None


def check_sandbox(task: Task) -> None:
    """Refuses a task whose sandbox cannot start on this host, and logs the sandbox once.

    A task that runs no model output (`sandbox_backend` None) needs no sandbox. For one that
    does, the first check of each backend in this process logs the backend, what it protects
    against and what it lacks (`sandbox.describe`).

    Raises:
      SandboxUnavailableError: "bwrap" where bubblewrap cannot start; the message names the
        package to install and the opt-in to the weak fallback, `reward.sandbox_backend`.
      ValueError: an unknown backend.
    """
    backend = task.sandbox_backend
    if backend is None:
        return
    sandbox.check_backend(backend)
    if backend in _LOGGED_BACKENDS:
        return
    _LOGGED_BACKENDS.add(backend)
    log = logging.info if backend == "bwrap" else logging.warning
    log("task %r runs model output in the sandbox: %s", task.name, sandbox.describe(backend))


def response_texts(tok: Tokenizer, rollout: Rollout) -> list[str]:
    """The decoded responses of a rollout (special tokens dropped), for host verifiers."""
    tokens_NT, lengths_N = jax.device_get((rollout.tokens_NT, rollout.lengths_N))
    return [
        tok.decode(tokens_NT[i, : lengths_N[i]], skip_special_tokens=True)
        for i in range(tokens_NT.shape[0])
    ]


def shape_rewards(
    parts: Mapping[str, Array], lengths_N: Array, reward: RewardSettings, G: int, T: int
) -> tuple[Array, dict[str, Array]]:
    """Adds the configured shaping parts and sums them with their weights (jittable).

    Args:
      parts: the task's parts, (N,) each, N = B x G rows in groups of G.
      lengths_N: response lengths.
      reward: the weights.
      G: group size (the length reward is group-relative).
      T: the generation length (the overlong penalty's limit).
    """
    parts = dict(parts)
    weights = {"correct": 1.0}
    if reward.format != "none" and "format" in parts:
        weights["format"] = reward.format_weight
    # Parts a learned reward adds (`envs.learned_rewards`) weigh in when they are there.
    weights.update({k: w for k, w in reward.learned_weights().items() if k in parts})
    if reward.length_weight:
        parts["length"] = shaping.kimi_length_reward(
            lengths_N.reshape(-1, G), parts["correct"].reshape(-1, G)
        ).reshape(-1)
        weights["length"] = reward.length_weight
    if reward.overlong_cache:
        parts["overlong"] = shaping.overlong_penalty(lengths_N, T, reward.overlong_cache)
        weights["overlong"] = 1.0
    return shaping.combine(parts, weights)


def host_rewards(
    task: Task,
    rollout: Rollout,
    examples_N: Sequence[Example],
    reward: RewardSettings,
    G: int,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Shaped rewards and parts of one rollout on the host (the step's split path)."""
    parts = task.score(rollout, examples_N)
    lengths_N = jax.device_get(rollout.lengths_N)
    T = rollout.tokens_NT.shape[1]
    rewards, parts = shape_rewards(
        {k: jnp.asarray(v) for k, v in parts.items()}, jnp.asarray(lengths_N), reward, G, T
    )
    return np.asarray(rewards), {k: np.asarray(v) for k, v in parts.items()}


def host_part_shapes(
    task: Task, reward: RewardSettings, G: int, N: int, T: int
) -> tuple[jax.ShapeDtypeStruct, dict[str, jax.ShapeDtypeStruct]] | None:
    """The shapes of `host_rewards(...)` for N rows of T tokens, when `task.part_names()` knows
    them before scoring: `(rewards_N, parts)` as `jax.ShapeDtypeStruct`s; else None."""
    names = task.part_names()
    if names is None:
        return None
    part = jax.ShapeDtypeStruct((N,), jnp.float32)
    lengths = jax.ShapeDtypeStruct((N,), jnp.int32)
    return jax.eval_shape(
        lambda parts, lengths_N: shape_rewards(parts, lengths_N, reward, G, T),
        dict.fromkeys(names, part),
        lengths,
    )


def jax_reward_fn(
    task: Task, reward: RewardSettings, G: int
) -> Callable[[Rollout, Any], tuple[Array, dict[str, Array]]]:
    """`reward_fn(rollout, targets) -> (rewards_N, parts)` for the fused step.

    Raises:
      ValueError: for a task without a JAX verifier.
    """
    parts_fn = task.jax_parts
    if parts_fn is None:
        raise ValueError(f"task {task.name!r} verifies on the host; it has no JAX reward")

    def reward_fn(rollout: Rollout, targets: Any):
        T = rollout.tokens_NT.shape[1]
        return shape_rewards(parts_fn(rollout, targets), rollout.lengths_N, reward, G, T)

    return reward_fn
