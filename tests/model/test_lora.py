"""LoRA adapters: zero B is the base model, adapters equal merged weights, gradients reach the
adapters only, an int8 base equals its dequantised weights, cached decoding equals the full pass."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

from rlvr_jax.model import config as config_lib
from rlvr_jax.model import grouped, kv_cache, sharding
from rlvr_jax.model import lora as lora_lib
from rlvr_jax.model import transformer as tf

# qwen2-like (q/k/v biases, untied head) and qwen3-like (q/k norms, tied): the adapter must be
# added where the weight's product is, before the bias and the norms.
CFGS = {
    "qwen2": config_lib.PRESETS["tiny"].replace(vocab_size=128, tie_embeddings=False),
    "qwen3": config_lib.PRESETS["tiny"].replace(
        model_type="qwen3", vocab_size=128, qkv_bias=False, qk_norm=True
    ),
}


def _params(cfg, seed=0):
    params = jax.device_get(tf.init_params(jax.random.key(seed), cfg))
    # Non-trivial norms and biases, so an adapter added in the wrong place would show.
    bump = lambda x: x + 0.05 * np.cos(np.arange(x.size).reshape(x.shape)).astype(x.dtype)
    return jax.tree.map(lambda x: jnp.asarray(bump(x)), params)


def _trained(lora, seed=1, std=0.05):
    """Adapters as after training: B nonzero (fresh ones have B = 0)."""
    rng = np.random.default_rng(seed)
    noise = lambda x: x + std * rng.standard_normal(x.shape).astype(np.float32)
    return jax.tree.map(lambda x: jnp.asarray(noise(np.asarray(x))), lora)


def _batch(B=2, T=9, vocab=128, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((B, T), bool)
    mask[1, :3] = False  # one left-padded row
    tokens = np.where(mask, rng.integers(1, vocab, (B, T)), 0)
    return jnp.asarray(tokens), jnp.asarray(mask), tf.positions_from_mask(jnp.asarray(mask))


@functools.partial(jax.jit, static_argnums=5)
def _forward(params, lora, tokens, mask, positions, cfg):
    return tf.forward(params, tokens, positions, cfg, mask_BT=mask, lora=lora)[0]


def _logits(params, cfg, lora=None, batch=None):
    tokens, mask, positions = batch or _batch()
    return np.asarray(_forward(params, lora, tokens, mask, positions, cfg))


@pytest.mark.parametrize("kind", sorted(CFGS))
def test_fresh_adapters_are_exactly_the_base_model(kind):
    cfg = CFGS[kind]
    params = _params(cfg)
    lora = lora_lib.init_lora(jax.random.key(1), cfg, lora_lib.LoraConfig(rank=4))
    base = _logits(params, cfg)
    np.testing.assert_array_equal(_logits(params, cfg, lora), base)
    # A is random (so training can start), B is zero.
    assert all(float(jnp.abs(getattr(lora, n).a).max()) > 0 for n in lora_lib.TARGETS)
    assert all(float(jnp.abs(getattr(lora, n).b).max()) == 0 for n in lora_lib.TARGETS)


@pytest.mark.parametrize("kind", sorted(CFGS))
def test_adapter_equals_explicitly_merged_weights_for_every_target(kind):
    cfg = CFGS[kind]
    params = _params(cfg)
    base = _logits(params, cfg)
    lora_cfg = lora_lib.LoraConfig(rank=3, alpha=5.0)
    all_on = _trained(lora_lib.init_lora(jax.random.key(2), cfg, lora_cfg))
    L = cfg.num_layers
    for target in lora_lib.TARGETS:
        # Only `target`'s B nonzero: one tree structure, so one compiled program for all targets.
        lora = dataclasses.replace(
            all_on,
            **{
                n: dataclasses.replace(ad, b=jnp.zeros_like(ad.b))
                for n in lora_lib.TARGETS
                if n != target and (ad := getattr(all_on, n)) is not None
            },
        )
        ad = getattr(lora, target)
        # The merge written out by hand (not `merge_lora`): W + alpha / r * A @ B per layer.
        w = getattr(params.layers, target)
        n_in = lora_lib.IN_DIMS[target]
        assert w.shape[1 : 1 + n_in] == ad.a.shape[1:-1] and w.shape[1 + n_in :] == ad.b.shape[2:]
        a = np.asarray(ad.a).reshape(L, -1, 3)
        b = np.asarray(ad.b).reshape(L, 3, -1)
        merged_w = np.asarray(w) + (5.0 / 3) * np.matmul(a, b).reshape(w.shape)
        merged = dataclasses.replace(
            params, layers=dataclasses.replace(params.layers, **{target: jnp.asarray(merged_w)})
        )
        ours = _logits(params, cfg, lora)
        np.testing.assert_allclose(ours, _logits(merged, cfg), atol=2e-5, rtol=0, err_msg=target)
        ours_merged = getattr(lora_lib.merge_lora(params, lora).layers, target)
        np.testing.assert_allclose(np.asarray(ours_merged), merged_w, atol=1e-6, err_msg=target)
        assert np.abs(ours - base).max() > 1e-3, target  # the adapter did change the model


def test_gradients_reach_only_the_adapters_and_match_the_merged_weight_gradient():
    cfg = CFGS["qwen2"]
    params = _params(cfg)
    lora_cfg = lora_lib.LoraConfig(rank=4, alpha=8.0, targets=("q", "o", "down"))
    lora = _trained(lora_lib.init_lora(jax.random.key(3), cfg, lora_cfg))
    tokens, mask, positions = _batch()

    def loss(logits):
        return jnp.sum(jax.nn.log_softmax(logits)[..., 5] * mask)

    def lora_loss(ad):  # the base is closed over
        return loss(tf.forward(params, tokens, positions, cfg, mask_BT=mask, lora=ad)[0])

    grads = jax.jit(jax.grad(lora_loss))(lora)
    assert jax.tree.structure(grads) == jax.tree.structure(lora)
    assert grads.k is None and grads.gate is None and grads.scale == 2.0
    # Chain rule through W' = W + s A B: dA = s dW' B^T, dB = s A^T dW'.
    merged = lora_lib.merge_lora(params, lora)
    g_merged = jax.grad(lambda p: loss(tf.forward(p, tokens, positions, cfg, mask_BT=mask)[0]))(
        merged
    )
    for name in lora_cfg.targets:
        ad, g_ad = getattr(lora, name), getattr(grads, name)
        L, r = cfg.num_layers, lora_cfg.rank
        dw = np.asarray(getattr(g_merged.layers, name)).reshape(L, ad.a[0].size // r, -1)
        a = np.asarray(ad.a).reshape(L, -1, r)
        b = np.asarray(ad.b).reshape(L, r, -1)
        want_a = 2.0 * dw @ b.transpose(0, 2, 1)
        want_b = 2.0 * a.transpose(0, 2, 1) @ dw
        scale = np.abs(want_b).max()
        assert scale > 1e-3
        np.testing.assert_allclose(np.asarray(g_ad.a).reshape(want_a.shape), want_a, atol=1e-5)
        np.testing.assert_allclose(np.asarray(g_ad.b).reshape(want_b.shape), want_b, atol=1e-5)


@pytest.mark.parametrize("kind", sorted(CFGS))
def test_int8_base_equals_its_dequantised_weights(kind):
    cfg = CFGS[kind]
    params = _params(cfg)
    lora = _trained(lora_lib.init_lora(jax.random.key(4), cfg, lora_lib.LoraConfig(rank=2)))
    quant = lora_lib.quantize_int8(params)
    assert quant.layers.q.values.dtype == jnp.int8 and quant.layers.q.scale.shape == (
        cfg.num_layers,
        cfg.num_heads,
        cfg.head_dim,
    )
    assert quant.layers.o.scale.shape == (cfg.num_layers, cfg.embed_dim)
    deq = lora_lib.dequantize(quant)
    # Rounding to the nearest of 255 levels: at most half a step per weight.
    for name in lora_lib.TARGETS:
        w, qw = getattr(params.layers, name), getattr(quant.layers, name)
        step = lora_lib._expand_scale(qw.scale, lora_lib.IN_DIMS[name])
        assert np.all(np.abs(np.asarray(getattr(deq.layers, name) - w)) <= step / 2 + 1e-7)
    ours = _logits(quant, cfg, lora)
    np.testing.assert_allclose(ours, _logits(deq, cfg, lora), atol=2e-5, rtol=0)
    np.testing.assert_allclose(ours, _logits(lora_lib.merge_lora(quant, lora), cfg), atol=2e-5)
    # And close to the unquantised model (the int8 error, not a bug-sized difference).
    assert np.abs(ours - _logits(params, cfg, lora)).max() < 0.05


def test_int8_base_under_jit_and_grad():
    cfg = CFGS["qwen3"]
    quant = lora_lib.quantize_int8(_params(cfg))
    lora = _trained(lora_lib.init_lora(jax.random.key(5), cfg, lora_lib.LoraConfig(rank=2)))
    tokens, mask, positions = _batch()
    loss = lambda ad, p: jnp.sum(tf.forward(p, tokens, positions, cfg, mask_BT=mask, lora=ad)[0])
    g_q = jax.jit(jax.grad(loss))(lora, quant)
    g_d = jax.grad(loss)(lora, lora_lib.dequantize(quant))
    for x, y in zip(jax.tree.leaves(g_q), jax.tree.leaves(g_d), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", sorted(CFGS))
def test_cached_decoding_with_adapters_equals_the_full_forward(kind):
    cfg = CFGS[kind]
    params = _params(cfg)
    lora = _trained(lora_lib.init_lora(jax.random.key(6), cfg, lora_lib.LoraConfig(rank=4)))
    prompt, new = 6, 5
    tokens, mask, positions = _batch(B=2, T=prompt + new, seed=3)
    full = _logits(params, cfg, lora, (tokens, mask, positions))
    step = jax.jit(
        lambda p, ad, t, pos, c, m: tf.forward(p, t, pos, cfg, c, m, lora=ad),
        donate_argnums=4,
    )
    cache = kv_cache.init_cache(cfg, batch=2, num_slots=16)
    logits, cache = step(
        params, lora, tokens[:, :prompt], positions[:, :prompt], cache, mask[:, :prompt]
    )
    chunks = [logits]
    for t in range(prompt, prompt + new):
        sl = slice(t, t + 1)
        logits, cache = step(params, lora, tokens[:, sl], positions[:, sl], cache, mask[:, sl])
        chunks.append(logits)
    cached = np.concatenate([np.asarray(c) for c in chunks], axis=1)
    m = np.asarray(mask)
    np.testing.assert_allclose(cached[m], full[m], atol=1e-5, rtol=0)
    assert np.abs(full - _logits(params, cfg, None, (tokens, mask, positions)))[m].max() > 1e-3


def test_grouped_hidden_states_with_adapters_equal_merged_weights():
    cfg = CFGS["qwen2"]
    params = _params(cfg)
    lora = _trained(lora_lib.init_lora(jax.random.key(7), cfg, lora_lib.LoraConfig(rank=4)))
    prompt, p_mask, p_pos = _batch(B=2, T=5, seed=4)
    comp, c_mask, _ = _batch(B=4, T=4, seed=5)
    c_mask = c_mask.at[:, 1:].set(True)
    p_len = jnp.repeat(p_mask.sum(-1), 2)
    c_pos = p_len[:, None] + jnp.arange(4)[None, :]
    args = (prompt, p_mask, p_pos, comp, c_mask, c_pos, cfg)
    ours = grouped.grouped_hidden_states(params, *args, lora=lora)
    merged = grouped.grouped_hidden_states(lora_lib.merge_lora(params, lora), *args)
    for x, y in zip(ours, merged, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=2e-5, rtol=0)
    base = grouped.grouped_hidden_states(params, *args)
    assert np.abs(np.asarray(ours[1]) - np.asarray(base[1])).max() > 1e-3


def test_fresh_adapter_draws_follow_peft_init():
    cfg = CFGS["qwen2"]
    lora = lora_lib.init_lora(jax.random.key(8), cfg, lora_lib.LoraConfig(rank=16, alpha=32))
    assert lora.scale == 2.0
    for name in lora_lib.TARGETS:
        a = np.asarray(getattr(lora, name).a)
        fan_in = math.prod(a.shape[1:-1])
        assert a.dtype == np.float32
        assert np.abs(a).max() <= 1 / math.sqrt(fan_in)
        assert np.abs(a).max() > 0.9 / math.sqrt(fan_in)  # uniform over the whole range
    assert lora.o.a.shape == (cfg.num_layers, cfg.num_heads, cfg.head_dim, 16)  # fan_in H * Dh


def test_logical_axes_place_adapters_on_a_mesh_and_keep_the_logits():
    cfg = config_lib.PRESETS["tiny"].replace(vocab_size=128, num_heads=4, num_kv_heads=2)
    lora_cfg = lora_lib.LoraConfig(rank=4)
    params = _params(cfg)
    lora = _trained(lora_lib.init_lora(jax.random.key(9), cfg, lora_cfg))
    axes = lora_lib.lora_logical_axes(cfg, lora_cfg)
    table = tf.logical_axes(cfg).layers
    for name in lora_lib.TARGETS:
        ad, w = getattr(axes, name), getattr(table, name)
        n_in = lora_lib.IN_DIMS[name]
        assert ad.a == (*w[: 1 + n_in], None) and ad.b == ("layers", None, *w[1 + n_in :])
    mesh = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=4, tensor=2))
    is_names = lambda x: isinstance(x, tuple) and all(n is None or isinstance(n, str) for n in x)
    shardings = jax.tree.map(
        lambda names, x: NamedSharding(mesh, sharding.logical_spec(names, x.shape, mesh)),
        axes,
        lora,
        is_leaf=is_names,
    )
    assert shardings.q.b.spec == jax.sharding.PartitionSpec(None, None, "tensor")
    assert shardings.q.a.spec == jax.sharding.PartitionSpec(None, "fsdp")
    placed = sharding.place(lora, shardings)
    np.testing.assert_allclose(
        _logits(params, cfg, placed), _logits(params, cfg, lora), atol=1e-5, rtol=0
    )
    q_axes = lora_lib.quantized_logical_axes(cfg)
    quant = lora_lib.quantize_int8(params)
    assert jax.tree.structure(quant) == jax.tree.structure(
        jax.tree.map(lambda n: 0, q_axes, is_leaf=is_names)
    )
    assert q_axes.layers.o.scale == ("layers", "embed")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(rank=0), "LoraConfig.rank=0"),
        (dict(rank=2.5), "LoraConfig.rank=2.5"),
        (dict(rank=True), "LoraConfig.rank=True"),
        (dict(alpha=0.0), "LoraConfig.alpha=0.0"),
        (dict(alpha=float("nan")), "LoraConfig.alpha=nan"),
        (dict(alpha="16"), "LoraConfig.alpha='16'"),
        (dict(targets=()), "LoraConfig.targets is empty"),
        (dict(targets=("q", "qkv")), "'qkv' is not a projection"),
        (dict(targets=("q_proj",)), "'q_proj' is not a projection"),
        (dict(targets="q"), "LoraConfig.targets='q'"),
        (dict(targets=("q", "q")), "names a projection twice"),
        (dict(dropout=0.1), "LoraConfig.dropout=0.1: only 0 is supported"),
    ],
)
def test_config_validation_names_the_field_and_value(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        lora_lib.LoraConfig(**kwargs)


def test_config_is_hashable_and_lists_become_tuples():
    cfg = lora_lib.LoraConfig(rank=4, alpha=8, targets=["v", "q"])
    assert cfg.targets == ("v", "q") and cfg.scale == 2.0
    assert hash(cfg) == hash(lora_lib.LoraConfig(rank=4, alpha=8, targets=("v", "q")))


def test_bfloat16_base_with_f32_adapters():
    cfg = CFGS["qwen2"].replace(dtype="bfloat16", param_dtype="bfloat16")
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), _params(CFGS["qwen2"]))
    lora = _trained(lora_lib.init_lora(jax.random.key(10), cfg, lora_lib.LoraConfig(rank=4)))
    tokens, mask, positions = _batch()
    loss = lambda ad: jnp.sum(tf.forward(params, tokens, positions, cfg, mask_BT=mask, lora=ad)[0])
    grads = jax.jit(jax.grad(loss))(lora)
    assert {x.dtype for x in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}
    assert all(bool(jnp.isfinite(x).all()) for x in jax.tree.leaves(grads))
    # The bf16 model with adapters is near the f32 model with the same adapters.
    f32 = _logits(_params(CFGS["qwen2"]), CFGS["qwen2"], lora)
    assert np.abs(_logits(params, cfg, lora) - f32)[np.asarray(mask)].max() < 0.1
