"""The offline difficulty filter's logic: success counts per prompt, the histogram, the selection.

A prompt the policy solves in all N samples gives a zero-variance group at the start of training
(no gradient), and one it never solves is often out of reach; filtering both before training
spends the rollout budget where the group advantage is informative. The command is
`python -m rlvr_jax.filter`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np
from absl import logging

from rlvr_jax.data import templates
from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.task import Task
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import Params
from rlvr_jax.sampling.config import SamplerConfig, sampling_params
from rlvr_jax.sampling.host import completions, generate_in_batches
from rlvr_jax.types import Rollout

# verify(completion text, example) -> solved.
Verifier = Callable[[str, Example], bool]


# ---------------------------------------------------------------------------------------------
# The pure part


def success_histogram(success_counts: Sequence[int] | np.ndarray, n: int) -> np.ndarray:
    """hist[k] = how many prompts were solved in exactly k of n samples, k = 0..n.

    Raises:
      ValueError: for a count outside [0, n] (naming its position).
    """
    counts = np.asarray(success_counts, np.int64)
    bad = np.flatnonzero((counts < 0) | (counts > n))
    if bad.size:
        raise ValueError(f"success_counts[{bad[0]}]={counts[bad[0]]} is outside [0, {n}]")
    return np.bincount(counts, minlength=n + 1)


def format_histogram(hist: np.ndarray, width: int = 40) -> str:
    """A text histogram, one line per success count k: "k/n  count  bar"."""
    n = len(hist) - 1
    top = max(int(hist.max()), 1)
    digits = len(str(int(hist.max())))
    lines = [f"successes/{n}  prompts"]
    for k, c in enumerate(hist):
        bar = "#" * round(width * int(c) / top)
        lines.append(f"{k:>{len(str(n))}}/{n}  {int(c):>{digits}}  {bar}".rstrip())
    return "\n".join(lines)


def filter_by_success(
    examples: Sequence[Example],
    success_counts: Sequence[int] | np.ndarray,
    n: int,
    drop_all_solved: bool = True,
    drop_never_solved: bool = False,
) -> tuple[list[Example], dict[str, int]]:
    """Keeps the examples whose success count is informative.

    Args:
      examples: the prompts.
      success_counts: successes of each prompt in `n` samples.
      n: samples per prompt.
      drop_all_solved: drop prompts solved in all n samples.
      drop_never_solved: drop prompts solved in none.

    Returns:
      (kept examples in input order, {"total", "kept", "dropped_all_solved",
      "dropped_never_solved"}).
    """
    if n < 1:
        raise ValueError(f"n={n} must be at least 1")
    counts = np.asarray(success_counts, np.int64)
    if counts.shape != (len(examples),):
        raise ValueError(
            f"success_counts has shape {counts.shape}; expected ({len(examples)},) for the examples"
        )
    success_histogram(counts, n)  # validates the range
    all_solved = drop_all_solved & (counts == n)
    never = drop_never_solved & (counts == 0)
    keep = ~(all_solved | never)
    kept = [ex for ex, k in zip(examples, keep, strict=True) if k]
    stats = {
        "total": len(examples),
        "kept": len(kept),
        "dropped_all_solved": int(all_solved.sum()),
        "dropped_never_solved": int(never.sum()),
    }
    return kept, stats


# ---------------------------------------------------------------------------------------------
# Verifier and sampling

_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def last_number(text: str) -> str | None:
    """The last number in `text` ("1,234.5" -> "1234.5"), or None."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def _as_fraction(text: str) -> Fraction | None:
    try:
        return Fraction(text.strip().replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def last_number_verifier(completion: str, example: Example) -> bool:
    """Whether the last number of the completion equals the (numeric) gold answer, exactly."""
    got, gold = last_number(completion), _as_fraction(example.answer)
    if got is None or gold is None:
        return False
    return _as_fraction(got) == gold


VERIFIERS: dict[str, Verifier] = {"last_number": last_number_verifier}


def count_successes(
    params: Params,
    model_cfg: ModelConfig,
    tokenizer: Tokenizer,
    examples: Sequence[Example],
    template: templates.PromptTemplate,
    n: int,
    verify: Verifier | Task,
    *,
    buckets: Sequence[int],
    max_new_tokens: int,
    batch_prompts: int = 8,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> tuple[list[Example], np.ndarray]:
    """Samples `n` completions per prompt and counts the verified ones.

    Prompts longer than the largest bucket are skipped (and logged). Every sampler call has
    `batch_prompts * n` rows (the last chunk is padded by repeating a prompt, whose extra results
    are discarded), so at most one program per bucket is compiled.

    Args:
      params: policy weights.
      model_cfg: its `ModelConfig`.
      tokenizer: its tokenizer.
      examples: the prompts.
      template: the prompt template.
      n: samples per prompt.
      verify: `verify(completion_text, example) -> bool`, or a single-turn `Task` (the
        training verifier: its "correct" part, 1 = solved, scored where the task scores, e.g.
        in its verifier pool).
      buckets: prompt length buckets.
      max_new_tokens: generated tokens per sample.
      batch_prompts: prompts per sampler call.
      temperature: sampling temperature.
      top_p: nucleus mass.
      seed: sampling seed.

    Returns:
      (the examples that fit, success counts aligned with them).
    """
    if n < 1 or batch_prompts < 1:
        raise ValueError(f"n={n} and batch_prompts={batch_prompts} must be >= 1")
    encoded = templates.encode_prompts(examples, template, tokenizer, buckets)
    if encoded.num_too_long:
        logging.warning("difficulty filter: %s", encoded.summary())
    cfg = SamplerConfig(
        max_new_tokens=max_new_tokens, eos_ids=tokenizer.eos_ids, pad_id=tokenizer.pad_id
    )

    def score(rollout: Rollout, prompt_ids: list[int]) -> np.ndarray:
        # The last batch repeats its last prompt to keep shapes fixed: those rows are dropped
        # (a per-text verifier does not check them: a verifier call can be the costly part).
        real = len(dict.fromkeys(prompt_ids)) * n
        rows = [encoded.examples[j] for j in prompt_ids for _ in range(n)]
        if isinstance(verify, Task):
            # A task scores the whole rollout at once; the padding rows' scores are dropped.
            return np.asarray(verify.score(rollout, rows)["correct"])[:real] >= 1.0
        rows = rows[:real]
        tokens = completions(rollout)[:real]
        texts = [tokenizer.decode(t, skip_special_tokens=True) for t in tokens]
        solved = [bool(verify(t, ex)) for t, ex in zip(texts, rows, strict=True)]
        return np.asarray(solved + [False] * (len(prompt_ids) * n - real))

    solved = generate_in_batches(
        params,
        encoded.ids,
        score,
        model_cfg=model_cfg,
        cfg=cfg,
        batch_prompts=batch_prompts,
        buckets=buckets,
        pad_id=tokenizer.pad_id,
        group_size=n,
        sp=sampling_params(batch_prompts * n, temperature, top_p),
        seed=seed,
    )
    counts = solved.reshape(-1, n).sum(axis=1)
    return encoded.examples, counts
