"""Policy losses, KL estimators and aggregations against hand-computed values; exact
gradient accumulation over micro-batches in every aggregation mode."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.rl import losses
from rlvr_jax.rl.losses import LossConfig

# Two completions of T=3. Row 0: advantage +1, three tokens with ratios 1.5, 1.0, 0.5.
# Row 1: advantage -2, two tokens with ratios 0.5, 4.0, then padding (garbage log-prob).
OLD = np.array([[-1.0, -2.0, -0.5], [-1.2, -3.0, -0.7]], np.float32)
RATIOS = np.array([[1.5, 1.0, 0.5], [0.5, 4.0, 1.0]], np.float32)
MASK = np.array([[1, 1, 1], [1, 1, 0]], bool)
ADV = np.array([1.0, -2.0], np.float32)
LOGP = np.where(MASK, OLD + np.log(RATIOS), 80.0).astype(np.float32)  # exp(80) overflows f32

# Per-token PPO losses with clip_low=0.2, clip_high=0.28, by hand:
#   r=1.5, A=+1: -min(1.5, 1.28) = -1.28    (clip high active)
#   r=1.0, A=+1: -1.0
#   r=0.5, A=+1: -min(0.5, 0.8)  = -0.5     (A > 0: the low clip does not bind)
#   r=0.5, A=-2: -min(-1.0, -1.6) = 1.6     (clip low active)
#   r=4.0, A=-2: -min(-8.0, -2.56) = 8.0    (A < 0: the high clip does not bind)
PPO_ROW0 = [-1.28, -1.0, -0.5]
PPO_ROW1 = [1.6, 8.0]


def _loss(cfg, logp=LOGP, old=OLD, adv=ADV, mask=MASK, **kwargs):
    return losses.policy_loss(
        jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), cfg, **kwargs
    )


def _grad(cfg, logp=LOGP, **kwargs):
    return np.asarray(jax.grad(lambda lp: _loss(cfg, logp=lp, **kwargs)[0])(jnp.asarray(logp)))


PPO = LossConfig(clip_low=0.2, clip_high=0.28)


@pytest.mark.parametrize(
    "aggregation, expected",
    [
        ("token_mean", (sum(PPO_ROW0) + sum(PPO_ROW1)) / 5),
        ("seq_mean_token_mean", (sum(PPO_ROW0) / 3 + sum(PPO_ROW1) / 2) / 2),
        ("seq_mean_token_sum", (sum(PPO_ROW0) + sum(PPO_ROW1)) / 2),
        ("dr_grpo_constant", (sum(PPO_ROW0) + sum(PPO_ROW1)) / (2 * 4)),
    ],
)
def test_ppo_clip_each_aggregation(aggregation, expected):
    cfg = LossConfig(clip_low=0.2, clip_high=0.28, aggregation=aggregation)
    loss, metrics = _loss(cfg, max_new_tokens=4)
    np.testing.assert_allclose(float(loss), expected, rtol=1e-6)
    np.testing.assert_allclose(float(metrics["loss/pg"]), expected, rtol=1e-6)
    assert float(metrics["loss/kl"]) == 0.0 and float(metrics["loss/entropy"]) == 0.0


def test_hand_values_of_the_aggregations():
    # The same numbers written out, so a wrong formula above would not hide behind itself.
    assert math.isclose((sum(PPO_ROW0) + sum(PPO_ROW1)) / 5, 1.364)
    assert math.isclose((sum(PPO_ROW0) / 3 + sum(PPO_ROW1) / 2) / 2, (-2.78 / 3 + 4.8) / 2)
    assert math.isclose((sum(PPO_ROW0) + sum(PPO_ROW1)) / 2, 3.41)


def test_ppo_clip_gradient_and_metrics():
    # d/dlogp of -A r is -A r where unclipped, 0 where the clip binds; token_mean divides by 5.
    expected = np.array([[0.0, -1.0, -0.5], [0.0, 8.0, 0.0]]) / 5
    np.testing.assert_allclose(_grad(PPO), expected, rtol=1e-6, atol=1e-7)
    _, m = _loss(PPO)
    assert float(m["clip/frac_low"]) == pytest.approx(0.2)
    assert float(m["clip/frac_high"]) == pytest.approx(0.2)
    assert float(m["clip/frac_dual"]) == 0.0
    assert float(m["ratio/min"]) == pytest.approx(0.5)
    assert float(m["ratio/max"]) == pytest.approx(4.0)
    assert float(m["ratio/mean"]) == pytest.approx((1.5 + 1.0 + 0.5 + 0.5 + 4.0) / 5)
    assert float(m["loss/tokens"]) == 5.0
    assert "kl/mean" not in m and "entropy/mean" not in m and "tis/weight_mean" not in m


def test_symmetric_clip_clips_ratio_1_25_high():
    # clip_high=0.2 < 0.28: r=1.5 is now clipped at 1.2 instead of 1.28.
    loss, _ = _loss(LossConfig(clip_low=0.2, clip_high=0.2))
    np.testing.assert_allclose(float(loss), (-1.2 - 1.0 - 0.5 + 1.6 + 8.0) / 5, rtol=1e-6)


def test_dual_clip_caps_negative_advantage_tokens():
    # c=3: the r=4, A=-2 token's loss 8 is capped at -c A = 6, and its gradient vanishes.
    cfg = LossConfig(clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    loss, m = _loss(cfg)
    np.testing.assert_allclose(float(loss), (-1.28 - 1.0 - 0.5 + 1.6 + 6.0) / 5, rtol=1e-6)
    assert float(m["clip/frac_dual"]) == pytest.approx(0.2)
    expected = np.array([[0.0, -1.0, -0.5], [0.0, 0.0, 0.0]]) / 5
    np.testing.assert_allclose(_grad(cfg), expected, rtol=1e-6, atol=1e-7)


def test_reinforce_is_unclipped_minus_a_times_ratio():
    cfg = LossConfig(policy_loss="reinforce", clip_low=0.2, clip_high=0.28)
    token = np.array([[-1.5, -1.0, -0.5], [1.0, 8.0, 0.0]])
    loss, m = _loss(cfg)
    np.testing.assert_allclose(float(loss), token.sum() / 5, rtol=1e-6)
    np.testing.assert_allclose(_grad(cfg), token / 5, rtol=1e-6, atol=1e-7)
    assert float(m["clip/frac_low"]) == 0.0 and float(m["clip/frac_high"]) == 0.0


def test_reinforce_on_policy_gradient_is_minus_advantage():
    # pi_old == pi: every ratio is 1, the gradient is -A / tokens per token.
    cfg = LossConfig(policy_loss="reinforce")
    logp = np.where(MASK, OLD, 0.0).astype(np.float32)
    expected = np.array([[-1.0, -1.0, -1.0], [2.0, 2.0, 0.0]]) / 5
    np.testing.assert_allclose(_grad(cfg, logp=logp), expected, rtol=1e-6)


def test_gspo_sequence_ratio_value_and_gradient():
    # Sequence ratios: row 0 exp(mean(log 1.5, 0, log 0.5)) = 0.75 ** (1/3); row 1
    # exp(mean(log 0.5, log 4)) = sqrt(2). Advantages (-1, +2), clip 0.2 / 0.5: neither clips.
    s0, s1 = 0.75 ** (1 / 3), math.sqrt(2.0)
    adv = np.array([-1.0, 2.0], np.float32)
    cfg = LossConfig(
        policy_loss="gspo", clip_low=0.2, clip_high=0.5, aggregation="seq_mean_token_mean"
    )
    loss, m = _loss(cfg, adv=adv)
    np.testing.assert_allclose(float(loss), (s0 - 2 * s1) / 2, rtol=1e-6)
    assert float(m["ratio/min"]) == pytest.approx(s0, rel=1e-6)
    assert float(m["ratio/max"]) == pytest.approx(s1, rel=1e-6)
    # d/dlogp_t of -A s / len is -A s / len: the same for every token of a row.
    expected = np.array([[s0 / 3] * 3, [-2 * s1 / 2] * 2 + [0.0]]) / 2
    np.testing.assert_allclose(_grad(cfg, adv=adv), expected, rtol=1e-5)


def test_gspo_clips_whole_sequences():
    # Clip 0.05: row 0 (A=-1) clips at 0.95, row 1 (A=+2) at 1.05; both gradients vanish.
    adv = np.array([-1.0, 2.0], np.float32)
    cfg = LossConfig(
        policy_loss="gspo", clip_low=0.05, clip_high=0.05, aggregation="seq_mean_token_mean"
    )
    loss, m = _loss(cfg, adv=adv)
    np.testing.assert_allclose(float(loss), (0.95 - 2 * 1.05) / 2, rtol=1e-6)
    np.testing.assert_allclose(_grad(cfg, adv=adv), np.zeros((2, 3)), atol=1e-7)
    assert float(m["clip/frac_low"]) == pytest.approx(3 / 5)
    assert float(m["clip/frac_high"]) == pytest.approx(2 / 5)


def test_truncated_importance_sampling_weights():
    # pi_old / pi_sampler per token: row 0 (3, 1, 0.5), row 1 (1, 1.5); cap 2 -> (2, 1, 0.5),
    # (1, 1.5). Policy loss reinforce with ratios from RATIOS.
    tis = np.array([[3.0, 1.0, 0.5], [1.0, 1.5, 1.0]], np.float32)
    sampler = (OLD - np.log(tis)).astype(np.float32)
    cfg = LossConfig(policy_loss="reinforce", tis_cap=2.0)
    loss, m = _loss(cfg, sampler_logp_NT=jnp.asarray(sampler))
    token = np.array([-1.5 * 2, -1.0 * 1, -0.5 * 0.5, 1.0 * 1, 8.0 * 1.5])
    np.testing.assert_allclose(float(loss), token.sum() / 5, rtol=1e-6)
    assert float(m["tis/weight_mean"]) == pytest.approx((2 + 1 + 0.5 + 1 + 1.5) / 5)
    assert float(m["tis/frac_capped"]) == pytest.approx(0.2)
    # Without a cap the sampler is only logged: the loss is the unweighted one.
    loss, m = _loss(LossConfig(policy_loss="reinforce"), sampler_logp_NT=jnp.asarray(sampler))
    np.testing.assert_allclose(float(loss), (-1.5 - 1.0 - 0.5 + 1.0 + 8.0) / 5, rtol=1e-6)
    assert float(m["tis/weight_mean"]) == pytest.approx((3 + 1 + 0.5 + 1 + 1.5) / 5)


def test_kl_estimators_hand_values():
    # d = log pi - log pi_ref = +log 2 and -log 2.
    l2 = math.log(2.0)
    logp = jnp.asarray([l2, -l2])
    ref = jnp.zeros(2)
    np.testing.assert_allclose(losses.kl_penalty(logp, ref, "k1"), [l2, -l2], rtol=1e-6)
    np.testing.assert_allclose(losses.kl_penalty(logp, ref, "k2"), [l2**2 / 2] * 2, rtol=1e-6)
    # k3 = exp(-d) + d - 1: 0.5 + log 2 - 1 and 2 - log 2 - 1.
    np.testing.assert_allclose(losses.kl_penalty(logp, ref, "k3"), [l2 - 0.5, 1.0 - l2], rtol=1e-6)


def test_k3_log_ratio_is_clamped():
    # d = 50: -d clamps to -10; d = -50: -d clamps to +10; d = -1000 stays finite.
    k3 = losses.kl_penalty(jnp.asarray([50.0, -50.0, -1000.0]), jnp.zeros(3), "k3")
    np.testing.assert_allclose(
        k3, [math.exp(-10) + 10 - 1, math.exp(10) - 10 - 1, math.exp(10) - 10 - 1], rtol=1e-6
    )


def test_k1_and_k3_are_unbiased_estimates_of_kl():
    # Exact expectation over a 3-way categorical: sum_x pi(x) k(x) == KL(pi || ref) for k1, k3.
    pi = np.array([0.6, 0.3, 0.1])
    ref = np.array([0.2, 0.5, 0.3])
    kl = float(np.sum(pi * np.log(pi / ref)))
    for est in ("k1", "k3"):
        k = np.asarray(losses.kl_penalty(jnp.log(pi), jnp.log(ref), est))
        np.testing.assert_allclose(np.sum(pi * k), kl, rtol=1e-5)
    k2 = np.asarray(losses.kl_penalty(jnp.log(pi), jnp.log(ref), "k2"))
    assert abs(np.sum(pi * k2) - kl) > 0.01  # k2 is biased (this test could tell them apart)


def test_kl_in_loss_adds_beta_times_kl():
    # pi_old == pi (ratio 1), zero advantages: the loss is beta * mean(k3) over tokens.
    logp = np.array([[math.log(2.0), 0.0, -1.0], [-math.log(2.0), 0.0, 0.0]], np.float32)
    ref = np.zeros_like(logp)
    cfg = LossConfig(kl_beta=0.1, kl_estimator="k3")
    loss, m = _loss(cfg, logp=logp, old=logp, adv=np.zeros(2, np.float32), ref_logp_NT=ref)
    k3 = [math.log(2) - 0.5, 0.0, math.e - 2.0, 1.0 - math.log(2), 0.0]  # row 1 pad excluded
    np.testing.assert_allclose(float(loss), 0.1 * sum(k3) / 5, rtol=1e-6)
    np.testing.assert_allclose(float(m["loss/kl"]), 0.1 * sum(k3) / 5, rtol=1e-6)
    np.testing.assert_allclose(float(m["kl/mean"]), sum(k3) / 5, rtol=1e-6)
    # d k3 / d logp = 1 - exp(-d).
    g = jax.grad(
        lambda lp: _loss(cfg, logp=lp, old=logp, adv=np.zeros(2, np.float32), ref_logp_NT=ref)[0]
    )(jnp.asarray(logp))
    expected = 0.1 / 5 * np.array([[1 - 0.5, 0.0, 1 - math.e], [1 - 2.0, 0.0, 0.0]])
    np.testing.assert_allclose(np.asarray(g), expected, rtol=1e-5, atol=1e-7)


def test_kl_in_reward_keeps_it_out_of_the_loss():
    ref = np.zeros_like(LOGP)
    cfg = LossConfig(clip_low=0.2, clip_high=0.28, kl_beta=0.1, kl_in="reward")
    loss, m = _loss(cfg, ref_logp_NT=ref)
    np.testing.assert_allclose(float(loss), 1.364, rtol=1e-6)
    assert float(m["loss/kl"]) == 0.0
    assert "kl/mean" in m


def test_kl_penalized_rewards():
    # Per-token log ratios (0.5, 0.25, pad) and (-0.1, 0.3, 0.2); beta 0.2, k1 summed per row.
    logp = np.array([[0.5, 0.25, 9.0], [-0.1, 0.3, 0.2]], np.float32)
    mask = np.array([[1, 1, 0], [1, 1, 1]], bool)
    out = losses.kl_penalized_rewards(
        jnp.asarray([1.0, 0.0]), jnp.asarray(logp), jnp.zeros((2, 3)), jnp.asarray(mask), 0.2
    )
    np.testing.assert_allclose(out, [1.0 - 0.2 * 0.75, 0.0 - 0.2 * 0.4], rtol=1e-6)
    assert out.dtype == jnp.float32


def test_entropy_bonus_and_logging():
    ent = np.array([[1.0, 2.0, 3.0], [0.5, 0.5, 99.0]], np.float32)
    base = 1.364
    loss, m = _loss(PPO, entropy_NT=jnp.asarray(ent))
    np.testing.assert_allclose(float(loss), base, rtol=1e-6)
    assert float(m["entropy/mean"]) == pytest.approx(7.0 / 5)
    cfg = LossConfig(clip_low=0.2, clip_high=0.28, entropy_coef=0.01)
    loss, m = _loss(cfg, entropy_NT=jnp.asarray(ent))
    np.testing.assert_allclose(float(loss), base - 0.01 * 7.0 / 5, rtol=1e-6)
    np.testing.assert_allclose(float(m["loss/entropy"]), -0.01 * 7.0 / 5, rtol=1e-5)


def test_missing_inputs_raise():
    with pytest.raises(ValueError, match="ref_logp_NT"):
        _loss(LossConfig(kl_beta=0.1))
    with pytest.raises(ValueError, match="entropy_NT"):
        _loss(LossConfig(entropy_coef=0.1))
    with pytest.raises(ValueError, match="sampler_logp_NT"):
        _loss(LossConfig(tis_cap=2.0))


def test_padding_garbage_never_reaches_loss_or_gradient():
    logp = LOGP.copy()
    logp[1, 2] = np.inf
    ref = np.zeros_like(LOGP)
    ref[1, 2] = np.nan
    ent = np.ones_like(LOGP)
    ent[1, 2] = np.nan
    cfg = LossConfig(kl_beta=0.1, entropy_coef=0.01, tis_cap=2.0)
    kwargs = dict(ref_logp_NT=ref, entropy_NT=jnp.asarray(ent), sampler_logp_NT=jnp.asarray(ref))

    def f(lp):
        return _loss(cfg, logp=lp, **kwargs)[0]

    loss, g = jax.value_and_grad(f)(jnp.asarray(logp))
    assert np.isfinite(float(loss))
    assert np.all(np.isfinite(np.asarray(g)))
    assert float(g[1, 2]) == 0.0
    _, m = _loss(cfg, logp=logp, **kwargs)
    assert all(np.isfinite(float(v)) for v in m.values())


def test_empty_batch_gives_zero_not_nan():
    mask = np.zeros_like(MASK)
    for agg in losses.AGGREGATIONS:
        loss, m = _loss(LossConfig(aggregation=agg), mask=mask)
        assert float(loss) == 0.0
        assert all(np.isfinite(float(v)) for v in m.values())


def test_normalizers():
    mask = jnp.asarray([[1, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0]], bool)
    assert float(losses.loss_normalizer(mask, "token_mean")) == 4.0
    assert float(losses.loss_normalizer(mask, "seq_mean_token_mean")) == 2.0
    assert float(losses.loss_normalizer(mask, "seq_mean_token_sum")) == 2.0
    assert float(losses.loss_normalizer(mask, "dr_grpo_constant")) == 12.0
    assert float(losses.loss_normalizer(mask, "dr_grpo_constant", max_new_tokens=10)) == 30.0
    w = np.asarray(losses.token_weights(mask, "seq_mean_token_mean"))
    np.testing.assert_allclose(w, [[1 / 3] * 3 + [0], [0] * 4, [1, 0, 0, 0]], rtol=1e-6)


# Micro-batching: the loss of a tiny softmax "model" whose logits are the parameters.
N, T, V = 6, 5, 6
MICRO_ROWS = np.array([[0, 1], [2, 3], [4, 5]])  # tokens per micro-batch: 9, 1, 5


def _batch():
    rng = np.random.default_rng(0)
    lengths = [5, 4, 1, 0, 3, 2]  # includes an empty row
    mask = np.arange(T)[None, :] < np.array(lengths)[:, None]
    theta = rng.normal(size=(N, T, V)).astype(np.float32)
    targets = jnp.asarray(rng.integers(0, V, size=(N, T)))
    old = np.asarray(_logp_entropy(jnp.asarray(theta), targets)[0]) + 0.3 * rng.normal(size=(N, T))
    ref = old + 0.2 * rng.normal(size=(N, T))
    sampler = old + 0.5 * rng.normal(size=(N, T))
    adv = rng.normal(size=(N,))
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return f32(theta), targets, f32(old), f32(ref), f32(sampler), f32(adv), jnp.asarray(mask)


def _logp_entropy(theta_NTV, targets_NT):
    logp_NTV = jax.nn.log_softmax(theta_NTV, axis=-1)
    logp_NT = jnp.take_along_axis(logp_NTV, targets_NT[..., None], -1)[..., 0]
    return logp_NT, -jnp.sum(jnp.exp(logp_NTV) * logp_NTV, axis=-1)


def _batch_loss(theta, rows, cfg, normalizer, batch):
    _, targets, old, ref, sampler, adv, mask = batch
    logp, ent = _logp_entropy(theta[rows], targets[rows])
    loss, _ = losses.policy_loss(
        logp, old[rows], adv[rows], mask[rows], cfg, normalizer=normalizer,
        ref_logp_NT=ref[rows], sampler_logp_NT=sampler[rows], entropy_NT=ent,
    )  # fmt: skip
    return loss


@pytest.mark.parametrize(
    "aggregation, policy",
    [(agg, "ppo_clip") for agg in losses.AGGREGATIONS]
    + [("seq_mean_token_mean", "gspo"), ("token_mean", "cispo"), ("seq_mean_token_sum", "sapo")],
)
def test_micro_batch_gradients_sum_to_full_batch(aggregation, policy):
    batch = _batch()
    theta = batch[0]
    cfg = LossConfig(
        policy_loss=policy, clip_low=0.2, clip_high=0.28, aggregation=aggregation,
        dual_clip=3.0 if policy in ("ppo_clip", "gspo") else None, kl_beta=0.05, entropy_coef=0.01,
        tis_cap=2.0,
    )  # fmt: skip

    @jax.jit  # one compilation: the full batch, and the micro-batches under vmap
    def full_and_accumulated(theta, batch):
        vg = jax.value_and_grad(_batch_loss)
        z = losses.loss_normalizer(batch[-1], aggregation, max_new_tokens=8)
        full = vg(theta, jnp.arange(N), cfg, z, batch)
        micro_M = jax.vmap(lambda rows: vg(theta, rows, cfg, z, batch))(MICRO_ROWS)
        # The negative control: each micro-batch normalised by its own tokens/rows, averaged.
        naive_g = jnp.mean(
            jax.vmap(lambda rows: jax.grad(_batch_loss)(theta, rows, cfg, None, batch))(MICRO_ROWS),
            axis=0,
        )
        return full, jax.tree.map(lambda x: jnp.sum(x, axis=0), micro_M), naive_g

    (full_loss, full_g), (acc_loss, acc_g), naive_g = full_and_accumulated(theta, batch)
    np.testing.assert_allclose(float(acc_loss), float(full_loss), rtol=1e-5)
    np.testing.assert_allclose(acc_g, full_g, rtol=1e-5, atol=1e-7)
    assert float(jnp.max(jnp.abs(full_g))) > 1e-3  # the comparison is not between zeros
    if aggregation != "dr_grpo_constant":  # a constant normaliser is already global
        # Local normalisers re-weight tokens: the equality is due to the global normaliser.
        assert float(jnp.max(jnp.abs(naive_g - full_g))) > 1e-3


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(policy_loss="ppo"), "policy_loss"),
        (dict(clip_low=-0.1), "clip_low"),
        (dict(clip_low=1.0), "clip_low"),
        (dict(clip_high=float("inf")), "clip_high"),
        (dict(dual_clip=1.0), "dual_clip"),
        (dict(dual_clip=3.0, policy_loss="reinforce"), "dual_clip"),
        (dict(aggregation="mean"), "aggregation"),
        (dict(kl_estimator="k4"), "kl_estimator"),
        (dict(kl_beta=-0.1), "kl_beta"),
        (dict(kl_in="both"), "kl_in"),
        (dict(entropy_coef=float("nan")), "entropy_coef"),
        (dict(tis_cap=0.0), "tis_cap"),
        (dict(dual_clip=3.0, policy_loss="cispo"), "dual_clip"),
        (dict(sapo_tau_pos=0.0), "sapo_tau_pos"),
        (dict(sapo_tau_neg=-1.0), "sapo_tau_neg"),
        (dict(tis_level="seq"), "tis_level"),
        (dict(icepop_high=0.9), "icepop_high"),
        (dict(icepop_low=1.0, icepop_high=5.0), "icepop_low"),
        (dict(icepop_high=5.0, tis_cap=2.0), "icepop_high"),
    ],
)
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        LossConfig(**kwargs)


def test_config_is_hashable():
    assert hash(LossConfig()) == hash(LossConfig())
    assert LossConfig(kl_beta=0.1).kl_in_loss
    assert not LossConfig(kl_beta=0.1, kl_in="reward").kl_in_loss
    assert not LossConfig().kl_in_loss


# Objectives and corrections after GRPO, each against its formula on the fixed batch above.


def test_cispo_clips_the_weight_never_the_gradient():
    cfg = LossConfig(policy_loss="cispo", clip_low=0.2, clip_high=0.28)
    # Weights clip(r, 0.8, 1.28): row 0 (1.28, 1.0, 0.8), row 1 (0.8, 1.28); loss -A w log pi.
    w = np.array([[1.28, 1.0, 0.8], [0.8, 1.28, 0.0]], np.float32)
    A = ADV[:, None]
    loss, m = _loss(cfg)
    np.testing.assert_allclose(float(loss), np.sum(np.where(MASK, -A * w * LOGP, 0)) / 5, rtol=1e-6)
    # Every token keeps a gradient, the clipped ones (r = 1.5, r = 0.5 with A < 0) included;
    # PPO's clip zeroes exactly those two.
    np.testing.assert_allclose(_grad(cfg), np.where(MASK, -A * w / 5, 0), rtol=1e-6)
    assert (_grad(PPO)[[0, 1], [0, 0]] == 0).all()
    assert float(m["clip/frac_high"]) == pytest.approx(2 / 5)  # r = 1.5 and 4.0
    assert float(m["clip/frac_low"]) == pytest.approx(2 / 5)  # r = 0.5 twice


def test_sapo_soft_gate_value_and_gradient():
    cfg = LossConfig(policy_loss="sapo", sapo_tau_pos=1.0, sapo_tau_neg=1.05)
    tau = np.where(ADV > 0, 1.0, 1.05)[:, None]
    s = 1 / (1 + np.exp(-tau * (RATIOS - 1)))
    A = ADV[:, None]
    loss, _ = _loss(cfg)
    np.testing.assert_allclose(
        float(loss), np.sum(np.where(MASK, -A * 4 / tau * s, 0)) / 5, rtol=1e-5
    )
    # d/dlog pi of f(r) = 4 s (1 - s) r: 1 on-policy, smaller as r leaves 1.
    np.testing.assert_allclose(
        _grad(cfg), np.where(MASK, -A * 4 * s * (1 - s) * RATIOS / 5, 0), rtol=1e-5, atol=1e-7
    )
    on_policy = dict(logp=OLD, old=OLD)
    np.testing.assert_allclose(
        _grad(cfg, **on_policy),
        _grad(LossConfig(policy_loss="reinforce"), **on_policy),
        rtol=1e-6,
    )


def _verl_low_var_kl(logprob, ref_logprob):
    """verl's `kl_penalty_forward(..., "low_var_kl")` (verl/trainer/ppo/core_algos.py)."""
    kl = np.clip(ref_logprob - logprob, -20, 20)
    return np.clip(np.exp(kl) - kl - 1, -10, 10)


def test_k3_plus_is_verls_k3_plus():
    # verl's "k3+" (`kl_penalty`): value low_var_kl's, gradient that of k2 = d^2 / 2, i.e. d.
    l2 = math.log(2.0)
    d = np.array([l2, -l2, -2.0, 30.0, -30.0, -5.0, 1e4], np.float32)
    ref = jnp.zeros(len(d))
    # By hand: 0.5 + log 2 - 1, 2 - log 2 - 1, e^2 - 2 - 1; d = 30: -d clamps to -20 and
    # e^-20 + 20 - 1 = 19 clamps to 10; d = -30: e^20 - 21 clamps to 10; d = -5: e^5 - 6 = 142
    # clamps to 10; d = 1e4: 10, exactly (not rounded to the spacing of d^2 / 2 = 5e7).
    by_hand = [l2 - 0.5, 1 - l2, math.exp(2) - 3, 10, 10, 10, 10]
    np.testing.assert_allclose(_verl_low_var_kl(d.astype(np.float64), 0.0), by_hand, rtol=1e-6)
    got = losses.kl_penalty(jnp.asarray(d), ref, "k3_plus")
    np.testing.assert_allclose(got, by_hand, rtol=1e-6)
    assert float(got[-1]) == 10.0
    np.testing.assert_array_equal(got, losses.kl_penalty(jnp.asarray(d), ref, "low_var_kl"))
    grad = lambda est: jax.grad(lambda x: jnp.sum(losses.kl_penalty(x, ref, est)))(jnp.asarray(d))  # noqa: E731
    np.testing.assert_allclose(grad("k3_plus"), d, rtol=1e-6)  # d, k2's, unclamped
    np.testing.assert_allclose(grad("k3")[:3], [0.5, -1.0, 1 - math.exp(2)], rtol=1e-6)
    # Our k3 clamps only the log ratio: its value at d = -30 is e^10 - 11, not 10.
    k3 = losses.kl_penalty(jnp.asarray(d), ref, "k3")
    assert float(k3[4]) == pytest.approx(math.exp(10) - 11, rel=1e-6)


def test_low_var_kl_is_verls_twice_clamped_k3():
    l2 = math.log(2.0)
    d = jnp.asarray([l2, -15.0, 25.0, -25.0])
    got = losses.kl_penalty(d, jnp.zeros(4), "low_var_kl")
    # -d clamped to [-20, 20], then the value to [-10, 10].
    np.testing.assert_allclose(got, [l2 - 0.5, 10.0, 10.0, 10.0], rtol=1e-6)
    np.testing.assert_allclose(got, _verl_low_var_kl(np.asarray(d, np.float64), 0.0), rtol=1e-6)
    g = jax.grad(lambda x: jnp.sum(losses.kl_penalty(x, jnp.zeros(4), "low_var_kl")))(d)
    np.testing.assert_allclose(g, [0.5, 0.0, 0.0, 0.0], atol=1e-6)  # clamped values: no gradient
    # Ours keeps -15's value and gradient (log ratio clamp at 10 only).
    assert float(losses.kl_penalty(d, jnp.zeros(4), "k3")[1]) == pytest.approx(
        math.exp(10) - 11, rel=1e-6
    )


# pi_old / pi_sampler per token: row 0 (3, 1, 0.5), row 1 (1, 1.5).
TIS = np.array([[3.0, 1.0, 0.5], [1.0, 1.5, 1.0]], np.float32)
SAMPLER = (OLD - np.log(TIS)).astype(np.float32)
REINFORCE_TOKENS = np.array([-1.5, -1.0, -0.5, 1.0, 8.0])  # -A r, masked tokens in order


def test_sequence_level_importance_weight():
    # One weight per completion: row 0 3 * 1 * 0.5 = 1.5, row 1 1 * 1.5 = 1.5 (padding adds 0).
    for cap, w in ((2.0, 1.5), (1.2, 1.2)):
        cfg = LossConfig(policy_loss="reinforce", tis_cap=cap, tis_level="sequence")
        loss, m = _loss(cfg, sampler_logp_NT=jnp.asarray(SAMPLER))
        np.testing.assert_allclose(float(loss), w * REINFORCE_TOKENS.sum() / 5, rtol=1e-6)
        assert float(m["tis/weight_mean"]) == pytest.approx(w)


def test_icepop_drops_tokens_outside_the_bounds_and_weights_the_rest():
    cfg = LossConfig(policy_loss="reinforce", icepop_low=0.5, icepop_high=2.0)
    loss, m = _loss(cfg, sampler_logp_NT=jnp.asarray(SAMPLER))
    # k = 3 is dropped; k = 0.5 is kept (bounds inclusive): -1 - 0.25 + 1 + 12.
    np.testing.assert_allclose(float(loss), 11.75 / 5, rtol=1e-6)
    assert float(m["icepop/frac_masked"]) == pytest.approx(0.2)
    g = _grad(cfg, sampler_logp_NT=jnp.asarray(SAMPLER))
    assert g[0, 0] == 0 and g[0, 1] != 0


def test_sampler_trainer_mismatch_metrics():
    _, m = _loss(LossConfig(), sampler_logp_NT=jnp.asarray(SAMPLER))
    lr = np.log(np.array([3.0, 1.0, 0.5, 1.0, 1.5]))
    assert float(m["mismatch/mean"]) == pytest.approx(np.abs(lr).mean(), rel=1e-5)
    assert float(m["mismatch/max"]) == pytest.approx(math.log(3.0), rel=1e-5)
    assert float(m["mismatch/kl"]) == pytest.approx(np.mean(np.exp(lr) - lr - 1), rel=1e-5)
    _, same = _loss(LossConfig(), sampler_logp_NT=jnp.asarray(OLD))
    assert float(same["mismatch/max"]) == 0 and float(same["mismatch/kl"]) == 0


def test_kimi_objective_value_and_gradient_by_hand():
    # Two completions: A = r - mean(r) = 1 and -2; tau = 0.5; "seq_mean_token_sum" (Z = 2 rows).
    # Row 0: -A log pi(y) = -(-1 - 2) = 3, summed log ratio s = 0.5, tau / 2 s^2 = 0.0625.
    # Row 1: -(-2)(-0.5) = -1, s = 0. Loss (3.0625 - 1) / 2 = 1.03125.
    logp = jnp.array([[-1.0, -2.0], [-0.5, 0.0]])
    old = jnp.array([[-1.5, -2.0], [-0.5, 7.0]])
    adv = jnp.array([1.0, -2.0])
    mask = jnp.array([[True, True], [True, False]])
    cfg = LossConfig(policy_loss="kimi", kimi_tau=0.5, aggregation="seq_mean_token_sum")
    loss, metrics = losses.policy_loss(logp, old, adv, mask, cfg)
    np.testing.assert_allclose(loss, 1.03125, rtol=1e-6)
    # d/d log pi_t: (-A + tau s) / Z on every token of the row: (-1 + 0.25) / 2 and 2 / 2.
    g = jax.grad(lambda x: losses.policy_loss(x, old, adv, mask, cfg)[0])(logp)
    np.testing.assert_allclose(g, [[-0.375, -0.375], [1.0, 0.0]], atol=1e-7)
    assert float(metrics["clip/frac_low"]) == float(metrics["clip/frac_high"]) == 0.0
    # On-policy the squared term vanishes: the REINFORCE gradient with the group-mean baseline.
    on = lambda x: losses.policy_loss(x, jax.lax.stop_gradient(x), adv, mask, cfg)[0]  # noqa: E731
    reinforce = LossConfig(policy_loss="reinforce", aggregation="seq_mean_token_sum")
    np.testing.assert_allclose(
        jax.grad(on)(logp),
        jax.grad(
            lambda x: losses.policy_loss(x, jax.lax.stop_gradient(x), adv, mask, reinforce)[0]
        )(logp),
        atol=1e-7,
    )
    with pytest.raises(ValueError, match="kimi_tau=-1"):
        LossConfig(policy_loss="kimi", kimi_tau=-1.0)
