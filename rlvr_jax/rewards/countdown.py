"""Countdown (TinyZero rules): combine the given numbers with + - * / into the target.

Host code, no `eval`. The answer is the content of the last `<answer>...</answer>` block, which
must sit on the last line of the response (nothing but whitespace and end-of-sequence strings
such as `<|im_end|>` after `</answer>`). The
expression is read by a small recursive-descent parser:

    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := INTEGER | "(" expr ")"

Only non-negative integer literals (digits), the four operators, parentheses and whitespace are
allowed; a unary minus or plus, decimals, `=`, `x`, `^` and anything else make the answer wrong.
Arithmetic is exact (`fractions.Fraction`); a division by zero is wrong; non-integer
intermediate values (`(6 / 4) * 4`) are allowed unless `integer_intermediates=True`, as in
TinyZero. The expression is at most `max_chars` characters and nests parentheses at most
`max_depth` deep, so parsing is bounded whatever the model writes.

Scores: 1.0 when every given number is used exactly once and the value equals the target;
`format_score` when a well-placed answer block exists but the expression is wrong in any way; 0.0
without one.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

from rlvr_jax.rewards.format import EOS_STRINGS, strip_eos

MAX_CHARS = 200
MAX_DEPTH = 16
_OPEN, _CLOSE = "<answer>", "</answer>"


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


def extract_expression(response: str, eos_strings: Sequence[str] = EOS_STRINGS) -> str | None:
    """The content of the last `<answer>` block, or None when there is none or text follows it."""
    response = strip_eos(response, eos_strings)
    if not response.endswith(_CLOSE):
        return None
    end = len(response) - len(_CLOSE)
    start = response.rfind(_OPEN, 0, end)
    return None if start < 0 else response[start + len(_OPEN) : end]


def score(
    response: str,
    numbers: Sequence[int],
    target: int,
    format_score: float = 0.1,
    *,
    max_chars: int = MAX_CHARS,
    max_depth: int = MAX_DEPTH,
    integer_intermediates: bool = False,
) -> float:
    """The countdown reward of one response (rules in the module docstring).

    Args:
      response: the generated text (special tokens removed).
      numbers: the given numbers; each must be used exactly once.
      target: the value to reach.
      format_score: credit for a well-placed answer block whose expression is wrong.
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
