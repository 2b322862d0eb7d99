"""Format rewards: the R1 template and language consistency."""

import pytest

from rlvr_jax.rewards import format as fmt

GOOD = "<think>\nadd them\n</think>\n<answer>\n4\n</answer>"

R1_CASES = [
    (GOOD, 1.0),
    ("<think>a</think><answer>4</answer>", 1.0),
    ("  <think>a</think>  <answer>4</answer>  \n", 1.0),
    (GOOD + "<|im_end|>", 1.0),
    (GOOD + "\n<|endoftext|><|endoftext|>", 1.0),
    ("<think></think><answer>4</answer>", 1.0),  # an empty thought is allowed
    ("<think>a</think><answer>  </answer>", 0.0),  # an empty answer is not
    (GOOD + " and more", 0.0),  # text after the answer
    ("So: " + GOOD, 0.0),  # text before <think>
    ("<think>a</think> so <answer>4</answer>", 0.0),  # text between the blocks
    ("<answer>4</answer><think>a</think>", 0.0),  # wrong order
    ("<think>a</think>", 0.0),  # no answer
    ("<answer>4</answer>", 0.0),  # no thought
    ("<think>a</think><think>b</think><answer>4</answer>", 0.0),  # think twice
    ("<think>a</think><answer>4</answer><answer>5</answer>", 0.0),  # answer twice
    ("<think>a <answer>3</answer></think><answer>4</answer>", 0.0),  # nested answer
    ("<think>a</think><answer>4", 0.0),  # unclosed
    ("", 0.0),
]


@pytest.mark.parametrize(("text", "expected"), R1_CASES)
def test_r1_format_reward(text, expected):
    assert fmt.r1_format_reward(text) == expected


def test_r1_format_with_think_opened_by_the_prompt():
    assert fmt.r1_format_reward("add them</think><answer>4</answer>", think_in_prompt=True) == 1.0
    assert fmt.r1_format_reward(GOOD, think_in_prompt=True) == 0.0  # <think> again
    assert fmt.r1_format_reward("add them</think><answer>4</answer>") == 0.0


def test_r1_format_custom_eos():
    assert fmt.r1_format_reward(GOOD + "[END]", eos_strings=("[END]",)) == 1.0
    assert fmt.r1_format_reward(GOOD + "[END]") == 0.0


@pytest.mark.parametrize(
    ("char", "script"),
    [
        ("a", "LATIN"),
        ("é", "LATIN"),
        ("я", "CYRILLIC"),
        ("λ", "GREEK"),
        ("中", "CJK"),
        ("の", "CJK"),
        ("カ", "CJK"),
        ("한", "HANGUL"),
        ("ع", "ARABIC"),
        ("א", "HEBREW"),
        ("क", "DEVANAGARI"),
        ("7", None),
        (" ", None),
        ("+", None),
    ],
)
def test_script_of(char, script):
    assert fmt.script_of(char) == script


LANGUAGE_CASES = [
    ("What is 2+2?", "Two plus two is four.", 1.0),
    ("What is 2+2?", "二加二等于四", 0.0),
    ("二加二等于几？", "二加二等于四", 1.0),
    ("二加二等于几？", "abcd二加二等于四", 6 / 10),
    ("Сколько будет 2+2?", "Будет four", 5 / 9),
    ("二加二等于几？", "答案是 $\\frac{x}{y}$ 和 \\sqrt{4}", 1.0),  # math is not language
    ("What is 2+2?", "4", 1.0),  # no letters in the response
    ("2+2?", "Four", 1.0),  # no letters in the prompt: no target
    ("What?", "$$unclosed math is text", 1.0),
]


@pytest.mark.parametrize(("prompt", "response", "expected"), LANGUAGE_CASES)
def test_language_consistency(prompt, response, expected):
    assert fmt.language_consistency(prompt, response) == pytest.approx(expected)


def test_language_consistency_explicit_script():
    assert fmt.language_consistency("What is 2+2?", "二加二等于四", script="CJK") == 1.0


def test_language_consistency_on_hostile_text():
    # Unclosed delimiters of every kind, a million times: linear scanning keeps this instant.
    text = "$$ \\( \\[ $" * 100_000 + "abc"
    assert fmt.language_consistency("hello", text) == 1.0
    assert fmt.language_consistency("hello", "$x$" * 300_000 + "я") == 0.0
