"""Curriculum statistics (weights follow 1 - success), easy-to-hard levels, exact resumption of
both samplers, and DAPO dynamic sampling counts."""

from __future__ import annotations

import numpy as np
import pytest

from rlvr_jax.data import curriculum as cu
from rlvr_jax.data.datasets import Example


def _examples(n: int, levels: list[float] | None = None) -> list[Example]:
    return [
        Example(f"p/{i}", f"q{i}", str(i), "test", None if levels is None else levels[i])
        for i in range(n)
    ]


def test_weights_are_one_minus_success_with_a_floor_and_a_prior():
    sampler = cu.CurriculumSampler(_examples(5), cu.CurriculumConfig(prior_success=0.3, floor=0.1))
    state = sampler.init(0)
    state = sampler.update(
        state,
        ["p/0", "p/1", "p/2"],
        [[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]],
    )
    state = sampler.update(state, ["p/3", "p/2"], [[1, 0, 0, 0], [1, 1, 1, 1]])
    np.testing.assert_array_equal(state.attempts_P, [4, 4, 8, 4, 0])
    np.testing.assert_array_equal(state.successes_P, [4, 0, 6, 1, 0])
    # p/0 solved -> floor; p/2 6 of 8; p/4 unseen -> 1 - prior.
    np.testing.assert_allclose(sampler.weights(state), [0.1, 1.0, 0.25, 0.75, 0.7])
    stats = cu.summary_stats(state)
    assert stats["curriculum/seen_fraction"] == 0.8
    assert stats["curriculum/solved_fraction"] == 0.2
    assert stats["curriculum/unsolved_fraction"] == 0.2
    assert stats["curriculum/mean_success"] == pytest.approx((1 + 0 + 0.75 + 0.25) / 4)


def test_draw_frequencies_follow_the_weights():
    config = cu.CurriculumConfig(prior_success=0.0, floor=0.05, replace=True)
    sampler = cu.CurriculumSampler(_examples(4), config)
    state = sampler.update(sampler.init(1), ["p/0", "p/1", "p/2"], [[1, 1], [1, 0], [0, 0]])
    w = sampler.weights(state)
    np.testing.assert_allclose(w, [0.05, 0.5, 1.0, 1.0])
    draws = 40_000
    _, idx = sampler.next(state, draws)
    freq = np.bincount(idx, minlength=4) / draws
    p = w / w.sum()
    # Within 5 standard errors of the binomial frequency.
    np.testing.assert_allclose(freq, p, atol=5 * np.sqrt(p * (1 - p) / draws).max())


def test_batches_without_replacement_are_distinct_and_prefer_unsolved_prompts():
    sampler = cu.CurriculumSampler(_examples(20), cu.CurriculumConfig(floor=0.01))
    state = sampler.init(0)
    solved = [f"p/{i}" for i in range(10)]
    state = sampler.update(state, solved, np.ones((10, 4)))
    counts = np.zeros(20)
    for _ in range(200):
        state, idx = sampler.next(state, 5)
        assert len(set(idx.tolist())) == 5
        counts[idx] += 1
    assert counts[:10].sum() < 0.1 * counts[10:].sum()
    assert state.steps == 200
    with pytest.raises(ValueError, match="cannot draw 21 distinct prompts from 20"):
        sampler.next(state, 21)


def test_ema_rate():
    config = cu.CurriculumConfig(ema=0.5)
    sampler = cu.CurriculumSampler(_examples(2), config)
    state = sampler.update(sampler.init(0), ["p/0"], [[0, 0, 0, 0]])
    state = sampler.update(state, ["p/0"], [[1, 1, 1, 1]])
    state = sampler.update(state, ["p/0"], [[1, 1, 0, 0]])
    # 0 -> 0.5 * 0 + 0.5 * 1 = 0.5 -> 0.5 * 0.5 + 0.5 * 0.5 = 0.5; the cumulative rate is 6/12.
    assert state.rate_P[0] == pytest.approx(0.5)
    state = sampler.update(state, ["p/0"], [[1, 1, 1, 1]])
    assert state.rate_P[0] == pytest.approx(0.75)
    assert state.successes_P[0] / state.attempts_P[0] == pytest.approx(10 / 16)
    np.testing.assert_allclose(sampler.success_rates(state), [0.75, 0.5])


def test_easy_to_hard_advances_when_the_level_is_solved():
    levels = [1.0] * 4 + [2.0] * 4 + [3.0] * 4
    config = cu.CurriculumConfig(ordered=True, advance_threshold=0.75, advance_min_attempted=1.0)
    sampler = cu.CurriculumSampler(_examples(12, levels), config)
    assert sampler.levels == (1.0, 2.0, 3.0)
    state = sampler.init(0)
    for _ in range(10):
        state, idx = sampler.next(state, 2)
        assert set(idx.tolist()) <= {0, 1, 2, 3}
    # Three of four level-1 prompts attempted: no advance yet, whatever the rate.
    state = sampler.update(state, ["p/0", "p/1", "p/2"], np.ones((3, 4)))
    assert state.level == 0
    # All attempted, mean rate (1 + 1 + 1 + 0.5) / 4 = 0.875 >= 0.75: level 2 opens.
    state = sampler.update(state, ["p/3"], [[1, 1, 0, 0]])
    assert state.level == 1
    seen = set()
    for _ in range(20):
        state, idx = sampler.next(state, 3)
        seen |= set(idx.tolist())
    assert seen <= set(range(8)) and seen & {4, 5, 6, 7}
    # Level 2 failing: it stays.
    state = sampler.update(state, ["p/4", "p/5", "p/6", "p/7"], np.zeros((4, 4)))
    assert state.level == 1
    # A batch larger than the open levels opens the next one for that draw.
    state, idx = sampler.next(state, 10)
    assert len(set(idx.tolist())) == 10 and state.level == 1


def test_easy_to_hard_goes_back_a_level_when_the_policy_falls_behind():
    levels = [1.0] * 2 + [2.0] * 2
    config = cu.CurriculumConfig(
        ordered=True,
        advance_threshold=0.75,
        advance_min_attempted=1.0,
        retreat_threshold=0.25,
        ema=1.0,  # the latest step's rate: the level follows the policy
    )
    sampler = cu.CurriculumSampler(_examples(4, levels), config)
    state = sampler.update(sampler.init(0), ["p/0", "p/1"], np.ones((2, 4)))
    assert state.level == 1
    # Level 2 at 0.5: between the thresholds, it stays.
    state = sampler.update(state, ["p/2", "p/3"], [[1, 1, 0, 0], [1, 1, 0, 0]])
    assert state.level == 1
    # Level 2 at 0.125 < 0.25: back to level 1, whose prompts are drawn alone again.
    state = sampler.update(state, ["p/2", "p/3"], [[1, 0, 0, 0], [0, 0, 0, 0]])
    assert state.level == 0 and cu.summary_stats(state)["curriculum/level"] == 0.0
    assert set(np.flatnonzero(sampler.weights(state)).tolist()) == {0, 1}
    # Without a retreat threshold the level never goes down (the default).
    plain = cu.CurriculumSampler(
        _examples(4, levels), cu.CurriculumConfig(ordered=True, advance_min_attempted=1.0)
    )
    state = plain.update(plain.init(0), ["p/0", "p/1"], np.ones((2, 4)))
    state = plain.update(state, ["p/2", "p/3"], np.zeros((2, 4)))
    assert state.level == 1
    with pytest.raises(ValueError, match="retreat_threshold=0.8 must be below"):
        cu.CurriculumConfig(retreat_threshold=0.8)


def test_samplers_check_their_inputs():
    with pytest.raises(ValueError, match="'p/1' has no difficulty"):
        cu.CurriculumSampler(_examples(3, [1.0, None, 2.0]), cu.CurriculumConfig(ordered=True))
    dup = _examples(2) + _examples(1)
    with pytest.raises(ValueError, match=r"'p/0' appears twice \(positions 0, 2\)"):
        cu.EpochSampler(dup)
    sampler = cu.CurriculumSampler(_examples(3))
    state = sampler.init(0)
    with pytest.raises(ValueError, match="'p/9' is not one this sampler draws from"):
        sampler.update(state, ["p/9"], [[1]])
    with pytest.raises(ValueError, match=r"expected \(2, G\)"):
        sampler.update(state, ["p/0", "p/1"], [1, 0])
    with pytest.raises(ValueError, match="outside"):
        sampler.update(state, ["p/0"], [[2.0]])
    with pytest.raises(ValueError, match="floor=0.0"):
        cu.CurriculumConfig(floor=0.0)


def _run(sampler, state, steps: int, seed: int) -> tuple[object, list[list[int]]]:
    """Draws and updates with pseudo-random successes that depend only on `seed` and the step."""
    batches = []
    for step in range(steps):
        state, idx = sampler.next(state, 4)
        rng = np.random.default_rng([seed, step])
        success = (rng.random((4, 3)) < 0.3 + 0.1 * (idx[:, None] % 5)).astype(float)
        state = sampler.update(state, [sampler.ids[i] for i in idx], success)
        batches.append(idx.tolist())
    return state, batches


def _assert_states_equal(a: cu.SamplerState, b: cu.SamplerState):
    for field in ("attempts_P", "successes_P", "rate_P"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    for field in ("level", "epoch", "position", "steps", "seed", "rng_state"):
        assert getattr(a, field) == getattr(b, field), field


@pytest.mark.parametrize(
    "make",
    [
        lambda ex: cu.CurriculumSampler(ex, cu.CurriculumConfig(ema=0.3)),
        lambda ex: cu.CurriculumSampler(ex, cu.CurriculumConfig(ordered=True)),
        lambda ex: cu.EpochSampler(ex, shuffle=True),
        lambda ex: cu.EpochSampler(ex, shuffle=False),
    ],
    ids=["curriculum_ema", "curriculum_ordered", "epoch_shuffled", "epoch_sequential"],
)
def test_resuming_from_a_saved_state_continues_identically(make):
    examples = _examples(11, [float(i % 3) for i in range(11)])
    sampler = make(examples)
    state, _ = _run(sampler, sampler.init(7), 6, seed=0)
    saved_json = cu.state_to_json(sampler.state_dict(state))
    saved_arrays = sampler.state_dict(state)
    final, rest = _run(sampler, state, 8, seed=1)

    for restored in (
        make(examples).load_state_dict(cu.state_from_json(saved_json)),
        make(examples).load_state_dict(saved_arrays),
    ):
        _assert_states_equal(restored, state)
        resumed, rest_again = _run(make(examples), restored, 8, seed=1)
        assert rest_again == rest
        _assert_states_equal(resumed, final)


def test_a_state_for_other_examples_is_refused():
    sampler = cu.CurriculumSampler(_examples(4))
    saved = sampler.state_dict(sampler.init(0))
    with pytest.raises(ValueError, match="different list of examples"):
        cu.CurriculumSampler(_examples(5)).load_state_dict(saved)
    with pytest.raises(ValueError, match=r"missing \['fingerprint'\]"):
        sampler.load_state_dict({k: v for k, v in saved.items() if k != "fingerprint"})


def test_epoch_sampler_visits_every_example_once_per_epoch():
    sampler = cu.EpochSampler(_examples(10), shuffle=True)
    state = sampler.init(3)
    drawn = []
    for _ in range(5):  # 5 batches of 4 = two epochs
        state, idx = sampler.next(state, 4)
        drawn += idx.tolist()
    assert state.epoch == 2 and state.position == 0
    first, second = drawn[:10], drawn[10:]
    assert sorted(first) == sorted(second) == list(range(10))
    assert first != second  # a fresh shuffle each epoch
    assert first == sampler.order(3, 0).tolist()
    seq = cu.EpochSampler(_examples(3), shuffle=False)
    state, idx = seq.next(seq.init(0), 5)
    assert idx.tolist() == [0, 1, 2, 0, 1] and (state.epoch, state.position) == (1, 2)


def test_filter_groups_drops_zero_variance_groups():
    rewards_BG = [
        [1.0, 1.0, 1.0, 1.0],  # all solved
        [0.0, 0.0, 0.0, 0.0],  # all failed
        [1.0, 0.0, 0.0, 0.0],
        [0.5, 0.5, 0.5, 0.5],  # constant partial reward
        [0.0, 1.0, 1.0, 1.0],
        [0.2, 0.2001, 0.2, 0.2],  # constant within atol below
    ]
    keep, stats = cu.filter_groups(rewards_BG)
    assert keep.tolist() == [False, False, True, False, True, True]
    assert stats == {"groups": 6, "kept": 3, "dropped": 3}
    keep, stats = cu.filter_groups(rewards_BG, atol=1e-3)
    assert keep.tolist() == [False, False, True, False, True, False]
    assert stats["dropped"] == 4


class _Stream:
    """A `produce` callable that hands out groups from a fixed list, recording what was asked."""

    def __init__(self, rewards_BG, per_call: int):
        self.rewards = np.asarray(rewards_BG, float)
        self.next, self.per_call, self.asked = 0, per_call, []

    def __call__(self, wanted: int):
        self.asked.append(wanted)
        lo, hi = self.next, min(self.next + self.per_call, len(self.rewards))
        self.next = hi
        return [f"g{i}" for i in range(lo, hi)], self.rewards[lo:hi]


SIGNAL, FLAT = [1.0, 0.0], [1.0, 1.0]


def test_fill_batch_draws_until_full_and_truncates():
    stream = _Stream([SIGNAL, FLAT, FLAT, SIGNAL, FLAT, SIGNAL, SIGNAL, SIGNAL], per_call=3)
    groups, rewards_BG, stats = cu.fill_batch(stream, batch_size=3, max_rounds=5)
    assert groups == ["g0", "g3", "g5"]
    np.testing.assert_array_equal(rewards_BG, [SIGNAL] * 3)
    assert stream.asked == [3, 2]  # what was still missing
    assert stats == cu.FillStats(rounds=2, generated=6, kept=3, dropped=3, padded=0, full=True)
    stream = _Stream([SIGNAL, SIGNAL, SIGNAL, SIGNAL], per_call=4)
    groups, _, stats = cu.fill_batch(stream, batch_size=2, max_rounds=5)
    assert groups == ["g0", "g1"] and stats.kept == 4 and stats.rounds == 1  # extras discarded


def test_fill_batch_pads_with_dropped_groups_when_rounds_run_out():
    rewards = [FLAT, SIGNAL, [0.0, 0.0], FLAT, FLAT, FLAT]
    groups, rewards_BG, stats = cu.fill_batch(_Stream(rewards, 2), batch_size=4, max_rounds=2)
    assert groups == ["g1", "g0", "g2", "g3"]  # kept first, then dropped in produced order
    np.testing.assert_array_equal(rewards_BG, [SIGNAL, FLAT, [0.0, 0.0], FLAT])
    assert stats == cu.FillStats(rounds=2, generated=4, kept=1, dropped=3, padded=3, full=True)
    assert stats.as_metrics()["dynamic_sampling/padded"] == 3.0
    groups, rewards_BG, stats = cu.fill_batch(
        _Stream(rewards, 2), batch_size=4, max_rounds=2, pad_with_dropped=False
    )
    assert groups == ["g1"] and rewards_BG.shape == (1, 2) and not stats.full
    # Padding cannot invent groups that were never produced.
    groups, _, stats = cu.fill_batch(_Stream([FLAT], 1), batch_size=3, max_rounds=3)
    assert groups == ["g0"] and stats.rounds == 3 and stats.padded == 1 and not stats.full


def test_fill_batch_checks_what_produce_returns():
    def ragged(wanted):
        ragged.calls += 1
        return ["a"], np.zeros((1, 2 + ragged.calls))

    ragged.calls = 0
    with pytest.raises(ValueError, match="round 2: group size 4 differs from 3"):
        cu.fill_batch(ragged, batch_size=2, max_rounds=3)
    with pytest.raises(ValueError, match=r"returned 2 groups and rewards of shape \(1, 2\)"):
        cu.fill_batch(lambda n: (["a", "b"], np.zeros((1, 2))), batch_size=2, max_rounds=1)


def test_per_source_levels_move_each_task_on_its_own_success_rate():
    # Two tasks of a mix, each with levels 1 and 2 (and task "b" a level 3).
    spec = [("a", 1.0)] * 2 + [("a", 2.0)] * 2 + [("b", 1.0)] * 2 + [("b", 2.0), ("b", 3.0)]
    examples = [
        Example(f"p/{i}", f"q{i}", str(i), source, level) for i, (source, level) in enumerate(spec)
    ]
    config = cu.CurriculumConfig(
        ordered=True,
        per_source=True,
        advance_threshold=0.75,
        advance_min_attempted=1.0,
        retreat_threshold=0.25,
        ema=1.0,
    )
    sampler = cu.CurriculumSampler(examples, config)
    assert sampler.sources == ("a", "b")
    state = sampler.init(0)
    assert state.source_levels == (0, 0)
    assert set(np.flatnonzero(sampler.weights(state)).tolist()) == {0, 1, 4, 5}
    # Task a solves its level 1, task b fails its own: only a's level 2 opens.
    state = sampler.update(state, ["p/0", "p/1", "p/4", "p/5"], [[1, 1]] * 2 + [[0, 0]] * 2)
    assert state.source_levels == (1, 0) and state.level == 0
    assert set(np.flatnonzero(sampler.weights(state)).tolist()) == {0, 1, 2, 3, 4, 5}
    assert sampler.level_metrics(state) == {"curriculum/a/level": 2.0, "curriculum/b/level": 1.0}
    # b catches up; a's level 2 then fails and closes again, b's stays open.
    state = sampler.update(state, ["p/4", "p/5"], [[1, 1]] * 2)
    state = sampler.update(state, ["p/2", "p/3", "p/6"], [[0, 0]] * 2 + [[1, 0]])
    assert state.source_levels == (0, 1)
    # A batch larger than what is open raises the lowest level that can rise, for that draw.
    assert int(np.count_nonzero(sampler.weights(state, batch_size=7))) == 7
    # The levels survive a checkpoint, and a state for other sources is refused.
    saved = cu.state_from_json(cu.state_to_json(sampler.state_dict(state)))
    assert sampler.load_state_dict(saved).source_levels == (0, 1)
    shared = cu.CurriculumSampler(examples, cu.CurriculumConfig(ordered=True))
    assert shared.sources == ("",) and shared.level_metrics(shared.init(0)) == {}
    with pytest.raises(ValueError, match="has 0 source levels; this curriculum has 2"):
        sampler.weights(shared.init(0))
    with pytest.raises(ValueError, match="per_source=True needs curriculum.ordered=True"):
        cu.CurriculumConfig(per_source=True)
