"""LoRA through the train step: the adapters are the only trained tree, the reference is the
base with the adapters off (no copy), the sampler decodes with the adapters, the adapters shard
from the same table, and checkpoints hold the adapters only."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.model import lora as lora_lib
from rlvr_jax.model import sharding
from rlvr_jax.model import transformer as tf
from rlvr_jax.program.runtime import checkpoint as ckpt_lib
from rlvr_jax.rl import losses, sharding_plan
from rlvr_jax.rl import rows as rows_lib
from rlvr_jax.rl import state as state_lib
from rlvr_jax.rl import train_step as ts
from rlvr_jax.sft import step as sft_step
from tests.rl import step_fixtures

B, G = step_fixtures.B, step_fixtures.G


_reward_fn = step_fixtures.reward_fn


@pytest.fixture(scope="module")
def setup():
    return step_fixtures.tiny_setup()


def _trained(lora, seed=1, std=0.3):
    """Adapters as after training: B nonzero (fresh ones have B = 0)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: jnp.asarray(x + std * rng.standard_normal(x.shape)), lora)


def _policy(cfg, base="model", trained=False):
    params = tf.init_params(jax.random.key(0), cfg)
    if base == "int8":
        params = lora_lib.quantize_int8(params)
    lora = lora_lib.init_lora(jax.random.key(5), cfg, lora_lib.LoraConfig(rank=4, alpha=8.0))
    return dataclasses.replace(params, lora=_trained(lora) if trained else lora)


def _build(setup, params, kl_beta=0.05, **rl_kwargs):
    _, sampler, _ = setup
    loss = losses.LossConfig(kl_beta=kl_beta)
    rl = ts.RLConfig(group_size=G, sampler=sampler, loss=loss, **rl_kwargs)
    ocfg = state_lib.OptimConfig(learning_rate=3e-2, total_steps=100, schedule="constant")
    opt = state_lib.make_optimizer(ocfg)
    state = state_lib.init_train_state(params, opt, jax.random.key(1), kl_beta > 0)
    return rl, opt, state_lib.learning_rate_schedule(ocfg), state


def _same(a, b) -> bool:
    return all(
        np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


@pytest.mark.parametrize("base", ["model", "int8"])
def test_lora_step_trains_the_adapters_only(setup, base):
    cfg, _, batch = setup
    rl, opt, sched, state = _build(setup, _policy(cfg, base))
    assert state.ref_params is None  # the base is the reference: no copy is made
    # Adam's moments cover the adapters only: mu and nu are LoraParams trees.
    adapters = state.params.lora
    moments = [x for x in jax.tree.leaves(state.opt_state) if x.size > 1]
    assert sum(x.size for x in moments) == 2 * sum(x.size for x in jax.tree.leaves(adapters))
    step = ts.build_train_step(cfg, rl, opt, sched, _reward_fn)
    before = jax.device_get(state.params)
    for i in range(2):
        state, out = step(state, batch(i))
    after = jax.device_get(state.params)
    m = jax.device_get(out.metrics)
    assert m["grad_norm"] > 0 and np.isfinite(m["loss/kl"])
    assert _same(lora_lib.without_adapters(before), lora_lib.without_adapters(after))
    assert not _same(before.lora, after.lora)
    assert max(float(np.abs(x.b).max()) for x in jax.tree.leaves(after.lora, is_leaf=_is_lr)) > 0


def _is_lr(x):
    return isinstance(x, lora_lib.LowRank)


def test_reference_is_the_base_with_the_adapters_off(setup):
    cfg, _, batch = setup
    rl, _, _, state = _build(setup, _policy(cfg, trained=True))
    ref = state_lib.reference_params(state, use_reference=True)
    assert ref.lora is None and ref.layers.q is state.params.layers.q  # the same buffer
    assert state_lib.reference_params(state, use_reference=False) is None
    state, key = ts.split_rollout_key(state)
    rollout = ts.build_rollout(cfg, rl)(state.params, batch(0), key)
    rewards, parts = _reward_fn(rollout, None)
    rows, _, _ = rows_lib.prepare_rows(state, rollout, rewards, parts, cfg, rl)
    # The reference log-probs are the plain base model's, not the policy's.
    seq = rows_lib.sequences(rollout)
    base = lora_lib.without_adapters(state.params)
    base_logp = rows_lib._frozen_logprobs(base, seq, cfg, rl)
    policy_logp = rows_lib._frozen_logprobs(state.params, seq, cfg, rl)
    mask = np.asarray(rollout.mask_NT)
    np.testing.assert_array_equal(np.asarray(rows.ref_logp_NT)[mask], np.asarray(base_logp)[mask])
    assert np.abs(np.asarray(policy_logp - base_logp)[mask]).max() > 1e-3


@pytest.mark.parametrize("layer_loop", ["scan", "unroll"])
def test_sampler_decodes_with_the_adapters(setup, layer_loop):
    """The sampler's log-probs are the teacher-forced log-probs of base + adapters, in both
    decode loops, and not the base's."""
    cfg, sampler, batch = setup
    sampler = dataclasses.replace(sampler, layer_loop=layer_loop)
    params = _policy(cfg, trained=True)
    rl, _, _, state = _build(setup, params, kl_beta=0.0)
    rl = dataclasses.replace(rl, sampler=sampler)
    rollout = ts.build_rollout(cfg, rl)(params, batch(1), jax.random.key(3))
    seq = rows_lib.sequences(rollout)
    mask = np.asarray(rollout.mask_NT)
    forced = np.asarray(rows_lib._frozen_logprobs(params, seq, cfg, rl))
    np.testing.assert_allclose(np.asarray(rollout.logp_NT)[mask], forced[mask], atol=2e-4)
    base = np.asarray(rows_lib._frozen_logprobs(lora_lib.without_adapters(params), seq, cfg, rl))
    assert np.abs(base - forced)[mask].max() > 1e-3


def test_adapters_shard_from_the_table_and_match_one_device(setup):
    cfg, _, batch = setup
    results = []
    for mesh in (None, sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2))):
        rl, opt, sched, state = _build(setup, _policy(cfg))
        plan = None
        if mesh is not None:
            plan = sharding_plan.plan_step(state, cfg, mesh, B * G)
            state = sharding.place(state, plan.state)
            # q's A takes q's input axis (embed), its B the heads; the rank axis is whole.
            a, b = state.params.lora.q.a.sharding.spec, state.params.lora.q.b.sharding.spec
            q = state.params.layers.q.sharding.spec
            axis = lambda spec, i: spec[i] if i < len(spec) else None  # noqa: E731
            assert a[:2] == q[:2] and b[2:] == q[2:] and axis(a, 2) is axis(b, 1) is None
        step = ts.build_train_step(cfg, rl, opt, sched, _reward_fn, plan)
        b = batch(2) if plan is None else sharding.place(batch(2), plan.rows)
        state, out = step(state, b)
        results.append(jax.device_get((state.params.lora, out.metrics["grad_norm"])))
    (l1, g1), (l8, g8) = results
    np.testing.assert_allclose(g1, g8, rtol=1e-4)
    for x, y in zip(jax.tree.leaves(l1), jax.tree.leaves(l8), strict=True):
        np.testing.assert_allclose(x, y, atol=1e-5)


def test_sft_step_trains_the_adapters_only(setup):
    cfg, _, _ = setup
    params = _policy(cfg)
    ocfg = state_lib.OptimConfig(learning_rate=1e-2, total_steps=10, schedule="constant")
    opt = state_lib.make_optimizer(ocfg)
    state = state_lib.init_train_state(params, opt, jax.random.key(1), use_reference=False)
    step = sft_step.build_sft_step(cfg, opt, state_lib.learning_rate_schedule(ocfg))
    batch = sft_step.make_batch([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10]], [2, 3], [8], pad_id=0)
    before = jax.device_get(state.params)
    state, m = step(state, batch)
    after = jax.device_get(state.params)
    assert float(m["sft/grad_norm"]) > 0
    assert _same(lora_lib.without_adapters(before), lora_lib.without_adapters(after))
    assert not _same(before.lora, after.lora)


def test_checkpoint_holds_the_adapters_only_and_restores_onto_the_base(setup, tmp_path):
    cfg, _, _ = setup
    _, _, _, state = _build(setup, _policy(cfg, trained=True))
    with ckpt_lib.Checkpointer(tmp_path / "a", every_steps=1, ref_source="base-dir") as ck:
        ck.save(1, state, {"step": 1})
        ck.wait()
        meta = ck.read_meta(1)
    assert meta["adapters_only"] and meta["has_lora"]
    # Nothing of the base is on disk: the saved parameter tree is the adapters'.
    saved = ocp_tree(tmp_path / "a" / "1" / "state")
    assert saved and all(k.startswith("params.lora.") for k in saved if k.startswith("params."))

    # Restored onto a fresh policy (the base loaded from its source, fresh adapters).
    _, _, _, fresh = _build(setup, _policy(cfg))
    with ckpt_lib.Checkpointer(tmp_path / "a", every_steps=1, read_only=True) as ck:
        restored, _ = ck.restore(fresh)
        assert _same(restored.params.lora, state.params.lora)
        assert restored.params.layers.q is fresh.params.layers.q
        assert _same(restored.opt_state, state.opt_state)
        # A run without adapters, or a target without the base's weights, is told why.
        _, _, _, plain = _build(setup, tf.init_params(jax.random.key(0), cfg))
        with pytest.raises(ckpt_lib.CheckpointError, match="model.lora.rank must match"):
            ck.restore(plain)
        with pytest.raises(ckpt_lib.CheckpointError, match="needs the base weights"):
            ck.restore(jax.eval_shape(lambda: fresh))

    # Without a source for the base (a random initialisation), the base is written too.
    with ckpt_lib.Checkpointer(tmp_path / "b", every_steps=1) as ck:
        ck.save(1, state, {"step": 1})
        ck.wait()
        assert not ck.read_meta(1)["adapters_only"]
        restored, _ = ck.restore(jax.eval_shape(lambda: state))
    assert _same(restored.params, state.params)


def ocp_tree(path) -> list[str]:
    """The dotted names of the arrays a checkpoint item holds (orbax's tree metadata)."""
    import orbax.checkpoint as ocp

    meta = ocp.StandardCheckpointHandler().metadata(path)
    tree = getattr(meta, "item_metadata", meta)
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: not isinstance(x, dict))
    return [ckpt_lib._leaf_name(p) for p, _ in flat[0]]
