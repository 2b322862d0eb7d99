"""The SFT stage: a cold start on demonstrations or distillation traces before RL.

`python -m rlvr_jax.main --config=configs/sft_tiny.py` runs it (`train.stage="sft"`).
Demonstrations come from `sft.path`, or from the training examples of `data`: with their gold
answer as the response (`rlvr_jax.sft.data`), or, for a multi-turn task (tools), as the task's
scripted gold episodes (`rlvr_jax.envs.demonstrations`, the loss on the model's turns only). The
update is `rlvr_jax.sft.step`. The state, optimizer, checkpoints, evaluation and metrics ledger
are the run skeleton's, as for RL, so a run resumes exactly from its workdir (data order
included). At the end the policy is written as a Hugging Face directory `<workdir>/hf`
(config.json, safetensors, tokenizer), and the RL stage starts from it with
`model.source=<workdir>/hf`.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp

from rlvr_jax.config_types import ConfigError
from rlvr_jax.data import curriculum as curriculum_lib
from rlvr_jax.data import templates
from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.demonstrations import scripted_demonstrations
from rlvr_jax.envs.single_turn import build_task
from rlvr_jax.envs.task import MultiTurnTask, Task
from rlvr_jax.model import hf
from rlvr_jax.program.evals.evaluation import heldout_evaluator
from rlvr_jax.program.parts import build
from rlvr_jax.program.runtime.run import Stage, run_stage
from rlvr_jax.program.settings import Settings
from rlvr_jax.rl import state as state_lib
from rlvr_jax.sft import traces
from rlvr_jax.sft.data import (
    EncodedDemonstrations,
    demonstrations_from_examples,
    encode_demonstrations,
    from_episodes,
    load_demonstrations,
)
from rlvr_jax.sft.step import build_sft_step, make_batch

EXPORT_DIR = "hf"


def written_after_final(s: Settings, workdir: str | Path) -> tuple[Path, ...]:
    """What the stage writes after its final evaluation: the export, when `sft.export`."""
    return (Path(workdir) / EXPORT_DIR,) if s.sft.export else ()


def _encoded(
    s: Settings,
    tok: Tokenizer,
    template: templates.PromptTemplate,
    train_ex: Sequence[Example] | None,
    task: Task | None,
    log: Callable[[str], None],
) -> EncodedDemonstrations:
    """The demonstrations, tokenized: `sft.path`'s; or, without one, the scripted gold episodes
    of a multi-turn task (`envs.demonstrations`), or the training examples with their answers."""
    max_len = max(s.sft.buckets)
    if not s.sft.path and isinstance(task, MultiTurnTask):
        played = scripted_demonstrations(task, train_ex or [], max_len, s.reward.tool_workers)
        log(played.summary())
        if not played.episodes:
            raise ConfigError(
                f"reward.verifier={s.reward.verifier!r} gave no scripted demonstration of the "
                f"{len(train_ex or [])} training examples of data.name={s.data.name!r} within "
                f"{max_len} tokens ({played.summary()}); set sft.path or raise sft.buckets"
            )
        return from_episodes(played, train_ex or [], max_len)
    if not s.sft.path:
        demos = demonstrations_from_examples(
            train_ex or [], s.sft.response_format, traces.thought_for
        )
    else:
        demos, report = load_demonstrations(s.sft.path, s.sft.prompt_field, s.sft.response_field)
        log(report.summary())
    return encode_demonstrations(demos, template, tok, max_len)


def _sft_step(s: Settings, step_fn, sampler, enc: EncodedDemonstrations, pad_id: int):
    def step(state, sampler_state):
        start = time.perf_counter()
        sampler_state, idx = sampler.next(sampler_state, s.sft.batch_size)
        batch = make_batch(
            [enc.ids[i] for i in idx],
            [enc.prompt_lengths[i] for i in idx],
            s.sft.buckets,
            pad_id,
            None if enc.trained is None else [enc.trained[i] for i in idx],
        )
        state, metrics = step_fn(state, jax.tree.map(jnp.asarray, batch))
        metrics = jax.device_get(metrics)
        metrics["time/step"] = time.perf_counter() - start
        metrics["sft/epoch"] = sampler_state.epoch + sampler_state.position / len(enc.ids)
        return state, sampler_state, metrics

    return step


def run(
    settings: Settings,
    workdir: str | Path,
    log: Callable[[str], None] = print,
    allow_changed_settings: bool = False,
    resume_step: int | None = None,
) -> dict:
    """Fine-tunes on demonstrations, evaluating before and after; resumes from `workdir`.

    Returns:
      {"eval_before", "eval_after" (None when `sft.eval` is off), "steps", "resumed_from",
      "export" (the Hugging Face directory, or None), "loss_first", "loss_last"}.
    """
    tok, params, model_cfg, s = build.policy_and_settings(settings)
    template = templates.get_template(s.data.template)

    train_ex = eval_ex = None
    if s.sft.eval or not s.sft.path:
        train_ex, eval_ex, notes = build.load_examples(s.data)
        for note in notes:
            log(note)
    with contextlib.ExitStack() as stack:
        task = enc_eval = None
        # The task evaluates, and a multi-turn one scripts the demonstrations.
        if s.sft.eval or (not s.sft.path and s.reward.multi_turn):
            enc_eval = templates.encode_prompts(eval_ex, template, tok, s.data.buckets)
            task = build_task(
                s.reward, tok, model_cfg.vocab_size, enc_eval.examples, s.data.template
            )
            stack.enter_context(task)
        enc = _encoded(s, tok, template, train_ex, task, log)
        log(enc.summary())
        if len(enc.ids) < s.sft.batch_size:
            raise ConfigError(
                f"sft.batch_size={s.sft.batch_size} exceeds the {len(enc.ids)} demonstrations"
            )
        steps = math.ceil(s.sft.epochs * len(enc.ids) / s.sft.batch_size) or s.train.steps

        optimizer = state_lib.make_optimizer(s.optim)
        step_fn = build_sft_step(
            model_cfg, optimizer, state_lib.learning_rate_schedule(s.optim), s.rl.logprob_chunk
        )
        state = state_lib.init_train_state(
            params, optimizer, jax.random.key(s.train.seed + 1), use_reference=False
        )
        sampler = curriculum_lib.EpochSampler(enc.demos, shuffle=True)
        evaluate = None
        if s.sft.eval:
            evaluate = heldout_evaluator(model_cfg, s, task, tok, enc_eval.ids, enc_eval.examples)
        stage = Stage(
            name="SFT",
            steps=steps,
            state=state,
            sampler=sampler,
            step=_sft_step(s, step_fn, sampler, enc, tok.pad_id),
            evaluate=evaluate,
            ref_source=build.base_source(s.model),
        )
        result = run_stage(stage, s, workdir, log, allow_changed_settings, resume_step)
    losses = [float(m["sft/loss"]) for m in result.step_metrics]
    if losses:
        log(
            f"SFT loss: {losses[0]:.4f} at step {result.resumed_from + 1}, {losses[-1]:.4f} at "
            f"step {result.steps}"
        )
    out_dir = None
    if s.sft.export and result.steps == steps:
        out_dir = Path(workdir) / EXPORT_DIR
        if jax.process_index() == 0:
            hf.save_hf(result.state.params, model_cfg, out_dir, tokenizer=tok, overwrite=True)
        log(f"policy written to {out_dir}; RL from it with --config.model.source={out_dir}")
    return {
        "eval_before": result.eval_before,
        "eval_after": result.eval_after,
        "steps": result.steps,
        "resumed_from": result.resumed_from,
        "export": out_dir,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
    }
