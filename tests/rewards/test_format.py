"""Format rewards: the R1 template and language consistency."""

import random
import threading

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


def _strip_eos_by_slicing(text, eos_strings=fmt.EOS_STRINGS):
    """The definition `strip_eos` keeps: slice one end string at a time (quadratic)."""
    text = text.rstrip()
    changed = True
    while changed:
        changed = False
        for eos in eos_strings:
            if eos and text.endswith(eos):
                text = text[: -len(eos)].rstrip()
                changed = True
    return text


STRIP_CASES = [
    (GOOD + "<|im_end|>", fmt.EOS_STRINGS, GOOD),
    (GOOD + " <|im_end|>\n<|endoftext|> </s>\t", fmt.EOS_STRINGS, GOOD),
    ("<|im_end|>", fmt.EOS_STRINGS, ""),
    ("  \n ", fmt.EOS_STRINGS, ""),
    ("x<|im_end", fmt.EOS_STRINGS, "x<|im_end"),
    ("<|im_end|> x", fmt.EOS_STRINGS, "<|im_end|> x"),
    ("aab b", ("b", "ab"), "a"),  # the order of the end strings decides which one is cut
    ("aab b", ("ab", "b"), "a"),
    ("xab", ("", "b"), "xa"),  # an empty end string is ignored
]


@pytest.mark.parametrize(("text", "eos_strings", "expected"), STRIP_CASES)
def test_strip_eos(text, eos_strings, expected):
    assert fmt.strip_eos(text, eos_strings) == expected
    assert _strip_eos_by_slicing(text, eos_strings) == expected


def test_strip_eos_equals_slicing_on_random_text():
    rng = random.Random(0)
    pieces = ["a", "b", " ", "\n", "<", "|", ">", "</s>", "<|im_end|>", "<|eot_id|>", "s>"]
    eos_sets = [fmt.EOS_STRINGS, ("b", "ab"), ("ab", "b"), ("</s>", "s>", " s"), ("a",)]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        eos_strings = rng.choice(eos_sets)
        assert fmt.strip_eos(text, eos_strings) == _strip_eos_by_slicing(text, eos_strings), (
            text,
            eos_strings,
        )


MB = 1_000_000
# A 1 MB answer per shape a model can emit; each helper must stay linear in its length.
LONG_ANSWERS = {
    "end tokens": GOOD + "<|im_end|>" * (MB // 10),
    "end tokens and newlines": GOOD + "<|im_end|>\n" * (MB // 11),
    "mixed end tokens": GOOD + "</s><|endoftext|><|eot_id|>" * (MB // 27),
    "trailing spaces": GOOD + " " * MB,
    "spaces then an end token": GOOD + " " * MB + "<|im_end|>",
    "tags": "<think></think><answer>" * (MB // 23),
    "letters": "a" * MB,
    "han": "中" * MB,
    "inline math": "$x$" * (MB // 3),
    "unclosed math": "$$ \\( \\[ $" * (MB // 10),
    "commands": "\\frac" * (MB // 5),
}
HELPERS = {
    "strip_eos": fmt.strip_eos,
    "r1_format_reward": fmt.r1_format_reward,
    "dominant_script": fmt.dominant_script,
    "language_consistency": lambda text: fmt.language_consistency("What is 2+2?", text),
}


# Only a hang trips this: the linear helpers take at most 0.3 s of CPU on 1 MB and 1 s on 16 MB
# of end tokens here (benchmarks/format_linear.py measures them), while a rescan per character or
# a backtracking regex on 1 MB runs for hours, and a slice per end token on 16 MB (the copies
# `strip_eos` avoids: 1.4 s on 1 MB, 10 s on 2 MB) for many minutes.
HANG_S = 60.0


def _bounded(fn, text):
    """`fn(text)`, run in a thread that must return within HANG_S."""
    out = {}

    def target():
        try:
            out["value"] = fn(text)
        except BaseException as e:  # re-raised in the test's thread
            out["error"] = e

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(HANG_S)
    assert not worker.is_alive(), f"still running after {HANG_S:.0f} s on {len(text)} characters"
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.mark.parametrize("helper", list(HELPERS))
@pytest.mark.parametrize("shape", list(LONG_ANSWERS))
def test_helpers_finish_on_a_1mb_answer(shape, helper):
    _bounded(HELPERS[helper], LONG_ANSWERS[shape])


@pytest.mark.parametrize("helper", ["strip_eos", "r1_format_reward"])
def test_end_tokens_are_stripped_without_a_copy_each(helper):
    text = GOOD + "<|im_end|>" * (16 * MB // 10)
    assert _bounded(HELPERS[helper], text) == (GOOD if helper == "strip_eos" else 1.0)


def test_long_answers_keep_their_rewards():
    for shape in ("end tokens", "end tokens and newlines", "mixed end tokens"):
        assert fmt.strip_eos(LONG_ANSWERS[shape]) == GOOD
        assert fmt.r1_format_reward(LONG_ANSWERS[shape]) == 1.0
    assert fmt.r1_format_reward(LONG_ANSWERS["spaces then an end token"]) == 1.0
    assert fmt.r1_format_reward(LONG_ANSWERS["tags"]) == 0.0
    assert fmt.dominant_script(LONG_ANSWERS["han"]) == "CJK"
    assert fmt.language_consistency("What is 2+2?", LONG_ANSWERS["inline math"]) == 1.0


@pytest.mark.parametrize(
    "text, think, expected",
    [
        ("<think>\n47+30=77\n</think>\n\n#### 77", True, 1.0),
        (" <think>x</think>77", True, 1.0),
        ("<think>\n\n</think>\n\n#### 77", True, 0.0),  # empty: not thinking
        ("<think>\n47+30=77", True, 0.0),  # never closed
        ("#### 77", True, 0.0),
        ("#### 77 <think>x</think>", True, 0.0),  # not where the answer starts
        ("<think>\n\n</think>\n\n#### 77", False, 1.0),  # Qwen3's empty block
        ("#### 77", False, 1.0),
        ("<think>\nx\n</think>\n\n#### 77", False, 0.0),
        ("#### 77 <think>x", False, 0.0),
    ],
)
def test_mode_reward(text, think, expected):
    assert fmt.mode_reward(text, think) == expected
