"""Context parallelism: a row's tokens split over the mesh's "seq" axis give the numbers of the
unsplit forward and backward, in every attention layout."""

import dataclasses
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rlvr_jax.model import attention as attention_lib
from rlvr_jax.model import config as config_lib
from rlvr_jax.model import lora as lora_lib
from rlvr_jax.model import sharding
from rlvr_jax.model import transformer as tf
from rlvr_jax.rl import logprobs, sharding_plan
from tests import test_sharding

N, T = 4, 32
ATOL = 1e-5
# The last one splits the heads over "tensor" inside the attention's shard_map.
MESHES = [dict(fsdp=2, seq=4), dict(fsdp=4, seq=2), dict(fsdp=2, seq=2, tensor=2)]


def _cfg(attention: str) -> config_lib.ModelConfig:
    # Blocks of 6 do not divide the chunks of 8 or 16 tokens a device holds: the blocks of the
    # split kernel straddle the chunk's end, those of the unsplit one the chunks' boundaries.
    return config_lib.PRESETS["tiny"].replace(
        vocab_size=64, attention=attention, attention_block=6, remat=True
    )


def _params(cfg, lora=False):
    params = tf.init_params(jax.random.key(0), cfg, std=0.1)
    if not lora:
        return params
    adapters = lora_lib.init_lora(jax.random.key(1), cfg, lora_lib.LoraConfig(rank=4))
    # Nonzero B, so that the adapters change the forward (small: larger adapters blow the
    # forward up, and float noise with it, on one device as on any mesh).
    b = lambda ab: dataclasses.replace(ab, b=ab.b + 0.002)  # noqa: E731
    adapters = jax.tree.map(b, adapters, is_leaf=lambda x: isinstance(x, tf.LowRank))
    return dataclasses.replace(params, lora=adapters)


def _flat_batch():
    """Left-padded rows with right padding after their answers."""
    tokens = jax.random.randint(jax.random.key(2), (N, T), 0, 64)
    starts, ends = np.array([0, 3, 7, 1]), np.array([32, 30, 25, 32])
    col = np.arange(T)[None]
    mask = (col >= starts[:, None]) & (col < ends[:, None])
    positions = tf.positions_from_mask(jnp.asarray(mask))
    return dict(tokens=tokens, mask=jnp.asarray(mask), positions=positions)


def _packed_batch():
    """Two packed sequences per row: one prompt with two completions (branches), one prompt
    with one, then padding; and a row of two plain sequences."""
    B = attention_lib.BRANCHES
    runs = [
        [(B, 6), (B + 1, 5), (B + 2, 7), (2 * B, 4), (2 * B + 1, 6), (0, 4)],
        [(B, 13), (2 * B, 15), (0, 4)],
    ]
    segs, positions = [], []
    for row in runs:
        seg, pos, prefix = [], [], 0
        for sid, n in row:
            start = 0 if sid % B == 0 else prefix
            seg += [sid] * n
            pos += list(range(start, start + n))
            prefix = n if sid % B == 0 else prefix
        segs.append(seg)
        positions.append(pos)
    segs = jnp.asarray(segs * 2, jnp.int32)
    tokens = jax.random.randint(jax.random.key(3), segs.shape, 0, 64)
    return dict(tokens=tokens, mask=segs > 0, positions=jnp.asarray(positions * 2), segments=segs)


def _loss(params, batch, cfg, layout):
    """Mean log-prob of every next token and the per-token log-probs, through the split or
    unsplit forward that the active mesh selects."""
    targets = jnp.roll(batch["tokens"], -1, axis=1)
    if layout == "grouped":
        G, Pn = 2, 8
        h_NTD = logprobs.grouped_completion_hidden_states(
            params, batch["tokens"], batch["positions"], cfg, batch["mask"], G, Pn
        )
        logp, _ = logprobs.token_logprobs(params, h_NTD, batch["tokens"][:, Pn:], cfg, 4)
        weight = batch["mask"][:, Pn:]
    else:
        seg = batch.get("segments")
        h, _ = tf.hidden_states(
            params,
            batch["tokens"],
            batch["positions"],
            cfg,
            None,
            batch["mask"],
            segment_ids_BT=seg,
        )
        logp, _ = logprobs.token_logprobs(params, h, targets, cfg, 4)
        weight = batch["mask"]
    return -jnp.sum(logp * weight) / jnp.sum(weight), logp


def _grouped_batch():
    """Two prompts of 8 tokens (left-padded), each with G = 2 completions of 32 tokens."""
    prompt = jax.random.randint(jax.random.key(4), (2, 8), 0, 64)
    prompt_mask = jnp.asarray([[False] * 3 + [True] * 5, [True] * 8])
    completion = jax.random.randint(jax.random.key(5), (N, T), 0, 64)
    lengths = np.array([32, 20, 9, 27])
    completion_mask = jnp.asarray(np.arange(T)[None] < lengths[:, None])
    tokens = jnp.concatenate([jnp.repeat(prompt, 2, 0), completion], 1)
    mask = jnp.concatenate([jnp.repeat(prompt_mask, 2, 0), completion_mask], 1)
    return dict(tokens=tokens, mask=mask, positions=tf.positions_from_mask(mask))


BATCHES = {"causal": _flat_batch, "packed": _packed_batch, "grouped": _grouped_batch}


def _step(params, batch, cfg, layout, mesh):
    """Loss, log-probs, gradients and the parameters after one SGD step, jitted on `mesh`
    (None: one device)."""
    opt = optax.sgd(0.5)

    def step(params, batch):
        (loss, logp), grads = jax.value_and_grad(_loss, has_aux=True)(params, batch, cfg, layout)
        updates, _ = opt.update(grads, opt.init(params), params)
        return loss, logp, grads, optax.apply_updates(params, updates)

    if mesh is None:
        return jax.device_get(jax.jit(step)(params, batch))
    shardings = sharding_plan.param_shardings(cfg, mesh, params)
    rows = sharding.rows_sharding(mesh, batch["tokens"].shape[0])
    params, batch = sharding.place(params, shardings), sharding.place(batch, rows)
    with sharding.activation_mesh(mesh):
        jitted = jax.jit(step, in_shardings=(shardings, rows))
        lowered = jitted.lower(params, batch)
    # The row really is split: the attention gathers its keys over "seq".
    assert "all-gather" in lowered.compile().as_text()
    return jax.device_get(lowered.compile()(params, batch))


def _assert_close(got, want):
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(x, y, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("mesh_shape", MESHES, ids=lambda m: "-".join(f"{k}{m[k]}" for k in m))
@pytest.mark.parametrize("attention", ["xla_blockwise", "dense"])
@pytest.mark.parametrize("layout", ["causal", "packed", "grouped"])
def test_split_update_equals_the_unsplit_one(layout, attention, mesh_shape):
    cfg = _cfg(attention)
    params, batch = _params(cfg), BATCHES[layout]()
    want = _step(params, batch, cfg, layout, None)
    got = _step(params, batch, cfg, layout, sharding.make_mesh(sharding.MeshConfig(**mesh_shape)))
    _assert_close(got, want)
    assert np.isfinite(want[0]) and np.abs(np.asarray(want[2].layers.q)).max() > 0


@pytest.mark.parametrize("attention", ["xla_blockwise", "dense"])
def test_one_long_row_splits_over_seq_and_its_width_over_fsdp(attention):
    """The case the axis is for: one row, which the row axes cannot split; its tokens go over
    "seq" and its residual stream's D over "fsdp"."""
    cfg = _cfg(attention)
    params = _params(cfg)
    batch = jax.tree.map(lambda x: x[1:2], _flat_batch())
    want = _step(params, batch, cfg, "causal", None)
    mesh = sharding.make_mesh(sharding.MeshConfig(fsdp=2, seq=4))
    _assert_close(_step(params, batch, cfg, "causal", mesh), want)

    def spec(x):
        with sharding.activation_mesh(mesh):
            return sharding.constrain_tokens(x)

    x = jax.device_put(jnp.zeros((1, T, cfg.embed_dim)), NamedSharding(mesh, P()))
    assert jax.jit(spec)(x).sharding.spec == P(None, "seq", "fsdp")


def test_split_update_with_lora_adapters_equals_the_unsplit_one():
    cfg = _cfg("xla_blockwise")
    params, batch = _params(cfg, lora=True), _flat_batch()
    want = _step(params, batch, cfg, "causal", None)
    mesh = sharding.make_mesh(sharding.MeshConfig(fsdp=2, seq=4))
    got = _step(params, batch, cfg, "causal", mesh)
    _assert_close(got, want)
    assert np.abs(np.asarray(want[2].lora.q.b)).max() > 0


def test_split_update_of_a_mixture_of_experts_equals_the_unsplit_one():
    cfg = config_lib.PRESETS["tiny-moe"].replace(
        vocab_size=64, attention="xla_blockwise", attention_block=6, remat=True
    )
    params, batch = _params(cfg), _flat_batch()
    want = _step(params, batch, cfg, "causal", None)
    mesh = sharding.make_mesh(sharding.MeshConfig(fsdp=2, seq=2, expert=2))
    _assert_close(_step(params, batch, cfg, "causal", mesh), want)


def test_the_seq_axis_of_the_mesh_and_its_layouts():
    cfg = sharding.MeshConfig(fsdp=-1, seq=4)
    assert cfg.axes == ("data", "fsdp", "seq", "tensor")
    assert cfg.shape(8) == (1, 2, 4, 1)
    assert sharding.MeshConfig(fsdp=1, seq=2, expert=2, tensor=2).axes == (
        "data",
        "fsdp",
        "seq",
        "expert",
        "tensor",
    )
    assert cfg.sizes(8) == {"data": 1, "fsdp": 2, "seq": 4, "tensor": 1, "expert": 1}
    with pytest.raises(ValueError, match="mesh.seq=0"):
        sharding.MeshConfig(seq=0)
    with pytest.raises(ValueError, match="seq=3"):
        sharding.MeshConfig(seq=3).shape(8)
    mesh = sharding.make_mesh(cfg)
    model = config_lib.PRESETS["tiny"]
    specs = sharding_plan.param_shardings(model, mesh, tf.param_shapes(model))
    # The weights are split over fsdp and seq together (no replicas on the seq devices).
    assert specs.layers.gate.spec == P(None, ("fsdp", "seq"))
    assert specs.embed.spec == P(("fsdp", "seq"))
    # The rollout's rows take the seq axis; a full forward splits its tokens over it.
    assert sharding.rows_sharding(mesh, 8).spec == P(("fsdp", "seq"))
    with sharding.activation_mesh(mesh):
        assert sharding.seq_shards(32) == 4 and sharding.seq_shards(30) == 1
        assert sharding.token_rows(8) == "fsdp"

    def forward(x):
        with sharding.activation_mesh(mesh):
            return sharding.constrain_tokens(x), sharding.constrain_tokens(x[:, :30])

    x = jax.device_put(jnp.zeros((8, 32, 4)), NamedSharding(mesh, P()))
    split, rows = jax.jit(forward)(x)
    assert split.sharding.spec == P("fsdp", "seq")
    assert rows.sharding.spec == P(("fsdp", "seq"))


def _gathered_activations(text: str) -> list[int]:
    """The element counts of the f32 all-gathers of rank 3 or more in an HLO text (activations;
    the weights' gathers are matrices)."""
    counts = []
    for line in text.splitlines():
        found = re.search(r"= f32\[([\d,]+)\]\{[\d,]*\} all-gather\(", line)
        if found and found.group(1).count(",") >= 2:
            counts.append(math.prod(int(d) for d in found.group(1).split(",")))
    return counts


def test_split_logprobs_do_not_gather_the_hidden_states(monkeypatch):
    """Each chunk step of a split row's log-probs holds C tokens of every seq device: it
    gathers that chunk (rows over "fsdp", tokens over "seq") and no more of the (N, T, D)
    hidden states. The unsplit chunking, on the same input, gathers all T tokens."""
    cfg = _cfg("xla_blockwise").replace(vocab_size=512)
    mesh = sharding.make_mesh(sharding.MeshConfig(fsdp=2, seq=4))
    params = tf.param_shapes(cfg)
    shardings = sharding_plan.param_shardings(cfg, mesh, params)
    Tn, C, D = 128, 8, cfg.embed_dim
    h_spec = NamedSharding(mesh, P("fsdp", "seq"))

    def loss(params, h, targets):
        with sharding.activation_mesh(mesh):
            logp, _ = logprobs.token_logprobs(params, h, targets, cfg, C)
        return jnp.sum(logp)

    def gathers():
        h = jax.ShapeDtypeStruct((N, Tn, D), jnp.float32, sharding=h_spec)
        targets = jax.ShapeDtypeStruct((N, Tn), jnp.int32, sharding=h_spec)
        grad = jax.jit(jax.grad(loss, argnums=(0, 1)), in_shardings=(shardings, h_spec, h_spec))
        return _gathered_activations(grad.lower(params, h, targets).compile().as_text())

    chunk_step = N * 4 * C * D  # every row, C tokens of each of the 4 seq devices
    split = gathers()
    assert split and max(split) <= chunk_step, split
    monkeypatch.setattr(sharding, "seq_shards", lambda num_tokens: 1)  # the unsplit chunking
    assert max(gathers()) >= N // 2 * Tn * D  # its rows' whole T


def test_split_logprobs_equal_the_unsplit_ones():
    cfg = _cfg("xla_blockwise")
    params = _params(cfg)
    h = jax.random.normal(jax.random.key(6), (N, T, cfg.embed_dim))
    targets = jax.random.randint(jax.random.key(7), (N, T), 0, 64)
    want = logprobs.token_logprobs(params, h, targets, cfg, 5)
    mesh = sharding.make_mesh(sharding.MeshConfig(fsdp=2, seq=4))

    @jax.jit
    def split(params, h, targets):
        with sharding.activation_mesh(mesh):
            return logprobs.token_logprobs(params, h, targets, cfg, 5)

    _assert_close(split(params, h, targets), want)


# ---------------------------------------------------------------------------------------------
# The whole step


@pytest.fixture(scope="module")
def long_task():
    """tests/test_sharding.py's task with answers of 8 tokens: the update's rows (8 prompt and
    8 answer tokens) and the completions alone both split over a seq axis of 2 or 4."""
    cfg, rl, ocfg, *rest = test_sharding.make_task()
    rl = dataclasses.replace(rl, sampler=dataclasses.replace(rl.sampler, max_new_tokens=8))
    # A larger Adam eps: float noise in a near-zero gradient entry is not blown up to a
    # learning rate's worth of parameter change (see test_sharding.PARAM_ATOL).
    return (cfg, rl, dataclasses.replace(ocfg, eps=1e-4), *rest)


@pytest.mark.parametrize("shared_prompt", [True, False])
def test_train_step_on_a_seq_mesh_equals_one_device(long_task, shared_prompt, monkeypatch):
    cfg, rl, *rest = long_task
    task = (cfg, dataclasses.replace(rl, shared_prompt_forward=shared_prompt), *rest)
    want_state, want_outs, _ = test_sharding._run(task)
    split_shapes, original = [], attention_lib.split_over_seq

    def split_over_seq(local, q, *args):
        split_shapes.append(q.shape)
        return original(local, q, *args)

    monkeypatch.setattr(attention_lib, "split_over_seq", split_over_seq)
    mesh = sharding.make_mesh(sharding.MeshConfig(fsdp=2, seq=4))
    state, outs, plan = test_sharding._run(task, mesh)
    # The update's forwards (the reference's and the policy's) split their rows' tokens.
    assert split_shapes
    for got, want in zip(outs, want_outs, strict=True):
        assert got.metrics.keys() == want.metrics.keys()
        for k in want.metrics:
            np.testing.assert_allclose(
                got.metrics[k], want.metrics[k], atol=test_sharding.ATOL, rtol=1e-5, err_msg=k
            )
    assert float(outs[0].metrics["reward/std"]) > 0
    for x, y in zip(test_sharding._arrays(state), test_sharding._arrays(want_state), strict=True):
        np.testing.assert_allclose(x, y, atol=test_sharding.PARAM_ATOL)
    assert plan.state.params.layers.gate.spec == P(None, ("fsdp", "seq"))


def test_a_length_the_seq_axis_does_not_divide_is_a_config_error():
    from configs import tiny
    from rlvr_jax.config_types import ConfigError
    from rlvr_jax.program import settings as settings_lib

    config = tiny.get_config()
    config.mesh.seq = 2
    config.mesh.fsdp = 4
    config.rl.sampler.max_new_tokens = 64
    config.data.buckets = (32,)
    config.model.attention_block = 64
    settings = settings_lib.settings_from_config(config)
    assert settings.mesh.seq == 2 and settings.mesh.axes == ("data", "fsdp", "seq", "tensor")
    config.rl.sampler.max_new_tokens = 63
    with pytest.raises(ConfigError, match=r"rl.sampler.max_new_tokens=63 is not a multiple of"):
        settings_lib.settings_from_config(config)
    config.rl.sampler.max_new_tokens = 64
    config.data.buckets = (32, 33)
    with pytest.raises(ConfigError, match=r"data.buckets\[1\]=33 .* mesh.seq=2"):
        settings_lib.settings_from_config(config)
    config.data.buckets = (32,)
    config.mesh.seq = 0
    with pytest.raises(ValueError, match="mesh.seq=0 must be an integer >= 1"):
        settings_lib.settings_from_config(config)
    # The rollout's rows split over seq too.
    config.mesh.seq = 8
    config.mesh.fsdp = 1
    config.train.batch_prompts = 3  # 12 rows
    settings = settings_lib.settings_from_config(config, check_devices=False)
    with pytest.raises(ConfigError, match="12 rows do not split over the mesh's data x fsdp x seq"):
        settings_lib.check_mesh(settings, 8)


@pytest.mark.parametrize("mesh_shape", MESHES[:2], ids=lambda m: "-".join(f"{k}{m[k]}" for k in m))
def test_packed_update_log_probs_on_a_seq_mesh_equal_one_device(mesh_shape, monkeypatch):
    """`packing.all_logprobs` (the packed update's forward: packed rows of 32 tokens, their
    predicting positions gathered, the chunked log-probs) and its gradient."""
    from rlvr_jax.rl import packing as packing_lib
    from tests.rl import test_packing

    cfg = test_packing.CFG.replace(attention="xla_blockwise", attention_block=4)
    rollout = test_packing._rollout()
    Pn = test_packing.P
    prompt_lengths, mask = np.asarray(rollout.prompt_lengths_N), np.asarray(rollout.mask_NT)
    plan = packing_lib.plan(
        prompt_lengths, mask, Pn, length=32, group_size=test_packing.G, row_multiple=4, block=4
    )
    tokens = jnp.concatenate([rollout.prompt_NP, rollout.tokens_NT], axis=1)
    valid = jnp.concatenate([rollout.prompt_NP > 0, rollout.mask_NT], axis=1)
    positions = tf.positions_from_mask(valid)
    weight = jax.random.uniform(jax.random.key(8), mask.shape) * mask
    params = _params(cfg)

    plan = jax.tree.map(jnp.asarray, plan)

    def loss(params, plan):
        logp, _ = packing_lib.all_logprobs(
            params, tokens, positions, rollout.mask_NT, plan, cfg, 8, 1.0
        )
        return jnp.sum(logp * weight), logp

    want = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, plan)
    split_shapes, original = [], attention_lib.split_over_seq

    def split_over_seq(local, q, *args):
        split_shapes.append(q.shape)
        return original(local, q, *args)

    monkeypatch.setattr(attention_lib, "split_over_seq", split_over_seq)
    mesh = sharding.make_mesh(sharding.MeshConfig(**mesh_shape))
    shardings = sharding_plan.param_shardings(cfg, mesh, params)
    with sharding.activation_mesh(mesh):
        grad = jax.jit(jax.value_and_grad(loss, has_aux=True), in_shardings=(shardings, None))
        got = grad(sharding.place(params, shardings), plan)
    assert split_shapes and split_shapes[0][1] == 32
    _assert_close(got, want)
