"""Models and references shared by the sampler tests.

Two kinds of model: tiny random `transformers` models (parity; the `tiny` fixture in conftest.py),
and a "scripted" one-layer model whose attention and MLP are zeroed, so that its next-token logits
are a table lookup on the current token: greedy chains and stop/think edge cases are then exact by
construction.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special
import torch

from rlvr_jax.model import transformer
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.sampling.host import bucket_and_pad


def scripted_model(table_VV: np.ndarray) -> tuple[transformer.Params, ModelConfig]:
    """A model whose logits after token a are `table_VV[a]` (up to RMSNorm's eps)."""
    V = table_VV.shape[0]
    cfg = ModelConfig(
        model_type="llama",
        vocab_size=V,
        embed_dim=V,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=8,
        mlp_dim=8,
        norm_eps=1e-9,
        tie_embeddings=False,
    )
    rng = np.random.default_rng(0)
    normal = lambda *shape: jnp.asarray(rng.normal(0, 0.1, shape), jnp.float32)
    zeros = lambda *shape: jnp.zeros(shape, jnp.float32)
    ones = lambda *shape: jnp.ones(shape, jnp.float32)
    layers = transformer.Layers(
        attn_norm=ones(1, V),
        q=normal(1, V, 2, 8),
        k=normal(1, V, 1, 8),
        v=normal(1, V, 1, 8),
        o=zeros(1, 2, 8, V),
        mlp_norm=ones(1, V),
        gate=normal(1, V, 8),
        up=normal(1, V, 8),
        down=zeros(1, 8, V),
    )
    # rms_norm(e_a) = sqrt(V) e_a, so lm_head = table / sqrt(V) gives logits = table[a].
    params = transformer.Params(
        embed=jnp.eye(V, dtype=jnp.float32),
        layers=layers,
        final_norm=ones(V),
        lm_head=jnp.asarray(table_VV / np.sqrt(V), jnp.float32),
    )
    return params, cfg


def chain_table(next_of: dict[int, int], V: int, default: int = 1) -> np.ndarray:
    """Logits that make greedy decoding follow `next_of` (10 nats of margin)."""
    table = np.zeros((V, V), np.float32)
    for a in range(V):
        table[a, next_of.get(a, default)] = 10.0
    return table


def left_pad(prompts, pad_id=0):
    return bucket_and_pad(prompts, (max(len(p) for p in prompts),), pad_id)


@jax.jit(static_argnames="cfg")
def _teacher_forced(params, prompt_NP, prompt_lengths_N, tokens_NT, mask_NT, cfg):
    Pl = prompt_NP.shape[1]
    pmask = jnp.arange(Pl)[None] >= (Pl - prompt_lengths_N)[:, None]
    tokens = jnp.concatenate([prompt_NP, tokens_NT], axis=1)
    mask = jnp.concatenate([pmask, mask_NT], axis=1)
    positions = transformer.positions_from_mask(mask)
    logits, _ = transformer.forward(params, tokens, positions, cfg, mask_BT=mask)
    return logits[:, Pl - 1 : -1]


def teacher_forced_logits(params, cfg, rollout) -> np.ndarray:
    """forward() over prompt + generated tokens: the logits each generated token was drawn from."""
    r = rollout
    return np.asarray(
        _teacher_forced(params, r.prompt_NP, r.prompt_lengths_N, r.tokens_NT, r.mask_NT, cfg=cfg)
    )


def teacher_forced_logp(params, cfg, rollout, temperature=1.0) -> np.ndarray:
    """log_softmax(forward / temperature) of the rollout's own tokens, (N, T), on the host."""
    x = teacher_forced_logits(params, cfg, rollout).astype(np.float64) / temperature
    logp = x - scipy.special.logsumexp(x, axis=-1, keepdims=True)
    return np.take_along_axis(logp, np.asarray(rollout.tokens_NT)[..., None], axis=-1)[..., 0]


def hf_greedy(model, prompt_NP, lengths_N, T, eos_ids=()):
    Pl = prompt_NP.shape[1]
    mask = torch.tensor(np.arange(Pl)[None] >= (Pl - lengths_N)[:, None]).long()
    with torch.no_grad():
        out = model.generate(
            torch.tensor(prompt_NP).long(),
            attention_mask=mask,
            max_new_tokens=T,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=list(eos_ids) or None,
        )
    out = out[:, Pl:].numpy()
    return np.pad(out, ((0, 0), (0, T - out.shape[1])))


PROMPTS = [[5, 9, 100, 3, 17], [42], [7, 7, 8, 120, 1, 2, 3, 4, 5, 6, 11], [64, 3]]


def reference_truncation(logits_V, temperature, top_k, top_p, min_p) -> np.ndarray:
    """The sampling distribution, written independently: sort, cut, renormalise."""
    x = np.asarray(logits_V, np.float64) / temperature
    keep = np.ones_like(x, bool)
    if top_k:
        keep &= x >= np.sort(x)[::-1][top_k - 1]
    p = np.where(keep, np.exp(x - x[keep].max()), 0.0)
    p /= p.sum()
    # top-p: keep i iff the mass of strictly more likely tokens is below top_p.
    above = np.array([p[(p > p[i]) & keep].sum() for i in range(len(p))])
    keep &= above < top_p
    p = np.where(keep, p, 0.0)
    keep &= p >= min_p * p.max()
    p = np.where(keep, p, 0.0)
    return p / p.sum()
