"""Reasoning traces: arithmetic thoughts that evaluate to the answer, step by step."""

import re

import pytest

from rlvr_jax.data import datasets
from rlvr_jax.data.example import Example
from rlvr_jax.rewards import format as fmt
from rlvr_jax.sft import fusion, traces

_STEP = re.compile(r"^(-?\d+)([+\-*])(\d+)=(-?\d+)$")


def _check_steps(expression: str, steps: list[str]) -> None:
    """Every step is right, each starts from the value the one before it ended on (or a term of
    the expression), and the last one ends on the expression's value."""
    for line in steps:
        a, op, b, result = _STEP.match(line).groups()
        assert eval(f"{a}{op}{b}") == int(result), line  # noqa: S307 - digits and + - * only
    assert int(steps[-1].rsplit("=", 1)[-1]) == eval(expression)  # noqa: S307
    sums = [s for s in steps if "*" not in s]
    for before, after in zip(sums, sums[1:], strict=False):
        assert after.startswith(before.rsplit("=", 1)[-1]), (before, after)


@pytest.mark.parametrize("level", sorted(datasets.ARITHMETIC_LEVELS))
def test_arithmetic_steps_reach_the_value_at_every_level(level):
    for ex in datasets.arithmetic_examples(200, seed=3, level=level):
        expression = ex.meta["expression"]
        steps = traces.arithmetic_steps(expression)
        if len(steps) == 1 and "=" not in steps[0]:
            assert steps[0] == ex.answer
            continue
        _check_steps(expression, steps)
        assert steps[-1].rsplit("=", 1)[-1] == ex.answer


def test_arithmetic_steps_by_hand():
    assert traces.arithmetic_steps("47+38") == ["47+30=77", "77+8=85"]
    assert traces.arithmetic_steps("47-38") == ["47-30=17", "17-8=9"]
    assert traces.arithmetic_steps("305+7") == ["305+7=312"]
    assert traces.arithmetic_steps("5-3*4+10") == ["3*4=12", "5-10=-5", "-5-2=-7", "-7+10=3"]
    assert traces.arithmetic_steps("7") == ["7"]


@pytest.mark.parametrize("bad", ["", "4+", "4//2", "a+b", "4 + -2", "3.5+1"])
def test_a_bad_expression_is_named(bad):
    with pytest.raises(ValueError, match="is not 'a op b"):
        traces.arithmetic_steps(bad)


def test_traces_from_examples():
    arith = datasets.arithmetic_examples(1, seed=0, level=2)[0]
    written = Example("w/0", "Why?", "42", "jsonl", meta={"thought": " Because.\n"})
    bare = Example("b/0", "What?", "7", "gsm8k")
    a, w, b = traces.traces_from_examples([arith, written, bare], "#### {answer}")
    assert a.thought == "\n".join(traces.arithmetic_steps(arith.prompt_text))
    assert a.answer == f"#### {arith.answer}" and a.question == arith.prompt_text
    assert (w.thought, w.answer, w.source) == ("Because.", "#### 42", "jsonl")
    assert (b.thought, b.answer) == ("", "#### 7")  # only a non-thinking row


def test_thoughts_from_verified_samples():
    a, b = arith = datasets.arithmetic_examples(2, seed=0, level=2)
    samples = {
        # An unclosed block, then an empty one, then the first with a thought: that one is kept.
        a.id: [
            "<think>\n1+1=2",
            "<think>\n\n</think>\n\n#### 9",
            "<think>\nmine\n</think>\n\n#### 9",
        ],
        b.id: ["#### 3"],  # no block: no thought
    }
    ta, tb = traces.traces_from_samples(arith, samples, "#### {answer}")
    assert (ta.thought, ta.answer, ta.question) == ("mine", "#### 9", a.prompt_text)
    assert (tb.thought, tb.answer) == ("", f"#### {b.answer}")
    assert traces.traces_from_samples([a], {}, "{answer}")[0].answer == a.answer


@pytest.mark.parametrize(
    "response, split",
    [
        ("<think>\nx\ny\n</think>\n\n#### 5", ("x\ny", "#### 5")),
        ("  <think>x</think>5", ("x", "5")),
        ("<think>\n\n</think>\n\n5", None),  # empty
        ("<think>\nx", None),  # never closed
        ("5 <think>x</think>", None),  # not leading
    ],
)
def test_split_thinking(response, split):
    assert fmt.split_thinking(response) == split
    if split is not None:
        assert fmt.split_thinking(fusion.thinking_response(*split)) == split
