"""Evaluation statistics of sampled answers: pass@k, mean@n, maj@n, lengths, per-source tables.

Host code: pure numpy functions of per-sample results laid out (B prompts, G samples per prompt).

- pass@k is the unbiased estimator of Chen et al. (2021, "Evaluating Large Language Models
  Trained on Code"): from n samples of which c are correct, the probability that at least one of
  k samples drawn without replacement is correct, 1 - C(n-c, k) / C(n, k), averaged over prompts.
- mean@n is the fraction of all samples that are correct (the expected pass@1).
- maj@n is the accuracy of the most frequent extracted answer per prompt (self-consistency).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt with `c` correct samples out of `n`.

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k / i), which equals 1 - C(n-c, k) / C(n, k)
    without forming binomial coefficients that overflow for large n.

    Args:
      n: samples drawn (>= 1).
      c: how many of them are correct (0..n).
      k: the budget (1..n).

    Returns:
      The probability in [0, 1]; 1.0 whenever n - c < k (every k-subset holds a correct one).
    """
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer):
            raise TypeError(f"{name}={v!r} must be an int")
    if n < 1:
        raise ValueError(f"n={n} must be at least 1")
    if not 0 <= c <= n:
        raise ValueError(f"c={c} must be in [0, n={n}]")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be in [1, n={n}]")
    if n - c < k:
        return 1.0
    i = np.arange(n - c + 1, n + 1, dtype=np.float64)
    return float(1.0 - np.prod(1.0 - k / i))


def _correct_BG(correct: Any) -> np.ndarray:
    arr = np.asarray(correct)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"correctness has shape {arr.shape}; expected (prompts, samples) >= 1")
    if arr.dtype != np.bool_:
        if not np.isin(arr, (0, 1)).all():
            raise ValueError("correctness values must be 0/1 or booleans")
        arr = arr.astype(bool)
    return arr


def mean_pass_at_k(correct_BG: Any, k: int) -> float:
    """pass@k averaged over prompts, from a (prompts, samples) correctness table."""
    correct_BG = _correct_BG(correct_BG)
    n = correct_BG.shape[1]
    counts = correct_BG.sum(axis=1)
    return float(np.mean([pass_at_k(n, int(c), k) for c in counts]))


def mean_at_n(correct_BG: Any) -> float:
    """The fraction of all samples that are correct (equal to the mean pass@1)."""
    return float(_correct_BG(correct_BG).mean())


def majority_vote(answers: Sequence[Hashable | None]) -> Hashable | None:
    """The most frequent answer, ignoring None (no answer extracted). Ties go to the answer
    seen first; None when no sample has an answer."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == best)


def maj_at_n(answers_BG: Sequence[Sequence[Hashable | None]], correct_BG: Any) -> float:
    """Majority-vote accuracy: per prompt, whether the most frequent extracted answer is correct.

    Args:
      answers_BG: the extracted (normalised) answer of each sample, None where none was found.
      correct_BG: each sample's verdict; the majority answer takes the verdict of its first
        sample (equal answers get equal verdicts from a deterministic verifier).

    Returns:
      The fraction of prompts whose majority answer is correct (a prompt without any answer
      counts as wrong).
    """
    correct_BG = _correct_BG(correct_BG)
    B, G = correct_BG.shape
    if len(answers_BG) != B or any(len(row) != G for row in answers_BG):
        raise ValueError(
            f"answers have shape ({len(answers_BG)}, {[len(r) for r in answers_BG]}); the "
            f"correctness table is ({B}, {G})"
        )
    hits = 0
    for answers, correct in zip(answers_BG, correct_BG, strict=True):
        winner = majority_vote(answers)
        if winner is not None:
            hits += bool(correct[list(answers).index(winner)])
    return hits / B


def length_stats(
    lengths: Any, truncated: Any | None = None, max_length: int | None = None
) -> dict[str, float]:
    """Mean, median, 95th percentile and maximum of response lengths, and the truncation rate.

    Args:
      lengths: response lengths in tokens, any shape.
      truncated: per-response flags of hitting the generation limit (same shape); or
      max_length: the limit, a response of this length counting as truncated.

    Returns:
      {"mean", "p50", "p95", "max"} plus "truncated" when either truncation input is given.
    """
    arr = np.asarray(lengths, np.float64).ravel()
    if arr.size == 0:
        raise ValueError("length_stats of no responses")
    if (arr < 0).any():
        raise ValueError(f"negative response length {arr.min()}")
    out = {
        "mean": float(arr.mean()),
        "p50": float(np.percentile(arr, 50)),
        "p95": float(np.percentile(arr, 95)),
        "max": float(arr.max()),
    }
    if truncated is not None:
        flags = np.asarray(truncated).ravel()
        if flags.shape != arr.shape:
            raise ValueError(
                f"truncated has {flags.size} entries for {arr.size} lengths; expected one each"
            )
        out["truncated"] = float(flags.astype(bool).mean())
    elif max_length is not None:
        out["truncated"] = float((arr >= max_length).mean())
    return out


def group_metrics(
    correct_BG: Any,
    lengths_BG: Any | None = None,
    truncated_BG: Any | None = None,
    answers_BG: Sequence[Sequence[Hashable | None]] | None = None,
    ks: Sequence[int] = (1,),
) -> dict[str, float]:
    """All statistics of one evaluation table (B prompts x n samples).

    Returns:
      "prompts", "samples" (n), f"mean@{n}", f"pass@{k}" for each k, f"maj@{n}" when answers
      are given, and with lengths "length/mean", "length/p50", "length/p95", "length/max",
      "length/truncated" (when flags are given), "length/correct", "length/incorrect" (NaN
      when there is no such sample).
    """
    correct_BG = _correct_BG(correct_BG)
    B, n = correct_BG.shape
    out: dict[str, float] = {"prompts": float(B), "samples": float(n)}
    out[f"mean@{n}"] = mean_at_n(correct_BG)
    for k in ks:
        out[f"pass@{k}"] = mean_pass_at_k(correct_BG, k)
    if answers_BG is not None:
        out[f"maj@{n}"] = maj_at_n(answers_BG, correct_BG)
    if lengths_BG is not None:
        lengths = np.asarray(lengths_BG, np.float64)
        if lengths.shape != correct_BG.shape:
            raise ValueError(f"lengths have shape {lengths.shape}; expected {correct_BG.shape}")
        for name, v in length_stats(lengths, truncated_BG).items():
            out[f"length/{name}"] = v
        right, wrong = lengths[correct_BG], lengths[~correct_BG]
        out["length/correct"] = float(right.mean()) if right.size else float("nan")
        out["length/incorrect"] = float(wrong.mean()) if wrong.size else float("nan")
    return out


def per_source(
    sources_B: Sequence[str],
    correct_BG: Any,
    lengths_BG: Any | None = None,
    truncated_BG: Any | None = None,
    answers_BG: Sequence[Sequence[Hashable | None]] | None = None,
    ks: Sequence[int] = (1,),
) -> dict[str, dict[str, float]]:
    """`group_metrics` of the prompts of each source (dataset, difficulty level, ...).

    Args:
      sources_B: each prompt's source name.
      correct_BG, lengths_BG, truncated_BG, answers_BG, ks: as for `group_metrics`.

    Returns:
      {source: metrics}, sources in sorted order.
    """
    correct_BG = _correct_BG(correct_BG)
    if len(sources_B) != correct_BG.shape[0]:
        raise ValueError(
            f"{len(sources_B)} sources for {correct_BG.shape[0]} prompts; expected one each"
        )
    sources = np.asarray(sources_B, dtype=object)
    out = {}
    for source in sorted(set(sources_B)):
        rows = np.flatnonzero(sources == source)
        out[source] = group_metrics(
            correct_BG[rows],
            None if lengths_BG is None else np.asarray(lengths_BG)[rows],
            None if truncated_BG is None else np.asarray(truncated_BG)[rows],
            None if answers_BG is None else [answers_BG[i] for i in rows],
            ks,
        )
    return out


def as_metrics(
    results: Mapping[str, Mapping[str, float]], prefix: str = "eval"
) -> dict[str, float]:
    """Flattens {source: metrics} into ledger names "<prefix>/<source>/<metric>"."""
    return {
        f"{prefix}/{source}/{name}": value
        for source, metrics in results.items()
        for name, value in metrics.items()
    }
