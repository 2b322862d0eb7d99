"""Host helpers around the sampler: prompts to fixed-shape batches, and results back to lists.

Shapes never depend on data: prompts are left-padded to the smallest of a few bucket lengths, and
`generate_in_batches` runs every batch with the same number of rows, padding the last one with
repeats of its last prompt and dropping their rows after, so a pass over any number of prompts
compiles at most one program per bucket.

Shapes: B prompts, G samples per prompt, N = B x G rows, P prompt bucket, T generated columns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from rlvr_jax.model import transformer
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.sampling.config import SamplerConfig, SamplingParams, sampling_params
from rlvr_jax.sampling.continuous import auto_slots, sample_continuous
from rlvr_jax.sampling.loop import sample
from rlvr_jax.types import Rollout


def bucket_and_pad(
    prompts: Sequence[Sequence[int]],
    buckets: Sequence[int],
    pad_id: int,
    group_size: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Repeats each prompt `group_size` times and left-pads all rows to one bucket length.

    The bucket is the smallest of `buckets` that holds the longest prompt, so a run compiles at
    most one program per bucket. Row `b * group_size + g` is sample g of prompt b.

    Args:
      prompts: B token-id lists, already templated.
      buckets: the allowed prompt lengths P.
      pad_id: the id written left of each prompt.
      group_size: G samples per prompt.

    Returns:
      (prompt_NP int32, prompt_lengths_N int32) numpy arrays with N = B * G.

    Raises:
      ValueError: for no prompts, an empty prompt, a prompt longer than the largest bucket, or
        invalid buckets / group size.
    """
    if not prompts:
        raise ValueError("bucket_and_pad got no prompts")
    if group_size < 1:
        raise ValueError(f"group_size={group_size} must be at least 1")
    sizes = sorted(int(b) for b in buckets)
    if not sizes or sizes[0] < 1:
        raise ValueError(f"buckets={tuple(buckets)} must be a non-empty set of positive lengths")
    lengths = [len(p) for p in prompts]
    for i, n in enumerate(lengths):
        if n == 0:
            raise ValueError(f"prompt {i} is empty; every row needs at least one prompt token")
        if n > sizes[-1]:
            raise ValueError(
                f"prompt {i} has {n} tokens, longer than the largest bucket {sizes[-1]} "
                f"(buckets {tuple(sizes)})"
            )
    P = next(b for b in sizes if b >= max(lengths))
    out = np.full((len(prompts), P), pad_id, np.int32)
    for i, p in enumerate(prompts):
        out[i, P - len(p) :] = np.asarray(p, np.int32)
    return (
        np.repeat(out, group_size, axis=0),
        np.repeat(np.asarray(lengths, np.int32), group_size),
    )


def completions(rollout: Rollout) -> list[list[int]]:
    """The generated tokens of each row, up to and including its stop token (host lists)."""
    tokens, lengths = jax.device_get((rollout.tokens_NT, rollout.lengths_N))
    return [tokens[i, : lengths[i]].tolist() for i in range(tokens.shape[0])]


def generate_in_batches(
    params: transformer.Params,
    prompts: Sequence[Sequence[int]],
    score: Callable[[Rollout, list[int]], Any],
    *,
    model_cfg: ModelConfig,
    cfg: SamplerConfig,
    batch_prompts: int,
    buckets: Sequence[int],
    pad_id: int,
    group_size: int = 1,
    sp: SamplingParams | None = None,
    seed: int = 0,
    num_slots: int | None = None,
) -> Any:
    """Samples `group_size` completions of every prompt in fixed-shape batches and scores them.

    Batch i holds the next `batch_prompts` prompts, the last batch padded to that many by
    repeating its last prompt, so every call has the same N = B x G rows (one compile per bucket).
    It is sampled with rng fold_in(key(seed), i) and `prompt_group=G` (one prefill per prompt),
    then `score(rollout, prompt_ids)` runs on it: `prompt_ids` lists the B indices into `prompts`
    of its rows, padding repeats included (row b * G + g is sample g of `prompts[prompt_ids[b]]`).
    `score` returns a pytree of arrays whose leading axis is the N rows, on device or host.

    Args:
      params: the policy weights.
      prompts: token-id lists, already templated; at least one.
      score: per-batch scoring, e.g. a verifier's verdict, `rollout.lengths_N`, the rollout.
      model_cfg: the architecture.
      cfg: the sampler settings (its `prompt_group` is replaced by `group_size`).
      batch_prompts: B, prompts per sampler call.
      buckets: the allowed prompt lengths (`bucket_and_pad`).
      pad_id: the id written left of each prompt.
      group_size: G, samples per prompt.
      sp: `SamplingParams` of the N rows; None for temperature 1 and no truncation.
      seed: the sampling seed.
      num_slots: decode slots for the N rows of a batch (continuous batching when fewer than
        N; the rows are the same either way); None takes `auto_slots`.

    Returns:
      `score`'s pytree, each leaf a numpy array of the rows of real prompts only, batches
      concatenated: (len(prompts) * G, ...), row p * G + g is sample g of prompt p.

    Raises:
      ValueError: for no prompts, a batch or group size below 1, or what `bucket_and_pad` and
        `sample` refuse.
    """
    if not prompts:
        raise ValueError("generate_in_batches got no prompts")
    if batch_prompts < 1 or group_size < 1:
        raise ValueError(f"batch_prompts={batch_prompts} and group_size={group_size} must be >= 1")
    B, G = batch_prompts, group_size
    cfg = dataclasses.replace(cfg, prompt_group=G)
    if sp is None:
        sp = sampling_params(B * G)
    slots = auto_slots(B * G, cfg.max_new_tokens) if num_slots is None else num_slots
    key = jax.random.key(seed)
    parts = []
    for i, start in enumerate(range(0, len(prompts), B)):
        prompt_ids = list(range(start, min(start + B, len(prompts))))
        real = len(prompt_ids)
        prompt_ids += [prompt_ids[-1]] * (B - real)
        prompt_NP, lengths_N = bucket_and_pad([prompts[j] for j in prompt_ids], buckets, pad_id, G)
        args = (params, prompt_NP, lengths_N, jax.random.fold_in(key, i), model_cfg, cfg)
        if slots < B * G:
            rollout, _ = sample_continuous(*args, num_slots=slots, sp=sp)
        else:
            rollout = sample(*args, sp)
        scored = jax.device_get(score(rollout, prompt_ids))
        parts.append(jax.tree.map(lambda x, n=real * G: np.asarray(x)[:n], scored))
    return jax.tree.map(lambda *xs: np.concatenate(xs), *parts)
