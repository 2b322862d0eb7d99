"""Token log-probs and entropies from hidden states, chunked over time, in f32.

For a Qwen vocabulary (V = 151,936) the logits of a modest batch, N x T x V in f32, run to tens of
GiB (64 x 1024 x 151936 x 4 bytes = 40 GiB), and autodiff would keep them for the backward pass.
Here the time axis is cut into chunks of `chunk_size` and processed by `lax.map`, with the chunk
body under `jax.checkpoint`: the forward holds one chunk's logits at a time, and the backward
recomputes each chunk's logits from its hidden states instead of storing them. Peak memory is
O(N x chunk_size x V), compute is one extra unembedding matmul.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlvr_jax.model import sharding
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.grouped import grouped_routed_hidden_states
from rlvr_jax.model.moe import Routing
from rlvr_jax.model.transformer import Params, logits_from_hidden, routed_hidden_states

Array = jax.Array


def _chunk_logprobs(
    params: Params,
    h_NCD: Array,
    targets_NC: Array,
    cfg: ModelConfig,
    temperature: Array,
    seq_chunks: bool = False,
) -> tuple[Array, Array]:
    """Log-prob of each target and the entropy (both (N, C) f32) for one chunk of C steps;
    with `seq_chunks`, h is (N, seq, C, D), a chunk of each seq device's tokens, and the
    results (N, seq, C)."""
    if seq_chunks:
        N, S, C, D = h_NCD.shape
        logits = logits_from_hidden(params, h_NCD.reshape(N, S * C, D), cfg).reshape(N, S, C, -1)
    else:
        logits = logits_from_hidden(params, h_NCD, cfg)
    logits_NCV = sharding.constrain_vocab(logits) / temperature
    lse_NC = jax.nn.logsumexp(logits_NCV, axis=-1)
    target_logit_NC = jnp.take_along_axis(logits_NCV, targets_NC[..., None], axis=-1)[..., 0]
    logp_NCV = logits_NCV - lse_NC[..., None]
    entropy_NC = -jnp.sum(jnp.exp(logp_NCV) * logp_NCV, axis=-1)
    return target_logit_NC - lse_NC, entropy_NC


def token_logprobs(
    params: Params,
    h_NTD: Array,
    targets_NT: Array,
    cfg: ModelConfig,
    chunk_size: int = 256,
    temperature: float | Array = 1.0,
) -> tuple[Array, Array]:
    """log p(targets) and the entropy of p at every position, from final hidden states.

    p is `softmax(logits / temperature)`, the distribution the sampler draws from at that
    temperature, so these log-probs are comparable with the sampler's.

    Args:
      params: the weights (`embed` is the unembedding when `cfg.tie_embeddings`, else
        `lm_head`).
      h_NTD: final-norm hidden states (`transformer.hidden_states`); row t predicts
        `targets_NT[:, t]`.
      targets_NT: token ids whose log-probs are wanted.
      cfg: the architecture.
      chunk_size: time steps per chunk (static); T need not be a multiple. Memory scales with
        N x chunk_size x V.
      temperature: a Python float or a traced scalar (changing it does not recompile when passed
        as an array).

    Returns:
      logp_NT: f32 log-probs of the targets.
      entropy_NT: f32 entropy `-sum_v p_v log p_v` of each position's distribution.
      Both are differentiable with respect to `params` and `h_NTD`.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1")
    N, T, D = h_NTD.shape
    if sharding.seq_shards(T) > 1:
        return _split_token_logprobs(params, h_NTD, targets_NT, cfg, chunk_size, temperature)
    C = min(chunk_size, T)
    num_chunks = -(-T // C)
    pad = num_chunks * C - T
    # Padded steps compute logits of zero hidden states for target 0 and are sliced off.
    h_NTD = jnp.pad(h_NTD, ((0, 0), (0, pad), (0, 0)))
    targets_NT = jnp.pad(targets_NT, ((0, 0), (0, pad)))
    h_KNCD = h_NTD.reshape(N, num_chunks, C, D).transpose(1, 0, 2, 3)
    targets_KNC = targets_NT.reshape(N, num_chunks, C).transpose(1, 0, 2)
    temperature = jnp.asarray(temperature, jnp.float32)

    # prevent_cse=False: inside lax.map (a scan) CSE cannot undo the rematerialisation.
    chunk = jax.checkpoint(_chunk_logprobs, static_argnums=(3,), prevent_cse=False)
    logp_KNC, entropy_KNC = jax.lax.map(
        lambda xs: chunk(params, xs[0], xs[1], cfg, temperature), (h_KNCD, targets_KNC)
    )
    unchunk = lambda x_KNC: x_KNC.transpose(1, 0, 2).reshape(N, num_chunks * C)[:, :T]  # noqa: E731
    return unchunk(logp_KNC), unchunk(entropy_KNC)


def _split_token_logprobs(
    params: Params,
    h_NTD: Array,
    targets_NT: Array,
    cfg: ModelConfig,
    chunk_size: int,
    temperature: float | Array,
) -> tuple[Array, Array]:
    """`token_logprobs` of rows whose T tokens are split over the mesh's "seq" axis: each seq
    device's T / seq tokens are chunked on their own, (N, seq, T / seq) -> chunks of
    (N, seq, C), so that every chunk step holds C tokens of every device. The step gathers
    its chunk, seq x C tokens, over "seq" and computes their logits on each device's slice of
    the vocabulary, as the unsplit chunks do over "fsdp": the hidden states are gathered a
    chunk at a time, never the whole row, and the LM head stays split (gathering it over "seq"
    in place of the hidden states would hold V x D / (tensor x fsdp) of it, and of its f32
    gradient, on every device: for Qwen3-8B on fsdp = 1 that is the whole head, 1.2 + 2.3 GiB).
    Without this chunk order the compiler gathers every chunk at once: the whole row."""
    N, T, D = h_NTD.shape
    S = sharding.seq_shards(T)
    Ts = T // S
    C = min(chunk_size, Ts)
    num_chunks = -(-Ts // C)
    pad = num_chunks * C - Ts
    h = jnp.pad(h_NTD.reshape(N, S, Ts, D), ((0, 0), (0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets_NT.reshape(N, S, Ts), ((0, 0), (0, 0), (0, pad)))
    h_KNSCD = h.reshape(N, S, num_chunks, C, D).transpose(2, 0, 1, 3, 4)
    targets_KNSC = targets.reshape(N, S, num_chunks, C).transpose(2, 0, 1, 3)
    temperature = jnp.asarray(temperature, jnp.float32)

    chunk = jax.checkpoint(_chunk_logprobs, static_argnums=(3, 5), prevent_cse=False)
    logp_KNSC, entropy_KNSC = jax.lax.map(
        lambda xs: chunk(params, xs[0], xs[1], cfg, temperature, True), (h_KNSCD, targets_KNSC)
    )

    def unchunk(x_KNSC):
        x_NSK = x_KNSC.transpose(1, 2, 0, 3).reshape(N, S, num_chunks * C)
        return x_NSK[:, :, :Ts].reshape(N, T)

    return unchunk(logp_KNSC), unchunk(entropy_KNSC)


def completion_hidden_states(
    params: Params,
    tokens_NT: Array,
    positions_NT: Array,
    cfg: ModelConfig,
    mask_NT: Array | None = None,
    first_target: int = 1,
) -> Array:
    """The final-norm hidden states (N, T - first_target, D) that predict tokens
    `first_target .. T-1`: those of positions `first_target - 1 .. T - 2`, from one full causal
    pass. Arguments as `next_token_logprobs`."""
    return routed_completion_hidden_states(
        params, tokens_NT, positions_NT, cfg, mask_NT, first_target
    )[0]


def routed_completion_hidden_states(
    params: Params,
    tokens_NT: Array,
    positions_NT: Array,
    cfg: ModelConfig,
    mask_NT: Array | None = None,
    first_target: int = 1,
) -> tuple[Array, Routing | None]:
    """`completion_hidden_states`, and the routing of the same positions (those that predict
    tokens `first_target .. T-1`), fields (L, N, T - first_target, ...); None for a dense
    model."""
    T = tokens_NT.shape[1]
    if not 1 <= first_target < T:
        raise ValueError(f"first_target={first_target} must be in [1, T={T})")
    h_NTD, routed = routed_hidden_states(params, tokens_NT, positions_NT, cfg, mask_NT)
    if routed is not None:
        routed = jax.tree.map(lambda a: a[:, :, first_target - 1 : -1], routed)
    return h_NTD[:, first_target - 1 : -1], routed


def next_token_logprobs(
    params: Params,
    tokens_NT: Array,
    positions_NT: Array,
    cfg: ModelConfig,
    mask_NT: Array | None = None,
    first_target: int = 1,
    chunk_size: int = 256,
    temperature: float | Array = 1.0,
) -> tuple[Array, Array]:
    """Teacher-forced log-probs of `tokens_NT[:, first_target:]` given their prefixes.

    One full causal pass (`completion_hidden_states`), then `token_logprobs` on the hidden
    states of positions `first_target - 1 .. T - 2`, which predict tokens `first_target .. T-1`.
    With a prompt of P (left-padded) tokens followed by the completion, `first_target=P` gives
    the completion's log-probs, aligned with the completion tokens.

    Args:
      params, cfg: the model.
      tokens_NT: prompt and completion tokens.
      positions_NT: RoPE positions (`transformer.positions_from_mask` for left padding).
      mask_NT: real tokens (padding is never attended to); None means all real.
      first_target: the first position whose token is scored (static, >= 1).
      chunk_size, temperature: see `token_logprobs`.

    Returns:
      logp and entropy, each (N, T - first_target) f32.
    """
    h_NTD = completion_hidden_states(params, tokens_NT, positions_NT, cfg, mask_NT, first_target)
    return token_logprobs(params, h_NTD, tokens_NT[:, first_target:], cfg, chunk_size, temperature)


def grouped_completion_hidden_states(
    params: Params,
    tokens_NS: Array,
    positions_NS: Array,
    cfg: ModelConfig,
    mask_NS: Array,
    group_size: int,
    prompt_len: int,
) -> Array:
    """`completion_hidden_states(..., first_target=prompt_len)` for rows in groups that share a
    prompt, with each group's prompt run through the model once
    (`grouped.grouped_hidden_states`); arguments as `grouped_next_token_logprobs`."""
    return routed_grouped_completion_hidden_states(
        params, tokens_NS, positions_NS, cfg, mask_NS, group_size, prompt_len
    )[0]


def routed_grouped_completion_hidden_states(
    params: Params,
    tokens_NS: Array,
    positions_NS: Array,
    cfg: ModelConfig,
    mask_NS: Array,
    group_size: int,
    prompt_len: int,
) -> tuple[Array, Routing | None]:
    """`grouped_completion_hidden_states`, and the routing of the same positions, fields
    (L, N, S - prompt_len, ...) as `routed_completion_hidden_states`'; None for a dense
    model."""
    N, S = tokens_NS.shape
    G, P = group_size, prompt_len
    if N % G:
        raise ValueError(f"{N} rows do not split into groups of {G}")
    if not 1 <= P < S:
        raise ValueError(f"prompt_len={P} must be in [1, S={S})")
    first = lambda x: x[::G, :P]  # noqa: E731
    h_BPD, h_NTD, routed_p, routed_c = grouped_routed_hidden_states(
        params,
        first(tokens_NS),
        first(mask_NS),
        first(positions_NS),
        tokens_NS[:, P:],
        mask_NS[:, P:],
        positions_NS[:, P:],
        cfg,
    )
    # The last prompt position predicts the first completion token, for each of the G rows.
    h_last = jnp.repeat(h_BPD[:, -1:], G, axis=0)
    routed = None
    if routed_p is not None:
        routed = jax.tree.map(
            lambda p, c: jnp.concatenate([jnp.repeat(p[:, :, -1:], G, axis=1), c[:, :, :-1]], 2),
            routed_p,
            routed_c,
        )
    return jnp.concatenate([h_last, h_NTD[:, :-1]], axis=1), routed


def grouped_next_token_logprobs(
    params: Params,
    tokens_NS: Array,
    positions_NS: Array,
    cfg: ModelConfig,
    mask_NS: Array,
    group_size: int,
    prompt_len: int,
    chunk_size: int = 256,
    temperature: float | Array = 1.0,
) -> tuple[Array, Array]:
    """`next_token_logprobs(..., first_target=prompt_len)` for rows in groups that share a prompt,
    with each group's prompt run through the model once (`grouped.grouped_hidden_states`).

    Rows b * G .. b * G + G - 1 must hold the same first `prompt_len` tokens, mask and positions
    (one prompt's samples, as `sampling.bucket_and_pad` lays them out); only the group's first
    row's prompt is read.

    Returns:
      logp and entropy of the completion tokens, each (N, S - prompt_len) f32.
    """
    h_NTD = grouped_completion_hidden_states(
        params, tokens_NS, positions_NS, cfg, mask_NS, group_size, prompt_len
    )
    targets_NT = tokens_NS[:, prompt_len:]
    return token_logprobs(params, h_NTD, targets_NT, cfg, chunk_size, temperature)
