"""The packed update: a step's rows packed into a few rows of a fixed length by their real
lengths, so the update's forwards and backward pay for real tokens only.

Reasoning answers are long-tailed: padded to the longest row of a step, most of the update's
token positions are padding. Here a group's prompt (without the left padding) is written once,
then the completions of its rows up to their ends, as the shared-prompt forward does: each
completion is a branch of the group's segment that sees the prompt and itself
(`attention.segment_visible`); `group_size=1` gives every row its own prompt and a plain
segment (what splash attention can mask). First-fit decreasing places these units in packed rows
of `length` tokens (a group too long for one is split over several, its prompt in each), and
every token keeps its own RoPE position (`transformer.hidden_states(segment_ids_BT=...)`). The
log-probs are computed at the packed positions that predict a completion token (the unembedding
skips the prompts) and gathered back to the (N, T) layout, where the losses, advantages and
metrics read them exactly as they read the padded update's.

Microbatches are balanced by tokens, not rows: a packed microbatch holds at most a token
budget (by default the padded microbatch's, N / M rows of S tokens), the packed rows go to the
fewest microbatches M' that hold them, largest first, and a microbatch's loss covers the rows
packed into it, with the whole batch's normaliser, so the gradients sum to the full batch's.
Shapes stay static: M' is a small count and the packed row count R is bucketed (`row_buckets`:
eight sizes per doubling), so a run compiles the few update programs its lengths reach, not one
per step.

The plan (`plan`) is host code on the rollout's lengths; `packed_logprobs` runs inside the
jitted update. Shapes: N rows, P prompt and T completion columns, S = P + T; M' microbatches of
R packed rows of L tokens each.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.model.attention import BRANCHES
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
    at_MK: Array  # (M, K) int32: flat index into microbatch m's (R, L) of its k-th position
    #               that predicts a completion token (K = R' x L, R' <= R); 0 at padding
    tgt_MK: Array  # (M, K) int32: flat index into the (N, S) sequences of the token it predicts
    pred_NT: Array  # (N, T) int32: the k (into at_MK[m]) of the position whose hidden state
    #                 predicts completion token t of row n; 0 if not real
    micro_N: Array  # (N,) int32: the microbatch holding row n; -1 for a row with no token

    @property
    def num_microbatches(self) -> int:
        return self.src_MRL.shape[0]


def row_buckets(num_rows: int, multiple: int) -> list[int]:
    """The packed row counts a run may compile: `multiple` x 1, 2, ..., 8, then eight steps per
    doubling (9 ... 16 by 1, 18 ... 32 by 2, ...: at most an eighth of a bucket is empty rows)
    below `num_rows`, and `num_rows` itself (which holds the rows without packing). A run
    compiles the few of them its steps' lengths reach."""
    sizes, k, step = [], 1, 1
    while k * multiple < num_rows:
        sizes.append(k * multiple)
        if k >= 8 and k & (k - 1) == 0:  # a power of two from 8 on: the step doubles
            step = k // 8
        k += step
    return [*sizes, num_rows]


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
    group_size: int = 1,
    microbatch_tokens: int = 0,
) -> Packing:
    """The packed layout of one rollout's rows (host numpy arrays).

    Args:
      prompt_lengths_N: real prompt tokens per row (left-padded to `prompt_len`).
      mask_NT: the completions' real tokens (a prefix of each row).
      prompt_len: P, the prompt columns.
      length: L, tokens per packed row; 0: 2 S = 2 (P + T), twice the padded row's length,
        which packs long rows in pairs (`benchmarks/step_efficiency.py`), or S where a
        microbatch of 2 S rows would have fewer rows than `row_multiple`.
      num_microbatches: the padded update's microbatches, each of N / M rows of S tokens.
      microbatch_tokens: the token budget of one packed microbatch; 0: the padded
        microbatch's, (N / M) x S, so that a packed one fits where a padded one does. The
        packed rows go to the fewest microbatches within the budget that hold them, dealt by
        real tokens.
      row_multiple: every microbatch's packed row count is a multiple of this (the mesh's row
        shards).
      group_size: G > 1: rows `g * G ... g * G + G - 1` share their prompt, which is packed
        once per packed row that holds completions of the group, each completion a branch
        that sees it (`attention.BRANCHES`); 1: every row its own prompt, plain segments.

    Returns:
      The `Packing` of M' microbatches, with R the smallest bucket (`row_buckets`) that holds
      the rows, and R' the smallest that holds a microbatch's predicting positions in rows of
      L (the unembedding runs on those only, not on the prompts).
    """
    N, T = np.shape(mask_NT)
    S = prompt_len + T
    G = group_size
    p_N, c_N = real_lengths(prompt_lengths_N, mask_NT)
    if G >= BRANCHES:
        raise ValueError(f"group size {G}: a packed prompt has at most {BRANCHES - 1} branches")
    if N % (num_microbatches * row_multiple) or N % G:
        raise ValueError(
            f"{N} rows do not split into groups of {G}, nor into {num_microbatches} "
            f"microbatches of a multiple of {row_multiple} rows"
        )
    budget = microbatch_tokens or N // num_microbatches * S
    # Long rows in pairs, unless then a microbatch would not hold a packed row per row shard.
    L = length or (2 * S if budget // (2 * S) >= row_multiple else S)
    r_max = budget // L // row_multiple * row_multiple
    if r_max < 1:
        raise ValueError(
            f"a microbatch of {budget} tokens holds no {row_multiple} packed rows of {L} tokens"
        )
    units = _units(p_N, c_N, G, L)
    sizes = np.array([p_N[u[0]] + c_N[u].sum() for u in units], np.int64)
    bins = first_fit_decreasing(sizes, L)
    M = -(-max(len(bins), 1) // r_max)
    per_micro = -(-max(len(bins), 1) // M)
    R = next(r for r in row_buckets(r_max, row_multiple) if r >= per_micro)
    src, segment, at, tgt, pred, micro = _place(
        units, bins, sizes, p_N, c_N, (M, R, L), prompt_len, T
    )
    most = -(-max(map(len, at)) // L)
    K = L * next(r for r in row_buckets(r_max, row_multiple) if r >= most)
    at_MK, tgt_MK = np.zeros((M, K), np.int32), np.zeros((M, K), np.int32)
    for m in range(M):
        at_MK[m, : len(at[m])] = at[m]
        tgt_MK[m, : len(tgt[m])] = tgt[m]
    return Packing(src, segment, at_MK, tgt_MK, pred, micro)


def _place(units, bins, sizes, p_N, c_N, shape, prompt_len: int, T: int) -> tuple:
    """The packed rows of `plan`: (src, segment) of `shape` (M, R, L), each microbatch's
    predicting positions and their targets (1-d arrays), pred (N, T) and micro (N,)."""
    M, R, L = shape
    N, S = len(c_N), prompt_len + T
    src = np.zeros((M, R, L), np.int32)
    segment = np.zeros((M, R, L), np.int32)
    at = [[] for _ in range(M)]  # each microbatch's predicting positions, in order
    tgt = [[] for _ in range(M)]  # and the flat (N, S) index of the token each predicts
    pred = np.zeros((N, T), np.int32)
    micro = np.full((N,), -1, np.int32)
    count = [0] * M
    # Deal the bins, fullest first, round-robin over the microbatches: balanced by tokens.
    order = sorted(range(len(bins)), key=lambda b: -int(sizes[bins[b]].sum()))
    for k, b in enumerate(order):
        m, r = k % M, k // M
        start = r * L
        flat_src, flat_seg = src[m].reshape(-1), segment[m].reshape(-1)
        for seq, u in enumerate(bins[b], start=1):
            rows = units[u]
            p = int(p_N[rows[0]])
            flat_src[start : start + p] = rows[0] * S + prompt_len - p + np.arange(p)
            flat_seg[start : start + p] = seq * BRANCHES
            last_prompt, start = start + p - 1, start + p
            for branch, n in enumerate(rows, start=1 if len(rows) > 1 else 0):
                c = int(c_N[n])
                flat_src[start : start + c] = n * S + prompt_len + np.arange(c)
                flat_seg[start : start + c] = seq * BRANCHES + branch
                # The last prompt token predicts the first completion token, and so on.
                pred[n, :c] = count[m] + np.arange(c)
                count[m] += c
                at[m] += [np.array([last_prompt]), np.arange(start, start + c - 1)]
                tgt[m].append(n * S + prompt_len + np.arange(c))
                micro[n] = m
                start += c
    flat = lambda parts: np.concatenate([np.zeros(0, np.int64), *parts])  # noqa: E731
    return src, segment, [flat(x) for x in at], [flat(x) for x in tgt], pred, micro


def _units(p_N: np.ndarray, c_N: np.ndarray, G: int, L: int) -> list[list[int]]:
    """The rows packed behind one copy of their prompt: each group's rows with a completion, in
    as few units of at most L tokens as first-fit decreasing makes (one row each for G = 1)."""
    units = []
    for g in range(0, len(c_N), G):
        rows = [n for n in range(g, g + G) if c_N[n] > 0]
        if not rows:
            continue
        if len(set(p_N[rows].tolist())) > 1:
            raise ValueError(f"the rows of group {g // G} have prompts of different lengths")
        n = max(rows, key=lambda n: c_N[n])
        if p_N[n] + c_N[n] > L:
            raise ValueError(
                f"row {n} has {int(p_N[n] + c_N[n])} real tokens, more than rl.pack_length={L}"
            )
        units += [[rows[i] for i in b] for b in first_fit_decreasing(c_N[rows], L - p_N[n])]
    return units


# The packed update pays for its gathers and its per-segment masks, so with as many token
# positions it is slower than the padded update: it runs only where it computes at most this
# share of the padded update's positions.
WORTH_PACKING = 0.8


def padded_positions(N: int, P: int, T: int, group_size: int) -> int:
    """Token positions the padded update computes for N rows of P + T columns: each group's
    prompt once with `group_size` > 1 (`rl.shared_prompt_forward`), every row's otherwise."""
    return N // group_size * P + N * T if group_size > 1 else N * (P + T)


def worth_packing(packing: Packing, padded: int) -> bool:
    """Whether `packing` computes few enough positions against the padded update's `padded`
    (`padded_positions`) to be faster (`WORTH_PACKING`)."""
    return packing.src_MRL.size <= WORTH_PACKING * padded


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


def predicting(
    params: Params,
    tokens_NS: Array,
    positions_NS: Array,
    packing: Packing,
    m: Array | int,
    cfg: ModelConfig,
) -> tuple[Array, Array]:
    """Microbatch m's hidden states (R', L, D) at its predicting positions (`at_MK`), and the
    completion tokens (R', L) they predict."""
    h_RLD, tokens_RL = packed_hidden(params, tokens_NS, positions_NS, packing, m, cfg)
    D, L = h_RLD.shape[-1], tokens_RL.shape[1]
    h_KD = h_RLD.reshape(-1, D)[packing.at_MK[m]]
    targets_K = tokens_NS.reshape(-1)[packing.tgt_MK[m]]  # padding reads token 0, masked later
    return h_KD.reshape(-1, L, D), targets_K.reshape(-1, L)


def gather_rows(x_KL: Array, packing: Packing, m: Array | int, valid_NT: Array) -> Array:
    """Values (R', L, ...) at microbatch m's predicting positions, in the rows' (N, T, ...)
    layout; zero for the tokens of other microbatches and for padding."""
    flat = x_KL.reshape(-1, *x_KL.shape[2:])[packing.pred_NT]
    here_NT = (packing.micro_N == m)[:, None] & valid_NT
    here = here_NT.reshape(*here_NT.shape, *([1] * (flat.ndim - 2)))
    return jnp.where(here, flat, jnp.zeros((), flat.dtype))


def packed_values_hidden(
    params: Params,
    tokens_NS: Array,
    positions_NS: Array,
    valid_NT: Array,
    packing: Packing,
    m: Array | int,
    cfg: ModelConfig,
) -> Array:
    """The hidden states (N, T, D) that predict microbatch m's completion tokens (for a value
    head on a separate backbone); zero outside microbatch m."""
    h_KLD, _ = predicting(params, tokens_NS, positions_NS, packing, m, cfg)
    return gather_rows(h_KLD, packing, m, valid_NT)


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
    (N, T, D) that predict them (for a value head); zero outside microbatch m. The unembedding
    runs at the predicting positions only."""
    h_KLD, targets_KL = predicting(params, tokens_NS, positions_NS, packing, m, cfg)
    logp_KL, entropy_KL = token_logprobs(params, h_KLD, targets_KL, cfg, chunk_size, temperature)
    gather = lambda x: gather_rows(x, packing, m, valid_NT)  # noqa: E731
    return gather(logp_KL), gather(entropy_KL), gather(h_KLD)


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
