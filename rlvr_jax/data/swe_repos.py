"""Generated software-engineering tasks: a small Python package with one seeded bug and tests.

Host code, standard library only. `swe_repo(seed, index)` builds one repository from a fixed
catalogue of small functions (`FUNCTIONS`), deterministically from `(seed, index)`: four functions
spread over two modules of a package, one of them broken by a mutation of one kind (`BUG_KINDS`:
off-by-one, wrong operator, swapped arguments, wrong constant, missing edge case). The repository
holds

* `<pkg>/__init__.py`, `<pkg>/core.py`, `<pkg>/extra.py`: the source (the only files an agent may
  change, `SweRepo.allowed`);
* `tests/test_core.py`, `tests/test_extra.py` and `run_tests.py`: visible tests, plain asserts
  run by a stdlib runner (no pytest needed inside the sandbox), at least one of which fails on
  the bug;
* `README.md`.

The hidden tests are data, never files of the repository: `(module, function, args, expected)`
with literal arguments, computed from the correct source and chosen so that at least two of them
fail on the bug. The expected values stay on the host; only the calls go into the sandbox that
scores a patch (`envs.swe`).

The generator executes its own catalogue's source (the correct and the mutated function) on the
host to compute expected values and to pick cases that reveal the bug; model-written code never
runs here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlvr_jax.data.example import Example

NAME = "swe_repos"
BUG_KINDS = ("off_by_one", "wrong_operator", "swapped_args", "wrong_constant", "missing_edge_case")
PACKAGES = ("toolkit", "mathlib", "calc", "utilkit", "numtools", "helpers")
MODULES = ("core", "extra")
HIDDEN_CASES = 6  # per function
VISIBLE_CASES = 2  # per function


@dataclasses.dataclass(frozen=True)
class Function:
    """A catalogue entry: correct source, its mutations, and a draw of arguments.

    Attributes:
      name: the function's name.
      source: the correct definition.
      bugs: (kind, old, new): the mutation replaces `old` (once, it occurs exactly once) by `new`.
      draw: random arguments, a tuple of literals.
      edge: arguments that reveal the edge-case bugs (drawn cases may miss them).
    """

    name: str
    source: str
    bugs: tuple[tuple[str, str, str], ...]
    draw: Callable[[random.Random], tuple]
    edge: tuple[tuple, ...] = ()


def _ints(r: random.Random, n: int, lo: int = -20, hi: int = 20) -> list[int]:
    return [r.randint(lo, hi) for _ in range(n)]


def _src(text: str) -> str:
    return textwrap.dedent(text).strip() + "\n"


FUNCTIONS: tuple[Function, ...] = (
    Function(
        "clamp",
        _src('''
            def clamp(x, lo, hi):
                """x limited to the interval [lo, hi]."""
                return max(lo, min(x, hi))
        '''),
        (("swapped_args", "max(lo, min(x, hi))", "max(hi, min(x, lo))"),),
        lambda r: (r.randint(-30, 30), r.randint(-10, 0), r.randint(1, 10)),
    ),
    Function(
        "window_sums",
        _src('''
            def window_sums(xs, k):
                """Sums of every run of k consecutive items of xs."""
                return [sum(xs[i : i + k]) for i in range(len(xs) - k + 1)]
        '''),
        (("off_by_one", "len(xs) - k + 1", "len(xs) - k"),),
        lambda r: (_ints(r, r.randint(3, 7)), r.randint(1, 3)),
    ),
    Function(
        "is_leap",
        _src('''
            def is_leap(year):
                """Whether year is a leap year of the Gregorian calendar."""
                return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
        '''),
        (
            ("wrong_constant", "year % 400 == 0", "year % 300 == 0"),
            ("missing_edge_case", " and (year % 100 != 0 or year % 400 == 0)", ""),
            ("wrong_operator", "year % 100 != 0 or", "year % 100 != 0 and"),
        ),
        lambda r: (r.choice([r.randint(1, 2400), 4 * r.randint(1, 600), 100 * r.randint(1, 24)]),),
        ((1900,), (2000,), (1600,), (2100,)),
    ),
    Function(
        "to_fahrenheit",
        _src('''
            def to_fahrenheit(celsius):
                """Degrees Celsius in degrees Fahrenheit."""
                return celsius * 9 / 5 + 32
        '''),
        (
            ("wrong_constant", "+ 32", "+ 23"),
            ("wrong_operator", "celsius * 9 / 5 + 32", "celsius * 9 / 5 - 32"),
        ),
        lambda r: (r.randint(-40, 120),),
    ),
    Function(
        "safe_div",
        _src('''
            def safe_div(a, b, default):
                """a / b, or default when b is zero."""
                if b == 0:
                    return default
                return a / b
        '''),
        (
            ("missing_edge_case", "if b == 0:\n        return default\n    ", ""),
            ("swapped_args", "return a / b", "return b / a"),
        ),
        lambda r: (r.randint(1, 50), r.choice([0, r.randint(1, 9)]), r.randint(-5, 5)),
        ((7, 0, 0), (3, 0, -1)),
    ),
    Function(
        "count_vowels",
        _src('''
            def count_vowels(text):
                """How many letters of text are vowels (a, e, i, o, u), either case."""
                return sum(1 for ch in text.lower() if ch in "aeiou")
        '''),
        (
            ("missing_edge_case", "text.lower()", "text"),
            ("wrong_constant", '"aeiou"', '"aeio"'),
        ),
        lambda r: ("".join(r.choice("abcdeEfghIijkOoUuxyz ") for _ in range(r.randint(3, 12))),),
        (("AEIOU",), ("Queue",)),
    ),
    Function(
        "mean",
        _src('''
            def mean(xs):
                """The arithmetic mean of xs; 0.0 for an empty list."""
                if not xs:
                    return 0.0
                return sum(xs) / len(xs)
        '''),
        (
            ("missing_edge_case", "if not xs:\n        return 0.0\n    ", ""),
            ("off_by_one", "sum(xs) / len(xs)", "sum(xs) / (len(xs) + 1)"),
        ),
        lambda r: (_ints(r, r.randint(0, 6)),),
        (([],),),
    ),
    Function(
        "range_sum",
        _src('''
            def range_sum(a, b):
                """The sum of the integers from a to b, both included."""
                return sum(range(a, b + 1))
        '''),
        (
            ("off_by_one", "range(a, b + 1)", "range(a, b)"),
            ("swapped_args", "range(a, b + 1)", "range(b, a + 1)"),
        ),
        lambda r: (r.randint(-10, 5), r.randint(6, 20)),
    ),
    Function(
        "in_range",
        _src('''
            def in_range(x, lo, hi):
                """Whether x lies between lo and hi, both included."""
                return lo <= x <= hi
        '''),
        (("wrong_operator", "lo <= x <= hi", "lo < x <= hi"),),
        lambda r: (r.randint(0, 10), r.randint(0, 5), r.randint(5, 10)),
        ((0, 0, 5), (3, 3, 3)),
    ),
    Function(
        "last_n",
        _src('''
            def last_n(xs, n):
                """The last n items of xs (all of them when n >= len(xs), none when n <= 0)."""
                if n <= 0:
                    return []
                return xs[-n:]
        '''),
        (
            ("missing_edge_case", "if n <= 0:\n        return []\n    ", ""),
            ("off_by_one", "xs[-n:]", "xs[-n + 1 :]"),
        ),
        lambda r: (_ints(r, r.randint(2, 6)), r.randint(1, 4)),
        (([1, 2, 3], 0),),
    ),
)
BY_NAME = {f.name: f for f in FUNCTIONS}


@dataclasses.dataclass(frozen=True)
class HiddenTest:
    """One hidden test: `<pkg>.<module>.<function>(*args) == expected`."""

    module: str
    function: str
    args: tuple
    expected: Any


@dataclasses.dataclass(frozen=True)
class SweRepo:
    """A generated repository.

    Attributes:
      files: relative path -> text, the repository as the agent starts from it.
      allowed: the paths an agent may change (the package's source files).
      hidden_tests: the scoring tests (data; never files of the repository).
      fix: path -> correct text of the file that holds the bug.
      bug: {"kind", "module", "function"}.
      issue: the bug report the agent is given.
    """

    files: Mapping[str, str]
    allowed: tuple[str, ...]
    hidden_tests: tuple[HiddenTest, ...]
    fix: Mapping[str, str]
    bug: Mapping[str, str]
    issue: str

    @property
    def package(self) -> str:
        return self.allowed[0].split("/")[0]


def repo_hash(files: Mapping[str, str]) -> str:
    """sha256 over the sorted paths and contents: the repository's identity."""
    h = hashlib.sha256()
    for path in sorted(files):
        data = files[path].encode()
        h.update(f"{path}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def _compile(source: str, name: str) -> Callable:
    # Our own catalogue's code (never model output): needed for the expected values.
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<catalogue {name}>", "exec"), namespace)  # noqa: S102
    return namespace[name]


def _outcome(fn: Callable, args: tuple) -> tuple[bool, Any]:
    try:
        return True, fn(*args)
    except Exception as e:  # noqa: BLE001 (a mutated function may raise; that is its outcome)
        return False, type(e).__name__


def _cases(
    r: random.Random, f: Function, good: Callable, bad: Callable | None, n: int
) -> list[tuple[tuple, Any]]:
    """n cases of f with distinct arguments; with `bad`, up to n // 2 reveal the bug (one at
    least)."""
    seen, revealing, plain = set(), [], []
    pool = [*f.edge, *(f.draw(r) for _ in range(200))]
    for args in pool:
        key = repr(args)
        if key in seen:
            continue
        seen.add(key)
        ok, expected = _outcome(good, args)
        assert ok, f"catalogue function {f.name} raised on {args}"
        differs = bad is not None and _outcome(bad, args) != (True, expected)
        (revealing if differs else plain).append((args, expected))
    if bad is not None and not revealing:
        raise AssertionError(f"no case reveals the {f.name} mutation")
    k = min(len(revealing), max(2, n // 2)) if bad is not None else 0
    chosen = revealing[:k] + plain[: n - k]
    r.shuffle(chosen)
    return chosen


def _literal(value: Any) -> str:
    return repr(value)


def _visible_test(module: str, pkg: str, cases: Sequence[tuple[str, tuple, Any]]) -> str:
    lines = [
        f'"""Tests of {pkg}.{module}."""',
        "",
        f"from {pkg} import {module}",
        "",
        "",
        "def _close(a, b):",
        "    if isinstance(b, float):",
        "        return isinstance(a, (int, float)) and abs(a - b) < 1e-9",
        "    return a == b",
    ]
    for i, (fn, args, expected) in enumerate(cases):
        call = f"{module}.{fn}({', '.join(_literal(a) for a in args)})"
        lines += ["", "", f"def test_{fn}_{i}():", f"    assert _close({call}, {expected!r})"]
    return "\n".join(lines) + "\n"


RUNNER = _src('''
    """Runs every test_* function of tests/test_*.py: python run_tests.py"""

    import importlib
    import pathlib
    import sys
    import traceback

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    failed = passed = 0
    for path in sorted(pathlib.Path("tests").glob("test_*.py")):
        module = importlib.import_module(f"tests.{path.stem}")
        for name in sorted(n for n in vars(module) if n.startswith("test_")):
            try:
                getattr(module, name)()
                passed += 1
                print(f"PASS {path.stem}.{name}")
            except Exception:
                failed += 1
                print(f"FAIL {path.stem}.{name}")
                traceback.print_exc(limit=2)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
''')


def swe_repo(seed: int, index: int) -> SweRepo:
    """The repository `index` of the set drawn with `seed` (same arguments, same repository)."""
    r = random.Random(f"{NAME}/{seed}/{index}")
    pkg = r.choice(PACKAGES)
    kind = BUG_KINDS[r.randrange(len(BUG_KINDS))]
    buggy = r.choice([f for f in FUNCTIONS if any(b[0] == kind for b in f.bugs)])
    others = r.sample([f for f in FUNCTIONS if f is not buggy], 3)
    chosen = [buggy, *others]
    r.shuffle(chosen)
    _, old, new = r.choice([b for b in buggy.bugs if b[0] == kind])
    assert buggy.source.count(old) == 1, (buggy.name, old)
    broken = buggy.source.replace(old, new)
    layout = {MODULES[0]: chosen[:2], MODULES[1]: chosen[2:]}
    files, fix, hidden, visible = {}, {}, [], {m: [] for m in MODULES}
    for module, functions in layout.items():
        path = f"{pkg}/{module}.py"
        header = f'"""{pkg}.{module}: small helpers."""\n'
        correct = header + "".join(f"\n\n{f.source}" for f in functions)
        files[path] = correct.replace(buggy.source, broken) if buggy in functions else correct
        if buggy in functions:
            fix[path] = correct
            bug = {"kind": kind, "module": module, "function": buggy.name}
        for f in functions:
            good = _compile(f.source, f.name)
            bad = _compile(broken, f.name) if f is buggy else None
            cases = _cases(r, f, good, bad, HIDDEN_CASES + VISIBLE_CASES)
            split = _split_visible(cases, bad)
            visible[module] += [(f.name, a, e) for a, e in split[0]]
            hidden += [HiddenTest(module, f.name, a, e) for a, e in split[1]]
    files[f"{pkg}/__init__.py"] = f'"""{pkg}: small helpers."""\n'
    for module in MODULES:
        files[f"tests/test_{module}.py"] = _visible_test(module, pkg, visible[module])
    files["tests/__init__.py"] = ""
    files["run_tests.py"] = RUNNER
    files["README.md"] = (
        f"# {pkg}\n\nSmall helper functions in `{pkg}/`. Run the tests with "
        "`python run_tests.py`.\n"
    )
    wrong = next(t for t in hidden if t.function == buggy.name and _reveals(broken, t))
    ok, got = _outcome(_compile(broken, buggy.name), wrong.args)
    call = f"{pkg}.{wrong.module}.{wrong.function}({', '.join(map(_literal, wrong.args))})"
    seen = f"returns {got!r}" if ok else f"raises {got}"
    issue = (
        f"Bug report for the `{pkg}` package: `{call}` {seen}, but it should return "
        f"{wrong.expected!r}. Find and fix the bug. You may change only the package's source "
        f"files ({', '.join(sorted(p for p in files if p.startswith(pkg + '/')))}); "
        "`python run_tests.py` runs the tests. When you are done, answer without a tool call."
    )
    allowed = tuple(sorted(p for p in files if p.startswith(pkg + "/")))
    return SweRepo(files, allowed, tuple(hidden), fix, bug, issue)


def _reveals(broken: str, t: HiddenTest) -> bool:
    return _outcome(_compile(broken, t.function), t.args) != (True, t.expected)


def _split_visible(cases: list, bad: Callable | None) -> tuple[list, list]:
    """(visible, hidden) cases: VISIBLE_CASES visible, one of them revealing the bug when there
    is one; the hidden ones reveal it too (the visible case is repeated there when it is the
    only one, as for the empty list of `mean`)."""
    if bad is None:
        return cases[:VISIBLE_CASES], cases[VISIBLE_CASES:]
    revealing = [c for c in cases if _outcome(bad, c[0]) != (True, c[1])]
    first = revealing[0]
    rest = [c for c in cases if c is not first]
    visible, hidden = [first, *rest[: VISIBLE_CASES - 1]], rest[VISIBLE_CASES - 1 :]
    if len(revealing) == 1:
        hidden.append(first)
    return visible, hidden


def hidden_to_json(tests: Sequence[HiddenTest]) -> list[dict[str, Any]]:
    """The hidden tests as JSON-serialisable records (arguments as lists)."""
    return [dataclasses.asdict(t) | {"args": list(t.args)} for t in tests]


def hidden_from_json(rows: Sequence[Mapping[str, Any]]) -> tuple[HiddenTest, ...]:
    """The inverse of `hidden_to_json`."""
    return tuple(
        HiddenTest(r["module"], r["function"], tuple(r["args"]), r["expected"]) for r in rows
    )


def swe_example(seed: int, index: int) -> Example:
    """The repository as an `Example`: the issue is the prompt; the repository, the allowed
    paths, the hidden tests and the fix are in `hidden` (no template renders it)."""
    repo = swe_repo(seed, index)
    bug = repo.bug
    return Example(
        id=f"{NAME}/{seed}/{index}",
        prompt_text=repo.issue,
        answer=f"{bug['kind']} in {repo.package}/{bug['module']}.py::{bug['function']}",
        source=NAME,
        meta={"seed": seed, "index": index, "bug_kind": bug["kind"]},
        hidden={
            "files": dict(repo.files),
            "allowed": list(repo.allowed),
            "hidden_tests": hidden_to_json(repo.hidden_tests),
            "fix": dict(repo.fix),
            "repo_hash": repo_hash(repo.files),
        },
    )


def swe_examples(num: int, seed: int) -> list[Example]:
    """`num` generated repositories (`swe_example(seed, i)` for i < num)."""
    if num < 1:
        raise ValueError(f"num={num} must be positive")
    return [swe_example(seed, i) for i in range(num)]


def example_json(example: Example) -> str:
    """A stable JSON text of an example (for comparing two generations)."""
    return json.dumps(example.to_json(), sort_keys=True)
