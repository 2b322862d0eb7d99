"""Math verifier: answer extraction, equivalence both ways, hostile inputs under a deadline."""

import json
import time
from fractions import Fraction

import pytest

from rlvr_jax.rewards import math as math_reward
from rlvr_jax.rewards import math_guard
from rlvr_jax.rewards.pool import VerifierPool
from tests.shared_data import DATA, needs_shared_data

# (pred, gold): each pair is equivalent, checked in both directions.
EQUIVALENT = [
    ("1000", "1,000"),
    ("1\\,000", "1000"),
    ("1 000", "1000"),
    ("1{,}000", "1000"),
    ("1\u2009000", "1000"),
    ("1\u202f000", "1000"),
    ("1,000,000", "10^6"),
    ("1,000.5", "1000.5"),
    ("42.", "42"),
    ("5.", "5.0"),
    ("3.0", "3"),
    ("+7", "7"),
    ("\u22123", "-3"),
    ("12.5\\%", "12.5"),
    ("12.5%", "0.125"),
    ("50\\%", "\\frac{1}{2}"),
    ("0.5", "\\frac{1}{2}"),
    ("\\dfrac{3}{4}", "0.75"),
    ("\\tfrac{3}{4}", "3/4"),
    ("\\frac34", "0.75"),
    ("-\\frac{1}{2}", "-0.5"),
    ("\\frac{-1}{2}", "-0.5"),
    ("2\\frac{1}{2}", "2.5"),
    ("1/3", "0.333333333333"),
    ("0.30000000000000004", "0.3"),
    ("1.5\\times10^{3}", "1500"),
    ("1e3", "1000"),
    ("\\$18", "18"),
    ("18 dollars", "18"),
    ("10\\text{ cm}", "10"),
    ("90^\\circ", "90"),
    ("90^{\\circ}", "90"),
    ("x=5", "5"),
    ("x = 5", "5"),
    ("$\\frac{1}{2}$", "1/2"),
    ("\\left( 1, 2 \\right)", "(1,2)"),
    ("(1,2)", "(1, 2)"),
    ("[1,2)", "[1, 2)"),
    ("(-\\infty, 3]", "(-\\infty,3]"),
    ("\\langle 1, 2\\rangle", "(1,2)"),
    ("\\{1,2,3\\}", "\\{3,2,1\\}"),
    ("2, -5", "-5, 2"),
    ("(1,2)\\cup(3,4)", "(3,4)\\cup(1,2)"),
    ("(0.5, \\frac{1}{4})", "(\\frac{1}{2}, 0.25)"),
    ("(5)", "5"),
    ("\\infty", "\u221e"),
    ("\\sqrt2", "\\sqrt{2}"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("\\sqrt{16}", "4"),
    ("2^{10}", "1024"),
    ("\\cos(\\pi)", "-1"),
    ("2\\pi", "6.283185307179586"),
    ("\\sqrt{2}", "1.41421356237"),
    ("\\pi/2", "\\frac{\\pi}{2}"),
    ("(x+1)^2", "x^2+2x+1"),
    ("\\text{Yes}", "yes"),
    ("(B)", "B"),
    ("\\textbf{(C)}", "C"),
    ("\\frac 59", "5/9"),
    ("x**2+1", "x^2+1"),
    ("5!", "120"),
    ("\\binom{10}{3}", "120"),
    ("2^{2023}", "2^{2022}\\cdot 2"),
    ("10^{400}\\pi", "\\pi 10^{400}"),  # beyond the range of a float, still compared
    ("e^{9999}", "e^{9998}e"),
    ("\\frac{(2n)!}{n!(n+1)!}", "\\frac{1}{n+1}\\binom{2n}{n}"),
    ("(x+1)^{32}", "(1+x)^{32}"),
    ("\\sqrt{x^2}", "|x|"),
    ("\\cos^2 x - \\sin^2 x", "\\cos(2x)"),
    ("e^{x}e^{y}", "e^{x+y}"),
    ("\\frac{x^2-1}{x-1}", "x+1"),
    ("\\log_2 8x", "3+\\log_2 x"),
    ("x^{0.5}", "\\sqrt{x}"),
]

# (pred, gold): never equivalent, in either direction.
DIFFERENT = [
    ("3.1415926", "3.14159265"),
    ("0.333333", "\\frac{1}{3}"),
    ("\\pi", "3.14159"),
    ("1.41421", "\\sqrt{2}"),
    ("1000000000000", "1000000000001"),
    ("0.1", "0.10000001"),
    ("10^{-10}", "0"),
    ("5", "6"),
    ("-5", "5"),
    ("1,000", "1"),
    ("1e3", "1001"),
    ("12.5", "0.125"),
    ("50\\%", "0.6"),
    ("\\frac{1}{2}", "\\frac{1}{3}"),
    ("2x", "2"),
    ("x^2+1", "x^2-1"),
    ("x", "y"),
    ("\\sqrt{3}", "\\sqrt{2}"),
    ("[1,2)", "(1,2)"),
    ("(1, 2]", "(1, 2)"),
    ("(-\\infty, 3)", "(-\\infty, 3]"),
    ("(1,2)", "(2,1)"),
    ("(1,2)", "\\{1,2\\}"),
    ("\\{1,2\\}", "\\{1,2,3\\}"),
    ("2, 3", "2, 3, 4"),
    ("A", "B"),
    ("\\text{yes}", "no"),
    ("", "5"),
    # Text that only starts like the answer: math_verify's plain-text extraction read these as 7.
    ("7²", "7"),
    ("7\u200b8", "7"),
    ("7 @@@", "7"),
    ("7 \\\\ 8", "7"),
    ("7^", "7"),
    # Values beyond the range of a float: as floats they read as inf (close to anything) or 0.
    ("e^{9999}", "7"),
    ("e^{9999}", "e^{9998}"),
    ("e^{-9999}", "0"),
    ("(1+\\sqrt{2})^{9999}", "7"),
    ("\\frac{1}{0}", "\\infty"),
    ("x \\cdot 0^{-1}", "x"),
    # Expressions that differ at a probe point, with no simplification.
    ("(x+1)^{30}", "(x+1)^{29}(x+1.000001)"),
    ("(x+218)!", "x+1"),
    ("\\sin x", "\\cos x"),
]


def test_tables_are_large_enough():
    assert len(EQUIVALENT) + len(DIFFERENT) >= 60


@pytest.mark.parametrize(("pred", "gold"), EQUIVALENT)
def test_equivalent_both_ways(pred, gold):
    assert math_reward.is_equivalent(pred, gold), (pred, gold)
    assert math_reward.is_equivalent(gold, pred), (gold, pred)


@pytest.mark.parametrize(("pred", "gold"), DIFFERENT)
def test_different_both_ways(pred, gold):
    assert not math_reward.is_equivalent(pred, gold), (pred, gold)
    assert not math_reward.is_equivalent(gold, pred), (gold, pred)


def test_none_is_never_equivalent():
    assert not math_reward.is_equivalent(None, "5")
    assert not math_reward.is_equivalent("5", None)
    with pytest.raises(TypeError, match="pred must be a str"):
        math_reward.is_equivalent(5, "5")


def test_numeric_rule():
    F = Fraction
    assert math_reward.numbers_close(F(10**15), F(10**15))
    assert not math_reward.numbers_close(F(10**15), F(10**15 + 1))  # integers: exact
    assert math_reward.numbers_close(F(1, 3), F(333333333333, 10**12))  # 1e-12 relative
    assert not math_reward.numbers_close(F(1, 3), F(333333, 10**6))


EXTRACT = [
    ("The answer is \\boxed{42}.", "42"),
    ("\\boxed{1} and then \\boxed{2}", None),  # two different final answers: none
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),
    ("so $\\boxed{x^{2}}$.", "x^{2}"),
    ("\\fbox{7}", "7"),
    ("\\boxed 5", "5"),
    ("\\boxed{42.}", "42."),
    ("\\boxed{a} \\boxed{unclosed", "a"),
    ("\\boxed{unclosed", None),
    ("#### 1,000", "1,000"),
    ("Natalia sold 48/2 = 24 clips.\n#### 72\n", "72"),
    ("<answer>1</answer> <answer>2</answer>", None),
    ("<answer>2</answer> <answer>2.0</answer>", "2.0"),  # they agree: the last
    ("<answer> \\boxed{7} </answer>", "7"),
    ("<think>so \\boxed{3}</think> <answer>5</answer>", "5"),
    ("<think><answer>9</answer></think> hence \\boxed{8}", "8"),
    ("<think>so \\boxed{3}</think> hence \\boxed{4}", "4"),
    ("<think>only here \\boxed{3}</think>", None),  # never committed
    ("<think>unclosed \\boxed{3}", "3"),  # no </think>: the whole response
    ("<answer>  </answer>", None),
    ("no answer at all", None),
    ("", None),
]


@pytest.mark.parametrize(("text", "expected"), EXTRACT)
def test_extract_answer(text, expected):
    assert math_reward.extract_answer(text) == expected


def test_boxed_trailing_dot_scores():
    assert math_reward.score("Thus \\boxed{42.}", "42") == 1.0
    assert math_reward.score("Thus \\boxed{41}", "42") == 0.0
    assert math_reward.score("no answer", "42") == 0.0


def test_extract_is_linear_on_hostile_text():
    # Quadratic scans would not finish; the values are what the rules say.
    assert math_reward.extract_answer("\\boxed{" * 100_000) is None
    assert math_reward.extract_answer("<answer>" * 100_000 + "</answer>") is None
    assert math_reward.extract_answer("{" * 500_000 + "\\boxed{1}" + "}" * 10) == "1"
    assert math_reward.extract_answer("x" * 1_000_000 + "\\boxed{7}") == "7"


# (answer, words of the rule that rejects it, or None when sympy may have it): each limit from
# both sides.
COST_RULES = [
    ("x^2+2x+1", None),
    ("\\frac{\\sqrt{6}+\\sqrt{2}}{4}", None),
    ("\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}", None),
    ("\\frac 59", None),
    ("1" * 400, None),
    ("1" * 401, "characters"),
    ("+".join("a" * 40), None),
    ("+".join("a" * 41), "more than 80 tokens"),
    ("(" * 24 + "1" + ")" * 24, None),
    ("(" * 25 + "1" + ")" * 25, "nested"),
    ("(1+2", "unbalanced"),
    ("9^{9999}", None),
    ("9^{10001}", "exponent above 10000"),
    ("2^{-10000}", None),
    ("9^{9^{9}}", "tower"),
    ("9^9^9", "tower"),
    ("(x^2+1)^2", None),
    ("(2^3)^2", "power of a power"),
    ("((x^2+1)^2+1)^2", "power of a power"),
    ("e^{x^2}", "tower"),
    ("\\exp(\\exp(1))", "tower"),
    ("10000!", None),
    ("10001!", "argument above 10000"),
    ("(3!)!", "factorial, binomial or Gamma of a power or factorial"),
    ("\\binom{10000}{5000}", None),
    ("\\binom{10001}{5000}", "argument above 10000"),
    ("\\Gamma(10001)", "argument above 10000"),
    ("\\binom{x}{32}", None),
    ("\\binom{x}{33}", "degree above 32"),
    ("\\binom{\\sqrt{2}}{32}", None),
    ("\\binom{\\sqrt{2}}{4257}", "binomial of a non-integer"),
    ("(x+1)^{63}+1", "degree above 32"),
    ("(x+y)^{32}", None),
    ("(x+y+z)^{9}", None),
    ("(x+y+z)^{10}", "more than 64 terms"),
    ("(a+b)(c+d)(e+f)(g+h)(i+j)(k+l)", None),
    ("(a+b)(c+d)(e+f)(g+h)(i+j)(k+l)(m+n)", "more than 64 terms"),
    ("\\cdot".join(["9^{9999}"] * 10), None),
    ("\\cdot".join(["9^{9999}"] * 11), "digits"),
    ("x^2" * 16, None),
    ("x^2" * 17, "more than 16 powers"),
    ("\\sin(10^{300})", None),
    ("\\sin(10^{301})", "function next to a number of more than 300 digits"),
    ("\\cos(x)^{3}9^{944}", "function next to a number of more than 300 digits"),
    ("\\sqrt{8173 \\cdot 9^{8442}-18}", "function next to a number of more than 300 digits"),
    ("|9^{999}+1|^{999}", "power of a power"),
    ("|a+b+c+d|^{30}", "more than 64 terms"),
    ("\\sin x+\\cos y+\\log z", None),
    ("\\sin x+\\cos y+\\log z+\\sqrt{x}", "functions"),
    ("+".join(f"\\sqrt{{{k}}}" for k in range(2, 14)), None),
    ("+".join(f"\\sqrt{{{k}}}" for k in range(2, 15)), "more than 12 functions"),
    ("\\sum_{k=1}^{n} k", "never a final answer"),
    ("\\int_0^1 x\\,dx", "never a final answer"),
    ("\\begin{vmatrix} a & b \\\\ c & d \\end{vmatrix}", "determinant"),
    ("\\begin{pmatrix} a & b \\\\ c & d \\end{pmatrix}^{2}", "power of a matrix"),
    ("1e5+1", "scientific notation"),
    ("7 \\\\ 8", "line break"),
    ("7^", "without its operand"),
    ("7²", "character"),
]


@pytest.mark.parametrize(("answer", "rule"), COST_RULES)
def test_sympy_cost_rules(answer, rule):
    reason = math_guard.sympy_cost_reason(answer)
    if rule is None:
        assert reason is None, (answer, reason)
    else:
        assert reason is not None and rule in reason, (answer, reason)
    assert math_reward.too_costly_for_sympy(answer) == (rule is not None)


@needs_shared_data
def test_no_contest_answer_breaks_a_cost_rule():
    golds = []
    for name in ("math500", "aime", "amc"):
        with open(DATA / name / "test.jsonl") as f:
            golds += [str(json.loads(line)["answer"]) for line in f]
    assert len(golds) > 500
    broken = [(g, math_guard.sympy_cost_reason(math_reward.normalize(g))) for g in golds]
    assert [b for b in broken if b[1] is not None] == []


def test_sympy_numbers_beyond_floats_compare():
    big = math_reward._sympy_number(math_reward._sympy_parse("e^{9999}"))
    assert not math_reward.numbers_close(big.value, Fraction(7))
    assert not math_reward.numbers_close(Fraction(7), big.value)
    assert math_reward.numbers_close(big.value, big.value * (1 + 1e-12))
    assert not math_reward.numbers_close(big.value, big.value * (1 + 1e-6))


DEADLINE_S = 2.0
SLACK_S = 1.5

HOSTILE = {
    "power tower": "\\boxed{9^{9^{9^9}}}",
    "python power tower": "\\boxed{10**10**10}",
    "bare power tower": "\\boxed{9^9^9^9}",
    "parenthesized tower": "\\boxed{9^(9^(9^9))}",
    "huge exponent": "\\boxed{2^{1000000000}}",
    "huge scientific": "\\boxed{1e999999999}",
    "factorial tower": "\\boxed{((10!)!)!}",
    "huge factorial": "\\boxed{100000!}",
    "huge binomial": "\\boxed{\\binom{10^{100}}{10^{50}}}",
    "10k parentheses": "\\boxed{" + "(" * 10_000 + "1" + ")" * 10_000 + "}",
    "10k braces": "\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}",
    "2k nested fractions": "\\boxed{" + "\\frac{1}{" * 2000 + "2" + "}" * 2000 + "}",
    "100k unclosed boxes": "\\boxed{" * 100_000,
    "1 MB of digits": "\\boxed{" + "1" * 1_000_000 + "}",
    "1 MB of text": "a" * 1_000_000,
    "1 MB of dollars": "$" * 1_000_000,
    "100k commas": "\\boxed{" + ",".join(["1"] * 100_000) + "}",
}


@pytest.fixture(scope="module")
def math_pool():
    with VerifierPool(
        math_reward.score, num_workers=2, deadline_s=DEADLINE_S, warmup=math_reward.WARMUP
    ) as pool:
        assert pool.map([("\\boxed{1}", "1")]) == [1.0]  # both workers warm before timing
        yield pool


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_input_finishes_within_deadline(math_pool, name):
    start = time.monotonic()
    rewards, statuses = math_pool.map_with_status([(HOSTILE[name], "1")])
    elapsed = time.monotonic() - start
    assert rewards == [0.0]
    assert statuses[0] in ("ok", "timeout")
    assert elapsed < DEADLINE_S + SLACK_S, f"{name}: {elapsed:.2f} s"


def test_pool_scores_math_and_reports_throughput(math_pool):
    items, expected = [], []
    for i in range(100):
        items += [
            (f"so \\boxed{{{i * 1000:,}}}", str(i * 1000)),
            (f"<answer>\\frac{{{i}}}{{4}}</answer>", str(i / 4)),
            ("\\boxed{(x+1)^2}", "x^2+2x+1") if i % 10 == 0 else ("#### 3", "4"),
        ]
        expected += [1.0, 1.0, 1.0 if i % 10 == 0 else 0.0]
    checks, seconds = math_pool.stats.checks, math_pool.stats.seconds
    assert math_pool.map(items) == expected
    checks = math_pool.stats.checks - checks
    seconds = math_pool.stats.seconds - seconds
    print(f"\nmath pool throughput: {checks / seconds:.0f} checks/s ({checks} checks, 2 workers)")


# Answers that used to fool the verifier one way or the other: a hedge of several different
# answers, an answer left in the thought, a sentence whose words were stripped as units, a big
# integer compared as a float; and right answers it used to miss.
VERDICTS = [
    ("\\boxed{3} or \\boxed{4}", "4", 0.0),  # two different final answers: no credit
    ("<answer>3</answer> <answer>4</answer>", "4", 0.0),
    ("\\boxed{2 \\text{ or } 3}", "3", 0.0),
    ("<think>so \\boxed{4}</think>", "4", 0.0),  # never committed outside the thought
    ("\\boxed{5 \\text{ apples and 7 oranges}}", "5", 0.0),  # a sentence, not a unit
    ("\\boxed{5 \\text{ cm}}", "5", 1.0),  # a unit is still stripped
    ("\\boxed{1000000000000000000001}", "1000000000000000000000", 0.0),  # integers exactly
    ("\\boxed{1000000000000000000000}", "1000000000000000000000", 1.0),
    ("\\boxed{e^{i\\pi}}", "-1", 1.0),
    ("\\boxed{\\sin^2 x + \\cos^2 x}", "1", 1.0),
    ("\\boxed{0.\\overline{3}}", "\\frac{1}{3}", 1.0),
    ("\\boxed{0.\\overline{142857}}", "\\frac{1}{7}", 1.0),
    ("\\boxed{\\begin{pmatrix}1\\\\2\\end{pmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", 1.0),
    ("\\boxed{\\begin{pmatrix}1\\\\3\\end{pmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", 0.0),
    ("\\boxed{(1, 2]}", "(1,2]", 1.0),
    ("\\boxed{[1, 2]}", "(1,2]", 0.0),  # a closed end is another interval
    ("The final answer is 42.", "42", 1.0),  # a closing sentence without a box
    ("Therefore, the answer is $\\frac{1}{2}$.", "\\frac{1}{2}", 1.0),
]


@pytest.mark.parametrize(("response", "gold", "reward"), VERDICTS)
def test_verdicts_on_hedges_thoughts_and_forms(response, gold, reward):
    assert math_reward.score(response, gold) == reward, (response, gold)
