"""The update half of an RL step: prepared rows -> optimizer passes -> metrics.

`mu` passes over the rows; each pass shuffles them (when there is more than one minibatch) and
makes `num_minibatches` optimizer updates, each from the gradients of `num_microbatches`
microbatches summed. Every microbatch's loss uses its minibatch's normaliser, so the sum is the
minibatch's gradient exactly (see `losses`), whatever the split.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import Params
from rlvr_jax.rl import losses
from rlvr_jax.rl import rows as rows_lib
from rlvr_jax.rl.config import RLConfig
from rlvr_jax.rl.outputs import StepOutput, pass_metrics, rollout_metrics, row_results
from rlvr_jax.rl.rows import TrainRows
from rlvr_jax.rl.state import TrainState
from rlvr_jax.types import Rollout

Array = jax.Array


def _split(tree: Any, num: int) -> Any:
    """Leading axis N -> (num, N // num)."""
    return jax.tree.map(lambda x: x.reshape(num, x.shape[0] // num, *x.shape[1:]), tree)


def _loss(
    params: Params,
    mb: TrainRows,
    normalizer: Array,
    *,
    model_cfg: ModelConfig,
    rl: RLConfig,
    grouped: bool,
) -> tuple[Array, dict[str, Array]]:
    """The policy loss of some rows, normalised by `normalizer` (that of the batch they are
    part of), and its metrics; `grouped`: the rows are whole groups in order."""
    logp_NT, entropy_NT = rows_lib.policy_logprobs(params, mb.seq, model_cfg, rl, grouped)
    old_logp_NT = jax.lax.stop_gradient(logp_NT) if mb.old_logp_NT is None else mb.old_logp_NT
    return losses.policy_loss(
        logp_NT,
        old_logp_NT,
        mb.adv_N,
        mb.loss_mask_NT,
        rl.loss,
        normalizer=normalizer,
        ref_logp_NT=mb.ref_logp_NT,
        sampler_logp_NT=mb.sampler_logp_NT,
        entropy_NT=entropy_NT,
    )


def _normalizer(rows: TrainRows, rl: RLConfig) -> Array:
    T = rows.loss_mask_NT.shape[1]
    return losses.loss_normalizer(rows.loss_mask_NT, rl.loss.aggregation, T)


def optimizer_passes(
    state: TrainState,
    rows: TrainRows,
    key: Array,
    model_cfg: ModelConfig,
    rl: RLConfig,
    optimizer: optax.GradientTransformation,
) -> tuple[tuple[Params, optax.OptState, Array], dict[str, Array]]:
    """`rl.mu x rl.num_minibatches` optimizer updates on the rows.

    Args:
      state: the pre-update state.
      rows: the prepared rows.
      key: the PRNG key of the passes' shuffles.
      model_cfg: the architecture.
      rl: the algorithm.
      optimizer: the optax transformation.

    Returns:
      (params, opt_state, step) after the updates, and the stacked metrics: the loss's, with
      leaves (mu, num_minibatches, num_microbatches), and "grad_norm", "update_norm" with leaves
      (mu, num_minibatches).
    """
    N = rows.adv_N.shape[0]
    grouped = rl.microbatches_hold_groups(N)
    grad_fn = jax.grad(
        functools.partial(_loss, model_cfg=model_cfg, rl=rl, grouped=grouped), has_aux=True
    )

    def minibatch(carry, mb: TrainRows):
        params, opt_state, step = carry
        normalizer = _normalizer(mb, rl)

        def accumulate(grads, micro: TrainRows):
            g, metrics = grad_fn(params, micro, normalizer)
            return jax.tree.map(jnp.add, grads, g), metrics

        zeros = jax.tree.map(jnp.zeros_like, params)
        grads, metrics = jax.lax.scan(accumulate, zeros, _split(mb, rl.microbatch_count()))
        updates, opt_state = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        metrics = dict(metrics)
        metrics["grad_norm"] = optax.global_norm(grads)
        metrics["update_norm"] = optax.global_norm(updates)
        return (new_params, opt_state, step + 1), metrics

    def one_pass(carry, pass_key):
        shuffled = rows  # one minibatch: nothing to shuffle across
        if rl.num_minibatches > 1:
            shuffled = jax.tree.map(lambda x: x[jax.random.permutation(pass_key, N)], rows)
        return jax.lax.scan(minibatch, carry, _split(shuffled, rl.num_minibatches))

    carry = (state.params, state.opt_state, state.step)
    return jax.lax.scan(one_pass, carry, jax.random.split(key, rl.mu))


def group_grad_norms(
    params: Params, rows: TrainRows, model_cfg: ModelConfig, rl: RLConfig
) -> Array:
    """(B,) global norms of each prompt's share of the full-batch gradient at `params`.

    Rows b*G..(b+1)*G are prompt b's; with the whole batch's normaliser, the gradients of the
    groups sum to the full-batch gradient. lax.map keeps one gradient live at a time.
    """
    G = rl.group_size
    normalizer = _normalizer(rows, rl)
    by_group = jax.tree.map(lambda x: x.reshape(x.shape[0] // G, G, *x.shape[1:]), rows)
    loss = functools.partial(_loss, model_cfg=model_cfg, rl=rl, grouped=True)
    group_grad = jax.grad(loss, has_aux=True)
    return jax.lax.map(
        lambda one: optax.global_norm(group_grad(params, one, normalizer)[0]), by_group
    )


def update(
    state: TrainState,
    rollout: Rollout,
    rewards_N: Array,
    parts: dict[str, Array],
    *,
    model_cfg: ModelConfig,
    rl: RLConfig,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
) -> tuple[TrainState, StepOutput]:
    """Prepares the rows, runs the optimizer passes and gathers the step's metrics.

    Args:
      state: the pre-update state; its key is split for the passes' shuffles.
      rollout: N = B * G rows.
      rewards_N: the verifier's rewards.
      parts: the verifier's per-row parts (see `rows.prepare_rows`).
      model_cfg: the architecture.
      rl: the algorithm.
      optimizer: the optax transformation.
      schedule: the learning-rate schedule (logged at the step's first update).

    Returns:
      The new state and the step's output.
    """
    rl.check_rows(rollout.prompt_NP.shape[0])
    rng, pass_key = jax.random.split(state.rng)
    rows, rewards_N, adv_stats = rows_lib.prepare_rows(
        state, rollout, rewards_N, parts, model_cfg, rl
    )
    (params, opt_state, step), stacked = optimizer_passes(
        state, rows, pass_key, model_cfg, rl, optimizer
    )
    results = row_results(rollout, rewards_N, rows.adv_N, parts)
    metrics = {
        **pass_metrics(stacked),
        **adv_stats,
        **rollout_metrics(rollout, rewards_N, parts),
        "learning_rate": schedule(state.step),
        "loss/tokens": jnp.sum(rows.loss_mask_NT.astype(jnp.float32)),
    }
    if rl.group_grad_norms:
        metrics["groups/grad_norm"] = group_grad_norms(state.params, rows, model_cfg, rl)
        metrics["groups/success_rate"] = jnp.mean(results.correct_N.reshape(-1, rl.group_size), 1)
    new_state = TrainState(
        step=step, params=params, opt_state=opt_state, ref_params=state.ref_params, rng=rng
    )
    return new_state, StepOutput(metrics, results)
