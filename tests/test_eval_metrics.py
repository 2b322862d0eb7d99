"""Evaluation statistics, against values computed by hand."""

import math

import numpy as np
import pytest

from rlvr_jax.program.evals import eval_metrics as em


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 1, 0.4),  # 1 - C(3,1)/C(5,1) = 1 - 3/5
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 0, 1, 0.0),
        (5, 0, 5, 0.0),
        (5, 4, 2, 1.0),  # n - c = 1 < k
        (5, 5, 1, 1.0),
        (4, 1, 4, 1.0),  # n - c = 3 < 4
        (1, 1, 1, 1.0),
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
    ],
)
def test_pass_at_k_by_hand(n, c, k, expected):
    assert em.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_equals_the_binomial_form_and_stays_stable():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert em.pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12), (n, c, k)
    # C(1000, 500) overflows a float; the product form does not.
    exact = 1 - math.comb(990, 500) / math.comb(1000, 500)
    assert em.pass_at_k(1000, 10, 500) == pytest.approx(exact, rel=1e-9)
    assert 0 < em.pass_at_k(1000, 1, 1) == pytest.approx(1e-3)


@pytest.mark.parametrize(
    "n, c, k, error",
    [(0, 0, 1, "n=0"), (5, 6, 1, "c=6"), (5, -1, 1, "c=-1"), (5, 2, 0, "k=0"), (5, 2, 6, "k=6")],
)
def test_pass_at_k_rejects_bad_counts(n, c, k, error):
    with pytest.raises(ValueError, match=error):
        em.pass_at_k(n, c, k)


def test_pass_at_k_rejects_non_integers():
    with pytest.raises(TypeError, match="k=1.5"):
        em.pass_at_k(5, 2, 1.5)


def test_mean_and_pass_over_prompts():
    correct = np.array(
        [
            [1, 1, 0, 0, 0],  # c=2: pass@1 0.4, pass@2 0.7
            [0, 0, 0, 0, 0],  # c=0
            [1, 1, 1, 1, 1],  # c=5
            [0, 0, 0, 1, 0],  # c=1: pass@1 0.2, pass@2 1 - C(4,2)/C(5,2) = 0.4
        ]
    )
    assert em.mean_at_n(correct) == pytest.approx(8 / 20)
    assert em.mean_pass_at_k(correct, 1) == pytest.approx((0.4 + 0 + 1 + 0.2) / 4)
    assert em.mean_pass_at_k(correct, 2) == pytest.approx((0.7 + 0 + 1 + 0.4) / 4)
    assert em.mean_pass_at_k(correct.astype(bool), 5) == pytest.approx(3 / 4)
    with pytest.raises(ValueError, match=r"shape \(5,\)"):
        em.mean_at_n(correct[0])
    with pytest.raises(ValueError, match="0/1"):
        em.mean_at_n(correct * 2)


def test_majority_vote_and_maj_at_n():
    assert em.majority_vote(["3", "4", "4", None, "3"]) == "3"  # tie: first seen wins
    assert em.majority_vote([None, "7", "8", "8"]) == "8"
    assert em.majority_vote([None, None]) is None
    answers = [
        ["12", "12", "13", None],  # majority 12, which is correct
        ["5", "6", "6", "6"],  # majority 6, wrong; the one correct sample is outvoted
        [None, None, None, None],  # nothing extracted: wrong
        ["1/2", "0.5", "0.5", "1/2"],  # tie between equivalent forms: first ("1/2") is correct
    ]
    correct = [[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]
    assert em.maj_at_n(answers, correct) == pytest.approx(2 / 4)
    with pytest.raises(ValueError, match="answers have shape"):
        em.maj_at_n(answers[:3], correct)


def test_length_stats_by_hand():
    lengths = [1, 2, 3, 4, 10]
    stats = em.length_stats(lengths, max_length=10)
    # p95 by linear interpolation: position 0.95 * 4 = 3.8 -> 4 + 0.8 * (10 - 4).
    assert stats == pytest.approx(
        {"mean": 4.0, "p50": 3.0, "p95": 8.8, "max": 10.0, "truncated": 0.2}
    )
    flags = [0, 0, 1, 1, 0]
    assert em.length_stats(lengths, truncated=flags)["truncated"] == pytest.approx(0.4)
    assert "truncated" not in em.length_stats(lengths)
    with pytest.raises(ValueError, match="no responses"):
        em.length_stats([])
    with pytest.raises(ValueError, match="truncated has 2 entries for 5"):
        em.length_stats(lengths, truncated=[0, 1])


def test_group_metrics_and_per_source():
    correct = np.array([[1, 0], [0, 0], [1, 1]], bool)
    lengths = np.array([[10, 20], [30, 40], [50, 60]])
    truncated = lengths >= 60
    answers = [["a", "b"], ["c", "c"], ["d", "d"]]
    out = em.group_metrics(correct, lengths, truncated, answers, ks=(1, 2))
    assert out == pytest.approx(
        {
            "prompts": 3.0,
            "samples": 2.0,
            "mean@2": 0.5,
            "pass@1": 0.5,
            "pass@2": 2 / 3,
            "maj@2": 2 / 3,
            "length/mean": 35.0,
            "length/p50": 35.0,
            "length/p95": 57.5,
            "length/max": 60.0,
            "length/truncated": 1 / 6,
            "length/correct": 40.0,  # (10 + 50 + 60) / 3
            "length/incorrect": 30.0,  # (20 + 30 + 40) / 3
        }
    )
    tables = em.per_source(["math", "gsm8k", "math"], correct, lengths, ks=(1,))
    assert list(tables) == ["gsm8k", "math"]
    assert tables["gsm8k"]["pass@1"] == 0.0 and tables["gsm8k"]["prompts"] == 1.0
    assert math.isnan(tables["gsm8k"]["length/correct"])
    assert tables["math"]["mean@2"] == pytest.approx(0.75)
    assert tables["math"]["length/mean"] == pytest.approx(35.0)
    flat = em.as_metrics(tables)
    assert flat["eval/math/pass@1"] == pytest.approx(0.75)
    assert len(flat) == 2 * len(tables["math"])
    with pytest.raises(ValueError, match="2 sources for 3 prompts"):
        em.per_source(["a", "b"], correct)
    with pytest.raises(ValueError, match=r"lengths have shape \(2, 2\)"):
        em.group_metrics(correct, lengths[:2])
