"""Math answers that are collections: tuples, sets, lists, matrices, vectors and intervals.

Host code. `compare(pred, gold, ...)` takes two normalized answers (`rewards.math.normalize`) and
decides whether they are the same collection, comparing elements with the equivalence it is given
(that of `rewards.math`), or returns None when neither answer is a collection. Linear in the
length of the answers, which the caller bounds (`math_numbers.MAX_PARSE_CHARS`).

* Tuples, points and lists compare element by element with the same brackets: `[1, 2)` is not
  `(1, 2)`, `(1, 2)` is not `(2, 1)`.
* Matrices `\\begin{pmatrix}` (`bmatrix`, `Bmatrix`, `matrix`, `smallmatrix`, `array` in brackets)
  compare element by element with the same shape, whatever their brackets. A matrix of one row or
  one column is a vector: it equals a vector of the same elements, whichever way it stands, and a
  tuple `(1, 2, 3)` or list `[1, 2, 3]`.
* Sets `\\{...\\}`, bare comma lists (`2, -5`) and unions (`\\cup`) compare as multisets.
* Intervals. A gold answer that is an interval expression compares as a set of real numbers:
  brackets in every notation (`[a, b)`, `(a, b]`, `\\left[ a, b \\right)`), infinite ends
  (`(-\\infty, 3)`; an infinite end is open whatever its bracket), unions in any order,
  `\\mathbb{R}`, `x \\in [2, 5)` and inequalities (`2 \\le x < 5` is `[2, 5)`, `x > 3` is
  `(3, \\infty)`, `x < 2 \\text{ or } x > 5` is `(-\\infty, 2) \\cup (5, \\infty)`). With numeric
  ends, overlapping and touching intervals merge first (`[1, 2] \\cup (2, 3]` is `[1, 3]`); with
  other ends each interval must match one of the other side's.
* `(a, b)` with finite ends is a point or an open interval: it is compared as the gold reads it.
  A gold with an interval marker (a bracket `[` or `]`, an infinite end, a union, an inequality,
  `\\in`, `\\mathbb{R}`) is an interval expression; a gold `(a, b)` is a point, which only a point
  `(a, b)` equals (`1 < x < 2` does not).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from fractions import Fraction

from rlvr_jax.rewards.math_guard import _CLOSE, _OPEN, _scan_top
from rlvr_jax.rewards.math_numbers import numbers_close, parse_number

MAX_ELEMENTS = 64  # tuples / sets / matrices / unions with more elements compare as strings
MAX_STRUCT_DEPTH = 6

# (pred, gold, depth) -> whether they are equivalent: the equivalence of `rewards.math`.
Equal = Callable[[str, str, int], bool]


def _split_at(s: str, positions: list[int], width: int) -> list[str]:
    out, start = [], 0
    for p in positions:
        out.append(s[start:p].strip())
        start = p + width
    out.append(s[start:].strip())
    return out


def _split_top(s: str, sep: str) -> list[str] | None:
    """`s` split at `sep` outside brackets, or None when its brackets do not balance."""
    positions: list[int] = []
    depth, i, n = 0, 0, len(s)
    while i < n:
        c = s[i]
        if c == "\\" and i + 1 < n:
            if s.startswith(sep, i) and depth == 0:
                positions.append(i)
                i += len(sep)
                continue
            if s[i + 1] in "{}\\":  # an escaped brace is a bracket; `\\` is a row break
                c = s[i + 1]
                i += 1
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if depth < 0:
                return None
        elif s.startswith(sep, i) and depth == 0:
            positions.append(i)
        i += 1
    return _split_at(s, positions, len(sep)) if depth == 0 else None


def outer(s: str) -> tuple[str, str, str] | None:
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


# ----------------------------------------------------------------------------------------------
# Tuples, sets, matrices


@dataclasses.dataclass(frozen=True)
class Struct:
    """A collection: "seq" (ordered; `brackets` must match) or "bag" (unordered)."""

    kind: str
    brackets: str  # "()", "[)", ..., "vec" for a vector, "RxC" for a matrix, "set", "cup", ""
    items: tuple[str, ...]


_MATRIX_RE = re.compile(
    r"\\begin\{(?P<env>[pbB]?matrix|smallmatrix|array)\}\s*(?:\{[lcr| ]*\})?"
    r"(?P<body>.*)\\end\{(?P=env)\}",
    re.DOTALL,
)


def _matrix(s: str) -> Struct | None:
    m = _MATRIX_RE.fullmatch(s)
    if m is None:
        return None
    rows = _split_top(m.group("body"), "\\\\")
    if rows is None:
        return None
    if len(rows) > 1 and not rows[-1]:  # a row break before \end
        rows.pop()
    cells = [_split_top(row, "&") for row in rows]
    if any(c is None for c in cells) or len({len(c) for c in cells}) != 1:
        return None
    items = tuple(x for row in cells for x in row)
    if len(rows) == 1 or len(cells[0]) == 1:
        return Struct("seq", "vec", items)
    return Struct("seq", f"{len(rows)}x{len(cells[0])}", items)


def structure(s: str) -> Struct | None:
    """The collection `s` spells, or None for a single value."""
    if s.startswith("\\begin"):
        return _matrix(s)
    commas, cups, depth = _scan_top(s)
    if depth < 0:
        return None
    if cups:
        return Struct("bag", "cup", tuple(_split_at(s, cups, len("\\cup"))))
    if commas:
        return Struct("bag", "", tuple(_split_at(s, commas, 1)))
    bracketed = outer(s)
    if bracketed is None:
        return None
    open_, inner, close = bracketed
    inner = inner.strip()
    inner_commas, _, inner_depth = _scan_top(inner)
    if inner_depth < 0:
        return None
    if not inner_commas and inner.startswith("\\begin") and open_ + close in ("()", "[]"):
        return _matrix(inner)  # \left( \begin{array}{c} ... \end{array} \right)
    items = tuple(_split_at(inner, inner_commas, 1)) if inner else ()
    if open_ == "\\{":
        return Struct("bag", "set", items)
    if not inner_commas and open_ == "(" and close == ")":
        return None  # plain parentheses around one value
    return Struct("seq", open_ + close, items)


def unwrap_parens(s: str) -> str:
    for _ in range(MAX_STRUCT_DEPTH):
        bracketed = outer(s)
        if bracketed is None or bracketed[0] != "(" or bracketed[2] != ")":
            return s
        if _scan_top(bracketed[1])[0]:
            return s
        s = bracketed[1].strip()
    return s


def _brackets_match(a: str, b: str) -> bool:
    if a == b:
        return True
    return "vec" in (a, b) and {a, b} <= {"vec", "()", "[]"}


def _bag_equal(pred: tuple[str, ...], gold: tuple[str, ...], same: Callable[[str, str], bool]):
    if len(pred) != len(gold):
        return False
    unused = list(gold)
    for p in pred:
        for j, g in enumerate(unused):
            if same(p, g):
                del unused[j]
                break
        else:
            return False
    return True


def _structs_equal(ps: Struct, gs: Struct, depth: int, equal: Equal) -> bool:
    if len(ps.items) > MAX_ELEMENTS or ps.kind != gs.kind or len(ps.items) != len(gs.items):
        return False
    if ps.kind == "seq":
        return _brackets_match(ps.brackets, gs.brackets) and all(
            equal(a, b, depth + 1) for a, b in zip(ps.items, gs.items, strict=True)
        )
    return _bag_equal(ps.items, gs.items, lambda a, b: equal(a, b, depth + 1))


# ----------------------------------------------------------------------------------------------
# Intervals


@dataclasses.dataclass(frozen=True)
class Interval:
    """An interval of real numbers; an end of None is infinite."""

    lo: str | None
    hi: str | None
    lo_closed: bool
    hi_closed: bool
    point_like: bool = False  # written `(a, b)` with finite ends: a point or an open interval


_INFINITY_RE = re.compile(r"([+-]?)\\infty")
_REALS = frozenset({"\\mathbb{R}", "\\mathbbR", "\\R"})
_RELATION_RE = re.compile(
    r"(\\leqslant|\\geqslant|\\leq|\\geq|\\le|\\ge|\\lt|\\gt)(?![A-Za-z])|(<=|>=|<|>|≤|≥)"
)
_RELATIONS = {  # relation -> (x < y or x > y, inclusive)
    "<": ("<", False),
    ">": (">", False),
    "<=": ("<", True),
    ">=": (">", True),
    "≤": ("<", True),
    "≥": (">", True),
    "\\lt": ("<", False),
    "\\gt": (">", False),
    "\\le": ("<", True),
    "\\leq": ("<", True),
    "\\leqslant": ("<", True),
    "\\ge": (">", True),
    "\\geq": (">", True),
    "\\geqslant": (">", True),
}
_VARIABLE_RE = re.compile(r"[A-Za-z](?:_\{?\w+\}?)?|\\(?:theta|alpha|beta|gamma|phi|lambda|mu)")
_OR_RE = re.compile(r"\s+or\s+|\\lor(?![A-Za-z])|\\vee(?![A-Za-z])")


def _end(s: str, sign: str) -> tuple[bool, str | None]:
    """(valid, end) for an interval end: None for the infinity of the right `sign`."""
    s = s.strip()
    inf = _INFINITY_RE.fullmatch(s.replace(" ", ""))
    if inf is None:
        return bool(s), s
    return (inf.group(1) or "+") == sign, None


def _make(lo: str, hi: str, lo_closed: bool, hi_closed: bool, parens: bool) -> Interval | None:
    ok_lo, lo_end = _end(lo, "-")
    ok_hi, hi_end = _end(hi, "+")
    if not (ok_lo and ok_hi):
        return None
    point_like = parens and lo_end is not None and hi_end is not None
    lo_closed = lo_closed and lo_end is not None
    hi_closed = hi_closed and hi_end is not None
    return Interval(lo_end, hi_end, lo_closed, hi_closed, point_like)


def _inequality(s: str) -> Interval | None:
    parts = [p for p in _RELATION_RE.split(s) if p is not None]
    if len(parts) not in (3, 5):
        return None
    terms, relations = parts[0::2], [_RELATIONS[r] for r in parts[1::2]]
    is_var = [bool(_VARIABLE_RE.fullmatch(t.strip())) for t in terms]
    if len(terms) == 2:
        (a, b), ((direction, inclusive),) = terms, relations
        if is_var == [False, True]:  # a < x is x > a
            a, b, direction = b, a, "<" if direction == ">" else ">"
        elif is_var != [True, False]:
            return None
        if direction == "<":
            return _make("-\\infty", b, False, inclusive, False)
        return _make(b, "\\infty", inclusive, False, False)
    if is_var != [False, True, False] or relations[0][0] != relations[1][0]:
        return None
    (a, _, b), ((direction, inc_a), (_, inc_b)) = terms, relations
    if direction == ">":  # b < x < a
        a, b, inc_a, inc_b = b, a, inc_b, inc_a
    return _make(a, b, inc_a, inc_b, False)


def _interval(piece: str) -> Interval | None:
    piece = piece.strip()
    if piece.replace(" ", "") in _REALS:
        return Interval(None, None, False, False)
    bracketed = outer(piece)
    if bracketed is not None and bracketed[0] in "([" and bracketed[2] in ")]":
        open_, inner, close = bracketed
        commas, _, depth = _scan_top(inner)
        if len(commas) != 1 or depth < 0:
            return None
        lo, hi = _split_at(inner, commas, 1)
        return _make(lo, hi, open_ == "[", close == "]", open_ + close == "()")
    return _inequality(piece)


def interval_set(s: str) -> list[Interval] | None:
    """The intervals `s` spells, in order (a union of them), or None when it is not intervals."""
    _, cups, depth = _scan_top(s)
    if depth < 0:
        return None
    pieces = [p for part in _split_at(s, cups, len("\\cup")) for p in _OR_RE.split(part)]
    if len(pieces) > MAX_ELEMENTS:
        return None
    intervals = [_interval(p) for p in pieces]
    return None if any(x is None for x in intervals) else intervals


def is_interval_expression(intervals: list[Interval]) -> bool:
    """Whether an answer read as `intervals` is one for sure, not a point `(a, b)`."""
    return not (len(intervals) == 1 and intervals[0].point_like)


def _numeric(x: Interval) -> tuple | None:
    ends = [None if e is None else parse_number(e) for e in (x.lo, x.hi)]
    if any(n is not None and n.percent for n in ends):
        return None
    if any(e is not None and n is None for e, n in zip((x.lo, x.hi), ends, strict=True)):
        return None
    lo, hi = (None if n is None else n.value for n in ends)
    return (lo, hi, x.lo_closed, x.hi_closed)


def _merged(intervals: list[Interval]) -> list[tuple] | None:
    """Numeric intervals as disjoint, sorted, non-empty ones; None if an end is not a number."""
    numeric = [_numeric(x) for x in intervals]
    if any(x is None for x in numeric):
        return None
    inf = Fraction(10) ** 1000  # beyond every parsed number (`math_numbers._MAX_EXP10`)
    kept = [
        (lo, hi, lc, hc)
        for lo, hi, lc, hc in numeric
        if lo is None or hi is None or lo < hi or (lo == hi and lc and hc)
    ]
    kept.sort(key=lambda x: (-inf if x[0] is None else x[0], not x[2]))
    out: list[tuple] = []
    for lo, hi, lc, hc in kept:
        if out:
            plo, phi, plc, phc = out[-1]
            if phi is None:
                continue
            if lo is not None and (lo > phi or (lo == phi and not (phc or lc))):
                out.append((lo, hi, lc, hc))
                continue
            if hi is None or hi > phi:
                out[-1] = (plo, hi, plc, hc)
            elif hi == phi:
                out[-1] = (plo, phi, plc, phc or hc)
            continue
        out.append((lo, hi, lc, hc))
    return out


def _ends_close(a: Fraction | None, b: Fraction | None) -> bool:
    return a is None if b is None else a is not None and numbers_close(a, b)


def _intervals_equal(pred: list[Interval], gold: list[Interval], depth: int, equal: Equal):
    mp, mg = _merged(pred), _merged(gold)
    if mp is not None and mg is not None:
        return len(mp) == len(mg) and all(
            _ends_close(p[0], g[0]) and _ends_close(p[1], g[1]) and p[2:] == g[2:]
            for p, g in zip(mp, mg, strict=True)
        )

    def same_end(a: str | None, b: str | None) -> bool:
        return a is None if b is None else a is not None and equal(a, b, depth + 1)

    def same(p: Interval, g: Interval) -> bool:
        return (p.lo_closed, p.hi_closed) == (g.lo_closed, g.hi_closed) and (
            same_end(p.lo, g.lo) and same_end(p.hi, g.hi)
        )

    return _bag_equal(tuple(pred), tuple(gold), same)


# ----------------------------------------------------------------------------------------------
# Comparison


def compare(
    pred: str, gold: str, pred_is_number: bool, gold_is_number: bool, depth: int, equal: Equal
) -> bool | None:
    """Whether the normalized answers `pred` and `gold` are the same collection (the module
    docstring's rules), or None when neither is a collection (nor in parentheses)."""
    gold_intervals = None if gold_is_number else interval_set(gold)
    if gold_intervals is not None and is_interval_expression(gold_intervals):
        pred_intervals = None if pred_is_number else interval_set(pred)
        if pred_intervals is None:
            return False
        return _intervals_equal(pred_intervals, gold_intervals, depth, equal)
    ps = None if pred_is_number else structure(pred)
    gs = None if gold_is_number else structure(gold)
    if ps is not None or gs is not None:
        return ps is not None and gs is not None and _structs_equal(ps, gs, depth, equal)
    up, ug = unwrap_parens(pred), unwrap_parens(gold)
    if (up, ug) != (pred, gold):
        return equal(up, ug, depth + 1)
    return None
