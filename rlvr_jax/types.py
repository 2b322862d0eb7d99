"""Data that crosses layers: a rollout and the reasons a row stops generating.

The lowest layer: pytree dataclasses and constants, no jax programs, so the model, the sampler, the
verifiers and the step can all name them without importing each other.

Shapes: N rows (B prompts x G samples), P prompt bucket, T generated columns.
"""

from __future__ import annotations

import dataclasses

import jax

Array = jax.Array

FINISH_LENGTH = 0  # ran to max_new_tokens
FINISH_EOS = 1  # sampled one of the end ids
FINISH_STOP = 2  # completed one of the stop sequences
FINISH_NAMES = ("length", "eos", "stop")


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
    # How busy the sampler kept its decode slots, per row so that rows of several rollouts
    # concatenate: the decode steps of the program that made the row, and the row's equal share
    # of its slot-steps (slots x emission steps / N). None where no sampler filled them.
    decode_steps_N: Array | None = None  # (N,) int32
    slot_steps_N: Array | None = None  # (N,) f32
    # An MoE policy's experts, in every layer, of the position whose logits each token was
    # sampled from (most probable first), as both decode loops record them; meaningless past a
    # row's end and on tokens not sampled (observations), which are not trained. None for a
    # dense model.
    experts_NTLk: Array | None = None  # (N, T, L, k) int32
