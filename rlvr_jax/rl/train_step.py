"""One RL step: rollout -> rewards -> `update.update` (rows, optimizer passes, metrics).

Two ways to run it, on the same mesh and the same parameter buffers:
- `build_train_step(..., reward_fn)`: the reward is a JAX function of the sampled tokens (an
  in-graph verifier), so rollout, reward, advantages and every minibatch update are one jitted
  program.
- `build_rollout` + host verifier + `build_update`: when the verifier needs Python on text, the
  rollout is one jitted program, the rewards are computed on the host, and the update another.

Both updates return `(state, StepOutput)`: scalar metrics and per-row results (`RowResults`),
replicated; the metrics include the useful trajectories and sampled tokens of the rows trained
on (`outputs.with_useful_metrics`). Rows are ordered `b * G + g` (sample g of prompt b) throughout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from rlvr_jax.model import sharding
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import Params
from rlvr_jax.rl import sharding_plan
from rlvr_jax.rl.config import RLConfig
from rlvr_jax.rl.outputs import StepOutput, with_useful_metrics
from rlvr_jax.rl.packing import Packing
from rlvr_jax.rl.state import TrainState
from rlvr_jax.rl.update import check_router_aux, update
from rlvr_jax.sampling.config import SamplingParams
from rlvr_jax.sampling.continuous import generate_continuous
from rlvr_jax.sampling.loop import generate, init_decode_cache
from rlvr_jax.types import Rollout

Array = jax.Array
# reward_fn(rollout, targets) -> (rewards_N f32, {part name: part_N f32}); jittable.
RewardFn = Callable[[Rollout, Any], tuple[Array, dict[str, Array]]]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Batch:
    """One step's prompts, already repeated G times and left-padded, and verifier targets."""

    prompt_NP: Array  # (N, P) int32
    prompt_lengths_N: Array  # (N,) int32
    targets: Any = None  # per-row pytree for an in-graph verifier; None for host verifiers


def split_rollout_key(state: TrainState) -> tuple[TrainState, Array]:
    """Takes the rollout's PRNG key from the state (the fused step does the same)."""
    rng, sample_rng = jax.random.split(state.rng)
    return dataclasses.replace(state, rng=rng), sample_rng


def _rollout(
    params: Params,
    batch: Batch,
    rng: Array,
    model_cfg: ModelConfig,
    rl: RLConfig,
    mesh: jax.sharding.Mesh | None,
) -> Rollout:
    """Samples G completions of every prompt at the configured temperature, top-p and min-p."""
    N, P = batch.prompt_NP.shape
    full_N = lambda x: jnp.full((N,), x, jnp.float32)  # noqa: E731
    sp = SamplingParams(full_N(rl.temperature), full_N(rl.top_p), full_N(rl.min_p))
    sampler = rl.sampler
    if rl.shared_prompt_forward and sampler.prompt_group == 1:
        sampler = dataclasses.replace(sampler, prompt_group=rl.group_size)  # one prefill a group
    slots = rl.slots_for(N)
    cache = None
    if mesh is not None:  # the cache's own layout (see model/sharding.py), not left to propagation
        cache = init_decode_cache(model_cfg, sampler, slots, P)
        cache = sharding.shard_decode_cache(cache, model_cfg, mesh)
    args = (params, batch.prompt_NP, batch.prompt_lengths_N, rng, sp, cache)
    if slots < N:  # continuous batching: a slot takes the next row when its row ends
        rollout, stats, _ = generate_continuous(
            *args, model_cfg=model_cfg, cfg=sampler, num_slots=slots
        )
        steps, slot_steps = stats.decode_steps, stats.total_slot_steps
    else:  # every row decodes until the longest ends
        rollout, _ = generate(*args, model_cfg=model_cfg, cfg=sampler)
        longest = jnp.max(rollout.lengths_N)
        steps, slot_steps = longest - 1, N * longest
    return dataclasses.replace(
        rollout,
        decode_steps_N=jnp.full((N,), steps, jnp.int32),
        slot_steps_N=jnp.full((N,), slot_steps / N, jnp.float32),
    )


def build_train_step(
    model_cfg: ModelConfig,
    rl: RLConfig,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    reward_fn: RewardFn,
    shardings: sharding_plan.StepShardings | None = None,
) -> Callable[[TrainState, Batch], tuple[TrainState, StepOutput]]:
    """The whole step as one jitted program (the state is donated): `(state, batch) ->
    (state, StepOutput)`. `reward_fn(rollout, batch.targets)` must be jittable.

    With `shardings` (`sharding_plan.plan_step`) the state keeps its planned layout from step to
    step, the batch's rows are split over the mesh, the decode cache gets its own layout and
    the output comes back replicated; the state and batch must already be placed on the plan
    (`sharding.place`).
    """
    check_router_aux(model_cfg, rl)
    mesh = None if shardings is None else shardings.mesh

    def step(state: TrainState, batch: Batch) -> tuple[TrainState, StepOutput]:
        with sharding.activation_mesh(mesh):
            state, sample_rng = split_rollout_key(state)
            rollout = _rollout(state.params, batch, sample_rng, model_cfg, rl, mesh)
            rewards_N, parts = reward_fn(rollout, batch.targets)
            state, out = update(
                state,
                rollout,
                rewards_N,
                parts,
                model_cfg=model_cfg,
                rl=rl,
                optimizer=optimizer,
                schedule=schedule,
            )
            return state, with_useful_metrics(out, rollout, rewards_N, rl.group_size)

    if shardings is None:
        return jax.jit(step, donate_argnums=0)
    return jax.jit(
        step,
        in_shardings=(shardings.state, shardings.rows),
        out_shardings=(shardings.state, shardings.replicated),
        donate_argnums=0,
    )


def build_rollout(
    model_cfg: ModelConfig, rl: RLConfig, shardings: sharding_plan.StepShardings | None = None
) -> Callable[[Params, Batch, Array], Rollout]:
    """Jitted `(params, batch, rng) -> Rollout` for the host-verifier path.

    With `shardings`, the sampler runs with the batch's rows split over the mesh and returns the
    rollout replicated, so that every process can read all of it for the host verifier (the
    tokens are small next to the weights) and pass it back to `build_update`'s program.
    """
    mesh = None if shardings is None else shardings.mesh

    def rollout(params: Params, batch: Batch, rng: Array) -> Rollout:
        with sharding.activation_mesh(mesh):
            return _rollout(params, batch, rng, model_cfg, rl, mesh)

    if shardings is None:
        return jax.jit(rollout)
    rep = shardings.replicated
    return jax.jit(
        rollout, in_shardings=(shardings.state.params, shardings.rows, rep), out_shardings=rep
    )


def build_update(
    model_cfg: ModelConfig,
    rl: RLConfig,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    shardings: sharding_plan.StepShardings | None = None,
) -> Callable[..., tuple[TrainState, StepOutput]]:
    """Jitted `(state, rollout, rewards_N, parts[, packing, minibatch_packing]) -> (state,
    StepOutput)`; the state is donated. `packing` (`rl.packing.plan` of the rollout; None: the
    padded rows) and `minibatch_packing` (`rl.packing.plan_minibatches`, with several
    minibatches) are part of the program's shape: each packed shape compiles once.

    With `shardings`, the rollout (as `build_rollout` returns it), the host rewards and parts come
    in replicated (host numpy arrays are accepted on every process) and are split by rows inside
    the program; the state keeps its planned layout.
    """
    check_router_aux(model_cfg, rl)
    mesh = None if shardings is None else shardings.mesh

    def update_fn(
        state: TrainState,
        rollout: Rollout,
        rewards_N: Array,
        parts: dict[str, Array],
        packing: Packing | None = None,
        minibatch_packing: Packing | None = None,
    ) -> tuple[TrainState, StepOutput]:
        if shardings is not None:
            rollout, rewards_N, parts = jax.lax.with_sharding_constraint(
                (rollout, rewards_N, parts), shardings.rows
            )
        with sharding.activation_mesh(mesh):
            state, out = update(
                state,
                rollout,
                rewards_N,
                parts,
                model_cfg=model_cfg,
                rl=rl,
                optimizer=optimizer,
                schedule=schedule,
                packing=packing,
                minibatch_packing=minibatch_packing,
            )
            return state, with_useful_metrics(out, rollout, rewards_N, rl.group_size)

    if shardings is None:
        return jax.jit(update_fn, donate_argnums=0)
    rep = shardings.replicated
    return _OptionalPacking(
        jax.jit(
            update_fn,
            in_shardings=(shardings.state, rep, rep, rep, rep, rep),
            out_shardings=(shardings.state, rep),
            donate_argnums=0,
        )
    )


class _OptionalPacking:
    """A jitted update with explicit shardings, which take positional arguments only, called
    with or without its last ones (`packing`, `minibatch_packing`; None: the padded rows)."""

    def __init__(self, jitted: Any):
        self.jitted = jitted

    def __call__(self, state, rollout, rewards_N, parts, packing=None, minibatch_packing=None):
        return self.jitted(state, rollout, rewards_N, parts, packing, minibatch_packing)

    def lower(self, state, rollout, rewards_N, parts, packing=None, minibatch_packing=None):
        return self.jitted.lower(state, rollout, rewards_N, parts, packing, minibatch_packing)

    def _cache_size(self) -> int:
        return self.jitted._cache_size()
