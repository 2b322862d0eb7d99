"""Reward shaping: Kimi k1.5 length reward, DAPO soft overlong penalty, weights.

JAX math: every function is pure and jittable, takes numpy or JAX arrays, and returns f32 JAX
arrays. Group functions take (B, G) arrays (B prompts, G samples each); row functions take (N,)
arrays. Reshape with `x_N.reshape(B, G)` and back with `.reshape(-1)`.

Usage on the host-verifier path, after the pool has scored the texts:

    correct_N = jnp.asarray(pool.map(items))
    parts = {
        "correct": correct_N,
        "format": jnp.asarray([format.r1_format_reward(t) for t in texts]),
        "length": shaping.kimi_length_reward(
            rollout.lengths_N.reshape(B, G), correct_N.reshape(B, G)
        ).reshape(-1),
        "overlong": shaping.overlong_penalty(rollout.lengths_N, max_len=4096, cache_len=512),
    }
    rewards_N, parts = shaping.combine(
        parts, {"correct": 1.0, "format": 0.1, "length": 0.1, "overlong": 1.0}
    )
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

Array = jax.Array


def kimi_length_reward(lengths_BG, correct_BG) -> Array:
    """Kimi k1.5 length reward within each group of G responses to one prompt.

    `lam = 0.5 - (len - min_len) / (max_len - min_len)`, with the minimum and maximum over the
    group; a correct response gets `lam`, an incorrect one `min(0, lam)`; a group whose lengths
    are all equal gets 0.

    Args:
      lengths_BG: response lengths (tokens), any real dtype.
      correct_BG: bool, or f32 with 1.0 for correct (values >= 0.5 count as correct).

    Returns:
      (B, G) f32 in [-0.5, 0.5].
    """
    lengths = jnp.asarray(lengths_BG, jnp.float32)
    correct = jnp.asarray(correct_BG, jnp.float32) >= 0.5
    if lengths.ndim != 2 or lengths.shape != correct.shape:
        raise ValueError(
            f"lengths_BG {lengths.shape} and correct_BG {correct.shape} must be the same (B, G)"
        )
    min_B1 = jnp.min(lengths, axis=1, keepdims=True)
    max_B1 = jnp.max(lengths, axis=1, keepdims=True)
    span_B1 = max_B1 - min_B1
    lam_BG = 0.5 - (lengths - min_B1) / jnp.where(span_B1 > 0, span_B1, 1.0)
    reward_BG = jnp.where(correct, lam_BG, jnp.minimum(0.0, lam_BG))
    return jnp.where(span_B1 > 0, reward_BG, 0.0)


def overlong_penalty(lengths_N, max_len: int, cache_len: int) -> Array:
    """DAPO soft overlong punishment.

    0 for `len <= max_len - cache_len`, then linear down to -1 at `len == max_len`, and -1 beyond.

    Args:
      lengths_N: response lengths (tokens).
      max_len: L_max, the generation limit.
      cache_len: L_cache, the width of the penalty ramp, in (0, max_len].

    Returns:
      (N,) f32 in [-1, 0].
    """
    if not 0 < cache_len <= max_len:
        raise ValueError(f"cache_len={cache_len} must be in (0, max_len={max_len}]")
    lengths = jnp.asarray(lengths_N, jnp.float32)
    free = max_len - cache_len
    return jnp.clip((free - lengths) / cache_len, -1.0, 0.0)


def combine(
    parts: Mapping[str, Array], weights: Mapping[str, float]
) -> tuple[Array, dict[str, Array]]:
    """The weighted sum of reward parts; every part is returned, weighted or not.

    Args:
      parts: name -> (N,) reward component.
      weights: name -> weight; parts without a weight are reported but not summed.

    Returns:
      (rewards_N f32, {name: part_N f32}).

    Raises:
      ValueError: naming a weight without a part, a part that is not (N,), or no parts.
    """
    if not parts:
        raise ValueError("parts is empty: nothing to combine")
    missing = sorted(set(weights) - set(parts))
    if missing:
        raise ValueError(f"weights name parts {missing} that are not in parts {sorted(parts)}")
    out = {name: jnp.asarray(value, jnp.float32) for name, value in parts.items()}
    shapes = {name: value.shape for name, value in out.items()}
    first = next(iter(shapes.values()))
    if len(first) != 1 or any(shape != first for shape in shapes.values()):
        raise ValueError(f"every part must have the same (N,) shape; got {shapes}")
    rewards_N = jnp.zeros(first, jnp.float32)
    for name, weight in weights.items():
        rewards_N = rewards_N + jnp.float32(weight) * out[name]
    return rewards_N, out
