"""Every advantage estimator against values computed by hand."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.rl import advantages as adv_lib
from rlvr_jax.rl.advantages import AdvantageConfig


def _adv(rewards, **kwargs):
    adv, stats = adv_lib.compute_advantages(
        jnp.asarray(rewards, jnp.float32), AdvantageConfig(**kwargs)
    )
    return np.asarray(adv), {k: float(v) for k, v in stats.items()}


def test_worked_example_grpo_population_std():
    # mean 0.5, population std 0.5: (1, 1, -1, -1); eps=1e-4 gives 0.5 / 0.5001.
    adv, _ = _adv([[1, 1, 0, 0]], estimator="grpo", eps=0.0)
    np.testing.assert_array_equal(adv, [[1, 1, -1, -1]])
    adv, _ = _adv([[1, 1, 0, 0]], estimator="grpo")
    np.testing.assert_allclose(adv, [[1, 1, -1, -1]], atol=1e-3)
    np.testing.assert_allclose(adv, [[0.5 / 0.5001] * 2 + [-0.5 / 0.5001] * 2], rtol=1e-6)


def test_grpo_sample_std():
    # Sample variance of (1, 1, 0, 0) is 4 * 0.25 / 3 = 1/3.
    adv, _ = _adv([[1, 1, 0, 0]], estimator="grpo", std_kind="sample", eps=0.0)
    a = 0.5 / math.sqrt(1 / 3)
    np.testing.assert_allclose(adv, [[a, a, -a, -a]], rtol=1e-6)


def test_grpo_uneven_group_hand_values():
    # Rewards (1, 0, 0, 0): mean 1/4, population std sqrt(3)/4.
    adv, _ = _adv([[1, 0, 0, 0]], estimator="grpo", eps=0.0)
    s = math.sqrt(3) / 4
    np.testing.assert_allclose(adv, [[0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s]], rtol=1e-6)


def test_dr_grpo_is_mean_centred_without_std():
    adv, _ = _adv([[1, 1, 0, 0], [2, 0, 0, 0]], estimator="dr_grpo")
    np.testing.assert_allclose(adv, [[0.5, 0.5, -0.5, -0.5], [1.5, -0.5, -0.5, -0.5]])
    assert AdvantageConfig(estimator="dr_grpo").std_scaling == "none"


def test_rloo_leave_one_out():
    adv, _ = _adv([[1, 1, 0, 0]], estimator="rloo")
    np.testing.assert_allclose(adv, [[2 / 3, 2 / 3, -2 / 3, -2 / 3]], rtol=1e-6)
    # (3, 0, 1): 3 - 1/2, 0 - 2, 1 - 3/2.
    adv, _ = _adv([[3, 0, 1]], estimator="rloo")
    np.testing.assert_allclose(adv, [[2.5, -2.0, -0.5]], rtol=1e-6)


def test_rloo_is_g_over_g_minus_1_times_dr_grpo():
    r = np.random.default_rng(0).normal(size=(5, 6))
    rloo, _ = _adv(r, estimator="rloo")
    dr, _ = _adv(r, estimator="dr_grpo")
    np.testing.assert_allclose(rloo, dr * 6 / 5, rtol=1e-5, atol=1e-6)


def test_rloo_needs_two_samples():
    with pytest.raises(ValueError, match="G >= 2"):
        _adv([[1.0], [0.0]], estimator="rloo")


def test_reinforce_batch_mean_baseline():
    # Batch mean (1 + 1 + 1 + 0 + 0 + 0 + 0 + 1) / 8 = 0.5; groups play no role.
    adv, stats = _adv([[1, 1, 1, 1], [0, 0, 0, 0]], estimator="reinforce")
    np.testing.assert_allclose(adv, [[0.5] * 4, [-0.5] * 4])
    assert stats["adv/frac_zero_variance"] == 1.0
    adv, _ = _adv([[1, 1, 1, 1], [0, 0, 0, 0]], estimator="reinforce", std_scaling="batch")
    np.testing.assert_allclose(adv, [[0.5 / 0.5001] * 4, [-0.5 / 0.5001] * 4], rtol=1e-6)


def test_reinforce_pp_baseline_whitens_group_centred_values():
    # Group-centred: (0.5, 0.5, -0.5, -0.5) and (0, 0, 0, 0); batch mean 0, population std
    # sqrt(4 * 0.25 / 8) = sqrt(1/8).
    adv, _ = _adv([[1, 1, 0, 0], [1, 1, 1, 1]], estimator="reinforce_pp_baseline", eps=0.0)
    a = 0.5 / math.sqrt(1 / 8)
    np.testing.assert_allclose(adv, [[a, a, -a, -a], [0, 0, 0, 0]], rtol=1e-6)
    # (3, 0, 0), (2, 0, 1) centre to (2, -1, -1), (1, -1, 0); batch mean 0, population std
    # sqrt((4 + 1 + 1 + 1 + 1 + 0) / 6) = sqrt(4/3). The batch std of the raw rewards would
    # differ (mean 1, sqrt(10/6 - 1)), so this pins the whitening to the centred values.
    adv, _ = _adv([[3, 0, 0], [2, 0, 1]], estimator="reinforce_pp_baseline", eps=0.0)
    s = math.sqrt(4 / 3)
    np.testing.assert_allclose(adv, [[2 / s, -1 / s, -1 / s], [1 / s, -1 / s, 0]], rtol=1e-6)


def test_batch_std_scaling_uses_std_of_all_rewards():
    # Lite PPO: group mean, then the std of all 8 rewards (mean 0.625, population std
    # sqrt(0.625 * 0.375)).
    adv, _ = _adv([[1, 1, 0, 0], [1, 1, 1, 0]], estimator="grpo", std_scaling="batch", eps=0.0)
    s = math.sqrt(0.625 * 0.375)
    expected = [[0.5 / s, 0.5 / s, -0.5 / s, -0.5 / s], [0.25 / s] * 3 + [-0.75 / s]]
    np.testing.assert_allclose(adv, expected, rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(estimator="grpo"),
        dict(estimator="grpo", eps=0.0),
        dict(estimator="grpo", std_kind="sample"),
        dict(estimator="grpo", std_scaling="batch"),
        dict(estimator="dr_grpo"),
        dict(estimator="rloo"),
        dict(estimator="reinforce_pp_baseline", eps=0.0),
    ],
)
def test_zero_variance_groups_get_exactly_zero_and_are_counted(kwargs):
    # 0.1 * 3 / 3 != 0.1 in floating point: the zero must not depend on the mean being exact.
    rewards = [[0.1, 0.1, 0.1], [1, 1, 1], [0, 0, 0], [1, 0, 0]]
    adv, stats = _adv(rewards, **kwargs)
    assert np.all(adv[:3] == 0.0)
    assert np.all(np.isfinite(adv))
    assert np.all(adv[3] != 0.0)
    assert stats["adv/frac_zero_variance"] == 0.75
    # rewards > 0 count as correct: groups 0 and 1 are all correct, group 2 all wrong.
    assert stats["adv/frac_all_correct"] == 0.5
    assert stats["adv/frac_all_wrong"] == 0.25


def test_all_equal_batch_is_zero_for_every_baseline_estimator():
    # Expert iteration has no baseline: it trains on every verified sample (tested below).
    for est in set(adv_lib.ESTIMATORS) - {"expert_iteration", "gae"}:
        adv, _ = _adv([[0.3, 0.3], [0.3, 0.3]], estimator=est, eps=0.0)
        assert np.all(adv == 0.0), est


def test_correct_mask_overrides_the_default_threshold():
    rewards = jnp.asarray([[0.1, 0.1], [0.1, 0.0]])
    correct = jnp.asarray([[False, False], [True, False]])
    _, stats = adv_lib.compute_advantages(rewards, AdvantageConfig(), correct_BG=correct)
    assert float(stats["adv/frac_all_wrong"]) == 0.5
    assert float(stats["adv/frac_all_correct"]) == 0.0


def test_stats_values():
    _, stats = _adv([[1, 1, 0, 0], [2, 0, 0, 0]], estimator="dr_grpo")
    assert stats["adv/abs_max"] == 1.5
    assert stats["reward/mean"] == 0.5
    # Deviations from 0.5: seven of +-0.5 and one of 1.5.
    np.testing.assert_allclose(stats["reward/std"], math.sqrt((7 * 0.25 + 2.25) / 8), rtol=1e-6)
    np.testing.assert_allclose(stats["adv/mean"], 0.0, atol=1e-7)


def test_jit_and_bf16_rewards_give_f32():
    cfg = AdvantageConfig()
    f = jax.jit(adv_lib.compute_advantages, static_argnums=1)
    adv, stats = f(jnp.asarray([[1, 0, 1, 1]], jnp.bfloat16), cfg)
    assert adv.dtype == jnp.float32
    assert all(v.dtype == jnp.float32 for v in stats.values())
    np.testing.assert_allclose(np.asarray(adv)[0, 1], -0.75 / (math.sqrt(3) / 4 + 1e-4), rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(estimator="ppo"), "estimator"),
        (dict(std_scaling="global"), "std_scaling"),
        (dict(std_kind="unbiased"), "std_kind"),
        (dict(eps=-1e-3), "eps"),
        (dict(eps=float("nan")), "eps"),
        (dict(estimator="dr_grpo", std_scaling="group"), "std_scaling"),
        (dict(estimator="reinforce_pp_baseline", std_scaling="none"), "std_scaling"),
    ],
)
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        AdvantageConfig(**kwargs)


def test_config_is_hashable_and_resolves_defaults():
    assert hash(AdvantageConfig()) == hash(AdvantageConfig(std_scaling="group"))
    assert AdvantageConfig().std_scaling == "group"
    assert AdvantageConfig(estimator="rloo").std_scaling == "none"
    assert AdvantageConfig(estimator="reinforce_pp_baseline").std_scaling == "batch"


def test_sample_std_needs_two_values():
    with pytest.raises(ValueError, match="std_kind='sample'"):
        _adv([[1.0], [0.0]], estimator="grpo", std_kind="sample")


def test_expert_iteration_keeps_verified_samples_only():
    rewards = jnp.array([[1.0, 0.5, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    correct = jnp.array([[True, False, False, True], [True, True, True, True]])
    cfg = AdvantageConfig("expert_iteration")
    adv, stats = adv_lib.compute_advantages(rewards, cfg, correct)
    # 1 for every verified completion, all-correct groups included (no group baseline).
    np.testing.assert_array_equal(np.asarray(adv), [[1, 0, 0, 1], [1, 1, 1, 1]])
    assert float(stats["adv/frac_all_correct"]) == 0.5
    # Without a correct mask, a positive reward counts as verified.
    adv, _ = adv_lib.compute_advantages(rewards, cfg)
    np.testing.assert_array_equal(np.asarray(adv), [[1, 1, 0, 1], [1, 1, 1, 1]])
    with pytest.raises(ValueError, match="std_scaling='group'"):
        AdvantageConfig("expert_iteration", std_scaling="group")


def _pass_at_k_by_enumeration(correct_G, k):
    """The mean pass@k of the k-subsets holding each sample, less the group's, over its std."""
    subsets = list(itertools.combinations(range(len(correct_G)), k))
    value = {s: float(any(correct_G[i] for i in s)) for s in subsets}
    r = np.mean(list(value.values()))
    std = math.sqrt(r * (1 - r))
    if std == 0:
        return np.zeros(len(correct_G))
    return np.array(
        [
            (np.mean([v for s, v in value.items() if i in s]) - r) / std
            for i in range(len(correct_G))
        ]
    )


def test_pass_at_k_hand_case_and_enumeration():
    cfg = AdvantageConfig("pass_at_k", pass_k=2)
    # G = 4, one correct: R = 1 - C(3,2)/C(4,2) = 1/2, s = 1/2; correct (1 - 1/2)/s = 1, wrong
    # (1 - 1/2 - C(2,1)/C(3,1)) / s = -1/3.
    adv, _ = adv_lib.compute_advantages(jnp.asarray([[1.0, 0.0, 0.0, 0.0]]), cfg)
    np.testing.assert_allclose(adv, [[1.0, -1 / 3, -1 / 3, -1 / 3]], rtol=1e-6)
    rng = np.random.default_rng(0)
    for G, k in ((5, 1), (5, 2), (5, 3), (6, 4), (6, 6)):
        correct_BG = np.stack([np.arange(G) < c for c in range(G + 1)])
        rng.permuted(correct_BG, axis=1, out=correct_BG)
        adv, _ = adv_lib.compute_advantages(
            jnp.asarray(correct_BG, jnp.float32), AdvantageConfig("pass_at_k", pass_k=k)
        )
        want = np.stack([_pass_at_k_by_enumeration(c, k) for c in correct_BG])
        np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-6, err_msg=f"G={G} k={k}")


def test_pass_at_1_is_grpo_on_correctness():
    correct = jnp.asarray([[1.0, 0.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0, 0.0]])
    grpo, _ = adv_lib.compute_advantages(correct, AdvantageConfig("grpo", eps=0.0))
    pass1, _ = adv_lib.compute_advantages(correct, AdvantageConfig("pass_at_k", pass_k=1))
    np.testing.assert_allclose(pass1, grpo, rtol=1e-6)
    with pytest.raises(ValueError, match="pass_k=6 must be in"):
        adv_lib.compute_advantages(correct, AdvantageConfig("pass_at_k", pass_k=6))
    with pytest.raises(ValueError, match="pass_k=0"):
        AdvantageConfig("pass_at_k", pass_k=0)


def test_reinforce_pp_whitening_over_tokens_weighs_long_completions():
    # Centred (2, -1, -1), (1, -1, 0) with lengths (1, 3, 1), (2, 1, 1): the token-weighted mean
    # is (2 - 3 - 1 + 2 - 1 + 0) / 9 = -1/9; the population variance over the 9 tokens
    # sum_i len_i (a_i - m)^2 / 9.
    rewards = jnp.asarray([[3.0, 0.0, 0.0], [2.0, 0.0, 1.0]])
    lengths = jnp.asarray([[1, 3, 1], [2, 1, 1]])
    a = np.array([[2.0, -1.0, -1.0], [1.0, -1.0, 0.0]])
    w = np.asarray(lengths, np.float64)
    m = (w * a).sum() / w.sum()
    for kind, ddof in (("population", 0), ("sample", 1)):
        cfg = AdvantageConfig("reinforce_pp_baseline", whiten_over="tokens", std_kind=kind, eps=0.0)
        adv, _ = adv_lib.compute_advantages(rewards, cfg, lengths_BG=lengths)
        std = math.sqrt((w * (a - m) ** 2).sum() / (w.sum() - ddof))
        np.testing.assert_allclose(adv, (a - m) / std, rtol=1e-5)
    # Equal lengths: the same as whitening over completions.
    ones = jnp.ones((2, 3), jnp.int32)
    tokens = AdvantageConfig("reinforce_pp_baseline", whiten_over="tokens", eps=0.0)
    by_tokens, _ = adv_lib.compute_advantages(rewards, tokens, lengths_BG=3 * ones)
    by_rows, _ = adv_lib.compute_advantages(
        rewards, AdvantageConfig("reinforce_pp_baseline", eps=0.0)
    )
    np.testing.assert_allclose(by_tokens, by_rows, rtol=1e-6)
    with pytest.raises(ValueError, match="needs lengths_BG"):
        adv_lib.compute_advantages(rewards, tokens)
    with pytest.raises(ValueError, match="whiten_over='tokens' applies"):
        AdvantageConfig("grpo", whiten_over="tokens")
