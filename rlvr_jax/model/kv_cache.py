"""The key/value cache: a pytree of fixed-size buffers, written in place (donate it under jit)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from rlvr_jax.model.config import ModelConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """Keys and values of every layer for B rows and S slots.

    Rows are left-padded, so all rows write the same slot at each step and one scalar `index`
    suffices; `mask` records which slots hold real tokens.
    """

    k: jax.Array  # (L, B, S, K, Dh)
    v: jax.Array  # (L, B, S, K, Dh)
    mask: jax.Array  # (B, S) bool: slot holds a real (non-padding) token
    index: jax.Array  # () int32: the next slot to write

    @property
    def num_slots(self) -> int:
        return self.k.shape[2]


def init_cache(cfg: ModelConfig, batch: int, num_slots: int, dtype: str | None = None) -> KVCache:
    """An empty cache of `num_slots` slots for `batch` rows, in `dtype` (default `cfg.dtype`)."""
    dt = jnp.dtype(dtype or cfg.dtype)
    shape = (cfg.num_layers, batch, num_slots, cfg.num_kv_heads, cfg.head_dim)
    return KVCache(
        k=jnp.zeros(shape, dt),
        v=jnp.zeros(shape, dt),
        mask=jnp.zeros((batch, num_slots), bool),
        index=jnp.zeros((), jnp.int32),
    )
