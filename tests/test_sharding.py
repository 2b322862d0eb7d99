"""The step on a device mesh: the same numbers as on one device, in the planned layouts."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.model import config as config_lib
from rlvr_jax.model import sharding
from rlvr_jax.model import transformer as tf
from rlvr_jax.rewards import arithmetic as ar
from rlvr_jax.rl import losses, sharding_plan
from rlvr_jax.rl import state as state_lib
from rlvr_jax.rl import train_step as ts
from rlvr_jax.sampling.config import SamplerConfig, sampling_params
from rlvr_jax.sampling.host import bucket_and_pad
from rlvr_jax.sampling.loop import generate, init_decode_cache
from rlvr_jax.types import Rollout

B, G = 8, 4
# f32 on CPU: a sharded program sums in another order; metrics and log-probs differ by ~1e-7.
ATOL = 2e-5
# Adam divides by sqrt(nu): a near-zero gradient entry turns float noise into up to ~1e-5 of
# parameter change (seen: 2.1e-5), against lr = 3e-3 per step for a real difference.
PARAM_ATOL = 1e-4


def _arrays(tree):
    raw = lambda x: jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x
    return [np.asarray(raw(x)) for x in jax.tree.leaves(tree)]


def _reward_fn(rollout: Rollout, targets) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Rewards that a random model earns in some rows and not others (the arithmetic reward is 0
    for every row of a fresh model, which would make the advantages, and the update, zero)."""
    del targets
    hits_N = jnp.sum((rollout.tokens_NT % 3 == 0) & rollout.mask_NT, axis=1)
    correct_N = (hits_N >= 2).astype(jnp.float32)
    return correct_N + 0.1 * hits_N, {"correct": correct_N}


def make_task():
    tok = Tokenizer.from_characters("0123456789+-*=")
    cfg = config_lib.PRESETS["tiny"].replace(vocab_size=32)
    problems = ar.generate_problems(256, seed=0, num_operands=2, max_digits=1, operators="+")

    def batch(i: int) -> ts.Batch:
        ps = problems[i * B : (i + 1) * B]
        prompt_NP, lengths_N = bucket_and_pad(
            [tok.encode(p.expression + "=") for p in ps], [8], tok.pad_id, G
        )
        answers = ar.encode_answers([p.answer for p in ps for _ in range(G)], 3)
        return ts.Batch(jnp.asarray(prompt_NP), jnp.asarray(lengths_N), answers)

    sampler = SamplerConfig(max_new_tokens=3, eos_ids=tok.eos_ids, pad_id=tok.pad_id)
    # A KL term, so that the reference parameters are part of the state.
    loss = losses.LossConfig(kl_beta=0.05, kl_estimator="k3")
    rl = ts.RLConfig(group_size=G, sampler=sampler, loss=loss)
    ocfg = state_lib.OptimConfig(learning_rate=3e-3, total_steps=100, schedule="constant")
    return cfg, rl, ocfg, _reward_fn, batch


@pytest.fixture(scope="module")
def task():
    return make_task()


def _fresh_state(cfg, ocfg):
    opt = state_lib.make_optimizer(ocfg)
    params = tf.init_params(jax.random.key(0), cfg)
    return opt, state_lib.init_train_state(params, opt, jax.random.key(1), use_reference=True)


def _run(task, mesh=None, steps=2):
    cfg, rl, ocfg, reward_fn, batch = task
    opt, state = _fresh_state(cfg, ocfg)
    sched = state_lib.learning_rate_schedule(ocfg)
    plan = None
    if mesh is not None:
        plan = sharding_plan.plan_step(state, cfg, mesh, B * G)
        state = sharding.place(state, plan.state)
    step = ts.build_train_step(cfg, rl, opt, sched, reward_fn, plan)
    outs = []
    for i in range(steps):
        b = batch(i) if plan is None else sharding.place(batch(i), plan.rows)
        state, out = step(state, b)
        assert all(x.sharding.is_fully_replicated for x in jax.tree.leaves(out))
        outs.append(jax.device_get(out))
    return state, outs, plan


@pytest.fixture(scope="module")
def one_device(task):
    return _run(task)


# ---------------------------------------------------------------------------------------------
# The mesh and the table


def test_mesh_config_takes_the_remainder_and_names_bad_sizes():
    assert sharding.MeshConfig().shape(8) == (1, 8, 1)
    assert sharding.MeshConfig(data=2, fsdp=-1, tensor=2).shape(8) == (2, 2, 2)
    assert sharding.MeshConfig(data=-1, fsdp=1, tensor=4).shape(8) == (2, 1, 4)
    with pytest.raises(ValueError, match="mesh.tensor=0"):
        sharding.MeshConfig(tensor=0)
    with pytest.raises(ValueError, match="at most one axis"):
        sharding.MeshConfig(data=-1, fsdp=-1)
    with pytest.raises(ValueError, match="needs 4 devices; there are 8"):
        sharding.MeshConfig(data=2, fsdp=2, tensor=1).shape(8)
    with pytest.raises(ValueError, match="not a multiple of 3"):
        sharding.MeshConfig(data=3).shape(8)
    mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


def test_the_config_has_a_mesh_section():
    from configs import tiny
    from rlvr_jax.program import settings as settings_lib

    config = tiny.get_config()
    assert dict(config.mesh) == {"data": 1, "fsdp": -1, "tensor": 1, "expert": 1, "seq": 1}
    config.mesh.tensor = 2
    assert settings_lib.settings_from_config(config).mesh == sharding.MeshConfig(1, -1, 2)
    config.mesh.data = -1
    with pytest.raises(ValueError, match="at most one axis may be -1"):
        settings_lib.settings_from_config(config)


def test_dimensions_the_mesh_does_not_divide_fall_back():
    mesh = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=2, tensor=4))
    cfg = config_lib.PRESETS["qwen2.5-0.5b"]  # 14 query heads, 2 kv heads
    specs = jax.tree.map(
        lambda s: s.spec, sharding_plan.param_shardings(cfg, mesh, tf.param_shapes(cfg))
    )
    assert specs.embed == P(("tensor", "fsdp"))  # vocab 151936 = 8 x 18992; D whole
    assert specs.layers.q == P(None, "fsdp")  # 14 heads: not a multiple of 4
    assert specs.layers.k == P(None, "fsdp")
    assert specs.layers.gate == P(None, "fsdp", "tensor")
    assert specs.layers.down == P(None, "tensor", "fsdp")
    assert specs.final_norm == P("fsdp")
    big = config_lib.PRESETS["qwen2.5-7b"]  # an untied LM head: (D, V), split on V
    assert sharding_plan.param_shardings(big, mesh, tf.param_shapes(big)).lm_head.spec == P(
        None, ("tensor", "fsdp")
    )
    mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=4, tensor=1))
    assert sharding.rows_sharding(mesh, 16).spec == P(("data", "fsdp"))
    assert sharding.rows_sharding(mesh, 4).spec == P("data")  # the longest dividing prefix
    assert sharding.rows_sharding(mesh, 3).spec == P()
    with pytest.raises(ValueError, match="'seq' has no rule"):
        sharding.logical_spec(("seq",), (8,), mesh)


def test_optimizer_state_is_sharded_like_the_parameters(task):
    cfg, _, ocfg, _, _ = task
    mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2))
    for master in (False, True):
        abstract = jax.eval_shape(
            lambda m=master: _fresh_state(cfg, dataclasses.replace(ocfg, master_weights=m))[1]
        )
        plan = sharding_plan.plan_step(abstract, cfg, mesh, B * G)
        is_params = lambda x: isinstance(x, tf.Params)  # noqa: E731
        mirrored = [
            t for t in jax.tree.leaves(plan.state.opt_state, is_leaf=is_params) if is_params(t)
        ]
        assert len(mirrored) == (3 if master else 2)  # (master,) mu, nu
        for tree in mirrored:
            assert tree == plan.state.params
        others = [
            t for t in jax.tree.leaves(plan.state.opt_state, is_leaf=is_params) if not is_params(t)
        ]
        assert others and all(t.spec == P() for t in others)  # step counts
        assert plan.state.params.layers.gate.spec == P(None, "fsdp", "tensor")
        assert plan.state.params.layers.k.spec == P(None, "fsdp", "tensor")
        assert plan.state.params.embed.spec == P(("tensor", "fsdp"))
        assert plan.state.ref_params == plan.state.params
        assert plan.state.rng.spec == P() and plan.rows.spec == P(("data", "fsdp"))


def test_vocabulary_matrices_and_their_gradients_stay_split():
    """The log-prob gradient on fsdp = 8 never builds a whole (V, D) matrix on a device: with the
    embedding and LM head split on D instead, XLA gathered the LM head and built both f32
    gradients whole (3 x V x D x 4 bytes of temporaries here, against 0.4 x with the V split)."""
    from rlvr_jax.rl.logprobs import next_token_logprobs

    cfg = config_lib.PRESETS["tiny"].replace(vocab_size=16384, tie_embeddings=False)
    mesh = sharding.make_mesh(sharding.MeshConfig(1, 8, 1))
    shapes = tf.param_shapes(cfg)
    shardings = sharding_plan.param_shardings(cfg, mesh, shapes)
    assert shardings.embed.spec == P("fsdp") and shardings.lm_head.spec == P(None, "fsdp")

    def loss(params, tokens_NT):
        with sharding.activation_mesh(mesh):
            positions_NT = jnp.broadcast_to(jnp.arange(tokens_NT.shape[1]), tokens_NT.shape)
            return jnp.sum(
                next_token_logprobs(params, tokens_NT, positions_NT, cfg, chunk_size=8)[0]
            )

    grad = jax.jit(
        jax.grad(loss),
        in_shardings=(shardings, sharding.rows_sharding(mesh, 8)),
        out_shardings=shardings,
    )
    compiled = grad.lower(shapes, jax.ShapeDtypeStruct((8, 16), jnp.int32)).compile()
    whole_f32_VD = cfg.vocab_size * cfg.embed_dim * 4
    assert compiled.memory_analysis().temp_size_in_bytes < whole_f32_VD


# ---------------------------------------------------------------------------------------------
# The step


# FSDP alone (as on a v5e-8), tensor alone (8 does not divide the 4 heads), and all three axes
# at once (data parallelism among them, as in tests/test_multihost.py); the host-verifier path
# below runs fsdp x tensor = 2 x 4.
@pytest.mark.parametrize("shape", [(1, 8, 1), (2, 2, 2), (1, 1, 8)])
def test_sharded_train_step_equals_one_device(task, one_device, shape):
    want_state, want_outs, _ = one_device
    mesh = sharding.make_mesh(sharding.MeshConfig(*shape))
    state, outs, plan = _run(task, mesh)
    for got, want in zip(outs, want_outs, strict=True):
        assert got.metrics.keys() == want.metrics.keys()
        for k in want.metrics:
            np.testing.assert_allclose(
                got.metrics[k], want.metrics[k], atol=ATOL, rtol=1e-5, err_msg=k
            )
        for x, y in zip(jax.tree.leaves(got.rows), jax.tree.leaves(want.rows), strict=True):
            np.testing.assert_allclose(x, y, atol=ATOL, rtol=1e-5)
    assert float(outs[0].metrics["reward/std"]) > 0  # the rollouts are not trivially equal
    for x, y in zip(_arrays(state), _arrays(want_state), strict=True):
        np.testing.assert_allclose(x, y, atol=PARAM_ATOL)
    for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(plan.state), strict=True):
        assert got.sharding.is_equivalent_to(want, got.ndim), (got.sharding, want)
    # What the mesh splits really is split: the MLP over "fsdp" or "tensor", the rows over
    # "data" and "fsdp" (pure data parallelism replicates the weights, pure tensor the rows).
    data, fsdp, tensor = shape
    assert (plan.state.params.layers.gate.spec != P()) == (fsdp * tensor > 1)
    assert (plan.rows.spec != P()) == (data * fsdp > 1)


@pytest.fixture(scope="module")
def moe_task():
    cfg, *rest = make_task()
    return (config_lib.PRESETS["tiny-moe"].replace(vocab_size=32), *rest)


@pytest.fixture(scope="module")
def moe_one_device(moe_task):
    return _run(moe_task)


# Experts split over "expert" composed with FSDP and tensor parallelism, and over "expert" alone.
@pytest.mark.parametrize("shape", [dict(fsdp=2, tensor=2, expert=2), dict(fsdp=1, expert=8)])
def test_sharded_moe_train_step_equals_one_device(moe_task, moe_one_device, shape):
    want_state, want_outs, _ = moe_one_device
    mesh = sharding.make_mesh(sharding.MeshConfig(data=1, **shape))
    assert mesh.shape["expert"] == shape["expert"]
    state, outs, plan = _run(moe_task, mesh)
    for got, want in zip(outs, want_outs, strict=True):
        for k in want.metrics:
            np.testing.assert_allclose(
                got.metrics[k], want.metrics[k], atol=ATOL, rtol=1e-5, err_msg=k
            )
        for x, y in zip(jax.tree.leaves(got.rows), jax.tree.leaves(want.rows), strict=True):
            np.testing.assert_allclose(x, y, atol=ATOL, rtol=1e-5)
    assert float(outs[0].metrics["reward/std"]) > 0
    for x, y in zip(_arrays(state), _arrays(want_state), strict=True):
        np.testing.assert_allclose(x, y, atol=PARAM_ATOL)
    # The experts really are split over "expert" (and D over "fsdp", their width over "tensor");
    # the rows over "fsdp" and "expert".
    experts = plan.state.params.layers.moe
    tensor = "tensor" if shape.get("tensor", 1) > 1 else None
    fsdp = "fsdp" if shape["fsdp"] > 1 else None
    padded = lambda spec: tuple(spec) + (None,) * (4 - len(spec))  # noqa: E731
    assert padded(experts.gate.spec) == (None, "expert", fsdp, tensor)
    assert padded(experts.down.spec) == (None, "expert", tensor, fsdp)
    assert "expert" in plan.rows.spec[0]


def test_the_expert_axis_of_the_mesh():
    cfg = sharding.MeshConfig(data=1, fsdp=-1, tensor=2, expert=2)
    assert cfg.axes == ("data", "fsdp", "expert", "tensor")
    assert cfg.shape(8) == (1, 2, 2, 2)
    assert cfg.sizes(8) == {"data": 1, "fsdp": 2, "expert": 2, "tensor": 2, "seq": 1}
    assert sharding.MeshConfig().sizes(8) == {
        "data": 1,
        "fsdp": 8,
        "tensor": 1,
        "expert": 1,
        "seq": 1,
    }
    with pytest.raises(ValueError, match="mesh.expert=0"):
        sharding.MeshConfig(expert=0)
    with pytest.raises(ValueError, match="expert=3"):
        sharding.MeshConfig(expert=3).shape(8)
    # A dense model on an expert mesh: the expert axis splits rows only.
    mesh = sharding.make_mesh(cfg)
    dense = config_lib.PRESETS["tiny"]
    specs = sharding_plan.param_shardings(dense, mesh, tf.param_shapes(dense))
    assert all("expert" not in str(x.spec) for x in jax.tree.leaves(specs))
    assert sharding.rows_sharding(mesh, 8).spec == P(("fsdp", "expert"))


def test_host_verifier_path_on_a_mesh_equals_the_fused_step(task, one_device):
    cfg, rl, ocfg, reward_fn, batch = task
    want_state, want_outs, _ = one_device
    mesh = sharding.make_mesh(sharding.MeshConfig(1, 2, 4))
    opt, state = _fresh_state(cfg, ocfg)
    sched = state_lib.learning_rate_schedule(ocfg)
    plan = sharding_plan.plan_step(state, cfg, mesh, B * G)
    state = sharding.place(state, plan.state)
    rollout_fn = ts.build_rollout(cfg, rl, plan)
    update_fn = ts.build_update(cfg, rl, opt, sched, plan)
    for i in range(2):
        state, key = ts.split_rollout_key(state)
        rollout = rollout_fn(state.params, sharding.place(batch(i), plan.rows), key)
        assert rollout.tokens_NT.sharding.is_fully_replicated
        rewards, parts = jax.device_get(reward_fn(rollout, batch(i).targets))  # host values
        state, out = update_fn(state, rollout, rewards, parts)
        assert all(x.sharding.is_fully_replicated for x in jax.tree.leaves(out))
        out = jax.device_get(out)
        for k, want in want_outs[i].metrics.items():
            np.testing.assert_allclose(out.metrics[k], want, atol=ATOL, rtol=1e-5, err_msg=k)
        np.testing.assert_array_equal(out.rows.correct_N, want_outs[i].rows.correct_N)
    for x, y in zip(_arrays(state), _arrays(want_state), strict=True):
        np.testing.assert_allclose(x, y, atol=PARAM_ATOL)
    assert state.params.layers.gate.sharding.is_equivalent_to(plan.state.params.layers.gate, 3)


# ---------------------------------------------------------------------------------------------
# The sampler's cache


@pytest.fixture(scope="module")
def one_device_rollout(task):
    cfg, rl, _, _, batch = task
    params = tf.init_params(jax.random.key(0), cfg)
    b = batch(0)
    sp = sampling_params(b.prompt_NP.shape[0], temperature=1.3)
    scfg = dataclasses.replace(rl.sampler, max_new_tokens=4)
    rollout, _ = generate(
        params,
        b.prompt_NP,
        b.prompt_lengths_N,
        jax.random.key(3),
        sp,
        None,
        model_cfg=cfg,
        cfg=scfg,
    )
    return params, sp, scfg, rollout


@pytest.mark.parametrize(
    "shape, layer_loop, want",
    [
        ((2, 2, 2), "scan", P(None, ("data", "fsdp"), "tensor")),  # 2 kv heads over tensor=2
        ((1, 2, 4), "unroll", P(("fsdp", "tensor"))),  # per-layer (N, K, S, Dh); tensor joins rows
    ],
)
def test_sampler_runs_with_its_cache_sharded(task, one_device_rollout, shape, layer_loop, want):
    cfg, _, _, _, batch = task
    params, sp, scfg, want_rollout = one_device_rollout
    scfg = dataclasses.replace(scfg, layer_loop=layer_loop)
    mesh = sharding.make_mesh(sharding.MeshConfig(*shape))
    b = batch(0)
    N, P_ = b.prompt_NP.shape
    cache = init_decode_cache(cfg, scfg, N, P_)
    cache_sh = sharding.decode_cache_shardings(cache, cfg, mesh)
    assert all(s.spec == want for s in jax.tree.leaves(cache_sh))
    rows = sharding.rows_sharding(mesh, N)
    got, cache = generate(
        sharding.place(params, sharding_plan.param_shardings(cfg, mesh, params)),
        sharding.place(b.prompt_NP, rows),
        sharding.place(b.prompt_lengths_N, rows),
        jax.random.key(3),
        sharding.place(sp, rows),
        sharding.place(cache, cache_sh),
        model_cfg=cfg,
        cfg=scfg,
    )
    for leaf, planned in zip(jax.tree.leaves(cache), jax.tree.leaves(cache_sh), strict=True):
        assert leaf.sharding.is_equivalent_to(planned, leaf.ndim)
    # Split by rows: like the batch, or like the cache's rows where those take more axes.
    cache_rows = want[1] if layer_loop == "scan" else want[0]
    assert got.tokens_NT.sharding.spec[0] in (rows.spec[0], cache_rows)
    np.testing.assert_array_equal(np.asarray(got.tokens_NT), np.asarray(want_rollout.tokens_NT))
    np.testing.assert_allclose(np.asarray(got.logp_NT), np.asarray(want_rollout.logp_NT), atol=ATOL)


# ---------------------------------------------------------------------------------------------
# bf16 parameters, f32 optimizer state


def test_bf16_parameters_with_f32_master_weights_run_sharded(task):
    cfg, rl, ocfg, reward_fn, batch = task
    # Untied: the LM head runs vocabulary-split too.
    cfg = cfg.replace(param_dtype="bfloat16", dtype="bfloat16", tie_embeddings=False)
    ocfg = dataclasses.replace(ocfg, master_weights=True)
    opt, state = _fresh_state(cfg, ocfg)
    mesh = sharding.make_mesh(sharding.MeshConfig(2, 2, 2))
    plan = sharding_plan.plan_step(state, cfg, mesh, B * G)
    state = sharding.place(state, plan.state)
    step = ts.build_train_step(
        cfg, rl, opt, state_lib.learning_rate_schedule(ocfg), reward_fn, plan
    )
    before = jax.device_get(state.params)
    for i in range(2):
        state, out = step(state, sharding.place(batch(i), plan.rows))
    is_float = lambda x: jnp.issubdtype(x.dtype, jnp.floating)  # noqa: E731
    float_leaves = [x for x in jax.tree.leaves(state.opt_state) if is_float(x)]
    assert len(float_leaves) == 3 * jax.tree.structure(state.params).num_leaves  # master, mu, nu
    assert {x.dtype for x in float_leaves} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.bfloat16)}
    assert float(out.metrics["grad_norm"]) > 0
    for m, p, b in zip(
        jax.tree.leaves(state.opt_state.master),
        jax.tree.leaves(state.params),
        jax.tree.leaves(before),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(m.astype(jnp.bfloat16)), np.asarray(p))
        assert not np.array_equal(np.asarray(m), np.asarray(b, np.float32))
        assert m.sharding.is_equivalent_to(p.sharding, p.ndim)


@pytest.mark.parametrize("master", [False, True])
def test_optimizer_state_is_f32_for_bf16_parameters(master):
    """Adam's moments (and the master copy) stay f32 through updates; without master weights,
    updates below bf16's resolution are rounded away, with them they accumulate."""
    params = {"w": jnp.ones((4,), jnp.bfloat16)}
    grads = {"w": jnp.ones((4,), jnp.bfloat16)}
    cfg = state_lib.OptimConfig(
        learning_rate=1e-4, schedule="constant", max_grad_norm=0, master_weights=master
    )
    opt = state_lib.make_optimizer(cfg)
    p, s = params, opt.init(params)
    for _ in range(50):  # 50 x 1e-4 = 5e-3; bf16's spacing below 1.0 is 2^-8
        u, s = opt.update(grads, s, p)
        p = optax.apply_updates(p, u)
    floats = [x for x in jax.tree.leaves(s) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert len(floats) == (3 if master else 2)
    assert {x.dtype for x in floats} == {jnp.dtype(jnp.float32)}
    assert p["w"].dtype == jnp.bfloat16
    assert (float(p["w"][0]) != 1.0) == master, p
    if master:
        np.testing.assert_allclose(np.asarray(s.master["w"]), 1 - 50 * 1e-4, rtol=1e-4)
