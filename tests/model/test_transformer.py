"""The decoder equals `transformers`, cached decoding equals the full pass, shapes match reality."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from rlvr_jax.model import config as config_lib
from rlvr_jax.model import hf, kv_cache
from rlvr_jax.model import transformer as tf
from tests.model.hf_fixtures import make_tiny_hf

KINDS = ["qwen2", "qwen3", "llama"]


def _left_padded_batch(seed: int, lengths: list[int], T: int, vocab: int = 128):
    rng = np.random.default_rng(seed)
    mask = np.zeros((len(lengths), T), bool)
    for b, n in enumerate(lengths):
        mask[b, T - n :] = True
    tokens = np.where(mask, rng.integers(1, vocab, (len(lengths), T)), 0)
    return tokens, mask


@pytest.fixture(scope="module", params=KINDS)
def tiny(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    model = make_tiny_hf(request.param, directory)
    params, cfg = hf.load_hf(directory)
    return request.param, model, params, cfg


def test_logits_match_transformers_on_left_padded_batch(tiny):
    kind, model, params, cfg = tiny
    tokens, mask = _left_padded_batch(0, [13, 9, 4, 1], T=13)
    with torch.no_grad():
        ref = model(
            input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64))
        ).logits.numpy()
    positions = tf.positions_from_mask(jnp.asarray(mask))
    ours, _ = tf.forward(params, jnp.asarray(tokens), positions, cfg, mask_BT=jnp.asarray(mask))
    diff = np.abs(np.asarray(ours) - ref)[mask]
    assert diff.max() <= 1e-4, (kind, diff.max())
    # The architecture features really are present (otherwise parity would be vacuous).
    assert (cfg.qkv_bias, cfg.qk_norm, cfg.rope_scaling is not None) == {
        "qwen2": (True, False, False),
        "qwen3": (False, True, False),
        "llama": (False, False, True),
    }[kind]


def test_cached_decoding_equals_full_forward_step_by_step(tiny):
    _, _, params, cfg = tiny
    prompt, new = 7, 6
    tokens, mask = _left_padded_batch(1, [13, 10, 8], T=prompt + new)
    positions = tf.positions_from_mask(jnp.asarray(mask))
    full, _ = tf.forward(params, jnp.asarray(tokens), positions, cfg, mask_BT=jnp.asarray(mask))
    cache = kv_cache.init_cache(cfg, batch=3, num_slots=24)
    step = jax.jit(tf.forward, static_argnums=3)
    logits, cache = step(
        params, tokens[:, :prompt], positions[:, :prompt], cfg, cache, mask[:, :prompt]
    )
    chunks = [logits]
    for t in range(prompt, prompt + new):
        logits, cache = step(
            params, tokens[:, t : t + 1], positions[:, t : t + 1], cfg, cache, mask[:, t : t + 1]
        )
        chunks.append(logits)
    assert int(cache.index) == prompt + new
    cached = np.concatenate([np.asarray(c) for c in chunks], axis=1)
    np.testing.assert_allclose(cached[mask], np.asarray(full)[mask], atol=1e-5, rtol=0)


def test_padding_does_not_change_real_tokens(tiny):
    _, _, params, cfg = tiny
    tokens, mask = _left_padded_batch(2, [5], T=5)
    padded = np.concatenate([np.full((1, 6), 0), tokens], axis=1)
    pmask = np.concatenate([np.zeros((1, 6), bool), mask], axis=1)
    a, _ = tf.forward(params, jnp.asarray(tokens), tf.positions_from_mask(mask), cfg)
    b, _ = tf.forward(
        params, jnp.asarray(padded), tf.positions_from_mask(pmask), cfg, mask_BT=jnp.asarray(pmask)
    )
    np.testing.assert_allclose(np.asarray(b)[:, 6:], np.asarray(a), atol=1e-5)
    assert np.isfinite(np.asarray(b)).all()


def test_remat_and_bf16_options(tiny):
    _, _, params, cfg = tiny
    tokens, mask = _left_padded_batch(3, [8, 5], T=8)
    positions = tf.positions_from_mask(mask)

    def loss(p, c):
        logits, _ = tf.forward(p, jnp.asarray(tokens), positions, c, mask_BT=jnp.asarray(mask))
        return jnp.sum(jax.nn.log_softmax(logits)[..., 0] * mask)

    g_plain = jax.grad(loss)(params, cfg)
    g_remat = jax.grad(loss)(params, cfg.replace(remat=True))
    for x, y in zip(jax.tree.leaves(g_plain), jax.tree.leaves(g_remat), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)
    full, _ = tf.forward(params, jnp.asarray(tokens), positions, cfg, mask_BT=jnp.asarray(mask))
    half, _ = tf.forward(
        params, jnp.asarray(tokens), positions, cfg.replace(dtype="bfloat16"), mask_BT=mask
    )
    assert half.dtype == jnp.float32  # logits stay f32 for the log-softmax
    assert np.abs(np.asarray(half) - np.asarray(full))[mask].max() < 0.1


# Published sizes (model cards): total parameters, and non-embedding where the card gives it.
PUBLISHED = {
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-7b": 7_615_616_512,
    "qwen3-0.6b": 596_049_920,
    "qwen3-8b": 8_190_735_360,
    "qwen3-32b": 32_762_123_264,  # the card: 32.8B
    "smollm2-135m": 134_515_008,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_eval_shape_reproduces_published_parameter_counts(name):
    cfg = config_lib.PRESETS[name]
    shapes = tf.param_shapes(cfg)
    assert tf.count_params(shapes) == PUBLISHED[name]
    # Every tensor a checkpoint of this architecture holds has a home in the tree.
    assert sum(int(np.prod(s)) for s in hf.hf_tensor_shapes(cfg).values()) == PUBLISHED[name]


def test_qwen3_cards_non_embedding_counts():
    # The Qwen3 cards state 0.44B, 6.95B and 31.2B non-embedding parameters (half a unit of the
    # last digit given is the tolerance).
    cards = [("qwen3-0.6b", 0.44e9, 0.005e9), ("qwen3-8b", 6.95e9, 0.005e9)]
    for name, expected, tolerance in [*cards, ("qwen3-32b", 31.2e9, 0.05e9)]:
        cfg = config_lib.PRESETS[name]
        total = tf.count_params(tf.param_shapes(cfg))
        embeddings = cfg.vocab_size * cfg.embed_dim * (1 if cfg.tie_embeddings else 2)
        assert abs(total - embeddings - expected) < tolerance


def test_logical_axes_cover_every_parameter():
    for name in ["qwen2.5-0.5b", "qwen3-0.6b", "smollm2-135m"]:
        cfg = config_lib.PRESETS[name]
        shapes = jax.tree.leaves(tf.param_shapes(cfg))
        axes = jax.tree.leaves(tf.logical_axes(cfg), is_leaf=lambda x: isinstance(x, tuple))
        assert [len(a) for a in axes] == [len(s.shape) for s in shapes]


def test_bad_config_values_are_named():
    with pytest.raises(ValueError, match="num_kv_heads=3"):
        config_lib.PRESETS["tiny"].replace(num_kv_heads=3)
    with pytest.raises(ValueError, match="dtype='float8'"):
        config_lib.PRESETS["tiny"].replace(dtype="float8")
