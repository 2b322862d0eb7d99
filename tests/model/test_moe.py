"""Qwen3-MoE and Qwen2-MoE: parity with `transformers` (logits and every layer's router choices),
weights in and out, the two dispatches against each other, and the KV cache."""

import dataclasses
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from rlvr_jax.model import config as config_lib
from rlvr_jax.model import hf, kv_cache, moe
from rlvr_jax.model import transformer as tf
from tests.model.hf_fixtures import make_tiny_hf

KINDS = ["qwen3_moe", "qwen2_moe"]


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


def test_logits_and_router_choices_match_transformers(tiny):
    kind, model, params, cfg = tiny
    tokens, mask = _left_padded_batch(0, [13, 9, 4, 1], T=13)
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(tokens),
            attention_mask=torch.tensor(mask.astype(np.int64)),
            output_router_logits=True,
        )
    positions = tf.positions_from_mask(jnp.asarray(mask))
    ours, _ = tf.forward(params, jnp.asarray(tokens), positions, cfg, mask_BT=jnp.asarray(mask))
    diff = np.abs(np.asarray(ours) - out.logits.numpy())[mask]
    assert diff.max() <= 1e-4, (kind, diff.max())
    choices = np.asarray(tf.router_choices(params, jnp.asarray(tokens), positions, cfg, mask))
    assert choices.shape == (cfg.num_layers, 4, 13, 2)
    for layer, logits in enumerate(out.router_logits):
        probs = torch.softmax(logits.float(), dim=-1)
        want = torch.topk(probs, cfg.num_experts_per_tok, dim=-1).indices.numpy()
        np.testing.assert_array_equal(choices[layer][mask], want.reshape(4, 13, -1)[mask])
    # The routing really spreads over the experts (otherwise the choice parity is vacuous).
    assert len(np.unique(choices[:, mask])) == cfg.num_experts
    assert (cfg.model_type, cfg.qk_norm, cfg.qkv_bias, cfg.norm_topk_prob) == {
        "qwen3_moe": ("qwen3_moe", True, False, True),
        "qwen2_moe": ("qwen2_moe", False, True, False),
    }[kind]
    assert (cfg.shared_expert_dim > 0) == (kind == "qwen2_moe")


def test_load_balancing_loss_equals_transformers(tiny):
    kind, model, params, cfg = tiny
    tokens, mask = _left_padded_batch(3, [11, 6, 2], T=11)
    mask_t = torch.tensor(mask.astype(np.int64))
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(tokens), attention_mask=mask_t, output_router_logits=True
        )
    loss_fn = importlib.import_module(type(model).__module__).load_balancing_loss_func
    want = float(loss_fn(out.router_logits, cfg.num_experts, cfg.num_experts_per_tok, mask_t))
    positions = tf.positions_from_mask(jnp.asarray(mask))
    routed, _ = tf.routing(params, jnp.asarray(tokens), positions, cfg, mask_BT=jnp.asarray(mask))
    flat = jax.tree.map(lambda a: a.reshape(cfg.num_layers, 3 * 11, -1), routed)
    ours = float(moe.load_balancing_loss(flat.probs_NE, flat.experts_Nk, mask.reshape(-1)))
    assert abs(ours - want) < 1e-5, (kind, ours, want)
    assert ours > cfg.num_experts_per_tok  # a random router is not balanced


def test_cached_decoding_equals_full_forward_step_by_step(tiny):
    _, _, params, cfg = tiny
    prompt, new = 7, 5
    tokens, mask = _left_padded_batch(1, [12, 9, 8], T=prompt + new)
    positions = tf.positions_from_mask(jnp.asarray(mask))
    full, _ = tf.forward(params, jnp.asarray(tokens), positions, cfg, mask_BT=jnp.asarray(mask))
    cache = kv_cache.init_cache(cfg, batch=3, num_slots=16)
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
    cached = np.concatenate([np.asarray(c) for c in chunks], axis=1)
    np.testing.assert_allclose(cached[mask], np.asarray(full)[mask], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_export_round_trip_through_transformers(kind, tmp_path):
    cfg = config_lib.PRESETS["tiny-moe"].replace(
        model_type=kind,
        vocab_size=128,
        qkv_bias=kind == "qwen2_moe",
        qk_norm=kind == "qwen3_moe",
        norm_topk_prob=kind == "qwen3_moe",
        shared_expert_dim=24 if kind == "qwen2_moe" else 0,
        tie_embeddings=kind == "qwen2_moe",
    )
    params = tf.init_params(jax.random.key(1), cfg)
    # Non-trivial norms, biases and routers, so a dropped or swapped tensor would show.
    params = jax.tree.map(lambda x: x + 0.05 * jnp.cos(jnp.arange(x.size).reshape(x.shape)), params)
    out = hf.save_hf(params, cfg, tmp_path / "export")
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(model).__name__ == {"qwen3_moe": "Qwen3MoeForCausalLM"}.get(
        kind, "Qwen2MoeForCausalLM"
    )
    tokens = np.random.default_rng(0).integers(0, 128, (2, 9))
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(tokens)).logits.numpy()
    ours, _ = tf.forward(params, jnp.asarray(tokens), jnp.broadcast_to(jnp.arange(9), (2, 9)), cfg)
    assert np.abs(np.asarray(ours) - ref).max() <= 1e-4
    reloaded, cfg2 = hf.load_hf(out)
    assert cfg2 == cfg
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(reloaded), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _batch(cfg, B=3, T=11, seed=0):
    tokens, mask = _left_padded_batch(seed, [T, T - 4, 3][:B], T, cfg.vocab_size)
    return jnp.asarray(tokens), tf.positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask)


@pytest.mark.parametrize("dispatch", ["ragged", "blocked"])
def test_dispatch_equals_dense_forward_and_gradient(dispatch):
    cfg = config_lib.PRESETS["tiny-moe"].replace(moe_dispatch=dispatch)
    params = tf.init_params(jax.random.key(0), cfg)
    tokens, positions, mask = _batch(cfg)

    def loss(p, c):
        logits, _ = tf.forward(p, tokens, positions, c, mask_BT=mask)
        return jnp.sum(jax.nn.log_softmax(logits)[..., 5] * mask)

    dense = cfg.replace(moe_dispatch="dense")
    (la, ga), (lb, gb) = (jax.value_and_grad(loss)(params, c) for c in (cfg, dense))
    np.testing.assert_allclose(float(la), float(lb), rtol=1e-6)
    for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5, rtol=1e-5)
    # Gradients reach the weights of exactly the experts some token was routed to, through the
    # grouped matmuls, and the router.
    expert_grad = np.abs(np.asarray(ga.layers.moe.gate)).sum(axis=(2, 3))
    choices = np.asarray(tf.router_choices(params, tokens, positions, cfg, mask))
    used = np.zeros_like(expert_grad, bool)
    for layer in range(cfg.num_layers):
        used[layer, np.unique(choices[layer])] = True
    np.testing.assert_array_equal(expert_grad > 0, used)
    assert used.sum() > cfg.num_layers
    assert np.abs(np.asarray(ga.layers.moe.router)).sum() > 0
    g_remat = jax.grad(loss)(params, cfg.replace(remat=True))
    for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(g_remat), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)


def test_router_renormalises_the_top_k_only_when_configured():
    cfg = config_lib.PRESETS["tiny-moe"]
    h = jax.random.normal(jax.random.key(0), (5, cfg.embed_dim))
    w = jax.random.normal(jax.random.key(1), (cfg.embed_dim, cfg.num_experts))
    r = moe.route(h, w, cfg)
    probs = np.asarray(jax.nn.softmax(h @ w, axis=-1))
    top = np.sort(probs, axis=-1)[:, ::-1][:, :2]
    np.testing.assert_allclose(np.asarray(r.weights_Nk), top / top.sum(-1, keepdims=True), 1e-5)
    np.testing.assert_array_equal(np.asarray(r.experts_Nk), np.argsort(-probs, axis=-1)[:, :2])
    raw = moe.route(h, w, cfg.replace(norm_topk_prob=False))
    np.testing.assert_allclose(np.asarray(raw.weights_Nk), top, rtol=1e-5)


def test_a_token_output_does_not_depend_on_the_rest_of_the_batch():
    # Dropless dispatch: row 0 alone and row 0 beside other rows give the same logits.
    cfg = config_lib.PRESETS["tiny-moe"]
    assert moe.resolve_dispatch(cfg.moe_dispatch) == "blocked"  # on this CPU
    params = tf.init_params(jax.random.key(2), cfg)
    tokens, positions, mask = _batch(cfg, B=3)
    both, _ = tf.forward(params, tokens, positions, cfg, mask_BT=mask)
    alone, _ = tf.forward(params, tokens[:1], positions[:1], cfg, mask_BT=mask[:1])
    np.testing.assert_allclose(np.asarray(both[:1]), np.asarray(alone), atol=1e-5)


def test_published_qwen3_30b_a3b_parameter_count():
    cfg = config_lib.PRESETS["qwen3-30b-a3b"]
    # The model card: 30.5B parameters, 29.9B non-embedding, 3.3B activated (8 of 128 experts).
    total = tf.count_params(tf.param_shapes(cfg))
    assert total == 30_532_122_624
    assert sum(int(np.prod(s)) for s in hf.hf_tensor_shapes(cfg).values()) == total
    embeddings = 2 * cfg.vocab_size * cfg.embed_dim
    assert abs(total - embeddings - 29.9e9) < 0.05e9
    per_expert = 3 * cfg.embed_dim * cfg.moe_mlp_dim * cfg.num_layers
    active = total - (cfg.num_experts - cfg.num_experts_per_tok) * per_expert
    assert abs(active - 3.3e9) < 0.06e9
    axes = jax.tree.leaves(tf.logical_axes(cfg), is_leaf=lambda x: isinstance(x, tuple))
    shapes = jax.tree.leaves(tf.param_shapes(cfg))
    assert [len(a) for a in axes] == [len(s.shape) for s in shapes]


def test_bad_moe_configs_are_named():
    tiny = config_lib.PRESETS["tiny-moe"]
    with pytest.raises(ValueError, match="num_experts_per_tok=9"):
        tiny.replace(num_experts_per_tok=9)
    with pytest.raises(ValueError, match="moe_dispatch='sorted'"):
        tiny.replace(moe_dispatch="sorted")
    with pytest.raises(ValueError, match="num_experts=0"):
        tiny.replace(num_experts=0)
    with pytest.raises(ValueError, match="shared_expert_dim=0"):
        tiny.replace(model_type="qwen2_moe")
    hf_cfg = config_lib.to_hf_config(tiny)
    with pytest.raises(ValueError, match=r"mlp_only_layers=\[1\]"):
        config_lib.from_hf_config({**hf_cfg, "mlp_only_layers": [1]})
    with pytest.raises(ValueError, match="decoder_sparse_step=2"):
        config_lib.from_hf_config({**hf_cfg, "decoder_sparse_step": 2})
    with pytest.raises(ValueError, match="routing: model_type=.qwen2. has no router"):
        cfg = config_lib.PRESETS["tiny"]
        tokens = jnp.zeros((1, 3), jnp.int32)
        tf.router_choices(tf.init_params(jax.random.key(0), cfg), tokens, tokens, cfg)


@pytest.mark.parametrize("skew", ["one_expert", "uneven", "uniform"])
def test_sorted_dispatches_equal_dense_on_any_routing(skew):
    # Routings that fill the blocks unevenly: all tokens on one expert, a few experts, spread.
    cfg = config_lib.PRESETS["tiny-moe"]
    N, E, k = 13, cfg.num_experts, cfg.num_experts_per_tok
    w = jax.tree.map(lambda x: x[0], moe.init_moe(jax.random.key(0), cfg, 0.1, jnp.float32))
    h = jax.random.normal(jax.random.key(1), (N, cfg.embed_dim))
    rng = np.random.default_rng(0)
    if skew == "one_expert":
        experts = np.stack([np.full(N, 3), np.full(N, 5)], axis=1)
    elif skew == "uneven":
        experts = np.stack([rng.permutation(E)[:k] if n % 4 else [0, 1] for n in range(N)])
    else:
        experts = np.stack([rng.permutation(E)[:k] for _ in range(N)])
    routing = moe.Routing(
        jnp.asarray(experts, jnp.int32),
        jnp.asarray(rng.uniform(0.1, 1.0, (N, k)), jnp.float32),
        jnp.zeros((N, E)),
    )
    want = np.asarray(moe.dense_experts(h, routing, w))
    for fn in (moe.ragged_experts, moe.blocked_experts):
        np.testing.assert_allclose(np.asarray(fn(h, routing, w)), want, atol=1e-6)


def test_lora_and_int8_on_an_moe_model_leave_the_experts_alone():
    from rlvr_jax.model import lora as lora_lib

    cfg = config_lib.PRESETS["tiny-moe"]
    params = tf.init_params(jax.random.key(0), cfg)
    with pytest.raises(ValueError, match=r"no dense \['gate', 'up', 'down'\]"):
        lora_lib.init_lora(jax.random.key(1), cfg, lora_lib.LoraConfig())
    adapters = lora_lib.init_lora(jax.random.key(1), cfg, lora_lib.LoraConfig(targets=("q", "v")))
    adapters = jax.tree.map(lambda x: x + 0.01, adapters)
    tokens, positions, mask = _batch(cfg)
    with_lora = tf.forward(params, tokens, positions, cfg, mask_BT=mask, lora=adapters)[0]
    merged = lora_lib.merge_lora(params, adapters)
    np.testing.assert_allclose(
        np.asarray(tf.forward(merged, tokens, positions, cfg, mask_BT=mask)[0]),
        np.asarray(with_lora),
        atol=1e-4,
    )
    quantized = lora_lib.quantize_int8(params)
    assert quantized.layers.moe is params.layers.moe
    names = lora_lib.params_logical_axes(cfg, quantized)
    assert names.layers.moe.gate == ("layers", "expert", "embed", "mlp")
    logits = tf.forward(quantized, tokens, positions, cfg, mask_BT=mask)[0]
    assert np.isfinite(np.asarray(logits)).all()


def test_routing_statistics_by_hand():
    # Two layers, three tokens (the last one padding), E = 4, k = 2.
    experts = jnp.asarray([[[0, 1], [0, 2], [3, 3]], [[1, 2], [2, 1], [0, 0]]], jnp.int32)
    mask = jnp.asarray([True, True, False])
    lo, hi = moe.expert_load(experts, mask, 4)
    # Layer 0: expert 0 takes 2 of 4 assignments, 1 and 2 one each, 3 none; layer 1: 1 and 2 half.
    assert (float(lo), float(hi)) == (0.0, 0.5)
    uniform = jnp.full((2, 3, 4), 0.25)
    np.testing.assert_allclose(float(moe.router_entropy(uniform, mask)), np.log(4), rtol=1e-6)
    onehot = jax.nn.one_hot(jnp.zeros((2, 3), jnp.int32), 4)
    assert float(moe.router_entropy(onehot, mask)) == 0.0
    # Assignments of the real tokens over both layers: (2, 3, 3, 0), over 2 x 2 rows; uniform
    # probabilities make the loss k whatever the load.
    loss = moe.load_balancing_loss(uniform, experts, mask)
    np.testing.assert_allclose(float(loss), 4 * np.sum(np.array([2, 3, 3, 0]) / 4 * 0.25), 1e-6)
    assert float(loss) == 2.0
    skewed = jnp.asarray([0.7, 0.1, 0.1, 0.1])
    loss = moe.load_balancing_loss(jnp.broadcast_to(skewed, (2, 3, 4)), experts, mask)
    np.testing.assert_allclose(float(loss), 4 * np.sum(np.array([2, 3, 3, 0]) / 4 * skewed), 1e-6)
    other = experts.at[1, 1].set(jnp.asarray([1, 3]))  # token 1 differs in layer 1
    assert float(moe.routing_disagreement(experts, experts[:, :, ::-1], mask)) == 0.0
    assert float(moe.routing_disagreement(experts, other, mask)) == 0.5
    padded_only = experts.at[0, 2].set(jnp.asarray([1, 2]))  # a padding token differs
    assert float(moe.routing_disagreement(experts, padded_only, mask)) == 0.0


def test_decoding_with_a_cache_routes_every_token_as_the_full_forward():
    # The rollout's path (prefill, then one token per step on a KV cache) and the update's (one
    # full pass) choose the same experts for every token: disagreement exactly 0 in f32.
    cfg = config_lib.PRESETS["tiny-moe"]
    params = tf.init_params(jax.random.key(3), cfg)
    params = dataclasses.replace(
        params,
        layers=dataclasses.replace(
            params.layers,
            moe=dataclasses.replace(params.layers.moe, router=params.layers.moe.router * 50),
        ),
    )
    prompt, new = 6, 5
    tokens, mask = _left_padded_batch(4, [11, 8, 7], T=prompt + new, vocab=cfg.vocab_size)
    positions = tf.positions_from_mask(jnp.asarray(mask))
    full, _ = tf.routing(params, jnp.asarray(tokens), positions, cfg, mask_BT=jnp.asarray(mask))
    cache = kv_cache.init_cache(cfg, batch=3, num_slots=16)
    step = jax.jit(tf.routing, static_argnums=3)
    parts = []
    for a, b in [(0, prompt)] + [(t, t + 1) for t in range(prompt, prompt + new)]:
        routed, cache = step(params, tokens[:, a:b], positions[:, a:b], cfg, cache, mask[:, a:b])
        parts.append(routed.experts_Nk)
    cached = jnp.concatenate(parts, axis=2)
    L = cfg.num_layers
    flat = lambda x: x.reshape(L, -1, cfg.num_experts_per_tok)  # noqa: E731
    real = jnp.asarray(mask).reshape(-1)
    agree = moe.routing_disagreement(flat(cached), flat(full.experts_Nk), real)
    assert float(agree) == 0.0
    # It can fail: another router gives other choices.
    other, _ = tf.routing(
        tf.init_params(jax.random.key(4), cfg), tokens, positions, cfg, None, mask
    )
    assert float(moe.routing_disagreement(flat(other.experts_Nk), flat(cached), real)) > 0.5
    lo, hi = moe.expert_load(flat(full.experts_Nk), real, cfg.num_experts)
    assert 0.0 <= float(lo) < 1 / cfg.num_experts < float(hi) <= 0.5
