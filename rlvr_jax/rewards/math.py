"""Math answers: the final answer of a response, and whether it equals the gold answer.

Host code. `is_equivalent` may hand hard cases to sympy (through `math_verify`), which can run for
a very long time on hostile input, so model output is verified inside `pool.VerifierPool` (hard
per-item deadline, process isolation); call these functions in-process only on trusted text.

Extraction (`extract_answer`): the answer the response commits to, by the rules of
`math_extract` (the region after the last `</think>`, its `<answer>` blocks, boxes, `####` lines
and closing sentences "The final answer is 42."); several final answers that are not all
equivalent are no answer (see `math_extract` for the rule).

Equivalence (`is_equivalent`), in order:

1. Both answers are normalized: math delimiters, `\\left`/`\\right`, `\\text{}` wrappers, a known
   unit after a lone number (`10\\text{ cm}`, `18 dollars`; `math_numbers.UNIT_WORDS`: other
   words stay, so `12 is not correct` is not 12), degree signs, `\\dfrac`/`\\tfrac`, a leading
   `x =` or `x \\in`, trailing punctuation (`42.` is 42) and currency signs are dropped; equal
   strings are equivalent.
2. Plain numbers are compared exactly as rationals (`math_numbers`): integers of any size,
   decimals, `a/b`, `\\frac{a}{b}`, mixed numbers, scientific notation, thousands separators,
   repeating decimals (`0.\\overline{3}` is 1/3). Against an integer only the same integer is
   equal (`123456789012.5` is not `123456789012`); two non-integers are equal within the relative
   tolerance `REL_TOL` (1e-9): `1/2 == 0.5`, `1/3 != 0.333333`. A percentage equals its number
   or its number / 100: `12.5\\% == 12.5 == 0.125`.
3. Collections (`math_forms`): tuples and points element by element with the same brackets;
   matrices and vectors (`pmatrix`, `bmatrix`, ...; a vector equals a tuple of its elements)
   element by element; sets, bare comma lists and unions as multisets; and, when the gold is an
   interval expression, intervals as sets of reals in every notation (`[2, 5)`,
   `2 \\le x < 5`, `x \\in [2, 5)`, unions in any order). `(a, b)` is compared as the gold
   reads it: a gold `(a, b)` is a point, a gold with an interval marker an interval expression.
4. Single words compare case-insensitively (`\\text{Yes}` == `yes`); `(B)` == `B`.
5. Anything else is parsed to sympy by `math_verify`, as LaTeX only (its plain-text extraction
   would read `7²` or `7 @@@` as 7). Two closed-form numbers (`\\sqrt{2}/2`, `\\pi`,
   `e^{i\\pi}`: a lone `i` is the imaginary unit) are evaluated to 30 digits and compared with the
   rule of step 2, an integer within `math_numbers.INTEGER_TOL` (values beyond the range of a
   float, `e^{9999}`, stay exact enough to compare). A division by zero is never equivalent.
   Expressions that differ at one of a few fixed positive points are not equivalent; the others
   go to `math_verify.verify` (symbolic simplification): `(x+1)^2 == x^2+2x+1`, and a number
   equals an expression of variables that simplifies to it (`\\sin^2 x + \\cos^2 x == 1`).
6. An answer that breaks a rule of `sympy_cost_reason` never reaches sympy: it is equivalent only
   when the normalized strings are equal. The rules bound what sympy would build (towers such as
   `9^{9^{9^9}}` or `((2^2)^2)^2`, huge exponents, factorials, binomials and Gamma arguments,
   expansions, degrees, functions of variables, sums, integrals, limits and determinants); no
   contest answer comes near them.
"""

from __future__ import annotations

import logging
import re
from fractions import Fraction

# Imported at module level, so that a pool's fork server preloads them for every worker.
import math_verify
import sympy

from rlvr_jax.rewards import math_forms
from rlvr_jax.rewards.math_extract import committed_answer, final_answers, last_boxed
from rlvr_jax.rewards.math_forms import MAX_ELEMENTS, MAX_STRUCT_DEPTH
from rlvr_jax.rewards.math_guard import too_costly_for_sympy
from rlvr_jax.rewards.math_numbers import (
    INTEGER_TOL,
    MAX_PARSE_CHARS,
    REL_TOL,
    Number,
    numbers_close,
    numbers_equal,
    parse_number,
    strip_unit,
)

__all__ = [
    "INTEGER_TOL",
    "MAX_COMPARE_CHARS",
    "MAX_ELEMENTS",
    "MAX_PARSE_CHARS",
    "MAX_STRUCT_DEPTH",
    "REL_TOL",
    "WARMUP",
    "extract_answer",
    "final_answers",
    "is_equivalent",
    "last_boxed",
    "normalize",
    "numbers_close",
    "score",
    "too_costly_for_sympy",
]

MAX_COMPARE_CHARS = 10_000  # longer answers are compared as stripped strings only
_SYMPY_DIGITS = 30
_PROBE_POINTS = 3
_PROBE_DIGITS = 15
_PROBE_TOL = 1e-8
_PROBE_FLOOR = 1e-6  # values below it compare as equal: a probe proves nothing there

# Disabling math_verify's signal-based timeouts is deliberate (the pool enforces a hard
# deadline, and signals fail off the main thread); its one-off warning about it is noise.
_MV_WARNING = "Timeout is disabled"


class _DropTimeoutWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _MV_WARNING not in str(record.msg)


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutWarning())


# ----------------------------------------------------------------------------------------------
# Normalization

_DELIMS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_WRAPPERS_RE = re.compile(
    r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|mbox|operatorname|displaystyle)"
    r"\s*\{([^{}]*)\}"
)
_SIZING_RE = re.compile(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|biggl|biggr|big|Big|bigg|Bigg)\b")
# A row break `\\` of a matrix is kept; `\ ` and the other spacing commands are a space.
_SPACES_RE = re.compile(
    r"\\\\|\\[,;:! ]|~|[\u00a0\u2009\u202f\u2002\u2003\u2004\u2005\u2006\u2007]"
)
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|°|\\degree")
_PREFIX_RE = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?!.*=)")
_MEMBER_RE = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*\\in(?![A-Za-z])\s*")
_BRACED_COMMA_RE = re.compile(r"(?<=\d)\{,\}(?=\d{3})")
_THIN_COMMA_RE = re.compile(r"(?<=\d),\\!\s*(?=\d{3})")  # 11,\!111 is 11,111
_PERCENT_WORD_RE = re.compile(r"(?<=\d)\s*percent$", re.IGNORECASE)
_CHOICE_RE = re.compile(r"^\(?([A-Ea-e])\)$|^\(([A-Ea-e])\)?$")
_FRAC_SHORT_RE = re.compile(r"\\frac(\d)(\d)")
_FRAC_HALF_RE = re.compile(r"\\frac\s*(?:(\d)\s*\{(\w+)\}|\{(\w+)\}\s*(\d))")
_SQRT_SHORT_RE = re.compile(r"\\sqrt(\d+)")
_WORD_RE = re.compile(r"^[A-Za-z][A-Za-z ]*$")


def _strip_delims(s: str) -> str:
    changed = True
    while changed:
        changed = False
        s = s.strip()
        for left, right in _DELIMS:
            if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s = s[len(left) : -len(right)]
                changed = True
                break
    return s


def _space(m: re.Match) -> str:
    return m.group() if m.group() == "\\\\" else " "


def _frac_braces(m: re.Match) -> str:
    if m.group(1) is not None:  # \frac5{9}
        return f"\\frac{{{m.group(1)}}}{{{m.group(2)}}}"
    return f"\\frac{{{m.group(3)}}}{{{m.group(4)}}}"  # \frac{270}7


def normalize(answer: str) -> str:
    """A canonical spelling of an answer string (see the module docstring); cheap and total."""
    s = _strip_delims(answer)
    s = s.replace("\u2212", "-").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("\\dbinom", "\\binom").replace("\\infty", "\\infty ").replace("∞", "\\infty ")
    s = s.replace("≤", "\\le ").replace("≥", "\\ge ")
    s = _SIZING_RE.sub("", s).replace("\\langle", "(").replace("\\rangle", ")")
    s = _DEGREE_RE.sub("", s)
    s = s.replace("\\%", "%").replace("\\$", "").replace("$", "")
    s = _THIN_COMMA_RE.sub(",", _BRACED_COMMA_RE.sub("", s))
    s = _SPACES_RE.sub(_space, s)
    s = _FRAC_SHORT_RE.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_HALF_RE.sub(_frac_braces, s)
    s = strip_unit(s.strip())
    for _ in range(4):
        unwrapped = _WRAPPERS_RE.sub(r"\1", s)
        if unwrapped == s:
            break
        s = unwrapped
    s = _SQRT_SHORT_RE.sub(r"\\sqrt{\1}", s)
    s = " ".join(s.split())
    s = s.rstrip(".;:").strip()
    s = _PREFIX_RE.sub("", s)
    s = _MEMBER_RE.sub("", s)
    s = _PERCENT_WORD_RE.sub("%", strip_unit(s))
    s = s.rstrip(".").strip()
    if s.startswith("+") and len(s) > 1:
        s = s[1:]
    choice = _CHOICE_RE.match(s)
    if choice:
        s = (choice.group(1) or choice.group(2)).upper()
    return s


# ----------------------------------------------------------------------------------------------
# Sympy


def _sympy_parse(text: str) -> list:
    # LaTeX only: math_verify's plain-expression extraction takes the first number it finds in
    # any text, so that `7²`, `7 @@@` or `7 \\ 8` would all read as 7.
    configs = [math_verify.LatexExtractionConfig()]
    return math_verify.parse(f"${text.replace('**', '^')}$", configs, parsing_timeout=None)


def _sympy_number(parsed: list) -> Number | None:
    """The value of a closed-form number (`\\sqrt{2}/2`, `\\pi`, `e^{i\\pi}`), None for anything
    else: a rational exactly, anything else evaluated to `_SYMPY_DIGITS` digits (a sympy number,
    so that values beyond the range of a float, `e^{9999}`, do not read as inf or 0)."""
    expr = _first_sympy(parsed)
    if not isinstance(expr, sympy.Expr):
        return None
    if expr.free_symbols and all(str(x) == "i" for x in expr.free_symbols):
        expr = expr.subs({x: sympy.I for x in expr.free_symbols})  # `i` in a number is imaginary
    if not expr.is_number:
        return None
    expr = expr.doit()
    if expr.is_Rational:
        return Number(Fraction(int(expr.p), int(expr.q)), False)
    value = sympy.N(expr, _SYMPY_DIGITS)
    if not value.is_number or value.has(sympy.nan, sympy.zoo, sympy.oo, -sympy.oo):
        return None
    return Number(value, False)


def _as_parsed(number: Number) -> list:
    value = number.value
    if isinstance(value, Fraction):
        value = sympy.Rational(value.numerator, value.denominator)
    return [value]


def _constant_equal(parsed_pred: list, parsed_gold: list, number_is_pred: bool) -> bool:
    """Whether an expression of variables is the number on the other side: only when it takes
    that value at every probe point and `math_verify` simplifies their difference away
    (`\\sin^2 x + \\cos^2 x` is 1)."""
    pred, gold = _first_sympy(parsed_pred), _first_sympy(parsed_gold)
    if not isinstance(pred, sympy.Expr) or not isinstance(gold, sympy.Expr):
        return False
    variable = gold if number_is_pred else pred
    if not variable.free_symbols or _divides_by_zero(variable) or _differ_at_a_point(pred, gold):
        return False
    return bool(
        math_verify.verify(parsed_gold, parsed_pred, float_rounding=10, timeout_seconds=None)
    )


def _sympy_equal(pred: str, gold: str, pred_num: Number | None, gold_num: Number | None) -> bool:
    """Sympy's verdict; a side already read as a plain number keeps its exact value."""
    parsed_pred = None if pred_num is not None else _sympy_parse(pred)
    parsed_gold = None if gold_num is not None else _sympy_parse(gold)
    pn = pred_num if pred_num is not None else _sympy_number(parsed_pred)
    gn = gold_num if gold_num is not None else _sympy_number(parsed_gold)
    if pn is not None and gn is not None:
        return numbers_equal(pn, gn)
    if pn is not None or gn is not None:  # a number against something else
        if (pn or gn).percent:
            return False
        if pn is not None:
            return _constant_equal(parsed_pred or _as_parsed(pn), parsed_gold, True)
        return _constant_equal(parsed_pred, parsed_gold or _as_parsed(gn), False)
    exprs = [_first_sympy(parsed_pred), _first_sympy(parsed_gold)]
    if any(e is not None and _divides_by_zero(e) for e in exprs):
        return False  # never an answer, and the probe below cannot evaluate it
    if _differ_at_a_point(*(e if isinstance(e, sympy.Expr) else None for e in exprs)):
        return False
    return bool(
        math_verify.verify(parsed_gold, parsed_pred, float_rounding=10, timeout_seconds=None)
    )


def _divides_by_zero(expr: sympy.Basic) -> bool:
    if expr.has(sympy.zoo, sympy.nan):
        return True
    return any(p.base.is_zero and p.exp.is_negative for p in expr.atoms(sympy.Pow))


def _first_sympy(parsed: list) -> sympy.Basic | None:
    return next((e for e in parsed if isinstance(e, sympy.Basic)), None)


def _value_at(expr: sympy.Expr, point: dict) -> sympy.Expr | None:
    # A sympy number, not a float: values beyond 1e308 (`(x+218)!`) still compare.
    try:
        value = sympy.N(expr, _PROBE_DIGITS, subs=point)
    except Exception:  # sympy raises anything on odd input
        return None
    if not value.is_number or value.has(sympy.nan, sympy.zoo, sympy.oo, -sympy.oo):
        return None
    return value


def _differ_at_a_point(a: sympy.Expr | None, b: sympy.Expr | None) -> bool:
    """Whether `a` and `b` take different values at one of a few fixed positive points.

    Proves in milliseconds what `simplify(a - b)` (math_verify) would take seconds to fail to
    prove, or would not end on; an undefined or tiny value proves nothing. Positive points keep
    it sound for identities that hold for real variables (such as `\\sqrt{x^2} = |x|`).
    """
    if a is None or b is None:
        return False
    symbols = sorted(a.free_symbols | b.free_symbols, key=str)
    if not symbols:
        return False
    for k in range(_PROBE_POINTS):
        point = {s: sympy.Rational(17 + 7 * j + 11 * k, 13 + 5 * j) for j, s in enumerate(symbols)}
        va, vb = _value_at(a, point), _value_at(b, point)
        if va is None or vb is None:
            continue
        try:
            scale = max(abs(va), abs(vb), sympy.Float(_PROBE_FLOOR))
            if bool(abs(va - vb) > _PROBE_TOL * scale):
                return True
        except TypeError:  # a value sympy cannot order
            continue
    return False


# ----------------------------------------------------------------------------------------------
# Equivalence


def _equivalent(pred: str, gold: str, depth: int) -> bool:
    p, g = normalize(pred), normalize(gold)
    if not p or not g:
        return False
    if p.replace(" ", "") == g.replace(" ", ""):
        return True
    if len(p) > MAX_PARSE_CHARS or len(g) > MAX_PARSE_CHARS:
        return False
    pn, gn = parse_number(p), parse_number(g)
    if pn is not None and gn is not None:
        return numbers_equal(pn, gn)
    if depth < MAX_STRUCT_DEPTH:
        verdict = math_forms.compare(p, g, pn is not None, gn is not None, depth, _equivalent)
        if verdict is not None:
            return verdict
    if _WORD_RE.match(p) and _WORD_RE.match(g):
        return p.lower() == g.lower()
    if too_costly_for_sympy(p) or too_costly_for_sympy(g):
        return False
    try:
        return _sympy_equal(p, g, pn, gn)
    except Exception:  # sympy and the parser raise anything, RecursionError included
        return False


def is_equivalent(pred: str | None, gold: str | None) -> bool:
    """Whether the answer `pred` is mathematically the answer `gold` (rules: module docstring).

    Both are answer strings, as `extract_answer` returns them; None is never equivalent. May call
    sympy: for untrusted `pred`, run it in a `pool.VerifierPool`.
    """
    if pred is None or gold is None:
        return False
    for name, value in (("pred", pred), ("gold", gold)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str or None, got {type(value).__name__}")
    if len(pred) > MAX_COMPARE_CHARS or len(gold) > MAX_COMPARE_CHARS:
        return pred.strip() == gold.strip()
    return _equivalent(pred, gold, 0)


# An item for `VerifierPool(..., warmup=WARMUP)`: it runs sympy's lazy imports and caches in each
# worker before the worker takes items, so that they are not charged to an item's deadline.
WARMUP = ("\\boxed{(x+1)^2}, that is \\boxed{(1+x)^2}", "x^2+2x+1")


def extract_answer(text: str) -> str | None:
    """The final answer `text` commits to (a response or a reference solution), or None when it
    states none or several that are not all equivalent (`math_extract`'s rules). Linear in
    `len(text)` but for the equivalence checks between several answers (at most
    `math_extract.MAX_ANSWERS`)."""
    return committed_answer(text, is_equivalent)


def score(response: str, gold: str) -> float:
    """1.0 when the final answer of `response` is equivalent to the gold answer, else 0.0.

    `gold` is an answer (`extract_answer` of a reference solution), not a whole solution. This is
    the function to give `pool.VerifierPool`: `VerifierPool(math.score, ...)` with items
    `(response, gold)`.
    """
    return float(is_equivalent(extract_answer(response), gold))
