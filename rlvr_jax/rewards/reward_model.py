"""A learned reward model: a decoder with a scalar head, and its Bradley-Terry training.

The reward of a sequence (prompt, then response) is a scalar head (`model.heads.ScalarHead`, f32)
on the final-norm hidden state of its last real token: that position has attended to the whole
prompt and response. The decoder is the policy's architecture without the unembedding (the
score never reads logits), initialised from the policy's weights or any checkpoint that
`model.source` reads; the head starts at zero, so every pair starts at loss log 2.

Training minimises the Bradley-Terry negative log-likelihood of preference pairs,
`-log sigmoid(r_chosen - r_rejected)`, averaged over pairs (Christiano et al. 2017, Ouyang et
al. 2022). The loss depends on score differences only, so the scores' offset is free:
`RewardModelTask` can whiten them over a batch (`reward.rm_norm`).

A batch of pairs is one forward: chosen sequences in rows 0 .. N-1, the rejected ones in rows
N .. 2N-1 (`PairBatch`, made by `data.preferences.make_pair_batch`). Everything here is jittable.
"""

# Dataclass fields carry their shapes (tokens_MS), which N815 would read as mixedCase.
# ruff: noqa: N815

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.heads import ScalarHead, apply_scalar_head, init_scalar_head
from rlvr_jax.model.transformer import Params, hidden_states, positions_from_mask
from rlvr_jax.types import Rollout

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RewardModelParams:
    """The reward model's weights: a decoder without `lm_head`, and the scalar head."""

    backbone: Params
    head: ScalarHead


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PairBatch:
    """M = 2N sequences, each padded on either side: rows 0 .. N-1 are the chosen responses of
    N pairs, rows N .. 2N-1 the rejected ones in the same order."""

    tokens_MS: Array  # (M, S) int32
    mask_MS: Array  # (M, S) bool: real tokens
    last_M: Array  # (M,) int32: index of each row's last real token


def init_reward_model(policy: Params) -> RewardModelParams:
    """A reward model with the policy's decoder (copied, `lm_head` dropped) and a zero head."""
    # A copy: the train state is donated, and two of its leaves may not share a buffer.
    backbone = jax.tree.map(jnp.copy, dataclasses.replace(policy, lm_head=None))
    return RewardModelParams(backbone, init_scalar_head(policy.embed.shape[1]))


def sequence_scores(
    params: RewardModelParams, tokens_MS: Array, mask_MS: Array, last_M: Array, cfg: ModelConfig
) -> Array:
    """The reward of each sequence: the head on the hidden state of its last real token.

    Args:
      params: the reward model.
      tokens_MS: token ids, padded on the left, the right or both (padding is never attended to).
      mask_MS: real tokens; RoPE positions count them from 0 (`positions_from_mask`).
      last_M: the index of each row's last real token.
      cfg: the decoder's architecture.

    Returns:
      (M,) f32 scores.
    """
    positions_MS = positions_from_mask(mask_MS)
    h_MSD, _ = hidden_states(params.backbone, tokens_MS, positions_MS, cfg, mask_BT=mask_MS)
    h_MD = jnp.take_along_axis(h_MSD, last_M[:, None, None].astype(jnp.int32), axis=1)[:, 0]
    return apply_scalar_head(params.head, h_MD)


def pairwise_loss(chosen_N: Array, rejected_N: Array) -> tuple[Array, dict[str, Array]]:
    """The Bradley-Terry loss `mean(-log sigmoid(r_chosen - r_rejected))` over N pairs.

    Written as `softplus(-(r_c - r_r))`, which stays finite for any margin (log sigmoid of a
    large negative number underflows to -inf otherwise).

    Returns:
      The loss (f32 scalar) and metrics: "rm/accuracy" (fraction of pairs with
      r_chosen > r_rejected), "rm/margin" (mean r_chosen - r_rejected), "rm/score_mean".
    """
    margin_N = chosen_N.astype(jnp.float32) - rejected_N.astype(jnp.float32)
    loss = jnp.mean(jax.nn.softplus(-margin_N))
    metrics = {
        "rm/accuracy": jnp.mean((margin_N > 0).astype(jnp.float32)),
        "rm/margin": jnp.mean(margin_N),
        "rm/score_mean": 0.5 * jnp.mean(chosen_N + rejected_N),
    }
    return loss, jax.lax.stop_gradient(metrics)


def batch_loss(
    params: RewardModelParams, batch: PairBatch, cfg: ModelConfig
) -> tuple[Array, dict[str, Array]]:
    """`pairwise_loss` of a `PairBatch`, with one forward over its 2N rows."""
    scores_M = sequence_scores(params, batch.tokens_MS, batch.mask_MS, batch.last_M, cfg)
    N = scores_M.shape[0] // 2
    return pairwise_loss(scores_M[:N], scores_M[N:])


def build_rm_step(
    cfg: ModelConfig, optimizer: optax.GradientTransformation, schedule: optax.Schedule
) -> Callable[[Any, PairBatch], tuple[Any, dict[str, Array]]]:
    """The jitted update `(state, batch) -> (state, metrics)`; the state is donated.

    `state` is any dataclass with `step`, `params` (`RewardModelParams`) and `opt_state`
    (`rl.state.TrainState` in the stage), replaced with `dataclasses.replace`.
    """

    def step(state: Any, batch: PairBatch):
        (loss, metrics), grads = jax.value_and_grad(batch_loss, has_aux=True)(
            state.params, batch, cfg
        )
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        metrics = {
            **metrics,
            "rm/loss": loss,
            "rm/grad_norm": optax.global_norm(grads),
            "rm/lr": schedule(state.step),
        }
        new = dataclasses.replace(
            state,
            step=state.step + 1,
            params=optax.apply_updates(state.params, updates),
            opt_state=opt_state,
        )
        return new, metrics

    return jax.jit(step, donate_argnums=0)


def build_rm_eval(
    cfg: ModelConfig,
) -> Callable[[RewardModelParams, PairBatch], tuple[Array, dict[str, Array]]]:
    """The jitted `(params, batch) -> (loss, metrics)` of `batch_loss`, for held-out pairs."""
    return jax.jit(lambda params, batch: batch_loss(params, batch, cfg))


def rollout_sequences(rollout: Rollout) -> tuple[Array, Array, Array]:
    """A rollout's rows as scored sequences: (tokens_NS, mask_NS, last_N) with S = P + T, the
    left-padded prompt followed by the response (its end token included when it has one)."""
    P = rollout.prompt_NP.shape[1]
    prompt_mask_NP = jnp.arange(P)[None, :] >= (P - rollout.prompt_lengths_N)[:, None]
    tokens_NS = jnp.concatenate([rollout.prompt_NP, rollout.tokens_NT], axis=1)
    mask_NS = jnp.concatenate([prompt_mask_NP, rollout.mask_NT.astype(bool)], axis=1)
    # A row with an empty response is scored at its prompt's last token.
    last_N = P + rollout.lengths_N - 1
    return tokens_NS, mask_NS, last_N


def normalize_scores(scores_N: Array, norm: str) -> Array:
    """Scores as a reward part: "none" as they are, "batch" whitened over the N rows (mean 0,
    std 1; the Bradley-Terry scores have no fixed offset), "sigmoid" squashed into (0, 1)."""
    scores_N = scores_N.astype(jnp.float32)
    if norm == "none":
        return scores_N
    if norm == "batch":
        centred_N = scores_N - jnp.mean(scores_N)
        return centred_N / (jnp.std(scores_N) + 1e-6)
    if norm == "sigmoid":
        return jax.nn.sigmoid(scores_N)
    raise ValueError(f"norm={norm!r}; expected 'none', 'batch' or 'sigmoid'")


def rollout_scores(
    params: RewardModelParams, rollout: Rollout, cfg: ModelConfig, norm: str = "none"
) -> Array:
    """The reward model's (N,) f32 part for a rollout (`rollout_sequences`, then
    `normalize_scores`). Jit it with `cfg` and `norm` static."""
    tokens_NS, mask_NS, last_N = rollout_sequences(rollout)
    return normalize_scores(sequence_scores(params, tokens_NS, mask_NS, last_N, cfg), norm)
