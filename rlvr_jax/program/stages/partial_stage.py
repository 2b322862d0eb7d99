"""Kimi k1.5's partial rollouts in the RL stage: the batch function and the sampler state that
carries the groups still running from step to step (and so through the checkpoint).

A step decodes rounds of at most `rl.partial_budget` tokens per row until B groups have ended
(`rl.partial`), verifies and trains on those; the rows still running wait in the data state,
which `PartialSampler` saves with the prompt sampler's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.data import curriculum as curriculum_lib
from rlvr_jax.data import templates
from rlvr_jax.envs.task import Task, host_rewards
from rlvr_jax.model import sharding
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.program.runtime import metrics as metrics_lib
from rlvr_jax.program.runtime import useful as useful_lib
from rlvr_jax.program.settings import Settings
from rlvr_jax.rl import partial as partial_lib
from rlvr_jax.rl import sharding_plan
from rlvr_jax.rl import train_step as ts
from rlvr_jax.rl.state import TrainState
from rlvr_jax.sampling.host import bucket_and_pad


@dataclasses.dataclass(frozen=True)
class PartialState:
    """The data state of a stage with partial rollouts: the prompt sampler's, and the groups
    started but not yet trained on, oldest first."""

    inner: Any
    pending: tuple[partial_lib.PendingGroup, ...] = ()


@dataclasses.dataclass(frozen=True)
class PartialSampler:
    """A prompt sampler whose state also holds the pending groups of partial rollouts, so that
    the checkpoint keeps them (`run.DataSampler`)."""

    inner: Any
    max_new_tokens: int
    pad_id: int

    def init(self, seed: int) -> PartialState:
        return PartialState(self.inner.init(seed))

    def state_dict(self, state: PartialState) -> dict:
        return {**self.inner.state_dict(state.inner), **partial_lib.to_arrays(state.pending)}

    def load_state_dict(self, d: dict) -> PartialState:
        own, pending = partial_lib.split_arrays(d)
        groups = partial_lib.from_arrays(pending, self.max_new_tokens, self.pad_id)
        return PartialState(self.inner.load_state_dict(own), tuple(groups))


def build_partial_batch(
    s: Settings,
    model_cfg: ModelConfig,
    task: Task,
    sampler: curriculum_lib.EpochSampler | curriculum_lib.CurriculumSampler,
    encoded: templates.EncodedPrompts,
    plan: sharding_plan.StepShardings,
    pad_id: int,
    timer: metrics_lib.StageTimer,
    update: Callable[..., tuple[TrainState, Any]],
) -> Callable[[TrainState, PartialState], tuple]:
    """The batch of a step with partial rollouts (`rl.partial`): rounds of at most
    `rl.partial_budget` tokens per row until B groups have ended, then `update` on them.
    Returns `(state, data_state) -> (state, data_state, output, metrics, attempts)`.

    Its useful-trajectory counts (`program.runtime.useful`): the tokens of every round, those
    of rows that finish in a later step included; the rows verified, only those of the B groups
    verified and trained on here: a row counts once, finished and verified, not per segment
    (a complete group left waiting counts in the step that takes it)."""
    G, B = s.rl.group_size, s.train.batch_prompts
    T = s.rl.sampler.max_new_tokens
    # A round: each row's prompt and tokens so far (so no prompt group), `budget` new tokens.
    segment_sampler = dataclasses.replace(
        s.rl.sampler, max_new_tokens=min(s.rl.partial_budget, T), prompt_group=1
    )
    segment_rl = dataclasses.replace(s.rl, sampler=segment_sampler, shared_prompt_forward=False)
    segment_fn = ts.build_rollout(model_cfg, segment_rl, plan)
    context_buckets = (*s.data.buckets, max(s.data.buckets) + T)

    def partial_round(state, groups):
        """Decodes up to the budget after each row of `groups`; returns the state, the tokens
        kept, the round's slot-steps and decode steps."""
        with timer.stage("rollout"):
            ctx = partial_lib.contexts(groups)
            prompt_NP, lengths_N = bucket_and_pad(ctx, context_buckets, pad_id)
            batch = ts.Batch(jnp.asarray(prompt_NP), jnp.asarray(lengths_N))
            version = int(jax.device_get(state.step))
            state, key = ts.split_rollout_key(state)
            seg = jax.device_get(segment_fn(state.params, sharding.place(batch, plan.rows), key))
        kept = partial_lib.absorb(groups, seg, version)
        return state, kept, float(np.sum(seg.slot_steps_N)), int(seg.decode_steps_N[0])

    def partial_batch(state, data: PartialState):
        inner, pending = data.inner, list(data.pending)
        rounds, kept, slot_steps, decode_steps = 0, 0, 0.0, 0
        while sum(g.complete for g in pending) < B:
            groups = partial_lib.round_groups(pending, B)
            if len(groups) < B:
                with timer.stage("prompt_selection"):
                    inner, idx = sampler.next(inner, B - len(groups))
                fresh = [partial_lib.new_group(i, encoded.ids[i], G, T, pad_id) for i in idx]
                pending += fresh
                groups += fresh
            state, k, slots, steps = partial_round(state, groups)
            rounds, kept, slot_steps, decode_steps = (
                rounds + 1,
                kept + k,
                slot_steps + slots,
                decode_steps + steps,
            )
        done = [g for g in pending if g.complete][:B]
        pending = [g for g in pending if all(g is not d for d in done)]
        rollout = partial_lib.training_rollout(done, s.data.buckets, pad_id)
        chosen = [encoded.examples[g.example] for g in done]
        with timer.stage("verification"):
            rows = [ex for ex in chosen for _ in range(G)]
            rewards, parts = host_rewards(task, rollout, rows, s.reward, G)
        extra = {
            **partial_lib.lag_metrics(done, int(jax.device_get(state.step))),
            "partial/rounds": rounds,
            "partial/running_groups": sum(not g.complete for g in pending),
            "partial/waiting_groups": sum(g.complete for g in pending),
            "rollout/slot_utilisation": kept / max(slot_steps, 1.0),
            "rollout/decode_steps": decode_steps,
            **useful_lib.step_counts(len(rewards), kept),
        }
        state, out = update(state, rollout, rewards, parts)
        attempts = [(chosen, np.asarray(out.rows.correct_N).reshape(-1, G))]
        return state, PartialState(inner, tuple(pending)), out, extra, attempts

    return partial_batch
