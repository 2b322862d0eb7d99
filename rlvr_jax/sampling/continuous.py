"""Continuous batching: M decode slots for N rows, refilled inside one jitted `lax.while_loop`.

With long-tailed answer lengths the static loop (`loop.generate`) decodes every row until the
longest ends, so most of its slot-steps go to rows that have finished. Here the decode cache has
M <= N rows, the slots; each holds one row at a time, and when that row ends (end id, stop
sequence, `max_new_tokens`) the slot takes the next queued row, in row order:

* Each group's prompt is prefilled once for the whole rollout, into a store of (L, B, K, P, Dh)
  keys/values and the (B, V) logits of its last position. A slot that takes a row copies the
  prompt's keys/values into its cache row (slots [0, P)) and emits the row's first token from
  the stored logits; the decode step it runs in that iteration is thrown away.
* Each iteration: refill free slots, one decode step in which each slot writes its own cache
  slot (`decode.decode_step_per_row`), then one token per slot through `loop.choose_and_match`,
  the static loop's emission. Row n draws its t-th token with `row_uniforms`' u[n, t] whichever
  slot it lands in, so the rollout equals `loop.generate`'s for the same key.
* Attention reads the static window (`decode.attention_windows`) that holds the largest filled
  position among live slots.
* For a mixture-of-experts model it records each token's experts as the static loop does
  (`Rollout.experts_NTLk`): the stored experts of the prompt's last position for a row's first
  token, then those of each decode step's fed token; a dense model's field stays None.

The loop returns when every row is done, with the `Rollout` in row order and `RolloutStats`
(decode steps, live and total slot-steps) to compare with the static loop (`static_stats`).

Shapes: N rows (B prompts x G samples), M decode slots, P prompt bucket, T = max_new_tokens,
S = P + T - 1 cache positions per slot, L layers, K kv heads, Dh head dim, V vocab.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.model import decode, transformer
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.kv_cache import KVCache
from rlvr_jax.sampling import loop
from rlvr_jax.sampling.choice import row_uniforms
from rlvr_jax.sampling.config import SamplerConfig, SamplingParams, sampling_params
from rlvr_jax.types import FINISH_EOS, FINISH_LENGTH, FINISH_STOP, Rollout

Array = jax.Array
# `auto_slots` turns continuous batching on from this answer length. Measured on a 2-core CPU
# (benchmarks/README.md, "Rollout"): a long-tailed workload ran 4x faster with N / 8 and N / 16
# slots, 128-token SmolLM2 answers only 1.1-1.2x; N / 4 is a middle not yet tuned on an
# accelerator, where fewer slots also mean smaller decode matmuls.
CONTINUOUS_FROM_TOKENS = 1024


def auto_slots(num_rows: int, max_new_tokens: int) -> int:
    """Decode slots for `num_rows` rows where no count is configured: N / 4 for answers of
    `CONTINUOUS_FROM_TOKENS` tokens or more, else N (the static sampler)."""
    if max_new_tokens >= CONTINUOUS_FROM_TOKENS and num_rows >= 8:
        return num_rows // 4
    return num_rows


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RolloutStats:
    """How busy a rollout kept its decode slots. A slot-step is one slot over one emission step
    (the first token, from the prompt's logits, then one per decode step)."""

    decode_steps: Array  # () int32 decode steps (loop iterations) after the first token
    live_slot_steps: Array  # () int32 slot-steps that emitted a token of a row
    total_slot_steps: Array  # () int32 slots x (decode_steps + 1)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _Prompts:
    """The loop's per-call inputs, indexed by prompt or row; read, never updated."""

    store: KVCache  # (L, B, K, P, Dh) each prompt's keys/values, prefilled once
    logits_BV: Array  # f32 logits of each prompt's last position
    experts_BLk: Array | None  # int32 an MoE model's experts of that position; None when dense
    mask_NP: Array  # bool real prompt slots
    lengths_N: Array  # int32 prompt lengths
    in_think_N: Array  # bool prompt leaves a thinking block open
    u_NT: Array  # f32 row n's uniform for its token t
    sp: SamplingParams  # (N,) fields


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _Slots:
    """The loop's carry: M slots, the queue position and the rollout so far."""

    step: Array  # () int32 decode steps run
    next_row: Array  # () int32 rows [0, next_row) have been given a slot
    cache: KVCache  # M rows, S positions
    row_M: Array  # int32 the row each slot holds (stale once it ends)
    t_M: Array  # int32 tokens that row has emitted
    live_M: Array  # bool holds a row that has not ended
    fresh_M: Array  # bool took its row this iteration: its token comes from the prompt's logits
    last_M: Array  # int32 the token fed next
    mask_MP: Array  # bool prompt mask of each slot's row
    matchers: loop.Matchers  # (M, ...) stop and think matchers of each slot's row
    out: Rollout  # (N, ...) in row order; lengths_N is filled after the loop
    live_steps: Array  # () int32 slot-steps that emitted a token


def check_num_slots(num_slots: int, num_rows: int) -> None:
    """Raises ValueError unless 1 <= num_slots <= num_rows."""
    if not 1 <= num_slots <= num_rows:
        raise ValueError(
            f"num_slots={num_slots} must be in [1, {num_rows}]: each of the {num_rows} rows "
            "needs a decode slot, and a slot holds one row at a time"
        )


def _copy_prompts(cache: KVCache, store: KVCache, take_M: Array, prompt_M: Array) -> KVCache:
    """Copies prompt `prompt_M[m]`'s keys/values into slots [0, P) of cache row m, for each m
    with `take_M[m]`: one (L, 1, K, P, Dh) copy per taken slot, not a rewrite of every row."""
    M = take_M.shape[0]
    L, _, K, P, Dh = store.k.shape
    slots_M = jnp.nonzero(take_M, size=M, fill_value=0)[0]
    put = jax.lax.dynamic_update_slice

    def one(j, cache: KVCache) -> KVCache:
        m = slots_M[j]
        at = (0, prompt_M[m], 0, 0, 0)
        k, v = (jax.lax.dynamic_slice(x, at, (L, 1, K, P, Dh)) for x in (store.k, store.v))
        if cache.unrolled:
            return KVCache(
                k=tuple(put(c, k[i], (m, 0, 0, 0)) for i, c in enumerate(cache.k)),
                v=tuple(put(c, v[i], (m, 0, 0, 0)) for i, c in enumerate(cache.v)),
            )
        return KVCache(k=put(cache.k, k, (0, m, 0, 0, 0)), v=put(cache.v, v, (0, m, 0, 0, 0)))

    # A trip count of the slots taken (usually 0 or 1 per iteration); each copy updates the
    # carried cache in place.
    return jax.lax.fori_loop(0, jnp.sum(take_M), one, cache)


def _refill(s: _Slots, pr: _Prompts, cfg: SamplerConfig) -> _Slots:
    """Gives each free slot the next queued row, in row order, with its prompt's keys/values."""
    N = pr.lengths_N.shape[0]
    free_M = ~s.live_M
    new_row_M = s.next_row + jnp.cumsum(free_M, dtype=jnp.int32) - 1
    take_M = free_M & (new_row_M < N)
    row_M = jnp.where(take_M, new_row_M, s.row_M)
    prompt_M = row_M // cfg.prompt_group
    fresh = loop.initial_matchers(pr.in_think_N[row_M], cfg)
    reset = lambda new, old: jnp.where(take_M.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)
    return dataclasses.replace(
        s,
        next_row=s.next_row + jnp.sum(take_M, dtype=jnp.int32),
        cache=_copy_prompts(s.cache, pr.store, take_M, prompt_M),
        row_M=row_M,
        t_M=jnp.where(take_M, 0, s.t_M),
        live_M=s.live_M | take_M,
        fresh_M=take_M,
        mask_MP=reset(pr.mask_NP[row_M], s.mask_MP),
        matchers=jax.tree.map(reset, fresh, s.matchers),
    )


def _emit(
    s: _Slots,
    logits_MV: Array,
    pr: _Prompts,
    cfg: SamplerConfig,
    experts_MLk: Array | None = None,
) -> _Slots:
    """Chooses, records and matches one token per live slot, in its row's place, with
    `experts_MLk`, the experts of the position whose logits these are (an MoE model's)."""
    N, T = pr.u_NT.shape
    live = s.live_M
    t_M = jnp.minimum(s.t_M, T - 1)  # a finished slot's t may be T; its choice is discarded
    sp_M = jax.tree.map(lambda x: x[s.row_M], pr.sp)
    tok, logp, injected, eos, stop, matchers = loop.choose_and_match(
        logits_MV, pr.u_NT[s.row_M, t_M], live, sp_M, s.matchers, cfg
    )
    # Slots without a live row write out of bounds, which mode="drop" discards.
    at = (jnp.where(live, s.row_M, N), t_M)
    put = lambda buf_NT, x_M: buf_NT.at[at].set(x_M, mode="drop")
    reason = jnp.where(eos, FINISH_EOS, FINISH_STOP)
    out = dataclasses.replace(
        s.out,
        tokens_NT=put(s.out.tokens_NT, tok),
        logp_NT=put(s.out.logp_NT, logp),
        mask_NT=put(s.out.mask_NT, live),
        injected_NT=put(s.out.injected_NT, injected),
        finish_N=s.out.finish_N.at[jnp.where(eos | stop, s.row_M, N)].set(reason, mode="drop"),
    )
    if out.experts_NTLk is not None:
        out = dataclasses.replace(out, experts_NTLk=put(out.experts_NTLk, experts_MLk))
    return dataclasses.replace(
        s,
        t_M=s.t_M + live,
        live_M=live & ~(eos | stop | (s.t_M + 1 >= T)),
        fresh_M=jnp.zeros_like(live),
        last_M=tok,
        matchers=matchers,
        out=out,
        live_steps=s.live_steps + jnp.sum(live, dtype=jnp.int32),
    )


def _decode(
    s: _Slots,
    params: transformer.Params,
    layers: list[transformer.Layers] | None,
    pr: _Prompts,
    rope_table: tuple[Array, Array],
    model_cfg: ModelConfig,
    windows: tuple[int, ...],
) -> tuple[Array, KVCache, Array | None]:
    """One decode step of every slot: the token fed at index t - 1 of its row sits at cache slot
    P + t - 1 and RoPE position len + t - 1. Fresh slots (t = 0) run a throwaway step at slot P,
    which their first fed token overwrites; finished ones (t = T) are clamped into their row.
    Returns the logits, the cache and an MoE model's experts (M, L, k) of the fed tokens."""
    P, S = pr.mask_NP.shape[1], s.cache.num_slots
    fed_M = jnp.maximum(s.t_M - 1, 0)
    slot_M = jnp.minimum(P + fed_M, S - 1)
    pos_M = pr.lengths_N[s.row_M] + fed_M
    rope_M = tuple(table[pos_M] for table in rope_table)
    max_slot = jnp.max(jnp.where(s.live_M & ~s.fresh_M, slot_M, 0))
    return decode.routed_decode_step_per_row(
        params, layers, s.cache, s.last_M, rope_M, s.mask_MP, slot_M, max_slot, model_cfg, windows
    )


def _initial_slots(cache: KVCache, pr: _Prompts, cfg: SamplerConfig) -> _Slots:
    """The carry before any row has a slot (with room for every token's experts when the
    prompts' experts say the model is an MoE)."""
    (N, P), T = pr.mask_NP.shape, cfg.max_new_tokens
    M = jax.tree.leaves(cache)[0].shape[-4]  # (L, M, K, S, Dh) stacked, (M, K, S, Dh) per layer
    zeros_M = jnp.zeros((M,), jnp.int32)
    experts_NTLk = None
    if pr.experts_BLk is not None:
        experts_NTLk = jnp.zeros((N, T, *pr.experts_BLk.shape[1:]), jnp.int32)
    out = Rollout(
        prompt_NP=jnp.zeros((N, P), jnp.int32),  # set by the caller
        prompt_lengths_N=pr.lengths_N,
        tokens_NT=jnp.full((N, T), cfg.pad_id, jnp.int32),
        logp_NT=jnp.zeros((N, T), jnp.float32),
        mask_NT=jnp.zeros((N, T), bool),
        injected_NT=jnp.zeros((N, T), bool),
        lengths_N=jnp.zeros((N,), jnp.int32),
        finish_N=jnp.full((N,), FINISH_LENGTH, jnp.int32),
        experts_NTLk=experts_NTLk,
    )
    return _Slots(
        step=jnp.zeros((), jnp.int32),
        next_row=jnp.zeros((), jnp.int32),
        cache=cache,
        row_M=zeros_M,
        t_M=zeros_M,
        live_M=jnp.zeros((M,), bool),
        fresh_M=jnp.zeros((M,), bool),
        last_M=zeros_M,
        mask_MP=jnp.zeros((M, P), bool),
        matchers=loop.initial_matchers(jnp.zeros((M,), bool), cfg),
        out=out,
        live_steps=jnp.zeros((), jnp.int32),
    )


def _prefill_prompts(
    params: transformer.Params,
    prompt_NP: Array,
    prompt_lengths_N: Array,
    rng: Array,
    sp: SamplingParams,
    model_cfg: ModelConfig,
    cfg: SamplerConfig,
    dtype: jnp.dtype,
) -> _Prompts:
    """Prefills each group's prompt once, into a store of B rows and P slots (and, for an MoE
    model, the experts of each prompt's last position)."""
    N, P = prompt_NP.shape
    T, G = cfg.max_new_tokens, cfg.prompt_group
    mask_NP = loop.prompt_mask(prompt_NP, prompt_lengths_N)
    # The store is always stacked: a refill slices one prompt across all layers in one copy.
    store = decode.init_decode_cache(model_cfg, N // G, P, dtype, "scan")
    logits_BV, store, experts_BLk = decode.routed_prefill(
        params, prompt_NP[::G], mask_NP[::G], store, model_cfg
    )
    return _Prompts(
        store=store,
        logits_BV=logits_BV,
        experts_BLk=experts_BLk,
        mask_NP=mask_NP,
        lengths_N=prompt_lengths_N,
        in_think_N=loop.initial_in_think(prompt_NP, mask_NP, cfg),
        u_NT=row_uniforms(rng, N, T) if cfg.method == "sample" else jnp.ones((N, T)),
        sp=sp,
    )


def _generate_continuous(
    params: transformer.Params,
    prompt_NP: Array,
    prompt_lengths_N: Array,
    rng: Array,
    sp: SamplingParams,
    cache: KVCache | None,
    *,
    model_cfg: ModelConfig,
    cfg: SamplerConfig,
    num_slots: int,
) -> tuple[Rollout, RolloutStats, KVCache]:
    """Samples `cfg.max_new_tokens` tokens after each prompt with `num_slots` decode slots;
    jitted once, as `generate_continuous`.

    Args:
      params: the policy weights (any sharding; rows of the inputs may be sharded).
      prompt_NP: left-padded prompt ids (see `bucket_and_pad`).
      prompt_lengths_N: real tokens per row, at least 1.
      rng: a PRNG key; row n draws from fold_in(rng, n), as in `loop.generate`.
      sp: per-row `SamplingParams`.
      cache: a cache of `num_slots` rows, `init_decode_cache(model_cfg, cfg, num_slots, P)`
        (donated, returned for reuse), or None to allocate one inside the program.
      model_cfg: the architecture (static).
      cfg: the `SamplerConfig` (static).
      num_slots: M, the decode slots, in [1, N] (static: it sets the cache's shape).

    Returns:
      (Rollout in row order, RolloutStats, KVCache). Equal to `loop.generate`'s rollout for the
      same inputs; the same shapes and static settings never compile again.

    Raises:
      ValueError: for a slot count outside [1, N], a cache of the wrong shape, or sampling
        values or a prompt group that do not fit the rows.
    """
    N, P = prompt_NP.shape
    T, M = cfg.max_new_tokens, num_slots
    check_num_slots(M, N)
    if cache is None:
        cache = loop.init_decode_cache(model_cfg, cfg, M, P)
    loop.check_cache(cache, M, P, model_cfg, cfg)
    loop.check_rows(sp, N, cfg)
    prompt_NP = prompt_NP.astype(jnp.int32)
    prompt_lengths_N = prompt_lengths_N.astype(jnp.int32)
    pr = _prefill_prompts(params, prompt_NP, prompt_lengths_N, rng, sp, model_cfg, cfg, cache.dtype)
    windows = decode.attention_windows(P, loop.num_cache_slots(P, cfg), cfg.attention_chunk)
    layers = decode.unstack_layers(params) if cache.unrolled else None
    # RoPE of every position a fed token can take, built once (see `decode`: built in the step,
    # XLA would recompute the trigonometry in every layer); each step gathers its M rows.
    cos, sin = transformer.rope_tables(jnp.arange(P + T)[None], model_cfg, jnp.float32)
    rope_table = (cos[0], sin[0])

    def first_logits(s: _Slots) -> Array:
        return pr.logits_BV[s.row_M // cfg.prompt_group]

    def first_experts(s: _Slots) -> Array | None:
        return None if pr.experts_BLk is None else pr.experts_BLk[s.row_M // cfg.prompt_group]

    def body(s: _Slots) -> _Slots:
        s = _refill(s, pr, cfg)
        logits_MV, cache, experts_MLk = _decode(
            s, params, layers, pr, rope_table, model_cfg, windows
        )
        logits_MV = jnp.where(s.fresh_M[:, None], first_logits(s), logits_MV)
        if experts_MLk is not None:
            experts_MLk = jnp.where(s.fresh_M[:, None, None], first_experts(s), experts_MLk)
        s = dataclasses.replace(s, step=s.step + 1, cache=cache)
        return _emit(s, logits_MV, pr, cfg, experts_MLk)

    s = _refill(_initial_slots(cache, pr, cfg), pr, cfg)
    # Every row's first token needs no decode step.
    s = _emit(s, first_logits(s), pr, cfg, first_experts(s))
    s = jax.lax.while_loop(lambda s: jnp.any(s.live_M) | (s.next_row < N), body, s)
    rollout = dataclasses.replace(
        s.out, prompt_NP=prompt_NP, lengths_N=jnp.sum(s.out.mask_NT, axis=1, dtype=jnp.int32)
    )
    stats = RolloutStats(
        decode_steps=s.step, live_slot_steps=s.live_steps, total_slot_steps=M * (s.step + 1)
    )
    return rollout, stats, s.cache


generate_continuous = jax.jit(
    _generate_continuous,
    static_argnames=("model_cfg", "cfg", "num_slots"),
    donate_argnames=("cache",),
)


def sample_continuous(
    params: transformer.Params,
    prompt_NP: np.ndarray | Array,
    prompt_lengths_N: np.ndarray | Array,
    rng: Array,
    model_cfg: ModelConfig,
    cfg: SamplerConfig,
    num_slots: int,
    sp: SamplingParams | None = None,
) -> tuple[Rollout, RolloutStats]:
    """`generate_continuous` with `loop.sample`'s checks of host inputs and defaults.

    Raises:
      ValueError: as `loop.sample`, and for a slot count outside [1, N].
    """
    loop.check_prompts(prompt_NP, prompt_lengths_N, model_cfg, cfg)
    N = prompt_NP.shape[0]
    check_num_slots(num_slots, N)
    if sp is None:
        sp = sampling_params(N)
    args = (params, prompt_NP, prompt_lengths_N, rng, sp, None)
    rollout, stats, _ = generate_continuous(
        *args, model_cfg=model_cfg, cfg=cfg, num_slots=num_slots
    )
    return rollout, stats


# ---------------------------------------------------------------------------------------------
# Host side: the static loop's stats, and a summary of either


def static_stats(lengths_N: np.ndarray) -> RolloutStats:
    """The stats of `loop.generate`'s rollout, from its lengths: N slots, one per row, until the
    longest row ends (its loop runs max(lengths) - 1 decode steps after the first token)."""
    lengths_N = np.asarray(lengths_N)
    steps = int(lengths_N.max()) - 1
    return RolloutStats(
        decode_steps=np.int32(steps),
        live_slot_steps=np.int32(lengths_N.sum()),
        total_slot_steps=np.int32(lengths_N.size * (steps + 1)),
    )


def summarize(stats: RolloutStats, lengths_N: np.ndarray) -> dict[str, float]:
    """Host metrics of one rollout: slot utilisation (live / total slot-steps), decode steps,
    answer length p50 / p95 / max, and batch imbalance (max length / mean length)."""
    stats, lengths_N = jax.device_get((stats, lengths_N))
    lengths_N = np.asarray(lengths_N, np.float64)
    return {
        "slot_utilisation": float(stats.live_slot_steps) / float(stats.total_slot_steps),
        "decode_steps": float(stats.decode_steps),
        "length_p50": float(np.percentile(lengths_N, 50)),
        "length_p95": float(np.percentile(lengths_N, 95)),
        "length_max": float(lengths_N.max()),
        "batch_imbalance": float(lengths_N.max() / lengths_N.mean()),
    }
