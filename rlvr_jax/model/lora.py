"""LoRA adapters on the decoder's projections, and an int8 frozen base (QLoRA-style).

An adapter adds scale * A @ B to a projection W, with A (in..., r) and B (r, out...) laid out
like W's einsum (q: W (D, H, Dh), A (D, r), B (r, H, Dh); o: W (H, Dh, D), A (H, Dh, r),
B (r, D)) and stacked on L like `transformer.Layers`, so the adapters are scanned with the layers.
scale = alpha / rank. A starts as PEFT starts it (kaiming-uniform: U(-1/sqrt(fan_in),
1/sqrt(fan_in))) and B at zero, so a fresh adapter is exactly the base model. Adapters are f32;
the base may be f32, bf16, or int8 with one scale per output channel (`quantize_int8`).

Applied unmerged: each projection computes x @ W + scale * (x @ A) @ B (`transformer._project`).
The alternative, W + scale * A @ B merged one layer at a time inside the scan, makes the backward
pass form the full weight's gradient (x^T dy, as many flops as the forward matmul) to get dA and
dB from it; unmerged, the backward only passes dy through W and the thin A, B. Measured with
`python benchmarks/lora.py --runs 7` (forward + backward w.r.t. the adapters, L=4 D=256 F=768
V=2048, B=4, rank 16 on all seven projections, f32, XLA:CPU on 2 cores under a load average of
6 to 9 from other jobs, 2026-12-01; GFLOP and memory are the compiler's, exact):

      T  variant           temp MiB   GFLOP  median s  time/unmerged
     64  unmerged              37.9    1.23    0.2201          1.00x
     64  merge_per_layer       46.8    1.57    0.2539          1.15x
     64  merge_all             57.5    1.79    0.2722          1.24x
    256  unmerged             159.5    5.67    1.5562          1.00x
    256  merge_per_layer      156.7    6.79    1.5007          0.96x
    256  merge_all            166.5    7.01    1.5510          1.00x

Unmerged does 17 to 22% fewer flops at both lengths and was 13% faster at T=64; at T=256 the
times are within this machine's noise (a rerun swung each by 10 to 20%), with 2% more temporary
memory. The flop gap widens with model width (merging costs a full in x out weight gradient per
projection, unmerged r x (in + out) per token), and unmerged keeps the base untouched, so the
reference model is the same buffers with `lora=None`. Not measured on a GPU or TPU.

Why not qwix: its `LoraProvider` adds adapters by model surgery on Flax (Linen or NNX) modules,
intercepting their einsums and naming the adapters by module path. The decoder here is pure
functions over a `Params` pytree with the layers stacked and scanned, with no module for qwix
to rewrite; the transform it would do is the `_project` term above and `init_lora`, a few
dozen lines that keep the adapters a plain, stacked, shardable tree (`Params.lora`).

How the stages use it (`model.lora` in the settings): the adapters go into the parameter tree,
`params = dataclasses.replace(base, lora=init_lora(key, cfg, lora_cfg))`, so every forward, the
sampler's prefill and both decode loops apply them with no extra argument. The optimizer sees
`trainable(params)` (the adapters; all of `params` without them) and the loss is differentiated
with respect to it, the base closed over (`with_trainable(params, adapters)`): no gradient of a
full weight is formed and Adam's state is adapter-sized. The reference model of the KL term is
`without_adapters(params)`: the same base buffers, no copy. Shardings: `params_logical_axes`
(A takes the projection's input axes, B its output axes, the rank axis stays whole), mapped by
`model/sharding.py` like the parameters' names. Export: `merge_lora` (what `hf.save_hf`
writes) or `model/lora_export.py` (a PEFT adapter directory).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import (
    Int8Weight,
    Layers,
    LoraParams,
    LowRank,
    Params,
    logical_axes,
    param_shapes,
)

Array = jax.Array

# The projections an adapter may target, with how many leading (input) dimensions each weight
# has after L: o contracts (H, Dh), the others one axis.
IN_DIMS: Mapping[str, int] = {"q": 1, "k": 1, "v": 1, "o": 2, "gate": 1, "up": 1, "down": 1}
TARGETS: tuple[str, ...] = tuple(IN_DIMS)

__all__ = [
    "TARGETS",
    "Int8Weight",
    "LoraConfig",
    "LoraParams",
    "LowRank",
    "adapter_config",
    "adapters_of",
    "adapter_logical_axes",
    "dequantize",
    "init_lora",
    "lora_logical_axes",
    "merge_layers",
    "merge_lora",
    "params_logical_axes",
    "quantize_int8",
    "quantized_logical_axes",
    "trainable",
    "with_trainable",
    "without_adapters",
]


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """LoRA settings.

    Attributes:
      rank: r, the adapters' inner dimension (>= 1).
      alpha: the scale is alpha / rank (> 0).
      targets: projection names out of `TARGETS` (q, k, v, o, gate, up, down).
      dropout: must be 0; adapter dropout is not implemented.
    """

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = TARGETS
    dropout: float = 0.0

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"LoraConfig.rank={self.rank!r} must be an integer >= 1")
        if (
            isinstance(self.alpha, bool)
            or not isinstance(self.alpha, int | float)
            or not math.isfinite(self.alpha)
            or self.alpha <= 0
        ):
            raise ValueError(f"LoraConfig.alpha={self.alpha!r} must be a finite number > 0")
        if isinstance(self.targets, str):
            raise ValueError(
                f"LoraConfig.targets={self.targets!r} must be a tuple of names, e.g. ('q', 'v')"
            )
        object.__setattr__(self, "targets", tuple(self.targets))
        if not self.targets:
            raise ValueError(f"LoraConfig.targets is empty; choose from {TARGETS}")
        for name in self.targets:
            if name not in IN_DIMS:
                raise ValueError(
                    f"LoraConfig.targets: {name!r} is not a projection; choose from {TARGETS}"
                )
        if len(set(self.targets)) != len(self.targets):
            raise ValueError(f"LoraConfig.targets={self.targets} names a projection twice")
        if self.dropout != 0:
            raise ValueError(
                f"LoraConfig.dropout={self.dropout!r}: only 0 is supported (no adapter dropout)"
            )

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def _split(name: str, seq: tuple) -> tuple[tuple, tuple]:
    """A stacked projection's shape or axis names (L, in..., out...) -> ((in...), (out...))."""
    n = IN_DIMS[name]
    return tuple(seq[1 : 1 + n]), tuple(seq[1 + n :])


def init_lora(rng: Array, cfg: ModelConfig, lora_cfg: LoraConfig) -> LoraParams:
    """Fresh adapters: A kaiming-uniform as PEFT draws it, B zero (so the model is unchanged).

    PEFT's `kaiming_uniform_(a=sqrt(5))` on A (r, fan_in) is U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
    fan_in = the product of the projection's input dims.
    """
    shapes = param_shapes(cfg).layers
    absent = [name for name in lora_cfg.targets if getattr(shapes, name) is None]
    if absent:
        raise ValueError(
            f"LoraConfig.targets={lora_cfg.targets}: {cfg.model_type} has no dense {absent} "
            "projection (its MLP is a mixture of experts); target q, k, v, o"
        )
    L, r = cfg.num_layers, lora_cfg.rank
    keys = jax.random.split(rng, len(lora_cfg.targets))
    adapters = {}
    for key, name in zip(keys, lora_cfg.targets, strict=True):
        ins, outs = _split(name, getattr(shapes, name).shape)
        bound = 1.0 / math.sqrt(math.prod(ins))
        a = jax.random.uniform(key, (L, *ins, r), jnp.float32, -bound, bound)
        adapters[name] = LowRank(a=a, b=jnp.zeros((L, r, *outs), jnp.float32))
    return LoraParams(scale=lora_cfg.scale, **adapters)


def lora_logical_axes(cfg: ModelConfig, lora_cfg: LoraConfig) -> LoraParams:
    """Logical axis names of `init_lora`'s tree, from `transformer.logical_axes`' projections:
    A (layers, in..., None), B (layers, None, out...); the rank axis is never split."""
    table = logical_axes(cfg).layers
    adapters = {}
    for name in lora_cfg.targets:
        ins, outs = _split(name, getattr(table, name))
        adapters[name] = LowRank(a=("layers", *ins, None), b=("layers", None, *outs))
    return LoraParams(scale=lora_cfg.scale, **adapters)


def _low_rank_product(a: Array, b: Array, name: str) -> Array:
    """A @ B over r, in f32: (..., in..., r) x (..., r, out...) -> (..., in..., out...)."""
    n_in = IN_DIMS[name]
    lead = a.shape[: a.ndim - n_in - 1]
    ins, outs, r = a.shape[len(lead) : -1], b.shape[len(lead) + 1 :], a.shape[-1]
    a2 = a.astype(jnp.float32).reshape(*lead, math.prod(ins), r)
    b2 = b.astype(jnp.float32).reshape(*lead, r, math.prod(outs))
    return (a2 @ b2).reshape(*lead, *ins, *outs)


def _expand_scale(scale: Array, n_in: int) -> Array:
    """(L, out...) -> (L, 1 x n_in, out...): broadcastable against (L, in..., out...)."""
    return scale.reshape(scale.shape[:1] + (1,) * n_in + scale.shape[1:])


def merge_layers(layers: Layers, lora: LoraParams) -> Layers:
    """`layers` with each adapted projection replaced by W + scale * A @ B (summed in f32, stored
    in W's dtype; int8 bases must be dequantised first). Works on the stacked layers and on one
    layer's slice alike (as inside a scan body)."""
    merged = {}
    for name in TARGETS:
        ad, w = getattr(lora, name), getattr(layers, name)
        if ad is None:
            continue
        if isinstance(w, Int8Weight):
            raise TypeError(f"merge_layers: projection {name!r} is int8; dequantize it first")
        delta = _low_rank_product(ad.a, ad.b, name)
        merged[name] = (w.astype(jnp.float32) + lora.scale * delta).astype(w.dtype)
    return dataclasses.replace(layers, **merged)


def quantize_int8(params: Params) -> Params:
    """The projections (q, k, v, o, gate, up, down) as `Int8Weight`s: symmetric, one scale per
    output channel (max |w| over the input dims / 127). Norms, biases, embeddings, the LM head
    and an MoE model's experts and router stay as they are. The forward accepts the result; the
    error per weight is at most scale/2."""
    out = {}
    for name in TARGETS:
        w = getattr(params.layers, name)
        if w is None:  # an MoE model's dense MLP: its experts stay as they are
            continue
        if isinstance(w, Int8Weight):
            raise TypeError(f"quantize_int8: projection {name!r} is already int8")
        n_in = IN_DIMS[name]
        w32 = w.astype(jnp.float32)
        amax = jnp.max(jnp.abs(w32), axis=tuple(range(1, 1 + n_in)))  # (L, out...)
        scale = jnp.where(amax > 0, amax / 127.0, 1.0)
        values = jnp.clip(jnp.round(w32 / _expand_scale(scale, n_in)), -127, 127)
        out[name] = Int8Weight(values=values.astype(jnp.int8), scale=scale)
    return dataclasses.replace(params, layers=dataclasses.replace(params.layers, **out))


def dequantize(params: Params, dtype=None) -> Params:
    """`params` with every `Int8Weight` projection turned back into an array of `dtype` (default:
    the dtype of the layer norms, i.e. the model's parameter dtype)."""
    dtype = dtype or params.layers.attn_norm.dtype
    out = {}
    for name in TARGETS:
        w = getattr(params.layers, name)
        if isinstance(w, Int8Weight):
            full = w.values.astype(jnp.float32) * _expand_scale(w.scale, IN_DIMS[name])
            out[name] = full.astype(dtype)
    return dataclasses.replace(params, layers=dataclasses.replace(params.layers, **out))


def merge_lora(params: Params, lora: LoraParams | None = None) -> Params:
    """Plain `Params` (no adapters, no int8) computing what `forward(params, ..., lora=lora)`
    computes (`lora` None: `params.lora`): int8 bases dequantised, each adapted projection
    merged. What the Hugging Face export writes."""
    lora = params.lora if lora is None else lora
    params = dequantize(without_adapters(params))
    if lora is None:
        return params
    return dataclasses.replace(params, layers=merge_layers(params.layers, lora))


def quantized_logical_axes(cfg: ModelConfig) -> Params:
    """`transformer.logical_axes` for a `quantize_int8` tree: int8 values as the weight, each
    scale on the weight's output axes."""
    base = logical_axes(cfg)
    out = {}
    for name in TARGETS:
        names = getattr(base.layers, name)
        if names is None:
            continue
        _, outs = _split(name, names)
        out[name] = Int8Weight(values=names, scale=("layers", *outs))
    return dataclasses.replace(base, layers=dataclasses.replace(base.layers, **out))


def adapter_config(lora: LoraParams) -> LoraConfig:
    """The `LoraConfig` of an adapter tree: its targets, rank and alpha (= scale x rank)."""
    targets = tuple(name for name in TARGETS if getattr(lora, name) is not None)
    rank = int(getattr(lora, targets[0]).a.shape[-1])
    return LoraConfig(rank=rank, alpha=lora.scale * rank, targets=targets)


def without_adapters(params: Params) -> Params:
    """The base model: `params` with the adapters off (the same buffers, nothing copied). The
    reference policy of a LoRA run."""
    return dataclasses.replace(params, lora=None)


def adapters_of(params: Any) -> LoraParams | None:
    """The LoRA adapters of a parameter tree: a `Params`' `lora`, None for other trees."""
    return getattr(params, "lora", None)


def trainable(params: Any) -> Any:
    """What an optimizer trains: the adapters when `params` (a `Params`) has them (the base is
    frozen), else all of `params` (any tree: a reward model's, a critic's)."""
    adapters = adapters_of(params)
    return params if adapters is None else adapters


def with_trainable(params: Any, values: Any) -> Any:
    """`params` with its `trainable` part replaced by `values`."""
    if adapters_of(params) is None:
        return values
    return dataclasses.replace(params, lora=values)


def adapter_logical_axes(cfg: ModelConfig, lora: LoraParams) -> LoraParams:
    """`lora_logical_axes` for the adapter tree `lora` (same structure, its own scale)."""
    names = lora_logical_axes(cfg, adapter_config(lora))
    return dataclasses.replace(names, scale=lora.scale)


def params_logical_axes(cfg: ModelConfig, params: Params) -> Params:
    """Logical axis names of `params` as it is: int8 projections (`quantized_logical_axes`),
    adapters (`lora_logical_axes`) and an absent `lm_head` (a critic's decoder) included."""
    quantized = isinstance(params.layers.q, Int8Weight)
    names = quantized_logical_axes(cfg) if quantized else logical_axes(cfg)
    lora = None if params.lora is None else adapter_logical_axes(cfg, params.lora)
    lm_head = None if params.lm_head is None else names.lm_head
    return dataclasses.replace(names, lora=lora, lm_head=lm_head)
