"""Token choice: one token per row from f32 logits, and the log-prob it was drawn with.

* Each row draws from its own stream, `fold_in(rng, row)`, so a row's samples do not depend on
  the other rows of the batch or on how the batch is sharded.
* The log-prob returned for a sampled token is its log-probability under the distribution it was
  drawn from: logits / temperature, truncated by top-k, then top-p, then min-p, renormalised.
* The draw is an inverse CDF with one uniform per row and step, in two levels (blocks of about
  sqrt(V), then tokens), so no prefix sum runs over the whole vocabulary.

Shapes: N rows, V vocab, K kept by top-k, T steps.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from rlvr_jax.sampling.config import SamplerConfig, SamplingParams

Array = jax.Array

# The blocks of the two-level inverse-CDF draw (see `_draw`) are a multiple of this wide.
_DRAW_BLOCK = 128


def _argmax(x_NV: Array) -> Array:
    """First index of the maximum; XLA:CPU runs this two-pass form much faster than argmax."""
    V = x_NV.shape[-1]
    top = jnp.max(x_NV, axis=-1, keepdims=True)
    return jnp.min(jnp.where(x_NV == top, jnp.arange(V), V), axis=-1).astype(jnp.int32)


def _sortable_key(x: Array) -> Array:
    """A uint32 key with the order of the f32 values (IEEE bits, sign-folded)."""
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))


def _top_p_unsorted(x_NV: Array, top_p_N: Array) -> Array:
    """Top-p over the full vocabulary without a sort (a sort of (N, V) is slow on CPU).

    Keeps token i iff the mass of tokens strictly more likely than i is below top_p (ties at the
    boundary are all kept). The threshold is the largest logit tau with mass(x >= tau) >= top_p,
    found exactly by bisection over the 2^32 order-preserving integer keys of f32 (32 passes).
    """
    p_NV = jax.nn.softmax(x_NV, axis=-1)
    key_NV = _sortable_key(x_NV)

    def body(_, lo_hi):
        lo, hi = lo_hi
        mid = lo + (hi - lo + 1) // 2
        mass = jnp.sum(jnp.where(key_NV >= mid[:, None], p_NV, 0.0), axis=-1)
        ok = mass >= top_p_N
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid - 1)

    lo, _ = jax.lax.fori_loop(0, 32, body, (key_NV.min(-1), key_NV.max(-1)))
    keep = (key_NV >= lo[:, None]) | (top_p_N >= 1.0)[:, None]
    return jnp.where(keep, x_NV, -jnp.inf)


def _top_p_sorted(x_NK: Array, top_p_N: Array) -> Array:
    """Top-p on logits sorted in descending order (the output of `lax.top_k`); same rule."""
    p = jax.nn.softmax(x_NK, axis=-1)
    before = jnp.cumsum(p, axis=-1) - p
    num_kept = jnp.sum(before < top_p_N[:, None], axis=-1)
    tau = jnp.take_along_axis(x_NK, jnp.maximum(num_kept - 1, 0)[:, None], axis=-1)
    keep = (x_NK >= tau) | (top_p_N >= 1.0)[:, None]
    return jnp.where(keep, x_NK, -jnp.inf)


def _first_true(cond_NB: Array, fallback_N: Array) -> Array:
    B = cond_NB.shape[-1]
    first = jnp.min(jnp.where(cond_NB, jnp.arange(B), B), axis=-1)
    return jnp.where(first < B, first, fallback_N).astype(jnp.int32)


def _last_true(cond_NB: Array) -> Array:
    return jnp.max(jnp.where(cond_NB, jnp.arange(cond_NB.shape[-1]), 0), axis=-1)


def _draw_block(vocab_size: int) -> int:
    """Block width of `_draw`: about sqrt(V), so that both levels' prefix sums are short."""
    return min(vocab_size, _DRAW_BLOCK * math.ceil(math.sqrt(vocab_size) / _DRAW_BLOCK))


def _prefix_sums(x_NB: Array) -> Array:
    """Inclusive cumulative sums along the last axis, as one matmul with a triangular matrix of
    ones. XLA:CPU lowers `cumsum` to a reduce-window that took a tenth of a tiny model's decode
    step; B is about sqrt(V), so the matrix is small."""
    B = x_NB.shape[-1]
    upper_BB = jnp.triu(jnp.ones((B, B), jnp.float32))
    return jnp.dot(x_NB, upper_BB, precision=jax.lax.Precision.HIGHEST)


def _draw(x_NV: Array, u_N: Array) -> tuple[Array, Array]:
    """Draws one index per row from softmax(x) (-inf entries excluded) by inverse CDF.

    Two levels, blocks of about sqrt(V) then tokens, so no prefix sum runs over all of V and only
    one uniform per row is drawn (Gumbel-max needs V per row, ~30x slower on CPU). `u_N` is in
    (0, 1]. Only tokens with nonzero mass can be returned, whatever the f32 rounding.

    Returns:
      (index_N int32, log-prob_N f32 of that index under softmax(x)).
    """
    N, V = x_NV.shape
    Bk = _draw_block(V)
    nb = -(-V // Bk)
    xp = jnp.pad(x_NV, ((0, 0), (0, nb * Bk - V)), constant_values=-jnp.inf)
    top_N = jnp.max(xp, axis=-1)
    p_NbB = jnp.exp(xp - top_N[:, None]).reshape(N, nb, Bk)
    mass_Nb = jnp.sum(p_NbB, axis=-1)
    cdf_Nb = _prefix_sums(mass_Nb)
    total_N = cdf_Nb[:, -1]
    target_N = u_N * total_N
    b = _first_true((cdf_Nb >= target_N[:, None]) & (mass_Nb > 0), _last_true(mass_Nb > 0))
    below_N = jnp.take_along_axis(cdf_Nb - mass_Nb, b[:, None], axis=-1)[:, 0]
    block_NB = jnp.take_along_axis(p_NbB, b[:, None, None], axis=1)[:, 0]
    cdf_NB = below_N[:, None] + _prefix_sums(block_NB)
    j = _first_true((cdf_NB >= target_N[:, None]) & (block_NB > 0), _last_true(block_NB > 0))
    idx_N = b * Bk + j
    x_at = jnp.take_along_axis(xp, idx_N[:, None], axis=-1)[:, 0]
    return idx_N, x_at - top_N - jnp.log(total_N)


def row_uniforms(rng: Array, num_rows: int, num_steps: int) -> Array:
    """(N, T) uniforms in (0, 1]; row i's come from fold_in(rng, i) alone, so they do not depend on
    the batch it is in. Drawn once before the loop: one threefry call instead of one per step."""
    u = jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(rng, i), (num_steps,)))(
        jnp.arange(num_rows)
    )
    return 1.0 - u


def choose_tokens(
    logits_NV: Array, sp: SamplingParams, u_N: Array, cfg: SamplerConfig
) -> tuple[Array, Array]:
    """Picks one token per row from f32 logits.

    Sampling: logits / temperature, then top-k (static), top-p, min-p, then an inverse-CDF draw
    with the row's uniform `u_N` in (0, 1]. Greedy: argmax, with the model's (temperature 1)
    log-prob, since the point mass greedy samples from would always give 0.

    Returns:
      (tokens_N int32, logp_N f32), the log-prob under the truncated, renormalised distribution.
    """
    logits_NV = logits_NV.astype(jnp.float32)
    if cfg.method == "greedy":
        tok = _argmax(logits_NV)
        at = jnp.take_along_axis(logits_NV, tok[:, None], axis=-1)[:, 0]
        return tok, at - jax.nn.logsumexp(logits_NV, axis=-1)
    x = logits_NV / sp.temperature_N[:, None]
    V = x.shape[-1]
    if 0 < cfg.top_k < V:
        x, idx_NK = jax.lax.top_k(x, cfg.top_k)
        x = _top_p_sorted(x, sp.top_p_N)
    else:
        idx_NK = None
        # The bisection costs 32 passes over (N, V); skip it when no row asks for top-p.
        x = jax.lax.cond(jnp.any(sp.top_p_N < 1.0), _top_p_unsorted, lambda x, _: x, x, sp.top_p_N)
    floor_N = jnp.max(x, axis=-1) + jnp.log(sp.min_p_N)
    x = jnp.where(x >= floor_N[:, None], x, -jnp.inf)
    j, logp = _draw(x, u_N)
    tok = j if idx_NK is None else jnp.take_along_axis(idx_NK, j[:, None], axis=-1)[:, 0]
    return tok.astype(jnp.int32), logp
