"""The reward-model stage: Bradley-Terry training on preference pairs (`train.stage="rm"`).

`python -m rlvr_jax.main --config=configs/reward_model_tiny.py` runs it. The pairs come from
`rm.path` (JSONL, `data.preferences`), their prompts templated with `data.template`; `rm.num_eval`
of them are held out. The reward model is the policy's decoder (`model.source`: the preset, a
Hugging Face directory such as an SFT run's export, a GGUF file) with a zero scalar head
(`rewards.reward_model`). The state, optimizer (`optim`), checkpoints, resume and metrics ledger
are the run skeleton's (`program.runtime.run`), so a run resumes exactly from its workdir; the
"evaluation" is the held-out pairwise accuracy (the fraction of pairs scored chosen > rejected),
before and after. An RL run then uses the newest checkpoint as a reward part with
`reward.rm_path=<workdir>` (`program.parts.learned_rewards`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.config_types import ConfigError
from rlvr_jax.data import curriculum as curriculum_lib
from rlvr_jax.data import templates
from rlvr_jax.data.preferences import (
    EncodedPairs,
    encode_pairs,
    load_preferences,
    make_pair_batch,
    pairs_from_examples,
)
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.program.parts import build
from rlvr_jax.program.parts.learned_rewards import rm_train_state
from rlvr_jax.program.runtime.run import Stage, run_stage
from rlvr_jax.program.settings import Settings
from rlvr_jax.rewards import reward_model as rm_lib
from rlvr_jax.rl import state as state_lib

# What the evaluation counts and measures, for the log lines.
EVAL_UNIT = "pairs, pairwise accuracy"


def _batch(enc: EncodedPairs, idx, buckets, pad_id: int) -> rm_lib.PairBatch:
    arrays = make_pair_batch(
        [enc.chosen[i] for i in idx], [enc.rejected[i] for i in idx], buckets, pad_id
    )
    return rm_lib.PairBatch(**{k: jnp.asarray(v) for k, v in arrays.items()})


def pairwise_evaluator(
    model_cfg: ModelConfig, enc: EncodedPairs, batch_size: int, buckets, pad_id: int
) -> Callable[[rm_lib.RewardModelParams], dict[str, float]]:
    """Held-out pairwise accuracy and loss, in fixed-size batches (the last padded with repeats
    of its last pair, which are dropped): "eval/accuracy", "eval/loss", "eval/margin",
    "eval/num_prompts" (pairs)."""
    scores = jax.jit(rm_lib.sequence_scores, static_argnums=4)
    n = len(enc.pairs)

    def evaluate(params: rm_lib.RewardModelParams) -> dict[str, float]:
        margins = []
        for start in range(0, n, batch_size):
            idx = list(range(start, min(start + batch_size, n)))
            real = len(idx)
            idx += [idx[-1]] * (batch_size - real)
            b = _batch(enc, idx, buckets, pad_id)
            s_M = np.asarray(
                jax.device_get(scores(params, b.tokens_MS, b.mask_MS, b.last_M, model_cfg))
            )
            margins.append((s_M[:batch_size] - s_M[batch_size:])[:real])
        m = np.concatenate(margins).astype(np.float64)
        return {
            "eval/accuracy": float(np.mean(m > 0)),
            "eval/loss": float(np.mean(np.logaddexp(0.0, -m))),
            "eval/margin": float(np.mean(m)),
            "eval/num_prompts": float(n),
        }

    return evaluate


def _split(pairs, num_eval: int, seed: int):
    if num_eval >= len(pairs):
        raise ConfigError(f"rm.num_eval={num_eval} leaves no training pairs out of {len(pairs)}")
    order = np.random.default_rng(seed).permutation(len(pairs))
    held = set(order[:num_eval].tolist())
    train = [p for i, p in enumerate(pairs) if i not in held]
    return train, [p for i, p in enumerate(pairs) if i in held]


def run(
    settings: Settings,
    workdir: str | Path,
    log: Callable[[str], None] = print,
    allow_changed_settings: bool = False,
    resume_step: int | None = None,
) -> dict:
    """Trains a reward model on `rm.path`, evaluating before and after; resumes from `workdir`.

    Returns:
      {"eval_before", "eval_after", "steps", "resumed_from", "loss_first", "loss_last"}.
    """
    tok, params, model_cfg, s = build.policy_and_settings(settings)
    if s.rm.path:
        pairs, report = load_preferences(s.rm.path)
        log(report.summary())
    else:
        train_ex, eval_ex, notes = build.load_examples(s.data)
        for note in notes:
            log(note)
        pairs = pairs_from_examples([*train_ex, *eval_ex], s.data.seed)
        log(
            f"{len(pairs)} preference pairs from data.name={s.data.name!r}: each gold answer "
            "chosen over another example's"
        )
    template = templates.get_template(s.data.template)
    max_len = max(s.rm.buckets)
    train_pairs, eval_pairs = _split(pairs, s.rm.num_eval, s.data.seed)
    enc = encode_pairs(train_pairs, template, tok, max_len)
    log(enc.summary())
    if len(enc.pairs) < s.rm.batch_size:
        raise ConfigError(f"rm.batch_size={s.rm.batch_size} exceeds the {len(enc.pairs)} pairs")
    steps = math.ceil(s.rm.epochs * len(enc.pairs) / s.rm.batch_size) or s.train.steps

    optimizer = state_lib.make_optimizer(s.optim)
    step_fn = rm_lib.build_rm_step(model_cfg, optimizer, state_lib.learning_rate_schedule(s.optim))
    state = rm_train_state(rm_lib.init_reward_model(params), s)
    del params
    sampler = curriculum_lib.EpochSampler(enc.pairs, shuffle=True)

    def step(state, sampler_state):
        start = time.perf_counter()
        sampler_state, idx = sampler.next(sampler_state, s.rm.batch_size)
        state, metrics = step_fn(state, _batch(enc, idx, s.rm.buckets, tok.pad_id))
        metrics = jax.device_get(metrics)
        metrics["time/step"] = time.perf_counter() - start
        metrics["rm/epoch"] = sampler_state.epoch + sampler_state.position / len(enc.pairs)
        return state, sampler_state, metrics

    evaluate = None
    if eval_pairs:
        enc_eval = encode_pairs(eval_pairs, template, tok, max_len)
        evaluate = pairwise_evaluator(
            model_cfg, enc_eval, s.rm.batch_size, s.rm.buckets, tok.pad_id
        )
    stage = Stage(
        name="RM",
        steps=steps,
        state=state,
        sampler=sampler,
        step=step,
        evaluate=evaluate,
        eval_unit=EVAL_UNIT,
    )
    result = run_stage(stage, s, workdir, log, allow_changed_settings, resume_step)
    losses = [float(m["rm/loss"]) for m in result.step_metrics]
    if losses:
        log(
            f"RM loss: {losses[0]:.4f} at step {result.resumed_from + 1}, {losses[-1]:.4f} at "
            f"step {result.steps}; use it with --config.reward.rm_path={workdir}"
        )
    return {
        "eval_before": result.eval_before,
        "eval_after": result.eval_after,
        "steps": result.steps,
        "resumed_from": result.resumed_from,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
    }
