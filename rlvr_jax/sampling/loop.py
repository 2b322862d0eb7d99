"""The sampling program: prefill, then one jitted `lax.while_loop` of one-token decode steps.

The sampler runs on whatever mesh its inputs live on (rows sharded over the data axes, parameters
as the trainer holds them), from the same parameter buffers the optimizer updates.

* Prefill runs `transformer.hidden_states` over the left-padded prompts; decode runs the one-token
  step of `rlvr_jax.model.decode` (a layer scan on accelerators, an unrolled layer loop on CPU)
  inside one `lax.while_loop` that stops when every row is done. The cache is donated and
  returned, so a caller that keeps it allocates it once.
* Each step chooses a token per row (`choice`), may replace it by the think budget's injected
  text, and matches the end ids and stop sequences (`stops`); a row that ended emits `pad_id`.
* The same shapes and static settings never compile again: per-call values, the rng included,
  are arrays.
* The emission (`choose_and_match`), the matchers' state and the checks are shared with the
  continuous-batching loop (`continuous`), so both give a row the same tokens.
* For a mixture-of-experts model it records the experts of the position each token was sampled
  from, in every layer (`Rollout.experts_NTLk`: the prefill's last prompt position, then each
  decode step's fed token), for the update's `moe/routing_disagreement`; the continuous loop
  records the same.

Shapes: N rows (B prompts x G samples), P prompt bucket, T = max_new_tokens, S cache slots, V vocab,
W matched-token window.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.model import decode, transformer
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.kv_cache import KVCache
from rlvr_jax.sampling import stops
from rlvr_jax.sampling.choice import choose_tokens, row_uniforms
from rlvr_jax.sampling.config import SamplerConfig, SamplingParams, sampling_params
from rlvr_jax.types import FINISH_EOS, FINISH_LENGTH, FINISH_STOP, Rollout

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Matchers:
    """Each row's state for the stop and think matchers (`stops`), carried from token to token."""

    history_NW: Array  # (N, W) int32, last W emitted tokens, -1 before the first
    in_think_N: Array  # (N,) bool
    think_count_N: Array  # (N,) int32 tokens emitted since the block opened
    inject_pos_N: Array  # (N,) int32 next index into think_stop; 0 when not injecting


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _State:
    """The decode loop's carry. `step` tokens have been emitted; `last_N` is fed next."""

    step: Array  # () int32
    cache: KVCache
    u_NT: Array  # (N, T) f32 in (0, 1]: the uniform each row draws its token t with
    last_N: Array  # (N,) int32
    done_N: Array  # (N,) bool
    finish_N: Array  # (N,) int32
    tokens_NT: Array
    logp_NT: Array
    mask_NT: Array
    injected_NT: Array
    matchers: Matchers
    # An MoE model's experts of the position that predicted each token, in every layer (None
    # for a dense model): what the update's forward of the same tokens should route alike.
    experts_NTLk: Array | None = None


def num_cache_slots(prompt_len: int, cfg: SamplerConfig) -> int:
    """S: the prompt plus every generated token but the last, which is never fed back."""
    return prompt_len + cfg.max_new_tokens - 1


def init_decode_cache(
    model_cfg: ModelConfig, cfg: SamplerConfig, num_rows: int, prompt_len: int
) -> KVCache:
    """A zeroed cache for `num_rows` rows of prompt bucket `prompt_len`, to pass (donated) to
    `generate` and get back for the next call with the same shapes."""
    dtype = cfg.cache_dtype or model_cfg.dtype
    S = num_cache_slots(prompt_len, cfg)
    return decode.init_decode_cache(model_cfg, num_rows, S, dtype, cfg.layer_loop)


def prompt_mask(prompt_NP: Array, prompt_lengths_N: Array) -> Array:
    """(N, P) bool: which slots of the left-padded prompts hold real tokens."""
    P = prompt_NP.shape[1]
    return jnp.arange(P)[None, :] >= (P - prompt_lengths_N)[:, None]


def initial_in_think(prompt_NP: Array, prompt_mask_NP: Array, cfg: SamplerConfig) -> Array:
    """(N,) bool: rows whose prompt leaves a thinking block open (all False without a budget)."""
    if cfg.think_budget:
        return stops.prompt_in_think(prompt_NP, prompt_mask_NP, cfg)
    return jnp.zeros(prompt_NP.shape[:1], bool)


def initial_matchers(in_think_N: Array, cfg: SamplerConfig) -> Matchers:
    """The matchers of rows that have emitted nothing yet."""
    zeros_N = jnp.zeros(in_think_N.shape, jnp.int32)
    history_NW = jnp.full((*in_think_N.shape, cfg.match_window), -1, jnp.int32)
    return Matchers(history_NW, in_think_N, zeros_N, zeros_N)


def choose_and_match(
    logits_NV: Array,
    u_N: Array,
    active_N: Array,
    sp: SamplingParams,
    m: Matchers,
    cfg: SamplerConfig,
) -> tuple[Array, Array, Array, Array, Array, Matchers]:
    """Chooses one token per row, applies the think budget and matches the end ids and stops.

    Both decode loops emit through this function, so a row's tokens do not depend on the loop.

    Args:
      logits_NV: f32 logits of each row's next token.
      u_N: each row's uniform for this token (`row_uniforms`).
      active_N: rows still generating; the others emit `pad_id` with log-prob 0.
      sp: per-row sampling values.
      m: the rows' matchers before this token.
      cfg: the sampler settings.

    Returns:
      (tok_N, logp_N f32, injected_N, eos_N, stop_N, matchers after this token).
    """
    tok, logp = choose_tokens(logits_NV, sp, u_N, cfg)
    tok, logp, injecting, inject_pos = stops.inject_think_stop(
        tok, logp, active_N, m.in_think_N, m.think_count_N, m.inject_pos_N, cfg
    )
    tok = jnp.where(active_N, tok, cfg.pad_id)
    logp = jnp.where(active_N, logp, 0.0)
    history = jnp.concatenate([m.history_NW[:, 1:], tok[:, None]], axis=1)
    eos, stop = stops.ended(history, tok, active_N & ~injecting, cfg)
    in_think, count = stops.track_think(history, active_N, m.in_think_N, m.think_count_N, cfg)
    matchers = Matchers(history, in_think, count, inject_pos)
    return tok, logp.astype(jnp.float32), injecting, eos, stop, matchers


def _emit(
    s: _State,
    logits_NV: Array,
    sp: SamplingParams,
    cfg: SamplerConfig,
    experts_NLk: Array | None = None,
) -> _State:
    """Chooses, records and matches one token per row; records `experts_NLk`, the experts of
    the position whose logits these are (an MoE model's), with it."""
    t = s.step
    u_N = jax.lax.dynamic_index_in_dim(s.u_NT, t, axis=1, keepdims=False)
    active = ~s.done_N
    tok, logp, injecting, eos, stop, matchers = choose_and_match(
        logits_NV, u_N, active, sp, s.matchers, cfg
    )
    put = lambda buf, col: jax.lax.dynamic_update_slice(buf, col[:, None], (0, t))
    return dataclasses.replace(
        s,
        step=t + 1,
        last_N=tok,
        done_N=s.done_N | eos | stop,
        finish_N=jnp.where(eos, FINISH_EOS, jnp.where(stop, FINISH_STOP, s.finish_N)),
        tokens_NT=put(s.tokens_NT, tok),
        logp_NT=put(s.logp_NT, logp),
        mask_NT=put(s.mask_NT, active),
        injected_NT=put(s.injected_NT, injecting),
        matchers=matchers,
        experts_NTLk=_put_experts(s.experts_NTLk, experts_NLk, t),
    )


def _put_experts(experts_NTLk: Array | None, experts_NLk: Array | None, t: Array) -> Array | None:
    """`experts_NTLk` with column t set to `experts_NLk` (None stays None: a dense model)."""
    if experts_NTLk is None:
        return None
    return jax.lax.dynamic_update_slice(experts_NTLk, experts_NLk[:, None], (0, t, 0, 0))


def check_cache(
    cache: KVCache, num_rows: int, P: int, model_cfg: ModelConfig, cfg: SamplerConfig
) -> None:
    """Raises ValueError for a cache that is not `init_decode_cache(..., num_rows, P)`'s."""
    expected = jax.eval_shape(lambda: init_decode_cache(model_cfg, cfg, num_rows, P))
    describe = lambda c: jax.tree.map(lambda a: (a.shape, str(a.dtype)), c)
    if describe(cache) != describe(expected):
        got, want = (
            jax.tree.leaves(describe(cache))[:2],
            jax.tree.leaves(describe(expected))[:2],
        )
        raise ValueError(
            f"cache leaves start {got}; {num_rows} rows of bucket {P} with layer_loop="
            f"{cfg.layer_loop!r} need {want} (see init_decode_cache)"
        )


def check_rows(sp: SamplingParams, N: int, cfg: SamplerConfig) -> None:
    """Raises ValueError for a prompt group or sampling values that do not fit N rows."""
    if N % cfg.prompt_group:
        raise ValueError(f"{N} rows do not split into groups of prompt_group={cfg.prompt_group}")
    for field in dataclasses.fields(sp):
        name, x = field.name, getattr(sp, field.name)
        if x.shape != (N,):
            raise ValueError(f"SamplingParams.{name} has shape {x.shape}; expected ({N},)")


def _initial_state(
    cache: KVCache,
    prompt_NP: Array,
    prompt_mask_NP: Array,
    rng: Array,
    cfg: SamplerConfig,
    model_cfg: ModelConfig | None = None,
) -> _State:
    """The carry before the first token: nothing emitted, each row's uniforms drawn (and,
    for an MoE `model_cfg`, room for the experts of every token)."""
    N = prompt_NP.shape[0]
    T = cfg.max_new_tokens
    experts_NTLk = None
    if model_cfg is not None and model_cfg.is_moe:
        shape = (N, T, model_cfg.num_layers, model_cfg.num_experts_per_tok)
        experts_NTLk = jnp.zeros(shape, jnp.int32)
    return _State(
        step=jnp.zeros((), jnp.int32),
        cache=cache,
        u_NT=row_uniforms(rng, N, T) if cfg.method == "sample" else jnp.ones((N, T)),
        last_N=jnp.zeros((N,), jnp.int32),
        done_N=jnp.zeros((N,), bool),
        finish_N=jnp.full((N,), FINISH_LENGTH, jnp.int32),
        tokens_NT=jnp.full((N, T), cfg.pad_id, jnp.int32),
        logp_NT=jnp.zeros((N, T), jnp.float32),
        mask_NT=jnp.zeros((N, T), bool),
        injected_NT=jnp.zeros((N, T), bool),
        matchers=initial_matchers(initial_in_think(prompt_NP, prompt_mask_NP, cfg), cfg),
        experts_NTLk=experts_NTLk,
    )


def _generate(
    params: transformer.Params,
    prompt_NP: Array,
    prompt_lengths_N: Array,
    rng: Array,
    sp: SamplingParams,
    cache: KVCache | None,
    *,
    model_cfg: ModelConfig,
    cfg: SamplerConfig,
) -> tuple[Rollout, KVCache]:
    """Samples `cfg.max_new_tokens` tokens after each prompt; jitted once, as `generate`.

    Args:
      params: the policy weights (any sharding; rows of the inputs may be sharded over the mesh).
      prompt_NP: left-padded prompt ids (see `bucket_and_pad`).
      prompt_lengths_N: real tokens per row, at least 1.
      rng: a PRNG key; row i draws from fold_in(rng, i) (see `row_uniforms`).
      sp: per-row `SamplingParams`.
      cache: a `KVCache` from `init_decode_cache` (donated, returned for reuse), or None to
        allocate one inside the program.
      model_cfg: the architecture (static).
      cfg: the `SamplerConfig` (static).

    Returns:
      (Rollout, KVCache). The same shapes and static settings never compile again.
    """
    N, P = prompt_NP.shape
    T = cfg.max_new_tokens
    if cache is None:
        cache = init_decode_cache(model_cfg, cfg, N, P)
    check_cache(cache, N, P, model_cfg, cfg)
    check_rows(sp, N, cfg)
    prompt_NP = prompt_NP.astype(jnp.int32)
    prompt_lengths_N = prompt_lengths_N.astype(jnp.int32)
    prompt_mask_NP = prompt_mask(prompt_NP, prompt_lengths_N)

    logits_NV, cache, experts_NLk = decode.routed_prefill(
        params, prompt_NP, prompt_mask_NP, cache, model_cfg, cfg.prompt_group
    )
    state = _initial_state(cache, prompt_NP, prompt_mask_NP, rng, cfg, model_cfg)
    state = _emit(state, logits_NV, sp, cfg, experts_NLk)
    windows = decode.attention_windows(P, num_cache_slots(P, cfg), cfg.attention_chunk)
    layers = decode.unstack_layers(params) if cache.unrolled else None
    # RoPE of every fed token, built once: the token fed at step t sits at position len + t - 1.
    positions_TN = prompt_lengths_N[None, :] + jnp.arange(T)[:, None]
    cos_TNh, sin_TNh = transformer.rope_tables(positions_TN, model_cfg, jnp.float32)

    def body(s: _State) -> _State:
        fed = s.step - 1  # index of the token fed now
        row = lambda table: jax.lax.dynamic_index_in_dim(table, fed, keepdims=False)
        logits, cache, experts_NLk = decode.routed_decode_step(
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
        return _emit(dataclasses.replace(s, cache=cache), logits, sp, cfg, experts_NLk)

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
        experts_NTLk=state.experts_NTLk,
    )
    return rollout, state.cache


generate = jax.jit(_generate, static_argnames=("model_cfg", "cfg"), donate_argnames=("cache",))


def check_prompts(
    prompt_NP: np.ndarray | Array,
    prompt_lengths_N: np.ndarray | Array,
    model_cfg: ModelConfig,
    cfg: SamplerConfig,
) -> None:
    """Checks host inputs of `sample` (values only when both are numpy arrays).

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
    check_prompts(prompt_NP, prompt_lengths_N, model_cfg, cfg)
    N = prompt_NP.shape[0]
    if sp is None:
        sp = sampling_params(N)
    rollout, _ = generate(
        params, prompt_NP, prompt_lengths_N, rng, sp, None, model_cfg=model_cfg, cfg=cfg
    )
    return rollout
