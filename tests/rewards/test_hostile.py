"""The math verifier on hostile responses: nothing scores, nothing hangs, the pool keeps serving.

The corpus is `hostile_math.py`. Directly, each class the sympy cost guard exists for is rejected
by the rule meant for it, in milliseconds, and never reaches sympy. Through a `VerifierPool` with a
short deadline, every item scores 0 and none runs past the deadline.
"""

import dataclasses
import time

import pytest

from rlvr_jax.rewards import math as math_reward
from rlvr_jax.rewards import math_guard
from rlvr_jax.rewards.pool import VerifierPool
from tests.rewards.hostile_math import CASES, GOLDS, GUARDED, NORMAL

DEADLINE_S = 2.0
SLACK_S = 1.0  # a worker's reply and its replacement, on a loaded 2-core machine
WORKERS = 2
# A hang guard, not a speed check: the guard and `is_equivalent` take milliseconds per answer,
# while an answer that reached sympy's expansion or evaluation would run for minutes.
GUARD_S = 30.0


def test_corpus_is_large_and_covers_every_class():
    classes = {cls for cls, _, _ in CASES}
    assert len(CASES) >= 150
    assert set(GUARDED) <= classes
    expected = {
        "long strings",
        "deep nesting",
        "unicode tricks",
        "latex macros",
        "repeated boxes",
        "regex-shaped",
        "hedges and garbage",
        "out of float range",
    }
    assert expected <= classes


@pytest.mark.parametrize("cls", list(GUARDED))
def test_guard_rejects_its_class_before_sympy(cls, monkeypatch):
    parsed = []
    monkeypatch.setattr(math_reward, "_sympy_parse", lambda text: parsed.append(text) or [])
    rule, answers = GUARDED[cls]
    for answer in answers:
        start = time.perf_counter()
        reason = math_guard.sympy_cost_reason(math_reward.normalize(answer))
        equal = [math_reward.is_equivalent(answer, gold) for gold in GOLDS]
        elapsed = time.perf_counter() - start
        assert reason is not None and rule in reason, (answer, reason)
        assert not any(equal), answer
        assert elapsed < GUARD_S, f"{answer[:60]!r}: {elapsed:.3f} s"
    assert parsed == []  # rejected answers never reach sympy, nor do their golds with them


@pytest.fixture(scope="module")
def pool():
    with VerifierPool(
        math_reward.score, num_workers=WORKERS, deadline_s=DEADLINE_S, warmup=math_reward.WARMUP
    ) as p:
        assert p.map([("\\boxed{1}", "1")] * WORKERS) == [1.0] * WORKERS  # every worker warm
        yield p


def test_hostile_corpus_through_the_pool(pool):
    before = dataclasses.replace(pool.stats)
    rewards, statuses, worst = [], [], (0.0, "")
    start = time.monotonic()
    # One item per worker at a time: a batch's wall time bounds each of its items' wall times.
    for i in range(0, len(CASES), WORKERS):
        batch = CASES[i : i + WORKERS]
        t0 = time.monotonic()
        batch_rewards, batch_statuses = pool.map_with_status([(r, g) for _, r, g in batch])
        elapsed = time.monotonic() - t0
        rewards += batch_rewards
        statuses += batch_statuses
        worst = max(worst, (elapsed, ", ".join(cls for cls, _, _ in batch)))
    total = time.monotonic() - start
    print(
        f"\nhostile corpus: {len(CASES)} items in {total:.1f} s through {WORKERS} workers; "
        f"slowest pair {worst[0]:.3f} s ({worst[1]})"
    )
    assert worst[0] < DEADLINE_S + SLACK_S, worst
    scored = [(cls, r[:80], g) for (cls, r, g), x in zip(CASES, rewards, strict=True) if x != 0.0]
    assert scored == []
    assert pool.stats.checks - before.checks == len(CASES)
    assert pool.stats.timeouts - before.timeouts == statuses.count("timeout")
    assert pool.stats.crashes - before.crashes == statuses.count("crash")
    # None needed the deadline: the guard and the checks before sympy answer them all.
    slow = [(cls, r[:80], s) for (cls, r, _), s in zip(CASES, statuses, strict=True) if s != "ok"]
    assert slow == []
    # The pool keeps serving normal answers afterwards.
    assert pool.map(NORMAL) == [1.0] * len(NORMAL)
