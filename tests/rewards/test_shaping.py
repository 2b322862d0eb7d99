"""Reward shaping: hand-computed values for every function, under jit too."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.rewards import shaping


def test_kimi_length_reward_hand_computed():
    lengths_BG = np.array([[10, 20, 30], [5, 5, 5], [10, 30, 20], [7, 3, 5]])
    correct_BG = np.array(
        [[True, False, True], [True, False, True], [False, False, True], [True, True, False]]
    )
    # Group 0: lam = 0.5 - (len - 10) / 20 = [0.5, 0, -0.5]; the wrong one gets min(0, 0).
    # Group 1: all lengths equal -> 0. Group 2: lam = [0.5, -0.5, 0]; wrong ones min(0, lam).
    # Group 3: lam = 0.5 - (len - 3) / 4 = [-0.5, 0.5, 0]; the wrong one gets min(0, 0).
    expected = np.array(
        [[0.5, 0.0, -0.5], [0.0, 0.0, 0.0], [0.0, -0.5, 0.0], [-0.5, 0.5, 0.0]], np.float32
    )
    out = shaping.kimi_length_reward(lengths_BG, correct_BG)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, expected, atol=1e-7)
    jitted = jax.jit(shaping.kimi_length_reward)(jnp.asarray(lengths_BG), correct_BG.astype(float))
    np.testing.assert_allclose(jitted, expected, atol=1e-7)


def test_kimi_length_reward_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(3, 2\)"):
        shaping.kimi_length_reward(np.ones((2, 3)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="same"):
        shaping.kimi_length_reward(np.ones((6,)), np.ones((6,)))


def test_overlong_penalty_hand_computed():
    lengths_N = np.array([50, 80, 81, 90, 100, 120])
    # L_max = 100, L_cache = 20: free up to 80, then (80 - len) / 20, -1 from 100 on.
    expected = np.array([0.0, 0.0, -0.05, -0.5, -1.0, -1.0], np.float32)
    out = shaping.overlong_penalty(lengths_N, max_len=100, cache_len=20)
    np.testing.assert_allclose(out, expected, atol=1e-7)
    jitted = jax.jit(shaping.overlong_penalty, static_argnames=("max_len", "cache_len"))
    np.testing.assert_allclose(jitted(lengths_N, max_len=100, cache_len=20), expected, atol=1e-7)
    full_ramp = shaping.overlong_penalty(np.array([0, 50, 100]), max_len=100, cache_len=100)
    np.testing.assert_allclose(full_ramp, [0.0, -0.5, -1.0], atol=1e-7)


@pytest.mark.parametrize("cache_len", [0, -1, 101])
def test_overlong_penalty_rejects_bad_cache(cache_len):
    with pytest.raises(ValueError, match=f"cache_len={cache_len}"):
        shaping.overlong_penalty(np.array([1]), max_len=100, cache_len=cache_len)


def test_combine_weights_and_reports_every_part():
    parts = {
        "correct": np.array([1.0, 0.0, 1.0]),
        "format": np.array([1.0, 1.0, 0.0]),
        "length": np.array([0.5, -0.5, 0.0]),
    }
    rewards_N, out = shaping.combine(parts, {"correct": 1.0, "format": 0.1})
    np.testing.assert_allclose(rewards_N, [1.1, 0.1, 1.0], atol=1e-6)
    assert set(out) == {"correct", "format", "length"}
    np.testing.assert_allclose(out["length"], parts["length"])
    assert all(v.dtype == jnp.float32 for v in out.values())
    weights = {"correct": 1.0, "format": 0.1, "length": 2.0}
    jitted_rewards, _ = jax.jit(lambda p: shaping.combine(p, weights))(parts)
    np.testing.assert_allclose(jitted_rewards, [2.1, -0.9, 1.0], atol=1e-6)


def test_combine_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"\['missing'\]"):
        shaping.combine({"correct": np.ones(3)}, {"missing": 1.0})
    with pytest.raises(ValueError, match="same"):
        shaping.combine({"a": np.ones(3), "b": np.ones(4)}, {"a": 1.0})
    with pytest.raises(ValueError, match="empty"):
        shaping.combine({}, {})


def test_shaping_composes_on_groups():
    B, G = 2, 3
    lengths_N = np.array([10, 20, 30, 90, 95, 100])
    correct_N = np.array([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    length_N = shaping.kimi_length_reward(lengths_N.reshape(B, G), correct_N.reshape(B, G))
    parts = {
        "correct": correct_N,
        "length": length_N.reshape(-1),
        "overlong": shaping.overlong_penalty(lengths_N, max_len=100, cache_len=20),
    }
    rewards_N, _ = shaping.combine(parts, {"correct": 1.0, "length": 1.0, "overlong": 1.0})
    # Group 0: lam = [0.5, 0, -0.5], third wrong -> -0.5. Group 1: lam = [0.5, 0, -0.5], the
    # two wrong ones get [0, -0.5]. Overlong from 80: [0, 0, 0, -0.5, -0.75, -1].
    expected = np.array([1.5, 1.0, -0.5, 1.0, -0.75, -1.5])
    np.testing.assert_allclose(rewards_N, expected, atol=1e-6)
