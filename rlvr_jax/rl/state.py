"""The train state pytree and the optimizer (AdamW, warmup + cosine, global-norm clipping)."""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
import optax

from rlvr_jax.model.transformer import Params

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    """Everything a step reads and replaces. `ref_params` is None when no KL term is used."""

    step: Array  # () int32: optimizer updates applied so far
    params: Params
    opt_state: optax.OptState
    ref_params: Params | None
    rng: Array  # a PRNG key


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW with a linear warmup and a cosine (or constant) schedule.

    Attributes:
      learning_rate: peak learning rate.
      warmup_steps: linear warmup from 0 over this many optimizer updates.
      total_steps: updates over which the cosine decays to `min_lr_ratio * learning_rate`.
      schedule: "cosine" or "constant" (after the warmup).
      min_lr_ratio: the cosine's floor, as a fraction of the peak.
      weight_decay: decoupled weight decay (AdamW).
      b1, b2, eps: Adam moments.
      max_grad_norm: clip the gradient's global norm to this; 0 disables.
    """

    learning_rate: float = 1e-6
    warmup_steps: int = 0
    total_steps: int = 1000
    schedule: Literal["cosine", "constant"] = "cosine"
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    max_grad_norm: float = 1.0

    def __post_init__(self):
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate={self.learning_rate} must be positive")
        if self.schedule not in ("cosine", "constant"):
            raise ValueError(f"schedule={self.schedule!r}; expected 'cosine' or 'constant'")
        if self.warmup_steps < 0 or self.total_steps < 1:
            raise ValueError(
                f"warmup_steps={self.warmup_steps} must be >= 0 and total_steps="
                f"{self.total_steps} >= 1"
            )
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        if self.max_grad_norm < 0:
            raise ValueError(f"max_grad_norm={self.max_grad_norm} must be >= 0 (0 disables)")


def learning_rate_schedule(cfg: OptimConfig) -> optax.Schedule:
    """Learning rate as a function of the update count."""
    warmup = optax.linear_schedule(0.0, cfg.learning_rate, max(cfg.warmup_steps, 1))
    if cfg.schedule == "constant":
        after = optax.constant_schedule(cfg.learning_rate)
    else:
        after = optax.cosine_decay_schedule(
            cfg.learning_rate,
            max(cfg.total_steps - cfg.warmup_steps, 1),
            alpha=cfg.min_lr_ratio,
        )
    if cfg.warmup_steps == 0:
        return after
    return optax.join_schedules([warmup, after], [cfg.warmup_steps])


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW on the schedule. Moments are kept in f32."""
    parts = []
    if cfg.max_grad_norm:
        parts.append(optax.clip_by_global_norm(cfg.max_grad_norm))
    parts.append(
        optax.adamw(
            learning_rate_schedule(cfg),
            b1=cfg.b1,
            b2=cfg.b2,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            mu_dtype=jnp.float32,
        )
    )
    return optax.chain(*parts)


def init_train_state(
    params: Params,
    optimizer: optax.GradientTransformation,
    rng: Array,
    use_reference: bool,
) -> TrainState:
    """A fresh state; the reference is a copy of the initial parameters when `use_reference`."""
    ref = jax.tree.map(jnp.copy, params) if use_reference else None
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        ref_params=ref,
        rng=rng,
    )
