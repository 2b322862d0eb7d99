"""The rows an update trains on, prepared from one rollout and its rewards.

Sequences (prompt + completion), the loss mask, rewards -> advantages, and the frozen old and
reference log-probs, computed once per rollout before any optimizer update. Rows are ordered
`b * G + g` (sample g of prompt b) throughout.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import Params, positions_from_mask
from rlvr_jax.rl import advantages as adv_lib
from rlvr_jax.rl import losses
from rlvr_jax.rl.config import RLConfig
from rlvr_jax.rl.logprobs import grouped_next_token_logprobs, next_token_logprobs
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
    adv_N: Array  # (N,) f32
    old_logp_NT: Array | None  # None on-policy: the ratio's denominator is the current policy
    ref_logp_NT: Array | None  # None without a reference model
    sampler_logp_NT: Array  # what the sampler reported, for the mismatch and TIS


def sequences(rollout: Rollout) -> Sequences:
    """Prompt + completion tokens, their mask and positions."""
    N, P = rollout.prompt_NP.shape
    prompt_mask_NP = jnp.arange(P)[None, :] >= (P - rollout.prompt_lengths_N)[:, None]
    mask_NS = jnp.concatenate([prompt_mask_NP, rollout.mask_NT], axis=1)
    tokens_NS = jnp.concatenate([rollout.prompt_NP, rollout.tokens_NT], axis=1)
    return Sequences(tokens_NS, mask_NS, positions_from_mask(mask_NS), P)


def policy_logprobs(
    params: Params, seq: Sequences, model_cfg: ModelConfig, rl: RLConfig, grouped: bool
) -> tuple[Array, Array]:
    """Log-probs and entropies (each (N, T) f32) of the completion tokens at the sampling
    temperature.

    Args:
      params: the policy or reference weights.
      seq: the rows' sequences.
      model_cfg: the architecture.
      rl: reads `shared_prompt_forward`, `group_size`, `logprob_chunk`, `temperature`.
      grouped: the rows are whole groups in order, so each group's prompt can run once.
    """
    if grouped and rl.shared_prompt_forward:
        return grouped_next_token_logprobs(
            params,
            seq.tokens_NS,
            seq.positions_NS,
            model_cfg,
            seq.mask_NS,
            group_size=rl.group_size,
            prompt_len=seq.prompt_len,
            chunk_size=rl.logprob_chunk,
            temperature=rl.temperature,
        )
    return next_token_logprobs(
        params,
        seq.tokens_NS,
        seq.positions_NS,
        model_cfg,
        seq.mask_NS,
        first_target=seq.prompt_len,
        chunk_size=rl.logprob_chunk,
        temperature=rl.temperature,
    )


def _frozen_logprobs(params: Params, seq: Sequences, model_cfg: ModelConfig, rl: RLConfig):
    """Log-probs that are constants of the update (old policy, reference); whole groups."""
    return jax.lax.stop_gradient(policy_logprobs(params, seq, model_cfg, rl, grouped=True)[0])


def _loss_mask(rollout: Rollout, rl: RLConfig) -> Array:
    """Sampled completion tokens; injected tokens (forced, not sampled) are context only."""
    mask_NT = rollout.mask_NT & ~rollout.injected_NT
    if rl.mask_truncated:
        mask_NT = mask_NT & (rollout.finish_N != FINISH_LENGTH)[:, None]
    return mask_NT


def prepare_rows(
    state: TrainState,
    rollout: Rollout,
    rewards_N: Array,
    parts: dict[str, Array],
    model_cfg: ModelConfig,
    rl: RLConfig,
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

    Returns:
      rows: the training data.
      rewards_N: the rewards the advantages came from: the verifier's, less the KL penalty
        when `rl.loss.kl_in == "reward"`.
      adv_stats: the advantage estimator's f32 scalar statistics.
    """
    G = rl.group_size
    seq = sequences(rollout)
    loss_mask_NT = _loss_mask(rollout, rl)
    ref_logp_NT = None
    if state.ref_params is not None:
        ref_logp_NT = _frozen_logprobs(state.ref_params, seq, model_cfg, rl)
    if rl.loss.kl_in_reward:
        rewards_N = losses.kl_penalized_rewards(
            rewards_N,
            rollout.logp_NT,
            ref_logp_NT,
            loss_mask_NT,
            rl.loss.kl_beta,
            rl.loss.kl_estimator,
        )
    correct_BG = parts["correct"].reshape(-1, G) > 0 if "correct" in parts else None
    adv_BG, adv_stats = adv_lib.compute_advantages(
        rewards_N.reshape(-1, G), rl.advantage, correct_BG, rollout.lengths_N.reshape(-1, G)
    )
    adv_N = adv_BG.reshape(-1)
    if rl.advantage.estimator == "expert_iteration":
        # Rejected samples leave the loss, and its token count, entirely.
        loss_mask_NT = loss_mask_NT & (adv_N > 0)[:, None]
    old_logp_NT = None
    if not rl.on_policy:
        old_logp_NT = _frozen_logprobs(state.params, seq, model_cfg, rl)
    rows = TrainRows(seq, loss_mask_NT, adv_N, old_logp_NT, ref_logp_NT, rollout.logp_NT)
    return rows, rewards_N, adv_stats
