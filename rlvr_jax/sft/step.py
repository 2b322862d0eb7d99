"""The SFT step: token-mean negative log-likelihood of the response tokens.

Sequences are right-padded to the smallest of a few buckets that holds the batch (a few static
shapes, a few compilations). They are not packed: the decoder's attention mask has no segment ids,
so packed examples would attend to each other. Prompt and padding tokens are masked out of the
loss.
"""

# Dataclass fields carry their shapes (tokens_NS), which N815 would read as mixedCase.
# ruff: noqa: N815

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlvr_jax.model import lora as lora_lib
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import Params
from rlvr_jax.rl.logprobs import next_token_logprobs
from rlvr_jax.rl.state import TrainState

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SFTBatch:
    """Right-padded sequences and which next-token targets the loss counts."""

    tokens_NS: Array  # (N, S) int32
    mask_NS: Array  # (N, S) bool: real tokens
    loss_mask_NT: Array  # (N, S - 1) bool: target tokens_NS[:, t + 1] is a response token


def make_batch(
    ids: Sequence[Sequence[int]],
    prompt_lengths: Sequence[int],
    buckets: Sequence[int],
    pad_id: int,
    trained: Sequence[Sequence[bool]] | None = None,
) -> SFTBatch:
    """Pads sequences on the right to the smallest bucket that holds the longest (numpy arrays).

    `trained[i][t]` says whether id t of sequence i is a target of the loss (a multi-turn
    episode's model tokens, not its observations); None: every id after the prompt.

    Raises:
      ValueError: for a sequence longer than the largest bucket, or a prompt that leaves no
        response token.
    """
    sizes = sorted(int(b) for b in buckets)
    longest = max(len(s) for s in ids)
    if longest > sizes[-1]:
        raise ValueError(f"a sequence has {longest} tokens, more than the largest bucket {sizes}")
    S = next(b for b in sizes if b >= longest)
    tokens = np.full((len(ids), S), pad_id, np.int32)
    mask = np.zeros((len(ids), S), bool)
    loss_mask = np.zeros((len(ids), S - 1), bool)
    for i, (seq, p) in enumerate(zip(ids, prompt_lengths, strict=True)):
        if not 1 <= p < len(seq):
            raise ValueError(f"row {i}: prompt length {p} of a {len(seq)}-token sequence")
        tokens[i, : len(seq)] = seq
        mask[i, : len(seq)] = True
        # Position t predicts token t + 1: the targets p .. len - 1 are the response.
        loss_mask[i, p - 1 : len(seq) - 1] = True
        if trained is not None:
            if len(trained[i]) != len(seq):
                raise ValueError(f"row {i}: {len(trained[i])} trained flags for {len(seq)} ids")
            loss_mask[i, : len(seq) - 1] &= np.asarray(trained[i][1:], bool)
    return SFTBatch(tokens, mask, loss_mask)


def sft_loss(
    params: Params, batch: SFTBatch, model_cfg: ModelConfig, chunk: int = 256
) -> tuple[Array, Array]:
    """Token-mean NLL of the response tokens over the batch, and how many there are (f32)."""
    N, S = batch.tokens_NS.shape
    positions_NS = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (N, S))
    logp_NT, _ = next_token_logprobs(
        params, batch.tokens_NS, positions_NS, model_cfg, batch.mask_NS, 1, chunk
    )
    m_NT = batch.loss_mask_NT.astype(jnp.float32)
    num = jnp.sum(m_NT)
    return -jnp.sum(logp_NT * m_NT) / jnp.maximum(num, 1.0), num


def build_sft_step(
    model_cfg: ModelConfig,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    chunk: int = 256,
) -> Callable[[TrainState, SFTBatch], tuple[TrainState, dict[str, Array]]]:
    """The jitted update `(state, batch) -> (state, metrics)`; the state is donated."""

    def step(state: TrainState, batch: SFTBatch):
        # A LoRA policy trains its adapters only (`lora.trainable`), the base closed over.
        policy = lora_lib.trainable(state.params)

        def loss_of(p):
            return sft_loss(lora_lib.with_trainable(state.params, p), batch, model_cfg, chunk)

        (loss, num), grads = jax.value_and_grad(loss_of, has_aux=True)(policy)
        updates, opt_state = optimizer.update(grads, state.opt_state, policy)
        metrics = {
            "sft/loss": loss,
            "sft/tokens": num,
            "sft/grad_norm": optax.global_norm(grads),
            "sft/lr": schedule(state.step),
        }
        new = dataclasses.replace(
            state,
            step=state.step + 1,
            params=lora_lib.with_trainable(state.params, optax.apply_updates(policy, updates)),
            opt_state=opt_state,
        )
        return new, metrics

    return jax.jit(step, donate_argnums=0)
