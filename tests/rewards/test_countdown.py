"""Countdown verifier: TinyZero rules, a parser that never evaluates code, exact arithmetic."""

from fractions import Fraction

import pytest

from rlvr_jax.rewards import countdown

NUMBERS = [3, 5, 7]
TARGET = 22  # 3 * 5 + 7

# (response, expected score with format_score=0.1)
CASES = [
    ("<answer>3 * 5 + 7</answer>", 1.0),
    ("<answer>7 + 5 * 3</answer>", 1.0),
    ("<answer>(3*5)+7</answer>", 1.0),
    ("<answer>  3\t*\n5 +   7  </answer>", 1.0),  # whitespace anywhere
    ("Let me think.\nSo <answer>3*5+7</answer>\n\n", 1.0),  # trailing whitespace only
    ("<answer>3*5+7</answer><|im_end|>", 1.0),  # end-of-sequence strings may follow
    ("<answer>3*5+7</answer> ok", 0.0),  # text after the answer: not on the last line
    ("<answer>3*5+7</answer>\nDone.", 0.0),
    ("<answer>3+5+7</answer> then <answer>3*5+7</answer>", 1.0),  # the last tag counts
    ("<answer>3*5+7</answer> then <answer>3+5+7</answer>", 0.1),
    ("<answer>3*5+7", 0.0),  # unclosed
    ("3*5+7", 0.0),  # no tag
    ("<answer>3*5+7+7</answer>", 0.1),  # number reused
    ("<answer>3*5+3</answer>", 0.1),  # 7 missing, 3 reused
    ("<answer>3*5</answer>", 0.1),  # number missing
    ("<answer>3*5+7+0</answer>", 0.1),  # extra number
    ("<answer>3*5+7-1</answer>", 0.1),  # extra number
    ("<answer>-3+5*7-10</answer>", 0.1),  # unary minus refused
    ("<answer>+3*5+7</answer>", 0.1),  # unary plus refused
    ("<answer>3.0*5+7</answer>", 0.1),  # decimals refused
    ("<answer>3*5+7 = 22</answer>", 0.1),  # '=' refused
    ("<answer>3x5+7</answer>", 0.1),
    ("<answer>3**5+7</answer>", 0.1),  # no power operator
    ("<answer>__import__('os')</answer>", 0.1),
    ("<answer>(3*5+7</answer>", 0.1),  # unbalanced
    ("<answer>3*5+7)</answer>", 0.1),
    ("<answer></answer>", 0.1),
    ("<answer>7/(5-5)+3</answer>", 0.1),  # division by zero
    ("<answer>3*5*7</answer>", 0.1),  # wrong value
]


@pytest.mark.parametrize(("response", "expected"), CASES)
def test_score(response, expected):
    assert countdown.score(response, NUMBERS, TARGET, format_score=0.1) == expected


def test_format_score_is_configurable():
    assert countdown.score("<answer>3+5+7</answer>", NUMBERS, TARGET, format_score=0.0) == 0.0
    assert countdown.score("<answer>3+5+7</answer>", NUMBERS, TARGET, format_score=0.25) == 0.25


def test_non_integer_intermediates():
    # (6 / 4) * 4 - 2 = 4 passes through 3/2: allowed by default (TinyZero), refusable.
    response = "<answer>(6 / 4) * 4 - 2</answer>"
    assert countdown.score(response, [6, 4, 4, 2], 4) == 1.0
    assert countdown.score(response, [6, 4, 4, 2], 4, integer_intermediates=True) == 0.1
    assert countdown.score("<answer>8 / 4 + 2</answer>", [8, 4, 2], 4, integer_intermediates=True)


def test_exact_arithmetic():
    # In floats 1/3 * 3 is fine but (1/3 + 1/3 + 1/3) - 1 == 0 is not guaranteed; Fractions are.
    result = countdown.evaluate("(1/3 + 1/3 + 1/3) * 9")
    assert result.value == Fraction(9)
    assert result.numbers == (1, 3, 1, 3, 1, 3, 9)
    assert countdown.evaluate("10 - 2 - 3").value == 5  # left associative
    assert countdown.evaluate("2 * 3 + 4 * 5").value == 26  # precedence
    assert countdown.evaluate("100 / 8").value == Fraction(25, 2)


def test_numbers_as_multiset():
    assert countdown.score("<answer>5 + 5 + 2</answer>", [5, 2, 5], 12) == 1.0
    assert countdown.score("<answer>5 + 2 + 5</answer>", [5, 2, 2], 12) == 0.1


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("1" * 201, "max_chars=200"),
        ("(" * 17 + "1" + ")" * 17, "deeper than 16"),
        ("1/0", "division by zero"),
        ("-1", "expected a number"),
        ("1 +", "found the end"),
        ("1 2", "unexpected '2'"),
        ("", "empty"),
    ],
)
def test_evaluate_errors_name_the_problem(expression, message):
    with pytest.raises(countdown.ExpressionError, match=message):
        countdown.evaluate(expression)


def test_bounds_on_hostile_answers():
    deep = "(" * 100_000 + "1" + ")" * 100_000
    assert countdown.score(f"<answer>{deep}</answer>", [1], 1) == 0.1
    assert countdown.score(f"<answer>{'1+' * 100_000}1</answer>", [1], 1) == 0.1
    nested_ok = "(" * 16 + "3*5+7" + ")" * 16
    assert countdown.score(f"<answer>{nested_ok}</answer>", NUMBERS, TARGET) == 1.0
    assert countdown.score("<answer>" * 100_000, NUMBERS, TARGET) == 0.0
