"""The rows an update trains on, prepared from one rollout and its rewards.

Sequences (prompt + completion), the loss mask, rewards -> advantages, and the frozen old and
reference log-probs (and, for PPO, the values at sampling time and the GAE return targets),
computed once per rollout before any optimizer update. Rows are ordered `b * G + g` (sample g
of prompt b) throughout.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.moe import Routing
from rlvr_jax.model.transformer import Params, positions_from_mask
from rlvr_jax.rl import advantages as adv_lib
from rlvr_jax.rl import losses
from rlvr_jax.rl import packing as packing_lib
from rlvr_jax.rl import state as state_lib
from rlvr_jax.rl import value as value_lib
from rlvr_jax.rl.config import RLConfig
from rlvr_jax.rl.logprobs import (
    routed_completion_hidden_states,
    routed_grouped_completion_hidden_states,
    token_logprobs,
)
from rlvr_jax.rl.packing import Packing
from rlvr_jax.rl.state import TrainState
from rlvr_jax.types import FINISH_LENGTH, Rollout

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Sequences:
    """Prompt + completion tokens of each row, S = P + T, as the model reads them."""

    tokens_NS: Array  # (N, S) int32
    mask_NS: Array  # (N, S) bool: real tokens (left padding of the prompt is not)
    positions_NS: Array  # (N, S) int32 RoPE positions
    prompt_len: int = dataclasses.field(metadata=dict(static=True))  # P


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainRows:
    """Per-row training data, sliced into minibatches and microbatches along N."""

    seq: Sequences
    loss_mask_NT: Array  # (N, T) bool: completion tokens that enter the loss
    adv_N: Array  # (N,) f32; with GAE each row's mean over its loss tokens (for the results)
    old_logp_NT: Array | None  # None on-policy: the ratio's denominator is the current policy
    ref_logp_NT: Array | None  # None without a reference model
    sampler_logp_NT: Array  # what the sampler reported, for the mismatch and TIS
    adv_NT: Array | None = None  # (N, T) f32 per-token advantages (GAE); None: adv_N broadcast
    old_values_NT: Array | None = None  # (N, T) f32 values at sampling time (PPO)
    returns_NT: Array | None = None  # (N, T) f32 GAE return targets (PPO)
    # An MoE policy's experts of each token as the sampler routed it (`Rollout.experts_NTLk`);
    # None where the rollout has none.
    sampler_experts_NTLk: Array | None = None

    @property
    def advantages(self) -> Array:
        """What the loss multiplies: (N, T) per token with GAE, else (N,) per row."""
        return self.adv_N if self.adv_NT is None else self.adv_NT


def sequences(rollout: Rollout) -> Sequences:
    """Prompt + completion tokens, their mask and positions."""
    N, P = rollout.prompt_NP.shape
    prompt_mask_NP = jnp.arange(P)[None, :] >= (P - rollout.prompt_lengths_N)[:, None]
    mask_NS = jnp.concatenate([prompt_mask_NP, rollout.mask_NT], axis=1)
    tokens_NS = jnp.concatenate([rollout.prompt_NP, rollout.tokens_NT], axis=1)
    return Sequences(tokens_NS, mask_NS, positions_from_mask(mask_NS), P)


def policy_hidden(
    params: Params, seq: Sequences, model_cfg: ModelConfig, rl: RLConfig, grouped: bool
) -> Array:
    """(N, T, D) final-norm hidden states that predict each completion token (and whose value
    is that token's state value).

    Args:
      params: the policy, reference or critic weights.
      seq: the rows' sequences.
      model_cfg: the architecture.
      rl: reads `shared_prompt_forward`, `group_size`.
      grouped: the rows are whole groups in order, so each group's prompt can run once.
    """
    return routed_policy_hidden(params, seq, model_cfg, rl, grouped)[0]


def routed_policy_hidden(
    params: Params, seq: Sequences, model_cfg: ModelConfig, rl: RLConfig, grouped: bool
) -> tuple[Array, Routing | None]:
    """`policy_hidden`, and the routing of the same positions (those that predict the
    completion tokens), fields (L, N, T, ...); None for a dense model."""
    if grouped and rl.shared_prompt_forward:
        return routed_grouped_completion_hidden_states(
            params,
            seq.tokens_NS,
            seq.positions_NS,
            model_cfg,
            seq.mask_NS,
            group_size=rl.group_size,
            prompt_len=seq.prompt_len,
        )
    return routed_completion_hidden_states(
        params, seq.tokens_NS, seq.positions_NS, model_cfg, seq.mask_NS, seq.prompt_len
    )


def hidden_logprobs(
    params: Params, h_NTD: Array, seq: Sequences, model_cfg: ModelConfig, rl: RLConfig
) -> tuple[Array, Array]:
    """Log-probs and entropies (each (N, T) f32) of the completion tokens from `policy_hidden`'s
    states, at the sampling temperature (chunked by `rl.logprob_chunk`)."""
    targets_NT = seq.tokens_NS[:, seq.prompt_len :]
    return token_logprobs(params, h_NTD, targets_NT, model_cfg, rl.logprob_chunk, rl.temperature)


def policy_logprobs(
    params: Params, seq: Sequences, model_cfg: ModelConfig, rl: RLConfig, grouped: bool
) -> tuple[Array, Array]:
    """Log-probs and entropies (each (N, T) f32) of the completion tokens at the sampling
    temperature; arguments as `policy_hidden`."""
    h_NTD = policy_hidden(params, seq, model_cfg, rl, grouped)
    return hidden_logprobs(params, h_NTD, seq, model_cfg, rl)


def packed_microbatch(
    params: Params, seq: Sequences, model_cfg: ModelConfig, rl: RLConfig, packing: Packing, m
) -> tuple[Array, Array, Array, Routing | None]:
    """`packing.packed_logprobs` of microbatch m's completion tokens: log-probs, entropies
    (N, T), the hidden states (N, T, D) that predict them and an MoE model's routing of those
    states, fields (L, N, T, ...); zero outside microbatch m."""
    return packing_lib.packed_logprobs(
        params,
        seq.tokens_NS,
        seq.positions_NS,
        seq.mask_NS[:, seq.prompt_len :],
        packing,
        m,
        model_cfg,
        rl.logprob_chunk,
        rl.temperature,
    )


def packed_all(
    params: Params,
    seq: Sequences,
    model_cfg: ModelConfig,
    rl: RLConfig,
    packing: Packing,
    with_hidden: bool = False,
) -> tuple[Array, Array | None]:
    """`packing.all_logprobs` of the rows' completion tokens: log-probs (N, T) and, with
    `with_hidden`, the hidden states (N, T, D) that predict them."""
    valid_NT = seq.mask_NS[:, seq.prompt_len :]
    return packing_lib.all_logprobs(
        params,
        seq.tokens_NS,
        seq.positions_NS,
        valid_NT,
        packing,
        model_cfg,
        rl.logprob_chunk,
        rl.temperature,
        with_hidden,
    )


def _frozen_logprobs(
    params: Params,
    seq: Sequences,
    model_cfg: ModelConfig,
    rl: RLConfig,
    packing: Packing | None = None,
) -> Array:
    """Log-probs that are constants of the update (old policy, reference); whole groups, or
    the packed rows."""
    if packing is not None:
        return jax.lax.stop_gradient(packed_all(params, seq, model_cfg, rl, packing)[0])
    return jax.lax.stop_gradient(policy_logprobs(params, seq, model_cfg, rl, grouped=True)[0])


def _loss_mask(rollout: Rollout, rl: RLConfig) -> Array:
    """Sampled completion tokens; injected tokens (forced, not sampled) are context only."""
    mask_NT = rollout.mask_NT & ~rollout.injected_NT
    if rl.mask_truncated:
        mask_NT = mask_NT & (rollout.finish_N != FINISH_LENGTH)[:, None]
    return mask_NT


def critic_values(
    state: TrainState,
    seq: Sequences,
    model_cfg: ModelConfig,
    rl: RLConfig,
    grouped: bool,
    h_NTD: Array | None = None,
    packing: Packing | None = None,
) -> Array:
    """(N, T) f32 values of the completion's states under `state.critic`: its head on the
    policy's hidden states (`h_NTD` when the caller has them) or on a separate critic's."""
    critic = state.critic.params
    if critic.backbone is not None and packing is not None:
        h_NTD = packed_all(critic.backbone, seq, model_cfg, rl, packing, with_hidden=True)[1]
    elif critic.backbone is not None:
        h_NTD = policy_hidden(critic.backbone, seq, model_cfg, rl, grouped)
    elif h_NTD is None:
        h_NTD = policy_hidden(state.params, seq, model_cfg, rl, grouped)
    return value_lib.head_values(critic.head, h_NTD)


def _gae_rows(
    state: TrainState,
    rollout: Rollout,
    rewards_N: Array,
    seq: Sequences,
    loss_mask_NT: Array,
    ref_logp_NT: Array | None,
    model_cfg: ModelConfig,
    rl: RLConfig,
    packing: Packing | None = None,
) -> tuple[TrainRows, dict[str, Array]]:
    """PPO's rows: per-token rewards -> the critic's values at sampling time -> GAE."""
    actions_NT = rollout.mask_NT & ~rollout.injected_NT
    kl_NT = None
    if rl.loss.kl_in_reward:
        kl_NT = losses.kl_penalty(rollout.logp_NT, ref_logp_NT, rl.loss.kl_estimator)
    r_NT = adv_lib.token_rewards(rewards_N, actions_NT, kl_NT, rl.loss.kl_beta)
    h_NTD = packed_logp_NT = None
    if state.critic.params.backbone is None:  # the head reads the policy's states: one forward
        if packing is None:
            h_NTD = policy_hidden(state.params, seq, model_cfg, rl, True)
        else:
            packed_logp_NT, h_NTD = packed_all(state.params, seq, model_cfg, rl, packing, True)
        h_NTD = jax.lax.stop_gradient(h_NTD)
    values_NT = critic_values(state, seq, model_cfg, rl, True, h_NTD, packing)
    values_NT = jax.lax.stop_gradient(values_NT)
    adv_NT, returns_NT, stats = adv_lib.gae_advantages(r_NT, values_NT, actions_NT, rl.advantage)
    stats.update(value_lib.value_stats(values_NT, returns_NT, actions_NT))
    old_logp_NT = None
    if not rl.on_policy:
        if packed_logp_NT is not None:
            old_logp_NT = jax.lax.stop_gradient(packed_logp_NT)
        elif h_NTD is None:
            old_logp_NT = _frozen_logprobs(state.params, seq, model_cfg, rl, packing)
        else:
            old_logp_NT = hidden_logprobs(state.params, h_NTD, seq, model_cfg, rl)[0]
    m_NT = loss_mask_NT.astype(jnp.float32)
    adv_N = jnp.sum(m_NT * adv_NT, axis=1) / jnp.maximum(jnp.sum(m_NT, axis=1), 1.0)
    rows = TrainRows(
        seq,
        loss_mask_NT,
        adv_N,
        old_logp_NT,
        ref_logp_NT,
        rollout.logp_NT,
        adv_NT=adv_NT,
        old_values_NT=values_NT,
        returns_NT=returns_NT,
        sampler_experts_NTLk=rollout.experts_NTLk,
    )
    return rows, stats


def prepare_rows(
    state: TrainState,
    rollout: Rollout,
    rewards_N: Array,
    parts: dict[str, Array],
    model_cfg: ModelConfig,
    rl: RLConfig,
    packing: Packing | None = None,
) -> tuple[TrainRows, Array, dict[str, Array]]:
    """Everything the optimizer passes need that does not change between them.

    Args:
      state: the pre-update state (the old policy and the reference weights).
      rollout: N = B * G rows.
      rewards_N: the verifier's rewards.
      parts: the verifier's per-row parts; "correct", when present, marks each row's success
        for the advantage statistics.
      model_cfg: the architecture.
      rl: the algorithm.
      packing: the packed layout of the rows (`rl.packing.plan`), for the frozen log-probs'
        forwards; None: the padded rows.

    Returns:
      rows: the training data.
      rewards_N: the rewards the advantages came from: the verifier's, less the KL penalty
        when `rl.loss.kl_in == "reward"` (for GAE, per token: `advantages.token_rewards`).
      adv_stats: the advantage estimator's f32 scalar statistics.
    """
    G = rl.group_size
    seq = sequences(rollout)
    loss_mask_NT = _loss_mask(rollout, rl)
    ref_logp_NT = None
    ref_params = state_lib.reference_params(state, rl.loss.kl_beta > 0)
    if ref_params is not None:
        ref_logp_NT = _frozen_logprobs(ref_params, seq, model_cfg, rl, packing)
    correct_BG = parts["correct"].reshape(-1, G) > 0 if "correct" in parts else None
    if rl.advantage.estimator == "gae":  # the KL penalty goes in per token, not summed
        rows, adv_stats = _gae_rows(
            state, rollout, rewards_N, seq, loss_mask_NT, ref_logp_NT, model_cfg, rl, packing
        )
    if rl.loss.kl_in_reward:
        rewards_N = losses.kl_penalized_rewards(
            rewards_N,
            rollout.logp_NT,
            ref_logp_NT,
            loss_mask_NT,
            rl.loss.kl_beta,
            rl.loss.kl_estimator,
        )
    if rl.advantage.estimator == "gae":
        r_BG = rewards_N.reshape(-1, G)
        group = adv_lib.group_stats(r_BG, r_BG > 0 if correct_BG is None else correct_BG)
        return rows, rewards_N, {**group, **adv_stats}
    # Whitening over tokens counts the policy's own tokens, not a tool's injected output (as
    # verl's response mask does).
    policy_tokens_N = jnp.sum(rollout.mask_NT & ~rollout.injected_NT, axis=1)
    adv_BG, adv_stats = adv_lib.compute_advantages(
        rewards_N.reshape(-1, G), rl.advantage, correct_BG, policy_tokens_N.reshape(-1, G)
    )
    adv_N = adv_BG.reshape(-1)
    if rl.advantage.estimator == "expert_iteration":
        # Rejected samples leave the loss, and its token count, entirely.
        loss_mask_NT = loss_mask_NT & (adv_N > 0)[:, None]
    old_logp_NT = None
    if not rl.on_policy:
        old_logp_NT = _frozen_logprobs(state.params, seq, model_cfg, rl, packing)
    rows = TrainRows(
        seq,
        loss_mask_NT,
        adv_N,
        old_logp_NT,
        ref_logp_NT,
        rollout.logp_NT,
        sampler_experts_NTLk=rollout.experts_NTLk,
    )
    return rows, rewards_N, adv_stats
