"""Seconds per GRPO step: rlvr_jax against TRL's `GRPOTrainer`, same weights, prompts and sizes.

Command (CPU; the README's set-up plus `pip install -e ".[bench]"`):

    PYTHONPATH=. python benchmarks/train_step.py            # tiny random Qwen2, then SmolLM2-135M
    PYTHONPATH=. python benchmarks/train_step.py --quick    # smaller sizes, fewer steps (~2 min)

Both sides run in this one process on the same weights (the tiny Qwen2 is made with
`transformers`, saved, and loaded into ours with `hf.load_hf`; SmolLM2 is ours from the embedded
GGUF, exported with `hf.save_hf` and loaded by `transformers`), the same prompts of exactly P
tokens, B prompts x G samples, exactly T new tokens (no eos stopping on either side: TRL
suppresses the eos ids, ours has none), temperature 1, GRPO group advantages, the clipped
token-mean loss, mu = 1, beta = 0, AdamW with a constant learning rate, gradient clipping at 1,
f32, no activation checkpointing.

The steps are interleaved: after each TRL step (from a `TrainerCallback`) one step of ours split
and one of ours fused run, so that all three see the same load on a shared machine. What is timed
(medians over `--steps` steps after `--warmup` steps, wall and process-CPU seconds):
- TRL: `on_step_begin` to `on_step_end` (generation, decoding, reward, the loss's forward and
  backward, clipping, AdamW); "rollout" is the time inside `model.generate`, "update" the rest.
- ours split: `build_rollout`, then the jitted reward and `build_update` ("update"), each waited
  for with `jax.block_until_ready`.
- ours fused: `build_train_step`, one program, end to end.
Ours is compiled ahead of time (`.lower().compile()`) before the first step; that is the compile
column, not counted in the steps.

It first prints the rate of one f32 matmul of the SmolLM2 update's shape on each side
(`--matmuls-only` stops there): the ceiling of a matmul-bound update on these threads.

The process is pinned to `--threads` CPUs (default 1; see `pin_cpus`). The reward is the fraction
of completion tokens that are digit tokens: a Python function of `completion_ids` for TRL, a table
lookup over `tokens_NT` for ours.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.data import tokenizer as tokenizer_lib
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.model import hf, loading
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.rl import losses
from rlvr_jax.rl import state as state_lib
from rlvr_jax.rl import train_step as ts
from rlvr_jax.sampling.config import SamplerConfig
from rlvr_jax.sampling.host import bucket_and_pad
from rlvr_jax.types import Rollout


@dataclasses.dataclass(frozen=True)
class Sizes:
    """One model's benchmark shape: B prompts x G samples, P prompt tokens, T new tokens."""

    batch: int
    group: int
    prompt_len: int
    new_tokens: int

    @property
    def rows(self) -> int:
        return self.batch * self.group

    def __str__(self) -> str:
        return f"B={self.batch} x G={self.group}, P={self.prompt_len}, T={self.new_tokens}"


@dataclasses.dataclass(frozen=True)
class Timing:
    """One side's measured steps: arrays of (steps, 2) wall and CPU seconds; None where a side
    has no such split. `compile` is wall seconds."""

    side: str
    rollout: np.ndarray | None
    update: np.ndarray | None
    total: np.ndarray
    compile: float | None = None

    def median(self, phase: str, cpu: bool = False) -> float | None:
        x = getattr(self, phase)
        return None if x is None else float(np.median(x[:, int(cpu)]))


@dataclasses.dataclass(frozen=True)
class Task:
    """Everything both sides share for one model."""

    name: str
    hf_dir: Path  # config.json, model.safetensors, tokenizer files
    params: object  # ours, the same weights as hf_dir
    cfg: ModelConfig
    tokenizer: Tokenizer
    prompts: list[list[int]]  # (warmup + steps) * B prompts of exactly P ids, B per step
    texts: list[str]  # their text, which the HF tokenizer encodes to exactly those ids
    digit_ids: tuple[int, ...]
    sizes: Sizes


# ---------------------------------------------------------------------------------------------
# Models, tokenizers, prompts


def _word_tokenizer(vocab_size: int):
    """A word-level HF tokenizer: <pad>, <eos>, the ten digits, then three-letter words."""
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ("".join(w) for w in itertools.product("abcdefghijklmnopqrstuvwxyz", repeat=3))
    names = ["<pad>", "<eos>", *"0123456789", *itertools.islice(words, vocab_size - 12)]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({n: i for i, n in enumerate(names)}))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<pad>", "<eos>"])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<eos>",
        pad_token="<pad>",
        clean_up_tokenization_spaces=False,
    )


def make_tiny_qwen2(directory: Path, args: argparse.Namespace) -> None:
    """A random Qwen2 and its word-level tokenizer, saved with `save_pretrained`."""
    import torch
    import transformers

    config = transformers.Qwen2Config(
        vocab_size=args.tiny_vocab,
        hidden_size=args.tiny_hidden,
        intermediate_size=3 * args.tiny_hidden,
        num_hidden_layers=args.tiny_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(args.seed)
    model = transformers.Qwen2ForCausalLM(config)
    model.save_pretrained(directory)
    _word_tokenizer(args.tiny_vocab).save_pretrained(directory)


def _load_hf_tokenizer(directory: Path):
    """The saved tokenizer as the class it was saved from. (`AutoTokenizer` would pick the model
    type's class, e.g. `Qwen2Tokenizer`, which adds its own special tokens and pre-tokenizer.)"""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(directory))


def _hf_encode(hf_tok, texts: Sequence[str]) -> list[list[int]]:
    """Ids exactly as `GRPOTrainer` tokenizes plain-text prompts (`processing_class(text=...)`)."""
    return [list(ids) for ids in hf_tok(text=list(texts))["input_ids"]]


def make_prompts(hf_tok, count: int, length: int, seed: int) -> tuple[list[list[int]], list[str]]:
    """`count` random prompts of exactly `length` ids whose text the tokenizer encodes back to them.

    Prompts are runs of whole-word tokens (" word" for byte-level BPE, "word" for the word-level
    tokenizer) drawn from the vocabulary, so that text -> ids is exact and equal on both sides.
    """
    vocab = hf_tok.get_vocab()
    special = set(hf_tok.all_special_ids)
    pieces = hf_tok.batch_decode([[i] for i in range(len(vocab))])
    # Byte-level BPE vocabularies spell a word start with its space; a word-level one has none.
    spaced = any(re.match(r"^ [a-z]{3,}$", p) for p in pieces)
    word = re.compile(r"^ [a-z]{3,}$" if spaced else r"^[a-z]{3,}$")
    joiner = "" if spaced else " "
    pool = [i for i, p in enumerate(pieces) if i not in special and word.match(p)]
    encoded = _hf_encode(hf_tok, [pieces[i] for i in pool])
    pool = [i for i, ids in zip(pool, encoded, strict=True) if ids == [i]]
    if len(pool) < 100:
        raise ValueError(f"only {len(pool)} whole-word tokens in the vocabulary")
    rng = np.random.default_rng(seed)
    ids, texts = [], []
    for _ in range(20 * count):
        cand = [int(i) for i in rng.choice(pool, size=length)]
        text = joiner.join(pieces[i] for i in cand)
        if _hf_encode(hf_tok, [text])[0] == cand:
            ids.append(cand)
            texts.append(text)
            if len(ids) == count:
                return ids, texts
    raise ValueError(f"{len(ids)} of {count} random prompts survive text -> ids unchanged")


def digit_ids(hf_tok, vocab_size: int) -> tuple[int, ...]:
    """Ids whose text is one or more digits (surrounding spaces allowed)."""
    n = min(vocab_size, len(hf_tok))
    pieces = hf_tok.batch_decode([[i] for i in range(n)])
    return tuple(i for i, p in enumerate(pieces) if p.strip().isdigit())


def build_task(name: str, sizes: Sizes, count: int, workdir: Path, args) -> Task:
    """Writes the HF checkpoint both sides load and draws the prompts."""
    directory = workdir / name
    if name == "tiny-qwen2":
        make_tiny_qwen2(directory, args)
        params, cfg = hf.load_hf(directory, allow_download=False)
        tokenizer = Tokenizer(_load_hf_tokenizer(directory))
    elif name == "smollm2-135m":
        params, cfg = loading.load_model(loading.EMBEDDED)
        tokenizer = tokenizer_lib.load_tokenizer(loading.EMBEDDED)
        hf.save_hf(params, cfg, directory, tokenizer=tokenizer)
    else:
        raise ValueError(f"unknown model {name!r}")
    hf_tok = tokenizer._backend  # the transformers tokenizer, which TRL is given too
    prompts, texts = make_prompts(hf_tok, count, sizes.prompt_len, args.seed)
    return Task(
        name, directory, params, cfg, tokenizer, prompts, texts, digit_ids(hf_tok, cfg.vocab_size),
        sizes,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Ours


def make_digit_reward(digits: Sequence[int], vocab_size: int) -> ts.RewardFn:
    """In-graph reward: the fraction of a completion's tokens that are digit tokens."""
    table_V = np.zeros(vocab_size, bool)
    table_V[list(digits)] = True
    table_V = jnp.asarray(table_V)

    def reward_fn(rollout: Rollout, targets) -> tuple[jax.Array, dict[str, jax.Array]]:
        del targets
        hit_NT = table_V[rollout.tokens_NT] & rollout.mask_NT
        frac_N = jnp.sum(hit_NT, axis=1) / jnp.maximum(jnp.sum(rollout.mask_NT, axis=1), 1)
        frac_N = frac_N.astype(jnp.float32)
        return frac_N, {"digits": frac_N}

    return reward_fn


def _ours_setup(task: Task, args):
    """Our settings matching TRL's, the reward, the step batches and a fresh train state."""
    s = task.sizes
    sampler = SamplerConfig(max_new_tokens=s.new_tokens, eos_ids=(), pad_id=task.tokenizer.pad_id)
    rl = ts.RLConfig(
        group_size=s.group,
        sampler=sampler,
        loss=losses.LossConfig(aggregation="token_mean", clip_low=0.2, clip_high=0.2),
        temperature=1.0,
    )
    ocfg = state_lib.OptimConfig(
        learning_rate=args.lr, schedule="constant", total_steps=1000, max_grad_norm=1.0
    )
    optimizer = state_lib.make_optimizer(ocfg)
    schedule = state_lib.learning_rate_schedule(ocfg)
    reward_fn = make_digit_reward(task.digit_ids, task.cfg.vocab_size)
    batches = []
    for i in range(len(task.prompts) // s.batch):
        prompt_NP, lengths_N = bucket_and_pad(
            task.prompts[i * s.batch : (i + 1) * s.batch],
            [s.prompt_len],
            task.tokenizer.pad_id,
            s.group,
        )
        batches.append(ts.Batch(jnp.asarray(prompt_NP), jnp.asarray(lengths_N)))
    params = jax.tree.map(jnp.copy, task.params)
    state = state_lib.init_train_state(
        params, optimizer, jax.random.key(args.seed), use_reference=False
    )
    # Dispatch is asynchronous: nothing of the set-up may run inside a timed step.
    jax.block_until_ready((batches, state))
    return rl, optimizer, schedule, reward_fn, batches, state


def _clock() -> np.ndarray:
    """(wall, CPU) seconds now; CPU is this process's time, all threads."""
    return np.array([time.perf_counter(), time.process_time()])


def _timed(fn: Callable, *a) -> tuple[object, np.ndarray]:
    t = _clock()
    out = jax.block_until_ready(fn(*a))
    return out, _clock() - t


# A prepared side: step(i) runs step i and returns {phase: (wall, CPU) seconds}.
StepFn = Callable[[int], dict[str, np.ndarray]]


def prepare_ours_split(task: Task, args) -> tuple[StepFn, float]:
    """`build_rollout`, the jitted reward and `build_update`, compiled; (step, compile s)."""
    rl, opt, sched, reward_fn, batches, state = _ours_setup(task, args)
    t = time.perf_counter()
    rollout_fn = ts.build_rollout(task.cfg, rl)
    key = jax.random.key(0)
    rollout_c = rollout_fn.lower(state.params, batches[0], key).compile()
    rollout = jax.eval_shape(rollout_fn, state.params, batches[0], key)
    reward_c = jax.jit(reward_fn).lower(rollout, None).compile()
    update_fn = ts.build_update(task.cfg, rl, opt, sched)
    update_c = update_fn.lower(state, rollout, *jax.eval_shape(reward_fn, rollout, None)).compile()
    compile_s = time.perf_counter() - t
    carry = [state]

    def update(state, rollout):
        return update_c(state, rollout, *reward_c(rollout, None))

    def step(i: int) -> dict[str, np.ndarray]:
        state, key = jax.block_until_ready(ts.split_rollout_key(carry[0]))
        rollout, t_roll = _timed(rollout_c, state.params, batches[i], key)
        (carry[0], _), t_upd = _timed(update, state, rollout)
        return {"rollout": t_roll, "update": t_upd, "total": t_roll + t_upd}

    return step, compile_s


def prepare_ours_fused(task: Task, args) -> tuple[StepFn, float]:
    """`build_train_step` (rollout, in-graph reward, update), compiled; (step, compile s)."""
    rl, opt, sched, reward_fn, batches, state = _ours_setup(task, args)
    t = time.perf_counter()
    step_c = ts.build_train_step(task.cfg, rl, opt, sched, reward_fn).lower(state, batches[0])
    step_c = step_c.compile()
    compile_s = time.perf_counter() - t
    carry = [state]

    def step(i: int) -> dict[str, np.ndarray]:
        (carry[0], _), t_total = _timed(step_c, carry[0], batches[i])
        return {"total": t_total}

    return step, compile_s


# ---------------------------------------------------------------------------------------------
# TRL


def run_trl(task: Task, args, workdir: Path, between: dict[str, StepFn]) -> dict[str, list]:
    """`GRPOTrainer` on the same checkpoint and prompts; after its step i, `between[side](i)`.

    Returns:
      {side: [per-step {phase: (wall, CPU) seconds}]}, TRL's first.
    """
    import datasets
    import torch
    import transformers
    import trl

    s = task.sizes
    torch.manual_seed(args.seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(task.hf_dir, dtype=torch.float32)
    hf_tok = _load_hf_tokenizer(task.hf_dir)
    if _hf_encode(hf_tok, task.texts) != task.prompts:
        raise RuntimeError(f"{task.name}: TRL's tokenizer does not reproduce the prompt ids")
    digits = frozenset(task.digit_ids)

    def digit_reward(completion_ids, **_):
        return [sum(t in digits for t in ids) / max(len(ids), 1) for ids in completion_ids]

    # Every id TRL or the model would stop on is suppressed, so each row runs to exactly T.
    stop = {hf_tok.eos_token_id, *np.atleast_1d(model.generation_config.eos_token_id or [])}
    stop.discard(None)
    config = trl.GRPOConfig(
        output_dir=str(workdir / f"trl-{task.name}"),
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        disable_tqdm=True,
        save_strategy="no",
        max_steps=len(task.prompts) // s.batch,
        per_device_train_batch_size=s.rows,  # rows (completions), not prompts
        gradient_accumulation_steps=1,
        num_generations=s.group,
        max_completion_length=s.new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        num_iterations=1,
        epsilon=0.2,
        loss_type="dapo",  # token mean over the batch, as ours
        scale_rewards="group",
        bf16=False,
        fp16=False,
        # GRPOConfig turns it on by default; ours does not remat. (transformers 5 renames it
        # activation_checkpointing and still takes this name.)
        gradient_checkpointing=False,
        shuffle_dataset=False,  # step i takes prompts [i * B, (i + 1) * B), as ours
        seed=args.seed,
        generation_kwargs={"suppress_tokens": sorted(int(i) for i in stop)},
    )
    if config.gradient_checkpointing:
        raise RuntimeError("TRL would recompute activations in the backward; ours does not")
    dataset = datasets.Dataset.from_dict({"prompt": task.texts})

    gen_times: list[np.ndarray] = []  # (wall, CPU) seconds of each `generate` call
    results: dict[str, list] = {"TRL": [], **{side: [] for side in between}}

    class Interleave(transformers.TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.gen_start = len(gen_times)
            self.start = _clock()

        def on_step_end(self, *_, **__):
            total = _clock() - self.start
            gen = sum(gen_times[self.gen_start :])
            results["TRL"].append({"rollout": gen, "update": total - gen, "total": total})
            i = len(results["TRL"]) - 1
            # Ours' sides take turns at going first, which runs somewhat slower after TRL's step.
            sides = list(between)
            for side in sides[i % len(sides) :] + sides[: i % len(sides)]:
                results[side].append(between[side](i))

    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[digit_reward],
        args=config,
        train_dataset=dataset,
        processing_class=hf_tok,
        callbacks=[Interleave()],
    )
    generate = trainer.model.generate

    def timed_generate(*a, **kw):
        t = _clock()
        out = generate(*a, **kw)
        gen_times.append(_clock() - t)
        if out.shape[1] != s.prompt_len + s.new_tokens:
            raise RuntimeError(f"TRL generated {out.shape[1] - s.prompt_len} tokens, not T")
        return out

    trainer.model.generate = timed_generate
    trainer.remove_callback(transformers.PrinterCallback)  # the per-step log dicts
    trainer.train()
    return results


# ---------------------------------------------------------------------------------------------
# Report


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _ratio(trl: float | None, ours: float | None) -> str:
    return "-" if trl is None or ours is None else f"{trl / ours:.2f}x"


def table(results: list[tuple[str, Sizes, list[Timing]]], cpu: bool) -> str:
    """Medians of each side, ours against TRL, in wall or CPU seconds."""
    unit = "CPU s" if cpu else "s"
    lines = [
        f"| model | side | rollout {unit} | update {unit} | total {unit}/step | compile s "
        "| TRL/ours rollout | TRL/ours update | TRL/ours total |",
        "|" + "---|" * 9,
    ]
    for name, sizes, timings in results:
        trl = next(t for t in timings if t.side == "TRL")
        for t in timings:
            cells = [f"{name} ({sizes})", t.side]
            cells += [_fmt(t.median(k, cpu)) for k in ("rollout", "update", "total")]
            cells.append(_fmt(t.compile, 1))
            for k in ("rollout", "update", "total"):
                ours = t.side != "TRL"
                cells.append(_ratio(trl.median(k, cpu), t.median(k, cpu)) if ours else "")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pin_cpus(n: int) -> list[int]:
    """Pins every thread of this process, and so every thread started later, to n CPUs.

    Both sides then get the same cores. Without it XLA still runs some work on a second thread
    when asked for one, and torch with 2 OpenMP threads on a 2-core machine that other jobs share
    runs 10-20x slower than with 1 (its threads wait at barriers for a descheduled peer).
    """
    cpus = sorted(os.sched_getaffinity(0))[:n]
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), cpus)
    return cpus


def matmul_rates(rows: int = 640, d: int = 576, f: int = 1536, repeats: int = 20) -> str:
    """GFLOP/s of one f32 matmul of the SmolLM2 update's MLP shape on each side, forward
    (rows x d @ d x f) and weight-gradient (d x rows @ rows x f) forms: the ceiling a
    matmul-bound update can approach on these threads."""
    import torch

    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, d)).astype(np.float32)
    w = rng.normal(size=(d, f)).astype(np.float32)
    dy = rng.normal(size=(rows, f)).astype(np.float32)
    flops = 2 * rows * d * f

    def rate(fn, *a) -> float:
        fn(*a)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn(*a)
            times.append(time.perf_counter() - t)
        return flops / float(np.median(times)) / 1e9

    xla = lambda f: lambda *a: jax.block_until_ready(jax.jit(f)(*a))  # noqa: E731
    fwd = rate(xla(jnp.dot), jnp.asarray(x), jnp.asarray(w))
    grad = rate(xla(lambda x, dy: x.T @ dy), jnp.asarray(x), jnp.asarray(dy))
    with torch.inference_mode():
        t_fwd = rate(torch.mm, torch.from_numpy(x), torch.from_numpy(w))
        t_grad = rate(lambda x, dy: x.T @ dy, torch.from_numpy(x), torch.from_numpy(dy))
    return (
        f"one f32 matmul ({rows} x {d} @ {d} x {f}, and its weight-gradient form): XLA "
        f"{fwd:.0f} / {grad:.0f} GFLOP/s, torch {t_fwd:.0f} / {t_grad:.0f} GFLOP/s"
    )


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes, fewer steps")
    p.add_argument("--matmuls-only", action="store_true", help="print the matmul rates, stop")
    p.add_argument("--models", default="tiny-qwen2,smollm2-135m")
    p.add_argument("--steps", type=int, default=None, help="tiny: measured steps (5; quick 2)")
    p.add_argument("--smollm2-steps", type=int, default=None, help="measured steps (2; quick 1)")
    p.add_argument("--warmup", type=int, default=1, help="steps run first and not measured")
    p.add_argument("--tiny-sizes", default=None, help="B,G,P,T (8,8,64,128; quick 4,4,32,32)")
    p.add_argument("--smollm2-sizes", default=None, help="B,G,P,T (2,4,64,64; quick 2,4,32,16)")
    p.add_argument("--tiny-hidden", type=int, default=128)
    p.add_argument("--tiny-layers", type=int, default=4)
    p.add_argument("--tiny-vocab", type=int, default=4096)
    p.add_argument(
        "--threads", type=int, default=1, help="CPUs to pin to, and torch's threads (pin_cpus)"
    )
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    q = args.quick
    args.steps = args.steps or (2 if q else 5)
    args.smollm2_steps = args.smollm2_steps or (1 if q else 2)
    args.tiny_sizes = args.tiny_sizes or ("4,4,32,32" if q else "8,8,64,128")
    args.smollm2_sizes = args.smollm2_sizes or ("2,4,32,16" if q else "2,4,64,64")
    return args


def _timing(side: str, steps: list[dict[str, np.ndarray]], compile_s: float | None) -> Timing:
    phases = {k: np.array([s[k] for s in steps]) if k in steps[0] else None for k in steps[0]}
    return Timing(side, phases.get("rollout"), phases.get("update"), phases["total"], compile_s)


def main(argv: Sequence[str]) -> None:
    import torch
    import transformers
    import trl

    args = parse_args(argv)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    pin_cpus(args.threads)
    torch.set_num_threads(args.threads)
    if args.threads == 1:
        # Set before the CPU backend starts (the first `jax.devices()` below).
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        )
    print("command: PYTHONPATH=. python " + " ".join(["benchmarks/train_step.py", *argv]))
    print(
        f"jax {jax.__version__} ({jax.devices()[0].platform}), torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), transformers {transformers.__version__}, "
        f"trl {trl.__version__}; pinned to CPUs {sorted(os.sched_getaffinity(0))} of "
        f"{os.cpu_count()}; XLA_FLAGS={os.environ.get('XLA_FLAGS', '').strip()!r}"
    )
    print(matmul_rates(), flush=True)
    if args.matmuls_only:
        return
    start = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for name in args.models.split(","):
            sizes = Sizes(*map(int, getattr(args, f"{name.split('-')[0]}_sizes").split(",")))
            steps = args.smollm2_steps if name.startswith("smollm2") else args.steps
            task = build_task(name, sizes, (args.warmup + steps) * sizes.batch, workdir, args)
            n_params = sum(x.size for x in jax.tree.leaves(task.params))
            print(
                f"\n{name}: {n_params / 1e6:.1f}M params, vocab {task.cfg.vocab_size}, {sizes}, "
                f"{len(task.digit_ids)} digit tokens, {args.warmup} warm-up + {steps} measured "
                "steps"
            )
            split, split_compile = prepare_ours_split(task, args)
            fused, fused_compile = prepare_ours_fused(task, args)
            print(f"  compiled ours: split {split_compile:.1f} s, fused {fused_compile:.1f} s")
            t0 = time.perf_counter()
            steps_by_side = run_trl(task, args, workdir, {"ours split": split, "ours fused": fused})
            compiles = {"ours split": split_compile, "ours fused": fused_compile}
            timings = []
            for side, per_step in steps_by_side.items():
                timing = _timing(side, per_step[args.warmup :], compiles.get(side))
                walls = " ".join(f"{x['total'][0]:.2f}" for x in per_step)
                print(f"  {side}: every step's wall seconds {walls}")
                timings.append(timing)
            print(f"  the interleaved steps took {time.perf_counter() - t0:.0f} s", flush=True)
            results.append((name, sizes, timings))
    print("\nMedian wall seconds per step:\n")
    print(table(results, cpu=False))
    print("\nMedian CPU seconds per step (process time):\n")
    print(table(results, cpu=True))
    print(
        "\nrollout: generation only (TRL: inside model.generate; ours: build_rollout). "
        "update: the rest of the step (TRL: decoding, reward, forward, backward, clipping, AdamW; "
        "ours: the jitted reward + build_update). ours fused: build_train_step, one program. "
        "compile: ours' lower + compile, wall seconds, not in the step times."
    )
    print(f"wall time of the whole benchmark: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
