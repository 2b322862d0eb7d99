"""The packed update: a step's rows packed by their real lengths into a few long rows, so the
update's forwards and backward pay for real tokens only.

Reasoning answers are long-tailed: padded to the longest row of a step, most of the update's
token positions are padding. Here a group's prompt (without the left padding) is written once,
then the completions of its rows up to their ends, as the shared-prompt forward does: each
completion is a branch of the group's segment that sees the prompt and itself
(`attention.segment_visible`, and blockwise attention visits only those blocks);
`group_size=1` gives every row its own prompt and a plain segment (what splash attention can
mask). Every token keeps its own RoPE position (`transformer.hidden_states(segment_ids_BT=...)`).
The log-probs are computed at the packed positions that predict a completion token (the
unembedding skips the prompts) and gathered back to the (N, T) layout, where the losses,
advantages and metrics read them exactly as they read the padded update's.

The layout (`plan`): M' microbatches of R packed rows of L tokens. By default R is the mesh's
row shards (one row on one device) and L is chosen per step: the shortest of `length_buckets`
(multiples of the attention block, 16 per doubling) that `_fill` fills with the step's rows in
the fewest microbatches within a token budget (by default the padded microbatch's, N / M rows
of S tokens). A step then computes its real tokens plus the rounding to that length (about a
sixteenth at most), the packed rows' ends cost nothing, and a group's prompt is packed again
only where the group is split. Long rows cost no attention between sequences because
blockwise attention skips the blocks no query of a block sees; for dense and splash attention,
which do not, and with a fixed `length`, the rows have a fixed length and R is bucketed
(`row_buckets`). Shapes stay static: a run compiles the few update programs its lengths reach,
not one per step. A microbatch's loss covers the rows packed into it, with the whole batch's
normaliser, so the gradients sum to the full batch's.

The plan is host code on the rollout's lengths; `packed_logprobs` runs inside the jitted
update. Shapes: N rows, P prompt and T completion columns, S = P + T; M' microbatches of R
packed rows of L tokens each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.model.attention import BRANCHES
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.moe import Routing
from rlvr_jax.model.transformer import Params, routed_hidden_states
from rlvr_jax.rl.logprobs import token_logprobs

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Packing:
    """Where every token of the rows lies in the packed rows."""

    src_MRL: Array  # (M, R, L) int32: flat index into the (N, S) sequences; 0 at padding
    segment_MRL: Array  # (M, R, L) int32: the segment (1, 2, ...) in its packed row; 0 padding
    at_MK: Array  # (M, K) int32: flat index into microbatch m's (R, L) of its k-th position
    #               that predicts a completion token (K = R x L', L' <= L); 0 at padding
    tgt_MK: Array  # (M, K) int32: flat index into the (N, S) sequences of the token it predicts
    pred_NT: Array  # (N, T) int32: the k (into at_MK[m]) of the position whose hidden state
    #                 predicts completion token t of row n; 0 if not real
    micro_N: Array  # (N,) int32: the microbatch holding row n; -1 for a row with no token

    @property
    def num_microbatches(self) -> int:
        return self.src_MRL.shape[-3]

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(M, R, L, K): microbatches, packed rows and their length, and the predicting
        positions per packed row; the shapes a compiled update program is specialised to."""
        M, R, L = self.src_MRL.shape[-3:]  # minibatches' layouts are stacked in front
        return M, R, L, self.at_MK.shape[-1] // R


def _buckets(limit: int, unit: int, per_doubling: int) -> list[int]:
    """`unit` x 1, 2, ..., `per_doubling` (a power of two), then `per_doubling` steps per
    doubling, below `limit`; and `limit` itself."""
    sizes, k, step = [], 1, 1
    while k * unit < limit:
        sizes.append(k * unit)
        if k >= per_doubling and k & (k - 1) == 0:  # a power of two from there on: step doubles
            step = k // per_doubling
        k += step
    return [*sizes, limit]


def row_buckets(num_rows: int, multiple: int) -> list[int]:
    """The packed row counts a run with a fixed row length may compile: `multiple` x 1, ..., 8,
    then eight steps per doubling (9 ... 16 by 1, 18 ... 32 by 2, ...: at most an eighth of a
    bucket is empty rows) below `num_rows`, and `num_rows` itself."""
    return _buckets(num_rows, multiple, 8)


# A step takes an earlier step's (compiled) packed shape where it costs at most this share more
# token positions than the shape chosen for it alone (`plan(reuse=...)`).
REUSE_SLACK = 0.125


def length_buckets(longest: int, block: int) -> list[int]:
    """The packed row lengths a run may compile: multiples of `block` (the attention block, so
    that blockwise attention pads no row), 1 ... 16 blocks, then sixteen steps per doubling (a
    length at most a sixteenth over the one below), below `longest`, and `longest`."""
    return _buckets(longest, block, 16)


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
    block: int = 128,
    skips_blocks: bool = True,
    reuse: Collection[tuple[int, int, int, int]] = (),
    min_microbatches: int = 1,
) -> Packing:
    """The packed layout of one rollout's rows (host numpy arrays).

    Args:
      prompt_lengths_N: real prompt tokens per row (left-padded to `prompt_len`).
      mask_NT: the completions' real tokens (a prefix of each row).
      prompt_len: P, the prompt columns.
      length: L, tokens per packed row, with the row count R per microbatch bucketed
        (`row_buckets`); 0: R = `row_multiple` and L per step (`length_buckets`), or with
        `skips_blocks` False 2 S (S where a microbatch would hold fewer than `row_multiple`
        rows of 2 S).
      num_microbatches: the padded update's microbatches, each of N / M rows of S tokens.
      microbatch_tokens: the token budget of one packed microbatch; 0: the padded
        microbatch's, (N / M) x S, so that a packed one fits where a padded one does (at
        least `row_multiple` x S: a packed row per row shard). The rows go to the fewest
        microbatches within the budget that hold them, balanced by tokens.
      row_multiple: every microbatch's packed row count is a multiple of this (the mesh's row
        shards).
      group_size: G > 1: rows `g * G ... g * G + G - 1` share their prompt, which is packed
        once per packed row that holds completions of the group, each completion a branch
        that sees it (`attention.BRANCHES`); 1: every row its own prompt, plain segments.
      block: the attention block; default row lengths and the unembedding's rows are multiples
        of it.
      skips_blocks: whether the attention skips the key blocks no query of a query block sees
        (blockwise attention does), so that a long packed row costs what its sequences do;
        dense and splash attention pay for a row's whole causal square, so they take rows of a
        fixed length.
      reuse: shapes (M, R, L, K) = `Packing.shape` of earlier steps' plans, whose programs are
        compiled: the smallest that holds this step's rows for at most `REUSE_SLACK` more
        token positions than the fresh shape is taken instead of it, so that a run whose
        lengths drift compiles a few shapes, not one per step.
      min_microbatches: at least this many microbatches (`plan_minibatches` gives every
        minibatch the count the fullest one needs).

    Returns:
      The `Packing` of M' microbatches of the smallest (R, L) that `_fill` fills, and of
      predicting positions in (R, L') with L' the smallest of `length_buckets` that holds a
      microbatch's (the unembedding runs on those only, not on the prompts).
    """
    N, T = np.shape(mask_NT)
    S = prompt_len + T
    G = group_size
    p_N, c_N = real_lengths(prompt_lengths_N, mask_NT)
    if G >= BRANCHES:
        raise ValueError(f"group size {G}: a packed prompt has at most {BRANCHES - 1} branches")
    if N % num_microbatches or N % G:
        raise ValueError(
            f"{N} rows do not split into groups of {G}, nor into {num_microbatches} microbatches"
        )
    budget = microbatch_tokens or max(N // num_microbatches, row_multiple) * S
    if not (length or skips_blocks):
        length = 2 * S if budget // (2 * S) >= row_multiple else S
    shapes = _shapes(budget, length, row_multiple, block)
    groups = _groups(p_N, c_N, G, shapes[-1][1], length)
    M, R, L, rows = _layout(groups, p_N, c_N, shapes, min_microbatches)
    placed = _place(rows, p_N, c_N, (M, R, L), prompt_len, T)
    plan_args = (shapes[-1][1], prompt_len, T)
    most = -(-max(map(len, placed[2])) // R)
    K = R * next(k for k in length_buckets(L, block) if k >= most)
    if (M, R, L, K // R) not in reuse:
        (M, R, L, K), placed = _reused((M, R, L, K), placed, reuse, groups, p_N, c_N, plan_args)
    src, segment, at, tgt, pred, micro = placed
    at_MK, tgt_MK = np.zeros((M, K), np.int32), np.zeros((M, K), np.int32)
    for m in range(M):
        at_MK[m, : len(at[m])] = at[m]
        tgt_MK[m, : len(tgt[m])] = tgt[m]
    return Packing(src, segment, at_MK, tgt_MK, pred, micro)


def pad_to(packing: Packing, shape: tuple[int, int, int, int]) -> Packing:
    """`packing` (host arrays) in a shape (M, R, L, K per packed row) at least as large in each
    dimension: the microbatches, packed rows, positions and predicting positions it adds are
    padding, so the layout computes the same log-probs."""
    M, R, L, Kr = shape
    M0, R0, L0, Kr0 = packing.shape
    if not (M0 <= M and R0 <= R and L0 <= L and Kr0 <= Kr and Kr <= L):
        raise ValueError(f"a packed shape {packing.shape} does not fit in {shape}")
    src, segment = np.zeros((M, R, L), np.int32), np.zeros((M, R, L), np.int32)
    src[:M0, :R0, :L0] = packing.src_MRL
    segment[:M0, :R0, :L0] = packing.segment_MRL
    r, pos = np.divmod(np.asarray(packing.at_MK), L0)  # flat (R0, L0) -> flat (R, L)
    at_MK, tgt_MK = np.zeros((M, R * Kr), np.int32), np.zeros((M, R * Kr), np.int32)
    at_MK[:M0, : R0 * Kr0] = r * L + pos
    tgt_MK[:M0, : R0 * Kr0] = packing.tgt_MK
    return Packing(src, segment, at_MK, tgt_MK, packing.pred_NT, packing.micro_N)


def plan_minibatches(
    prompt_lengths_N: np.ndarray,
    mask_NT: np.ndarray,
    prompt_len: int,
    orders_PN: np.ndarray,
    num_minibatches: int,
    reuse: Collection[tuple[int, int, int, int]] = (),
    **kwargs,
) -> Packing:
    """The packed layouts of a step's minibatches: pass p's minibatch j holds rows
    `orders_PN[p, j * n : (j + 1) * n]` (n = N / num_minibatches, in that order, as the update
    shuffles them: `update.minibatch_orders`), planned alone with a prompt per row (shuffled
    rows do not keep their groups) and indexed into the minibatch's rows. All take one shape,
    the largest of theirs in each dimension (`pad_to`; the microbatch count by planning again),
    so that one program runs them; fields stacked (passes, minibatches, ...). `kwargs` as
    `plan`'s; `reuse` offers the earlier steps' shapes to each minibatch."""
    N = np.shape(mask_NT)[0]
    if N % num_minibatches:
        raise ValueError(f"{N} rows do not split into {num_minibatches} minibatches")
    n = N // num_minibatches
    rows = [
        order[j * n : (j + 1) * n]
        for order in np.asarray(orders_PN)
        for j in range(num_minibatches)
    ]
    prompt_lengths_N, mask_NT = np.asarray(prompt_lengths_N), np.asarray(mask_NT)
    one = lambda r, **more: plan(  # noqa: E731
        prompt_lengths_N[r], mask_NT[r], prompt_len, group_size=1, **kwargs, **more
    )
    plans = [one(r, reuse=reuse) for r in rows]
    M = max(p.num_microbatches for p in plans)
    plans = [
        p if p.num_microbatches == M else one(r, min_microbatches=M)
        for p, r in zip(plans, rows, strict=True)
    ]
    shape = tuple(max(p.shape[d] for p in plans) for d in range(4))
    plans = [pad_to(p, shape) for p in plans]
    stacked = jax.tree.map(lambda *xs: np.stack(xs), *plans)
    return jax.tree.map(lambda x: x.reshape(len(orders_PN), num_minibatches, *x.shape[1:]), stacked)


def _reused(fresh, placed, reuse, groups, p_N, c_N, plan_args) -> tuple:
    """(shape, `_place`'s arrays) of the smallest of the `reuse` shapes (M, R, L, K per packed
    row) that holds the groups for at most `REUSE_SLACK` more positions than `fresh` (M, R, L,
    K in all); `fresh` and `placed` where none does."""
    M, R, L, _ = fresh
    longest, prompt_len, T = plan_args
    for M2, R2, L2, K2 in sorted(reuse, key=lambda s: (s[0] * s[1] * s[2], s[3])):
        if (
            R2 != R
            or longest < L2
            or not M * R * L <= M2 * R2 * L2 <= (1 + REUSE_SLACK) * M * R * L
        ):
            continue
        if (rows := _fill(groups, p_N, c_N, L2, M2 * R2)) is None:
            continue
        placed2 = _place(rows, p_N, c_N, (M2, R2, L2), prompt_len, T)
        if max(map(len, placed2[2])) <= R2 * K2:
            return (M2, R2, L2, R2 * K2), placed2
    return fresh, placed


def _shapes(budget: int, length: int, row_multiple: int, block: int) -> list[tuple[int, int]]:
    """The (rows R, length L) a packed microbatch may take within `budget` tokens, smallest
    first: R bucketed for a fixed `length`; else R = `row_multiple`, L bucketed."""
    if length:
        rows = budget // length // row_multiple * row_multiple
        if rows < 1:
            raise ValueError(
                f"a microbatch of {budget} tokens holds no {row_multiple} packed rows of "
                f"{length} tokens"
            )
        return [(r, length) for r in row_buckets(rows, row_multiple)]
    if budget < row_multiple:
        raise ValueError(f"a microbatch of {budget} tokens holds no {row_multiple} packed rows")
    return [(row_multiple, n) for n in length_buckets(budget // row_multiple, block)]


def _groups(p_N: np.ndarray, c_N: np.ndarray, G: int, L: int, length: int) -> list[np.ndarray]:
    """Each group's rows with a completion (one row each for G = 1), checked: one prompt
    length per group, and every row's prompt and completion within a packed row of L."""
    groups = []
    for g in range(0, len(c_N), G):
        rows = np.array([n for n in range(g, g + G) if c_N[n] > 0], np.int64)
        if not rows.size:
            continue
        if len(set(p_N[rows].tolist())) > 1:
            raise ValueError(f"the rows of group {g // G} have prompts of different lengths")
        n = int(rows[np.argmax(c_N[rows])])
        if p_N[n] + c_N[n] > L:
            where = f"rl.pack_length={L}" if length else f"a packed row's {L} (token budget)"
            raise ValueError(f"row {n} has {int(p_N[n] + c_N[n])} real tokens, more than {where}")
        groups.append(rows)
    return groups


def _layout(groups, p_N, c_N, shapes, min_m: int = 1) -> tuple[int, int, int, list]:
    """(M, R, L, packed rows): the fewest microbatches (at least `min_m`), then the smallest
    of `shapes`, that `_fill` fills with the groups."""
    tokens = sum(int(p_N[rows[0]] + c_N[rows].sum()) for rows in groups)
    M = max(1, min_m, -(-tokens // (shapes[-1][0] * shapes[-1][1])))
    while True:  # ends: with a packed row per real row, every row fits (`_groups`)
        for R, L in shapes:
            if tokens <= M * R * L and (rows := _fill(groups, p_N, c_N, L, M * R)) is not None:
                return M, R, L, rows
        M += 1


def _fill(groups, p_N, c_N, L: int, num_rows: int) -> list[list[list[int]]] | None:
    """The groups' rows in `num_rows` packed rows of L tokens: per packed row, its units (the
    rows packed behind one copy of their prompt); None where they do not fit.

    Largest group first, each whole in the first packed row with room for it; a group that fits
    in none is split, its completions (longest first) each going to the first packed row that
    has room for it, and for another copy of the prompt where the row holds none of the group.
    Prompts are packed again only for split groups."""
    room = np.full(num_rows, L, np.int64)
    packed: list[dict[int, list[int]]] = [{} for _ in range(num_rows)]  # group -> its rows
    tokens = lambda rows: int(p_N[rows[0]] + c_N[rows].sum())  # noqa: E731
    for g in sorted(range(len(groups)), key=lambda g: -tokens(groups[g])):
        rows = groups[g]
        whole = np.flatnonzero(room >= tokens(rows))
        if whole.size:
            packed[whole[0]][g] = rows.tolist()
            room[whole[0]] -= tokens(rows)
            continue
        p = int(p_N[rows[0]])
        for n in sorted(rows.tolist(), key=lambda n: -c_N[n]):
            prompt = np.array([0 if g in x else p for x in packed])
            free = np.flatnonzero(room >= c_N[n] + prompt)
            if not free.size:
                return None
            packed[free[0]].setdefault(g, []).append(n)
            room[free[0]] -= c_N[n] + prompt[free[0]]
    return [list(x.values()) for x in packed]


def _place(packed_rows, p_N, c_N, shape, prompt_len: int, T: int) -> tuple:
    """The packed rows of `plan` (`_fill`'s: per packed row, its units of rows behind one
    prompt): (src, segment) of `shape` (M, R, L), each microbatch's predicting positions and
    their targets (1-d arrays), pred (N, T) and micro (N,)."""
    M, R, L = shape
    N, S = len(c_N), prompt_len + T
    src = np.zeros((M, R, L), np.int32)
    segment = np.zeros((M, R, L), np.int32)
    at = [[] for _ in range(M)]  # each microbatch's predicting positions, in order
    tgt = [[] for _ in range(M)]  # and the flat (N, S) index of the token each predicts
    pred = np.zeros((N, T), np.int32)
    micro = np.full((N,), -1, np.int32)
    count = [0] * M
    # Deal the packed rows, fullest first, round-robin over the microbatches: balanced by tokens.
    fill = [sum(int(p_N[u[0]] + c_N[u].sum()) for u in units) for units in packed_rows]
    order = sorted(range(len(packed_rows)), key=lambda b: -fill[b])
    for k, b in enumerate(order):
        m, r = k % M, k // M
        start = r * L
        flat_src, flat_seg = src[m].reshape(-1), segment[m].reshape(-1)
        for seq, rows in enumerate(packed_rows[b], start=1):
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
) -> tuple[Array, Array, Routing | None]:
    """The final-norm hidden states (R, L, D) of microbatch m's packed rows, their tokens, and
    an MoE model's routing of them, fields (layers, R, L, ...) (None for a dense model)."""
    src_RL = packing.src_MRL[m]
    segment_RL = packing.segment_MRL[m]
    tokens_RL = tokens_NS.reshape(-1)[src_RL]
    positions_RL = positions_NS.reshape(-1)[src_RL]
    h_RLD, routed = routed_hidden_states(
        params, tokens_RL, positions_RL, cfg, segment_RL > 0, segment_ids_BT=segment_RL
    )
    return h_RLD, tokens_RL, routed


def predicting(
    params: Params,
    tokens_NS: Array,
    positions_NS: Array,
    packing: Packing,
    m: Array | int,
    cfg: ModelConfig,
) -> tuple[Array, Array, Routing | None]:
    """Microbatch m's hidden states (R, L', D) at its predicting positions (`at_MK`), the
    completion tokens (R, L') they predict, and an MoE model's routing of those positions,
    fields (layers, R, L', ...) (None for a dense model)."""
    h_RLD, tokens_RL, routed = packed_hidden(params, tokens_NS, positions_NS, packing, m, cfg)
    R, D = h_RLD.shape[0], h_RLD.shape[-1]
    at_K = packing.at_MK[m]
    h_KD = h_RLD.reshape(-1, D)[at_K]
    targets_K = tokens_NS.reshape(-1)[packing.tgt_MK[m]]  # padding reads token 0, masked later
    if routed is not None:
        routed = jax.tree.map(
            lambda a: a.reshape(a.shape[0], -1, a.shape[-1])[:, at_K].reshape(
                a.shape[0], R, -1, a.shape[-1]
            ),
            routed,
        )
    return h_KD.reshape(R, -1, D), targets_K.reshape(R, -1), routed


def gather_rows(x_KL: Array, packing: Packing, m: Array | int, valid_NT: Array) -> Array:
    """Values (R, L', ...) at microbatch m's predicting positions, in the rows' (N, T, ...)
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
    h_KLD, _, _ = predicting(params, tokens_NS, positions_NS, packing, m, cfg)
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
) -> tuple[Array, Array, Array, Routing | None]:
    """Log-probs, entropies (N, T) of microbatch m's completion tokens, the hidden states
    (N, T, D) that predict them (for a value head) and an MoE model's routing of those states,
    fields (layers, N, T, ...) (None for a dense model); zero outside microbatch m. The
    unembedding runs at the predicting positions only."""
    h_KLD, targets_KL, routed = predicting(params, tokens_NS, positions_NS, packing, m, cfg)
    logp_KL, entropy_KL = token_logprobs(params, h_KLD, targets_KL, cfg, chunk_size, temperature)
    gather = lambda x: gather_rows(x, packing, m, valid_NT)  # noqa: E731
    if routed is not None:
        routed = jax.tree.map(jax.vmap(gather), routed)
    return gather(logp_KL), gather(entropy_KL), gather(h_KLD), routed


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
        lp, _, h, _ = packed_logprobs(
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
