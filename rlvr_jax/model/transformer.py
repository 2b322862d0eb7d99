"""One decoder for Qwen2/2.5, Qwen3, Llama 3 (SmolLM2) and the mixture-of-experts Qwen3-MoE and
Qwen2-MoE, as pure functions over a pytree (the MoE block itself in `model/moe.py`).

Layers are stacked on a leading axis L and run with `lax.scan`, so compile time does not grow with
depth. The same `forward` serves training (no cache), prefill (cache, T prompt tokens) and decode
(cache, one token), so the sampler and the trainer run one function on one set of buffers.

Attention: training forwards (`hidden_states` without a cache, and the shared-prompt forward,
`grouped.grouped_hidden_states`) run the implementation `cfg.attention` resolves to
(`attention.resolve_attention`): blockwise or a fused kernel, with no (T, S) mask or score
array, or "dense", the reference `attention` below.
On a mesh with a "seq" axis a full pass splits its tokens over it (`sharding.constrain_tokens`)
and its attention gathers the keys (`attention.split_over_seq`); decode and prefill split rows.
Prefill with a cache stays dense: prompts are short, its keys include cache slots and its causal
offset (the write index) is traced.

Shapes: B batch rows, T new tokens, S cache slots, D embed, H query heads, K kv heads, Dh head dim,
F mlp, V vocab, L layers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.model import attention as attention_lib
from rlvr_jax.model import fused_attention, sharding
from rlvr_jax.model import moe as moe_lib
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.kv_cache import KVCache

Array = jax.Array
# Finite rather than -inf: a fully masked row (a left-padding query) then yields a harmless
# uniform distribution instead of NaNs that would poison gradients.
_MASK_VALUE = attention_lib.MASK_VALUE
# attend(q_BTHd, k_BSKd, v_BSKd) -> (B, T, H, Dh): one layer's attention, its mask closed over.
Attend = Callable[[Array, Array, Array], Array]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Layers:
    """Per-layer weights, stacked on a leading L axis. Optional fields are None when absent.

    The projections (q, k, v, o, gate, up, down) may be `Int8Weight`s: a frozen, quantised base
    under LoRA adapters (`lora.quantize_int8`). An MoE model has `moe` in place of the dense
    MLP's gate, up and down.
    """

    attn_norm: Array  # (L, D)
    q: Array  # (L, D, H, Dh)
    k: Array  # (L, D, K, Dh)
    v: Array  # (L, D, K, Dh)
    o: Array  # (L, H, Dh, D)
    mlp_norm: Array  # (L, D)
    gate: Array | None = None  # (L, D, F), dense models
    up: Array | None = None  # (L, D, F)
    down: Array | None = None  # (L, F, D)
    q_bias: Array | None = None  # (L, H, Dh), Qwen2
    k_bias: Array | None = None  # (L, K, Dh)
    v_bias: Array | None = None  # (L, K, Dh)
    q_norm: Array | None = None  # (L, Dh), Qwen3
    k_norm: Array | None = None  # (L, Dh)
    moe: moe_lib.MoeWeights | None = None  # MoE models


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Params:
    """All weights of one decoder. `lm_head` is None when tied to `embed`.

    `lora` holds LoRA adapters on the layer projections (`model/lora.py`), or None. Every
    forward (`hidden_states`, `grouped.grouped_hidden_states`, the decode step) applies them, so
    a policy with adapters is one tree wherever parameters go; the base with the adapters off is
    `dataclasses.replace(params, lora=None)`, the same buffers.
    """

    embed: Array  # (V, D)
    layers: Layers
    final_norm: Array  # (D,)
    lm_head: Array | None = None  # (D, V)
    lora: LoraParams | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Int8Weight:
    """A frozen projection stored as int8 with one f32 scale per output channel (QLoRA-style).

    `values * scale` is the weight. The layer converts `values` to the compute dtype (exact: int8
    fits bf16) and multiplies the matmul's output by `scale`, which equals scaling the weight
    when the scales are per output channel. Built by `lora.quantize_int8`.
    """

    values: Array  # int8, the projection's shape, e.g. (L, D, H, Dh)
    scale: Array  # f32, its output dims, e.g. (L, H, Dh)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LowRank:
    """One projection's adapter, delta W = A @ B over the rank axis r (see `model/lora.py`)."""

    a: Array  # (L, in..., r), e.g. (L, D, r) for q, (L, H, Dh, r) for o
    b: Array  # (L, r, out...), e.g. (L, r, H, Dh) for q, (L, r, D) for o


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LoraParams:
    """LoRA adapters of the layer projections, stacked on L like `Layers` and scanned with them.

    A projection without an adapter is None. `scale` (alpha / rank) is static: it is part of the
    tree's structure, not a leaf, so it gets no gradient and no optimizer state.
    """

    scale: float = dataclasses.field(metadata=dict(static=True))
    q: LowRank | None = None
    k: LowRank | None = None
    v: LowRank | None = None
    o: LowRank | None = None
    gate: LowRank | None = None
    up: LowRank | None = None
    down: LowRank | None = None


def param_shapes(cfg: ModelConfig) -> Params:
    """The parameter tree of `cfg` as `jax.ShapeDtypeStruct`s (no memory is allocated)."""
    return jax.eval_shape(lambda: init_params(jax.random.key(0), cfg))


def logical_axes(cfg: ModelConfig) -> Params:
    """Logical axis names of every parameter, mapped to mesh axes by `model/sharding.py`."""
    opt = lambda on, names: names if on else None  # noqa: E731
    dense = not cfg.is_moe
    layers = Layers(
        attn_norm=("layers", "embed"),
        q=("layers", "embed", "q_heads", "head_dim"),
        k=("layers", "embed", "kv_heads", "head_dim"),
        v=("layers", "embed", "kv_heads", "head_dim"),
        o=("layers", "q_heads", "head_dim", "embed"),
        mlp_norm=("layers", "embed"),
        gate=opt(dense, ("layers", "embed", "mlp")),
        up=opt(dense, ("layers", "embed", "mlp")),
        down=opt(dense, ("layers", "mlp", "embed")),
        q_bias=opt(cfg.qkv_bias, ("layers", "q_heads", "head_dim")),
        k_bias=opt(cfg.qkv_bias, ("layers", "kv_heads", "head_dim")),
        v_bias=opt(cfg.qkv_bias, ("layers", "kv_heads", "head_dim")),
        q_norm=opt(cfg.qk_norm, ("layers", "head_dim")),
        k_norm=opt(cfg.qk_norm, ("layers", "head_dim")),
        moe=moe_lib.moe_logical_axes(cfg) if cfg.is_moe else None,
    )
    return Params(
        embed=("vocab", None),  # vocabulary-split, D whole: see model/sharding.py
        layers=layers,
        final_norm=("embed",),
        lm_head=opt(not cfg.tie_embeddings, (None, "vocab")),
    )


def init_params(rng: Array, cfg: ModelConfig, std: float = 0.02) -> Params:
    """Random parameters (normal(0, std) matrices, unit norms, zero biases) for `cfg`."""
    dt = jnp.dtype(cfg.param_dtype)
    L, D, H, K, Dh, F, V = (
        cfg.num_layers,
        cfg.embed_dim,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.mlp_dim,
        cfg.vocab_size,
    )
    keys = iter(jax.random.split(rng, 9))
    normal = lambda shape: (std * jax.random.normal(next(keys), shape, jnp.float32)).astype(dt)  # noqa: E731
    ones = lambda shape: jnp.ones(shape, dt)  # noqa: E731
    zeros = lambda shape: jnp.zeros(shape, dt)  # noqa: E731
    dense = not cfg.is_moe
    layers = Layers(
        attn_norm=ones((L, D)),
        q=normal((L, D, H, Dh)),
        k=normal((L, D, K, Dh)),
        v=normal((L, D, K, Dh)),
        o=normal((L, H, Dh, D)),
        mlp_norm=ones((L, D)),
        gate=normal((L, D, F)) if dense else None,
        up=normal((L, D, F)) if dense else None,
        down=normal((L, F, D)) if dense else None,
        q_bias=zeros((L, H, Dh)) if cfg.qkv_bias else None,
        k_bias=zeros((L, K, Dh)) if cfg.qkv_bias else None,
        v_bias=zeros((L, K, Dh)) if cfg.qkv_bias else None,
        q_norm=ones((L, Dh)) if cfg.qk_norm else None,
        k_norm=ones((L, Dh)) if cfg.qk_norm else None,
        moe=None if dense else moe_lib.init_moe(jax.random.fold_in(rng, 1), cfg, std, dt),
    )
    return Params(
        embed=normal((V, D)),
        layers=layers,
        final_norm=ones((D,)),
        lm_head=None if cfg.tie_embeddings else normal((D, V)),
    )


def count_params(params: Params) -> int:
    """Number of scalars in a parameter tree (arrays or ShapeDtypeStructs)."""
    return sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(params))


def positions_from_mask(mask_BT: Array) -> Array:
    """Positions of a left-padded batch: 0 at each row's first real token, clipped at 0 before."""
    return jnp.maximum(jnp.cumsum(mask_BT.astype(jnp.int32), axis=-1) - 1, 0)


def rms_norm(x: Array, weight: Array, eps: float) -> Array:
    """RMSNorm in f32, cast back before the scale, as Hugging Face does."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * x32.astype(x.dtype)


def inv_frequencies(cfg: ModelConfig) -> np.ndarray:
    """RoPE inverse frequencies (Dh/2,), with Llama-3 scaling when configured. Static numpy."""
    dh = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, dh, 2, dtype=np.float64) / dh))
    rs = cfg.rope_scaling
    if rs is None:
        return inv.astype(np.float32)
    low_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor
    high_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor
    wavelen = 2 * np.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / rs.factor, inv)
    smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) / (
        rs.high_freq_factor - rs.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_tables(positions_BT: Array, cfg: ModelConfig, dtype) -> tuple[Array, Array]:
    """cos and sin (B, T, Dh/2) of the RoPE angles of `positions_BT`, computed in f32.

    Computed once per forward (not per layer): XLA fuses trigonometry into each consumer, so a
    table built inside the layer would be recomputed for every head of every layer.
    """
    inv = jnp.asarray(inv_frequencies(cfg))
    angles = positions_BT.astype(jnp.float32)[..., None] * inv
    return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


def rotate(x_BTNd: Array, cos_BTh: Array, sin_BTh: Array) -> Array:
    """Applies the rotation of `rope_tables` in the Hugging Face (rotate-half) layout."""
    cos, sin = cos_BTh[..., None, :], sin_BTh[..., None, :]
    x1, x2 = jnp.split(x_BTNd, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def apply_rope(x_BTNd: Array, positions_BT: Array, cfg: ModelConfig) -> Array:
    """Rotary embedding in the Hugging Face (rotate-half) layout, angles computed in f32."""
    return rotate(x_BTNd, *rope_tables(positions_BT, cfg, x_BTNd.dtype))


def attention(
    q_BTHd: Array, k_BSKd: Array, v_BSKd: Array, mask_BTS: Array, cfg: ModelConfig
) -> Array:
    """Grouped-query attention; scores and softmax in f32. Returns (B, T, H, Dh)."""
    B, T, H, Dh = q_BTHd.shape
    K = k_BSKd.shape[2]
    q = q_BTHd.reshape(B, T, K, H // K, Dh)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k_BSKd, preferred_element_type=jnp.float32)
    scores = scores * (1.0 / math.sqrt(Dh))
    scores = jnp.where(mask_BTS[:, None, None, :, :], scores, _MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_BSKd.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v_BSKd)
    return out.reshape(B, T, H, Dh)


def _project(
    spec: str, x: Array, w: Array | Int8Weight, lora: LoraParams | None, name: str
) -> Array:
    """`einsum(spec, x, w)` in x's dtype, plus the scaled low-rank term of `lora.<name>`.

    The adapter is applied unmerged, (x @ A) @ B: the backward pass then never forms a gradient
    of the full weight (see `model/lora.py` for the measurement).
    """
    dt = x.dtype
    if isinstance(w, Int8Weight):
        y = jnp.einsum(spec, x, w.values.astype(dt)) * w.scale.astype(dt)
    else:
        y = jnp.einsum(spec, x, w.astype(dt))
    adapter = None if lora is None else getattr(lora, name)
    if adapter is None:
        return y
    # "btd,dhk->bthk" -> "btd,dr->btr" and "btr,rhk->bthk": r is a letter no spec uses.
    ins, out = spec.split("->")
    x_dims, w_dims = ins.split(",")
    contracted = "".join(c for c in w_dims if c in x_dims)
    kept = "".join(c for c in x_dims if c not in contracted)
    xa = jnp.einsum(f"{x_dims},{contracted}r->{kept}r", x, adapter.a.astype(dt))
    delta = jnp.einsum(f"{kept}r,r{w_dims[len(contracted) :]}->{out}", xa, adapter.b.astype(dt))
    return y + delta * jnp.asarray(lora.scale, dt)


def _qkv(
    x_BTD: Array,
    w: Layers,
    rope: tuple[Array, Array],
    cfg: ModelConfig,
    lora: LoraParams | None = None,
) -> tuple[Array, Array, Array]:
    """Queries (B, T, H, Dh), keys and values (B, T, K, Dh) of a block's input, RoPE applied.

    `lora` holds this layer's adapters (one slice of the stacked `LoraParams`), or None.
    """
    dt = x_BTD.dtype
    h = rms_norm(x_BTD, w.attn_norm, cfg.norm_eps)
    q = _project("btd,dhk->bthk", h, w.q, lora, "q")
    k = _project("btd,dhk->bthk", h, w.k, lora, "k")
    v = _project("btd,dhk->bthk", h, w.v, lora, "v")
    if w.q_bias is not None:
        q, k, v = q + w.q_bias.astype(dt), k + w.k_bias.astype(dt), v + w.v_bias.astype(dt)
    if w.q_norm is not None:
        q = rms_norm(q, w.q_norm, cfg.norm_eps)
        k = rms_norm(k, w.k_norm, cfg.norm_eps)
    return rotate(q, *rope), rotate(k, *rope), v


def _out_and_routed_mlp(
    x_BTD: Array,
    attn_BTHd: Array,
    w: Layers,
    cfg: ModelConfig,
    lora: LoraParams | None = None,
) -> tuple[Array, moe_lib.Routing | None]:
    """The rest of a block after attention: output projection, residual, and the MLP; and the
    routing of its B x T tokens, each field (B, T, ...) (None when dense)."""
    x_BTD = x_BTD + _project("bthk,hkd->btd", attn_BTHd, w.o, lora, "o")
    h = rms_norm(x_BTD, w.mlp_norm, cfg.norm_eps)
    if w.moe is not None:
        y, routing = moe_lib.moe_mlp(h, w.moe, cfg)
        return x_BTD + y, jax.tree.map(lambda a: a.reshape(*h.shape[:2], -1), routing)
    gate = _project("btd,df->btf", h, w.gate, lora, "gate")
    up = _project("btd,df->btf", h, w.up, lora, "up")
    return x_BTD + _project("btf,fd->btd", jax.nn.silu(gate) * up, w.down, lora, "down"), None


def _self_attend(valid_BT: Array, cfg: ModelConfig, segment_ids_BT: Array | None = None) -> Attend:
    """The attention of a full causal pass over the T tokens of `valid_BT` (their real ones),
    within each token's segment where `segment_ids_BT` packs several sequences in a row."""
    layout = "causal" if segment_ids_BT is None else "packed"
    impl = attention_lib.resolve_attention(cfg, layout=layout)
    if sharding.seq_shards(valid_BT.shape[1]) > 1:
        return _split_self_attend(valid_BT, cfg, segment_ids_BT, impl == "dense")
    if impl == "dense":
        T = valid_BT.shape[1]
        mask_BTS = jnp.tril(jnp.ones((T, T), bool))[None] & valid_BT[:, None, :]
        if segment_ids_BT is not None:
            seg = segment_ids_BT
            mask_BTS &= attention_lib.segment_visible(seg[:, :, None], seg[:, None, :])
        return lambda q, k, v: attention(q, k, v, mask_BTS, cfg)
    block = cfg.attention_block
    return lambda q, k, v: fused_attention.causal_attention(
        q, k, v, valid_BT, impl, block, segment_ids_BT
    )


def _split_self_attend(
    valid_BT: Array, cfg: ModelConfig, segment_ids_BT: Array | None, dense: bool
) -> Attend:
    """`_self_attend` of rows whose tokens are split over the mesh's "seq" axis: each device's
    query chunk attends to the keys gathered from the whole row (`attention.split_over_seq`),
    by the dense reference or else blockwise (the fused kernels take no query offset)."""
    keys = (valid_BT,) if segment_ids_BT is None else (valid_BT, segment_ids_BT)

    def local(q, k, v, keys, whole, query_start):
        del whole
        T = q.shape[1]
        seg_BS = keys[1] if len(keys) > 1 else None
        if dense:
            mask_BTS = attention_lib.causal_chunk_mask(keys[0], T, query_start)
            if seg_BS is not None:
                q_seg_BT = jax.lax.dynamic_slice_in_dim(seg_BS, query_start, T, axis=1)
                mask_BTS &= attention_lib.segment_visible(q_seg_BT[:, :, None], seg_BS[:, None])
            return attention(q, k, v, mask_BTS, cfg)
        block = cfg.attention_block
        segments = None if seg_BS is None else (seg_BS, seg_BS)
        return attention_lib.blockwise_attention(
            q, k, v, keys[0], 0, block, block, segments, query_start=query_start
        )[0]

    return lambda q, k, v: attention_lib.split_over_seq(local, q, k, v, keys)


def _layer(
    x_BTD: Array,
    w: Layers,
    rope: tuple[Array, Array],
    attend: Attend,
    kv: tuple[Array, Array] | None,
    write_index: Array | None,
    cfg: ModelConfig,
    lora: LoraParams | None = None,
) -> tuple[Array, tuple[Array, Array] | None, moe_lib.Routing | None]:
    """One pre-norm block. With `kv` (this layer's cache) the new keys are written at
    `write_index` and `attend` reads the whole cache; otherwise it reads the new keys only.
    `lora`: this layer's adapters, or None. Returns the block's output, the cache, and the
    routing of an MoE block (`_out_and_routed_mlp`; None when dense)."""
    dt = x_BTD.dtype
    q, k, v = _qkv(x_BTD, w, rope, cfg, lora)
    if kv is not None:
        # The cache is laid out (B, K, S, Dh), the decode layout (see kv_cache.py); XLA folds the
        # transposes of the read into the attention matmuls.
        cache_k, cache_v = kv
        start = (0, 0, write_index, 0)
        put = lambda c, x: jax.lax.dynamic_update_slice(c, x.swapaxes(1, 2).astype(c.dtype), start)
        kv = (put(cache_k, k), put(cache_v, v))
        k, v = (c.swapaxes(1, 2).astype(dt) for c in kv)
    x_BTD, routing = _out_and_routed_mlp(x_BTD, attend(q, k, v), w, cfg, lora)
    return x_BTD, kv, routing


def hidden_states(
    params: Params,
    tokens_BT: Array,
    positions_BT: Array,
    cfg: ModelConfig,
    cache: KVCache | None = None,
    mask_BT: Array | None = None,
    *,
    lora: LoraParams | None = None,
    segment_ids_BT: Array | None = None,
) -> tuple[Array, KVCache | None]:
    """Final-norm hidden states (B, T, D) in `cfg.dtype`, and the updated cache.

    Args:
      params: the weights.
      tokens_BT: token ids.
      positions_BT: RoPE positions (see `positions_from_mask` for left-padded rows).
      cfg: the architecture.
      cache: None for a full causal pass over `tokens_BT`; else a stacked cache with its slot
        mask and index (`kv_cache.init_cache`): the new tokens are written into slots
        `cache.index .. cache.index + T - 1` and attend to every earlier valid slot.
      mask_BT: which tokens are real (False for padding); padded keys are never attended to.
        Defaults to all True.
      lora: adapters to apply in place of `params.lora` (None: `params.lora`'s, if any).
      segment_ids_BT: packed rows (no cache): several sequences share a row, each a run of one
        segment id, and a token attends only to the earlier real tokens of its segment, or of
        its sequence's shared prefix (`attention.BRANCHES`); RoPE reads `positions_BT`, each
        sequence's own positions.
    """
    x, cache, _ = _decoder(
        params, tokens_BT, positions_BT, cfg, cache, mask_BT, lora, segment_ids_BT
    )
    return x, cache


def routed_hidden_states(
    params: Params,
    tokens_BT: Array,
    positions_BT: Array,
    cfg: ModelConfig,
    mask_BT: Array | None = None,
    *,
    lora: LoraParams | None = None,
    segment_ids_BT: Array | None = None,
) -> tuple[Array, moe_lib.Routing | None]:
    """`hidden_states` of a full causal pass (no cache), and the routing of its tokens as
    `routing` returns it, fields (L, B, T, ...); None for a dense model, whose pass is
    `hidden_states`' exactly."""
    x, _, routed = _decoder(
        params, tokens_BT, positions_BT, cfg, None, mask_BT, lora, segment_ids_BT
    )
    return x, routed


def routing(
    params: Params,
    tokens_BT: Array,
    positions_BT: Array,
    cfg: ModelConfig,
    cache: KVCache | None = None,
    mask_BT: Array | None = None,
) -> tuple[moe_lib.Routing, KVCache | None]:
    """The router's decision in every layer, as `hidden_states` computes it (a full pass, or
    with `cache` a prefill or decode step), and the updated cache. An MoE model only.

    Returns:
      A `moe.Routing` whose fields are stacked (L, B, T, ...): experts (L, B, T, k), most
      probable first; their weights; the probabilities (L, B, T, E) in f32.

    Raises:
      ValueError: for a dense model.
    """
    if not cfg.is_moe:
        raise ValueError(f"routing: model_type={cfg.model_type!r} has no router")
    _, cache, routed = _decoder(params, tokens_BT, positions_BT, cfg, cache, mask_BT, None, None)
    return routed, cache


def router_choices(
    params: Params,
    tokens_BT: Array,
    positions_BT: Array,
    cfg: ModelConfig,
    mask_BT: Array | None = None,
) -> Array:
    """The experts (L, B, T, k) each token is routed to in each layer of a full causal pass
    (most probable first); see `routing`."""
    return routing(params, tokens_BT, positions_BT, cfg, None, mask_BT)[0].experts_Nk


def _decoder(
    params: Params,
    tokens_BT: Array,
    positions_BT: Array,
    cfg: ModelConfig,
    cache: KVCache | None,
    mask_BT: Array | None,
    lora: LoraParams | None,
    segment_ids_BT: Array | None,
) -> tuple[Array, KVCache | None, Array | None]:
    """`hidden_states`, and the routing of an MoE model's tokens (`routing`; None if dense)."""
    B, T = tokens_BT.shape
    dt = jnp.dtype(cfg.dtype)
    lora = params.lora if lora is None else lora
    if mask_BT is None:
        mask_BT = jnp.ones((B, T), bool)
    mask_BT = mask_BT.astype(bool)
    x = params.embed[tokens_BT].astype(dt)
    if segment_ids_BT is not None and cache is not None:
        raise ValueError("segment_ids_BT (packed rows) is for a full pass, without a cache")
    if cache is None:
        attend = _self_attend(mask_BT, cfg, segment_ids_BT)
        write_index = None
    else:
        S = cache.num_slots
        write_index = cache.index
        key_mask_BS = jax.lax.dynamic_update_slice(cache.mask, mask_BT, (0, write_index))
        query_slot_T = write_index + jnp.arange(T)
        causal_TS = jnp.arange(S)[None, :] <= query_slot_T[:, None]
        mask_BTS = causal_TS[None] & key_mask_BS[:, None, :]
        attend = lambda q, k, v: attention(q, k, v, mask_BTS, cfg)  # noqa: E731

    rope = rope_tables(positions_BT, cfg, dt)
    # A full pass may split its tokens over the mesh's "seq" axis; decode and prefill split
    # rows only (their T is one token or a short prompt).
    constrain = sharding.constrain_rows if cache is not None else sharding.constrain_tokens

    def body(x, xs):
        w, kv, ad = xs
        x, kv, routed = _layer(constrain(x), w, rope, attend, kv, write_index, cfg, ad)
        return constrain(x), (kv, routed)

    if cfg.remat:
        body = jax.checkpoint(body, prevent_cse=False)
    kv_in = None if cache is None else (cache.k, cache.v)
    x, (kv_out, routed) = jax.lax.scan(body, x, (params.layers, kv_in, lora))
    x = rms_norm(x, params.final_norm, cfg.norm_eps)
    if cache is not None:
        cache = KVCache(k=kv_out[0], v=kv_out[1], mask=key_mask_BS, index=cache.index + T)
    return x, cache, routed


def logits_from_hidden(params: Params, h_BTD: Array, cfg: ModelConfig) -> Array:
    """Vocabulary logits (B, T, V) in f32 from final hidden states."""
    dt = h_BTD.dtype
    if cfg.tie_embeddings:
        return jnp.einsum(
            "btd,vd->btv", h_BTD, params.embed.astype(dt), preferred_element_type=jnp.float32
        )
    return jnp.einsum(
        "btd,dv->btv", h_BTD, params.lm_head.astype(dt), preferred_element_type=jnp.float32
    )


def forward(
    params: Params,
    tokens_BT: Array,
    positions_BT: Array,
    cfg: ModelConfig,
    cache: KVCache | None = None,
    mask_BT: Array | None = None,
    *,
    lora: LoraParams | None = None,
) -> tuple[Array, KVCache | None]:
    """Logits (B, T, V) in f32 and the updated cache; see `hidden_states` for the arguments."""
    h, cache = hidden_states(params, tokens_BT, positions_BT, cfg, cache, mask_BT, lora=lora)
    return logits_from_hidden(params, h, cfg), cache
