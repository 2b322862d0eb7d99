"""The sampler's model side: prefill into a KV cache, and one-token decode steps.

Prefill runs `transformer.hidden_states` over the left-padded prompts. Decode runs one token per
row through the block functions of `transformer._layer` (projections, RoPE, output and MLP), with
its own attention over the cache's (N, K, S, Dh) layers (`kv_cache.KVCache`), so that attention
is a batched matmul over (N, K) with no transpose. The cache here holds keys and values only: the
sampler's loop keeps the prompt mask and the slot to write. Two layer loops:

* "scan": layers stacked on L under `lax.scan` (compile time independent of depth), the cache one
  (L, N, K, S, Dh) array. Attention reads only the filled prefix of the cache, rounded up to a
  static window (`lax.switch`), and the new keys/values are written once after the scan. This is
  the loop for TPU and GPU, where XLA feeds a dynamic slice of the stacked weights to the matmul
  without a copy.
* "unroll": a Python loop over per-layer weights, split from the stack once per call, and a tuple
  of per-layer caches; each layer writes its new key/value in place, then attends over the same
  static windows of its buffer. XLA:CPU copies every dynamic slice of the stacked weights (and
  of the cache) before a matmul, which doubled the memory traffic of a decode step; unrolled, no
  weight is copied. It is the default on CPU ("auto"), at the price of compile time that grows
  with depth.

`decode_step` writes one slot for all rows (left padding keeps the rows in step);
`decode_step_per_row` gives each row its own slot, for the continuous-batching sampler, where a
cache row is a decode slot that takes the next queued prompt when its row ends. Both layer loops
serve both.

LoRA adapters (`Params.lora`) ride along with their layer's weights in both loops.

Both loops take RoPE's cos/sin of the fed tokens as inputs: built inside the step, XLA fuses the
trigonometry into every head's rotation of every layer.

Shapes: N rows, P prompt bucket, S cache slots, L layers, K kv heads, G query heads per kv head,
Dh head dim, D embed, V vocab.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from rlvr_jax.model import kv_cache, transformer
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.kv_cache import KVCache

Array = jax.Array
LAYER_LOOPS = ("auto", "scan", "unroll")


def resolve_layer_loop(layer_loop: str) -> str:
    """Maps "auto" to "unroll" on CPU and "scan" elsewhere (see the module docstring)."""
    if layer_loop not in LAYER_LOOPS:
        raise ValueError(f"layer_loop={layer_loop!r}; expected one of {LAYER_LOOPS}")
    if layer_loop == "auto":
        return "unroll" if jax.default_backend() == "cpu" else "scan"
    return layer_loop


def init_decode_cache(
    model_cfg: ModelConfig, num_rows: int, num_slots: int, dtype: str, layer_loop: str
) -> KVCache:
    """A zeroed cache of `num_slots` slots for `num_rows` rows, keys and values only, stacked or
    per layer as `layer_loop` resolves."""
    L, K, Dh = model_cfg.num_layers, model_cfg.num_kv_heads, model_cfg.head_dim
    if resolve_layer_loop(layer_loop) == "unroll":
        zeros = lambda: tuple(jnp.zeros((num_rows, K, num_slots, Dh), dtype) for _ in range(L))
        return KVCache(k=zeros(), v=zeros())
    shape = (L, num_rows, K, num_slots, Dh)
    return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))


def prefill(
    params: transformer.Params,
    prompt_NP: Array,
    prompt_mask_NP: Array,
    cache: KVCache,
    model_cfg: ModelConfig,
    group: int = 1,
) -> tuple[Array, KVCache]:
    """Runs the prompts, writes their keys/values into slots [0, P) of `cache` (in place).

    With `group` > 1 the rows come in groups of that many copies of one prompt (rows
    b * group .. b * group + group - 1, as `sampling.bucket_and_pad` repeats them): each group's
    prompt runs once and its keys, values and logits are copied to the group's rows.

    Returns:
      (logits (N, V) f32 of the last prompt position, cache).
    """
    logits_NV, cache, _ = routed_prefill(params, prompt_NP, prompt_mask_NP, cache, model_cfg, group)
    return logits_NV, cache


def routed_prefill(
    params: transformer.Params,
    prompt_NP: Array,
    prompt_mask_NP: Array,
    cache: KVCache,
    model_cfg: ModelConfig,
    group: int = 1,
) -> tuple[Array, KVCache, Array | None]:
    """`prefill`, and an MoE model's experts (N, L, k) int32 of the last prompt position in
    every layer (most probable first; None for a dense model)."""
    prompt_NP, prompt_mask_NP = prompt_NP[::group], prompt_mask_NP[::group]
    N, P = prompt_NP.shape  # the rows prefilled: one per group
    # A cache of the prompt's P slots only, so prefill attention spans P, not S, slots.
    kv = kv_cache.init_cache(model_cfg, N, P, cache.dtype)
    positions_NP = transformer.positions_from_mask(prompt_mask_NP)
    h_NPD, kv, routed = transformer._decoder(
        params, prompt_NP, positions_NP, model_cfg, kv, prompt_mask_NP, None, None
    )
    # Left padding puts every row's last prompt token in column P - 1; projecting only that
    # column avoids an (N, P, V) logits array.
    logits_NV = transformer.logits_from_hidden(params, h_NPD[:, -1:], model_cfg)[:, 0]
    experts_NLk = None if routed is None else routed.experts_Nk[:, :, -1].swapaxes(0, 1)
    k_LNKPd, v_LNKPd = kv.k, kv.v
    if group > 1:
        logits_NV = jnp.repeat(logits_NV, group, axis=0)
        k_LNKPd, v_LNKPd = (jnp.repeat(x, group, axis=1) for x in (k_LNKPd, v_LNKPd))
        if experts_NLk is not None:
            experts_NLk = jnp.repeat(experts_NLk, group, axis=0)
    put = jax.lax.dynamic_update_slice
    if cache.unrolled:
        return (
            logits_NV,
            KVCache(
                k=tuple(put(c, k_LNKPd[i], (0, 0, 0, 0)) for i, c in enumerate(cache.k)),
                v=tuple(put(c, v_LNKPd[i], (0, 0, 0, 0)) for i, c in enumerate(cache.v)),
            ),
            experts_NLk,
        )
    cache = KVCache(
        k=put(cache.k, k_LNKPd, (0, 0, 0, 0, 0)), v=put(cache.v, v_LNKPd, (0, 0, 0, 0, 0))
    )
    return logits_NV, cache, experts_NLk


LayerWeights = tuple[transformer.Layers, transformer.LoraParams | None]


def unstack_layers(params: transformer.Params) -> list[LayerWeights]:
    """Per-layer weights and adapters (None without) for the unrolled loop: one copy per call,
    none per step."""
    n = params.layers.attn_norm.shape[0]
    return [jax.tree.map(lambda a, i=i: a[i], (params.layers, params.lora)) for i in range(n)]


def attention_windows(prompt_len: int, num_slots: int, chunk: int) -> tuple[int, ...]:
    """The static attention windows: the prompt plus multiples of `chunk`, up to S."""
    if not chunk:
        return (num_slots,)
    S = num_slots
    return tuple(sorted({min(S, prompt_len + j * chunk) for j in range(S + 1)}))


# ---------------------------------------------------------------------------------------------
# The layer, split around attention so both loops share it


def _qkv(
    x_ND: Array, w: LayerWeights, rope_N: tuple[Array, Array], cfg: ModelConfig
) -> tuple[Array, Array, Array]:
    """`transformer._qkv` of one token per row: query (N, K, G, Dh), key and value (N, K, Dh)."""
    N, K = x_ND.shape[0], cfg.num_kv_heads
    rope = tuple(c[:, None].astype(x_ND.dtype) for c in rope_N)
    layer, lora = w
    q, k, v = transformer._qkv(x_ND[:, None], layer, rope, cfg, lora)
    return q[:, 0].reshape(N, K, cfg.num_heads // K, cfg.head_dim), k[:, 0], v[:, 0]


def _out_and_mlp(
    x_ND: Array, attn_NKGd: Array, w: LayerWeights, cfg: ModelConfig
) -> tuple[Array, Array | None]:
    """`transformer._out_and_routed_mlp` of one token per row: the output, and an MoE block's
    experts (N, k) (None when dense)."""
    attn = attn_NKGd.reshape(x_ND.shape[0], 1, cfg.num_heads, cfg.head_dim)
    layer, lora = w
    x, routed = transformer._out_and_routed_mlp(x_ND[:, None], attn, layer, cfg, lora)
    return x[:, 0], None if routed is None else routed.experts_Nk[:, 0]


def _scores(q_NKGd: Array, k_NKSd: Array, valid_NS: Array) -> Array:
    s = jnp.einsum("nkgd,nksd->nkgs", q_NKGd, k_NKSd, preferred_element_type=jnp.float32)
    s = s * (1.0 / math.sqrt(q_NKGd.shape[-1]))
    return jnp.where(valid_NS[:, None, None, :], s, transformer._MASK_VALUE)


def _valid_slots(prompt_mask_NP: Array, width: int, limit: Array) -> Array:
    """(N, width): prompt slots where the prompt is real, generated slots below `limit`."""
    N, P = prompt_mask_NP.shape
    generated = jnp.broadcast_to(jnp.arange(P, width) < limit, (N, width - P))
    return jnp.concatenate([prompt_mask_NP, generated], axis=1)


def _window_attention(
    q_NKGd: Array,
    k_NKd: Array,
    v_NKd: Array,
    cache: KVCache,
    layer: Array,
    prompt_mask_NP: Array,
    slot: Array,
    window: int,
) -> Array:
    """Scan loop: one query per row against cache slots [0, window) and its own key/value.

    Slots past `slot` hold nothing yet (or a previous batch's values), so they are masked; rows
    that already stopped attend to tokens nobody reads.
    """
    N, K, _, Dh = q_NKGd.shape
    dt = q_NKGd.dtype
    size = (1, N, K, window, Dh)
    ck = jax.lax.dynamic_slice(cache.k, (layer, 0, 0, 0, 0), size)[0].astype(dt)
    cv = jax.lax.dynamic_slice(cache.v, (layer, 0, 0, 0, 0), size)[0].astype(dt)
    s_NKGW = _scores(q_NKGd, ck, _valid_slots(prompt_mask_NP, window, slot))
    s_self = jnp.einsum("nkgd,nkd->nkg", q_NKGd, k_NKd, preferred_element_type=jnp.float32)
    s_self = s_self * (1.0 / math.sqrt(Dh))
    probs = jax.nn.softmax(jnp.concatenate([s_NKGW, s_self[..., None]], axis=-1), axis=-1)
    probs = probs.astype(dt)
    out = jnp.einsum("nkgw,nkwd->nkgd", probs[..., :window], cv)
    return out + probs[..., window:] * v_NKd[:, :, None, :]


def _scan_layers(
    x_ND: Array,
    params: transformer.Params,
    cache: KVCache,
    rope_N: tuple[Array, Array],
    prompt_mask_NP: Array,
    slot: Array,
    cfg: ModelConfig,
    windows: tuple[int, ...],
) -> tuple[Array, KVCache, Array | None]:
    # Smallest window that holds slots [0, slot).
    branch = jnp.sum(jnp.asarray(windows) < slot)
    attends = [functools.partial(_window_attention, window=w) for w in windows]

    def layer(x_ND, inputs):
        *w, index = inputs
        q, k, v = _qkv(x_ND, w, rope_N, cfg)
        args = (q, k, v, cache, index, prompt_mask_NP, slot)
        attn = attends[0](*args) if len(attends) == 1 else jax.lax.switch(branch, attends, *args)
        x_ND, experts_Nk = _out_and_mlp(x_ND, attn, w, cfg)
        return x_ND, (k, v, experts_Nk)

    layer_ids = jnp.arange(cfg.num_layers)
    x_ND, (k_LNKd, v_LNKd, experts_LNk) = jax.lax.scan(
        layer, x_ND, (params.layers, params.lora, layer_ids)
    )
    # Written after the scan, once: the scan only reads the cache, so the update is in place.
    at = (0, 0, 0, slot, 0)
    put = lambda c, new: jax.lax.dynamic_update_slice(c, new[:, :, :, None].astype(c.dtype), at)
    experts_NLk = None if experts_LNk is None else experts_LNk.swapaxes(0, 1)
    return x_ND, KVCache(k=put(cache.k, k_LNKd), v=put(cache.v, v_LNKd)), experts_NLk


def _span_attention(
    q_NKGd: Array, k_NKSd: Array, v_NKSd: Array, prompt_mask_NP: Array, slot: Array, window: int
) -> Array:
    """Unrolled loop: one query per row against its buffer's slots [0, window), of which those
    past `slot` (this token's, already written) are masked."""
    dt = q_NKGd.dtype
    k, v = k_NKSd[:, :, :window].astype(dt), v_NKSd[:, :, :window].astype(dt)
    s_NKGW = _scores(q_NKGd, k, _valid_slots(prompt_mask_NP, window, slot + 1))
    probs = jax.nn.softmax(s_NKGW, axis=-1).astype(dt)
    return jnp.einsum("nkgw,nkwd->nkgd", probs, v)


def _unrolled_layers(
    x_ND: Array,
    layers: list[LayerWeights],
    cache: KVCache,
    rope_N: tuple[Array, Array],
    prompt_mask_NP: Array,
    slot: Array,
    cfg: ModelConfig,
    windows: tuple[int, ...],
) -> tuple[Array, KVCache, Array | None]:
    # Write first, then attend to the buffer just written: each buffer's only reader follows its
    # update, so XLA updates it in place (reading it before the write made XLA copy it).
    put = lambda c, new: jax.lax.dynamic_update_slice(c, new[:, :, None].astype(c.dtype), at)
    at = (0, 0, slot, 0)
    # Smallest window that holds slots [0, slot].
    branch = jnp.sum(jnp.asarray(windows) <= slot)
    attends = [functools.partial(_span_attention, window=w) for w in windows]
    ks, vs = list(cache.k), list(cache.v)
    experts = []
    for i, w in enumerate(layers):
        q, k, v = _qkv(x_ND, w, rope_N, cfg)
        ks[i], vs[i] = put(ks[i], k), put(vs[i], v)
        args = (q, ks[i], vs[i], prompt_mask_NP, slot)
        attn = attends[0](*args) if len(attends) == 1 else jax.lax.switch(branch, attends, *args)
        x_ND, experts_Nk = _out_and_mlp(x_ND, attn, w, cfg)
        experts.append(experts_Nk)
    experts_NLk = None if experts[0] is None else jnp.stack(experts, axis=1)
    return x_ND, KVCache(k=tuple(ks), v=tuple(vs)), experts_NLk


def decode_step(
    params: transformer.Params,
    layers: list[LayerWeights] | None,
    cache: KVCache,
    tokens_N: Array,
    rope_N: tuple[Array, Array],
    prompt_mask_NP: Array,
    slot: Array,
    model_cfg: ModelConfig,
    windows: tuple[int, ...],
) -> tuple[Array, KVCache]:
    """One token per row through the decoder; its keys/values go to cache slot `slot`.

    Args:
      params: the weights (embedding, final norm, output projection; the stacked layers too in
        the scan loop).
      layers: `unstack_layers(params)` for an unrolled cache, else None.
      cache: the decode cache, slots [0, P) holding the prompts and [P, slot) the generated tokens.
      tokens_N: the token fed to each row.
      rope_N: (cos, sin) (N, Dh/2) of each row's RoPE position (`transformer.rope_tables`).
      prompt_mask_NP: which prompt slots hold real tokens.
      slot: () int32, the cache slot of this token.
      model_cfg: the architecture.
      windows: the attention windows (`attention_windows`).

    Returns:
      (logits (N, V) f32, cache).
    """
    return routed_decode_step(
        params, layers, cache, tokens_N, rope_N, prompt_mask_NP, slot, model_cfg, windows
    )[:2]


def routed_decode_step(
    params: transformer.Params,
    layers: list[LayerWeights] | None,
    cache: KVCache,
    tokens_N: Array,
    rope_N: tuple[Array, Array],
    prompt_mask_NP: Array,
    slot: Array,
    model_cfg: ModelConfig,
    windows: tuple[int, ...],
) -> tuple[Array, KVCache, Array | None]:
    """`decode_step`, and an MoE model's experts (N, L, k) int32 of the fed tokens in every
    layer (most probable first; None for a dense model)."""
    x_ND = params.embed[tokens_N].astype(jnp.dtype(model_cfg.dtype))
    if cache.unrolled:
        x_ND, cache, experts_NLk = _unrolled_layers(
            x_ND, layers, cache, rope_N, prompt_mask_NP, slot, model_cfg, windows
        )
    else:
        x_ND, cache, experts_NLk = _scan_layers(
            x_ND, params, cache, rope_N, prompt_mask_NP, slot, model_cfg, windows
        )
    x_ND = transformer.rms_norm(x_ND, params.final_norm, model_cfg.norm_eps)
    logits_NV = transformer.logits_from_hidden(params, x_ND[:, None], model_cfg)[:, 0]
    return logits_NV, cache, experts_NLk


# ---------------------------------------------------------------------------------------------
# Per-row slots: each row of the cache writes its own slot (continuous batching, where a cache
# row is a decode slot that takes a new prompt whenever its row ends)


def _put_per_row(c_NKSd: Array, new_NKd: Array, slot_N: Array) -> Array:
    """Writes row n's key/value at slot `slot_N[n]`: a scatter of N vectors, in place in a loop."""
    put = lambda c_KSd, x_Kd, s: jax.lax.dynamic_update_slice(
        c_KSd, x_Kd[:, None].astype(c_KSd.dtype), (0, s, 0)
    )
    return jax.vmap(put)(c_NKSd, new_NKd, slot_N)


def _scan_layers_per_row(
    x_ND: Array,
    params: transformer.Params,
    cache: KVCache,
    rope_N: tuple[Array, Array],
    prompt_mask_NP: Array,
    slot_N: Array,
    max_slot: Array,
    cfg: ModelConfig,
    windows: tuple[int, ...],
) -> tuple[Array, KVCache, Array | None]:
    # Smallest window that holds slots [0, max_slot); a (N, 1) limit masks each row's own.
    branch = jnp.sum(jnp.asarray(windows) < max_slot)
    attends = [functools.partial(_window_attention, window=w) for w in windows]
    limit_N1 = slot_N[:, None]

    def layer(x_ND, inputs):
        *w, index = inputs
        q, k, v = _qkv(x_ND, w, rope_N, cfg)
        args = (q, k, v, cache, index, prompt_mask_NP, limit_N1)
        attn = attends[0](*args) if len(attends) == 1 else jax.lax.switch(branch, attends, *args)
        x_ND, experts_Nk = _out_and_mlp(x_ND, attn, w, cfg)
        return x_ND, (k, v, experts_Nk)

    layer_ids = jnp.arange(cfg.num_layers)
    x_ND, (k_LNKd, v_LNKd, experts_LNk) = jax.lax.scan(
        layer, x_ND, (params.layers, params.lora, layer_ids)
    )
    # As in `_scan_layers`: written once after the scan, which only reads the cache. The layer
    # axis rides along inside each row's scatter.
    put = jax.vmap(_put_per_row, in_axes=(0, 0, None))
    cache = KVCache(k=put(cache.k, k_LNKd, slot_N), v=put(cache.v, v_LNKd, slot_N))
    return x_ND, cache, None if experts_LNk is None else experts_LNk.swapaxes(0, 1)


def _unrolled_layers_per_row(
    x_ND: Array,
    layers: list[LayerWeights],
    cache: KVCache,
    rope_N: tuple[Array, Array],
    prompt_mask_NP: Array,
    slot_N: Array,
    max_slot: Array,
    cfg: ModelConfig,
    windows: tuple[int, ...],
) -> tuple[Array, KVCache, Array | None]:
    # As in `_unrolled_layers`: write first, then attend to the buffer just written, so that
    # each buffer's update is in place. Smallest window that holds slots [0, max_slot].
    branch = jnp.sum(jnp.asarray(windows) <= max_slot)
    attends = [functools.partial(_span_attention, window=w) for w in windows]
    limit_N1 = slot_N[:, None]
    ks, vs = list(cache.k), list(cache.v)
    experts = []
    for i, w in enumerate(layers):
        q, k, v = _qkv(x_ND, w, rope_N, cfg)
        ks[i], vs[i] = _put_per_row(ks[i], k, slot_N), _put_per_row(vs[i], v, slot_N)
        args = (q, ks[i], vs[i], prompt_mask_NP, limit_N1)
        attn = attends[0](*args) if len(attends) == 1 else jax.lax.switch(branch, attends, *args)
        x_ND, experts_Nk = _out_and_mlp(x_ND, attn, w, cfg)
        experts.append(experts_Nk)
    experts_NLk = None if experts[0] is None else jnp.stack(experts, axis=1)
    return x_ND, KVCache(k=tuple(ks), v=tuple(vs)), experts_NLk


def decode_step_per_row(
    params: transformer.Params,
    layers: list[LayerWeights] | None,
    cache: KVCache,
    tokens_N: Array,
    rope_N: tuple[Array, Array],
    prompt_mask_NP: Array,
    slot_N: Array,
    max_slot: Array,
    model_cfg: ModelConfig,
    windows: tuple[int, ...],
) -> tuple[Array, KVCache]:
    """`decode_step` where each row has its own cache slot: row n's keys/values go to
    `slot_N[n]` and it attends to its prompt and its slots [P, slot_N[n]].

    Every row reads the same static window (`attention_windows`): the smallest that holds
    `max_slot`, the largest slot whose row's output is used. A row whose slot lies past the
    window (a finished row still in the batch) gets logits nobody should read.

    Args:
      params: the weights, as in `decode_step`.
      layers: `unstack_layers(params)` for an unrolled cache, else None.
      cache: the decode cache; row n holds its prompt in slots [0, P) and its generated tokens
        in [P, slot_N[n]).
      tokens_N: the token fed to each row.
      rope_N: (cos, sin) (N, Dh/2) of each row's RoPE position.
      prompt_mask_NP: which prompt slots of each row hold real tokens.
      slot_N: (N,) int32, each row's cache slot for this token, in [P, S).
      max_slot: () int32, the window bound (see above).
      model_cfg: the architecture.
      windows: the attention windows (`attention_windows`).

    Returns:
      (logits (N, V) f32, cache).
    """
    args = (cache, tokens_N, rope_N, prompt_mask_NP, slot_N, max_slot, model_cfg, windows)
    return routed_decode_step_per_row(params, layers, *args)[:2]


def routed_decode_step_per_row(
    params: transformer.Params,
    layers: list[LayerWeights] | None,
    cache: KVCache,
    tokens_N: Array,
    rope_N: tuple[Array, Array],
    prompt_mask_NP: Array,
    slot_N: Array,
    max_slot: Array,
    model_cfg: ModelConfig,
    windows: tuple[int, ...],
) -> tuple[Array, KVCache, Array | None]:
    """`decode_step_per_row`, and an MoE model's experts (N, L, k) int32 of the fed tokens in
    every layer (most probable first; None for a dense model)."""
    x_ND = params.embed[tokens_N].astype(jnp.dtype(model_cfg.dtype))
    args = (cache, rope_N, prompt_mask_NP, slot_N, max_slot, model_cfg, windows)
    if cache.unrolled:
        x_ND, cache, experts_NLk = _unrolled_layers_per_row(x_ND, layers, *args)
    else:
        x_ND, cache, experts_NLk = _scan_layers_per_row(x_ND, params, *args)
    x_ND = transformer.rms_norm(x_ND, params.final_norm, model_cfg.norm_eps)
    logits_NV = transformer.logits_from_hidden(params, x_ND[:, None], model_cfg)[:, 0]
    return logits_NV, cache, experts_NLk
