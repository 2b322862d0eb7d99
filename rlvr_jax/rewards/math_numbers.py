"""Math answers that are plain numbers: exact parsing and the numeric rule.

Host code, cheap and total. `parse_number` reads a number string as an exact rational: integers
of any size, decimals, `a/b`, `\\frac{a}{b}`, mixed numbers (`2\\frac{1}{2}` is 5/2), scientific
notation (`1.5\\times10^{3}`, `1e3`), thousands separators (`1,000`, `1 000`), percentages and
repeating decimals (`0.\\overline{3}` is 1/3, `0.1\\overline{6}` is 1/6, `\\bar` too).

A number may carry a unit word after it (`10\\text{ cm}`, `18 dollars`, `5.4 \\text{ cents}`):
`strip_unit` drops a known unit (`UNIT_WORDS`, with `square`/`cubic` before it, `per`/`/` and a
second unit, `^2`/`^3` after) when what stays is a lone number, and nothing else: `12 is not
correct` stays as it is.

`numbers_close` is the rule every numeric comparison uses:

* two exact values are equal when they are the same rational; when one of them is an integer that
  is the only way (`123456789012.5` is not `123456789012`, `10^{15}+1` is not `10^{15}`);
* two non-integers (`1/3` against `0.333333333333`) are equal within the relative tolerance
  `REL_TOL` (1e-9), so a match to 6 decimals is not enough;
* a closed form that sympy evaluated (to 30 digits: `\\sqrt{2}`, `2\\pi`, `e^{9999}`) against an
  integer must agree to `INTEGER_TOL` (1e-25, within the precision of the evaluation), against
  anything else to `REL_TOL`.
"""

from __future__ import annotations

import dataclasses
import re
from fractions import Fraction

import sympy

REL_TOL = 1e-9
INTEGER_TOL = 1e-25  # a 30-digit evaluation of an exact integer is this close to it
MAX_PARSE_CHARS = 1_000  # longer normalized answers are not parsed as numbers or structures
_MAX_EXP10 = 400  # |k| in 1e{k} / \times 10^{k} parsed exactly


@dataclasses.dataclass(frozen=True)
class Number:
    """A parsed number: exact (`Fraction`) or a value sympy evaluated (a sympy number)."""

    value: Fraction | sympy.Expr
    percent: bool


_NUM = r"(?:\d+(?:\.\d*)?|\.\d+)"
_GROUPED_RE = re.compile(r"[+-]?\d{1,3}(?:([, ])\d{3})(?:\1\d{3})*(?:\.\d+)?%?")
_PLAIN_RE = re.compile(rf"({_NUM})(?:[eE]([+-]?\d+))?")
_SCI_RE = re.compile(rf"({_NUM})(?:\\times|\\cdot|\*|x)10\^(?:\{{([+-]?\d+)\}}|([+-]?\d+))")
_SLASH_RE = re.compile(rf"({_NUM})/({_NUM})")
_FRAC_RE = re.compile(rf"(\d+)?\\frac\{{([+-]?{_NUM})\}}\{{([+-]?{_NUM})\}}")
_REPEATING_RE = re.compile(r"(\d*)\.(\d*)\\(?:overline|bar)(?:\{(\d+)\}|(\d))")


def word_set(text: str) -> frozenset[str]:
    """The whitespace-separated words of a word list."""
    return frozenset(text.split())


UNIT_WORDS = word_set(
    """
    degrees degree cm mm km meters meter metres metre centimeters centimeter millimeters
    kilometers inches inch feet foot ft yards yard yd miles mile units unit dollars dollar cents
    cent seconds second sec minutes minute min hours hour hr hrs days day weeks week months month
    years year grams gram kg kilograms kilogram pounds pound lb lbs ounces ounce oz liters liter
    litres litre ml gallons gallon mph points point radians radian
    """
)
_UNIT_LETTERS = frozenset("msghl")  # single letters are units inside \\text only


def _unit_phrase(words: frozenset[str]) -> str:
    unit = "(?:" + "|".join(sorted(words, key=len, reverse=True)) + ")"
    return (
        rf"(?:(?:square|sq\.?|cubic)\s+)?{unit}(?:\s*(?:/|per)\s*{unit})?"
        r"(?:\^\{?[23]\}?|²|³)?\.?"
    )


_WORD_UNIT_RE = re.compile(rf"^(.*?\d\.?)\s+{_unit_phrase(UNIT_WORDS)}$", re.IGNORECASE)
_TEXT_UNIT_RE = re.compile(
    r"^(.*\d\.?)\s*\\(?:text|mbox|mathrm|textrm)\s*\{\s*"
    rf"{_unit_phrase(UNIT_WORDS | _UNIT_LETTERS)}\s*\}}(?:\^\{{?\d\}}?)?$",
    re.IGNORECASE,
)
_MAX_UNIT_CHARS = 200


def _decimal(text: str, exp10: str | None = None) -> Fraction | None:
    k = int(exp10) if exp10 else 0
    if abs(k) > _MAX_EXP10:
        return None
    return Fraction(text) * Fraction(10) ** k


def _repeating(m: re.Match) -> Fraction:
    """`a.b\\overline{c}`: a, then b, then c repeated forever."""
    whole, head, cycle = m.group(1) or "0", m.group(2), m.group(3) or m.group(4)
    shift = Fraction(10) ** len(head)
    value = Fraction(int(whole)) + Fraction(int(head or "0")) / shift
    return value + Fraction(int(cycle), 10 ** len(cycle) - 1) / shift


def _unsigned(s: str) -> Fraction | None:
    if m := _PLAIN_RE.fullmatch(s):
        return _decimal(m.group(1), m.group(2))
    if m := _SCI_RE.fullmatch(s):
        return _decimal(m.group(1), m.group(2) or m.group(3))
    if m := _SLASH_RE.fullmatch(s):
        num, den = Fraction(m.group(1)), Fraction(m.group(2))
        return None if den == 0 else num / den
    if m := _REPEATING_RE.fullmatch(s):
        return _repeating(m)
    if m := _FRAC_RE.fullmatch(s):
        num, den = Fraction(m.group(2)), Fraction(m.group(3))
        if den == 0:
            return None
        value = num / den
        if m.group(1) is not None:  # mixed number: 2\frac{1}{2} is 5/2
            return None if value < 0 else int(m.group(1)) + value
        return value
    return None


def parse_number(text: str) -> Number | None:
    """An exact rational for a plain number string, or None when it is not one."""
    s = text.strip()
    if not s or len(s) > MAX_PARSE_CHARS:
        return None
    if _GROUPED_RE.fullmatch(s):
        s = s.replace(",", "").replace(" ", "")
    elif re.search(r"\d\s+\d", s):
        return None
    s = "".join(s.split())
    percent = s.endswith("%")
    if percent:
        s = s[:-1]
    sign = 1
    if s[:1] in "+-":
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    value = _unsigned(s)
    return None if value is None else Number(sign * value, percent)


def strip_unit(s: str) -> str:
    """`s` without a unit after a lone number (`10\\text{ cm}` is 10), else `s` unchanged."""
    if len(s) > _MAX_UNIT_CHARS:
        return s
    for pattern in (_TEXT_UNIT_RE, _WORD_UNIT_RE):
        unit = pattern.match(s)
        if unit and parse_number(unit.group(1)) is not None:
            return unit.group(1).strip()
    return s


def _is_integer(x: object) -> bool:
    if isinstance(x, Fraction):
        return x.denominator == 1
    return isinstance(x, int | sympy.Integer)


def numbers_close(
    a: Fraction | complex | float | sympy.Expr, b: Fraction | complex | float | sympy.Expr
) -> bool:
    """The numeric rule of the module docstring: exact against an integer, else relative
    tolerance `REL_TOL`. Takes sympy numbers too (values out of the range of a float)."""
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        if a == b:
            return True
        if a.denominator == 1 or b.denominator == 1:
            return False
        return abs(a - b) <= Fraction(REL_TOL) * max(abs(a), abs(b))
    tol = INTEGER_TOL if _is_integer(a) or _is_integer(b) else REL_TOL
    # A Fraction cannot compare with a sympy Float, nor a complex with a Fraction: sympy can.
    sa, sb = sympy.sympify(a), sympy.sympify(b)
    if sa == sb:
        return True
    return bool(abs(sa - sb) <= tol * max(abs(sa), abs(sb)))


def numbers_equal(pred: Number, gold: Number) -> bool:
    """`numbers_close`, where a percentage also equals its number / 100 (`12.5\\%` is 0.125)."""
    if numbers_close(pred.value, gold.value):
        return True
    if pred.percent and not gold.percent:
        return numbers_close(pred.value / 100, gold.value)
    if gold.percent and not pred.percent:
        return numbers_close(pred.value, gold.value / 100)
    return False
