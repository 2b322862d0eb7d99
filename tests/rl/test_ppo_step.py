"""PPO through the train step: a value head or a separate critic, GAE, warm-up, sharding."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.model import sharding
from rlvr_jax.model import transformer as tf
from rlvr_jax.program.runtime import checkpoint as ckpt_lib
from rlvr_jax.rl import advantages, losses, sharding_plan
from rlvr_jax.rl import rows as rows_lib
from rlvr_jax.rl import state as state_lib
from rlvr_jax.rl import train_step as ts
from rlvr_jax.rl import value as value_lib
from tests.rl import step_fixtures

B, G = step_fixtures.B, step_fixtures.G
GAE = advantages.AdvantageConfig("gae", gamma=1.0, lam=0.95)


_reward_fn = step_fixtures.reward_fn


@pytest.fixture(scope="module")
def setup():
    return step_fixtures.tiny_setup()


def _build(setup, kind, warmup=0, lr=3e-3, critic_lr=3e-2, **rl_kwargs):
    cfg, sampler, _ = setup
    critic = value_lib.CriticConfig(kind=kind, learning_rate=critic_lr, warmup_steps=warmup)
    rl = ts.RLConfig(group_size=G, sampler=sampler, advantage=GAE, critic=critic, **rl_kwargs)
    ocfg = state_lib.OptimConfig(learning_rate=lr, total_steps=100, schedule="constant")
    opt = state_lib.make_optimizer(ocfg)
    params = tf.init_params(jax.random.key(0), cfg)
    critic_state = state_lib.init_critic_state(value_lib.init_critic(critic, params), critic)
    use_ref = rl.loss.kl_beta > 0
    state = state_lib.init_train_state(params, opt, jax.random.key(1), use_ref, critic_state)
    return rl, opt, state_lib.learning_rate_schedule(ocfg), state


def test_config_pairs_gae_with_a_value_model(setup):
    _, sampler, _ = setup
    with pytest.raises(ValueError, match="GAE needs a value model"):
        ts.RLConfig(group_size=G, sampler=sampler, advantage=GAE)
    with pytest.raises(ValueError, match="rl.critic.kind='head'"):
        ts.RLConfig(group_size=G, sampler=sampler, critic=value_lib.CriticConfig(kind="head"))


def test_separate_critic_copies_the_policy_without_its_unembedding(setup):
    cfg, _, _ = setup
    params = tf.init_params(jax.random.key(0), cfg.replace(tie_embeddings=False))
    critic = value_lib.init_critic(value_lib.CriticConfig(kind="model"), params)
    assert critic.backbone.lm_head is None and params.lm_head is not None
    np.testing.assert_array_equal(critic.backbone.layers.q, params.layers.q)
    assert critic.backbone.layers.q is not params.layers.q
    np.testing.assert_array_equal(critic.head.w_D, np.zeros(cfg.embed_dim))


@pytest.mark.parametrize("kind", ["head", "model"])
def test_critic_loss_falls_on_a_fixed_batch_while_the_policy_waits(setup, kind):
    """During the critic's warm-up only the critic learns; on one rollout, repeated, its value
    error falls, and the policy's weights, optimizer state and update count stay put."""
    cfg, _, batch = setup
    rl, opt, sched, state = _build(setup, kind, warmup=100)
    rollout_fn = ts.build_rollout(cfg, rl)
    update_fn = ts.build_update(cfg, rl, opt, sched)
    state, key = ts.split_rollout_key(state)
    rollout = rollout_fn(state.params, batch(0), key)
    rewards, parts = _reward_fn(rollout, None)
    assert float(jnp.std(rewards)) > 0
    policy_before = jax.device_get((state.params, state.opt_state, state.step))
    errors = []
    for _ in range(25):
        state, out = update_fn(state, rollout, rewards, parts)
        errors.append(float(out.metrics["value/error"]))
        assert float(out.metrics["value/warmup"]) == 1.0
    assert errors[-1] < 0.5 * errors[0], errors
    assert int(state.critic.step) == 25
    for x, y in zip(
        jax.tree.leaves(policy_before),
        jax.tree.leaves((state.params, state.opt_state, state.step)),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("kind", ["head", "model"])
def test_ppo_step_trains_policy_and_critic_with_token_advantages(setup, kind):
    cfg, _, batch = setup
    rl, opt, sched, state = _build(setup, kind, mu=2, num_minibatches=2)
    step = ts.build_train_step(cfg, rl, opt, sched, _reward_fn)
    before = jax.device_get((state.params, state.critic.params))
    for i in range(2):
        state, out = step(state, batch(i))
    m = jax.device_get(out.metrics)
    assert int(state.step) == 2 * 2 * 2 and int(state.critic.step) == 2
    for k in ("loss/value", "value/error", "value/clip_frac", "value/grad_norm"):
        assert np.isfinite(m[k]) and k in m
    assert m["value/grad_norm"] > 0 and m["grad_norm"] > 0
    assert m["value/explained_variance"] <= 1
    changed = lambda a, b: any(  # noqa: E731
        not np.array_equal(x, y)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )
    params, critic = jax.device_get((state.params, state.critic.params))
    assert changed(before[0], params) and changed(before[1].head, critic.head)
    if kind == "model":
        assert changed(before[1].backbone, critic.backbone)
    # One advantage per token: the row results hold each row's mean over its loss tokens.
    assert np.all(np.isfinite(out.rows.adv_N))


def test_gae_rows_hold_per_token_advantages_and_return_targets(setup):
    cfg, _, batch = setup
    rl, _, _, state = _build(setup, "head")
    rl = dataclasses.replace(rl, advantage=advantages.AdvantageConfig("gae", lam=1.0))
    state, key = ts.split_rollout_key(state)
    rollout = ts.build_rollout(cfg, rl)(state.params, batch(1), key)
    rewards, parts = _reward_fn(rollout, None)
    rows, _, stats = rows_lib.prepare_rows(state, rollout, rewards, parts, cfg, rl)
    N, T = rollout.tokens_NT.shape
    assert rows.adv_NT.shape == rows.returns_NT.shape == rows.old_values_NT.shape == (N, T)
    # A zero head: every value is 0, so with gamma = lambda = 1 the return of each token is
    # the completion's reward.
    np.testing.assert_allclose(rows.old_values_NT, 0.0)
    mask = np.asarray(rollout.mask_NT)
    want = np.where(mask, np.asarray(rewards)[:, None], 0.0)
    np.testing.assert_allclose(rows.returns_NT, want, rtol=1e-6, atol=1e-6)
    assert rows.advantages is rows.adv_NT
    assert abs(float(stats["adv/mean"])) < 1e-5  # whitened over the tokens
    assert "adv/frac_all_correct" in stats and "value/explained_variance" in stats


def test_token_advantages_equal_to_the_row_advantage_give_the_same_loss():
    key = jax.random.key(0)
    logp, old = -jax.random.uniform(key, (2, 6, 5))
    adv_N = jnp.array([0.7, -1.2, 0.1, 2.0, -0.3, 0.0])
    mask = jax.random.bernoulli(jax.random.key(1), 0.8, (6, 5))
    cfg = losses.LossConfig(clip_low=0.1)
    a, _ = losses.policy_loss(logp, old, adv_N, mask, cfg)
    b, _ = losses.policy_loss(logp, old, jnp.broadcast_to(adv_N[:, None], (6, 5)), mask, cfg)
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_separate_critic_is_sharded_from_the_same_table_and_matches_one_device(setup):
    cfg, _, batch = setup
    results = []
    for mesh in (None, sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2))):
        rl, opt, sched, state = _build(setup, "model")
        plan = None
        if mesh is not None:
            plan = sharding_plan.plan_step(state, cfg, mesh, B * G)
            state = sharding.place(state, plan.state)
            q = state.critic.params.backbone.layers.q.sharding.spec
            assert q == state.params.layers.q.sharding.spec and q != jax.sharding.PartitionSpec()
        step = ts.build_train_step(cfg, rl, opt, sched, _reward_fn, plan)
        b = batch(2) if plan is None else sharding.place(batch(2), plan.rows)
        state, out = step(state, b)
        results.append(jax.device_get((state.critic.params, out.metrics)))
    (c1, m1), (c8, m8) = results
    np.testing.assert_allclose(m1["loss/value"], m8["loss/value"], rtol=1e-4, atol=1e-6)
    for x, y in zip(jax.tree.leaves(c1), jax.tree.leaves(c8), strict=True):
        np.testing.assert_allclose(x, y, atol=1e-4)


def test_value_head_state_restores_from_a_checkpoint(setup, tmp_path):
    rl, _, _, state = _build(setup, "head")
    state = dataclasses.replace(
        state,
        critic=dataclasses.replace(
            state.critic,
            params=value_lib.CriticParams(
                value_lib.ValueHead(
                    jnp.arange(state.critic.params.head.w_D.shape[0], dtype=jnp.float32) * 0.1,
                    jnp.float32(2.5),
                )
            ),
        ),
    )
    ck = ckpt_lib.Checkpointer(tmp_path / "ck", every_steps=1)
    ck.save(1, state, force=True)
    ck.wait()
    restored, _ = ck.restore(jax.tree.map(jnp.zeros_like, state))
    np.testing.assert_allclose(restored.critic.params.head.w_D, state.critic.params.head.w_D)
    assert float(restored.critic.params.head.b) == 2.5
    no_critic = dataclasses.replace(state, critic=None)
    with pytest.raises(ckpt_lib.CheckpointError, match="value model"):
        ck.restore(no_critic)
    ck.close()
