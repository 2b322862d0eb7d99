"""KV-cache sampler: prefill, then one jitted `lax.while_loop` of one-token decode steps.

The sampler runs on whatever mesh its inputs live on (rows sharded over the data axes, parameters
as the trainer holds them), from the same parameter buffers the optimizer updates.

* Static settings (`SamplerConfig`: length, method, top-k, stop ids and sequences, think budget) are
  a hashable static argument; per-call values (`SamplingParams`: temperature, top-p, min-p, one
  value per row) and the rng are arrays, so new values never recompile.
* Prefill runs `transformer.hidden_states` over the left-padded prompts; decode runs the one-token
  step of `rlvr_jax.decode` (a layer scan on accelerators, an unrolled layer loop on CPU) inside
  one `lax.while_loop` that stops when every row is done. The cache is donated and returned.
* Each row draws from its own stream, `fold_in(rng, row)`, so a row's samples do not depend on
  the other rows of the batch or on how the batch is sharded.
* The log-prob returned for a sampled token is its log-probability under the distribution it was
  drawn from: logits / temperature, truncated by top-k, then top-p, then min-p, renormalised.

Shapes: N rows (B prompts x G samples), P prompt bucket, T = max_new_tokens, S cache slots, V vocab,
L layers, K kv heads, G' = H / K query heads per kv head, Dh head dim, W matched-token window.
"""

# Dataclass fields carry their shapes (tokens_NT), which N815 would read as mixedCase.
# ruff: noqa: N815

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax import decode
from rlvr_jax.decode import DecodeCache
from rlvr_jax.model import transformer
from rlvr_jax.model.config import ModelConfig

Array = jax.Array

FINISH_LENGTH = 0  # ran to max_new_tokens
FINISH_EOS = 1  # sampled one of `eos_ids`
FINISH_STOP = 2  # completed one of `stop_sequences`
FINISH_NAMES = ("length", "eos", "stop")
METHODS = ("sample", "greedy")

# The blocks of the two-level inverse-CDF draw (see `_draw`) are a multiple of this wide.
_DRAW_BLOCK = 128


def _int_tuple(name: str, value: Sequence[int]) -> tuple[int, ...]:
    out = tuple(int(v) for v in value)
    if any(v < 0 for v in out):
        raise ValueError(f"{name}={out} holds a negative token id")
    return out


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """Static sampler settings; a change compiles a new program.

    Attributes:
      max_new_tokens: T, the fixed number of generated columns.
      method: "sample" (temperature, top-k, top-p, min-p) or "greedy" (argmax).
      top_k: keep the k largest logits before top-p and min-p; 0 keeps all. Static because it
        sets a shape; a small k also makes top-p cheap (it then works on k sorted values).
      eos_ids: a sampled token among these ends its row (finish reason "eos").
      stop_sequences: token sequences that end a row once its generated tokens end with one of
        them (finish reason "stop"); the sequence stays in the output. A stop string must be given
        as the token sequence(s) it is generated as.
      pad_id: written after a row's end.
      think_open: the token sequence that opens a thinking block (Qwen3: `<think>`).
      think_close: the sequence that closes it (Qwen3: `</think>`).
      think_budget: after this many tokens inside an open thinking block, `think_stop` is
        injected; 0 disables the budget.
      think_stop: the injected early-stop text, which must end with `think_close`.
      attention_chunk: decode attention reads the filled cache prefix rounded up to a multiple
        of this many slots past the prompt; 0 reads the whole cache.
      layer_loop: "scan", "unroll" or "auto" (unroll on CPU); see `rlvr_jax.decode`.
      cache_dtype: dtype of the KV cache; None means the model's compute dtype.
      prompt_group: rows come in groups of this many copies of one prompt
        (`bucket_and_pad(..., group_size)`): each group's prompt is prefilled once and its
        keys/values copied to the group's rows. 1 prefills every row.
    """

    max_new_tokens: int
    method: str = "sample"
    top_k: int = 0
    eos_ids: tuple[int, ...] = ()
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    pad_id: int = 0
    think_open: tuple[int, ...] = ()
    think_close: tuple[int, ...] = ()
    think_budget: int = 0
    think_stop: tuple[int, ...] = ()
    attention_chunk: int = 32
    layer_loop: str = "auto"
    cache_dtype: str | None = None
    prompt_group: int = 1

    def __post_init__(self):
        setf = functools.partial(object.__setattr__, self)
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be at least 1")
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r}; expected one of {METHODS}")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 keeps every token)")
        if self.pad_id < 0:
            raise ValueError(f"pad_id={self.pad_id} must be a token id (>= 0)")
        if self.attention_chunk < 0:
            raise ValueError(f"attention_chunk={self.attention_chunk} must be >= 0")
        if self.layer_loop not in decode.LAYER_LOOPS:
            raise ValueError(
                f"layer_loop={self.layer_loop!r}; expected one of {decode.LAYER_LOOPS}"
            )
        if self.prompt_group < 1:
            raise ValueError(f"prompt_group={self.prompt_group} must be at least 1")
        if self.think_budget < 0:
            raise ValueError(f"think_budget={self.think_budget} must be >= 0 (0 disables it)")
        setf("eos_ids", _int_tuple("eos_ids", self.eos_ids))
        seqs = tuple(_int_tuple("stop_sequences", s) for s in self.stop_sequences)
        if any(not s for s in seqs):
            raise ValueError(f"stop_sequences={seqs} holds an empty sequence")
        setf("stop_sequences", seqs)
        for name in ("think_open", "think_close", "think_stop"):
            setf(name, _int_tuple(name, getattr(self, name)))
        if self.think_budget:
            if not (self.think_open and self.think_close and self.think_stop):
                raise ValueError(
                    f"think_budget={self.think_budget} needs think_open, think_close and "
                    f"think_stop; got {self.think_open}, {self.think_close}, {self.think_stop}"
                )
            if self.think_open == self.think_close:
                raise ValueError(f"think_open and think_close are both {self.think_open}")
            n = len(self.think_close)
            if self.think_stop[-n:] != self.think_close:
                raise ValueError(
                    f"think_stop={self.think_stop} must end with think_close={self.think_close} "
                    "so that the injected text closes the thinking block"
                )

    @property
    def match_window(self) -> int:
        """W: how many trailing tokens the stop and think matchers look at."""
        seqs = (*self.stop_sequences, self.think_open, self.think_close)
        return max([1, *(len(s) for s in seqs)])


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-call, per-row sampling values; build them with `sampling_params`."""

    temperature_N: Array  # (N,) f32 > 0; ignored by greedy
    top_p_N: Array  # (N,) f32 in (0, 1]; 1 disables
    min_p_N: Array  # (N,) f32 in [0, 1); 0 disables


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Rollout:
    """Prompts and what was generated for them.

    `mask_NT` marks every generated token (sampled or injected); the policy loss should use
    `mask_NT & ~injected_NT`. `logp_NT` is 0 where a token was not sampled.
    """

    prompt_NP: Array  # (N, P) int32, left-padded
    prompt_lengths_N: Array  # (N,) int32
    tokens_NT: Array  # (N, T) int32, pad_id after a row's end
    logp_NT: Array  # (N, T) f32
    mask_NT: Array  # (N, T) bool
    injected_NT: Array  # (N, T) bool: forced by the think budget
    lengths_N: Array  # (N,) int32 generated tokens, stop tokens included
    finish_N: Array  # (N,) int32 FINISH_LENGTH / FINISH_EOS / FINISH_STOP


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _State:
    """The decode loop's carry. `step` tokens have been emitted; `last_N` is fed next."""

    step: Array  # () int32
    cache: DecodeCache
    u_NT: Array  # (N, T) f32 in (0, 1]: the uniform each row draws its token t with
    last_N: Array  # (N,) int32
    done_N: Array  # (N,) bool
    finish_N: Array  # (N,) int32
    tokens_NT: Array
    logp_NT: Array
    mask_NT: Array
    injected_NT: Array
    history_NW: Array  # (N, W) int32, last W emitted tokens, -1 before the first
    in_think_N: Array  # (N,) bool
    think_count_N: Array  # (N,) int32 tokens emitted since the block opened
    inject_pos_N: Array  # (N,) int32 next index into think_stop; 0 when not injecting


# ---------------------------------------------------------------------------------------------
# Host helpers


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


def sampling_params(
    num_rows: int,
    temperature: float | Sequence[float] = 1.0,
    top_p: float | Sequence[float] = 1.0,
    min_p: float | Sequence[float] = 0.0,
) -> SamplingParams:
    """Validated per-row sampling values; scalars are broadcast to all `num_rows` rows.

    Raises:
      ValueError: naming the first value outside its range: temperature must be > 0 and finite,
        top_p in (0, 1], min_p in [0, 1).
    """

    def rows(name: str, value, ok, rule: str) -> np.ndarray:
        arr = np.asarray(value, np.float32)
        if arr.ndim > 1 or (arr.ndim == 1 and arr.shape[0] != num_rows):
            raise ValueError(f"{name} has shape {arr.shape}; expected a scalar or ({num_rows},)")
        arr = np.broadcast_to(arr, (num_rows,))
        bad = ~ok(arr)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"{name}={float(arr[i])!r} (row {i}) is outside {rule}")
        return arr

    with np.errstate(invalid="ignore"):
        t = rows("temperature", temperature, lambda a: (a > 0) & np.isfinite(a), "(0, inf)")
        p = rows("top_p", top_p, lambda a: (a > 0) & (a <= 1), "(0, 1]")
        m = rows("min_p", min_p, lambda a: (a >= 0) & (a < 1), "[0, 1)")
    return SamplingParams(jnp.asarray(t), jnp.asarray(p), jnp.asarray(m))


def completions(rollout: Rollout) -> list[list[int]]:
    """The generated tokens of each row, up to and including its stop token (host lists)."""
    tokens, lengths = jax.device_get((rollout.tokens_NT, rollout.lengths_N))
    return [tokens[i, : lengths[i]].tolist() for i in range(tokens.shape[0])]


def num_cache_slots(prompt_len: int, cfg: SamplerConfig) -> int:
    """S: the prompt plus every generated token but the last, which is never fed back."""
    return prompt_len + cfg.max_new_tokens - 1


def init_decode_cache(
    model_cfg: ModelConfig, cfg: SamplerConfig, num_rows: int, prompt_len: int
) -> DecodeCache:
    """A zeroed cache for `num_rows` rows of prompt bucket `prompt_len`, to pass (donated) to
    `generate` and get back for the next call with the same shapes."""
    dtype = cfg.cache_dtype or model_cfg.dtype
    S = num_cache_slots(prompt_len, cfg)
    return decode.init_decode_cache(model_cfg, num_rows, S, dtype, cfg.layer_loop)


# ---------------------------------------------------------------------------------------------
# Token choice


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


# ---------------------------------------------------------------------------------------------
# Stops and the think budget


def _ends_with(history_NW: Array, seq: tuple[int, ...]) -> Array:
    """Rows whose emitted tokens end with `seq` (history holds -1 before the first token)."""
    return jnp.all(history_NW[:, -len(seq) :] == jnp.asarray(seq, jnp.int32), axis=-1)


def _prompt_in_think(prompt_NP: Array, prompt_mask_NP: Array, cfg: SamplerConfig) -> Array:
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


def _emit(s: _State, logits_NV: Array, sp: SamplingParams, cfg: SamplerConfig) -> _State:
    """Chooses, records and matches one token per row."""
    t = s.step
    u_N = jax.lax.dynamic_index_in_dim(s.u_NT, t, axis=1, keepdims=False)
    tok, logp = choose_tokens(logits_NV, sp, u_N, cfg)
    active = ~s.done_N
    in_think, count, inject_pos = s.in_think_N, s.think_count_N, s.inject_pos_N
    if cfg.think_budget:
        injecting = (in_think & (count >= cfg.think_budget)) | (inject_pos > 0)
        injecting &= active
        forced = jnp.asarray(cfg.think_stop, jnp.int32)[inject_pos]
        tok = jnp.where(injecting, forced, tok)
        logp = jnp.where(injecting, 0.0, logp)
        inject_pos = jnp.where(injecting, inject_pos + 1, 0)
        inject_pos = jnp.where(inject_pos >= len(cfg.think_stop), 0, inject_pos)
    else:
        injecting = jnp.zeros_like(active)
    tok = jnp.where(active, tok, cfg.pad_id)
    logp = jnp.where(active, logp, 0.0)
    history = jnp.concatenate([s.history_NW[:, 1:], tok[:, None]], axis=1)
    # Stops fire on sampled tokens only: injected text is ours, not the model's.
    chose = active & ~injecting
    eos = chose & jnp.isin(tok, jnp.asarray(cfg.eos_ids or (-1,), jnp.int32))
    stop = jnp.zeros_like(chose)
    for seq in cfg.stop_sequences:
        stop |= chose & _ends_with(history, seq)
    stop &= ~eos
    if cfg.think_budget:
        opened = active & _ends_with(history, cfg.think_open)
        closed = active & _ends_with(history, cfg.think_close)
        count = jnp.where(opened, 0, jnp.where(in_think & active, count + 1, count))
        in_think = (in_think | opened) & ~closed
    put = lambda buf, col: jax.lax.dynamic_update_slice(buf, col[:, None], (0, t))
    return dataclasses.replace(
        s,
        step=t + 1,
        last_N=tok,
        done_N=s.done_N | eos | stop,
        finish_N=jnp.where(eos, FINISH_EOS, jnp.where(stop, FINISH_STOP, s.finish_N)),
        tokens_NT=put(s.tokens_NT, tok),
        logp_NT=put(s.logp_NT, logp.astype(jnp.float32)),
        mask_NT=put(s.mask_NT, active),
        injected_NT=put(s.injected_NT, injecting),
        history_NW=history,
        in_think_N=in_think,
        think_count_N=count,
        inject_pos_N=inject_pos,
    )


# ---------------------------------------------------------------------------------------------
# The program


def _generate(
    params: transformer.Params,
    prompt_NP: Array,
    prompt_lengths_N: Array,
    rng: Array,
    sp: SamplingParams,
    cache: DecodeCache | None,
    *,
    model_cfg: ModelConfig,
    cfg: SamplerConfig,
) -> tuple[Rollout, DecodeCache]:
    """Samples `cfg.max_new_tokens` tokens after each prompt; jitted once, here.

    Args:
      params: the policy weights (any sharding; rows of the inputs may be sharded over the mesh).
      prompt_NP: left-padded prompt ids (see `bucket_and_pad`).
      prompt_lengths_N: real tokens per row, at least 1.
      rng: a PRNG key; row i draws from fold_in(rng, i) (see `row_uniforms`).
      sp: per-row `SamplingParams`.
      cache: a `DecodeCache` from `init_decode_cache` (donated, returned for reuse), or None to
        allocate one inside the program.
      model_cfg: the architecture (static).
      cfg: the `SamplerConfig` (static).

    Returns:
      (Rollout, DecodeCache). The same shapes and static settings never compile again.
    """
    N, P = prompt_NP.shape
    T = cfg.max_new_tokens
    expected = jax.eval_shape(lambda: init_decode_cache(model_cfg, cfg, N, P))
    if cache is None:
        cache = init_decode_cache(model_cfg, cfg, N, P)
    else:
        describe = lambda c: jax.tree.map(lambda a: (a.shape, str(a.dtype)), c)
        if describe(cache) != describe(expected):
            got, want = (
                jax.tree.leaves(describe(cache))[:2],
                jax.tree.leaves(describe(expected))[:2],
            )
            raise ValueError(
                f"cache leaves start {got}; {N} rows of bucket {P} with layer_loop="
                f"{cfg.layer_loop!r} need {want} (see init_decode_cache)"
            )
    if N % cfg.prompt_group:
        raise ValueError(f"{N} rows do not split into groups of prompt_group={cfg.prompt_group}")
    for field in dataclasses.fields(sp):
        name, x = field.name, getattr(sp, field.name)
        if x.shape != (N,):
            raise ValueError(f"SamplingParams.{name} has shape {x.shape}; expected ({N},)")
    prompt_NP = prompt_NP.astype(jnp.int32)
    prompt_lengths_N = prompt_lengths_N.astype(jnp.int32)
    prompt_mask_NP = jnp.arange(P)[None, :] >= (P - prompt_lengths_N)[:, None]

    logits_NV, cache = decode.prefill(
        params, prompt_NP, prompt_mask_NP, cache, model_cfg, cfg.prompt_group
    )
    if cfg.think_budget:
        in_think = _prompt_in_think(prompt_NP, prompt_mask_NP, cfg)
    else:
        in_think = jnp.zeros((N,), bool)
    zeros_N = jnp.zeros((N,), jnp.int32)
    state = _State(
        step=jnp.zeros((), jnp.int32),
        cache=cache,
        u_NT=row_uniforms(rng, N, T) if cfg.method == "sample" else jnp.ones((N, T)),
        last_N=zeros_N,
        done_N=jnp.zeros((N,), bool),
        finish_N=jnp.full((N,), FINISH_LENGTH, jnp.int32),
        tokens_NT=jnp.full((N, T), cfg.pad_id, jnp.int32),
        logp_NT=jnp.zeros((N, T), jnp.float32),
        mask_NT=jnp.zeros((N, T), bool),
        injected_NT=jnp.zeros((N, T), bool),
        history_NW=jnp.full((N, cfg.match_window), -1, jnp.int32),
        in_think_N=in_think,
        think_count_N=zeros_N,
        inject_pos_N=zeros_N,
    )
    state = _emit(state, logits_NV, sp, cfg)
    windows = decode.attention_windows(P, num_cache_slots(P, cfg), cfg.attention_chunk)
    layers = decode.unstack_layers(params) if cache.unrolled else None
    # RoPE of every fed token, built once: the token fed at step t sits at position len + t - 1.
    positions_TN = prompt_lengths_N[None, :] + jnp.arange(T)[:, None]
    cos_TNh, sin_TNh = transformer.rope_tables(positions_TN, model_cfg, jnp.float32)

    def body(s: _State) -> _State:
        fed = s.step - 1  # index of the token fed now
        row = lambda table: jax.lax.dynamic_index_in_dim(table, fed, keepdims=False)
        logits, cache = decode.decode_step(
            params,
            layers,
            s.cache,
            s.last_N,
            (row(cos_TNh), row(sin_TNh)),
            prompt_mask_NP,
            P + fed,
            model_cfg,
            windows,
        )
        return _emit(dataclasses.replace(s, cache=cache), logits, sp, cfg)

    state = jax.lax.while_loop(lambda s: (s.step < T) & ~jnp.all(s.done_N), body, state)
    rollout = Rollout(
        prompt_NP=prompt_NP,
        prompt_lengths_N=prompt_lengths_N,
        tokens_NT=state.tokens_NT,
        logp_NT=state.logp_NT,
        mask_NT=state.mask_NT,
        injected_NT=state.injected_NT,
        lengths_N=jnp.sum(state.mask_NT, axis=1, dtype=jnp.int32),
        finish_N=state.finish_N,
    )
    return rollout, state.cache


generate = jax.jit(_generate, static_argnames=("model_cfg", "cfg"), donate_argnames=("cache",))


def sample(
    params: transformer.Params,
    prompt_NP: np.ndarray | Array,
    prompt_lengths_N: np.ndarray | Array,
    rng: Array,
    model_cfg: ModelConfig,
    cfg: SamplerConfig,
    sp: SamplingParams | None = None,
) -> Rollout:
    """`generate` with checks of host inputs and default sampling values (temperature 1).

    Raises:
      ValueError: for misshapen prompts, lengths outside [1, P], token ids outside the vocab,
        or (with `cfg.prompt_group` > 1) a group whose rows hold different prompts.
    """
    if prompt_NP.ndim != 2 or prompt_lengths_N.shape != prompt_NP.shape[:1]:
        raise ValueError(
            f"prompt_NP {prompt_NP.shape} and prompt_lengths_N {prompt_lengths_N.shape} must be "
            "(N, P) and (N,)"
        )
    N, P = prompt_NP.shape
    if isinstance(prompt_NP, np.ndarray) and isinstance(prompt_lengths_N, np.ndarray):
        bad = np.flatnonzero((prompt_lengths_N < 1) | (prompt_lengths_N > P))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"prompt_lengths_N[{i}]={prompt_lengths_N[i]} is outside [1, {P}]")
        real = np.arange(P)[None, :] >= (P - prompt_lengths_N)[:, None]
        ids = np.where(real, prompt_NP, 0)
        if ids.min() < 0 or ids.max() >= model_cfg.vocab_size:
            i, j = np.argwhere((ids < 0) | (ids >= model_cfg.vocab_size))[0]
            raise ValueError(
                f"prompt_NP[{i}, {j}]={prompt_NP[i, j]} is not a token id of a vocabulary of "
                f"{model_cfg.vocab_size}"
            )
        G = cfg.prompt_group
        if G > 1 and N % G == 0:
            first = np.repeat(ids[::G], G, axis=0), np.repeat(prompt_lengths_N[::G], G)
            differs = (ids != first[0]).any(axis=1) | (prompt_lengths_N != first[1])
            if differs.any():
                i = int(np.argmax(differs))
                raise ValueError(
                    f"row {i}'s prompt differs from row {i - i % G}'s, but prompt_group={G} "
                    "prefills one prompt per group of rows"
                )
    if sp is None:
        sp = sampling_params(N)
    rollout, _ = generate(
        params, prompt_NP, prompt_lengths_N, rng, sp, None, model_cfg=model_cfg, cfg=cfg
    )
    return rollout
