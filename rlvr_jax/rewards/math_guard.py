"""Cost guard for sympy: answers whose exact evaluation would not end are refused before it.

Sympy is exact, so a short answer can ask it for a number of a billion digits (`9^{9^{9^9}}`,
`(10^8)!`), an expansion of millions of terms (`(a+b)(c+d)...(w+y)`) or a `simplify` that
does not end (several functions of several variables). `sympy_cost_reason` reads the answer
with a small tolerant parser and bounds, for each sub-expression, the digits of the numbers it
builds and the monomials of its expansion: digits(a*b) <= digits(a) + digits(b),
digits(a^n) <= n * digits(a), digits(n!) <= n * log10(n), terms(a*b) <= terms(a) * terms(b),
terms(a^n) <= C(terms(a) + n - 1, n). A bound is cheap to compute and never smaller than the
real cost; an answer over any limit is compared as a string only (contest answers are far
below every limit: tests check the gold answers of MATH-500, AIME and AMC).
"""

from __future__ import annotations

import dataclasses
import math
import re

MAX_SYMPY_CHARS = 400
MAX_SYMPY_TOKENS = 80  # math_verify's LaTeX parser alone takes seconds on some longer ones
MAX_SYMPY_DEPTH = 24

_OPEN = {"(": ")", "[": "]", "{": "}"}
_CLOSE = {")": "(", "]": "[", "}": "{"}


def _scan_top(s: str) -> tuple[list[int], list[int], int]:
    """Top-level comma positions, `\\cup` positions and the maximal nesting depth of `s`.

    Returns depth -1 when the brackets of `s` do not balance. Iterative: safe at any depth.
    """
    commas: list[int] = []
    cups: list[int] = []
    depth = max_depth = 0
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == "\\" and s.startswith("\\cup", i) and depth == 0:
            cups.append(i)
        if c == "\\" and i + 1 < n and s[i + 1] in "{}":
            c = s[i + 1]
            i += 1
        if c in _OPEN:
            depth += 1
            max_depth = max(max_depth, depth)
        elif c in _CLOSE:
            depth -= 1
            if depth < 0:
                return [], [], -1
        elif c == "," and depth == 0:
            commas.append(i)
        i += 1
    return commas, cups, (max_depth if depth == 0 else -1)


MAX_EXPONENT = 10_000  # largest numeric exponent and factorial / binomial / Gamma argument
MAX_DIGITS = 100_000  # digits of the largest number an answer may build
MAX_FUNCTION_DIGITS = 300  # next to a function or radical: sin(10^k) needs k digits of pi,
# and simplify looks for the square factors of a radicand
MAX_TERMS = 64  # monomials of an answer's expansion
MAX_DEGREE = 32  # total degree of its polynomials (sympy's are dense in each variable)
MAX_POWERS = 16  # powers and exponentials in an answer
MAX_POWER_NESTING = 2  # `(x^2+1)^2` nests 2 deep; `((2^2)^2)^2` is a tower
MAX_FUNCTIONS = 12  # functions, radicals, factorials, non-integer and symbolic powers
MAX_SYMBOLIC_FUNCTIONS = 3  # those of them that apply to a variable
_MAX_PARSE_DEPTH = 64  # chains without brackets (`\sqrt\sqrt\sqrt...2`)
_LOG2 = math.log10(2)

_GUARD_TOKEN_RE = re.compile(r"\d+(?:\.\d*)?|\.\d+|\\[A-Za-z]+|\\.|\S", re.DOTALL | re.ASCII)
_SCI_IN_EXPR_RE = re.compile(r"\d[eE][+-]?\d")


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


def _commands(names: str) -> frozenset[str]:
    return frozenset("\\" + name for name in names.split())


_OPENERS = frozenset({"(", "[", "{", "\\{", "\\lvert"})
_CLOSERS = frozenset({")", "]", "}", "\\}", "\\end", "\\rvert"})
_BARS = frozenset({"|", "\\|", "\\vert", "\\Vert"})  # open or close: |x|
_SEPARATORS = _words("+ - = < > , ; : &") | _commands(
    "pm mp le leq leqslant ge geq geqslant ne neq lt gt cup cap setminus in notin subset "
    "subseteq to approx sim equiv mid quad qquad ldots dots cdots vee wedge land lor"
)
_PRODUCT_OPS = _words("* /") | _commands("cdot times div")
_NO_COST = (
    _words(". ' % \\% \\! \\, \\; \\:")
    | {"\\ "}
    | _commands(
        "left right lfloor rfloor lceil rceil prime circ degree displaystyle "
        "bigl bigr Bigl Bigr big Big"
    )
)
_BANNED = _commands("sum prod int iint iiint oint lim limsup liminf det partial coprod nabla")
_FRACTIONS = _commands("frac dfrac tfrac cfrac")
_BINOMIALS = _commands("binom dbinom tbinom")
_FUNCTIONS = _commands(
    "sin cos tan cot sec csc arcsin arccos arctan arccot arcsec arccsc sinh cosh tanh coth "
    "arsinh arcosh artanh arcsinh arccosh arctanh log ln lg max min gcd lcm arg sgn floor ceil "
    "overline mod bmod Re Im"
)
_NAMES = _commands(
    "text textbf textit textrm mathrm mathbf mathit mathbb mathcal mbox operatorname"
)
_CONSTANTS = _words("e i") | _commands("pi infty emptyset varnothing")


class _TooCostlyError(Exception):
    """Raised by the guard's parser with the rule an answer breaks."""


@dataclasses.dataclass(frozen=True)
class _Cost:
    """Upper bounds on what sympy builds for a sub-expression."""

    digits: float = 0.0  # log10 of its largest number (value, coefficient, numerator)
    terms: int = 1  # monomials once expanded
    degree: int = 0  # total degree in its variables (a function of a variable counts as one)
    free: bool = False  # has a variable
    grows: bool = False  # has a power, exponential, factorial, binomial or Gamma
    nesting: int = 0  # depth of powers within powers
    matrix: bool = False
    integer: int | None = None  # the value of a plain integer literal


_E = _Cost(digits=math.log10(math.e))
_VARIABLE = _Cost(free=True, degree=1)


def _merge(a: _Cost, b: _Cost, digits: float, terms: int, degree: int) -> _Cost:
    return _Cost(
        digits,
        min(terms, MAX_TERMS + 1),
        min(degree, MAX_DEGREE + 1),
        a.free or b.free,
        a.grows or b.grows,
        max(a.nesting, b.nesting),
        a.matrix or b.matrix,
    )


def _sum(a: _Cost, b: _Cost) -> _Cost:
    terms = a.terms + b.terms if a.free or b.free else 1
    return _merge(a, b, max(a.digits, b.digits) + _LOG2, terms, max(a.degree, b.degree))


def _product(a: _Cost, b: _Cost) -> _Cost:
    return _merge(a, b, a.digits + b.digits, a.terms * b.terms, a.degree + b.degree)


def _number(token: str) -> _Cost:
    digits = token.replace(".", "").lstrip("0")
    integer = int(token) if "." not in token else None
    return _Cost(digits=math.log10(int(digits)) if digits else 0.0, integer=integer)


class _GuardParser:
    """Recursive descent over tokens: expr := term (separator term)*, term := factor+,
    factor := primary (^ operand | ! | _ operand)*. It accepts what LaTeX writers write (any
    closer ends a group, unknown commands are variables) and raises `_TooCostlyError` at a limit."""

    def __init__(self, tokens: list[str]):
        self.tokens = tokens
        self.pos = 0
        self.depth = 0
        self.in_matrix = 0
        self.bars = 0
        self.has_function = False  # a function or radical: sin, log, exp, sqrt
        self.powers = 0
        self.functions = 0
        self.symbolic_functions = 0

    def peek(self) -> str:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else ""

    def take(self) -> str:
        token = self.peek()
        self.pos += 1
        return token

    def _is_separator(self, token: str) -> bool:
        return token in _SEPARATORS or (token == "\\\\" and self.in_matrix > 0)

    def expr(self) -> _Cost:
        total: _Cost | None = None
        choose_left: _Cost | None = None
        while True:
            term = self.term()
            if term is not None:
                total = term if total is None else self.checked(_sum(total, term))
            token = self.peek()
            if token == "\\choose":  # {n \choose k}
                left = total or _Cost()
                choose_left = left if choose_left is None else self.binomial(choose_left, left)
                total = None
            elif not self._is_separator(token):
                break
            self.pos += 1
        total = total or _Cost()
        return total if choose_left is None else self.binomial(choose_left, total)

    def term(self) -> _Cost | None:
        cost = None
        while True:
            token = self.peek()
            if not token or token in _CLOSERS or token == "\\choose" or self._is_separator(token):
                return cost
            if token in _BARS and self.bars > 0:  # the bar that closes |...|
                return cost
            if token in _PRODUCT_OPS or token in _NO_COST:
                self.pos += 1
            elif token in ("^", "!", "_"):  # after `\\right.` or `\\rfloor`
                if cost is None:
                    raise _TooCostlyError("an operator without its operand")
                cost = self.postfix(cost)
            else:
                factor = self.factor()
                cost = factor if cost is None else self.checked(_product(cost, factor))

    def factor(self) -> _Cost:
        return self.postfix(self.primary())

    def postfix(self, cost: _Cost) -> _Cost:
        powered = False
        while True:
            token = self.peek()
            if token == "^":
                if powered:
                    raise _TooCostlyError("a chain of powers a^b^c (a tower)")
                self.pos += 1
                cost, powered = self.power(cost, self.operand()), True
            elif token == "!":
                self.pos += 1
                cost = self.factorial(cost)
            elif token == "_":  # a subscript names something: a_1, x_{n}
                self.pos += 1
                self.operand()
            else:
                return cost

    def operand(self, one_digit: bool = False) -> _Cost:
        while self.peek() in ("+", "-"):
            self.pos += 1
        token = self.peek()
        if not token or token in _CLOSERS or self._is_separator(token) or token in ("^", "_", "!"):
            raise _TooCostlyError("an operator without its operand")
        if one_digit and token.isascii() and token.isdigit() and len(token) > 1:  # \frac 59
            self.tokens[self.pos] = token[1:]
            return _number(token[0])
        return self.primary()

    def primary(self) -> _Cost:
        self.depth += 1
        if self.depth > _MAX_PARSE_DEPTH:
            raise _TooCostlyError(f"more than {_MAX_PARSE_DEPTH} nested operations")
        try:
            return self._primary(self.take())
        finally:
            self.depth -= 1

    def _primary(self, token: str) -> _Cost:
        if token[0] in "0123456789.":
            return _number(token)
        if token in _OPENERS:
            inner = self.expr()
            if self.take() not in _CLOSERS:
                raise _TooCostlyError("unbalanced brackets")
            return inner
        if token in _BARS:
            self.bars += 1
            inner = self.expr()
            self.bars -= 1
            if self.take() not in _BARS:
                raise _TooCostlyError("unbalanced bars")
            return dataclasses.replace(inner, integer=None)
        if token[0] == "\\" and len(token) > 1:
            return self.command(token)
        if token in _CONSTANTS:
            return _E
        if token.isascii() and token.isalpha():
            return _VARIABLE
        if "\u0370" <= token <= "\u03ff":  # Greek letters: variables, and pi
            return _E if token == "π" else _VARIABLE
        raise _TooCostlyError(f"{token!r}, a character that LaTeX does not read as math")

    def command(self, token: str) -> _Cost:
        if token in _BANNED:
            raise _TooCostlyError(f"{token}: calculus and big operators are never a final answer")
        if token == "\\\\":
            raise _TooCostlyError("a line break: two answers")
        if token in _FRACTIONS:
            return self.checked(_product(self.operand(True), self.operand(True)))
        if token in _BINOMIALS:
            return self.binomial(self.operand(True), self.operand(True))
        if token == "\\sqrt":
            index = None
            if self.peek() == "[":
                self.pos += 1
                index = self.expr()
                if self.take() != "]":
                    raise _TooCostlyError("unbalanced brackets")
            radicand = self.operand(True)
            self.function(radicand.free or (index is not None and index.free))
            self.has_function = True
            if index is None:
                return dataclasses.replace(radicand, integer=None)
            return _merge(radicand, index, radicand.digits, 1, radicand.degree + index.degree)
        if token == "\\exp":
            self.has_function = True
            return self.power(_E, self.function_argument())
        if token == "\\Gamma" and self.peek() in _OPENERS:
            return self.factorial(self.function_argument())
        if token in _FUNCTIONS:
            while self.peek() in ("^", "_"):  # \sin^2 x, \log_2 8
                if self.take() == "^":
                    self.power(_Cost(), self.operand())
                else:
                    self.operand()
            if not self.peek() or self.peek() in _CLOSERS or self._is_separator(self.peek()):
                return _VARIABLE
            argument = self.function_argument()
            self.function(argument.free)
            self.has_function = True
            if token in ("\\gcd", "\\lcm") and argument.grows:
                raise _TooCostlyError(f"{token} of powers")
            return _merge(argument, argument, argument.digits, 1, int(argument.free))
        if token in _NAMES:
            if self.peek() == "{":  # \text{...}: a name, whatever it spells
                self.skip_group()
            return _VARIABLE
        if token == "\\begin":
            name = self.group_name()
            if name in ("vmatrix", "Vmatrix"):
                raise _TooCostlyError("a determinant of a matrix")
            self.in_matrix += 1
            inner = self.expr()
            self.in_matrix -= 1
            if self.take() != "\\end":
                raise _TooCostlyError("unbalanced brackets")
            self.group_name()
            return dataclasses.replace(inner, matrix=True, integer=None)
        if token in _CONSTANTS:
            return _E
        return _VARIABLE  # Greek letters and commands sympy reads as symbols, or fails on

    def function_argument(self) -> _Cost:
        if not self.peek() or self.peek() in _CLOSERS or self._is_separator(self.peek()):
            raise _TooCostlyError("a function without its argument")
        return self.factor()

    def skip_group(self) -> None:
        depth = 0
        while self.pos < len(self.tokens):
            token = self.take()
            depth += token in _OPENERS
            depth -= token in _CLOSERS
            if depth == 0:
                return

    def group_name(self) -> str:
        start = self.pos
        self.skip_group()
        return "".join(self.tokens[start + 1 : self.pos - 1])

    def power(self, base: _Cost, exponent: _Cost) -> _Cost:
        self.powers += 1
        if self.powers > MAX_POWERS:
            raise _TooCostlyError(f"more than {MAX_POWERS} powers and exponentials")
        if exponent.grows:
            raise _TooCostlyError("a power, exponential or factorial in an exponent (a tower)")
        if base.nesting + 1 > MAX_POWER_NESTING or (base.nesting and not base.free):
            raise _TooCostlyError("a power of a power (a tower)")
        if base.matrix:
            raise _TooCostlyError("a power of a matrix")
        nested = dataclasses.replace(base, grows=True, nesting=base.nesting + 1, integer=None)
        if exponent.free:  # sympy keeps x^n and 2^n as they are
            self.function(True)
            return _merge(nested, exponent, base.digits, base.terms, max(base.degree, 1))
        n = exponent.integer
        if n is None:
            if exponent.digits > math.log10(MAX_EXPONENT):
                raise _TooCostlyError(f"an exponent above {MAX_EXPONENT}")
            n = math.ceil(10**exponent.digits)
            self.function(base.free)  # a radical, or a power that may not be an integer one
        if n > MAX_EXPONENT:
            raise _TooCostlyError(f"an exponent above {MAX_EXPONENT}")
        terms = math.comb(base.terms + n - 1, n) if base.free and base.terms > 1 else base.terms
        return self.checked(_merge(nested, exponent, base.digits * n, terms, base.degree * n))

    def factorial(self, argument: _Cost) -> _Cost:
        if argument.grows:
            raise _TooCostlyError("a factorial, binomial or Gamma of a power or factorial")
        self.function(argument.free)
        if argument.free:
            return dataclasses.replace(argument, grows=True, integer=None)
        n = self.argument_value(argument)
        digits = n * math.log10(n + 1)
        return self.checked(dataclasses.replace(argument, digits=digits, grows=True, integer=None))

    def binomial(self, top: _Cost, bottom: _Cost) -> _Cost:
        if top.grows or bottom.grows:
            raise _TooCostlyError("a factorial, binomial or Gamma of a power or factorial")
        self.function(top.free or bottom.free)
        if top.free or bottom.free:  # binom(x, k) is a polynomial of degree k
            k = max((self.argument_value(a) for a in (top, bottom) if not a.free), default=1)
            cost = _merge(top, bottom, max(top.digits, bottom.digits), 1, k)
            return self.checked(dataclasses.replace(cost, grows=True))
        n = max(self.argument_value(top), self.argument_value(bottom))
        if (top.integer is None or bottom.integer is None) and n > MAX_DEGREE:
            # binom(sqrt(2), k) is a product of k factors that sympy multiplies out when parsing
            raise _TooCostlyError(
                f"a binomial of a non-integer with an argument above {MAX_DEGREE}"
            )
        return self.checked(dataclasses.replace(_merge(top, bottom, n * _LOG2, 1, 0), grows=True))

    def argument_value(self, argument: _Cost) -> int:
        if argument.integer is not None:
            n = argument.integer
        elif argument.digits > math.log10(MAX_EXPONENT):
            n = MAX_EXPONENT + 1
        else:
            n = math.ceil(10**argument.digits)
        if n > MAX_EXPONENT:
            raise _TooCostlyError(f"a factorial, binomial or Gamma argument above {MAX_EXPONENT}")
        return n

    def function(self, of_variable: bool) -> None:
        self.functions += 1
        self.symbolic_functions += of_variable
        if self.functions > MAX_FUNCTIONS:
            raise _TooCostlyError(f"more than {MAX_FUNCTIONS} functions and radicals")
        if self.symbolic_functions > MAX_SYMBOLIC_FUNCTIONS:
            raise _TooCostlyError(
                f"more than {MAX_SYMBOLIC_FUNCTIONS} functions, radicals or symbolic powers of "
                "variables (simplify may not end)"
            )

    @staticmethod
    def checked(cost: _Cost) -> _Cost:
        if cost.digits > MAX_DIGITS:
            raise _TooCostlyError(f"a number of more than {MAX_DIGITS} digits")
        if cost.terms > MAX_TERMS:
            raise _TooCostlyError(f"an expansion of more than {MAX_TERMS} terms")
        if cost.degree > MAX_DEGREE:
            raise _TooCostlyError(f"a polynomial of degree above {MAX_DEGREE}")
        return cost


def sympy_cost_reason(s: str) -> str | None:
    """Why sympy could run long or exhaust memory on the answer `s`, or None when it cannot.

    The rules (constants above):

    * at most `MAX_SYMPY_CHARS` characters, `MAX_SYMPY_TOKENS` tokens (numbers, letters,
      commands, symbols) and `MAX_SYMPY_DEPTH` nested brackets, balanced;
    * no tower: no power, exponential, factorial, binomial or Gamma in an exponent or in an
      `\\exp`, no `a^b^c`, powers nested at most `MAX_POWER_NESTING` deep, no power of a numeric
      power (`{9^9}^9`);
    * numeric exponents and factorial, binomial and Gamma arguments at most `MAX_EXPONENT`;
    * at most `MAX_DIGITS` digits in any number (`MAX_FUNCTION_DIGITS` in an answer with a
      function such as sin, log, exp or a radical), `MAX_TERMS` terms in the expansion and degree
      `MAX_DEGREE` (the bounds in the comment above);
    * at most `MAX_POWERS` powers, `MAX_FUNCTIONS` functions and radicals, of which
      `MAX_SYMBOLIC_FUNCTIONS` of a variable;
    * no sum, product, integral, limit, partial derivative or determinant, no power of a matrix;
    * no scientific notation inside an expression, no line break (two answers), no operator
      without its operand and no character outside ASCII and Greek.

    Linear in `len(s)`: a few microseconds per character.
    """
    if len(s) > MAX_SYMPY_CHARS:
        return f"more than {MAX_SYMPY_CHARS} characters"
    _, _, depth = _scan_top(s)
    if depth < 0:
        return "unbalanced brackets"
    if depth > MAX_SYMPY_DEPTH:
        return f"brackets nested more than {MAX_SYMPY_DEPTH} deep"
    t = s.replace("**", "^")
    if _SCI_IN_EXPR_RE.search(t):
        return "scientific notation inside an expression (LaTeX reads e as Euler's number)"
    tokens = _GUARD_TOKEN_RE.findall(t)
    if len(tokens) > MAX_SYMPY_TOKENS:
        return f"more than {MAX_SYMPY_TOKENS} tokens"
    parser = _GuardParser(tokens)
    try:
        cost = parser.checked(parser.expr())
    except _TooCostlyError as e:
        return str(e)
    if parser.pos < len(parser.tokens):
        return "unbalanced brackets"
    # The whole answer, not only the argument: math_verify's parser lets `\\cos(x)^{3} 9^{944}`
    # read as cos of everything that follows.
    if parser.has_function and cost.digits > MAX_FUNCTION_DIGITS:
        return f"a function next to a number of more than {MAX_FUNCTION_DIGITS} digits"
    return None


def too_costly_for_sympy(s: str) -> bool:
    """Whether `s` breaks a rule of `sympy_cost_reason`: then it never reaches sympy."""
    return sympy_cost_reason(s) is not None
