"""PPO's pieces: per-token rewards, GAE, the value loss, and a PPO bandit that learns."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlvr_jax.rl import advantages as adv_lib
from rlvr_jax.rl import value as value_lib
from rlvr_jax.rl.losses import LossConfig, policy_loss


def test_token_rewards_put_the_reward_on_the_last_token_and_the_kl_on_every_token():
    mask = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], bool)
    r = adv_lib.token_rewards(jnp.array([2.0, -1.0, 5.0]), mask)
    np.testing.assert_array_equal(r, [[0, 0, 2, 0], [-1, 0, 0, 0], [0, 0, 0, 0]])
    kl = jnp.full((3, 4), 0.5)
    r = adv_lib.token_rewards(jnp.array([2.0, -1.0, 5.0]), mask, kl, kl_beta=0.1)
    np.testing.assert_allclose(r, [[-0.05, -0.05, 1.95, 0], [-1.05, 0, 0, 0], [0, 0, 0, 0]])


def _gae_by_hand(r, v, m, gamma, lam):
    """The textbook recursion over the positions on the mask only, in float64."""
    adv = np.zeros(len(r))
    on = [t for t in range(len(r)) if m[t]]
    next_v, next_a = 0.0, 0.0
    for t in reversed(on):
        delta = r[t] + gamma * next_v - v[t]
        next_a = delta + gamma * lam * next_a
        next_v = v[t]
        adv[t] = next_a
    return adv


def test_gae_matches_the_recursion_with_masks_and_padding():
    # Row 0: three tokens then padding; row 1: a hole (an observation token) in the middle.
    r = np.array([[0.0, 0.0, 1.0, 0.0, 0.0], [0.0, 0.3, 0.0, 0.0, -1.0]])
    v = np.array([[0.5, 0.2, 0.7, 9.0, 9.0], [0.1, 0.4, 9.0, 0.6, -0.2]])
    m = np.array([[1, 1, 1, 0, 0], [1, 1, 0, 1, 1]], bool)
    gamma, lam = 0.9, 0.8
    adv, ret = adv_lib.gae(jnp.asarray(r), jnp.asarray(v), jnp.asarray(m), gamma, lam)
    for n in range(2):
        want = _gae_by_hand(r[n], v[n], m[n], gamma, lam)
        np.testing.assert_allclose(adv[n], want, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(ret[n], np.where(m[n], want + v[n], 0.0), rtol=1e-6, atol=1e-6)
    # By hand, row 0: delta_2 = 1 - 0.7 = 0.3, delta_1 = 0.9 * 0.7 - 0.2 = 0.43,
    # delta_0 = 0.9 * 0.2 - 0.5 = -0.32; A_2 = 0.3, A_1 = 0.43 + 0.72 * 0.3 = 0.646,
    # A_0 = -0.32 + 0.72 * 0.646 = 0.14512.
    np.testing.assert_allclose(adv[0], [0.14512, 0.646, 0.3, 0, 0], atol=1e-6)
    # The masked-out value (9.0) never enters row 1's chain.
    v2 = v.copy()
    v2[1, 2] = -50.0
    adv2, _ = adv_lib.gae(jnp.asarray(r), jnp.asarray(v2), jnp.asarray(m), gamma, lam)
    np.testing.assert_array_equal(adv2, adv)


def test_gae_with_unit_gamma_and_lambda_and_zero_values_is_the_monte_carlo_return():
    key = jax.random.key(0)
    r = jax.random.normal(key, (4, 7))
    m = jnp.arange(7)[None, :] < jnp.array([7, 5, 1, 3])[:, None]
    r = jnp.where(m, r, 0.0)
    adv, ret = adv_lib.gae(r, jnp.zeros((4, 7)), m, 1.0, 1.0)
    to_go = jnp.cumsum(r[:, ::-1], axis=1)[:, ::-1]
    np.testing.assert_allclose(adv, jnp.where(m, to_go, 0.0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ret, adv, rtol=1e-6)
    # lambda = 0: the one-step TD error.
    v = jax.random.normal(jax.random.key(1), (4, 7))
    adv0, _ = adv_lib.gae(r, v, m, 1.0, 0.0)
    next_v = jnp.where(m[:, 1:], v[:, 1:], 0.0)
    td = r + jnp.concatenate([next_v, jnp.zeros((4, 1))], axis=1) - v
    np.testing.assert_allclose(adv0, jnp.where(m, td, 0.0), rtol=1e-5, atol=1e-6)


def test_gae_advantages_are_whitened_over_the_tokens_and_returns_are_not():
    r = jnp.array([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    v = jnp.array([[0.2, 0.1, 0.0], [0.3, 0.0, 0.0]])
    m = jnp.array([[1, 1, 0], [1, 0, 0]], bool)
    cfg = adv_lib.AdvantageConfig("gae", gamma=1.0, lam=1.0, eps=0.0)
    adv, ret, stats = adv_lib.gae_advantages(r, v, m, cfg)
    raw, _ = adv_lib.gae(r, v, m, 1.0, 1.0)
    on = np.asarray(raw)[np.asarray(m)]
    np.testing.assert_allclose(
        np.asarray(adv)[np.asarray(m)], (on - on.mean()) / on.std(), rtol=1e-5
    )
    np.testing.assert_allclose(ret, jnp.where(m, raw + v, 0.0), rtol=1e-6)
    assert abs(float(stats["adv/mean"])) < 1e-6 and abs(float(stats["adv/std"]) - 1) < 1e-5
    raw_cfg = adv_lib.AdvantageConfig("gae", std_scaling="none", gamma=1.0, lam=1.0)
    np.testing.assert_allclose(adv_lib.gae_advantages(r, v, m, raw_cfg)[0], raw)


def test_value_loss_clips_like_ppo():
    v = jnp.array([[1.0, 0.0, 0.5, 3.0]])
    old = jnp.array([[0.5, 0.0, 0.5, 0.0]])
    ret = jnp.array([[2.0, 1.0, 0.0, 0.0]])
    m = jnp.array([[1, 1, 1, 0]], bool)
    loss, metrics = value_lib.value_loss(v, old, ret, m, 0.2, jnp.asarray(3.0))
    # Token 0: V moved 0.5 from V_old towards R = 2; clipped V = 0.7: 0.5 * 1.3^2 = 0.845 >
    # 0.5 * 1^2. Token 1: 0.5 * 1 either way. Token 2: 0.5 * 0.25. Token 3 is off the mask.
    np.testing.assert_allclose(loss, (0.845 + 0.5 + 0.125) / 3, rtol=1e-6)
    np.testing.assert_allclose(metrics["value/clip_frac"], 1 / 3, rtol=1e-6)
    unclipped, _ = value_lib.value_loss(v, old, ret, m, None, jnp.asarray(3.0))
    np.testing.assert_allclose(unclipped, (0.5 + 0.5 + 0.125) / 3, rtol=1e-6)
    # The gradient of a clipped token is zero; of the others, (V - R) / Z.
    g = jax.grad(lambda x: value_lib.value_loss(x, old, ret, m, 0.2, jnp.asarray(3.0))[0])(v)
    np.testing.assert_allclose(g, [[0.0, -1 / 3, 0.5 / 3, 0.0]], atol=1e-7)


def test_value_loss_of_microbatches_sums_to_the_batch_loss():
    key = jax.random.key(3)
    v, old, ret = jax.random.normal(key, (3, 8, 6))
    m = jax.random.bernoulli(jax.random.key(4), 0.7, (8, 6))
    z = jnp.sum(m).astype(jnp.float32)
    full, _ = value_lib.value_loss(v, old, ret, m, 0.3, z)
    parts = [
        value_lib.value_loss(v[i::2], old[i::2], ret[i::2], m[i::2], 0.3, z)[0] for i in (0, 1)
    ]
    np.testing.assert_allclose(sum(parts), full, rtol=1e-6)


def test_explained_variance():
    ret = jnp.array([[1.0, 2.0, 3.0, 100.0]])
    m = jnp.array([[1, 1, 1, 0]], bool)
    perfect = value_lib.value_stats(ret, ret, m)["value/explained_variance"]
    constant = value_lib.value_stats(jnp.full((1, 4), 7.0), ret, m)["value/explained_variance"]
    np.testing.assert_allclose([perfect, constant], [1.0, 0.0], atol=1e-6)


def test_critic_config_names_bad_values():
    with pytest.raises(ValueError, match="rl.critic.kind='value'"):
        value_lib.CriticConfig(kind="value")
    with pytest.raises(ValueError, match="rl.critic.value_clip=0"):
        value_lib.CriticConfig(kind="head", value_clip=0)
    with pytest.raises(ValueError, match="rl.critic.warmup_steps=-1"):
        value_lib.CriticConfig(kind="head", warmup_steps=-1)
    with pytest.raises(ValueError, match="lam=1.5"):
        adv_lib.AdvantageConfig("gae", lam=1.5)
    with pytest.raises(ValueError, match="contradicts"):
        adv_lib.AdvantageConfig("gae", std_scaling="group")


# ---------------------------------------------------------------------------------------------
# PPO on a contextual bandit: each of C contexts has a softmax policy over K arms and a value.

C, K, G_BANDIT = 4, 3, 8
PAY = np.array([[0.9, 0.2, 0.1], [0.1, 0.8, 0.3], [0.2, 0.3, 0.7], [0.6, 0.5, 0.1]], np.float32)


@functools.partial(jax.jit, static_argnums=(2,))
def _ppo_iteration(carry, key, mu):
    (theta_CK, value_C), opt_state = carry
    k_arm, k_pay = jax.random.split(key)
    contexts_N = jnp.repeat(jnp.arange(C), G_BANDIT)
    arms_N = jax.random.categorical(k_arm, theta_CK[contexts_N])
    rewards_N = jax.random.bernoulli(k_pay, jnp.asarray(PAY)[contexts_N, arms_N]).astype(float)
    mask_N1 = jnp.ones((C * G_BANDIT, 1), bool)

    def logp(theta):
        return jax.nn.log_softmax(theta[contexts_N])[jnp.arange(C * G_BANDIT), arms_N][:, None]

    old_logp_N1 = logp(theta_CK)
    old_v_N1 = value_C[contexts_N][:, None]
    r_N1 = adv_lib.token_rewards(rewards_N, mask_N1)
    cfg = adv_lib.AdvantageConfig("gae", gamma=1.0, lam=1.0)
    adv_N1, ret_N1, _ = adv_lib.gae_advantages(r_N1, old_v_N1, mask_N1, cfg)

    def loss_fn(params):
        theta, value = params
        pg, _ = policy_loss(logp(theta), old_logp_N1, adv_N1, mask_N1, LossConfig())
        v_N1 = value[contexts_N][:, None]
        vl, _ = value_lib.value_loss(v_N1, old_v_N1, ret_N1, mask_N1, 0.2, jnp.asarray(32.0))
        return pg + 0.5 * vl

    params = (theta_CK, value_C)
    opt = optax.adam(0.05)
    for _ in range(mu):  # several PPO epochs on one batch: the clip is active
        grads = jax.grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state)
        params = optax.apply_updates(params, updates)
    return (params, opt_state), jnp.mean(rewards_N)


def test_ppo_with_a_learned_value_learns_the_bandit():
    params = (jnp.zeros((C, K)), jnp.zeros((C,)))
    carry = (params, optax.adam(0.05).init(params))
    for i in range(150):
        carry, _ = _ppo_iteration(carry, jax.random.key(i), 4)
    (theta, value), _ = carry
    pi = np.asarray(jax.nn.softmax(theta))
    expected = float(np.sum(pi * PAY, axis=1).mean())
    uniform = float(PAY.mean())
    best = float(PAY.max(axis=1).mean())
    assert uniform < 0.45 and expected > best - 0.05, (expected, best)
    # The critic has learnt each context's expected reward under the current policy.
    np.testing.assert_allclose(value, np.sum(pi * PAY, axis=1), atol=0.15)
