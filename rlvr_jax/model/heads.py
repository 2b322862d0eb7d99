"""A scalar head on final-norm hidden states: PPO's value head and the reward model's head.

The head is a linear map `h . w + b` to one number per position, kept in f32 whatever the model's
dtype: its output is a regression target (a return, a Bradley-Terry score) whose small
differences matter. It lives below both of its users (`rl.value`, `rewards.reward_model`) so
neither has to import the other.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ScalarHead:
    """`y = h . w + b` on a final-norm hidden state, in f32."""

    w_D: Array  # (D,) f32
    b: Array  # () f32


def init_scalar_head(embed_dim: int) -> ScalarHead:
    """A zero head: every output starts at 0 and its scale is learnt from the first batch."""
    return ScalarHead(jnp.zeros((embed_dim,), jnp.float32), jnp.zeros((), jnp.float32))


def apply_scalar_head(head: ScalarHead, h_ND: Array) -> Array:
    """The head on hidden states of any leading shape (..., D) -> (...) f32."""
    return jnp.einsum("...d,d->...", h_ND.astype(jnp.float32), head.w_D) + head.b
