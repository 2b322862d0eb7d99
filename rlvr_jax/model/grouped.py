"""The shared-prompt ("grouped") forward: B prompts and their N = B x G completions, each prompt
run once (`grouped_hidden_states`), over the decoder's blocks in `transformer.py`.

A completion row attends to its group's prompt and to its own prefix: one softmax over both,
by the dense reference `_grouped_attention` or blockwise (`attention.grouped_attention`, the two
key sets merged through their log-sum-exps), and over the mesh's "seq" axis by
`attention.split_over_seq`.

Shapes: B prompts, G completions per prompt, N = B x G completion rows, P prompt tokens, T
completion tokens, D embed, H query heads, K kv heads, Dh head dim, L layers.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from rlvr_jax.model import attention as attention_lib
from rlvr_jax.model import moe as moe_lib
from rlvr_jax.model import sharding
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import (
    _MASK_VALUE,
    LoraParams,
    Params,
    _out_and_routed_mlp,
    _qkv,
    _self_attend,
    rms_norm,
    rope_tables,
)

Array = jax.Array


def _grouped_attention(
    q_NTHd: Array,
    kp_BPKd: Array,
    vp_BPKd: Array,
    kc_NTKd: Array,
    vc_NTKd: Array,
    prompt_mask_BP: Array,
    mask_NTT: Array,
    cfg: ModelConfig,
) -> Array:
    """Attention of completion rows over their group's shared prompt and their own prefix.

    Row n = b * G + g attends to prompt b's keys (where real) and to its own completion keys under
    `mask_NTT`; one softmax over both. The prompt's keys are read per group, never repeated G times.
    """
    N, T, H, Dh = q_NTHd.shape
    B, P, K, _ = kp_BPKd.shape
    G = N // B
    S = kc_NTKd.shape[1]  # T, or the whole row's keys for a chunk of a seq-split row
    q = q_NTHd.reshape(B, G, T, K, H // K, Dh)
    kc = kc_NTKd.reshape(B, G, S, K, Dh)
    vc = vc_NTKd.reshape(B, G, S, K, Dh)
    f32 = jnp.float32
    scale = 1.0 / math.sqrt(Dh)
    s_prompt = jnp.einsum("bgtkhd,bpkd->bgkhtp", q, kp_BPKd, preferred_element_type=f32) * scale
    s_self = jnp.einsum("bgtkhd,bgskd->bgkhts", q, kc, preferred_element_type=f32) * scale
    s_prompt = jnp.where(prompt_mask_BP[:, None, None, None, None, :], s_prompt, _MASK_VALUE)
    s_self = jnp.where(mask_NTT.reshape(B, G, 1, 1, T, S), s_self, _MASK_VALUE)
    scores = jnp.concatenate([s_prompt, s_self], axis=-1)
    probs = jax.nn.softmax(scores, axis=-1).astype(vc.dtype)
    out = jnp.einsum("bgkhtp,bpkd->bgtkhd", probs[..., :P], vp_BPKd)
    out = out + jnp.einsum("bgkhts,bgskd->bgtkhd", probs[..., P:], vc)
    return out.reshape(N, T, H, Dh)


def _grouped_attend(prompt_mask_BP: Array, completion_mask_NT: Array, cfg: ModelConfig):
    """`attend(q, kp, vp, kc, vc)` of the completions over their prompts and own prefixes."""
    dense = attention_lib.resolve_attention(cfg, layout="grouped") == "dense"
    if sharding.seq_shards(completion_mask_NT.shape[1]) > 1:
        return _split_grouped_attend(prompt_mask_BP, completion_mask_NT, cfg, dense)
    if dense:
        T = completion_mask_NT.shape[1]
        mask_NTT = jnp.tril(jnp.ones((T, T), bool))[None] & completion_mask_NT[:, None, :]
        return lambda q, kp, vp, kc, vc: _grouped_attention(
            q, kp, vp, kc, vc, prompt_mask_BP, mask_NTT, cfg
        )
    block = cfg.attention_block
    return lambda q, kp, vp, kc, vc: attention_lib.grouped_attention(
        q, kp, vp, kc, vc, prompt_mask_BP, completion_mask_NT, block
    )


def _split_grouped_attend(
    prompt_mask_BP: Array, completion_mask_NT: Array, cfg: ModelConfig, dense: bool
):
    """`_grouped_attend` of completions whose tokens are split over the mesh's "seq" axis: the
    completions' keys are gathered (`attention.split_over_seq`), the prompts' stay whole on
    every seq device (prompts are short)."""
    block = cfg.attention_block

    def local(q, kc, vc, keys, whole, query_start):
        (valid_NS,) = keys
        kp, vp, prompt_mask = whole
        if dense:
            mask_NTS = attention_lib.causal_chunk_mask(valid_NS, q.shape[1], query_start)
            return _grouped_attention(q, kp, vp, kc, vc, prompt_mask, mask_NTS, cfg)
        return attention_lib.grouped_attention(
            q, kp, vp, kc, vc, prompt_mask, valid_NS, block, query_start=query_start
        )

    def attend(q, kp, vp, kc, vc):
        N, B = q.shape[0], kp.shape[0]
        prompt = (kp, vp, prompt_mask_BP)
        if sharding.token_rows(B) != sharding.token_rows(N):
            # The prompts split over the rows unlike their completions: each completion row
            # takes its own copy of its prompt's keys (small next to the completions').
            prompt = tuple(jnp.repeat(x, N // B, axis=0) for x in prompt)
        return attention_lib.split_over_seq(local, q, kc, vc, (completion_mask_NT,), prompt)

    return attend


def grouped_hidden_states(
    params: Params,
    prompt_BP: Array,
    prompt_mask_BP: Array,
    prompt_positions_BP: Array,
    completion_NT: Array,
    completion_mask_NT: Array,
    completion_positions_NT: Array,
    cfg: ModelConfig,
    *,
    lora: LoraParams | None = None,
) -> tuple[Array, Array]:
    """`transformer.hidden_states` of B prompts and their N = B x G completions, each prompt
    run once.

    Row n of the completions follows prompt n // G. The result equals `transformer.hidden_states`
    over the N rows [prompt n // G, completion n] split at the prompt (the tests hold it to
    that), at about B x P + N x T token positions of work instead of N x (P + T): a group's G
    samples share one prompt, so its layers, and their gradients, run once. Each group is laid
    out as one packed sequence of P + G x T positions (its prompt, then its completions), so
    every projection and the MLP are one matmul per weight, as in the flat forward; only the
    attention splits it.

    Args:
      params: the weights.
      prompt_BP, prompt_mask_BP, prompt_positions_BP: the prompts (left-padded), their real
        tokens and RoPE positions.
      completion_NT, completion_mask_NT, completion_positions_NT: the same for the completions;
        masked completion tokens are never attended to.
      cfg: the architecture.

    Returns:
      Final-norm hidden states (B, P, D) of the prompts and (N, T, D) of the completions.
    """
    hp, hc, _, _ = grouped_routed_hidden_states(
        params,
        prompt_BP,
        prompt_mask_BP,
        prompt_positions_BP,
        completion_NT,
        completion_mask_NT,
        completion_positions_NT,
        cfg,
        lora=lora,
    )
    return hp, hc


def grouped_routed_hidden_states(
    params: Params,
    prompt_BP: Array,
    prompt_mask_BP: Array,
    prompt_positions_BP: Array,
    completion_NT: Array,
    completion_mask_NT: Array,
    completion_positions_NT: Array,
    cfg: ModelConfig,
    *,
    lora: LoraParams | None = None,
) -> tuple[Array, Array, moe_lib.Routing | None, moe_lib.Routing | None]:
    """`grouped_hidden_states` (arguments and states as there), and the routing of the
    prompts' tokens, fields (L, B, P, ...), and of the completions', (L, N, T, ...), as
    `transformer.routing` returns it; both None for a dense model."""
    B, P = prompt_BP.shape
    N, T = completion_NT.shape
    if N % B:
        raise ValueError(f"{N} completion rows do not split into groups of the {B} prompts")
    dt = jnp.dtype(cfg.dtype)
    lora = params.lora if lora is None else lora
    prompt_mask_BP = prompt_mask_BP.astype(bool)
    attend_p = _self_attend(prompt_mask_BP, cfg)
    attend_c = _grouped_attend(prompt_mask_BP, completion_mask_NT.astype(bool), cfg)
    rope_p = rope_tables(prompt_positions_BP, cfg, dt)
    rope_c = rope_tables(completion_positions_NT, cfg, dt)
    x_p, x_c = params.embed[prompt_BP].astype(dt), params.embed[completion_NT].astype(dt)
    final = lambda x: rms_norm(x, params.final_norm, cfg.norm_eps)  # noqa: E731

    if sharding.seq_shards(T) == 1 and sharding.rows_split_alike(B, N):
        # Each group as one packed sequence, its prompt then its G completions: the projections
        # and the MLP run once over all of them, one matmul per weight, and only the attention
        # sees the parts. Two separate streams compile to about twice the program
        # (benchmarks/update_compile.py); packed, the rows of a group stay on one device.
        G = N // B

        def pack(p_BP, c_NT):
            return jnp.concatenate([p_BP, c_NT.reshape(B, G * T, *c_NT.shape[2:])], axis=1)

        def unpack(x):
            return x[:, :P], x[:, P:].reshape(N, T, *x.shape[2:])

        rope = (pack(rope_p[0], rope_c[0]), pack(rope_p[1], rope_c[1]))

        def packed_body(x, xs):
            w, ad = xs
            x = sharding.constrain_rows(x)
            q, k, v = _qkv(x, w, rope, cfg, ad)
            (qp, qc), (kp, kc), (vp, vc) = unpack(q), unpack(k), unpack(v)
            attn = pack(attend_p(qp, kp, vp), attend_c(qc, kp, vp, kc, vc))
            x, routed = _out_and_routed_mlp(x, attn, w, cfg, ad)
            return sharding.constrain_rows(x), routed

        if cfg.remat:
            packed_body = jax.checkpoint(packed_body, prevent_cse=False)
        x, routed = jax.lax.scan(packed_body, pack(x_p, x_c), (params.layers, lora))
        routed_p = routed_c = None
        if routed is not None:  # fields (L, B, P + G x T, ...): split as the states are
            routed_p = jax.tree.map(lambda a: jax.vmap(unpack)(a)[0], routed)
            routed_c = jax.tree.map(lambda a: jax.vmap(unpack)(a)[1], routed)
        return *unpack(final(x)), routed_p, routed_c

    # Prompt and completion rows split differently over the mesh (B prompts do not divide over
    # its row axes but N rows do), or the completions' tokens split over its "seq" axis: two
    # streams, each split its own way.
    def body(carry, xs):
        w, ad = xs
        xp, xc = (sharding.constrain_tokens(x) for x in carry)
        qp, kp, vp = _qkv(xp, w, rope_p, cfg, ad)
        qc, kc, vc = _qkv(xc, w, rope_c, cfg, ad)
        attn_p = attend_p(qp, kp, vp)
        attn_c = attend_c(qc, kp, vp, kc, vc)
        xp, routed_p = _out_and_routed_mlp(xp, attn_p, w, cfg, ad)
        xc, routed_c = _out_and_routed_mlp(xc, attn_c, w, cfg, ad)
        return (sharding.constrain_tokens(xp), sharding.constrain_tokens(xc)), (routed_p, routed_c)

    if cfg.remat:
        body = jax.checkpoint(body, prevent_cse=False)
    (xp, xc), (routed_p, routed_c) = jax.lax.scan(body, (x_p, x_c), (params.layers, lora))
    return final(xp), final(xc), routed_p, routed_c
