"""Countdown generator: the gold answer is a solution the verifier accepts, not the target."""

from collections import Counter

import pytest

from rlvr_jax.data import countdown_tasks, datasets, example
from rlvr_jax.rewards import countdown

LEVELS = range(2, 7)  # a countdown level is the number count


@pytest.mark.parametrize("level", LEVELS)
def test_every_gold_answer_scores_through_the_verifier(level):
    examples = countdown_tasks.countdown_examples(200, seed=level, num_numbers=(level,))
    for ex in examples:
        numbers, target = ex.meta["numbers"], ex.meta["target"]
        assert ex.answer == ex.meta["solution"]
        assert countdown.parse_gold(ex.answer) == (tuple(sorted(numbers)), target)
        assert countdown.score(f"<answer>{ex.answer}</answer>", ex.answer) == 1.0
        assert countdown.score(f"<answer>{target}</answer>", ex.answer) == 0.0
        assert countdown.score(ex.answer, ex.answer) == 0.0  # not in an answer block
        assert len(ex.answer) <= countdown.MAX_CHARS


def test_gold_answers_use_every_operator_and_stay_integral():
    examples = countdown_tasks.countdown_examples(300, seed=0)
    assert {op for ex in examples for op in ex.answer if op in "+-*/"} == set("+-*/")
    for ex in examples:
        # The construction never passes through a fraction, so TinyZero's lenient rule and the
        # strict one agree on every gold answer.
        strict = countdown.score_numbers(
            f"<answer>{ex.answer}</answer>",
            ex.meta["numbers"],
            ex.meta["target"],
            integer_intermediates=True,
        )
        assert strict == 1.0


def test_generation_is_deterministic_and_numbers_are_unchanged():
    first = countdown_tasks.countdown_examples(50, seed=3)
    assert first == countdown_tasks.countdown_examples(50, seed=3)
    assert first != countdown_tasks.countdown_examples(50, seed=4)
    # Problems made before the gold answer became an expression: same numbers, targets, ids.
    seed0 = countdown_tasks.countdown_examples(3, seed=0)
    assert [(ex.meta["numbers"], ex.meta["target"]) for ex in seed0] == [
        ([64, 52, 27, 31], 8),
        ([26, 62, 77, 39], 624),
        ([80, 88, 8], 78),
    ]
    assert [ex.answer for ex in seed0] == [
        "(27 + (64 - 31)) - 52",
        "26 * ((62 + 39) - 77)",
        "88 - (80 / 8)",
    ]
    mixed = countdown_tasks.countdown_examples(3, seed=11, num_numbers=(2, 5, 6))
    assert [(ex.id, ex.meta["numbers"], ex.meta["target"]) for ex in mixed] == [
        ("countdown/11/0", [13, 80], 67),
        ("countdown/11/1", [41, 93], 52),
        ("countdown/11/2", [98, 63, 87, 37, 15, 52], 148),
    ]


def test_question_states_the_scored_rule():
    ex = countdown_tasks.countdown_examples(1, seed=0, operators="+-")[0]
    assert f"[{', '.join(map(str, ex.meta['numbers']))}]" in ex.prompt_text
    assert f"equals {ex.meta['target']}." in ex.prompt_text
    assert "operations (+, -)" in ex.prompt_text
    assert "each number must be used exactly once" in ex.prompt_text
    assert countdown.score("<answer>64 + 52</answer>", ex.answer) == 0.0  # a subset is wrong


def test_load_gives_the_same_examples():
    examples, report = datasets.load("countdown", num=20, seed=5, level=(3, 5))
    assert report is None
    assert examples == countdown_tasks.countdown_examples(20, seed=5, num_numbers=(3, 5))
    assert Counter(ex.difficulty for ex in examples).keys() == {3.0, 5.0}


def test_example_has_one_home():
    assert datasets.Example is example.Example is countdown_tasks.Example
