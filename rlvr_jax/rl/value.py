"""PPO's value model: a value head on the policy's backbone or a separate critic, and its loss.

The value of position t of a completion is `V(s_t)`, the expected return of the prefix before
token t: a linear head (`ValueHead`, f32) on the final-norm hidden state that also predicts token
t (`rows.policy_hidden`). Two placements (`CriticConfig.kind`):

- "head": the head reads the policy's own hidden states. One forward serves the policy and the
  value loss, and the value loss's gradient reaches the shared backbone (scaled by
  `value_coef`), as in the original PPO's shared network. Only the head has its own optimizer.
- "model": a separate critic, a decoder of the policy's architecture with its own weights
  (initialised from the policy's or from another run's checkpoint) and its own optimizer state,
  as verl and OpenRLHF run PPO. Twice the weights and a second forward and backward per
  microbatch; the policy's backbone sees no value gradient.

Everything is jittable; the config is static (hashable).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import jax
import jax.numpy as jnp

from rlvr_jax.model.heads import ScalarHead, apply_scalar_head, init_scalar_head
from rlvr_jax.model.transformer import Params

Array = jax.Array

CriticKind = Literal["none", "head", "model"]
CRITIC_KINDS: tuple[str, ...] = ("none", "head", "model")

# `V = h . w + b` on a final-norm hidden state, in f32 (shared with the reward model).
ValueHead = ScalarHead


@dataclasses.dataclass(frozen=True)
class CriticConfig:
    """PPO's value model (used by `rl.advantage.estimator="gae"`, and only by it).

    Attributes:
      kind: "none" (no value model: the group-baseline estimators), "head" (a value head on the
        policy's backbone) or "model" (a separate critic); see the module docstring.
      init: where a separate critic's weights come from: "policy" (a copy of the policy's
        initial weights) or the workdir of an earlier run, whose newest checkpoint's policy
        weights are read (e.g. an SFT run, or a reward-model run). The head starts at zero
        (every value 0) either way.
      learning_rate: the critic optimizer's learning rate (the head's with kind="head"); Adam,
        constant, no weight decay.
      max_grad_norm: the critic's own gradient clipping (0 disables).
      value_coef: the value loss's weight in the summed loss; with kind="head" it sets how much
        the value loss pulls on the shared backbone.
      value_clip: None, or eps_v > 0: PPO's clipped value loss,
        `0.5 max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2)`, with `V_old` the
        values at sampling time and R the GAE return; None is the plain `0.5 (V - R)^2`.
      warmup_steps: steps during which only the critic learns (the policy's weights, optimizer
        state and update count do not change), so that the first policy updates see values
        that already fit the task (PPO-RLHF's critic warm-up).
    """

    kind: CriticKind = "none"
    init: str = "policy"
    learning_rate: float = 1e-5
    max_grad_norm: float = 1.0
    value_coef: float = 0.5
    value_clip: float | None = 0.2
    warmup_steps: int = 0

    def __post_init__(self):
        if self.kind not in CRITIC_KINDS:
            raise ValueError(f"rl.critic.kind={self.kind!r}; expected one of {CRITIC_KINDS}")
        for name, strict in (("learning_rate", True), ("max_grad_norm", False)):
            v = getattr(self, name)
            ok = isinstance(v, int | float) and math.isfinite(v) and (v > 0 if strict else v >= 0)
            if isinstance(v, bool) or not ok:
                raise ValueError(f"rl.critic.{name}={v!r} must be {'>' if strict else '>='} 0")
        v = self.value_coef
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
            raise ValueError(f"rl.critic.value_coef={v!r} must be > 0")
        v = self.value_clip
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not v > 0):
            raise ValueError(f"rl.critic.value_clip={v!r} must be > 0 or None")
        w = self.warmup_steps
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ValueError(f"rl.critic.warmup_steps={w!r} must be an integer >= 0")
        if not isinstance(self.init, str) or not self.init:
            raise ValueError(f"rl.critic.init={self.init!r}: 'policy' or a run's workdir")

    @property
    def enabled(self) -> bool:
        return self.kind != "none"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CriticParams:
    """The value model's trainable weights: the head, and a separate critic's decoder (None with
    kind="head"; its `lm_head` is dropped, the values never read logits)."""

    head: ValueHead
    backbone: Params | None = None


def init_head(embed_dim: int) -> ValueHead:
    """A zero head: every value starts at 0, the return's scale is learnt from the first batch."""
    return init_scalar_head(embed_dim)


def init_critic(cfg: CriticConfig, policy: Params, backbone: Params | None = None) -> CriticParams:
    """The critic's initial weights.

    Args:
      cfg: the critic settings (`kind` must not be "none").
      policy: the policy's weights (for the head's size, and the copy with `init="policy"`).
      backbone: a separate critic's decoder weights read from elsewhere (`init` a workdir);
        None copies the policy's.
    """
    if not cfg.enabled:
        raise ValueError("rl.critic.kind='none' has no critic to initialise")
    head = init_head(policy.embed.shape[1])
    if cfg.kind == "head":
        return CriticParams(head)
    source = policy if backbone is None else backbone
    # A copy: the state is donated, and two of its leaves may not share a buffer.
    backbone = jax.tree.map(jnp.copy, dataclasses.replace(source, lm_head=None))
    return CriticParams(head, backbone)


def head_values(head: ValueHead, h_NTD: Array) -> Array:
    """(N, T) f32 values of final-norm hidden states."""
    return apply_scalar_head(head, h_NTD)


def value_loss(
    values_NT: Array,
    old_values_NT: Array,
    returns_NT: Array,
    mask_NT: Array,
    clip: float | None,
    normalizer: Array,
) -> tuple[Array, dict[str, Array]]:
    """PPO's (clipped) value loss, summed over the mask and divided by `normalizer`.

    As with the policy loss (`losses.policy_loss`), pass the whole minibatch's token count as
    `normalizer` to each of its microbatches: their losses and gradients then sum to the
    minibatch's exactly.

    Args:
      values_NT: the current values (differentiated).
      old_values_NT: the values at sampling time (constants).
      returns_NT: the GAE return targets (constants).
      mask_NT: the tokens that enter the loss.
      clip: `CriticConfig.value_clip`.
      normalizer: the minibatch's number of loss tokens.

    Returns:
      The loss (f32 scalar) and metrics over this call's tokens: "value/clip_frac" (fraction
      of tokens where the clipped term is the larger), "value/error" (mean |V - R|).
    """
    mask_NT = mask_NT.astype(bool)
    clean = lambda x: jnp.where(mask_NT, x.astype(jnp.float32), 0.0)  # noqa: E731
    v_NT = clean(values_NT)
    old_NT, ret_NT = (jax.lax.stop_gradient(clean(x)) for x in (old_values_NT, returns_NT))
    loss_NT = 0.5 * jnp.square(v_NT - ret_NT)
    clipped_NT = jnp.zeros(mask_NT.shape, bool)
    if clip is not None:
        v_clip_NT = old_NT + jnp.clip(v_NT - old_NT, -clip, clip)
        loss_clip_NT = 0.5 * jnp.square(v_clip_NT - ret_NT)
        clipped_NT = loss_clip_NT > loss_NT
        loss_NT = jnp.maximum(loss_NT, loss_clip_NT)
    loss = jnp.sum(jnp.where(mask_NT, loss_NT, 0.0)) / normalizer
    n = jnp.maximum(jnp.sum(mask_NT.astype(jnp.float32)), 1.0)
    metrics = {
        "value/clip_frac": jnp.sum(clipped_NT & mask_NT) / n,
        "value/error": jnp.sum(jnp.where(mask_NT, jnp.abs(v_NT - ret_NT), 0.0)) / n,
    }
    return loss, jax.lax.stop_gradient(metrics)


def value_stats(values_NT: Array, returns_NT: Array, mask_NT: Array) -> dict[str, Array]:
    """How well the sampling-time values predict the returns: "value/mean", "value/returns_mean"
    and "value/explained_variance" = 1 - Var(R - V) / Var(R) over the tokens on the mask (1 is
    perfect, 0 no better than a constant, negative worse)."""
    m_NT = mask_NT.astype(jnp.float32)
    n = jnp.maximum(jnp.sum(m_NT), 1.0)
    mean = lambda x: jnp.sum(m_NT * x) / n  # noqa: E731
    var = lambda x: mean(jnp.square(x - mean(x)))  # noqa: E731
    var_r = var(returns_NT)
    return {
        "value/mean": mean(values_NT),
        "value/returns_mean": mean(returns_NT),
        "value/explained_variance": jnp.where(
            var_r > 0, 1.0 - var(returns_NT - values_NT) / jnp.where(var_r > 0, var_r, 1.0), 0.0
        ),
    }
