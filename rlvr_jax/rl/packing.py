"""The packed update: a step's rows packed into a few rows of a fixed length by their real
lengths, so the update's forwards and backward pay for real tokens only.

Reasoning answers are long-tailed: padded to the longest row of a step, most of the update's
token positions are padding. Here each row's real tokens (its prompt without the left padding,
then its completion up to its end) become one segment of a packed row of `length` tokens;
first-fit decreasing places the segments, and every token keeps its own RoPE position and
attends only within its segment (`transformer.hidden_states(segment_ids_BT=...)`). The
log-probs are computed on the packed rows and gathered back to the (N, T) layout, where the
losses, advantages and metrics read them exactly as they read the padded update's.

Shapes stay static: the packed row count R is bucketed (`row_buckets`: the row multiple times
powers of two and one and a half times them, capped at N), so a run compiles a handful of
update programs, not one per step. The R rows are dealt to `num_microbatches` microbatches by their
real token counts, largest first, so microbatches are balanced by tokens, not rows; a microbatch's
loss covers the rows packed into it, with the whole batch's normaliser, so the gradients sum to the
full batch's.

The plan (`plan`) is host code on the rollout's lengths; `packed_logprobs` runs inside the
jitted update. Shapes: N rows, P prompt and T completion columns, S = P + T; M microbatches of R
packed rows of L tokens each.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import Params, hidden_states
from rlvr_jax.rl.logprobs import token_logprobs

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Packing:
    """Where every token of the rows lies in the packed rows."""

    src_MRL: Array  # (M, R, L) int32: flat index into the (N, S) sequences; 0 at padding
    segment_MRL: Array  # (M, R, L) int32: the segment (1, 2, ...) in its packed row; 0 padding
    pred_NT: Array  # (N, T) int32: flat index into its microbatch's (R, L) of the position
    #                 whose hidden state predicts completion token t of row n; 0 if not real
    micro_N: Array  # (N,) int32: the microbatch holding row n; -1 for a row with no token

    @property
    def num_microbatches(self) -> int:
        return self.src_MRL.shape[0]


def row_buckets(num_rows: int, multiple: int) -> list[int]:
    """The packed row counts a run may compile: `multiple` x 1, 2, 3, 4, 6, 8, 12, ... (powers
    of two and one and a half times them: at most a third of a bucket is empty rows) below
    `num_rows`, and `num_rows` itself (which holds the rows without packing)."""
    sizes, k = set(), 1
    while k * multiple < num_rows:
        sizes.add(k * multiple)
        if k >= 2 and 3 * k // 2 * multiple < num_rows:
            sizes.add(3 * k // 2 * multiple)
        k *= 2
    return [*sorted(sizes), num_rows]


def real_lengths(prompt_lengths_N: np.ndarray, mask_NT: np.ndarray) -> tuple[np.ndarray, ...]:
    """(prompt, completion) real token counts per row; the completion's real tokens must be a
    prefix of its T columns, as the samplers write them."""
    mask_NT = np.asarray(mask_NT, bool)
    completion_N = mask_NT.sum(axis=1)
    prefix = np.arange(mask_NT.shape[1])[None, :] < completion_N[:, None]
    if not np.array_equal(mask_NT, prefix):
        bad = int(np.flatnonzero((mask_NT != prefix).any(axis=1))[0])
        raise ValueError(f"row {bad}'s completion tokens are not a prefix of its columns")
    return np.asarray(prompt_lengths_N, np.int64), completion_N.astype(np.int64)


def first_fit_decreasing(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Bins (lists of item indices) of total length <= `capacity`, longest items first."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = int(lengths[i])
        for b, free in enumerate(room):
            if n <= free:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(capacity - n)
    return bins


def plan(
    prompt_lengths_N: np.ndarray,
    mask_NT: np.ndarray,
    prompt_len: int,
    *,
    length: int = 0,
    num_microbatches: int = 1,
    row_multiple: int = 1,
) -> Packing:
    """The packed layout of one rollout's rows (host numpy arrays).

    Args:
      prompt_lengths_N: real prompt tokens per row (left-padded to `prompt_len`).
      mask_NT: the completions' real tokens (a prefix of each row).
      prompt_len: P, the prompt columns.
      length: L, tokens per packed row; 0: S = P + T, the padded row's length.
      num_microbatches: M; the packed rows are dealt to them by real tokens.
      row_multiple: every microbatch's packed row count is a multiple of this (the mesh's row
        shards).

    Returns:
      The `Packing`, with R the smallest bucket (`row_buckets`) that holds the rows.
    """
    N, T = np.shape(mask_NT)
    S = prompt_len + T
    L = length or S
    p_N, c_N = real_lengths(prompt_lengths_N, mask_NT)
    total_N = np.where(c_N > 0, p_N + c_N, 0)
    if total_N.max(initial=0) > L:
        n = int(np.argmax(total_N))
        raise ValueError(f"row {n} has {int(total_N[n])} real tokens, more than rl.pack_length={L}")
    if N % (num_microbatches * row_multiple):
        raise ValueError(
            f"{N} rows do not split into {num_microbatches} microbatches of a multiple of "
            f"{row_multiple} rows"
        )
    live = np.flatnonzero(total_N > 0)
    bins = [[int(live[i]) for i in b] for b in first_fit_decreasing(total_N[live], L)]
    per_micro = -(-max(len(bins), 1) // num_microbatches)
    R = next(r for r in row_buckets(N // num_microbatches, row_multiple) if r >= per_micro)
    M = num_microbatches
    src = np.zeros((M, R, L), np.int32)
    segment = np.zeros((M, R, L), np.int32)
    pred = np.zeros((N, T), np.int32)
    micro = np.full((N,), -1, np.int32)
    # Deal the bins, fullest first, round-robin over the microbatches: balanced by tokens.
    order = sorted(range(len(bins)), key=lambda b: -int(total_N[bins[b]].sum()))
    for k, b in enumerate(order):
        m, r = k % M, k // M
        start = 0
        for seg, n in enumerate(bins[b], start=1):
            p, c = int(p_N[n]), int(c_N[n])
            src[m, r, start : start + p + c] = n * S + prompt_len - p + np.arange(p + c)
            segment[m, r, start : start + p + c] = seg
            # The last prompt token predicts the first completion token, and so on.
            pred[n, :c] = r * L + start + p - 1 + np.arange(c)
            micro[n] = m
            start += p + c
    return Packing(src, segment, pred, micro)


def packed_hidden(
    params: Params,
    tokens_NS: Array,
    positions_NS: Array,
    packing: Packing,
    m: Array | int,
    cfg: ModelConfig,
) -> tuple[Array, Array]:
    """The final-norm hidden states (R, L, D) of microbatch m's packed rows, and their tokens."""
    src_RL = packing.src_MRL[m]
    segment_RL = packing.segment_MRL[m]
    tokens_RL = tokens_NS.reshape(-1)[src_RL]
    positions_RL = positions_NS.reshape(-1)[src_RL]
    h_RLD, _ = hidden_states(
        params, tokens_RL, positions_RL, cfg, mask_BT=segment_RL > 0, segment_ids_BT=segment_RL
    )
    return h_RLD, tokens_RL


def gather_rows(x_RL: Array, packing: Packing, m: Array | int, valid_NT: Array) -> Array:
    """Values at the predicting positions of microbatch m, in the rows' (N, T, ...) layout;
    zero for the tokens of other microbatches and for padding."""
    flat = x_RL.reshape(-1, *x_RL.shape[2:])[packing.pred_NT]
    here_NT = (packing.micro_N == m)[:, None] & valid_NT
    here = here_NT.reshape(*here_NT.shape, *([1] * (flat.ndim - 2)))
    return jnp.where(here, flat, jnp.zeros((), flat.dtype))


def packed_logprobs(
    params: Params,
    tokens_NS: Array,
    positions_NS: Array,
    valid_NT: Array,
    packing: Packing,
    m: Array | int,
    cfg: ModelConfig,
    chunk_size: int,
    temperature: float | Array,
) -> tuple[Array, Array, Array]:
    """Log-probs, entropies (N, T) of microbatch m's completion tokens, and the hidden states
    (N, T, D) that predict them (for a value head); zero outside microbatch m."""
    h_RLD, tokens_RL = packed_hidden(params, tokens_NS, positions_NS, packing, m, cfg)
    # Each position's target is the next token of the row; only the positions that predict a
    # completion token of their own segment are read back.
    targets_RL = jnp.concatenate([tokens_RL[:, 1:], jnp.zeros_like(tokens_RL[:, :1])], axis=1)
    logp_RL, entropy_RL = token_logprobs(params, h_RLD, targets_RL, cfg, chunk_size, temperature)
    gather = lambda x: gather_rows(x, packing, m, valid_NT)  # noqa: E731
    return gather(logp_RL), gather(entropy_RL), gather(h_RLD)


def all_logprobs(
    params: Params,
    tokens_NS: Array,
    positions_NS: Array,
    valid_NT: Array,
    packing: Packing,
    cfg: ModelConfig,
    chunk_size: int,
    temperature: float | Array,
    with_hidden: bool = False,
) -> tuple[Array, Array | None]:
    """Log-probs (N, T) of every row, one microbatch at a time (the old policy's and the
    reference's constants of the update), and with `with_hidden` the (N, T, D) hidden states
    that predict them (for a value head)."""
    N, T = valid_NT.shape

    def one(carry, m):
        lp, _, h = packed_logprobs(
            params, tokens_NS, positions_NS, valid_NT, packing, m, cfg, chunk_size, temperature
        )
        if not with_hidden:
            return carry + lp, None
        return (carry[0] + lp, carry[1] + h), None

    logp_NT = jnp.zeros((N, T), jnp.float32)
    init = logp_NT
    if with_hidden:
        init = (logp_NT, jnp.zeros((N, T, cfg.embed_dim), jnp.dtype(cfg.dtype)))
    out, _ = jax.lax.scan(one, init, jnp.arange(packing.num_microbatches))
    return out if with_hidden else (out, None)
