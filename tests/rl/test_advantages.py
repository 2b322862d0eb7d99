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


# The peers' formulas, transcribed from their code: verl's `compute_*_advantage*` in
# verl/trainer/ppo/core_algos.py with `masked_mean`, `masked_var` and `masked_whiten` of
# verl/utils/torch_functional.py; TRL's `GRPOTrainer._generate_and_score_completions` with
# `nanstd` of trl/trainer/utils.py. One row per completion, one column per token, as there.


def _verl_masked_whiten(values_NT, mask_NT):
    mask_NT = mask_NT.astype(np.float64)
    mean = (values_NT * mask_NT).sum() / (mask_NT.sum() + 1e-8)
    var = ((values_NT - mean) ** 2 * mask_NT).sum() / (mask_NT.sum() + 1e-8)
    var = var * mask_NT.sum() / (mask_NT.sum() - 1)  # unbiased=True
    return (values_NT - mean) / np.sqrt(var + 1e-8)


def _verl_reinforce_pp_baseline(scores_N, mask_NT, index_N):
    scores_N = scores_N.astype(np.float64).copy()
    means = {}
    for idx in set(index_N):
        group = scores_N[index_N == idx]
        means[idx] = 0.0 if len(group) == 1 else group.mean()
    scores_N = scores_N - np.array([means[i] for i in index_N])
    scores_NT = scores_N[:, None] * mask_NT
    return _verl_masked_whiten(scores_NT, mask_NT) * mask_NT


def _verl_gae(rewards_NT, values_NT, mask_NT, gamma, lam):
    next_values, last = np.zeros(len(rewards_NT)), np.zeros(len(rewards_NT))
    reversed_ = []
    for t in reversed(range(rewards_NT.shape[1])):
        delta = rewards_NT[:, t] + gamma * next_values - values_NT[:, t]
        last_ = delta + gamma * lam * last
        m = mask_NT[:, t]
        next_values = values_NT[:, t] * m + (1 - m) * next_values
        last = last_ * m + (1 - m) * last
        reversed_.append(last)
    adv_NT = np.stack(reversed_[::-1], axis=1)
    return _verl_masked_whiten(adv_NT, mask_NT), adv_NT + values_NT


def _rows_mask(lengths_BG, T):
    return (np.arange(T)[None, :] < np.asarray(lengths_BG).reshape(-1, 1)).astype(np.float64)


VERL_RPP = AdvantageConfig("reinforce_pp_baseline", whiten_over="tokens", whiten="verl")


def test_reinforce_pp_baseline_verl_by_hand():
    # Rewards (1, 0) and (1, 1) with lengths (2, 1) and (1, 3). verl: centred (0.5, -0.5) and
    # (0, 0); over the 7 tokens the mean is (2 * 0.5 - 0.5) / 7 = 1/14, the sample variance
    # (2 (3/7)^2 + (4/7)^2 + 4 (1/14)^2) / 6 = 5/42, so each value is (a - 1/14) sqrt(42/5):
    # the all-correct group gets -sqrt(8.4)/14 = -0.207, not zero.
    lengths = jnp.asarray([[2, 1], [1, 3]])
    adv, _ = adv_lib.compute_advantages(
        jnp.asarray([[1.0, 0.0], [1.0, 1.0]]), VERL_RPP, None, lengths
    )
    s = math.sqrt(8.4)
    np.testing.assert_allclose(adv, [[3 / 7 * s, -4 / 7 * s], [-s / 14, -s / 14]], rtol=1e-5)
    # The framework's own whitening keeps the zero-variance group at zero.
    ours = AdvantageConfig("reinforce_pp_baseline", whiten_over="tokens")
    adv, _ = adv_lib.compute_advantages(jnp.asarray([[1.0, 0.0], [1.0, 1.0]]), ours, None, lengths)
    assert np.all(np.asarray(adv)[1] == 0.0)


@pytest.mark.parametrize("G", [1, 4])
def test_reinforce_pp_baseline_verl_equals_verls_formula(G):
    rng = np.random.default_rng(G)
    B, T = 5, 9
    rewards = rng.integers(0, 3, size=(B, G)).astype(np.float32) * 0.1  # equal groups, 0.1s
    rewards[0] = 0.1
    if G > 1:
        rewards[1] = rewards[1, 0]
    lengths = rng.integers(0, T + 1, size=(B, G))
    lengths[0, 0] = T
    adv, _ = adv_lib.compute_advantages(jnp.asarray(rewards), VERL_RPP, None, jnp.asarray(lengths))
    mask_NT = _rows_mask(lengths, T)
    want_NT = _verl_reinforce_pp_baseline(rewards.reshape(-1), mask_NT, np.repeat(np.arange(B), G))
    got_NT = np.asarray(adv).reshape(-1)[:, None] * mask_NT
    np.testing.assert_allclose(got_NT, want_NT, rtol=1e-5, atol=1e-6)
    assert np.abs(want_NT).max() > 0.5  # the comparison is not between zeros


def test_gae_verl_whitening_equals_verls_gae():
    rng = np.random.default_rng(0)
    N, T = 4, 8
    mask = _rows_mask([8, 5, 1, 6], T)
    mask[0, 3] = mask[3, 1] = 0  # observation tokens inside a row
    rewards = rng.normal(size=(N, T)) * mask
    values = rng.normal(size=(N, T))
    cfg = AdvantageConfig("gae", whiten="verl", gamma=0.9, lam=0.8)
    adv, ret, _ = adv_lib.gae_advantages(
        jnp.asarray(rewards, jnp.float32),
        jnp.asarray(values, jnp.float32),
        jnp.asarray(mask, bool),
        cfg,
    )
    want_adv, want_ret = _verl_gae(rewards, values, mask, 0.9, 0.8)
    on = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(adv)[on], want_adv[on], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(ret)[on], want_ret[on], rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(adv)[~on] == 0.0)
    # The default whitening divides by the population std + eps: close, not verl's.
    default, _, _ = adv_lib.gae_advantages(
        jnp.asarray(rewards, jnp.float32),
        jnp.asarray(values, jnp.float32),
        jnp.asarray(mask, bool),
        AdvantageConfig("gae", gamma=0.9, lam=0.8),
    )
    assert np.abs(np.asarray(default)[on] - want_adv[on]).max() > 1e-3


def _trl_advantages(rewards_BG, scale_rewards):
    rewards = rewards_BG.reshape(-1).astype(np.float64)
    G = rewards_BG.shape[1]
    mean_grouped = np.repeat(rewards.reshape(-1, G).mean(axis=1), G)
    if scale_rewards == "group":
        std = np.repeat(rewards.reshape(-1, G).std(axis=1, ddof=1), G)
    else:
        std = np.full_like(rewards, rewards.std(ddof=1))
    return ((rewards - mean_grouped) / (std + 1e-4)).reshape(rewards_BG.shape)


def _verl_grpo(rewards_BG, epsilon=1e-6):
    mean = rewards_BG.mean(axis=1, keepdims=True)
    std = rewards_BG.std(axis=1, ddof=1, keepdims=True)
    return (rewards_BG - mean) / (std + epsilon)


def test_sample_std_grpo_and_batch_scaling_equal_trl_and_verl():
    # TRL's "batch" by hand: (1, 1, 0, 0), (1, 1, 1, 0): all 8 rewards have mean 0.625 and
    # sample variance (5 * 0.375^2 + 3 * 0.625^2) / 7 = 1.875 / 7.
    r = np.array([[1, 1, 0, 0], [1, 1, 1, 0]], np.float32)
    s = math.sqrt(1.875 / 7) + 1e-4
    by_hand = [[0.5 / s, 0.5 / s, -0.5 / s, -0.5 / s], [0.25 / s] * 3 + [-0.75 / s]]
    np.testing.assert_allclose(_trl_advantages(r, "batch"), by_hand, rtol=1e-12)
    adv, _ = _adv(r, estimator="grpo", std_scaling="batch", std_kind="sample")
    np.testing.assert_allclose(adv, by_hand, rtol=1e-6)
    r = np.random.default_rng(0).normal(size=(6, 5)).astype(np.float32)
    adv, _ = _adv(r, estimator="grpo", std_scaling="batch", std_kind="sample")
    np.testing.assert_allclose(adv, _trl_advantages(r, "batch"), rtol=1e-5, atol=1e-6)
    adv, _ = _adv(r, estimator="grpo", std_kind="sample")
    np.testing.assert_allclose(adv, _trl_advantages(r, "group"), rtol=1e-5, atol=1e-6)
    adv, _ = _adv(r, estimator="grpo", std_kind="sample", eps=1e-6)
    np.testing.assert_allclose(adv, _verl_grpo(r.astype(np.float64)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(whiten="rsqrt"), "whiten='rsqrt'"),
        (dict(estimator="grpo", whiten="verl"), "applies to"),
        (dict(estimator="reinforce_pp_baseline", whiten="verl"), "whiten_over='tokens'"),
        (dict(estimator="gae", std_scaling="none", whiten="verl"), "leaves them raw"),
    ],
)
def test_whiten_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdvantageConfig(**kwargs)
