"""The train state pytree and the optimizers (AdamW, warmup + cosine, global-norm clipping)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax

from rlvr_jax.model import lora as lora_lib
from rlvr_jax.model.transformer import Params
from rlvr_jax.rl.value import CriticConfig, CriticParams

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CriticState:
    """PPO's value model and its optimizer (`rl.value`)."""

    step: Array  # () int32: RL steps the critic has trained on (its warm-up counts them)
    params: CriticParams
    opt_state: optax.OptState


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    """Everything a step reads and replaces. `ref_params` is None when no KL term is used or
    when the policy has LoRA adapters (its base is the reference), `critic` when there is no
    value model. With adapters, `opt_state` is the adapters' (`lora.trainable`)."""

    step: Array  # () int32: optimizer updates applied so far
    params: Params
    opt_state: optax.OptState
    ref_params: Params | None
    rng: Array  # a PRNG key
    critic: CriticState | None = None


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
      master_weights: keep an f32 copy of the parameters in the optimizer state and apply the
        updates to it; the parameters are its rounding to their own dtype. For bf16 parameters
        (4 more bytes per parameter): an update below bf16's resolution (|update| < 2^-8 |p|,
        e.g. lr 1e-6) is otherwise rounded away. Adam's moments are f32 either way.
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
    master_weights: bool = False

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
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay={self.weight_decay} must be >= 0")
        for name in ("b1", "b2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be in [0, 1)")
        if not self.eps > 0:
            raise ValueError(f"eps={self.eps} must be positive")


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


def _f32(tree: Any) -> Any:
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)


def f32_moments(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """`inner` on f32 gradients and parameters, so that every moment it keeps is f32 whatever
    the parameter dtype (optax's Adam keeps `nu` in the parameters' dtype). The updates stay f32;
    `optax.apply_updates` adds them in f32 and rounds the sum once to the parameter dtype."""

    def init(params):
        return inner.init(_f32(params))

    def update(updates, state, params=None):
        return inner.update(_f32(updates), state, None if params is None else _f32(params))

    return optax.GradientTransformation(init, update)


class MasterWeightsState(NamedTuple):
    master: Any  # the parameters in f32
    inner: optax.OptState


def f32_master_weights(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """`inner` applied to an f32 copy of the parameters kept in the optimizer state.

    The returned updates are `round(master) - params` in f32, so that `optax.apply_updates`
    leaves the parameters equal to the master copy rounded to their dtype.
    """

    def init(params):
        # A copy even for f32 parameters: the state is donated, two leaves may not share a buffer.
        master = jax.tree.map(lambda p: jnp.array(p, jnp.float32, copy=True), params)
        return MasterWeightsState(master, inner.init(master))

    def update(grads, state, params=None):
        if params is None:
            raise ValueError("f32_master_weights needs the parameters in update()")
        updates, inner_state = inner.update(_f32(grads), state.inner, state.master)
        master = optax.apply_updates(state.master, updates)
        delta = jax.tree.map(
            lambda m, p: m.astype(p.dtype).astype(jnp.float32) - p.astype(jnp.float32),
            master,
            params,
        )
        return delta, MasterWeightsState(master, inner_state)

    return optax.GradientTransformation(init, update)


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW on the schedule; gradients, moments (and master weights
    with `cfg.master_weights`) in f32 whatever the parameter dtype."""
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
    inner = optax.chain(*parts)
    return f32_master_weights(inner) if cfg.master_weights else f32_moments(inner)


def make_critic_optimizer(cfg: CriticConfig) -> optax.GradientTransformation:
    """The critic's optimizer: Adam at a constant `cfg.learning_rate`, its own clipping."""
    return make_optimizer(
        OptimConfig(
            learning_rate=cfg.learning_rate, schedule="constant", max_grad_norm=cfg.max_grad_norm
        )
    )


def init_critic_state(params: CriticParams, cfg: CriticConfig) -> CriticState:
    """A fresh critic state for `params` (`value.init_critic`)."""
    opt_state = make_critic_optimizer(cfg).init(params)
    return CriticState(jnp.zeros((), jnp.int32), params, opt_state)


def init_train_state(
    params: Params,
    optimizer: optax.GradientTransformation,
    rng: Array,
    use_reference: bool,
    critic: CriticState | None = None,
) -> TrainState:
    """A fresh state; the reference is a copy of the initial parameters when `use_reference`.

    With LoRA adapters (`params.lora`), the optimizer state covers the adapters only and no
    reference is stored: the base with the adapters off is the reference (`reference_params`).
    """
    ref = None
    if use_reference and lora_lib.adapters_of(params) is None:
        ref = jax.tree.map(jnp.copy, params)
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(lora_lib.trainable(params)),
        ref_params=ref,
        rng=rng,
        critic=critic,
    )


def reference_params(state: TrainState, use_reference: bool) -> Params | None:
    """The KL term's reference policy: the stored copy if the state has one; else, for a LoRA
    policy when `use_reference`, the same base weights with the adapters off (no copy)."""
    if state.ref_params is not None:
        return state.ref_params
    if use_reference and lora_lib.adapters_of(state.params) is not None:
        return lora_lib.without_adapters(state.params)
    return None
