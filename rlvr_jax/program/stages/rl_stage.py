"""The RL stage: GRPO and its variants on the settings' task, through the run skeleton.

One step: the prompt sampler (epoch or success-rate curriculum) picks B prompts -> they are
repeated G times and left-padded to a bucket -> rollout, reward, advantages and update -> metrics
(one device_get) -> the prompt sampler learns each prompt's success. How the step runs depends
on the task, not on the loop:

* a task with a JAX verifier: rollout, reward and update are one jitted program;
* a host verifier (the pool): jitted rollout -> `Task.score` on the host -> jitted update;
* DAPO dynamic sampling: rounds of the latter until the batch holds B groups with reward
  variance (`rl.dynamic_sampling`);
* a multi-turn task (`MultiTurnTask`, tools): the rollout is `rl.multiturn`'s episodes, then the
  host path's verification and update;
* Kimi k1.5 partial rollouts: rounds of at most `rl.partial_budget` tokens per row until B
  groups have ended (`rl.partial`); the rows still running are kept in the data state, and so in
  the checkpoint (`partial_stage.py`).

Whichever the path, the step logs its verified useful trajectories (`program.runtime.useful`):
the rows verified and tokens sampled come from the batch function, the useful rows from the
train program.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.config_types import ConfigError
from rlvr_jax.data import curriculum as curriculum_lib
from rlvr_jax.data import templates
from rlvr_jax.data.example import Example
from rlvr_jax.envs.single_turn import build_task
from rlvr_jax.envs.task import (
    MultiTurnTask,
    Task,
    host_rewards,
    jax_reward_fn,
)
from rlvr_jax.model import sharding
from rlvr_jax.model.attention import resolve_attention
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.program.evals.evaluation import heldout_evaluator
from rlvr_jax.program.parts import build, learned_rewards
from rlvr_jax.program.runtime import metrics as metrics_lib
from rlvr_jax.program.runtime import useful as useful_lib
from rlvr_jax.program.runtime.run import Stage, run_stage
from rlvr_jax.program.settings import Settings
from rlvr_jax.program.stages import memory_fit
from rlvr_jax.program.stages.partial_stage import PartialSampler, build_partial_batch
from rlvr_jax.rl import dynamic_sampling, multiturn, sharding_plan
from rlvr_jax.rl import packing as packing_lib
from rlvr_jax.rl import state as state_lib
from rlvr_jax.rl import train_step as ts
from rlvr_jax.rl import update as update_lib
from rlvr_jax.rl.outputs import SAMPLED_TOKENS, sampled_tokens
from rlvr_jax.rl.state import TrainState
from rlvr_jax.sampling.host import bucket_and_pad

# (the prompts of a batch or round, their per-row success) for the prompt sampler.
Attempt = tuple[Sequence[Example], np.ndarray]


def make_batch(
    ids: Sequence[Sequence[int]],
    examples: Sequence[Example],
    G: int,
    buckets: Sequence[int],
    pad_id: int,
    task: Task,
) -> ts.Batch:
    """B prompts repeated G times, left-padded to a bucket, with the task's per-row targets."""
    prompt_NP, lengths_N = bucket_and_pad(ids, buckets, pad_id, G)
    rows = [ex for ex in examples for _ in range(G)]
    return ts.Batch(jnp.asarray(prompt_NP), jnp.asarray(lengths_N), task.targets(rows))


def fused_step(s: Settings, task: Task) -> bool:
    """Whether the stage's step is one program: a JAX verifier and one rollout per step."""
    return (
        task.jax_parts is not None
        and not s.data.dynamic_sampling
        and not s.rl.partial_budget
        and s.rl.pack is not True  # the packing is planned on the host between the two
    )


def build_rollout_source(
    s: Settings,
    model_cfg: ModelConfig,
    task: Task,
    plan: sharding_plan.StepShardings,
    pad_id: int,
    program: Callable | None = None,
) -> Callable[[Any, Sequence[Example], ts.Batch, jax.Array], tuple[Any, dict[str, Any]]]:
    """The host path's rollout, `(params, examples, batch, key) -> (rollout, metrics)`: the
    sampler's jitted program (`program`, or `ts.build_rollout`'s), or for a multi-turn task its
    episodes (`rl.multiturn`), whose metrics (turns, tool calls, tool time) come with it."""
    if not isinstance(task, MultiTurnTask):
        rollout_fn = program or ts.build_rollout(model_cfg, s.rl, plan)
        return lambda params, chosen, batch, key: (
            jax.block_until_ready(rollout_fn(params, batch, key)),
            {},
        )
    if s.rl.partial_budget:
        raise ConfigError(f"reward.verifier={task.name!r} runs episodes; rl.partial_budget=0")
    episodes = multiturn.build_episodes(model_cfg, s.rl, plan, task, s.data.buckets, pad_id)
    return lambda params, chosen, batch, key: episodes(params, chosen, key)


def build_rl_step(
    s: Settings,
    model_cfg: ModelConfig,
    task: Task,
    sampler: curriculum_lib.EpochSampler | curriculum_lib.CurriculumSampler,
    encoded: templates.EncodedPrompts,
    plan: sharding_plan.StepShardings,
    pad_id: int,
) -> tuple[
    Callable[[TrainState, Any], tuple[TrainState, Any, dict[str, Any]]],
    Callable[[TrainState], None] | None,
]:
    """One RL step `(state, sampler_state) -> (state, sampler_state, host metrics)`, with its
    programs jitted here, once; and a function that compiles them ahead of their first call
    (`run.Stage.precompile`: the fused step, or the host path's rollout and update), or None
    where the step's arguments are known only once it runs (partial rollouts, dynamic sampling,
    multi-turn episodes, a task whose parts are known only after scoring).

    Returns:
      (step, precompile or None).
    """
    G, B = s.rl.group_size, s.train.batch_prompts
    optimizer = state_lib.make_optimizer(s.optim)
    schedule = state_lib.learning_rate_schedule(s.optim)
    fused = fused_step(s, task)
    if fused:
        reward_fn = jax_reward_fn(task, s.reward, G)
        step_fn = ts.build_train_step(model_cfg, s.rl, optimizer, schedule, reward_fn, plan)
    else:
        rollout_program = ts.build_rollout(model_cfg, s.rl, plan)
        rollout_fn = build_rollout_source(s, model_cfg, task, plan, pad_id, rollout_program)
        update_fn = ts.build_update(model_cfg, s.rl, optimizer, schedule, plan)
    episode_metrics = {}
    timer = metrics_lib.StageTimer()

    def select(sampler_state):
        with timer.stage("prompt_selection"):
            sampler_state, idx = sampler.next(sampler_state, B)
            chosen = [encoded.examples[i] for i in idx]
            batch = make_batch(
                [encoded.ids[i] for i in idx], chosen, G, s.data.buckets, pad_id, task
            )
            return sampler_state, chosen, sharding.place(batch, plan.rows)

    def rollout_round(state, chosen, batch) -> tuple[TrainState, dynamic_sampling.Round]:
        with timer.stage("rollout"):
            state, key = ts.split_rollout_key(state)
            rollout, m = rollout_fn(state.params, chosen, batch, key)
            episode_metrics.update(m)
        with timer.stage("verification"):
            rows = [ex for ex in chosen for _ in range(G)]
            rewards, parts = host_rewards(task, rollout, rows, s.reward, G)
        return state, dynamic_sampling.Round(list(chosen), rollout, rewards, parts)

    packed_shapes = set()  # of the update programs compiled so far (`packing.plan(reuse=)`)

    def update(state, rollout, rewards, parts):
        with timer.stage("update"):
            packings = (None, None)
            if s.rl.packs():
                packings = _packing(s, model_cfg, state, rollout, plan, packed_shapes)
            state, out = update_fn(state, rollout, rewards, parts, *packings)
            return state, jax.device_get(out)

    def one_batch(state, sampler_state):
        sampler_state, chosen, batch = select(sampler_state)
        if fused:
            with timer.stage("train_step"):
                state, out = step_fn(state, batch)
                out = jax.device_get(out)
        else:
            state, r = rollout_round(state, chosen, batch)
            state, out = update(state, r.rollout, r.rewards_N, r.parts)
        attempts = [(chosen, np.asarray(out.rows.correct_N).reshape(-1, G))]
        # One rollout, all of it verified and trained on.
        counts = useful_lib.step_counts(len(out.rows.correct_N), out.metrics[SAMPLED_TOKENS])
        return state, sampler_state, out, counts, attempts

    run_batch = one_batch
    if s.data.dynamic_sampling:
        run_batch = _dynamic_batch(s, select, rollout_round, update, pad_id)
    elif s.rl.partial_budget:
        run_batch = build_partial_batch(
            s, model_cfg, task, sampler, encoded, plan, pad_id, timer, update
        )

    def step(state, data_state):
        with timer.stage("step"):
            state, data_state, out, extra, attempts = run_batch(state, data_state)
            metrics = {**out.metrics, **extra, **task.stats(), **episode_metrics}
        sampler_state = data_state.inner if s.rl.partial_budget else data_state
        sampler_state = _record_attempts(sampler, sampler_state, attempts)
        metrics["groups/success_hist"] = _success_hist(out.rows.correct_N, G)
        metrics.update(timer.metrics())
        metrics.update(useful_lib.step_rates(metrics))
        if s.data.sampler == "curriculum":
            metrics.update(_curriculum_metrics(sampler, sampler_state))
        if s.rl.partial_budget:
            return state, dataclasses.replace(data_state, inner=sampler_state), metrics
        return state, sampler_state, metrics

    batches = functools.partial(_bucket_batches, s, task, encoded, plan, pad_id)
    if fused:
        return step, _precompile_fused(step_fn, batches)
    if not _host_ahead(s, task):
        return step, None
    return step, _precompile_host(rollout_program, update_fn, batches, s, task, plan)


def _record_attempts(sampler: Any, sampler_state: Any, attempts: list) -> Any:
    """The sampler's state after it has seen each (examples, success_BG) the step attempted."""
    for examples, success_BG in attempts:
        sampler_state = sampler.update(
            sampler_state, [ex.id for ex in examples], np.asarray(success_BG)
        )
    return sampler_state


def _curriculum_metrics(sampler: curriculum_lib.CurriculumSampler, sampler_state: Any) -> dict:
    return {
        **curriculum_lib.summary_stats(sampler_state),
        **sampler.level_metrics(sampler_state),
    }


def _success_hist(correct_N: Any, G: int) -> list[int]:
    """How many groups of the rows trained on (the kept groups under dynamic sampling) have 0, 1,
    ..., G correct rows."""
    trained_BG = np.asarray(correct_N).reshape(-1, G)
    return np.bincount(np.rint(trained_BG.sum(axis=1)).astype(int), minlength=G + 1).tolist()


def _dynamic_batch(
    s: Settings, select: Callable, rollout_round: Callable, update: Callable, pad_id: int
) -> Callable:
    """DAPO's dynamic sampling as a batch function of `build_rl_step`: rounds of prompts drawn
    (`select`), rolled out and verified (`rollout_round`) until `batch_prompts` groups with
    mixed rewards are kept (`dynamic_sampling.dynamic_sampling_batch`), then one update."""
    B, G = s.train.batch_prompts, s.rl.group_size

    def dynamic_batch(state, sampler_state):
        def draw():
            nonlocal sampler_state
            sampler_state, chosen, batch = select(sampler_state)
            return chosen, batch

        def rollout_and_verify(chosen, batch):
            nonlocal state
            state, r = rollout_round(state, chosen, batch)
            return r

        rollout, rewards, parts, rounds, fill_metrics = dynamic_sampling.dynamic_sampling_batch(
            draw, rollout_and_verify, B, G, s.data.dynamic_max_rounds, pad_id
        )
        state, out = update(state, rollout, rewards, parts)
        attempts = [(r.examples, r.parts["correct"].reshape(-1, G)) for r in rounds]
        # Every round was sampled and verified, the dropped groups' rows too.
        counts = useful_lib.step_counts(
            sum(len(r.rewards_N) for r in rounds),
            sum(float(sampled_tokens(r.rollout)) for r in rounds),
        )
        return state, sampler_state, out, {**fill_metrics, **counts}, attempts

    return dynamic_batch


def _packing(
    s: Settings,
    model_cfg: ModelConfig,
    state: TrainState,
    rollout: Any,
    plan: sharding_plan.StepShardings,
    shapes: set[tuple[int, int, int, int]],
) -> tuple[packing_lib.Packing | None, packing_lib.Packing | None]:
    """The packed layouts of a rollout's rows (`rl.pack`): the rows' (the frozen log-probs',
    and with one minibatch the passes'), and with several minibatches each minibatch's
    (`packing.plan_minibatches`, in the order the update shuffles them, drawn from the state's
    key), each microbatch's packed row count a multiple of the mesh's row shards. A layout is
    None (the padded update) where packing would not save enough token positions to be faster
    (`packing.worth_packing`: rows of nearly equal lengths). `shapes` holds the packed shapes
    of earlier steps (compiled programs): one of them is taken where it costs little more than
    a new one (`packing.REUSE_SLACK`), and the shapes taken are added."""
    prompt_lengths_N, mask_NT = jax.device_get((rollout.prompt_lengths_N, rollout.mask_NT))
    # Each group's prompt once, as the padded update's shared-prompt forward, except under
    # splash attention, which masks plain segments only.
    shared = s.rl.group_size if s.rl.shared_prompt_forward else 1
    impl = resolve_attention(model_cfg, layout="packed")
    if impl == "pallas":
        shared = 1
    elif impl == "cudnn" and s.rl.pack == "auto":
        return None, None  # cuDNN cannot mask segments (`rl.pack=True` says so)
    axes = plan.rows.spec[0] if len(plan.rows.spec) else None
    axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
    # The update splits a packed row's tokens over "seq", not the rows.
    row_shards = math.prod(plan.mesh.shape[a] for a in axes if a != sharding.SEQ_AXIS)
    (N, T), P = mask_NT.shape, rollout.prompt_NP.shape[1]
    kwargs = dict(
        length=s.rl.pack_length,
        num_microbatches=s.rl.microbatch_count(),
        row_multiple=row_shards,
        microbatch_tokens=s.rl.pack_microbatch_tokens,
        block=model_cfg.attention_block,
        skips_blocks=impl == "xla_blockwise",
        reuse=shapes,
    )
    # The frozen log-probs' forwards (and one minibatch's) see all rows, in groups.
    whole = packing_lib.plan(prompt_lengths_N, mask_NT, P, group_size=shared, **kwargs)
    whole = _worth(whole, packing_lib.padded_positions(N, P, T, shared), shapes)
    if s.rl.num_minibatches == 1:
        return whole, None
    orders = update_lib.minibatch_orders(_local(state.rng), N, s.rl)
    minibatches = packing_lib.plan_minibatches(
        prompt_lengths_N, mask_NT, P, np.asarray(orders), s.rl.num_minibatches, **kwargs
    )
    padded = s.rl.mu * packing_lib.padded_positions(N, P, T, 1)
    return whole, _worth(minibatches, padded, shapes)


def _worth(packing: packing_lib.Packing, padded: int, shapes: set) -> packing_lib.Packing | None:
    """`packing` where it computes few enough positions against the padded update's `padded`
    (`packing.worth_packing`), its shape added to `shapes`; else None."""
    if not packing_lib.worth_packing(packing, padded):
        return None
    shapes.add(packing.shape)
    return packing


def _local(x: jax.Array) -> jax.Array:
    """This process's copy of a replicated array (several processes cannot read a global one)."""
    return x if x.is_fully_addressable else x.addressable_data(0)


def _host_ahead(s: Settings, task: Task) -> bool:
    """Whether the host path's arguments are known before its first step."""
    return (
        not s.rl.partial_budget
        and not s.data.dynamic_sampling  # its update takes rows gathered on the host
        and not isinstance(task, MultiTurnTask)
        and task.part_names() is not None
    )


def _bucket_batches(
    s: Settings,
    task: Task,
    encoded: templates.EncodedPrompts,
    plan: sharding_plan.StepShardings,
    pad_id: int,
) -> list[ts.Batch]:
    """One placed batch per prompt bucket, of the real ones' shapes and shardings (a one-token
    prompt padded to the bucket)."""
    B, G = s.train.batch_prompts, s.rl.group_size
    chosen = encoded.examples[:B]
    ids = [encoded.ids[0][:1]] * len(chosen)
    return [
        sharding.place(make_batch(ids, chosen, G, (bucket,), pad_id, task), plan.rows)
        for bucket in sorted(s.data.buckets)
    ]


def _precompile_fused(
    step_fn: Callable, batches: Callable[[], list[ts.Batch]]
) -> Callable[[TrainState], None]:
    """Compiles the fused step `step_fn` for every prompt bucket (`batches()`). jax keeps the
    executable with the jitted function, so the step's calls then compile nothing."""

    def precompile(state: TrainState) -> None:
        for batch in batches():
            step_fn.lower(state, batch).compile()

    return precompile


def _precompile_host(
    rollout_program: Callable,
    update_fn: Callable,
    batches: Callable[[], list[ts.Batch]],
    s: Settings,
    task: Task,
    plan: sharding_plan.StepShardings,
) -> Callable[[TrainState], None]:
    """Compiles the host path's rollout and update for every prompt bucket (`batches()`), each
    program on its own thread, the update on `memory_fit.update_args`: the arguments' types and
    shardings are the step's, so that its calls find these executables instead of tracing and
    compiling again."""

    def precompile(state: TrainState) -> None:
        # Abstract, so that nothing runs on the devices beside the evaluation; the key keeps the
        # state's sharding, as the step's split gives it.
        key = jax.eval_shape(lambda st: ts.split_rollout_key(st)[1], state)
        key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=state.rng.sharding)
        jobs = []
        for batch in batches():
            args = memory_fit.update_args(rollout_program, state.params, batch, key, task, s, plan)
            jobs.append(lambda b=batch: rollout_program.lower(state.params, b, key).compile())
            if not s.rl.packs():  # a packed update's shape is known only from its rollout
                jobs.append(lambda a=args: update_fn.lower(state, *a).compile())
        with concurrent.futures.ThreadPoolExecutor(len(jobs), "compile") as pool:
            for job in [pool.submit(job) for job in jobs]:
                job.result()

    return precompile


def run(
    settings: Settings,
    workdir: str | Path,
    log: Callable[[str], None] = print,
    allow_changed_settings: bool = False,
    resume_step: int | None = None,
) -> dict:
    """Trains, evaluating before and after; resumes from `workdir` when it holds a checkpoint.

    Returns:
      {"eval_before", "eval_after", "steps", "resumed_from", "wall_time"}.
    """
    tok, params, model_cfg, s = build.policy_and_settings(settings)

    train_ex, eval_ex, notes = build.load_examples(s.data)
    for note in notes:
        log(note)
    template = templates.get_template(s.data.template)
    enc_train = templates.encode_prompts(train_ex, template, tok, s.data.buckets)
    enc_eval = templates.encode_prompts(eval_ex, template, tok, s.data.buckets)
    for enc, what in ((enc_train, "train"), (enc_eval, "eval")):
        if enc.num_too_long:
            log(f"{what}: {enc.summary()}")
    if len(enc_train.ids) < s.train.batch_prompts:
        raise ConfigError(
            f"train.batch_prompts={s.train.batch_prompts} exceeds the {len(enc_train.ids)} "
            "training prompts"
        )
    if s.data.sampler == "curriculum":
        sampler = curriculum_lib.CurriculumSampler(enc_train.examples, s.curriculum)
    else:
        sampler = curriculum_lib.EpochSampler(enc_train.examples, shuffle=True)

    optimizer = state_lib.make_optimizer(s.optim)
    state = state_lib.init_train_state(
        params,
        optimizer,
        jax.random.key(s.train.seed + 1),
        use_reference=s.rl.loss.kl_beta > 0,
        critic=build.critic_state(s, params),
    )
    all_examples = [*enc_train.examples, *enc_eval.examples]
    task = build_task(s.reward, tok, model_cfg.vocab_size, all_examples, s.data.template)
    # The step's memory is measured at the longest prompt bucket: the most any step can need.
    B, G, longest = s.train.batch_prompts, s.rl.group_size, (max(s.data.buckets),)
    try:
        first = make_batch(enc_train.ids[:B], enc_train.examples[:B], G, longest, tok.pad_id, task)
        # The recorded settings keep "auto"; the step runs on `step_s`, its values resolved.
        step_s = memory_fit.resolve_seq(s, model_cfg, task, state, first, fused_step(s, task), log)
        # The state lives on the mesh from here on; the jitted programs keep its layout.
        rows = B * G
        plan = sharding_plan.plan_step(state, model_cfg, sharding.make_mesh(step_s.mesh), rows)
        state = sharding.place(state, plan.state)
        # Learned parts ("preference", "judge") wrap the verifier's task: the loop sees one task.
        task = learned_rewards.wrap_task(task, s, tok, params, model_cfg, plan.mesh, log)
    except BaseException:
        task.close()
        raise
    with task:
        first = make_batch(enc_train.ids[:B], enc_train.examples[:B], G, longest, tok.pad_id, task)
        step_s = memory_fit.resolve_microbatches(
            step_s,
            model_cfg,
            task,
            state,
            sharding.place(first, plan.rows),
            plan,
            fused_step(step_s, task),
            log,
        )
        step, precompile = build_rl_step(
            step_s, model_cfg, task, sampler, enc_train, plan, tok.pad_id
        )
        stage = Stage(
            name="RL",
            steps=s.train.steps,
            state=state,
            sampler=sampler
            if not s.rl.partial_budget
            else PartialSampler(sampler, s.rl.sampler.max_new_tokens, tok.pad_id),
            step=step,
            evaluate=heldout_evaluator(model_cfg, s, task, tok, enc_eval.ids, enc_eval.examples)
            if s.eval.in_stage
            else None,
            ref_source=build.base_source(s.model),
            precompile=precompile,
        )
        result = run_stage(stage, s, workdir, log, allow_changed_settings, resume_step)
    return {
        "eval_before": result.eval_before,
        "eval_after": result.eval_after,
        "steps": result.steps,
        "resumed_from": result.resumed_from,
        "wall_time": time.time(),
    }
