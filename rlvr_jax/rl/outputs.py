"""What one RL step returns besides the new state: scalar metrics and per-row results.

`StepOutput` is a pytree, so the jitted step returns it replicated over the mesh and the loop
fetches it with one `jax.device_get`. The reductions here turn the optimizer passes' stacked
per-microbatch metrics and the rollout into the metrics ledger's scalars.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from rlvr_jax.rl.advantages import zero_variance_groups
from rlvr_jax.types import FINISH_LENGTH, Rollout

Array = jax.Array

# The step metrics every train program adds to the update's (`with_useful_metrics`).
USEFUL_TRAJECTORIES = "useful/trajectories"
SAMPLED_TOKENS = "rollout/sampled_tokens"

# Stacked per optimizer update (mu, num_minibatches); every other pass metric per microbatch.
# "value/grad_norm" is there only with a value model.
UPDATE_NORMS = ("grad_norm", "update_norm", "value/grad_norm")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RowResults:
    """Per-row results of one step, rows ordered `b * G + g` (sample g of prompt b).

    Attributes:
      correct_N: (N,) f32, 1 where the row succeeded: the verifier's "correct" part, or reward
        > 0 without one. The curriculum and the group-success histogram read it.
      adv_N: (N,) f32 advantages.
      lengths_N: (N,) int32 completion lengths in tokens.

    The rewards are not repeated here: the host path has them already, and in the fused step
    returning them changes how XLA fuses the reward into its metrics (their last bits).
    """

    correct_N: Array
    adv_N: Array
    lengths_N: Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StepOutput:
    """What `build_train_step` and `build_update` return with the new state.

    Attributes:
      metrics: name -> f32 scalar; with `rl.group_grad_norms` also the per-prompt (B,) arrays
        "groups/grad_norm" and "groups/success_rate".
      rows: the per-row results.
    """

    metrics: dict[str, Array]
    rows: RowResults


def row_results(
    rollout: Rollout, rewards_N: Array, adv_N: Array, parts: dict[str, Array]
) -> RowResults:
    """The per-row results of a step that trained on `rewards_N` and `adv_N`."""
    if "correct" in parts:
        correct_N = parts["correct"]
    else:
        correct_N = (rewards_N > 0).astype(jnp.float32)
    return RowResults(correct_N, adv_N, rollout.lengths_N)


def useful_rows(rewards_N: Array, G: int) -> Array:
    """f32 count of the useful trajectories among N = B * G rows (ordered `b * G + g`): the rows
    of the groups whose G verifier rewards are not all equal (std > 0).

    A group of equal rewards (all correct, all wrong, any constant) has zero advantage under
    every group baseline, so it gives GRPO no gradient: its rows were verified but taught
    nothing. Counted from the rewards, not the advantages, so that the number means the same
    for every estimator (a batch baseline or expert iteration gives such rows an advantage
    anyway) and with the KL penalty in the reward. The train programs count it over the rows
    the update trains on (`with_useful_metrics`). Jittable; numpy arrays are accepted.
    """
    mixed_B = ~zero_variance_groups(jnp.asarray(rewards_N, jnp.float32).reshape(-1, G))
    return G * jnp.sum(mixed_B).astype(jnp.float32)


def sampled_tokens(rollout: Rollout) -> Array:
    """f32 count of the tokens the policy sampled in `rollout`: its generated tokens less the
    injected ones (a multi-turn row's tool observations, the think budget's forced text)."""
    return jnp.sum(rollout.mask_NT & ~rollout.injected_NT).astype(jnp.float32)


def with_useful_metrics(out: StepOutput, rollout: Rollout, rewards_N: Array, G: int) -> StepOutput:
    """`out` with `USEFUL_TRAJECTORIES` (`useful_rows` of the verifier's rewards of the rows
    the update trained on) and `SAMPLED_TOKENS` (`sampled_tokens` of their rollout) added to
    its metrics."""
    useful = {
        USEFUL_TRAJECTORIES: useful_rows(rewards_N, G),
        SAMPLED_TOKENS: sampled_tokens(rollout),
    }
    return dataclasses.replace(out, metrics={**out.metrics, **useful})


def pass_metrics(stacked: dict[str, Array]) -> dict[str, Array]:
    """Reduces the optimizer passes' metrics to scalars.

    Per-microbatch metrics (leaves (mu, num_minibatches, num_microbatches)): min/max keep their
    extreme, the loss terms (already normalised globally) are summed per minibatch then
    averaged over updates, the rest is a token-weighted mean. The update norms (leaves (mu,
    num_minibatches)) are averaged. "loss/tokens" is left to the caller: the batch's count is
    not a reduction of the passes'.
    """
    micro = {k: v.reshape(-1, v.shape[-1]) for k, v in stacked.items() if k not in UPDATE_NORMS}
    tokens = micro.pop("loss/tokens")
    weight = tokens / jnp.maximum(jnp.sum(tokens), 1.0)
    out = {}
    for k, v in micro.items():
        if k.endswith("/min"):
            out[k] = jnp.min(v)
        elif k.endswith("/max"):
            out[k] = jnp.max(v)
        elif k.startswith("loss/"):
            out[k] = jnp.sum(v) / v.shape[0]  # summed over microbatches, averaged over updates
        else:
            out[k] = jnp.sum(weight * v)
    out.update({k: jnp.mean(stacked[k]) for k in UPDATE_NORMS if k in stacked})
    return out


def rollout_metrics(
    rollout: Rollout, rewards_N: Array, parts: dict[str, Array]
) -> dict[str, Array]:
    """Rewards per component, accuracy, response lengths and truncation of one rollout."""
    lengths = rollout.lengths_N.astype(jnp.float32)
    m = {
        "reward/mean": jnp.mean(rewards_N),
        "reward/std": jnp.std(rewards_N),
        "length/mean": jnp.mean(lengths),
        "length/p50": jnp.percentile(lengths, 50),
        "length/p95": jnp.percentile(lengths, 95),
        "length/max": jnp.max(lengths),
        "length/imbalance": jnp.max(lengths) / jnp.maximum(jnp.mean(lengths), 1.0),
        "length/truncated": jnp.mean((rollout.finish_N == FINISH_LENGTH).astype(float)),
        "rollout/tokens": jnp.sum(lengths),
    }
    if rollout.slot_steps_N is not None:  # slot-steps that emitted a token / all slot-steps
        m["rollout/slot_utilisation"] = jnp.sum(lengths) / jnp.sum(rollout.slot_steps_N)
        m["rollout/decode_steps"] = jnp.max(rollout.decode_steps_N).astype(jnp.float32)
    for name, v in parts.items():
        m[f"reward/{name}"] = jnp.mean(v)
    if "correct" in parts:
        m["accuracy"] = jnp.mean(parts["correct"])
        correct = parts["correct"] > 0
        n_correct = jnp.maximum(jnp.sum(correct), 1)
        n_wrong = jnp.maximum(jnp.sum(~correct), 1)
        m["length/correct"] = jnp.sum(jnp.where(correct, lengths, 0)) / n_correct
        m["length/incorrect"] = jnp.sum(jnp.where(correct, 0, lengths)) / n_wrong
    return m
