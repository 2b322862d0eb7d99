"""Supervised fine-tuning: a cold start on demonstrations or distillation traces before RL.

`python -m rlvr_jax.main --config=configs/sft_tiny.py` runs it (`train.stage="sft"`).

Demonstrations are (prompt, response) pairs: a JSONL file (`sft.path`; fields "prompt"/"response",
"question"/"solution" and the other pairs of `FIELD_PAIRS`, or the ones the config names), or the
training examples of `data` with their gold answer as the response. Malformed rows are counted and
skipped, and a summary line says how many of each and where.

The prompt goes through the same template (`data.template`) that the RL stage uses, and the
prompt and the response are tokenized apart and concatenated, followed by the tokenizer's first
end id: exactly the token sequence the sampler would produce when it answers that prompt. The
loss is the token-mean negative log-likelihood of the response tokens (end token included) over
the batch; prompt and padding tokens are masked out. Sequences are right-padded to the smallest
of `sft.buckets` that holds the batch (a few static shapes, a few compilations). They are not
packed: the decoder's attention mask has no segment ids, so packed examples would attend to each
other.

The state, optimizer (`rl.state.make_optimizer`), checkpoints (`checkpoint.Checkpointer`) and
metrics ledger are the RL stage's; a run resumes exactly from its workdir (data order included).
At the end the policy is written as a Hugging Face directory `<workdir>/hf` (config.json,
safetensors, tokenizer), and the RL stage starts from it with `model.source=<workdir>/hf`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlvr_jax import export as export_lib
from rlvr_jax import train
from rlvr_jax.config_types import ConfigError
from rlvr_jax.data import curriculum as curriculum_lib
from rlvr_jax.data import datasets, templates
from rlvr_jax.data.datasets import Example, LoadReport, MalformedRowError
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.model import hf
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import Params
from rlvr_jax.program import checkpoint as ckpt_lib
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.rl import state as state_lib
from rlvr_jax.rl.logprobs import next_token_logprobs
from rlvr_jax.rl.state import TrainState

Array = jax.Array

# (prompt field, response field) pairs tried in order on each row.
FIELD_PAIRS = (
    ("prompt", "response"),
    ("prompt", "completion"),
    ("question", "solution"),
    ("question", "response"),
    ("problem", "solution"),
)
EXPORT_DIR = "hf"

# ---------------------------------------------------------------------------------------------
# Demonstrations


@dataclasses.dataclass(frozen=True)
class Demonstration:
    """One (prompt, response) pair.

    Attributes:
      id: unique ("<file stem>/<0-based line>" unless the row has a string "id").
      prompt: the question, before the prompt template.
      response: the text the model learns to produce after the templated prompt.
      answer: the gold answer when the row has one ("" otherwise); not used by the loss.
      source: the row's "source" field, or "sft".
    """

    id: str
    prompt: str
    response: str
    answer: str = ""
    source: str = "sft"


def _demonstration(
    row: Any, stem: str, index: int, fields: tuple[str, str] | None
) -> Demonstration:
    """One JSONL row as a demonstration; raises `MalformedRowError`."""
    if not isinstance(row, dict):
        raise MalformedRowError("not_an_object", f"the row is a {type(row).__name__}")
    pairs = [fields] if fields else FIELD_PAIRS
    pair = next((p for p in pairs if p[0] in row and p[1] in row), None)
    if pair is None:
        wanted = " or ".join(f"{p!r}/{r!r}" for p, r in pairs)
        raise MalformedRowError("missing_field", f"the row has none of the field pairs {wanted}")
    prompt, response = row[pair[0]], row[pair[1]]
    if not isinstance(prompt, str) or not prompt.strip():
        raise MalformedRowError("empty_prompt", f"{pair[0]}={prompt!r} is not a non-empty string")
    if not isinstance(response, str) or not response.strip():
        raise MalformedRowError(
            "empty_response", f"{pair[1]}={response!r} is not a non-empty string"
        )
    answer = row.get("answer", "")
    row_id = row.get("id")
    return Demonstration(
        id=row_id if isinstance(row_id, str) and row_id else f"{stem}/{index}",
        prompt=prompt.strip(),
        response=response,
        answer=str(answer).strip() if isinstance(answer, str | int | float) else "",
        source=row["source"] if isinstance(row.get("source"), str) else "sft",
    )


def load_demonstrations(
    path: str | Path, prompt_field: str = "", response_field: str = ""
) -> tuple[list[Demonstration], LoadReport]:
    """Reads demonstrations from JSONL, counting and skipping malformed rows.

    Args:
      path: the JSONL file.
      prompt_field, response_field: the fields to read; empty tries `FIELD_PAIRS`.

    Returns:
      (demonstrations in file order, report); `report.summary()` is the line for the log.

    Raises:
      FileNotFoundError: for a missing file.
      ValueError: for an empty file or one without a well-formed row.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"demonstrations file {str(path)!r} does not exist")
    fields = (prompt_field, response_field) if prompt_field else None
    return datasets._collect(  # noqa: SLF001 (the loaders' shared row counting)
        datasets._jsonl_rows(path),  # noqa: SLF001
        lambda line, row: _demonstration(row, path.stem, line - 1, fields),
        str(path),
        exclude_multiple_choice=False,
        exclude_true_false=False,
    )


def demonstrations_from_examples(
    examples: Iterable[Example], response_format: str = "{answer}"
) -> list[Demonstration]:
    """Demonstrations whose response is `response_format` with the gold answer in it (generated
    tasks, where the answer is the whole response)."""
    return [
        Demonstration(
            id=ex.id,
            prompt=ex.prompt_text,
            response=response_format.replace("{answer}", ex.answer),
            answer=ex.answer,
            source=ex.source,
        )
        for ex in examples
    ]


@dataclasses.dataclass(frozen=True)
class EncodedDemonstrations:
    """Token ids of the demonstrations that fit.

    Attributes:
      ids: prompt + response + end id, per kept demonstration.
      prompt_lengths: how many of those ids are the prompt's.
      demos: the kept demonstrations, aligned with `ids`.
      num_too_long: demonstrations longer than `max_len`, skipped.
      too_long_ids: the first few skipped ids.
      max_len: the limit (the largest sequence bucket).
    """

    ids: list[list[int]]
    prompt_lengths: list[int]
    demos: list[Demonstration]
    num_too_long: int
    too_long_ids: tuple[str, ...]
    max_len: int

    def summary(self) -> str:
        """One line for the log."""
        n = sum(len(i) - p for i, p in zip(self.ids, self.prompt_lengths, strict=True))
        line = f"{len(self.ids)} demonstrations fit in {self.max_len} tokens ({n} response tokens)"
        if self.num_too_long:
            line += (
                f"; skipped {self.num_too_long} longer ones, e.g. {', '.join(self.too_long_ids)}"
            )
        return line


def encode_demonstrations(
    demos: Sequence[Demonstration],
    template: templates.PromptTemplate,
    tokenizer: Tokenizer,
    max_len: int,
) -> EncodedDemonstrations:
    """Templated prompt ids, then response ids and the tokenizer's first end id.

    Prompt and response are tokenized apart, as the sampler sees them: the prompt ids are the
    RL stage's (`templates.encode_prompts`), the response ids what it would generate.

    Raises:
      ValueError: when no demonstration fits in `max_len`.
    """
    end_id = tokenizer.eos_ids[0]
    ids, prompt_lengths, kept, too_long = [], [], [], []
    for d in demos:
        prompt = tokenizer.encode(templates.render(d.prompt, template, tokenizer))
        seq = [*prompt, *tokenizer.encode(d.response), end_id]
        if len(seq) > max_len:
            too_long.append(d.id)
            continue
        ids.append(seq)
        prompt_lengths.append(len(prompt))
        kept.append(d)
    if demos and not ids:
        raise ValueError(
            f"none of {len(demos)} demonstrations fits in {max_len} tokens with template "
            f"{template.name!r} (raise sft.buckets)"
        )
    return EncodedDemonstrations(
        ids, prompt_lengths, kept, len(too_long), tuple(too_long[:5]), max_len
    )


# ---------------------------------------------------------------------------------------------
# Batches and the loss


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SFTBatch:
    """Right-padded sequences and which next-token targets the loss counts."""

    tokens_NS: Array  # (N, S) int32
    mask_NS: Array  # (N, S) bool: real tokens
    loss_mask_NT: Array  # (N, S - 1) bool: target tokens_NS[:, t + 1] is a response token


def make_batch(
    ids: Sequence[Sequence[int]],
    prompt_lengths: Sequence[int],
    buckets: Sequence[int],
    pad_id: int,
) -> SFTBatch:
    """Pads sequences on the right to the smallest bucket that holds the longest (numpy arrays).

    Raises:
      ValueError: for a sequence longer than the largest bucket, or a prompt that leaves no
        response token.
    """
    sizes = sorted(int(b) for b in buckets)
    longest = max(len(s) for s in ids)
    if longest > sizes[-1]:
        raise ValueError(f"a sequence has {longest} tokens, more than the largest bucket {sizes}")
    S = next(b for b in sizes if b >= longest)
    tokens = np.full((len(ids), S), pad_id, np.int32)
    mask = np.zeros((len(ids), S), bool)
    loss_mask = np.zeros((len(ids), S - 1), bool)
    for i, (seq, p) in enumerate(zip(ids, prompt_lengths, strict=True)):
        if not 1 <= p < len(seq):
            raise ValueError(f"row {i}: prompt length {p} of a {len(seq)}-token sequence")
        tokens[i, : len(seq)] = seq
        mask[i, : len(seq)] = True
        # Position t predicts token t + 1: the targets p .. len - 1 are the response.
        loss_mask[i, p - 1 : len(seq) - 1] = True
    return SFTBatch(tokens, mask, loss_mask)


def sft_loss(
    params: Params, batch: SFTBatch, model_cfg: ModelConfig, chunk: int = 256
) -> tuple[Array, Array]:
    """Token-mean NLL of the response tokens over the batch, and how many there are (f32)."""
    N, S = batch.tokens_NS.shape
    positions_NS = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (N, S))
    logp_NT, _ = next_token_logprobs(
        params, batch.tokens_NS, positions_NS, model_cfg, batch.mask_NS, 1, chunk
    )
    m_NT = batch.loss_mask_NT.astype(jnp.float32)
    num = jnp.sum(m_NT)
    return -jnp.sum(logp_NT * m_NT) / jnp.maximum(num, 1.0), num


def build_sft_step(
    model_cfg: ModelConfig,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    chunk: int = 256,
) -> Callable[[TrainState, SFTBatch], tuple[TrainState, dict[str, Array]]]:
    """The jitted update `(state, batch) -> (state, metrics)`; the state is donated."""

    def step(state: TrainState, batch: SFTBatch):
        (loss, num), grads = jax.value_and_grad(sft_loss, has_aux=True)(
            state.params, batch, model_cfg, chunk
        )
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        metrics = {
            "sft/loss": loss,
            "sft/tokens": num,
            "sft/grad_norm": optax.global_norm(grads),
            "sft/lr": schedule(state.step),
        }
        new = dataclasses.replace(
            state,
            step=state.step + 1,
            params=optax.apply_updates(state.params, updates),
            opt_state=opt_state,
        )
        return new, metrics

    return jax.jit(step, donate_argnums=0)


# ---------------------------------------------------------------------------------------------
# The loop


def _demonstrations(
    s: settings_lib.Settings, train_ex: Sequence[Example] | None, log: Callable[[str], None]
) -> list[Demonstration]:
    if not s.sft.path:
        return demonstrations_from_examples(train_ex or [], s.sft.response_format)
    demos, report = load_demonstrations(s.sft.path, s.sft.prompt_field, s.sft.response_field)
    log(report.summary())
    return demos


def run(
    settings: settings_lib.Settings, workdir: str | Path, log: Callable[[str], None] = print
) -> dict:
    """Fine-tunes on demonstrations, evaluating before and after; resumes from `workdir`.

    Returns:
      {"eval_before", "eval_after" (None when `sft.eval` is off), "steps", "resumed_from",
      "export" (the Hugging Face directory, or None), "loss_first", "loss_last"}.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    settings_lib.save_settings(settings, workdir)
    s = settings
    tok = train.build_tokenizer(s.model)
    params, model_cfg = export_lib.load_policy(s.model, tok, s.train.seed)
    sampler_cfg = s.rl.sampler
    if not sampler_cfg.eos_ids:
        sampler_cfg = dataclasses.replace(sampler_cfg, eos_ids=tok.eos_ids, pad_id=tok.pad_id)
    s = dataclasses.replace(s, rl=dataclasses.replace(s.rl, sampler=sampler_cfg))
    template = templates.get_template(s.data.template)

    train_ex = eval_ex = None
    if s.sft.eval or not s.sft.path:
        train_ex, eval_ex, notes = train.load_examples(s.data)
        for note in notes:
            log(note)
    enc = encode_demonstrations(
        _demonstrations(s, train_ex, log), template, tok, max(s.sft.buckets)
    )
    log(enc.summary())
    if len(enc.ids) < s.sft.batch_size:
        raise ConfigError(
            f"sft.batch_size={s.sft.batch_size} exceeds the {len(enc.ids)} demonstrations"
        )
    steps = math.ceil(s.sft.epochs * len(enc.ids) / s.sft.batch_size) or s.train.steps

    evaluate = None
    if s.sft.eval:
        enc_eval = templates.encode_prompts(eval_ex, template, tok, s.data.buckets)
        task = train.build_task(s.reward, tok, model_cfg, enc_eval.examples, s.data.template)
        greedy = train.build_evaluator(model_cfg, s, task, tok.pad_id)
        evaluate = lambda p: greedy(p, enc_eval.ids, enc_eval.examples)  # noqa: E731

    optimizer = state_lib.make_optimizer(s.optim)
    step_fn = build_sft_step(
        model_cfg, optimizer, state_lib.learning_rate_schedule(s.optim), s.rl.logprob_chunk
    )
    state = state_lib.init_train_state(
        params, optimizer, jax.random.key(s.train.seed + 1), use_reference=False
    )
    sampler = curriculum_lib.EpochSampler(enc.demos, shuffle=True)
    sampler_state = sampler.init(s.data.seed)
    checkpointer = ckpt_lib.Checkpointer(
        workdir / "checkpoints",
        every_steps=s.train.checkpoint_every or max(steps, 1),
        keep=s.train.keep_checkpoints,
    )
    state, host, start_step, writer = train.resume(
        checkpointer, state, workdir, s, max(steps, 1), log
    )
    eval_before = None
    if host is not None:
        sampler_state = sampler.load_state_dict(curriculum_lib.state_from_json(host["data"]))
        eval_before = host.get("eval_before")
    if evaluate is not None and eval_before is None:
        eval_before = evaluate(state.params)
        writer.write(0, eval_before)
    if eval_before is not None:
        log(f"held-out accuracy before SFT: {eval_before['eval/accuracy']:.3f}")

    guard = ckpt_lib.PreemptionGuard()
    guard.install()
    step, losses, eval_after = start_step, [], None
    try:
        while step < steps:
            start = time.perf_counter()
            sampler_state, idx = sampler.next(sampler_state, s.sft.batch_size)
            batch = make_batch(
                [enc.ids[i] for i in idx],
                [enc.prompt_lengths[i] for i in idx],
                s.sft.buckets,
                tok.pad_id,
            )
            state, metrics = step_fn(state, jax.tree.map(jnp.asarray, batch))
            metrics = jax.device_get(metrics)
            step += 1
            metrics["time/step"] = time.perf_counter() - start
            metrics["sft/epoch"] = sampler_state.epoch + sampler_state.position / len(enc.ids)
            losses.append(float(metrics["sft/loss"]))
            periodic = s.train.eval_every and step % s.train.eval_every == 0 and step < steps
            if evaluate is not None and periodic:
                metrics.update(evaluate(state.params))
            writer.write(step, metrics)
            host = {
                "step": step,
                "data": curriculum_lib.state_to_json(sampler.state_dict(sampler_state)),
                "eval_before": eval_before,
            }
            stop = guard.should_stop()
            if checkpointer.should_save(step) or stop or step == steps:
                checkpointer.save(step, state, host, force=True)
            if stop:
                log(f"stopping at step {step} on a termination signal; checkpoint saved")
                break
        if evaluate is not None:
            eval_after = evaluate(state.params)
    finally:
        guard.uninstall()
        checkpointer.close()
        if evaluate is not None and not task.in_graph:
            task.close()
    if eval_after is not None:
        writer.write(step, eval_after)
    writer.close()
    if losses:
        log(f"SFT loss: {losses[0]:.4f} at step {start_step + 1}, {losses[-1]:.4f} at step {step}")
    if eval_before is not None and eval_after is not None:
        log(
            f"held-out accuracy: before {eval_before['eval/accuracy']:.3f}, after "
            f"{eval_after['eval/accuracy']:.3f} ({int(eval_after['eval/num_prompts'])} prompts, "
            "greedy)"
        )
    out_dir = None
    if s.sft.export and step == steps:
        out_dir = workdir / EXPORT_DIR
        if jax.process_index() == 0:
            hf.save_hf(state.params, model_cfg, out_dir, tokenizer=tok)
        log(f"policy written to {out_dir}; RL from it with --config.model.source={out_dir}")
    return {
        "eval_before": eval_before,
        "eval_after": eval_after,
        "steps": step,
        "resumed_from": start_step,
        "export": out_dir,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
    }
