"""Token choice: empirical frequencies against the truncated, renormalised distribution, the
two-level draw, top-p with ties, greedy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from rlvr_jax.sampling import choice
from rlvr_jax.sampling.choice import choose_tokens, row_uniforms
from rlvr_jax.sampling.config import SamplerConfig, sampling_params
from tests.sampling.fixtures import reference_truncation

LOGITS_10 = np.array([2.0, 1.5, 1.5, 1.0, 0.3, 0.0, -0.5, -1.0, -2.0, -4.0], np.float32)


@pytest.mark.parametrize(
    "temperature, top_k, top_p, min_p",
    [
        (0.7, 0, 1.0, 0.0),  # temperature only
        (1.0, 3, 1.0, 0.0),  # top-k: 2.0 and the tied pair of 1.5
        (1.0, 0, 0.6, 0.0),  # top-p over the full vocabulary (bisection)
        (1.3, 0, 1.0, 0.2),  # min-p
        (0.9, 6, 0.8, 0.1),  # all three, top-p on the sorted top-k values
    ],
)
def test_empirical_frequencies_match_truncated_distribution(temperature, top_k, top_p, min_p):
    N = 40_000
    want = reference_truncation(LOGITS_10, temperature, top_k, top_p, min_p)
    truncating = top_k or top_p < 1 or min_p > 0
    assert 2 <= (want > 0).sum() < (10 if truncating else 11)
    scfg = SamplerConfig(max_new_tokens=1, top_k=top_k)
    sp = sampling_params(N, temperature, top_p, min_p)
    u_N = row_uniforms(jax.random.key(3), N, 1)[:, 0]
    choose = jax.jit(choose_tokens, static_argnames="cfg")
    tok, logp = choose(jnp.broadcast_to(jnp.asarray(LOGITS_10), (N, 10)), sp, u_N, cfg=scfg)
    tok, logp = np.asarray(tok), np.asarray(logp)
    counts = np.bincount(tok, minlength=10)
    assert (counts[want == 0] == 0).all(), counts
    kept = want > 0
    assert scipy.stats.chisquare(counts[kept], N * want[kept]).pvalue > 1e-3, (counts, N * want)
    np.testing.assert_allclose(logp, np.log(want[tok]), atol=1e-5)


def test_draw_over_a_large_vocabulary_is_exact():
    """V = 300 spans three blocks of the two-level draw, the last one padded."""
    N, V = 60_000, 300
    logits = np.random.default_rng(0).normal(0, 2, V).astype(np.float32)
    want = reference_truncation(logits, 1.0, 0, 1.0, 0.0)
    scfg = SamplerConfig(max_new_tokens=1)
    u_N = row_uniforms(jax.random.key(4), N, 1)[:, 0]
    tok, logp = jax.jit(choose_tokens, static_argnames="cfg")(
        jnp.broadcast_to(jnp.asarray(logits), (N, V)), sampling_params(N), u_N, cfg=scfg
    )
    counts = np.bincount(np.asarray(tok), minlength=V)
    big = N * want >= 20  # chi-square needs populated bins; pool the rest
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(N * want[big], N * want[~big].sum())
    assert scipy.stats.chisquare(observed, expected).pvalue > 1e-3
    np.testing.assert_allclose(np.asarray(logp), np.log(want[np.asarray(tok)]), atol=1e-5)


def test_extreme_uniforms_pick_the_first_and_last_kept_tokens():
    """u at the ends of (0, 1] must still land on tokens with mass, never on removed ones."""
    logits = jnp.asarray([[-jnp.inf, 1.0, 2.0, -jnp.inf, 0.5, -jnp.inf]] * 3)
    u_N = jnp.asarray([1e-30, 1.0, 0.5])
    tok, _ = choose_tokens(logits, sampling_params(3), u_N, SamplerConfig(max_new_tokens=1))
    assert np.asarray(tok).tolist()[:2] == [1, 4]
    assert int(tok[2]) in (1, 2, 4)


def test_top_p_bisection_equals_the_sorted_rule_with_ties():
    rng = np.random.default_rng(5)
    # Few distinct values, so ties straddle the top-p boundary often.
    x = rng.integers(-4, 4, (64, 50)).astype(np.float32) / 2
    top_p = rng.uniform(0.05, 1.0, 64).astype(np.float32)
    top_p[:4] = 1.0
    bisect = np.isfinite(np.asarray(choice._top_p_unsorted(jnp.asarray(x), jnp.asarray(top_p))))
    order = np.argsort(-x, axis=1, kind="stable")
    xs = np.take_along_axis(x, order, axis=1)
    kept_sorted = np.isfinite(np.asarray(choice._top_p_sorted(jnp.asarray(xs), jnp.asarray(top_p))))
    sorted_rule = np.zeros_like(kept_sorted)
    np.put_along_axis(sorted_rule, order, kept_sorted, axis=1)
    reference = np.stack([reference_truncation(x[n], 1.0, 0, top_p[n], 0.0) > 0 for n in range(64)])
    np.testing.assert_array_equal(bisect, reference)
    np.testing.assert_array_equal(sorted_rule, reference)


def test_greedy_returns_argmax_and_its_model_logp():
    logits = jnp.asarray([[0.0, 3.0, 3.0, 1.0], [5.0, -1.0, 0.0, 0.0]])
    tok, logp = choose_tokens(
        logits, sampling_params(2), jnp.ones(2), SamplerConfig(1, method="greedy")
    )
    assert np.asarray(tok).tolist() == [1, 0]  # first of tied maxima, as torch.argmax
    np.testing.assert_allclose(logp, jax.nn.log_softmax(logits)[jnp.arange(2), tok], atol=1e-6)
