"""DAPO dynamic sampling (Yu et al. 2025): train only on groups whose rewards differ.

A group whose G rewards are all equal has zero advantage everywhere: it spends rollout and update
compute and gives no gradient. Each step draws whole batches of prompts (shapes stay static),
rolls them out and verifies them, keeps the groups with reward variance, and stops when the batch
is full or after a number of rounds; the batch is then topped up with dropped groups. Host code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.data import curriculum as curriculum_lib
from rlvr_jax.data.example import Example
from rlvr_jax.rl.train_step import Batch
from rlvr_jax.types import Rollout


def concat_rollouts(rollouts: Sequence[Rollout], pad_id: int) -> Rollout:
    """Rows of several rollouts as one; prompts are left-padded to the widest bucket among them
    (positions follow the mask, so extra left padding changes nothing for the model)."""
    P = max(r.prompt_NP.shape[1] for r in rollouts)
    widened = [
        dataclasses.replace(
            r,
            prompt_NP=jnp.pad(
                r.prompt_NP, ((0, 0), (P - r.prompt_NP.shape[1], 0)), constant_values=pad_id
            ),
        )
        for r in rollouts
    ]
    return jax.tree.map(lambda *xs: jnp.concatenate(xs), *widened)


@dataclasses.dataclass
class Round:
    """One rollout round of dynamic sampling: the prompts drawn, their rollout and rewards."""

    examples: list[Example]
    rollout: Rollout
    rewards_N: np.ndarray
    parts: dict[str, np.ndarray]


def dynamic_sampling_batch(
    draw: Callable[[], tuple[list[Example], Batch]],
    rollout_and_verify: Callable[[list[Example], Batch], Round],
    batch_prompts: int,
    group_size: int,
    max_rounds: int,
    pad_id: int,
) -> tuple[Rollout, np.ndarray, dict[str, np.ndarray], list[Round], dict[str, float]]:
    """DAPO dynamic sampling over whole-batch rounds (see the settings' `data.dynamic_sampling`).

    Returns:
      (rollout, rewards_N, parts) of the `batch_prompts` groups to train on, kept groups first;
      every round (for the prompt sampler); and the `dynamic_sampling/*` metrics.

    Groups are filtered on the total reward, not on correctness alone: what the advantage
    zeroes is a group of equal rewards, and a shaped reward (length, format) can give an
    all-correct group variance, and so signal.
    """
    rounds: list[Round] = []

    def produce(wanted: int):
        del wanted  # every round is a full batch, so that shapes stay static
        examples, batch = draw()
        r = rollout_and_verify(examples, batch)
        rounds.append(r)
        i = len(rounds) - 1
        groups = [(i, b) for b in range(len(examples))]
        return groups, r.rewards_N.reshape(-1, group_size)

    groups, _, stats = curriculum_lib.fill_batch(produce, batch_prompts, max_rounds)
    rows = []
    for i, b in groups:
        rows.append((i, np.arange(b * group_size, (b + 1) * group_size)))
    rollout = concat_rollouts(
        [jax.tree.map(lambda x, idx=idx: x[idx], rounds[i].rollout) for i, idx in rows], pad_id
    )
    rewards = np.concatenate([rounds[i].rewards_N[idx] for i, idx in rows])
    parts = {
        k: np.concatenate([rounds[i].parts[k][idx] for i, idx in rows]) for k in rounds[0].parts
    }
    return rollout, rewards, parts, rounds, stats.as_metrics()
