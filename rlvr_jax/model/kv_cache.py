"""The key/value cache: one pytree of fixed-size buffers for the decoder's cached forward, the
sampler's prefill and its decode steps, written in place (donate it under jit).

Each layer's keys and values are laid out (N, K, S, Dh): attention of one new query per row is
then a batched matmul over (N, K) with no transpose, which is what a decode step spends its time
on. The layers are held either stacked, (L, N, K, S, Dh) arrays that `lax.scan` walks (the
decoder's `forward`, the sampler's "scan" loop), or as tuples of L (N, K, S, Dh) arrays (the
sampler's "unroll" loop, see `model/decode.py`).

`transformer.forward` needs to know which slots hold real tokens and where to write next, so its
cache carries `mask` and `index`. The sampler's cache carries neither: its loop already knows the
prompt mask and the step, and keeping the cache to the two buffers keeps its sharding to them
(`model/sharding.decode_cache_shardings`).

Shapes: L layers, N rows, K kv heads, S slots, Dh head dim.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from rlvr_jax.model.config import ModelConfig

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """Keys and values of every layer for N rows and S slots.

    Rows are left-padded, so all rows write the same slot at each step and one scalar `index`
    suffices; `mask` records which slots hold real tokens. Both are None in the sampler's cache.
    """

    k: Array | tuple[Array, ...]  # (L, N, K, S, Dh), or L arrays (N, K, S, Dh)
    v: Array | tuple[Array, ...]  # same as k
    mask: Array | None = None  # (N, S) bool: slot holds a real (non-padding) token
    index: Array | None = None  # () int32: the next slot to write

    @property
    def unrolled(self) -> bool:
        """Whether the layers are a tuple of per-layer arrays rather than one stacked array."""
        return isinstance(self.k, tuple)

    @property
    def num_slots(self) -> int:
        return self.k[0].shape[2] if self.unrolled else self.k.shape[3]

    @property
    def dtype(self) -> jnp.dtype:
        return (self.k[0] if self.unrolled else self.k).dtype


def init_cache(
    cfg: ModelConfig, batch: int, num_slots: int, dtype: jax.typing.DTypeLike | None = None
) -> KVCache:
    """An empty stacked cache with slot mask and index (for `transformer.forward`), of `num_slots`
    slots for `batch` rows, in `dtype` (default `cfg.dtype`)."""
    dt = jnp.dtype(cfg.dtype if dtype is None else dtype)
    shape = (cfg.num_layers, batch, cfg.num_kv_heads, num_slots, cfg.head_dim)
    return KVCache(
        k=jnp.zeros(shape, dt),
        v=jnp.zeros(shape, dt),
        mask=jnp.zeros((batch, num_slots), bool),
        index=jnp.zeros((), jnp.int32),
    )
