"""The math verifier scores the answer a response commits to: several different final answers,
answers only in the thinking, answer sentences and their hedges, unit words, the numeric rule."""

import pytest

from rlvr_jax.rewards import math as math_reward
from rlvr_jax.rewards import math_extract


def _positions(answers: list[str], right: str) -> list[tuple[str, list[str]]]:
    """The right answer first, in the middle and last among `answers` (which hold it once)."""
    others = [a for a in answers if a != right]
    return [
        ("first", [right, *others]),
        ("middle", [others[0], right, *others[1:]]),
        ("last", [*others, right]),
    ]


def _several() -> list[tuple[str, str, str, float]]:
    """(name, response, gold, score) for several different final answers: never credited."""
    rows = []
    for where, answers in _positions(["3", "4", "5"], "5"):
        boxes = ", or ".join(f"\\boxed{{{a}}}" for a in answers)
        rows += [
            (f"boxes, right {where}", f"Maybe {boxes}.", "5", 0.0),
            (f"boxes in <answer>, right {where}", f"<answer>{boxes}</answer>", "5", 0.0),
            (f"#### lines, right {where}", "".join(f"#### {a}\n" for a in answers), "5", 0.0),
            (
                f"<answer> blocks, right {where}",
                " ".join(f"<answer>{a}</answer>" for a in answers),
                "5",
                0.0,
            ),
            (
                f"sentences, right {where}",
                " ".join(f"The answer is {a}." for a in answers),
                "5",
                0.0,
            ),
            (
                f"box and ####, right {where}",
                f"\\boxed{{{answers[0]}}}\n#### {answers[-1]}",
                "5",
                0.0 if answers[0] != answers[-1] else 1.0,
            ),
        ]
    return rows


COMMITTED = [
    # The false positives.
    ("three boxes", "Maybe \\boxed{3}, or \\boxed{4}, or \\boxed{5}.", "5", 0.0),
    ("two boxes in <answer>", "<answer>\\boxed{41} \\boxed{42}</answer>", "42", 0.0),
    ("two ####", "so 3\n#### 3\nno, 5\n#### 5", "5", 0.0),
    ("box of a sentence", "\\boxed{12 is not correct}", "12", 0.0),
    ("text box of a sentence", "\\boxed{12\\text{ is not correct}}", "12", 0.0),
    ("near an integer gold", "\\boxed{123456789012.5}", "123456789012", 0.0),
    ("withdrawn in thinking", "<think>It is \\boxed{5}.</think> I cannot tell.", "5", 0.0),
    ("empty after thinking", "<think>\\boxed{5}</think>", "5", 0.0),
    # Several answers that agree are that answer.
    ("same box twice", "\\boxed{5} ... so \\boxed{5}", "5", 1.0),
    ("1/2 and 0.5", "\\boxed{1/2}, that is \\boxed{0.5}", "0.5", 1.0),
    ("agree but wrong", "\\boxed{1/2}, that is \\boxed{0.5}", "0.25", 0.0),
    ("box and #### agree", "\\boxed{72}\n#### 72", "72", 1.0),
    ("blocks agree", "<answer>7</answer> <answer>\\boxed{7.0}</answer>", "7", 1.0),
    ("a box in a box", "\\boxed{\\boxed{5}}", "5", 1.0),
    ("an empty box beside", "\\boxed{5} and \\boxed{}", "5", 0.0),
    # The committed region.
    ("answer after thinking", "<think>maybe \\boxed{4}</think> so \\boxed{5}", "5", 1.0),
    ("thinking disagrees", "<think>maybe \\boxed{5}</think> so \\boxed{4}", "5", 0.0),
    ("no </think>: all of it", "<think>so \\boxed{5}", "5", 1.0),
    ("<answer> wins over text", "\\boxed{4} <answer>5</answer>", "5", 1.0),
    ("sentence in <answer>", "<answer>The answer is 5.</answer>", "5", 1.0),
    ("#### in <answer>", "<answer>#### 5</answer>", "5", 1.0),
    # Closing sentences without a box.
    ("final answer sentence", "We add them. The final answer is 42.", "42", 1.0),
    ("answer with variable", "Therefore the answer is $x=3$.", "3", 1.0),
    (
        "Minerva style",
        "Final Answer: The final answer is $\\frac{1}{2}$. I hope it is correct.",
        "0.5",
        1.0,
    ),
    ("bold answer", "**Final Answer:** 42", "42", 1.0),
    ("answer colon", "Answer: $(1, 2)$", "(1,2)", 1.0),
    ("with a unit", "So the answer is 5 cm.", "5", 1.0),
    ("with a reason", "So the answer is 5, since 2 + 3 = 5.", "5", 1.0),
    ("LaTeX thin spaces", "The answer is $11,\\!111$.", "11111", 1.0),
    ("choice letter", "The answer is (B).", "B", 1.0),
    ("same sentence twice", "The answer is 5. Checking: yes, the answer is 5.", "5", 1.0),
    ("box beats sentence", "The answer is 4. Hmm, no: \\boxed{5}", "5", 1.0),
    ("not", "The answer is not 5.", "5", 0.0),
    ("is not", "So 5 is wrong; the answer is not 5.", "5", 0.0),
    ("maybe", "The answer is maybe 5.", "5", 0.0),
    ("or", "The answer is 5 or 6.", "5", 0.0),
    ("either", "The answer is either 5 or 6.", "5", 0.0),
    ("a clause with or", "The answer is 5, or perhaps 6.", "5", 0.0),
    ("if", "If the answer is 5, then x = 2.", "5", 0.0),
    ("whether", "We check whether the answer is 5.", "5", 0.0),
    ("question", "Is the answer is 5?", "5", 0.0),
    ("approximately", "The answer is approximately 5.", "5", 0.0),
    ("a word", "The answer is five apples.", "5", 0.0),
    ("words after", "The answer is 5 apples and 2 pears.", "5", 0.0),
    ("less than", "The answer is less than 5.", "5", 0.0),
    ("correct", "The answer is 5. I think the answer is correct.", "5", 1.0),
    ("corrected", "The answer is 4. Wait, the answer is 5.", "5", 0.0),
    ("no marker", "It is 5.", "5", 0.0),
    ("markdown heading", "#### Step 1: add\n2 + 3 = 5\n#### 5", "5", 1.0),
    ("heading only", "#### Solution\n5", "5", 0.0),
    # Unit words: only known units after a lone number.
    ("cm", "\\boxed{10\\text{ cm}}", "10", 1.0),
    ("dollars", "\\boxed{18 dollars}", "18", 1.0),
    ("square units", "\\boxed{12 square units}", "12", 1.0),
    ("degrees in text", "\\boxed{\\frac{270}7\\text{ degrees}}", "\\frac{270}{7}", 1.0),
    ("cents", "\\boxed{5.4 \\text{ cents}}", "5.4", 1.0),
    ("percent word", "\\boxed{50 percent}", "0.5", 1.0),
    ("not a unit", "\\boxed{12 apples are wrong}", "12", 0.0),
    ("unit after an expression", "\\boxed{2x cm}", "2", 0.0),
    # The numeric rule.
    ("integer gold, decimal", "\\boxed{12.0000000001}", "12", 0.0),
    ("integer gold, same", "\\boxed{12.0}", "12", 1.0),
    ("large integers exact", "\\boxed{123456789012345678}", "123456789012345680", 0.0),
    ("large integers equal", "\\boxed{123456789012345678}", "123,456,789,012,345,678", 1.0),
    ("non-integer gold, tolerance", "\\boxed{0.333333333333}", "\\frac{1}{3}", 1.0),
    ("non-integer gold, 6 digits", "\\boxed{0.333333}", "\\frac{1}{3}", 0.0),
    ("closed form at an integer", "\\boxed{(\\sqrt{2}+1)(\\sqrt{2}-1)}", "1", 1.0),
    ("closed form near an integer", "\\boxed{\\sqrt{4+10^{-12}}}", "2", 0.0),
    # The false negatives of the issue.
    ("Euler", "\\boxed{e^{i\\pi}}", "-1", 1.0),
    ("Euler plus one", "\\boxed{e^{i\\pi}+1}", "0", 1.0),
    ("i squared", "\\boxed{i^2}", "-1", 1.0),
    ("Pythagoras", "\\boxed{\\sin^2 x + \\cos^2 x}", "1", 1.0),
    ("Pythagoras, parentheses", "\\boxed{\\sin^2(x)+\\cos^2(x)}", "1", 1.0),
    ("not an identity", "\\boxed{\\sin^2 x + \\cos x}", "1", 0.0),
    ("x over x", "\\boxed{\\frac{x}{x}}", "1", 1.0),
    ("repeating 1/3", "\\boxed{0.\\overline{3}}", "1/3", 1.0),
    ("repeating 1/6", "\\boxed{0.1\\overline{6}}", "\\frac{1}{6}", 1.0),
    ("repeating 1/7", "\\boxed{0.\\overline{142857}}", "\\frac17", 1.0),
    ("repeating bar", "\\boxed{0.\\bar{3}}", "\\frac{1}{3}", 1.0),
    ("repeating is not 0.33", "\\boxed{0.\\overline{3}}", "0.33", 0.0),
    *_several(),
]


def test_commit_table_is_large_enough():
    assert len(COMMITTED) >= 90


@pytest.mark.parametrize(("name", "response", "gold", "expected"), COMMITTED)
def test_score_of_committed_answer(name, response, gold, expected):
    assert math_reward.score(response, gold) == expected, (name, response)


# (text, the different final answers `final_answers` lists, what `extract_answer` returns)
FINAL_ANSWERS = [
    ("\\boxed{3} \\boxed{4} \\boxed{3}", ["4", "3"], None),
    ("\\boxed{1/2} \\boxed{0.5}", ["1/2", "0.5"], "0.5"),
    ("\\boxed{ 5 } \\boxed{5}", ["5"], "5"),
    ("\\boxed 5 \\boxed{5}", ["5"], "5"),
    ("\\boxed{\\boxed 5}", ["\\boxed 5"], "\\boxed 5"),
    ("\\boxed{a \\boxed{b}}", ["a \\boxed{b}"], "a \\boxed{b}"),
    ("<think>\\boxed{1}</think>", [], None),
    ("<think>\\boxed{1}</think> The answer is 2.", ["2"], "2"),
    ("<answer></answer>", [""], None),
    ("<answer>5</answer> \\boxed{6}", ["5"], "5"),
    ("#### 1,000\n#### 1000", ["1,000", "1000"], "1000"),
    ("#### Step 1:\nThe answer is 3.", ["3"], "3"),
    ("The answer is: 7", ["7"], "7"),
    ("The answer to this problem is 7.", ["7"], "7"),
    ("answer", [], None),
]


@pytest.mark.parametrize(("text", "answers", "extracted"), FINAL_ANSWERS)
def test_final_answers(text, answers, extracted):
    assert math_extract.final_answers(text) == answers
    assert math_reward.extract_answer(text) == extracted


def test_more_different_answers_than_the_limit_are_none():
    k = math_extract.MAX_ANSWERS
    agreeing = " ".join(["\\boxed{2}", "\\boxed{2.0}", "\\boxed{4/2}", "\\boxed{\\frac{2}{1}}"])
    assert math_reward.extract_answer(agreeing) == "\\frac{2}{1}"
    many = " ".join(f"\\boxed{{{2 * (i + 1)}/{i + 1}}}" for i in range(k))
    assert math_reward.extract_answer(many) == f"{2 * k}/{k}"
    assert math_reward.extract_answer(many + f" \\boxed{{{2 * k + 2}/{k + 1}}}") is None


def test_agreement_uses_the_equivalence_given():
    calls = []

    def same(a: str, b: str) -> bool:
        calls.append((a, b))
        return True

    assert math_extract.committed_answer("\\boxed{x} \\boxed{y} \\boxed{z}", same) == "z"
    assert calls == [("x", "z"), ("y", "z")]
    assert math_extract.committed_answer("\\boxed{x} \\boxed{y}", lambda a, b: False) is None


def test_final_answers_takes_only_text():
    with pytest.raises(TypeError, match="text must be a str"):
        math_extract.final_answers(b"\\boxed{1}")  # type: ignore[arg-type]


# Hostile shapes of several answers: each in linear time, with the value the rule gives.
MB = 1_000_000
HOSTILE_SEVERAL = [
    ("\\boxed{8}" * 100_000, "8"),
    ("".join(f"\\boxed{{{i}}}" for i in range(10_000)), None),
    ("\\boxed{" * 10_000 + "8" + "}" * 10_000, "8"),
    ("\\boxed{ " * 10_000 + "8" + " }" * 10_000, "8"),
    ("#### 7\n" * 100_000, "7"),
    ("####" * 100_000, None),
    ("<answer>7</answer>" * 50_000, "7"),
    ("<answer>" * 100_000 + "</answer>", None),
    ("answer:" * (MB // 7), None),
    ("The answer is 7 " * (MB // 16), "7"),
    ("".join(f"The answer is {7 + i % 2}.\n" for i in range(50_000)), None),
    ("The answer is " + "$" * MB, None),
    ("The answer is " + "\\" * MB, None),
]


@pytest.mark.parametrize(("text", "expected"), HOSTILE_SEVERAL)
def test_hostile_several_answers(text, expected):
    assert math_reward.extract_answer(text) == expected
