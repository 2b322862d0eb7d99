"""The RL step fitted into device memory before its first step: `rl.num_microbatches="auto"`
and `mesh.seq="auto"` resolved from the step's programs compiled on its shapes (`rl.memory`).

`resolve_seq` runs before the train state is placed: for each seq split it builds that mesh,
plans the step on it and compiles on `jax.ShapeDtypeStruct`s carrying the plan's shardings, so
nothing is placed or allocated for the splits it rejects. `resolve_microbatches` runs on the
placed state of a mesh already chosen.

Host code: it builds and compiles programs and reads their memory analyses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from rlvr_jax.config_types import ConfigError
from rlvr_jax.envs.task import Task, host_part_shapes, jax_reward_fn
from rlvr_jax.model import sharding
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.program.settings import Settings, check_mesh, check_seq_split
from rlvr_jax.rl import memory as memory_lib
from rlvr_jax.rl import sharding_plan
from rlvr_jax.rl import state as state_lib
from rlvr_jax.rl import train_step as ts
from rlvr_jax.rl.config import RLConfig
from rlvr_jax.rl.state import TrainState


def update_args(
    rollout_program: Callable,
    params: Any,
    batch: ts.Batch,
    key: Any,
    task: Task,
    s: Settings,
    plan: sharding_plan.StepShardings,
) -> tuple[Any, jax.ShapeDtypeStruct, dict[str, jax.ShapeDtypeStruct]]:
    """The host path update's arguments after `rollout_program` on `batch`, abstract and as the
    step passes them: the rollout replicated (the rollout program's output), the rewards and
    parts host arrays (`host_part_shapes`; a lone "correct" part where the task names none)."""
    rep = plan.replicated
    rollout = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep),
        jax.eval_shape(rollout_program, params, batch, key),
    )
    N, T = rollout.tokens_NT.shape
    shapes = host_part_shapes(task, s.reward, s.rl.group_size, N, T)
    if shapes is None:
        row = jax.ShapeDtypeStruct((N,), jnp.float32)
        shapes = (row, {"correct": row})
    return (rollout, *shapes)


def step_memory(
    s: Settings,
    model_cfg: ModelConfig,
    task: Task,
    state: TrainState,
    batch: ts.Batch,
    plan: sharding_plan.StepShardings,
    fused: bool,
) -> Callable[[RLConfig], memory_lib.ProgramMemory]:
    """Compiles, for an `RLConfig`, the program whose memory the step's settings are fitted to,
    on the shapes and shardings of `state` and `batch` (arrays or ShapeDtypeStructs; nothing
    runs): the whole fused step where `fused` (an in-graph verifier), the update otherwise (the
    rollout depends on neither the microbatch count nor the seq split's memory)."""
    optimizer = state_lib.make_optimizer(s.optim)
    schedule = state_lib.learning_rate_schedule(s.optim)

    def measure(rl: RLConfig) -> memory_lib.ProgramMemory:
        if fused:
            reward_fn = jax_reward_fn(task, s.reward, rl.group_size)
            step = ts.build_train_step(model_cfg, rl, optimizer, schedule, reward_fn, plan)
            return memory_lib.program_memory(step.lower(state, batch).compile())
        rollout_program = ts.build_rollout(model_cfg, rl, plan)
        args = update_args(rollout_program, state.params, batch, jax.random.key(0), task, s, plan)
        update = ts.build_update(model_cfg, rl, optimizer, schedule, plan)
        return memory_lib.program_memory(update.lower(state, *args).compile())

    return measure


def resolve_microbatches(
    s: Settings,
    model_cfg: ModelConfig,
    task: Task,
    state: TrainState,
    batch: ts.Batch,
    plan: sharding_plan.StepShardings,
    fused: bool,
    log: Callable[[str], None] = print,
) -> Settings:
    """`s` with `rl.num_microbatches="auto"` replaced by the fewest microbatches whose step
    program (`step_memory`) fits the device's memory, compiled on the shapes of `state` and
    `batch` (nothing runs); other settings come back unchanged."""
    if not s.rl.auto_microbatches:
        return s
    measure = step_memory(s, model_cfg, task, state, batch, plan, fused)
    try:
        choice = memory_lib.fewest_microbatches(
            s.rl, batch.prompt_NP.shape[0], measure, memory_lib.memory_budget(s.rl)
        )
    except ValueError as e:
        raise ConfigError(str(e)) from e
    log(choice.summary())
    return dataclasses.replace(s, rl=dataclasses.replace(s.rl, num_microbatches=choice.count))


def seq_candidates(s: Settings, num_devices: int) -> list[sharding.MeshConfig]:
    """The meshes `mesh.seq="auto"` may choose from, smallest split first: seq a power of two
    that divides the devices the other axes leave to fsdp (which keeps the rest), every length
    the update splits over seq (`check_seq_split`), and a mesh whose row axes split the rows
    (`check_mesh`)."""
    base = dataclasses.replace(s.mesh, seq=1)
    check_mesh(dataclasses.replace(s, mesh=base), num_devices)
    fsdp = base.sizes(num_devices)["fsdp"]
    out = []
    seq = 1
    while fsdp % seq == 0:
        mesh = dataclasses.replace(base, fsdp=fsdp // seq, seq=seq)
        try:
            check_seq_split(dataclasses.replace(s, mesh=mesh))
            check_mesh(dataclasses.replace(s, mesh=mesh), num_devices)
            out.append(mesh)
        except ConfigError:
            pass
        seq *= 2
    return out


def resolve_seq(
    s: Settings,
    model_cfg: ModelConfig,
    task: Task,
    state: TrainState,
    batch: ts.Batch,
    fused: bool,
    log: Callable[[str], None] = print,
) -> Settings:
    """`s` with `mesh.seq="auto"` replaced by the smallest seq split (`seq_candidates`) whose
    step program fits the device's memory, and with `rl.num_microbatches="auto"` by that
    split's fewest microbatches (each split gets its own search); `s` itself when seq is a
    number.

    Args:
      state, batch: the train state and the step's longest batch, not yet placed: each
        candidate compiles on their shapes with its own plan's shardings.
      fused: whether the stage's step is one program (`rl_stage.fused_step`).

    Raises:
      ConfigError: when no split fits, naming the least memory needed and the budget.
    """
    if s.mesh.seq != "auto":
        return s
    rows = batch.prompt_NP.shape[0]
    meshes = {m.seq: m for m in seq_candidates(s, jax.device_count())}

    def search(seq: int) -> memory_lib.MicrobatchChoice:
        plan = sharding_plan.plan_step(state, model_cfg, sharding.make_mesh(meshes[seq]), rows)
        abstract = memory_lib.abstract_like
        shaped = abstract(state, plan.state), abstract(batch, plan.rows)
        measure = step_memory(s, model_cfg, task, *shaped, plan, fused)
        return memory_lib.microbatch_search(s.rl, rows, measure, budget)

    try:
        budget = memory_lib.memory_budget(s.rl, 'mesh.seq="auto"')
        choice = memory_lib.smallest_seq(list(meshes), search, budget)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    log(choice.summary(s.rl.auto_microbatches))
    rl = dataclasses.replace(s.rl, num_microbatches=choice.tried[-1][1].count)
    return dataclasses.replace(s, mesh=meshes[choice.seq], rl=rl)
