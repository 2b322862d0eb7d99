"""Prefill and one-token decode steps equal the full forward pass, in both layer loops and with
the attention read in windows or whole."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.model import decode, transformer
from rlvr_jax.model.config import PRESETS


# Each loop reads the cache in windows and whole; prefill runs once per row or once per group.
@pytest.mark.parametrize(
    "layer_loop, chunk, group", [("scan", 3, 1), ("unroll", 3, 2), ("scan", 0, 2), ("unroll", 0, 1)]
)
def test_prefill_and_decode_steps_equal_forward(layer_loop, chunk, group):
    cfg = PRESETS["tiny"].replace(qk_norm=True)
    params = transformer.init_params(jax.random.key(0), cfg, std=0.2)
    P, T = 8, 6  # prompt bucket, tokens fed after it
    lengths_N = np.repeat(np.array([5, 1, 8]), group)
    N = len(lengths_N)
    rng = np.random.default_rng(0)
    prompt_mask_NP = np.arange(P)[None] >= (P - lengths_N)[:, None]
    prompt_NP = np.where(prompt_mask_NP, np.repeat(rng.integers(1, 512, (3, P)), group, 0), 0)
    new_NT = rng.integers(1, 512, (N, T))
    tokens = np.concatenate([prompt_NP, new_NT], axis=1)
    mask = np.concatenate([prompt_mask_NP, np.ones((N, T), bool)], axis=1)
    full, _ = transformer.forward(
        params, jnp.asarray(tokens), transformer.positions_from_mask(mask), cfg, mask_BT=mask
    )
    full = np.asarray(full)

    S = P + T
    cache = decode.init_decode_cache(cfg, N, S, "float32", layer_loop)
    assert cache.unrolled == (layer_loop == "unroll") and cache.num_slots == S
    prefill = jax.jit(decode.prefill, static_argnums=(4, 5))
    logits, cache = prefill(params, prompt_NP, prompt_mask_NP, cache, cfg, group)
    np.testing.assert_allclose(np.asarray(logits), full[:, P - 1], atol=1e-4)

    windows = decode.attention_windows(P, S, chunk)
    assert len(windows) == (1 if chunk == 0 else 3)
    layers = decode.unstack_layers(params) if cache.unrolled else None
    step = jax.jit(decode.decode_step, static_argnums=(7, 8))
    for t in range(T):
        rope = transformer.rope_tables(jnp.asarray(lengths_N + t), cfg, jnp.float32)
        logits, cache = step(
            params,
            layers,
            cache,
            new_NT[:, t],
            rope,
            prompt_mask_NP,
            jnp.int32(P + t),
            cfg,
            windows,
        )
        np.testing.assert_allclose(np.asarray(logits), full[:, P + t], atol=1e-4, err_msg=str(t))
