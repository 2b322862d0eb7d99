"""The training program: settings, the step loop, evaluation, checkpoints and metrics.

`main.py` turns a config file into `Settings` (`settings_from_config`) and calls `run`. Everything
here is host orchestration; the math lives in `rl/`, `sampling.py` and `rewards/`.

One step: the prompt sampler (curriculum) picks B prompts -> they are repeated G times and
left-padded to a bucket -> rollout, reward, advantages and update (one jitted program when the
verifier is in JAX) -> metrics (one device_get) -> curriculum update -> checkpoint.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax import sampling
from rlvr_jax.config_types import ConfigError
from rlvr_jax.data import curriculum as curriculum_lib
from rlvr_jax.data import datasets, templates
from rlvr_jax.data.datasets import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.model import loading, sharding
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.program import checkpoint as ckpt_lib
from rlvr_jax.program import metrics as metrics_lib
from rlvr_jax.program.settings import (
    DataSettings,
    ModelSettings,
    RewardSettings,
    Settings,
    save_settings,
)
from rlvr_jax.rewards import arithmetic, shaping
from rlvr_jax.rewards import math as math_reward
from rlvr_jax.rewards.format import r1_format_reward
from rlvr_jax.rewards.pool import VerifierPool
from rlvr_jax.rl import sharding_plan
from rlvr_jax.rl import state as state_lib
from rlvr_jax.rl import train_step as ts

# ---------------------------------------------------------------------------------------------
# Building the pieces


def build_tokenizer(model: ModelSettings) -> Tokenizer:
    """The tokenizer named by the settings (a character one for "chars:...")."""
    if model.tokenizer.startswith("chars:"):
        return Tokenizer.from_characters(model.tokenizer.removeprefix("chars:"))
    if model.tokenizer:
        return loading.load_tokenizer(model.tokenizer)
    tok = loading.load_tokenizer(model.source)
    if tok is None:
        raise ConfigError(
            f"model.source={model.source!r} has no tokenizer; set model.tokenizer "
            "(e.g. 'chars:0123456789+-*=')"
        )
    return tok


def load_examples(data: DataSettings) -> tuple[list[Example], list[Example], list[str]]:
    """Training and evaluation examples, and notes about skipped rows for the log."""
    notes = []
    common = dict(
        seed=data.seed,
        level=data.level,
        exclude_multiple_choice=data.exclude_multiple_choice,
        exclude_true_false=data.exclude_true_false,
    )
    total = (data.num_train or 0) + (0 if data.eval_split else data.num_eval)
    examples, report = datasets.load(
        data.name, data.path or None, data.split, num=total or None, **common
    )
    if report is not None and report.num_skipped:
        notes.append(report.summary())
    if data.eval_split:
        evals, report = datasets.load(
            data.name, data.path or None, data.eval_split, num=data.num_eval, **common
        )
        if report is not None and report.num_skipped:
            notes.append(report.summary())
        train = examples
    else:
        if data.num_eval >= len(examples):
            raise ConfigError(
                f"data.num_eval={data.num_eval} leaves no training prompts out of {len(examples)}"
            )
        train, evals = datasets.split_holdout(examples, data.num_eval, seed=data.seed)
    if data.num_train:
        train = train[: data.num_train]
    return train, evals, notes


def shape_rewards(
    parts: dict[str, jax.Array], lengths_N: jax.Array, reward: RewardSettings, G: int, T: int
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Adds the configured shaping parts and sums them with their weights (jittable)."""
    parts = dict(parts)
    weights = {"correct": 1.0}
    if reward.format != "none" and "format" in parts:
        weights["format"] = reward.format_weight
    if reward.length_weight:
        parts["length"] = shaping.kimi_length_reward(
            lengths_N.reshape(-1, G), parts["correct"].reshape(-1, G)
        ).reshape(-1)
        weights["length"] = reward.length_weight
    if reward.overlong_cache:
        parts["overlong"] = shaping.overlong_penalty(lengths_N, T, reward.overlong_cache)
        weights["overlong"] = 1.0
    return shaping.combine(parts, weights)


@dataclasses.dataclass(frozen=True)
class ArithmeticTask:
    """Integer answers checked in JAX over tokens (`rewards.arithmetic`)."""

    table: arithmetic.DigitTable
    width: int
    in_graph = True

    def targets(self, examples: Sequence[Example], group_size: int) -> arithmetic.Answers:
        values = [int(ex.answer) for ex in examples for _ in range(group_size)]
        return arithmetic.encode_answers(values, self.width)

    def reward_fn(self, reward: RewardSettings, G: int, T: int) -> ts.RewardFn:
        base = arithmetic.make_reward_fn(self.table)

        def fn(rollout, answers):
            _, parts = base(rollout, answers)
            return shape_rewards(parts, rollout.lengths_N, reward, G, T)

        return fn


class MathTask:
    """Final answers checked on decoded text in a verifier pool (`rewards.math`)."""

    in_graph = False

    def __init__(self, tok: Tokenizer, reward: RewardSettings, think_in_prompt: bool):
        self.tok = tok
        self.reward = reward
        self.think_in_prompt = think_in_prompt
        self.pool = VerifierPool(
            math_reward.score,
            num_workers=reward.workers,
            deadline_s=reward.deadline_s,
            warmup=math_reward.WARMUP,
        )

    def targets(self, examples: Sequence[Example], group_size: int) -> None:
        del examples, group_size
        return None

    def texts(self, tokens_NT: np.ndarray, lengths_N: np.ndarray) -> list[str]:
        return [
            self.tok.decode(tokens_NT[i, : lengths_N[i]], skip_special_tokens=True)
            for i in range(tokens_NT.shape[0])
        ]

    def host_rewards(
        self, rollout: sampling.Rollout, examples_N: Sequence[Example], G: int, T: int
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Rewards and parts of one rollout (host arrays); failed checks count in the pool."""
        tokens, lengths = jax.device_get((rollout.tokens_NT, rollout.lengths_N))
        texts = self.texts(tokens, lengths)
        correct = np.asarray(
            self.pool.map([(t, ex.answer) for t, ex in zip(texts, examples_N, strict=True)]),
            np.float32,
        )
        parts = {"correct": correct}
        if self.reward.format == "r1":
            parts["format"] = np.asarray(
                [r1_format_reward(t, think_in_prompt=self.think_in_prompt) for t in texts],
                np.float32,
            )
        rewards, parts = shape_rewards(
            {k: jnp.asarray(v) for k, v in parts.items()},
            jnp.asarray(lengths),
            self.reward,
            G,
            T,
        )
        return np.asarray(rewards), {k: np.asarray(v) for k, v in parts.items()}

    def close(self) -> None:
        self.pool.close()


def build_task(
    reward: RewardSettings, tok: Tokenizer, cfg: ModelConfig, examples, template_name: str
):
    """The verifier the settings name; for arithmetic, checks that every gold answer is an int."""
    if reward.verifier == "math":
        return MathTask(tok, reward, think_in_prompt=template_name == "r1_zero")
    bad = next((ex for ex in examples if not ex.answer.lstrip("-").isdigit()), None)
    if bad is not None:
        raise ConfigError(
            f"reward.verifier='arithmetic' needs integer answers; example {bad.id!r} has "
            f"{bad.answer!r} (use reward.verifier='math')"
        )
    width = max(len(ex.answer.lstrip("-")) for ex in examples)
    return ArithmeticTask(arithmetic.DigitTable.from_tokenizer(tok, cfg.vocab_size), width)


def _batch(
    ids: Sequence[Sequence[int]],
    examples: Sequence[Example],
    group_size: int,
    buckets: Sequence[int],
    pad_id: int,
    task: ArithmeticTask | MathTask,
) -> ts.Batch:
    prompt_NP, lengths_N = sampling.bucket_and_pad(ids, buckets, pad_id, group_size)
    return ts.Batch(
        jnp.asarray(prompt_NP), jnp.asarray(lengths_N), task.targets(examples, group_size)
    )


def build_evaluator(
    model_cfg: ModelConfig,
    settings: Settings,
    task: ArithmeticTask | MathTask,
    pad_id: int,
) -> Callable[[Any, Sequence[Sequence[int]], Sequence[Example]], dict[str, float]]:
    """Greedy accuracy, response length and truncation on held-out prompts."""
    greedy = dataclasses.replace(settings.rl.sampler, method="greedy")
    B = settings.eval.batch_prompts
    T = greedy.max_new_tokens
    no_shaping = RewardSettings(verifier=settings.reward.verifier, format="none")
    in_graph_reward = task.reward_fn(no_shaping, 1, T) if task.in_graph else None

    @jax.jit
    def evaluate_batch(params, batch: ts.Batch):
        n = batch.prompt_NP.shape[0]
        sp = sampling.SamplingParams(jnp.ones((n,)), jnp.ones((n,)), jnp.zeros((n,)))
        rollout, _ = sampling.generate(
            params,
            batch.prompt_NP,
            batch.prompt_lengths_N,
            jax.random.key(0),
            sp,
            None,
            model_cfg=model_cfg,
            cfg=greedy,
        )
        correct = None
        if in_graph_reward is not None:
            correct = in_graph_reward(rollout, batch.targets)[1]["correct"]
        return rollout, correct

    def evaluate(params, ids, examples) -> dict[str, float]:
        correct, lengths, finish = [], [], []
        for start in range(0, len(ids), B):
            chunk = list(range(start, min(start + B, len(ids))))
            real = len(chunk)
            chunk += [chunk[-1]] * (B - real)  # fixed shapes: pad with repeats, drop below
            chosen = [examples[i] for i in chunk]
            batch = _batch([ids[i] for i in chunk], chosen, 1, settings.data.buckets, pad_id, task)
            rollout, c = evaluate_batch(params, batch)
            if c is None:
                c = task.host_rewards(rollout, chosen, 1, T)[1]["correct"]
            c, n, f = jax.device_get((c, rollout.lengths_N, rollout.finish_N))
            correct.append(c[:real])
            lengths.append(n[:real])
            finish.append(f[:real])
        c, n, f = map(np.concatenate, (correct, lengths, finish))
        return {
            "eval/accuracy": float(np.mean(c)),
            "eval/length": float(np.mean(n)),
            "eval/truncated": float(np.mean(f == sampling.FINISH_LENGTH)),
            "eval/num_prompts": float(len(c)),
        }

    return evaluate


def concat_rollouts(rollouts: Sequence[sampling.Rollout], pad_id: int) -> sampling.Rollout:
    """Rows of several rollouts as one; prompts are left-padded to the widest bucket among them
    (positions follow the mask, so extra left padding changes nothing for the model)."""
    P = max(r.prompt_NP.shape[1] for r in rollouts)
    widened = [
        dataclasses.replace(
            r,
            prompt_NP=jnp.pad(
                r.prompt_NP, ((0, 0), (P - r.prompt_NP.shape[1], 0)), constant_values=pad_id
            ),
        )
        for r in rollouts
    ]
    return jax.tree.map(lambda *xs: jnp.concatenate(xs), *widened)


@dataclasses.dataclass
class _Round:
    """One rollout round of dynamic sampling: the prompts drawn, their rollout and rewards."""

    examples: list[Example]
    rollout: sampling.Rollout
    rewards_N: np.ndarray
    parts: dict[str, np.ndarray]


def dynamic_sampling_batch(
    draw: Callable[[], tuple[list[Example], ts.Batch]],
    rollout_and_verify: Callable[[list[Example], ts.Batch], _Round],
    batch_prompts: int,
    group_size: int,
    max_rounds: int,
    pad_id: int,
) -> tuple[sampling.Rollout, np.ndarray, dict[str, np.ndarray], list[_Round], dict[str, float]]:
    """DAPO dynamic sampling over whole-batch rounds (see `DataSettings.dynamic_sampling`).

    Returns:
      (rollout, rewards_N, parts) of the `batch_prompts` groups to train on, kept groups first;
      every round (for the prompt sampler); and the `dynamic_sampling/*` metrics.

    Groups are filtered on the total reward, not on correctness alone: what the advantage
    zeroes is a group of equal rewards, and a shaped reward (length, format) can give an
    all-correct group variance, and so signal.
    """
    rounds: list[_Round] = []

    def produce(wanted: int):
        del wanted  # every round is a full batch, so that shapes stay static
        examples, batch = draw()
        r = rollout_and_verify(examples, batch)
        rounds.append(r)
        i = len(rounds) - 1
        groups = [(i, b) for b in range(len(examples))]
        return groups, r.rewards_N.reshape(-1, group_size)

    groups, _, stats = curriculum_lib.fill_batch(produce, batch_prompts, max_rounds)
    rows = []
    for i, b in groups:
        rows.append((i, np.arange(b * group_size, (b + 1) * group_size)))
    rollout = concat_rollouts(
        [jax.tree.map(lambda x, idx=idx: x[idx], rounds[i].rollout) for i, idx in rows], pad_id
    )
    rewards = np.concatenate([rounds[i].rewards_N[idx] for i, idx in rows])
    parts = {
        k: np.concatenate([rounds[i].parts[k][idx] for i, idx in rows]) for k in rounds[0].parts
    }
    return rollout, rewards, parts, rounds, stats.as_metrics()


# ---------------------------------------------------------------------------------------------
# The loop


def resume(
    checkpointer: ckpt_lib.Checkpointer,
    state: Any,
    workdir: Path,
    s: Settings,
    total_steps: int,
    log: Callable[[str], None],
) -> tuple[Any, dict | None, int, metrics_lib.MetricsWriter]:
    """Restores the last checkpoint in `workdir`, if any, and opens the metrics writer there.

    Returns:
      (state, the checkpoint's host data or None, the step to start from, the writer).
    """
    start_step, host = 0, None
    restored = checkpointer.restore(state)
    if restored is not None:
        state, host = restored
        start_step = int(host["step"])
        log(f"resumed from step {start_step} in {workdir / 'checkpoints'}")
    writer = metrics_lib.MetricsWriter(
        workdir,
        process_index=jax.process_index(),
        use_tensorboard=s.train.use_tensorboard,
        log_every=s.train.log_every,
        total_steps=total_steps,
        resume_step=start_step,
    )
    return state, host, start_step, writer


def run(settings: Settings, workdir: str | Path, log: Callable[[str], None] = print) -> dict:
    """Trains, evaluating before and after; resumes from `workdir` when it holds a checkpoint.

    Returns:
      {"eval_before": ..., "eval_after": ..., "steps": ..., "resumed_from": ...}.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    save_settings(settings, workdir)
    s = settings
    tok = build_tokenizer(s.model)
    overrides = dict(dtype=s.model.dtype, param_dtype=s.model.param_dtype, remat=s.model.remat)
    if s.model.source.startswith("random:") and s.model.tokenizer.startswith("chars:"):
        overrides["vocab_size"] = max(tok.vocab_size, 8)
    params, model_cfg = loading.load_model(s.model.source, seed=s.train.seed, **overrides)
    if tok.vocab_size > model_cfg.vocab_size:
        raise ConfigError(
            f"tokenizer has {tok.vocab_size} ids but the model's vocabulary is "
            f"{model_cfg.vocab_size}"
        )
    sampler_cfg = s.rl.sampler
    if not sampler_cfg.eos_ids:
        sampler_cfg = dataclasses.replace(sampler_cfg, eos_ids=tok.eos_ids, pad_id=tok.pad_id)
    rl = dataclasses.replace(s.rl, sampler=sampler_cfg)
    s = dataclasses.replace(s, rl=rl)

    train_ex, eval_ex, notes = load_examples(s.data)
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
    task = build_task(
        s.reward, tok, model_cfg, [*enc_train.examples, *enc_eval.examples], s.data.template
    )
    G, T = s.rl.group_size, s.rl.sampler.max_new_tokens
    if s.data.sampler == "curriculum":
        prompt_sampler = curriculum_lib.CurriculumSampler(enc_train.examples, s.curriculum)
    else:
        prompt_sampler = curriculum_lib.EpochSampler(enc_train.examples, shuffle=True)

    optimizer = state_lib.make_optimizer(s.optim)
    schedule = state_lib.learning_rate_schedule(s.optim)
    use_ref = s.rl.loss.kl_beta > 0
    state = state_lib.init_train_state(
        params, optimizer, jax.random.key(s.train.seed + 1), use_reference=use_ref
    )
    # The state lives on the mesh from here on; the jitted programs keep its layout.
    plan = sharding_plan.plan_step(
        state, model_cfg, sharding.make_mesh(s.mesh), s.train.batch_prompts * G
    )
    state = sharding.place(state, plan.state)
    if task.in_graph and not s.data.dynamic_sampling:
        step_fn = ts.build_train_step(
            model_cfg, s.rl, optimizer, schedule, task.reward_fn(s.reward, G, T), plan
        )
    else:
        rollout_fn = ts.build_rollout(model_cfg, s.rl, plan)
        update_fn = ts.build_update(model_cfg, s.rl, optimizer, schedule, plan)
    if task.in_graph:
        reward_c = jax.jit(task.reward_fn(s.reward, G, T))

        def verify(rollout, batch, chosen):
            del chosen
            return jax.device_get(reward_c(rollout, batch.targets))
    else:

        def verify(rollout, batch, chosen):
            del batch
            return task.host_rewards(rollout, [ex for ex in chosen for _ in range(G)], G, T)

    evaluate = build_evaluator(model_cfg, s, task, tok.pad_id)

    checkpointer = ckpt_lib.Checkpointer(
        workdir / "checkpoints",
        every_steps=s.train.checkpoint_every or max(s.train.steps, 1),
        keep=s.train.keep_checkpoints,
        ref_source=s.model.source if not s.model.source.startswith("random:") else None,
    )
    sampler_state = prompt_sampler.init(s.data.seed)
    state, host, start_step, writer = resume(checkpointer, state, workdir, s, s.train.steps, log)
    eval_before = None
    if host is not None:
        sampler_state = prompt_sampler.load_state_dict(
            curriculum_lib.state_from_json(host["prompt_sampler"])
        )
        eval_before = host.get("eval_before")
    if eval_before is None:
        eval_before = evaluate(state.params, enc_eval.ids, enc_eval.examples)
        writer.write(0, eval_before)
    log(f"held-out accuracy before RL: {eval_before['eval/accuracy']:.3f}")

    guard = ckpt_lib.PreemptionGuard()
    guard.install()
    timer = metrics_lib.StageTimer()
    step = start_step
    try:
        while step < s.train.steps:
            with timer.stage("step"):
                if s.data.dynamic_sampling:
                    carry = {"state": state, "sampler": sampler_state}

                    def draw():
                        with timer.stage("prompt_selection"):
                            carry["sampler"], idx = prompt_sampler.next(
                                carry["sampler"], s.train.batch_prompts
                            )
                            chosen = [enc_train.examples[i] for i in idx]
                            ids = [enc_train.ids[i] for i in idx]
                            batch = _batch(ids, chosen, G, s.data.buckets, tok.pad_id, task)
                            return chosen, sharding.place(batch, plan.rows)

                    def rollout_and_verify(chosen, batch):
                        with timer.stage("rollout"):
                            carry["state"], key = ts.split_rollout_key(carry["state"])
                            params = carry["state"].params
                            rollout = jax.block_until_ready(rollout_fn(params, batch, key))
                        with timer.stage("verification"):
                            rewards, parts = verify(rollout, batch, chosen)
                        return _Round(chosen, rollout, rewards, parts)

                    rollout, rewards, parts, rounds, fill_metrics = dynamic_sampling_batch(
                        draw,
                        rollout_and_verify,
                        s.train.batch_prompts,
                        G,
                        s.data.dynamic_max_rounds,
                        tok.pad_id,
                    )
                    state, sampler_state = carry["state"], carry["sampler"]
                    with timer.stage("update"):
                        state, metrics = update_fn(state, rollout, rewards, parts)
                        metrics = jax.device_get(metrics)
                    metrics.update(fill_metrics)
                    attempted = [(r.examples, r.parts["correct"].reshape(-1, G)) for r in rounds]
                else:
                    with timer.stage("prompt_selection"):
                        sampler_state, idx = prompt_sampler.next(
                            sampler_state, s.train.batch_prompts
                        )
                        chosen = [enc_train.examples[i] for i in idx]
                        batch = _batch(
                            [enc_train.ids[i] for i in idx],
                            chosen,
                            s.rl.group_size,
                            s.data.buckets,
                            tok.pad_id,
                            task,
                        )
                        batch = sharding.place(batch, plan.rows)
                    if task.in_graph:
                        with timer.stage("train_step"):
                            state, metrics = step_fn(state, batch)
                            metrics = jax.device_get(metrics)
                    else:
                        with timer.stage("rollout"):
                            state, key = ts.split_rollout_key(state)
                            rollout = jax.block_until_ready(rollout_fn(state.params, batch, key))
                        with timer.stage("verification"):
                            rewards, parts = verify(rollout, batch, chosen)
                        with timer.stage("update"):
                            state, metrics = update_fn(state, rollout, rewards, parts)
                            metrics = jax.device_get(metrics)
                    attempted = None
                if not task.in_graph:
                    metrics.update(task.pool.stats.as_dict())
            step += 1
            success_BG = np.asarray(metrics.pop("rows/correct")).reshape(-1, s.rl.group_size)
            if attempted is None:
                attempted = [(chosen, success_BG)]
            for examples, success in attempted:
                sampler_state = prompt_sampler.update(
                    sampler_state, [ex.id for ex in examples], np.asarray(success)
                )
            hist = np.bincount(
                np.rint(success_BG.sum(axis=1)).astype(int), minlength=s.rl.group_size + 1
            )
            metrics["groups/success_hist"] = hist.tolist()
            metrics.update(timer.metrics())
            if s.data.sampler == "curriculum":
                metrics.update(curriculum_lib.summary_stats(sampler_state))
            if s.train.eval_every and step % s.train.eval_every == 0 and step < s.train.steps:
                metrics.update(evaluate(state.params, enc_eval.ids, enc_eval.examples))
            writer.write(step, metrics)
            host = {
                "step": step,
                "prompt_sampler": curriculum_lib.state_to_json(
                    prompt_sampler.state_dict(sampler_state)
                ),
                "eval_before": eval_before,
            }
            stop = guard.should_stop()
            if checkpointer.should_save(step) or stop or step == s.train.steps:
                checkpointer.save(step, state, host, force=True)
            if stop:
                log(f"stopping at step {step} on a termination signal; checkpoint saved")
                break
        eval_after = evaluate(state.params, enc_eval.ids, enc_eval.examples)
    finally:
        guard.uninstall()
        checkpointer.close()
        if not task.in_graph:
            task.close()
    writer.write(step, eval_after)
    writer.close()
    log(
        f"held-out accuracy: before {eval_before['eval/accuracy']:.3f}, after "
        f"{eval_after['eval/accuracy']:.3f} ({int(eval_after['eval/num_prompts'])} prompts, "
        f"greedy)"
    )
    return {
        "eval_before": eval_before,
        "eval_after": eval_after,
        "steps": step,
        "resumed_from": start_step,
        "wall_time": time.time(),
    }
