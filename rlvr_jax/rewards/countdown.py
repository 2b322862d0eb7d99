"""Countdown (TinyZero rules): combine the given numbers with + - * / into the target.

Host code, standard library only, no `eval`.

The gold answer (`Example.answer` of a `data.countdown_tasks` problem) is one solution expression,
such as "(3 + 5) * 2". It carries the whole problem: its integer literals are the given numbers
(each used exactly once, so the multiset of literals is the multiset of numbers) and its exact
value is the target. `score(response, gold)` recovers both from it, so the verifier pool needs
nothing but `(response, gold)` pairs: `VerifierPool(countdown.score, ..., warmup=countdown.WARMUP)`.
A gold with fewer than two numbers (such as a bare target written by an older generator) is
refused with a `ValueError`, which the pool counts as a crash, rather than scored.

Extraction (`extract_expression`): when the response has an `<answer>` tag, the answer is the
content of the last `<answer>...</answer>` block, which must sit at the end of the response
(nothing but whitespace and end-of-sequence strings such as `<|im_end|>` after `</answer>`; the
R1 template asks for this), or that block's last `\\boxed{...}` if it has one. Without an
`<answer>` tag, the answer is the content of the last `\\boxed{...}` (the boxed templates ask for
this). LaTeX operators `\\times`, `\\cdot`, `\\div` (and `×`, `÷`) are read as `*` and `/`, and
`\\left` / `\\right` are dropped. The expression is read by a small recursive-descent parser:

    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := INTEGER | "(" expr ")"

Only non-negative integer literals (digits), the four operators, parentheses and whitespace are
allowed; a unary minus or plus, decimals, `=`, `x`, `^` and anything else make the answer wrong
(so "(3 + 5) * 2 = 16" is wrong: the answer is the expression alone). Arithmetic is exact
(`fractions.Fraction`); a division by zero is wrong; non-integer intermediate values
(`(6 / 4) * 4`) are allowed unless `integer_intermediates=True`, as in TinyZero. The expression is
at most `max_chars` characters and nests parentheses at most `max_depth` deep, and there is no
power operator, so parsing and arithmetic are bounded whatever the model writes.

Scores: 1.0 when every given number is used exactly once (as the question says) and the value
equals the target, else 0.0 (`score`). `score_numbers` takes the numbers and target directly and
can give `format_score` (TinyZero's 0.1) to a well-placed answer whose expression is wrong. A bare
number equal to the target is wrong: it uses the target, not the given numbers.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

from rlvr_jax.rewards.format import EOS_STRINGS, strip_eos

MAX_CHARS = 200
MAX_DEPTH = 16
# Fewer would make the target itself a valid answer: no generated problem has fewer.
MIN_GOLD_NUMBERS = 2
_OPEN, _CLOSE = "<answer>", "</answer>"
# Expressions hold no braces, so the boxed content ends at the first "}"; linear on any input.
_BOXED_RE = re.compile(r"\\boxed\s*\{([^{}]*)\}")
_LATEX_OPS = (
    ("\\times", "*"),
    ("\\cdot", "*"),
    ("\\div", "/"),
    ("\u00d7", "*"),
    ("\u00f7", "/"),
    ("\\left", ""),
    ("\\right", ""),
)

# An item for `VerifierPool(score, ..., warmup=WARMUP)`. Countdown has no lazy imports or caches
# to warm; it exists so that a task builder treats every host verifier alike.
WARMUP = ("<answer>(3 + 5) * 2</answer>", "(3 + 5) * 2")


class ExpressionError(ValueError):
    """The expression is not a valid countdown expression; the message says why."""


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """The exact value of an expression and the integer literals it uses, in order."""

    value: Fraction
    numbers: tuple[int, ...]


class _Parser:
    """Recursive descent over a string; recursion depth is bounded by `max_depth`."""

    def __init__(self, text: str, max_depth: int, integer_intermediates: bool):
        self.text = text
        self.pos = 0
        self.max_depth = max_depth
        self.integer_intermediates = integer_intermediates
        self.numbers: list[int] = []

    def _skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\n\r":
            self.pos += 1

    def _peek(self) -> str:
        self._skip()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def parse(self) -> Fraction:
        value = self._expr(0)
        if self._peek():
            raise ExpressionError(
                f"unexpected {self.text[self.pos]!r} at column {self.pos} of {self.text!r}"
            )
        return value

    def _expr(self, depth: int) -> Fraction:
        value = self._term(depth)
        while self._peek() in ("+", "-"):
            op = self.text[self.pos]
            self.pos += 1
            rhs = self._term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def _term(self, depth: int) -> Fraction:
        value = self._factor(depth)
        while self._peek() in ("*", "/"):
            op = self.text[self.pos]
            self.pos += 1
            rhs = self._factor(depth)
            if op == "*":
                value = value * rhs
            else:
                if rhs == 0:
                    raise ExpressionError(f"division by zero in {self.text!r}")
                value = value / rhs
                if self.integer_intermediates and value.denominator != 1:
                    raise ExpressionError(f"non-integer intermediate {value} in {self.text!r}")
        return value

    def _factor(self, depth: int) -> Fraction:
        c = self._peek()
        if c == "(":
            if depth >= self.max_depth:
                raise ExpressionError(f"parentheses nest deeper than {self.max_depth}")
            self.pos += 1
            value = self._expr(depth + 1)
            if self._peek() != ")":
                raise ExpressionError(f"missing ')' at column {self.pos} of {self.text!r}")
            self.pos += 1
            return value
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in "0123456789":
            self.pos += 1
        if self.pos == start:
            found = repr(c) if c else "the end"
            raise ExpressionError(f"expected a number or '(' but found {found} in {self.text!r}")
        number = int(self.text[start : self.pos])
        self.numbers.append(number)
        return Fraction(number)


def evaluate(
    expression: str,
    *,
    max_chars: int = MAX_CHARS,
    max_depth: int = MAX_DEPTH,
    integer_intermediates: bool = False,
) -> Evaluation:
    """The exact value of a countdown expression, and the numbers it uses.

    Raises:
      ExpressionError: naming what is wrong (length, a character, nesting, division by zero).
    """
    if len(expression) > max_chars:
        raise ExpressionError(f"expression of {len(expression)} characters > max_chars={max_chars}")
    if not expression.strip():
        raise ExpressionError("empty expression")
    parser = _Parser(expression, max_depth, integer_intermediates)
    value = parser.parse()
    return Evaluation(value, tuple(parser.numbers))


def _last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` without braces inside, or None."""
    last = None
    for m in _BOXED_RE.finditer(text):
        last = m
    return None if last is None else last.group(1)


def _plain_operators(expression: str) -> str:
    for latex, op in _LATEX_OPS:
        expression = expression.replace(latex, op)
    return expression


def extract_expression(response: str, eos_strings: Sequence[str] = EOS_STRINGS) -> str | None:
    """The answer expression of a response (rules in the module docstring), or None.

    Args:
      response: the generated text.
      eos_strings: end-of-sequence strings allowed after `</answer>`.

    Returns:
      The expression with LaTeX operators made plain, or None when the response has no answer
      where the rules look for one.
    """
    response = strip_eos(response, eos_strings)
    if _OPEN in response:
        if not response.endswith(_CLOSE):
            return None
        end = len(response) - len(_CLOSE)
        start = response.rfind(_OPEN, 0, end)
        if start < 0:
            return None
        block = response[start + len(_OPEN) : end]
        boxed = _last_boxed(block) if "\\boxed" in block else None
        expression = block if boxed is None else boxed
    else:
        expression = _last_boxed(response)
        if expression is None:
            return None
    return _plain_operators(expression)


def parse_gold(gold: str) -> tuple[tuple[int, ...], Fraction]:
    """The given numbers (sorted) and the target that a gold solution expression stands for.

    Args:
      gold: a solution expression, such as "(3 + 5) * 2" (`Example.answer` of a countdown
        problem).

    Raises:
      ValueError: when `gold` is not a countdown expression over at least `MIN_GOLD_NUMBERS`
        numbers (a bare target, text, a record from another task), naming what is wrong.
    """
    try:
        result = evaluate(gold)
    except ExpressionError as e:
        raise ValueError(f"countdown gold {gold[:80]!r} is not a solution expression: {e}") from e
    if len(result.numbers) < MIN_GOLD_NUMBERS:
        raise ValueError(
            f"countdown gold {gold!r} uses {len(result.numbers)} number(s); a gold answer is a "
            f"solution expression over all given numbers (at least {MIN_GOLD_NUMBERS}), not the "
            "target"
        )
    return tuple(sorted(result.numbers)), result.value


def score_numbers(
    response: str,
    numbers: Sequence[int],
    target: int | Fraction,
    format_score: float = 0.0,
    *,
    max_chars: int = MAX_CHARS,
    max_depth: int = MAX_DEPTH,
    integer_intermediates: bool = False,
) -> float:
    """The countdown reward of one response against explicit numbers and target.

    Args:
      response: the generated text (special tokens removed).
      numbers: the given numbers; each must be used exactly once.
      target: the value to reach.
      format_score: credit for an extracted answer whose expression is wrong (TinyZero: 0.1).
      max_chars: longest accepted expression.
      max_depth: deepest accepted parenthesis nesting.
      integer_intermediates: every division must leave an integer.

    Returns:
      1.0, `format_score` or 0.0.
    """
    expression = extract_expression(response)
    if expression is None:
        return 0.0
    try:
        result = evaluate(
            expression,
            max_chars=max_chars,
            max_depth=max_depth,
            integer_intermediates=integer_intermediates,
        )
    except ExpressionError:
        return format_score
    if Counter(result.numbers) != Counter(int(n) for n in numbers):
        return format_score
    return 1.0 if result.value == target else format_score


def score(response: str, gold: str) -> float:
    """1.0 when `response` solves the countdown problem whose solution is `gold`, else 0.0.

    This is the function to give `pool.VerifierPool`: `VerifierPool(countdown.score, ...,
    warmup=countdown.WARMUP)` with items `(response, example.answer)`. The numbers and target
    come from `gold` (`parse_gold`); any correct expression scores, not only the gold one.

    Raises:
      ValueError: when `gold` is not a solution expression (see `parse_gold`).
    """
    numbers, target = parse_gold(gold)
    return score_numbers(response, numbers, target)
