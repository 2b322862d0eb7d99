"""Hidden unit tests: right and wrong solutions score as they should; cheaters score 0.

Every test runs for each sandbox backend ("bwrap" skips with the reason where it is missing).
Each cheating candidate's function is wrong (or missing), so it could only score by the cheat.
"""

import secrets

import pytest

from rlvr_jax.rewards import code_tests, sandbox
from rlvr_jax.rewards.sandbox import SandboxLimits

# Random per run: no file on the host holds it (not this file, nor a clone of the repository,
# wherever it lives), so only a leak of this run's tests could show it to a candidate.
MARKER = f"hidden_marker_{secrets.token_hex(8)}"
TESTS = [
    f"# {MARKER}\nassert add(1, 2) == 3",
    "assert add(-1, 1) == 0",
    "assert add(-2, 1) == -1",
    "assert add(10, 5) == 15",
]


def _backend_param(name):
    reason = sandbox.bwrap_unavailable_reason() if name == "bwrap" else None
    return pytest.param(name, marks=pytest.mark.skipif(reason is not None, reason=str(reason)))


BACKENDS = [_backend_param("bwrap"), _backend_param("rlimits")]


def _score(solution, backend, tests=TESTS, **kwargs):
    kwargs.setdefault("per_test_seconds", 2.0)
    return code_tests.run_tests(solution, tests, ["add"], backend=backend, **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_correct_solution_passes(backend):
    ok, fraction, detail = _score("def add(a, b):\n    return a + b\n", backend)
    assert (ok, fraction) == (True, 1.0)
    assert detail.passed == (True,) * 4 and detail.errors == ("",) * 4
    assert detail.tester.backend == detail.candidate.backend == backend


@pytest.mark.parametrize("backend", BACKENDS)
def test_wrong_solution_gets_its_fraction(backend):
    wrong_for_negatives = "def add(a, b):\n    return a + b if a > 0 else 0\n"
    ok, fraction, detail = _score(wrong_for_negatives, backend)
    assert (ok, fraction) == (False, 0.75)
    assert detail.passed == (True, True, False, True)
    assert detail.errors[2].startswith("AssertionError")


@pytest.mark.parametrize("backend", BACKENDS)
def test_humaneval_style_check_function(backend):
    test = "def check(candidate):\n    assert candidate([3, 1, 2]) == [1, 2, 3]\n"
    tests = code_tests.humaneval_tests(test, "sort_list")
    good = code_tests.run_tests(
        "def sort_list(x):\n    return sorted(x)", tests, ["sort_list"], backend=backend
    )
    bad = code_tests.run_tests(
        "def sort_list(x):\n    return x", tests, ["sort_list"], backend=backend
    )
    assert (good.all_passed, bad.all_passed) == (True, False)


@pytest.mark.parametrize(
    "solution",
    [
        "def add(a, b) return a + b",  # a syntax error
        "raise SystemExit(0)\ndef add(a, b):\n    return a + b",  # exits before defining it
        "def plus(a, b):\n    return a + b",  # the wrong name
        "def add(a, b):\n    return object()",  # a value that is not plain data
        "def add(a, b):\n    return 'x' * (1 << 24)",  # an answer larger than the output cap
    ],
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_broken_solutions_score_zero(backend, solution):
    ok, fraction, _ = _score(solution, backend)
    assert (ok, fraction) == (False, 0.0)


# Each cheat below prepends a wrong `add`; a cheat that worked would make it score above 0.
FAKE_PASS_LINES = """
import sys
print("ALL PASSED")
for nonce in ("", "0" * 32, "PASS"):
    for i in range(10):
        print(nonce, i, "pass", '""', flush=True)
        sys.stderr.write(f"{nonce} {i} pass \\"\\"\\n")
def add(a, b):
    return None
"""

EXIT_AT_IMPORT = """
import os
print("ALL PASSED", flush=True)
os._exit(0)
def add(a, b):
    return a + b
"""

PATCHED_BUILTINS = """
import builtins, json, ast, sys
class Equal:
    def __eq__(self, other):
        return True
builtins.AssertionError = type("Never", (Exception,), {})
builtins.print = lambda *a, **k: None
json.dumps = lambda *a, **k: '{"id": 1, "value": "7"}'
ast.literal_eval = lambda text: Equal()
sys.excepthook = lambda *a: None
def add(a, b):
    return Equal()
"""


def _reads_the_tests(*extra_places: str) -> str:
    """A candidate that looks for the hidden tests (by the marker only they contain) where this
    run could have leaked them: its directory, /tmp, /dev/shm, `extra_places`, and the command
    lines, environments and open files of every process it can see; it answers right only if
    it found them."""
    return _READS_THE_TESTS.replace("EXTRA_PLACES", repr(list(extra_places)))


_READS_THE_TESTS = f"""
import os
def _found():
    marker = ({MARKER[:8]!r} + {MARKER[8:]!r}).encode()  # Not in its own source as one string.
    places = [os.getcwd(), "/tmp", "/scratch", "/dev/shm"] + EXTRA_PLACES
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            places += ["/proc/%s/cmdline" % pid, "/proc/%s/environ" % pid, "/proc/%s/fd" % pid]
    for place in places:
        paths = [place]
        if os.path.isdir(place):
            paths = []
            for root, _, names in os.walk(place):
                paths += [os.path.join(root, n) for n in names]
                if len(paths) > 2000:
                    break
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                try:
                    if marker in os.read(fd, 1 << 20):
                        return True
                finally:
                    os.close(fd)
            except OSError:
                pass
    return False
FOUND = _found()
def add(a, b):
    return a + b if FOUND else None
"""

# Finds the tester by its command line, looks in its memory for the nonce (any 32 hex digits)
# and writes result lines with each candidate nonce into the tester's stdout.
WRITES_THE_VERDICT = """
import os, re
def tokens(pid):
    found = set()
    try:
        with open("/proc/%s/maps" % pid) as maps, open("/proc/%s/mem" % pid, "rb") as mem:
            for line in maps:
                span, perms = line.split()[:2]
                if not perms.startswith("rw"):
                    continue
                low, high = (int(x, 16) for x in span.split("-"))
                try:
                    mem.seek(low)
                    found.update(re.findall(rb"[0-9a-f]{32}", mem.read(min(high - low, 1 << 24))))
                except OSError:
                    pass
    except OSError:
        pass
    return list(found)[:500] + [b""]
for pid in os.listdir("/proc"):
    try:
        with open("/proc/%s/cmdline" % pid, "rb") as f:
            if b"__hidden_test__" not in f.read() or int(pid) == os.getpid():
                continue
        lines = b"".join(b"%s %d pass \\"\\"\\n" % (t, i) for t in tokens(pid) for i in range(4))
        fd = os.open("/proc/%s/fd/1" % pid, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, lines)
        os.close(fd)
        print("wrote into", pid)
    except OSError:
        pass
open("verdict.txt", "w").write("0 pass\\n1 pass\\n")
def add(a, b):
    return None
"""

HANGS_AT_IMPORT = "while True:\n    pass\ndef add(a, b):\n    return a + b\n"


@pytest.mark.parametrize(
    "cheat",
    [FAKE_PASS_LINES, EXIT_AT_IMPORT, PATCHED_BUILTINS, _reads_the_tests(), WRITES_THE_VERDICT],
    ids=["fake_pass_lines", "exit_at_import", "patched_builtins", "reads_tests", "writes_verdict"],
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_cheating_candidates_score_zero(backend, cheat):
    ok, fraction, detail = _score(cheat, backend)
    assert (ok, fraction) == (False, 0.0), detail
    assert detail.passed == (False,) * len(TESTS)


# The tests leaked into the candidate's own directory (a file it writes with the marker, which its
# source holds only in two pieces): what the search finds wherever it can read them.
LEAKED = f"open('leaked_tests.py', 'w').write({MARKER[:8]!r} + {MARKER[8:]!r})\n"


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_reading_cheat_scores_where_the_tests_leaked(backend):
    # So the reading cheat's 0 above says that the tests did not leak to where it looked, not
    # that its search could not have found them.
    ok, fraction, detail = _score(LEAKED + _reads_the_tests(), backend)
    assert (ok, fraction) == (True, 1.0), detail


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_hanging_candidate_costs_one_test_deadline(backend):
    limits = SandboxLimits(wall_seconds=20)
    ok, fraction, detail = _score(HANGS_AT_IMPORT, backend, limits=limits, per_test_seconds=1.0)
    assert (ok, fraction) == (False, 0.0)
    assert "no answer" in detail.errors[0]
    assert all("gone" in e for e in detail.errors[1:])
    assert detail.tester.wall_seconds < limits.wall_seconds


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"tests": []}, "tests=\\[\\]"),
        ({"tests": "assert True"}, "tests='assert True'"),
        ({"function_names": ["len"]}, "'len' shadows a builtin"),
        ({"function_names": ["not a name"]}, "'not a name'"),
        ({"per_test_seconds": 0}, "per_test_seconds=0"),
        ({"solution": b"def add(): pass"}, "solution=b"),
        ({"backend": "docker"}, "backend='docker'"),
        ({"backend": "auto"}, "backend='auto'"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, named):
    arguments = {"solution": "", "tests": TESTS, "function_names": ["add"], **kwargs}
    with pytest.raises(ValueError, match=named):
        code_tests.run_tests(**arguments)
