"""Hostile responses for the math verifier, by class: none may score, hang or crash it.

`CASES` holds `(cls, response, gold)` triples; every response must score 0 against its gold,
well within the pool's deadline. `GUARDED` maps the classes the sympy cost guard exists for to
their answers (what `extract_answer` returns), with the words of the rule that must reject them.
The big items are built here rather than stored: a 1 MB line in a data file helps nobody.
"""

GOLDS = ("7", "\\frac{\\sqrt{3}}{2}", "x+1")
MB = 1_000_000


def _tower(open_: str, close: str, base: str, depth: int) -> str:
    """((b^b)^b)^b... with the given brackets: a power tower that never nests an exponent."""
    s = base
    for _ in range(depth):
        s = f"{open_}{s}{close}^{{{base}}}"
    return s


def _nested_exponents(base: str, depth: int) -> str:
    return "".join(f"{base}^{{" for _ in range(depth)) + base + "}" * depth


_SIMPLIFY_BOMBS = [
    "\\log(r+b)+\\tan(u+t)+\\log(m+t)+\\tan(w+h)+\\sqrt{f+m}",
    "\\cos(d+x)+\\tan(v+x)+\\cos(m+d)+\\exp(c+z)+\\tan(t+v)+\\sin(p+r)+\\tan(x+y)",
    "\\sin(x+3y)+\\tan(x+2x)-\\sqrt{x+7y}-\\log(y+3x)+\\exp(y+4x)+\\cos(x+7x)",
    "\\cos(x+3x)-\\log(x+8x)+\\cos(x+2x)+\\sin(2x)",
    "+".join(f"\\sin {i}" for i in range(1, 14)),
    "\\sqrt{z+9z}-\\sin(z+8y)-\\cos(z+6x)+\\sqrt{z+5z}-\\log(z+8z)+\\sqrt{z+4y}",
    "\\frac{\\sin(a+b)\\cos(c+d)}{\\tan(a-c)\\log(b+d)}",
]

GUARDED: dict[str, tuple[str, list[str]]] = {
    "power tower, parentheses": (
        "tower",
        [_tower("(", ")", "2", d) for d in (2, 3, 5, 8, 12)]
        + [_tower("(", ")", "9", d) for d in (4, 7)]
        + ["((2**2)**2)**2", "((9)^(9))^(9)", "(9^{9999})^{9999}"],
    ),
    "power tower, braces": (
        "tower",
        [_tower("{", "}", "9", d) for d in (2, 3, 4, 6, 10)]
        + ["{{{9}^{9}}^{9}}^{9}", "{\\left(9^{9}\\right)}^{9}"],
    ),
    "power tower, exponents": (
        "tower",
        [_nested_exponents("2", d) for d in (2, 4, 8, 16)]
        + ["9^{9^{9^9}}", "10**10**10", "9^9^9^9", "9^(9^(9^9))", "x^{x^{x}}", "2^{10^{100}}"],
    ),
    "factorial, binomial, Gamma": (
        "factorial, binomial or Gamma",
        [
            "\\Gamma(10^6)",
            "\\Gamma(1000000)",
            "\\Gamma(\\Gamma(9))",
            "\\binom{10^9}{5*10^8}",
            "\\binom{1000000000}{500000000}",
            "\\dbinom{99999}{3}",
            "{10^{9} \\choose 5}",
            "{1000000000 \\choose 500000000}",
            "(10^8)!",
            "100000!",
            "((10!)!)!",
            "10^8!",
            "(99 \\cdot 999)!",
            "\\binom{x}{100000}",
        ],
    ),
    "nested exp": (
        "tower",
        [
            "e^{e^{e^{10}}}",
            "\\exp(\\exp(\\exp(9)))",
            "\\exp(\\exp(9))",
            "e^{\\exp(5)}",
            "\\exp(10^{6})",
            "e^{10^{10}}",
            "\\exp(e^{x})",
            "2^{999!}",
        ],
    ),
    "large exponents": (
        "exponent above",
        [
            "(x+1)^{100000}",
            "x^{1000000000}",
            "2^{1000000000}",
            "\\exp(99999999)",
            "10^{-99999}",
            "\\sqrt{2}^{123456}",
        ],
    ),
    "large symbolic powers": (
        "terms",
        [
            "(x+1)^{1000}",
            "(x+1)^{200}",
            "(x+y+z)^{40}",
            "(a+b)^{99}(a-b)^{99}",
            "(x-1)^{70}",
            "\\frac{(x+1)^{16}}{(x-1)^{16}}",
        ],
    ),
    "high degree": (
        "degree",
        ["x^{9999}y^{9999}", "(xyz)^{99}", "a^{4623}b^{5062}+1", "\\binom{x}{218}"],
    ),
    "expansion bombs": (
        "terms",
        [
            "".join(f"({a}+{b})" for a, b in zip("acegikmoqsuw", "bdfhjlnprtvy", strict=True)),
            "(a+b+c+d+e)" * 4,
            "(a+b+c+d+e+f+g+h)^{8}",
            "\\frac{(a+b)^{5}(c+d)^{5}}{(a-b)^{5}(c-d)^{5}}",
            "(a+b+c+d+e+f+g+h+i+j+k+l+m+n+o+p)^{3}",
        ],
    ),
    "simplify bombs": ("functions", _SIMPLIFY_BOMBS),
    "calculus": (
        "never a final answer",
        [
            "\\sum_{k=1}^{1000000} \\frac{1}{k}",
            "\\prod_{k=1}^{100000} k",
            "\\int_0^1 e^{x^3}\\sin(x^5) dx",
            "\\lim_{n\\to\\infty}(1+1/n)^{n}",
            "\\det\\begin{pmatrix}a&b&c\\\\d&e&f\\\\g&h&i\\end{pmatrix}",
            "\\iint x y \\, dx\\, dy",
        ],
    ),
    "huge numbers": (
        "digits",
        [
            "9" * 100 + "^{9999}",
            "\\cdot".join(["9^{9999}"] * 12),
            "9999!\\cdot 9999!\\cdot 9999!",
        ],
    ),
    "determinants and matrix powers": (
        "matri",
        [
            "\\begin{vmatrix}a&b&c&d\\\\e&f&g&h\\\\i&j&k&l\\\\m&n&o&p\\end{vmatrix}",
            "\\begin{pmatrix}a&b\\\\c&d\\end{pmatrix}^{9999}",
        ],
    ),
    "long expressions": (
        "tokens",
        [
            "(1379.517^{\\frac{1}{2}}-3080^{5623}\\cdot 11\\cdot 4+a7253065850^{396}"
            "9^{\\frac{1}{2}})\\binom{b}{12}\\frac{b\\sqrt{2}^{5418}}{n-n9295z-86b}-0^{-1}ax\\sqrt{5n^{\\frac{1}{2}}"
            "-n+41.7292}-(128+e^{2}\\cdot 10^{5}\\cdot z\\cdot z-y^{-1})^{-1}-yx",
            "1+" * 60 + "1",
            "\\frac{a}{b}" * 20,
        ],
    ),
    "scientific notation": (
        "scientific notation",
        ["1e999999999", "2e999+1", "1e9999x"],
    ),
}


def _boxed(answer: str) -> str:
    return f"The answer is \\boxed{{{answer}}}."


def _cases() -> list[tuple[str, str, str]]:
    cases: list[tuple[str, str, str]] = []
    for cls, (_, answers) in GUARDED.items():
        cases += [(cls, _boxed(a), GOLDS[i % len(GOLDS)]) for i, a in enumerate(answers)]
    long_strings = [
        "a" * MB,
        "$" * MB,
        "\\boxed{" + "1" * MB + "}",
        "\\boxed{" + "1+" * (MB // 2) + "1}",
        "\\boxed{" + ",".join(["1"] * 100_000) + "}",
        "x" * MB + "\\boxed{8}",
        "<think>" + "think " * (MB // 6) + "</think><answer>8</answer>",
        "\\boxed{" + "9" * 1001 + "}",
        "\\boxed{" + "9" * 100_000 + "}",
        "\\boxed{" + "\\sqrt{2}+" * 30 + "1}",
    ]
    cases += [("long strings", s, "7") for s in long_strings]
    deep_nesting = [
        "\\boxed{" + "(" * 10_000 + "1" + ")" * 10_000 + "}",
        "\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}",
        "\\boxed{" + "\\frac{1}{" * 2000 + "2" + "}" * 2000 + "}",
        "\\boxed{" + "\\sqrt{" * 5000 + "2" + "}" * 5000 + "}",
        "\\boxed{" + "[" * 50_000 + "}",
        "\\boxed{" + "\\left(" * 3000 + "1" + "\\right)" * 3000 + "}",
        "\\boxed{" + "(" * 30 + "x" + ")" * 30 + "}",
        "\\boxed{" + "([{" * 20 + "1" + "}])" * 20 + "}",
        "\\boxed{" + "\\sqrt" * 100 + " 2}",
        "\\boxed{" + "-" * 5000 + "8}",
    ]
    cases += [("deep nesting", s, GOLDS[i % 3]) for i, s in enumerate(deep_nesting)]
    # Text that looks like the gold 7 (or x+1) and is not: each must read as what it is.
    unicode_tricks = [
        ("\\boxed{7²}", "7"),
        ("\\boxed{7⁹⁹⁹⁹⁹⁹⁹⁹⁹}", "7"),
        ("\\boxed{7\u200b8}", "7"),
        ("\\boxed{7\u200d000}", "7"),
        ("\\boxed{7\u0338}", "7"),
        ("\\boxed{7\u20e3}", "7"),
        ("\\boxed{\u202e87}", "7"),
        ("\\boxed{７７}", "7"),
        ("\\boxed{х+1}", "x+1"),  # a Cyrillic х
        ("\\boxed{x\u00a0+\u00a02}", "x+1"),
        ("\\boxed{7\ud800}", "7"),
        ("\\boxed{7\U0001f600}", "7"),
        ("\\boxed{𝟕𝟖}", "7"),
        ("\\boxed{٧٨}", "7"),  # Arabic-Indic digits are digits: this is 78
    ]
    cases += [("unicode tricks", s, g) for s, g in unicode_tricks]
    macros = [
        "\\boxed{\\def\\a{\\a\\a}\\a}",
        "\\boxed{\\newcommand{\\x}{\\x\\x}\\x}",
        "\\boxed{\\let\\x\\relax 8}",
        "\\boxed{\\input{/etc/passwd}}",
        "\\boxed{\\write18{rm -rf /}}",
        "\\boxed{\\csname 7\\endcsname 8}",
        "\\boxed{\\phantom{7}8}",
        "\\boxed{\\color{white}{7}8}",
        "\\boxed{\\expandafter\\x\\x}",
        "\\boxed{\\catcode`7=11 8}",
        "\\boxed{\\def\\7{7}\\7\\7}",
    ]
    cases += [("latex macros", s, "7") for s in macros]
    repeated_boxes = [
        "\\boxed{" * 100_000,
        "\\boxed{8}" * 100_000,
        "\\boxed{" * 10_000 + "8" + "}" * 10_000,
        "\\boxed{7} so the answer is \\boxed{}",
        "\\fbox{7}\\boxed{8}",
        "\\boxed{7}\\boxed 8",
        "<answer>\\boxed{7}\\boxed{8}</answer>",
        "\\boxed{\\boxed{\\boxed{8}}}",
    ]
    cases += [("repeated boxes", s, "7") for s in repeated_boxes]
    regex_shaped = [
        "\\boxed{" + "1" * 5000 + "!}",
        "\\boxed{" + "1 " * 5000 + "cm}",
        "\\boxed{" + "x = " * 2000 + "8}",
        "\\boxed{" + "1," * 5000 + "x}",
        "\\boxed{" + "\\text{" * 5000 + "}",
        "\\boxed{" + "1.1." * 2000 + "}",
        "\\boxed{" + "(1," * 1000 + "}",
        "####" * 10_000,
        "<answer>" * 10_000 + "</answer>" * 10_000,
        "\\boxed{" + "a" * 199 + " 1 cm}",
        "\\boxed{1" + " " * 10_000 + "cm}",
        "\\boxed{" + "\\$" * 10_000 + "}",
        "\\boxed{" + "1{,}" * 3000 + "}",
        "\\boxed{" + "\\frac{1}{" * 300 + "}",
        "\\boxed{" + "10^{" * 300 + "}",
    ]
    cases += [("regex-shaped", s, GOLDS[i % 3]) for i, s in enumerate(regex_shaped)]
    # An answer that says 7 and something else, or 7 followed by garbage, is not 7.
    hedges = [
        "\\boxed{7 @@@}",
        "\\boxed{7 \\\\ 8}",
        "\\boxed{7^}",
        "\\boxed{7\\}}",
        "\\boxed{7 or 8}",
        "\\boxed{7, 8}",
        "\\boxed{\\{7, 8\\}}",
        "\\boxed{7 \\pm 1}",
        "\\boxed{7;8}",
        "\\boxed{7 \\text{ or } 8}",
    ]
    cases += [("hedges and garbage", s, "7") for s in hedges]
    out_of_range = [
        ("\\boxed{e^{9999}}", "7"),
        ("\\boxed{e^{-9999}}", "0"),
        ("\\boxed{(1+\\sqrt{2})^{9999}}", "7"),
        ("\\boxed{10^{400}\\pi}", "7"),
        ("\\boxed{\\frac{1}{0}}", "\\infty"),
        ("\\boxed{0^{-1}}", "\\infty"),
        ("\\boxed{\\infty-\\infty}", "0"),
        ("\\boxed{\\binom{\\sqrt{3}}{9}^{923}}", "\\frac{\\sqrt{3}}{2}"),
    ]
    cases += [("out of float range", s, g) for s, g in out_of_range]
    return cases


CASES = _cases()

# Normal answers that must still score after the hostile ones: (response, gold).
NORMAL = [
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{\\dfrac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}"),
    ("\\boxed{2\\pi}", "6.283185307179586"),
    ("\\boxed{[1, 2)}", "[1,2)"),
    ("\\boxed{(x+1)^2}", "x^2+2x+1"),
    ("#### 1,000", "1000"),
    ("<answer>12.5\\%</answer>", "0.125"),
    ("\\boxed{2^{10}}", "1024"),
    ("\\boxed{\\binom{10}{3}}", "120"),
    ("\\boxed{5!}", "120"),
    ("\\boxed{e^{2}}", "e^2"),
    ("\\boxed{\\frac{n(n+1)}{2}}", "\\frac{n^2+n}{2}"),
]
