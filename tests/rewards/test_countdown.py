"""Countdown verifier: TinyZero rules, the gold expression as the whole problem, no eval."""

import pickle
import time
from fractions import Fraction

import pytest

from rlvr_jax.rewards import countdown
from rlvr_jax.rewards.pool import VerifierPool

GOLD = "3 * 5 + 7"  # numbers [3, 5, 7], target 22
NUMBERS = [3, 5, 7]
TARGET = 22

# (response, expected `score(response, GOLD)`)
CASES = [
    # Correct: the gold itself, or any expression over 3, 5, 7 worth 22.
    (f"<answer>{GOLD}</answer>", 1.0),
    ("<answer>7 + 5 * 3</answer>", 1.0),
    ("<answer>(3*5)+7</answer>", 1.0),
    ("<answer>  3\t*\n5 +   7  </answer>", 1.0),  # whitespace anywhere
    ("<think>3*5 is 15</think> <answer>3*5+7</answer>\n\n", 1.0),
    ("<answer>3*5+7</answer><|im_end|>", 1.0),  # end-of-sequence strings may follow
    ("<answer>3+5+7</answer> then <answer>3*5+7</answer>", 1.0),  # the last block counts
    ("So the answer is \\boxed{3 \\times 5 + 7}.", 1.0),  # boxed templates
    ("\\boxed{3+5+7} no, \\boxed{\\left(3 \\cdot 5\\right) + 7}", 1.0),  # the last box counts
    ("<answer>\\boxed{3 × 5 + 7}</answer>", 1.0),
    # The target alone, or an expression that ends in it.
    ("<answer>22</answer>", 0.0),
    ("\\boxed{22}", 0.0),
    ("22", 0.0),
    ("<answer>3*5+7 = 22</answer>", 0.0),
    # Wrong numbers, reused, missing or extra.
    ("<answer>4 * 5 + 2</answer>", 0.0),  # 22 from numbers not given
    ("<answer>15 + 7</answer>", 0.0),
    ("<answer>3*5+7+7-7</answer>", 0.0),  # 7 reused
    ("<answer>3*5+3+4</answer>", 0.0),
    ("<answer>5*5-3</answer>", 0.0),  # 5 reused, 7 missing
    ("<answer>3*5+7+0</answer>", 0.0),
    ("<answer>3*5+7*1</answer>", 0.0),
    ("<answer>(7 * 5 - 3 - 2 * 5) / 1</answer>", 0.0),  # extra numbers, even if worth 22
    # Wrong value.
    ("<answer>3*5*7</answer>", 0.0),
    ("<answer>3+5+7</answer>", 0.0),
    ("<answer>3*5+7</answer> then <answer>3+5+7</answer>", 0.0),
    ("<answer>7/(5-5)+3</answer>", 0.0),  # division by zero
    # Misplaced or malformed answers.
    ("<answer>3*5+7</answer> ok", 0.0),  # text after the answer block
    ("<answer>3*5+7</answer>\nDone.", 0.0),
    ("<answer>3*5+7", 0.0),  # unclosed
    ("3*5+7", 0.0),  # neither a block nor a box
    ("<answer></answer>", 0.0),
    ("<answer>-3+5*7-10</answer>", 0.0),  # unary minus refused
    ("<answer>+3*5+7</answer>", 0.0),
    ("<answer>3.0*5+7</answer>", 0.0),
    ("<answer>3x5+7</answer>", 0.0),
    ("<answer>3**5+7</answer>", 0.0),
    ("<answer>3^5+7</answer>", 0.0),
    ("<answer>__import__('os').system('true')</answer>", 0.0),
    ("<answer>(3*5+7</answer>", 0.0),
    ("<answer>3*5+7)</answer>", 0.0),
]


@pytest.mark.parametrize(("response", "expected"), CASES)
def test_score(response, expected):
    assert countdown.score(response, GOLD) == expected


@pytest.mark.parametrize(
    ("gold", "numbers", "target"),
    [
        ("3 * 5 + 7", (3, 5, 7), 22),
        ("(27 + (64 - 31)) - 52", (27, 31, 52, 64), 8),
        ("88 - (80 / 8)", (8, 80, 88), 78),
        ("(6 / 4) * 4 - 2", (2, 4, 4, 6), 4),  # a repeated number is given twice
    ],
)
def test_parse_gold(gold, numbers, target):
    assert countdown.parse_gold(gold) == (numbers, Fraction(target))
    assert countdown.score(f"<answer>{gold}</answer>", gold) == 1.0


@pytest.mark.parametrize(
    ("gold", "message"),
    [
        ("22", "uses 1 number"),  # a bare target, as older generators wrote
        ("", "empty"),
        ("twenty-two", "expected a number"),
        ("3 * 5 + 7 = 22", "unexpected '='"),
    ],
)
def test_bad_gold_is_refused(gold, message):
    with pytest.raises(ValueError, match=message):
        countdown.score("<answer>22</answer>", gold)


def test_format_score_is_configurable():
    wrong = "<answer>3+5+7</answer>"
    assert countdown.score_numbers(wrong, NUMBERS, TARGET) == 0.0
    assert countdown.score_numbers(wrong, NUMBERS, TARGET, format_score=0.1) == 0.1
    assert countdown.score_numbers("no answer", NUMBERS, TARGET, format_score=0.1) == 0.0


def test_non_integer_intermediates():
    # (6 / 4) * 4 - 2 = 4 passes through 3/2: allowed by default (TinyZero), refusable.
    response = "<answer>(6 / 4) * 4 - 2</answer>"
    assert countdown.score_numbers(response, [6, 4, 4, 2], 4) == 1.0
    assert countdown.score_numbers(response, [6, 4, 4, 2], 4, integer_intermediates=True) == 0.0
    ok = "<answer>8 / 4 + 2</answer>"
    assert countdown.score_numbers(ok, [8, 4, 2], 4, integer_intermediates=True) == 1.0


def test_exact_arithmetic():
    # In floats 1/3 * 3 is fine but (1/3 + 1/3 + 1/3) - 1 == 0 is not guaranteed; Fractions are.
    result = countdown.evaluate("(1/3 + 1/3 + 1/3) * 9")
    assert result.value == Fraction(9)
    assert result.numbers == (1, 3, 1, 3, 1, 3, 9)
    assert countdown.evaluate("10 - 2 - 3").value == 5  # left associative
    assert countdown.evaluate("2 * 3 + 4 * 5").value == 26  # precedence
    assert countdown.evaluate("100 / 8").value == Fraction(25, 2)


def test_numbers_as_multiset():
    assert countdown.score("<answer>5 + 5 + 2</answer>", "2 + 5 + 5") == 1.0
    assert countdown.score("<answer>5 + 2 + 5</answer>", "(2 * 2) + 8") == 0.0


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


HOSTILE = [
    "<answer>" + "(" * 100_000 + "3*5+7" + ")" * 100_000 + "</answer>",  # deep nesting
    "<answer>" + "(" * 17 + "3*5+7" + ")" * 17 + "</answer>",  # just past the depth bound
    "<answer>" + "1+" * 500_000 + "1</answer>",  # long
    "<answer>" + "9" * 1_000_000 + "</answer>",  # a huge literal
    "<answer>9**9**9**9</answer>",  # exponent towers: no power operator
    "<answer>(3*5+7)^(10^100)</answer>",
    "\\boxed{9^{9^{9^9}}}",
    "<answer>" * 200_000,  # no answer
    "\\boxed{" * 200_000 + "}",
    "\\boxed{" + "7 " * 1_000_000 + "}",
    "<answer>" + "\\times" * 200_000 + "</answer>",
    "x" * 5_000_000,
]


@pytest.mark.parametrize("response", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_inputs_are_rejected_without_hanging(response):
    start = time.perf_counter()
    assert countdown.score(response, GOLD) == 0.0
    # A hang guard, not a speed check: each is rejected in milliseconds, while evaluating one
    # (a tower, a 5 MB scan per character) would run for minutes.
    assert time.perf_counter() - start < 30.0


def test_bounds_admit_a_deeply_bracketed_right_answer():
    nested_ok = "(" * 16 + "3*5+7" + ")" * 16
    assert countdown.score(f"<answer>{nested_ok}</answer>", GOLD) == 1.0


def test_pool_scores_countdown_items():
    pickle.dumps(countdown.score)  # the pool sends the function by reference
    items = [(f"<answer>{GOLD}</answer>", GOLD), ("<answer>22</answer>", GOLD), ("x", "22")]
    with VerifierPool(
        countdown.score, num_workers=1, deadline_s=10.0, warmup=countdown.WARMUP
    ) as pool:
        rewards, statuses = pool.map_with_status(items)
    assert rewards == [1.0, 0.0, 0.0]
    assert statuses == ["ok", "ok", "crash"]  # a bad gold is counted, never scored
    assert countdown.score(*countdown.WARMUP) == 1.0
