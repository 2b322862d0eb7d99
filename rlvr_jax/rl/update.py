"""The update half of an RL step: prepared rows -> optimizer passes -> metrics.

`mu` passes over the rows; each pass shuffles them (when there is more than one minibatch) and
makes `num_minibatches` optimizer updates, each from the gradients of `num_microbatches`
microbatches summed. Every microbatch's loss uses its minibatch's normaliser, so the sum is the
minibatch's gradient exactly (see `losses`), whatever the split.

With a value model (PPO, `rl.critic`), each microbatch's loss is the policy loss plus
`value_coef` times the value loss, differentiated with respect to the policy and the critic at
once; the critic's optimizer steps beside the policy's, and during the critic's warm-up the
policy's weights, optimizer state and update count are left as they were.

A policy with LoRA adapters (`Params.lora`) is differentiated with respect to its adapters only
(`lora.trainable`); its frozen base never gets a gradient.

A mixture-of-experts policy's forward also returns its routing of the positions that predict
the completion tokens (whichever forward the rows take: flat, shared-prompt or packed); each
microbatch logs its statistics over the trained tokens ("moe/*", `routing_terms`) and, with
`rl.loss.router_aux_coef` > 0, adds the router's load-balancing loss to the policy loss. A
dense policy computes what it did without them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from rlvr_jax.config_types import ConfigError
from rlvr_jax.model import lora as lora_lib
from rlvr_jax.model import moe as moe_lib
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import Params
from rlvr_jax.rl import losses
from rlvr_jax.rl import packing as packing_lib
from rlvr_jax.rl import rows as rows_lib
from rlvr_jax.rl import state as state_lib
from rlvr_jax.rl import value as value_lib
from rlvr_jax.rl.config import RLConfig
from rlvr_jax.rl.outputs import StepOutput, pass_metrics, rollout_metrics, row_results
from rlvr_jax.rl.packing import Packing
from rlvr_jax.rl.rows import TrainRows
from rlvr_jax.rl.state import CriticState, TrainState
from rlvr_jax.rl.value import CriticParams
from rlvr_jax.types import Rollout

Array = jax.Array


def _norm(tree) -> jax.Array:
    """The global norm of `tree` in f32 (a bf16 policy's gradients are bf16)."""
    return optax.global_norm(jax.tree.map(lambda x: x.astype(jnp.float32), tree))


def _split(tree: Any, num: int) -> Any:
    """Leading axis N -> (num, N // num)."""
    return jax.tree.map(lambda x: x.reshape(num, x.shape[0] // num, *x.shape[1:]), tree)


def _loss(
    params: Params,
    mb: TrainRows,
    normalizer: Array,
    token_count: Array,
    *,
    model_cfg: ModelConfig,
    rl: RLConfig,
    grouped: bool,
) -> tuple[Array, dict[str, Array]]:
    """The policy loss of some rows, normalised by `normalizer` (that of the batch they are
    part of), and its metrics; `token_count`: the batch's trained tokens (`routing_terms`);
    `grouped`: the rows are whole groups in order."""
    h_NTD, routed = rows_lib.routed_policy_hidden(params, mb.seq, model_cfg, rl, grouped)
    loss, metrics = _policy_loss(params, h_NTD, mb, normalizer, model_cfg, rl)
    return _with_routing_terms(loss, metrics, routed, mb, token_count, rl)


def routing_terms(
    routed: moe_lib.Routing,
    mask_NT: Array,
    token_count: Array,
    rl: RLConfig,
    sampler_experts_NTLk: Array | None = None,
) -> tuple[Array, dict[str, Array]]:
    """The router's part of a microbatch's loss, and its metrics, over its trained tokens.

    Args:
      routed: the routing of the positions that predict the rows' completion tokens, fields
        (L, N, T, ...).
      mask_NT: the tokens trained on (the loss mask).
      token_count: the trained tokens of the microbatch's minibatch: the load-balancing loss
        is a microbatch's own, weighted by its share of them, so the microbatches' terms sum
        to their token-weighted mean (the loss is not a sum over tokens).
      rl: reads `loss.router_aux_coef`.
      sampler_experts_NTLk: the experts the sampler chose for the same tokens
        (`Rollout.experts_NTLk`), or None.

    Returns:
      `router_aux_coef` x the weighted load-balancing loss (0. when the coefficient is 0), and
      "moe/aux_loss" (unweighted), "moe/load_min", "moe/load_max" (`moe.expert_load`),
      "moe/router_entropy" (`moe.router_entropy`) and, with the sampler's experts,
      "moe/routing_disagreement" (`moe.routing_disagreement`: the fraction of tokens whose
      top-k experts differ, in some layer, between the rollout and this forward), all
      constants of the gradient.
    """
    flat = lambda a: a.reshape(a.shape[0], -1, a.shape[-1])  # noqa: E731
    experts_LNk, probs_LNE = flat(routed.experts_Nk), flat(routed.probs_NE)
    mask_N = mask_NT.reshape(-1)
    aux = moe_lib.load_balancing_loss(probs_LNE, experts_LNk, mask_N)
    low, high = moe_lib.expert_load(experts_LNk, mask_N, probs_LNE.shape[-1])
    sg = jax.lax.stop_gradient
    metrics = {
        "moe/aux_loss": sg(aux),
        "moe/load_min": low,
        "moe/load_max": high,
        "moe/router_entropy": moe_lib.router_entropy(sg(probs_LNE), mask_N),
    }
    if sampler_experts_NTLk is not None:
        sampled_LNk = flat(jnp.moveaxis(sampler_experts_NTLk, 2, 0))
        metrics["moe/routing_disagreement"] = moe_lib.routing_disagreement(
            experts_LNk, sampled_LNk, mask_N
        )
    coef = rl.loss.router_aux_coef
    if not coef:
        return jnp.zeros((), jnp.float32), metrics
    share = jnp.sum(mask_N.astype(jnp.float32)) / jnp.maximum(token_count, 1.0)
    return coef * share * aux, metrics


def _with_routing_terms(
    loss: Array,
    metrics: dict[str, Array],
    routed: moe_lib.Routing | None,
    mb: TrainRows,
    token_count: Array,
    rl: RLConfig,
) -> tuple[Array, dict[str, Array]]:
    """The loss and metrics with `routing_terms` of `mb`'s trained tokens added (unchanged for
    a dense model)."""
    if routed is None:
        return loss, metrics
    term, moe_metrics = routing_terms(
        routed, mb.loss_mask_NT, token_count, rl, mb.sampler_experts_NTLk
    )
    return loss + term, {**metrics, **moe_metrics}


def check_router_aux(model_cfg: ModelConfig, rl: RLConfig) -> None:
    """Raises ConfigError for a router loss on a model without a router."""
    coef = rl.loss.router_aux_coef
    if coef and not model_cfg.is_moe:
        raise ConfigError(
            f"rl.loss.router_aux_coef={coef} with model_type={model_cfg.model_type!r}: a dense "
            "model has no router to balance; set rl.loss.router_aux_coef=0 or train an MoE model"
        )


def _policy_loss(
    params: Params,
    h_NTD: Array,
    mb: TrainRows,
    normalizer: Array,
    model_cfg: ModelConfig,
    rl: RLConfig,
) -> tuple[Array, dict[str, Array]]:
    logp_NT, entropy_NT = rows_lib.hidden_logprobs(params, h_NTD, mb.seq, model_cfg, rl)
    return _objective(logp_NT, entropy_NT, mb, normalizer, rl)


def _objective(
    logp_NT: Array, entropy_NT: Array, mb: TrainRows, normalizer: Array, rl: RLConfig
) -> tuple[Array, dict[str, Array]]:
    """The policy loss of rows whose log-probs and entropies are computed."""
    old_logp_NT = jax.lax.stop_gradient(logp_NT) if mb.old_logp_NT is None else mb.old_logp_NT
    return losses.policy_loss(
        logp_NT,
        old_logp_NT,
        mb.advantages,
        mb.loss_mask_NT,
        rl.loss,
        normalizer=normalizer,
        ref_logp_NT=mb.ref_logp_NT,
        sampler_logp_NT=mb.sampler_logp_NT,
        entropy_NT=entropy_NT,
    )


def _ppo_loss(
    params: Params,
    critic: CriticParams,
    mb: TrainRows,
    normalizer: Array,
    value_normalizer: Array,
    *,
    model_cfg: ModelConfig,
    rl: RLConfig,
    grouped: bool,
) -> tuple[Array, dict[str, Array]]:
    """The policy loss plus `value_coef` x the value loss (normalised by the minibatch's token
    count), with both terms' metrics: "loss/value" beside the policy's "loss/*"."""
    h_NTD, routed = rows_lib.routed_policy_hidden(params, mb.seq, model_cfg, rl, grouped)
    loss, metrics = _policy_loss(params, h_NTD, mb, normalizer, model_cfg, rl)
    loss, metrics = _with_routing_terms(loss, metrics, routed, mb, value_normalizer, rl)
    if critic.backbone is not None:
        h_NTD = rows_lib.policy_hidden(critic.backbone, mb.seq, model_cfg, rl, grouped)
    return _with_value_loss(loss, metrics, critic, h_NTD, mb, value_normalizer, rl)


def _packed_loss(
    params: Params,
    critic: CriticParams | None,
    m: Array,
    normalizer: Array,
    value_normalizer: Array,
    *,
    rows: TrainRows,
    packing: Packing,
    model_cfg: ModelConfig,
    rl: RLConfig,
) -> tuple[Array, dict[str, Array]]:
    """`_loss` (or `_ppo_loss` with a critic) of the rows packed into microbatch m: their
    log-probs come from its packed rows, the other rows leave the loss mask."""
    seq = rows.seq
    logp_NT, entropy_NT, h_NTD, routed = rows_lib.packed_microbatch(
        params, seq, model_cfg, rl, packing, m
    )
    mine = (packing.micro_N == m)[:, None]
    mb = dataclasses.replace(rows, loss_mask_NT=rows.loss_mask_NT & mine)
    loss, metrics = _objective(logp_NT, entropy_NT, mb, normalizer, rl)
    loss, metrics = _with_routing_terms(loss, metrics, routed, mb, value_normalizer, rl)
    if critic is None:
        return loss, metrics
    if critic.backbone is not None:
        valid_NT = seq.mask_NS[:, seq.prompt_len :]
        h_NTD = packing_lib.packed_values_hidden(
            critic.backbone, seq.tokens_NS, seq.positions_NS, valid_NT, packing, m, model_cfg
        )
    return _with_value_loss(loss, metrics, critic, h_NTD, mb, value_normalizer, rl)


def _with_value_loss(
    loss: Array,
    metrics: dict[str, Array],
    critic: CriticParams,
    h_NTD: Array,
    mb: TrainRows,
    value_normalizer: Array,
    rl: RLConfig,
) -> tuple[Array, dict[str, Array]]:
    """The policy loss plus `value_coef` x the value loss of the critic's head on `h_NTD`."""
    values_NT = value_lib.head_values(critic.head, h_NTD)
    v_loss, v_metrics = value_lib.value_loss(
        values_NT,
        mb.old_values_NT,
        mb.returns_NT,
        mb.loss_mask_NT,
        rl.critic.value_clip,
        value_normalizer,
    )
    v_loss = rl.critic.value_coef * v_loss
    metrics = {**metrics, **v_metrics, "loss/value": jax.lax.stop_gradient(v_loss)}
    return loss + v_loss, metrics


def _normalizer(rows: TrainRows, rl: RLConfig) -> Array:
    T = rows.loss_mask_NT.shape[1]
    return losses.loss_normalizer(rows.loss_mask_NT, rl.loss.aggregation, T)


Carry = tuple[Params, optax.OptState, Array, CriticState | None]


def minibatch_orders(rng: Array, num_rows: int, rl: RLConfig) -> Array:
    """(mu, N) int32: the row order each pass shuffles the rows into before splitting them
    into minibatches, as `update` draws it from the state's key `rng` (the host plans packed
    minibatches with it)."""
    _, pass_key = jax.random.split(rng)
    keys = jax.random.split(pass_key, rl.mu)
    return jnp.stack([jax.random.permutation(k, num_rows) for k in keys])


def optimizer_passes(
    state: TrainState,
    rows: TrainRows,
    key: Array,
    model_cfg: ModelConfig,
    rl: RLConfig,
    optimizer: optax.GradientTransformation,
    packing: Packing | None = None,
    minibatch_packing: Packing | None = None,
) -> tuple[Carry, dict[str, Array]]:
    """`rl.mu x rl.num_minibatches` optimizer updates on the rows.

    Args:
      state: the pre-update state.
      rows: the prepared rows.
      key: the PRNG key of the passes' shuffles.
      model_cfg: the architecture.
      rl: the algorithm.
      optimizer: the optax transformation.
      packing: the rows' packed layout (one minibatch); its microbatches replace
        `rl.num_microbatches` equal slices of the rows.
      minibatch_packing: with several minibatches, each minibatch's packed layout
        (`packing.plan_minibatches` on `minibatch_orders`), fields stacked (mu,
        num_minibatches, ...); its microbatches replace the minibatch's equal slices.

    Returns:
      (params, opt_state, step, critic) after the updates (critic None without a value model),
      and the stacked metrics: the loss's, with leaves (mu, num_minibatches, num_microbatches),
      and "grad_norm", "update_norm" (and the critic's "value/grad_norm") with leaves (mu,
      num_minibatches).
    """
    N = rows.adv_N.shape[0]
    grouped = rl.microbatches_hold_groups(N)
    with_critic = state.critic is not None
    if with_critic:
        critic_optimizer = state_lib.make_critic_optimizer(rl.critic)
    if packing is not None and rl.num_minibatches != 1:
        raise ValueError(
            f"rl.num_minibatches={rl.num_minibatches}: a packed update of several minibatches "
            "takes each minibatch's layout (minibatch_packing), not the rows' (packing)"
        )
    if minibatch_packing is not None and rl.num_minibatches == 1:
        raise ValueError("minibatch_packing needs rl.num_minibatches > 1; one takes packing")

    def loss_and_micro(mb: TrainRows, pk: Packing | None) -> tuple[Any, Any]:
        """The microbatch loss of minibatch `mb` and what its microbatches scan over: equal
        slices of its rows, or the microbatch indices of its packed layout `pk`."""
        if pk is None:
            full = _ppo_loss if with_critic else _loss
            loss_fn = functools.partial(full, model_cfg=model_cfg, rl=rl, grouped=grouped)
            return loss_fn, _split(mb, rl.microbatch_count())
        packed = functools.partial(_packed_loss, rows=mb, packing=pk, model_cfg=model_cfg, rl=rl)
        micro = jnp.arange(pk.num_microbatches)
        if with_critic:
            return packed, micro
        return (lambda p, m, *args: packed(p, None, m, *args)), micro

    def minibatch(carry: Carry, xs: TrainRows | tuple[TrainRows, Packing]):
        params, opt_state, step, critic = carry
        mb, pk = xs if minibatch_packing is not None else (xs, packing)
        loss_fn, micro_xs = loss_and_micro(mb, pk)
        normalizer = _normalizer(mb, rl)
        # Differentiated: the adapters of a LoRA policy (the base is closed over, so no
        # gradient of a full weight is formed), else all the parameters.
        policy = lora_lib.trainable(params)
        policy_loss = lambda p, *args: loss_fn(lora_lib.with_trainable(params, p), *args)  # noqa: E731
        token_count = losses.loss_normalizer(mb.loss_mask_NT, "token_mean")
        if with_critic:
            grad_fn = jax.grad(policy_loss, argnums=(0, 1), has_aux=True)
            trainable = (policy, critic.params)
            grads_of = lambda micro: grad_fn(*trainable, micro, normalizer, token_count)  # noqa: E731
        else:
            grad_fn = jax.grad(policy_loss, has_aux=True)
            trainable = policy
            grads_of = lambda micro: grad_fn(policy, micro, normalizer, token_count)  # noqa: E731

        def accumulate(grads, micro: TrainRows | Array):
            g, metrics = grads_of(micro)
            return jax.tree.map(jnp.add, grads, g), metrics

        zeros = jax.tree.map(jnp.zeros_like, trainable)
        grads, metrics = jax.lax.scan(accumulate, zeros, micro_xs)
        metrics = dict(metrics)
        if with_critic:
            grads, critic_grads = grads
            critic_updates, critic_opt = critic_optimizer.update(
                critic_grads, critic.opt_state, critic.params
            )
            new_critic = optax.apply_updates(critic.params, critic_updates)
            critic = dataclasses.replace(critic, params=new_critic, opt_state=critic_opt)
            metrics["value/grad_norm"] = _norm(critic_grads)
        updates, opt_state = optimizer.update(grads, opt_state, policy)
        new_params = lora_lib.with_trainable(params, optax.apply_updates(policy, updates))
        metrics["grad_norm"] = _norm(grads)
        metrics["update_norm"] = _norm(updates)
        return (new_params, opt_state, step + 1, critic), metrics

    def one_pass(carry, xs):
        pass_key, packs = xs
        shuffled = rows  # one minibatch: nothing to shuffle across
        if rl.num_minibatches > 1:
            # `minibatch_orders` draws the same order on the host.
            shuffled = jax.tree.map(lambda x: x[jax.random.permutation(pass_key, N)], rows)
        minibatches = _split(shuffled, rl.num_minibatches)
        return jax.lax.scan(
            minibatch, carry, minibatches if packs is None else (minibatches, packs)
        )

    carry = (state.params, state.opt_state, state.step, state.critic)
    passes = (jax.random.split(key, rl.mu), minibatch_packing)
    carry, stacked = jax.lax.scan(one_pass, carry, passes)
    if with_critic:
        carry = _critic_warmup(state, carry, rl)
    return carry, stacked


def _critic_warmup(state: TrainState, carry: Carry, rl: RLConfig) -> Carry:
    """The passes' result, with the policy's part put back as it was while the critic warms up
    (its first `rl.critic.warmup_steps` steps), and the critic's step counted."""
    params, opt_state, step, critic = carry
    critic = dataclasses.replace(critic, step=critic.step + 1)
    if not rl.critic.warmup_steps:
        return params, opt_state, step, critic
    warming = state.critic.step < rl.critic.warmup_steps
    keep = lambda old, new: jax.tree.map(lambda o, n: jnp.where(warming, o, n), old, new)  # noqa: E731
    return (
        keep(state.params, params),
        keep(state.opt_state, opt_state),
        keep(state.step, step),
        critic,
    )


def group_grad_norms(
    params: Params, rows: TrainRows, model_cfg: ModelConfig, rl: RLConfig
) -> Array:
    """(B,) global norms of each prompt's share of the full-batch gradient at `params`.

    Rows b*G..(b+1)*G are prompt b's; with the whole batch's normaliser, the gradients of the
    groups sum to the full-batch gradient. lax.map keeps one gradient live at a time.
    """
    G = rl.group_size
    normalizer = _normalizer(rows, rl)
    token_count = losses.loss_normalizer(rows.loss_mask_NT, "token_mean")
    by_group = jax.tree.map(lambda x: x.reshape(x.shape[0] // G, G, *x.shape[1:]), rows)
    loss = functools.partial(_loss, model_cfg=model_cfg, rl=rl, grouped=True)
    group_grad = jax.grad(
        lambda p, *args: loss(lora_lib.with_trainable(params, p), *args), has_aux=True
    )
    policy = lora_lib.trainable(params)
    return jax.lax.map(
        lambda one: _norm(group_grad(policy, one, normalizer, token_count)[0]),
        by_group,
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
    packing: Packing | None = None,
    minibatch_packing: Packing | None = None,
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
      packing: the packed layout of the rollout's rows (`rl.packing.plan`) for the frozen
        log-probs, the critic's values and, with one minibatch, the passes; None: padded rows.
      minibatch_packing: with several minibatches, each one's packed layout
        (`rl.packing.plan_minibatches`); None: padded minibatches.

    Returns:
      The new state and the step's output.
    """
    rl.check_rows(rollout.prompt_NP.shape[0])
    check_router_aux(model_cfg, rl)
    rng, pass_key = jax.random.split(state.rng)
    rows, rewards_N, adv_stats = rows_lib.prepare_rows(
        state, rollout, rewards_N, parts, model_cfg, rl, packing
    )
    (params, opt_state, step, critic), stacked = optimizer_passes(
        state,
        rows,
        pass_key,
        model_cfg,
        rl,
        optimizer,
        packing if rl.num_minibatches == 1 else None,
        minibatch_packing,
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
    if critic is not None:
        metrics["value/warmup"] = (state.critic.step < rl.critic.warmup_steps).astype(jnp.float32)
    new_state = TrainState(
        step=step,
        params=params,
        opt_state=opt_state,
        ref_params=state.ref_params,
        rng=rng,
        critic=critic,
    )
    return new_state, StepOutput(metrics, results)
