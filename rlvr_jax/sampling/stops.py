"""Where rows end, and the think budget: matchers over each row's last W emitted tokens.

* A row ends when it samples one of `eos_ids` (finish reason "eos") or when its emitted tokens
  end with one of `stop_sequences` ("stop"). Only sampled tokens end a row: injected text is ours,
  not the model's, and a stop sequence that starts in the prompt does not count.
* The think budget: after `think_budget` tokens inside an open thinking block, the sampler emits
  `think_stop` (which ends with `think_close`) in place of the model's choices, one token per
  step, with log-prob 0; what follows is the model's answer to it. A prompt that opens a block it
  does not close (Qwen3's `<think>` in the template) starts the row inside the block.

All functions are jittable and work on (N,) columns; the sequences are static (`SamplerConfig`).

Shapes: N rows, P prompt bucket, W matched-token window (`SamplerConfig.match_window`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlvr_jax.sampling.config import SamplerConfig

Array = jax.Array


def ends_with(history_NW: Array, seq: tuple[int, ...]) -> Array:
    """Rows whose emitted tokens end with `seq` (history holds -1 before the first token)."""
    return jnp.all(history_NW[:, -len(seq) :] == jnp.asarray(seq, jnp.int32), axis=-1)


def prompt_in_think(prompt_NP: Array, prompt_mask_NP: Array, cfg: SamplerConfig) -> Array:
    """Rows whose prompt opens a thinking block it does not close (e.g. ends with `<think>`)."""
    P = prompt_NP.shape[1]

    def last_end(seq: tuple[int, ...]) -> Array:
        m = len(seq)
        if m > P:
            return jnp.full(prompt_NP.shape[:1], -1)
        hits = prompt_mask_NP[:, m - 1 :]
        for i, t in enumerate(seq):
            hits = (
                hits & prompt_mask_NP[:, i : P - m + 1 + i] & (prompt_NP[:, i : P - m + 1 + i] == t)
            )
        return jnp.max(jnp.where(hits, jnp.arange(P - m + 1), -1), axis=-1)

    return last_end(cfg.think_open) > last_end(cfg.think_close)


def inject_think_stop(
    tok_N: Array,
    logp_N: Array,
    active_N: Array,
    in_think_N: Array,
    count_N: Array,
    inject_pos_N: Array,
    cfg: SamplerConfig,
) -> tuple[Array, Array, Array, Array]:
    """Replaces the chosen tokens of rows over their think budget by the next `think_stop` token.

    Args:
      tok_N, logp_N: the tokens chosen this step and their log-probs.
      active_N: rows still generating.
      in_think_N: rows inside an open thinking block.
      count_N: tokens each row emitted since its block opened.
      inject_pos_N: next index into `think_stop`; 0 when not injecting.
      cfg: the sampler settings (`think_budget`, `think_stop`).

    Returns:
      (tok_N, logp_N (0 where injected), injecting_N, inject_pos_N for the next step).
    """
    if not cfg.think_budget:
        return tok_N, logp_N, jnp.zeros_like(active_N), inject_pos_N
    injecting = (in_think_N & (count_N >= cfg.think_budget)) | (inject_pos_N > 0)
    injecting &= active_N
    forced = jnp.asarray(cfg.think_stop, jnp.int32)[inject_pos_N]
    tok_N = jnp.where(injecting, forced, tok_N)
    logp_N = jnp.where(injecting, 0.0, logp_N)
    inject_pos_N = jnp.where(injecting, inject_pos_N + 1, 0)
    inject_pos_N = jnp.where(inject_pos_N >= len(cfg.think_stop), 0, inject_pos_N)
    return tok_N, logp_N, injecting, inject_pos_N


def ended(
    history_NW: Array, tok_N: Array, chose_N: Array, cfg: SamplerConfig
) -> tuple[Array, Array]:
    """Rows that end on this step's token, by end id and (otherwise) by stop sequence.

    Args:
      history_NW: the last W emitted tokens, this step's last.
      tok_N: this step's tokens.
      chose_N: rows whose token was sampled this step (active, not injected).
      cfg: the sampler settings (`eos_ids`, `stop_sequences`).

    Returns:
      (eos_N, stop_N), disjoint.
    """
    eos = chose_N & jnp.isin(tok_N, jnp.asarray(cfg.eos_ids or (-1,), jnp.int32))
    stop = jnp.zeros_like(chose_N)
    for seq in cfg.stop_sequences:
        stop |= chose_N & ends_with(history_NW, seq)
    return eos, stop & ~eos


def track_think(
    history_NW: Array, active_N: Array, in_think_N: Array, count_N: Array, cfg: SamplerConfig
) -> tuple[Array, Array]:
    """Opens and closes thinking blocks on this step's token and counts the tokens inside.

    Returns:
      (in_think_N, count_N) after this step; unchanged without a think budget.
    """
    if not cfg.think_budget:
        return in_think_N, count_N
    opened = active_N & ends_with(history_NW, cfg.think_open)
    closed = active_N & ends_with(history_NW, cfg.think_close)
    count_N = jnp.where(opened, 0, jnp.where(in_think_N & active_N, count_N + 1, count_N))
    return (in_think_N | opened) & ~closed, count_N
