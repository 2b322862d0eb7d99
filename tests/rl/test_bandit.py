"""Policy gradients on softmax bandits: the advantage + loss pipeline against analytic gradients.

A "prompt" is a softmax policy over K arms, pi = softmax(theta); arm k pays a Bernoulli(q_k)
reward, so J(theta) = sum_k pi_k q_k and dJ/dtheta_j = pi_j (q_j - J). Each of B groups samples G
arms, the advantages come from `compute_advantages`, the loss from `policy_loss` (REINFORCE,
on-policy, token_mean over N = B*G one-token "completions"), and jax.grad gives the estimate.
Every group has its own copy of theta, so the gradient with respect to theta_BK holds one
independent estimate per group: their mean is the Monte Carlo estimate and their spread gives its
standard error (SE). Tolerances are stated in SEs; the seeds are fixed.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.rl.advantages import AdvantageConfig, compute_advantages
from rlvr_jax.rl.losses import LossConfig, policy_loss

Z_TOL = 4.0  # |estimate - expectation| <= 4 SE: a false failure has probability ~6e-5 per check


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _per_group_gradients_jit(theta_K, q_K, B, G, adv_cfg, key):
    theta_BK = jnp.broadcast_to(theta_K, (B, theta_K.shape[0]))
    k_arm, k_reward = jax.random.split(key)
    arms_BG = jax.random.categorical(k_arm, theta_BK[:, None, :], shape=(B, G))
    rewards_BG = jax.random.bernoulli(k_reward, q_K[arms_BG]).astype(jnp.float32)
    adv_BG, _ = compute_advantages(rewards_BG, adv_cfg)

    def loss_fn(theta_BK):
        logp_BG = jnp.take_along_axis(jax.nn.log_softmax(theta_BK, -1), arms_BG, axis=1)
        logp_N1 = logp_BG.reshape(B * G, 1)
        loss, _ = policy_loss(
            logp_N1, jax.lax.stop_gradient(logp_N1), adv_BG.reshape(B * G),
            jnp.ones((B * G, 1), bool), LossConfig(policy_loss="reinforce"),
        )  # fmt: skip
        return loss

    # loss = -(1/N) sum_i A_i log pi(a_i): undo the sign and the 1/N, keep 1/G per group.
    return -jax.grad(loss_fn)(theta_BK) * (B * G) / G


def _per_group_gradients(theta_K, q_K, B, G, adv_cfg, seed):
    """(B, K) per-group estimates of dJ/dtheta: the mean over the group of A_i grad log pi(a_i)."""
    g_BK = _per_group_gradients_jit(
        jnp.asarray(theta_K), jnp.asarray(q_K), B, G, adv_cfg, jax.random.key(seed)
    )
    return np.asarray(g_BK, np.float64)


def _analytic_gradient(theta_K, q_K):
    pi = np.exp(theta_K - np.max(theta_K))
    pi /= pi.sum()
    return pi * (q_K - np.dot(pi, q_K))


def test_rloo_policy_gradient_is_unbiased():
    theta = np.array([0.3, -0.2, 0.5, 0.0], np.float32)
    q = np.array([0.9, 0.5, 0.2, 0.1], np.float32)
    g_BK = _per_group_gradients(theta, q, B=8000, G=4, adv_cfg=AdvantageConfig("rloo"), seed=0)
    estimate, se = g_BK.mean(0), g_BK.std(0, ddof=1) / math.sqrt(g_BK.shape[0])
    analytic = _analytic_gradient(theta.astype(np.float64), q.astype(np.float64))
    assert np.all(np.abs(estimate - analytic) <= Z_TOL * se), (estimate, analytic, se)
    # The test has power: the gradient is many SEs from zero, so a sign or scale error fails.
    assert np.max(np.abs(analytic)) > 15 * np.max(se), (analytic, se)
    # Dr. GRPO's advantage is (G-1)/G times RLOO's on every sample: its gradient is shrunk, not
    # biased in direction.
    g_dr = _per_group_gradients(theta, q, B=8000, G=4, adv_cfg=AdvantageConfig("dr_grpo"), seed=0)
    np.testing.assert_allclose(g_dr, g_BK * 3 / 4, rtol=1e-4, atol=1e-6)


def _grpo_gain_exact(p, G, eps):
    """E[GRPO per-group gradient] / (dJ/dtheta_1) for a two-arm prompt with success rate p.

    Enumerates k ~ Binomial(G, p) successes: each success has advantage (1 - k/G) / (std + eps)
    and score d log pi / d theta_1 = 1 - p; each failure -k/G / (std + eps) and score -p; std is
    the population std sqrt(k/G (1 - k/G)); k in {0, G} gives zero advantage.
    """
    total = 0.0
    for k in range(1, G):
        ph = k / G
        s = math.sqrt(ph * (1 - ph)) + eps
        per_group = (k * (1 - ph) * (1 - p) + (G - k) * ph * p) / s / G
        total += math.comb(G, k) * p**k * (1 - p) ** (G - k) * per_group
    return total / (p * (1 - p))


def test_grpo_std_scaling_reweights_prompts_by_inverse_std():
    # Two prompts, two arms each; arm 1 always pays 1, arm 0 pays 0, so the success rate is
    # p = pi(arm 1), and dJ/dtheta = (-p (1 - p), p (1 - p)). Dividing by the group std (about
    # sqrt(p (1 - p)) for large G) multiplies prompt p's expected gradient by about
    # 1 / sqrt(p (1 - p)): the easy-or-hard prompt (p = 0.1) gets 0.5 / 0.3 = 5/3 times the
    # weight of the p = 0.5 prompt, relative to the true gradient (Dr. GRPO, Liu et al. 2025).
    G, R, eps = 64, 3000, 1e-4
    q = np.array([0.0, 1.0], np.float32)
    p_rates = (0.5, 0.1)
    gains = {}
    for name, cfg in (
        ("grpo", AdvantageConfig("grpo", eps=eps)),
        ("dr", AdvantageConfig("dr_grpo")),
    ):
        for i, p in enumerate(p_rates):
            theta = np.array([0.0, math.log(p / (1 - p))], np.float32)
            g_BK = _per_group_gradients(theta, q, B=R, G=G, adv_cfg=cfg, seed=10 + i)
            true = _analytic_gradient(theta.astype(np.float64), q.astype(np.float64))
            # The per-prompt gradient norm over the true one (both vectors are along (-1, 1)).
            gain_B = np.linalg.norm(g_BK, axis=1) * np.sign(g_BK[:, 1]) / np.linalg.norm(true)
            gains[name, p] = (gain_B.mean(), gain_B.std(ddof=1) / math.sqrt(R))

    # Dr. GRPO: every prompt's expected gradient is exactly (G-1)/G of the true one.
    for p in p_rates:
        m, se = gains["dr", p]
        assert abs(m - (G - 1) / G) <= Z_TOL * se, (p, m, se)
    # GRPO: each prompt's gain matches the exact finite-G expectation...
    for p in p_rates:
        m, se = gains["grpo", p]
        assert abs(m - _grpo_gain_exact(p, G, eps)) <= Z_TOL * se, (p, m, se)
    # ... which is the 1 / sqrt(p (1 - p)) re-weighting up to 2% at G = 64.
    predicted_ratio = math.sqrt(0.1 * 0.9) / math.sqrt(0.5 * 0.5)  # gain(0.5) / gain(0.1) = 0.6
    exact_ratio = _grpo_gain_exact(0.5, G, eps) / _grpo_gain_exact(0.1, G, eps)
    assert abs(exact_ratio / predicted_ratio - 1) < 0.02, exact_ratio

    def ratio(name):
        (m1, s1), (m2, s2) = gains[name, 0.5], gains[name, 0.1]
        r = m1 / m2
        return r, r * math.hypot(s1 / m1, s2 / m2)

    grpo_ratio, grpo_se = ratio("grpo")
    dr_ratio, dr_se = ratio("dr")
    assert abs(grpo_ratio - predicted_ratio) <= 0.02 * predicted_ratio + Z_TOL * grpo_se
    assert abs(dr_ratio - 1.0) <= Z_TOL * dr_se
    # The bias exists: GRPO's relative weighting of the two prompts is far from unbiased.
    assert abs(grpo_ratio - 1.0) > 10 * grpo_se
