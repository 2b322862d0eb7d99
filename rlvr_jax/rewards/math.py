"""Math answers: extract the final answer of a response, decide whether it equals the gold answer.

Host code. `is_equivalent` may hand hard cases to sympy (through `math_verify`), which can run for
a very long time on hostile input, so model output is verified inside `pool.VerifierPool` (hard
per-item deadline, process isolation); call these functions in-process only on trusted text.

Extraction (`extract_answer`), first match wins:

1. the last `<answer>...</answer>` block after the last `</think>` (the whole text when there is
   no `</think>`); inside it, its last `\\boxed{}` if it has one, else the whole block;
2. the last `\\boxed{...}` / `\\fbox{...}` (balanced braces; `\\boxed 5` too) after `</think>`;
3. the rest of the line after the last GSM8K marker `####` after `</think>`;
4. steps 1-3 again over the whole text, thinking included.

Equivalence (`is_equivalent`), in order:

1. Both answers are normalized: math delimiters, `\\left`/`\\right`, `\\text{}` wrappers, unit words
   after a number, degree signs, `\\dfrac`/`\\tfrac`, a leading `x =`, trailing punctuation
   (`42.` is 42) and currency signs are dropped; equal strings are equivalent.
2. Plain numbers are compared exactly as rationals. Integers, decimals, `a/b`, `\\frac{a}{b}`,
   mixed numbers (`2\\frac{1}{2}` is 5/2), scientific notation, and thousands separators (`1,000`,
   `1\\,000`, `1{,}000`, `1 000`, thin spaces) are understood. The rule: two integers must be
   equal exactly; otherwise the relative difference must be at most `REL_TOL` (1e-9). So
   `1/2 == 0.5`, but `1/3 != 0.333333` and `3.1415926 != 3.14159265` (a match to 6 decimals is not
   enough). A percentage equals its number or its number / 100: `12.5\\% == 12.5 == 0.125`.
3. Tuples, points and intervals are compared element by element with the same brackets
   (`[1, 2)` is not `(1, 2)`); sets `\\{...\\}`, bare comma lists (`2, -5`) and unions (`\\cup`)
   are compared as multisets.
4. Single words compare case-insensitively (`\\text{Yes}` == `yes`); `(B)` == `B`.
5. Anything else is parsed to sympy by `math_verify`, as LaTeX only (its plain-text extraction
   would read `7²` or `7 @@@` as 7). Two closed-form numbers (`\\sqrt{2}/2`, `\\pi`) are
   evaluated to 30 digits and compared with the rule of step 2 (values beyond the range of a
   float, `e^{9999}`, stay exact enough to compare). A division by zero is never equivalent.
   Expressions with variables that differ at one of a few fixed positive points are not
   equivalent; the others go to `math_verify.verify` (symbolic simplification).
6. An answer that breaks a rule of `sympy_cost_reason` never reaches sympy: it is equivalent only
   when the normalized strings are equal. The rules bound what sympy would build (towers such as
   `9^{9^{9^9}}` or `((2^2)^2)^2`, huge exponents, factorials, binomials and Gamma arguments,
   expansions, degrees, functions of variables, sums, integrals, limits and determinants); no
   contest answer comes near them.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from fractions import Fraction

# Imported at module level, so that a pool's fork server preloads them for every worker.
import math_verify
import sympy

from rlvr_jax.rewards.math_guard import (
    _CLOSE,
    _OPEN,
    _scan_top,
    too_costly_for_sympy,
)

REL_TOL = 1e-9
MAX_COMPARE_CHARS = 10_000  # longer answers are compared as stripped strings only
MAX_PARSE_CHARS = 1_000  # longer normalized answers are not parsed as numbers or structures
MAX_ELEMENTS = 64  # tuples / sets with more elements are compared as strings
MAX_STRUCT_DEPTH = 6
_MAX_EXP10 = 400  # |k| in 1e{k} / \times 10^{k} parsed exactly
_SYMPY_DIGITS = 30
_PROBE_POINTS = 3
_PROBE_DIGITS = 15
_PROBE_TOL = 1e-8
_PROBE_FLOOR = 1e-6  # values below it compare as equal: a probe proves nothing there

_THINK_CLOSE = "</think>"
_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOXED_BARE_RE = re.compile(r"\\boxed\s+([^\s${}]+)")

# Disabling math_verify's signal-based timeouts is deliberate (the pool enforces a hard
# deadline, and signals fail off the main thread); its one-off warning about it is noise.
_MV_WARNING = "Timeout is disabled"


class _DropTimeoutWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _MV_WARNING not in str(record.msg)


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutWarning())


# ----------------------------------------------------------------------------------------------
# Extraction


def _match_braces(text: str) -> dict[int, int]:
    """Positions of `{` mapped to their matching `}`, in one pass; escaped `\\{` `\\}` are text."""
    stack: list[int] = []
    match: dict[int, int] = {}
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] in "{}":
            i += 2
            continue
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            match[stack.pop()] = i
        i += 1
    return match


def last_boxed(text: str) -> str | None:
    """The content of the last complete `\\boxed{...}` or `\\fbox{...}` (or `\\boxed x`).

    Linear in the length of `text`, whatever its nesting, so it is safe on hostile input.
    """
    starts = [m.end() - 1 for m in _BOXED_RE.finditer(text)]
    bare = list(_BOXED_BARE_RE.finditer(text))
    braced = None
    if starts:
        match = _match_braces(text)
        for open_pos in reversed(starts):
            close = match.get(open_pos)
            if close is not None:
                braced = (open_pos, text[open_pos + 1 : close])
                break
    if bare and (braced is None or bare[-1].start() > braced[0]):
        return bare[-1].group(1)
    return None if braced is None else braced[1]


def _last_answer_block(region: str) -> str | None:
    """The last complete `<answer>...</answer>` block; rfind keeps it linear on hostile text."""
    end = region.rfind(_ANSWER_CLOSE)
    if end < 0:
        return None
    start = region.rfind(_ANSWER_OPEN, 0, end)
    return None if start < 0 else region[start + len(_ANSWER_OPEN) : end]


def _answer_in(region: str) -> str | None:
    block = _last_answer_block(region)
    if block is not None:
        boxed = last_boxed(block)
        return (boxed if boxed is not None else block).strip()
    boxed = last_boxed(region)
    if boxed is not None:
        return boxed.strip()
    marker = region.rfind("####")
    if marker >= 0:
        line = region[marker + 4 :].lstrip(" \t").split("\n", 1)[0].strip()
        return line or None
    return None


def extract_answer(text: str) -> str | None:
    """The final answer of a response or of a reference solution, or None when it has none.

    See the module docstring for the order of the rules. Linear time in `len(text)`.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    close = text.rfind(_THINK_CLOSE)
    if close >= 0:
        found = _answer_in(text[close + len(_THINK_CLOSE) :])
        if found:
            return found
    found = _answer_in(text)
    return found or None


# ----------------------------------------------------------------------------------------------
# Normalization

_DELIMS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_WRAPPERS_RE = re.compile(
    r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|mbox|operatorname|displaystyle)"
    r"\s*\{([^{}]*)\}"
)
_SIZING_RE = re.compile(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|biggl|biggr|big|Big|bigg|Bigg)\b")
_SPACES_RE = re.compile(r"\\[,;:! ]|~|[\u00a0\u2009\u202f\u2002\u2003\u2004\u2005\u2006\u2007]")
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|°|\\degree")
_PREFIX_RE = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?!.*=)")
_BRACED_COMMA_RE = re.compile(r"(?<=\d)\{,\}(?=\d{3})")
# A number followed by unit words: "10\text{ cm}", "10 inches" (two letters or more: "2x" stays).
_UNIT_TEXT_RE = re.compile(
    r"^(.*\d\.?)\s*\\(?:text|mbox|mathrm|textrm)\s*\{\s*[A-Za-z][A-Za-z .]*\}(?:\^\{?\d\}?)?$"
)
_UNIT_WORD_RE = re.compile(r"^(.*?\d\.?)\s+[A-Za-z]{2,}[A-Za-z .]*$")
_MAX_UNIT_CHARS = 200
_CHOICE_RE = re.compile(r"^\(?([A-Ea-e])\)$|^\(([A-Ea-e])\)?$")
_FRAC_SHORT_RE = re.compile(r"\\frac(\d)(\d)")
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


def _strip_unit(pattern: re.Pattern, s: str) -> str:
    if len(s) > _MAX_UNIT_CHARS:
        return s
    unit = pattern.match(s)
    if unit and _parse_number(unit.group(1)) is not None:
        return unit.group(1)
    return s


def normalize(answer: str) -> str:
    """A canonical spelling of an answer string (see the module docstring); cheap and total."""
    s = _strip_delims(answer)
    s = s.replace("\u2212", "-").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("\\dbinom", "\\binom").replace("\\infty", "\\infty ").replace("∞", "\\infty ")
    s = _SIZING_RE.sub("", s).replace("\\langle", "(").replace("\\rangle", ")")
    s = _DEGREE_RE.sub("", s)
    s = s.replace("\\%", "%").replace("\\$", "").replace("$", "")
    s = _BRACED_COMMA_RE.sub("", s)
    s = _SPACES_RE.sub(" ", s)
    s = _strip_unit(_UNIT_TEXT_RE, s.strip())
    for _ in range(4):
        unwrapped = _WRAPPERS_RE.sub(r"\1", s)
        if unwrapped == s:
            break
        s = unwrapped
    s = _FRAC_SHORT_RE.sub(r"\\frac{\1}{\2}", s)
    s = _SQRT_SHORT_RE.sub(r"\\sqrt{\1}", s)
    s = " ".join(s.split())
    s = s.rstrip(".;:").strip()
    s = _PREFIX_RE.sub("", s)
    s = _strip_unit(_UNIT_WORD_RE, s)
    s = s.rstrip(".").strip()
    if s.startswith("+") and len(s) > 1:
        s = s[1:]
    choice = _CHOICE_RE.match(s)
    if choice:
        s = (choice.group(1) or choice.group(2)).upper()
    return s


# ----------------------------------------------------------------------------------------------
# Numbers


@dataclasses.dataclass(frozen=True)
class _Number:
    value: Fraction | complex | sympy.Expr  # complex or sympy: values sympy evaluated
    percent: bool


_NUM = r"(?:\d+(?:\.\d*)?|\.\d+)"
_GROUPED_RE = re.compile(r"[+-]?\d{1,3}(?:([, ])\d{3})(?:\1\d{3})*(?:\.\d+)?%?")
_PLAIN_RE = re.compile(rf"({_NUM})(?:[eE]([+-]?\d+))?")
_SCI_RE = re.compile(rf"({_NUM})(?:\\times|\\cdot|\*|x)10\^(?:\{{([+-]?\d+)\}}|([+-]?\d+))")
_SLASH_RE = re.compile(rf"({_NUM})/({_NUM})")
_FRAC_RE = re.compile(rf"(\d+)?\\frac\{{([+-]?{_NUM})\}}\{{([+-]?{_NUM})\}}")


def _decimal(text: str, exp10: str | None = None) -> Fraction | None:
    k = int(exp10) if exp10 else 0
    if abs(k) > _MAX_EXP10:
        return None
    return Fraction(text) * Fraction(10) ** k


def _parse_number(text: str) -> _Number | None:
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
    value = None
    if m := _PLAIN_RE.fullmatch(s):
        value = _decimal(m.group(1), m.group(2))
    elif m := _SCI_RE.fullmatch(s):
        value = _decimal(m.group(1), m.group(2) or m.group(3))
    elif m := _SLASH_RE.fullmatch(s):
        num, den = Fraction(m.group(1)), Fraction(m.group(2))
        value = None if den == 0 else num / den
    elif m := _FRAC_RE.fullmatch(s):
        num, den = Fraction(m.group(2)), Fraction(m.group(3))
        if den != 0:
            value = num / den
            if m.group(1) is not None:  # mixed number: 2\frac{1}{2} is 5/2
                if value < 0:
                    return None
                value = int(m.group(1)) + value
    if value is None:
        return None
    return _Number(sign * value, percent)


def numbers_close(a: Fraction | complex | float, b: Fraction | complex | float) -> bool:
    """The numeric rule: integers exactly, anything else within relative tolerance `REL_TOL`.

    Also takes sympy numbers (values out of the range of a float).
    """
    if isinstance(a, sympy.Basic) or isinstance(b, sympy.Basic):
        a, b = sympy.sympify(a), sympy.sympify(b)  # a Fraction cannot compare with a sympy Float
    if a == b:
        return True
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        if a.denominator == 1 and b.denominator == 1:
            return False
        return abs(a - b) <= Fraction(REL_TOL) * max(abs(a), abs(b))
    return bool(abs(a - b) <= REL_TOL * max(abs(a), abs(b)))


def _numbers_equal(pred: _Number, gold: _Number) -> bool:
    if numbers_close(pred.value, gold.value):
        return True
    if pred.percent and not gold.percent:
        return numbers_close(pred.value / 100, gold.value)
    if gold.percent and not pred.percent:
        return numbers_close(pred.value, gold.value / 100)
    return False


# ----------------------------------------------------------------------------------------------
# Structures: tuples, intervals, sets, lists, unions


def _split_at(s: str, positions: list[int], width: int) -> list[str]:
    out, start = [], 0
    for p in positions:
        out.append(s[start:p].strip())
        start = p + width
    out.append(s[start:].strip())
    return out


def _outer(s: str) -> tuple[str, str, str] | None:
    """(open, inner, close) when one bracket pair spans all of `s`: `(a,b]`, `\\{a\\}`."""
    if s.startswith("\\{") and s.endswith("\\}"):
        open_, close, inner = "\\{", "\\}", s[2:-2]
    elif len(s) >= 2 and s[0] in "([" and s[-1] in ")]":
        open_, close, inner = s[0], s[-1], s[1:-1]
    else:
        return None
    # The pair must be one group: the depth inside never drops below zero.
    depth = 0
    i = 0
    while i < len(inner):
        c = inner[i]
        if c == "\\" and i + 1 < len(inner) and inner[i + 1] in "{}":
            c = inner[i + 1]
            i += 1
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if depth < 0:
                return None
        i += 1
    return (open_, inner, close) if depth == 0 else None


@dataclasses.dataclass(frozen=True)
class _Struct:
    kind: str  # "seq" (ordered, brackets matter) or "bag" (unordered)
    brackets: str
    items: tuple[str, ...]


def _structure(s: str) -> _Struct | None:
    """The collection `s` spells, or None for a single value."""
    commas, cups, depth = _scan_top(s)
    if depth < 0:
        return None
    if cups:
        return _Struct("bag", "cup", tuple(_split_at(s, cups, len("\\cup"))))
    if commas:
        return _Struct("bag", "", tuple(_split_at(s, commas, 1)))
    outer = _outer(s)
    if outer is None:
        return None
    open_, inner, close = outer
    inner_commas, _, inner_depth = _scan_top(inner)
    if inner_depth < 0:
        return None
    items = tuple(_split_at(inner, inner_commas, 1)) if inner.strip() else ()
    if open_ == "\\{":
        return _Struct("bag", "set", items)
    if not inner_commas and open_ == "(" and close == ")":
        return None  # plain parentheses around one value
    return _Struct("seq", open_ + close, items)


def _unwrap_parens(s: str) -> str:
    for _ in range(MAX_STRUCT_DEPTH):
        outer = _outer(s)
        if outer is None or outer[0] != "(" or outer[2] != ")":
            return s
        if _scan_top(outer[1])[0]:
            return s
        s = outer[1].strip()
    return s


def _bag_equal(pred: tuple[str, ...], gold: tuple[str, ...], depth: int) -> bool:
    if len(pred) != len(gold):
        return False
    unused = list(gold)
    for p in pred:
        for j, g in enumerate(unused):
            if _equivalent(p, g, depth):
                del unused[j]
                break
        else:
            return False
    return True


def _sympy_parse(text: str) -> list:
    # LaTeX only: math_verify's plain-expression extraction takes the first number it finds in
    # any text, so that `7²`, `7 @@@` or `7 \\ 8` would all read as 7.
    configs = [math_verify.LatexExtractionConfig()]
    return math_verify.parse(f"${text.replace('**', '^')}$", configs, parsing_timeout=None)


def _sympy_number(parsed: list) -> _Number | None:
    """The value of a closed-form number (`\\sqrt{2}/2`, `\\pi`), None for anything else."""
    expr = _first_sympy(parsed)
    if not isinstance(expr, sympy.Expr) or not expr.is_number:
        return None
    expr = expr.doit()
    if expr.is_Integer:
        return _Number(Fraction(int(expr)), False)
    value = sympy.N(expr, _SYMPY_DIGITS)
    if not value.is_number or value.has(sympy.nan, sympy.zoo, sympy.oo, -sympy.oo):
        return None
    parts = value.as_real_imag()
    floats = [float(part) for part in parts]
    if all(
        math.isfinite(x) and (x != 0 or part.is_zero) for part, x in zip(parts, floats, strict=True)
    ):
        return _Number(complex(*floats), False)
    # Beyond the range of a float (`e^{9999}`, `e^{-9999}`) a value stays a sympy number: as a
    # float it would read as inf, which is within any relative tolerance of anything, or as 0.
    return _Number(value, False)


def _sympy_equal(pred: str, gold: str, pred_num: _Number | None, gold_num: _Number | None) -> bool:
    """Sympy's verdict; a side already read as a plain number keeps its exact value."""
    parsed_pred = None if pred_num is not None else _sympy_parse(pred)
    parsed_gold = None if gold_num is not None else _sympy_parse(gold)
    pn = pred_num if pred_num is not None else _sympy_number(parsed_pred)
    gn = gold_num if gold_num is not None else _sympy_number(parsed_gold)
    if pn is not None and gn is not None:
        return _numbers_equal(pn, gn)
    if pred_num is not None or gold_num is not None:
        return False  # a number against something that is not a number
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
    pn, gn = _parse_number(p), _parse_number(g)
    if pn is not None and gn is not None:
        return _numbers_equal(pn, gn)
    if depth < MAX_STRUCT_DEPTH:
        ps = None if pn is not None else _structure(p)
        gs = None if gn is not None else _structure(g)
        if ps is not None or gs is not None:
            if ps is None or gs is None or len(ps.items) > MAX_ELEMENTS:
                return False
            if ps.kind != gs.kind or len(ps.items) != len(gs.items):
                return False
            if ps.kind == "seq":
                return ps.brackets == gs.brackets and all(
                    _equivalent(a, b, depth + 1) for a, b in zip(ps.items, gs.items, strict=True)
                )
            return _bag_equal(ps.items, gs.items, depth + 1)
        up, ug = _unwrap_parens(p), _unwrap_parens(g)
        if (up, ug) != (p, g):
            return _equivalent(up, ug, depth + 1)
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
WARMUP = ("\\boxed{\\frac{\\sqrt{2}}{2}}, so (x+1)^2 is \\boxed{(x+1)^2}", "x^2+2x+1")


def score(response: str, gold: str) -> float:
    """1.0 when the final answer of `response` is equivalent to the gold answer, else 0.0.

    `gold` is an answer (`extract_answer` of a reference solution), not a whole solution. This is
    the function to give `pool.VerifierPool`: `VerifierPool(math.score, ...)` with items
    `(response, gold)`.
    """
    return float(is_equivalent(extract_answer(response), gold))
