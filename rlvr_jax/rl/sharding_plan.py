"""The shardings of the train state and of one RL step on the mesh (`model.sharding`'s table).

Parameters take their logical axes from `transformer.logical_axes` (LoRA adapters and int8
projections from `lora.params_logical_axes`); every subtree of the
optimizer state shaped like the parameters (Adam's moments, f32 master weights) takes the
parameters' sharding; counters and the rng are replicated. A separate critic's decoder is
sharded like the policy (same table), its value head and the head's moments replicated.
`plan_step` bundles them with the rows' sharding for `rl.train_step.build_*`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding

from rlvr_jax.model import lora as lora_lib
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.sharding import logical_spec, replicated, rows_sharding
from rlvr_jax.model.transformer import LoraParams, Params
from rlvr_jax.rl.state import CriticState, TrainState
from rlvr_jax.rl.value import CriticParams


def _is_names(x: Any) -> bool:
    return isinstance(x, tuple) and all(n is None or isinstance(n, str) for n in x)


def param_shardings(model_cfg: ModelConfig, mesh: Mesh, params: Params) -> Params:
    """A `Params` tree of NamedShardings for `params` (arrays or ShapeDtypeStructs); an
    `lm_head` of None (a critic's decoder) stays None, adapters and int8 projections are sharded
    by their own logical names (`lora.params_logical_axes`)."""
    return _by_names(lora_lib.params_logical_axes(model_cfg, params), params, mesh)


def _by_names(names: Any, tree: Any, mesh: Mesh) -> Any:
    return jax.tree.map(
        lambda names, x: NamedSharding(mesh, logical_spec(names, x.shape, mesh)),
        names,
        tree,
        is_leaf=_is_names,
    )


def mirror_params(tree: Any, model_cfg: ModelConfig, mesh: Mesh) -> Any:
    """Shardings of an optimizer state: each `Params`-shaped subtree is sharded like the
    parameters (by its own leaves' shapes, so any dtype works), every other leaf replicated."""

    def one(x):
        if isinstance(x, Params):
            return param_shardings(model_cfg, mesh, x)
        if isinstance(x, LoraParams):  # the optimizer state of a LoRA run's adapters
            names = lora_lib.adapter_logical_axes(model_cfg, x)
            return _by_names(names, x, mesh)
        return replicated(mesh)

    return jax.tree.map(one, tree, is_leaf=lambda x: isinstance(x, Params | LoraParams))


def critic_shardings(critic: CriticState, model_cfg: ModelConfig, mesh: Mesh) -> CriticState:
    """The shardings of a `CriticState` (concrete or abstract)."""
    rep = replicated(mesh)
    params = critic.params
    backbone = None
    if params.backbone is not None:
        backbone = param_shardings(model_cfg, mesh, params.backbone)
    return CriticState(
        step=rep,
        params=CriticParams(jax.tree.map(lambda _: rep, params.head), backbone),
        opt_state=mirror_params(critic.opt_state, model_cfg, mesh),
    )


def state_shardings(state: TrainState, model_cfg: ModelConfig, mesh: Mesh) -> TrainState:
    """The shardings of a `TrainState` (concrete or from `jax.eval_shape`)."""
    rep = replicated(mesh)
    critic = None if state.critic is None else critic_shardings(state.critic, model_cfg, mesh)
    return TrainState(
        step=rep,
        params=param_shardings(model_cfg, mesh, state.params),
        opt_state=mirror_params(state.opt_state, model_cfg, mesh),
        ref_params=(
            None if state.ref_params is None else param_shardings(model_cfg, mesh, state.ref_params)
        ),
        rng=rep,
        critic=critic,
    )


# ---------------------------------------------------------------------------------------------
# The plan of one step, and placing host values on it


@dataclasses.dataclass(frozen=True)
class StepShardings:
    """Everything `train_step.build_*` needs to pin a step to a mesh.

    Attributes:
      mesh: the device mesh.
      model_cfg: the architecture (for the decode cache's layout).
      state: a `TrainState` of NamedShardings.
      rows: the sharding of every per-row input (batch, rollout, rewards), a pytree prefix.
    """

    mesh: Mesh
    model_cfg: ModelConfig
    state: TrainState
    rows: NamedSharding

    @property
    def replicated(self) -> NamedSharding:
        return replicated(self.mesh)


def plan_step(
    state: TrainState, model_cfg: ModelConfig, mesh: Mesh, num_rows: int
) -> StepShardings:
    """The shardings of a step over `num_rows` rows for `state` (concrete or abstract)."""
    return StepShardings(
        mesh=mesh,
        model_cfg=model_cfg,
        state=state_shardings(state, model_cfg, mesh),
        rows=rows_sharding(mesh, num_rows),
    )
