"""Hidden unit tests for a model-written Python solution, with a verdict the solution cannot forge.

Host code, standard library only. `run_tests(solution, tests, function_names)` returns
`(all_passed, fraction_passed, detail)`; it is what a HumanEval/MBPP-style verifier calls. It never
raises for anything the solution does; bad arguments from the framework raise `ValueError`.

The design: the candidate and the tests never share a process or a sandbox.

* The candidate runs in one sandbox (`rlvr_jax.rewards.sandbox`), as a small server: it waits for
  the first call, only then executes `solution.py`, and answers each call `f(*args, **kwargs)` with
  `repr(result)` over a pipe.
* The hidden tests run in a second sandbox, the tester, which receives them on stdin (they never
  touch a disk). There each name in `function_names` is bound to a proxy that sends the call's
  arguments (as `repr`) to the candidate and turns the answer back into a value with
  `ast.literal_eval`: only plain data (numbers, strings, bytes, tuples, lists, dicts, sets,
  booleans, None) crosses, never code or objects with their own `__eq__`. The tests' own asserts
  and comparisons run in the tester, on those values.
* The tester prints one line per test, `<nonce> <index> pass|fail <error>`, where the nonce is a
  random token of this run known only to the host and the tester; the host counts only those
  lines of the tester's stdout, the first per index, and a test without one failed.

So the verdict is computed where the candidate cannot reach. Printing "ALL PASSED" or a fake
result line goes to the candidate's own stdout, which is never read for the verdict; `os._exit(0)`
at import, a crash or a hang only makes the proxies fail (a call that gets no answer within
`per_test_seconds` fails its test, and every later call fails at once); patching builtins,
`assert` or the test runner changes the candidate's interpreter, not the tester's; the tests were
never in the candidate's sandbox to read, and there is no verdict file to write. The tester marks
itself non-dumpable (`PR_SET_DUMPABLE` 0), so under the weaker "rlimits" backend another process
of the same user cannot read its memory or open its pipes through /proc either; the candidate runs
no code of its own before the tester has read its tests. Under "rlimits" the candidate can still
read any file of its user on the host (see the sandbox's docstring), the dataset the tests came
from included, so the tests are hidden only under "bwrap": train on code tasks with bwrap.

Limits of the method: tests must call the functions with arguments that `repr` writes and
`ast.literal_eval` reads back (true of HumanEval and MBPP asserts), results are compared by value
(an argument the function mutates in place is not seen by the test), float NaN and infinities do
not cross, and helper functions the tests call from the solution run in the candidate too.

Usage:

    ok, fraction, detail = run_tests(
        completion, ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"], ["add"]
    )
    # HumanEval: one test, the problem's `check` applied to its entry point.
    ok, fraction, detail = run_tests(prompt + completion, humaneval_tests(test, entry), [entry])
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import keyword
import math
import os
import secrets
import threading
from collections.abc import Sequence
from typing import NamedTuple

from rlvr_jax.rewards import sandbox
from rlvr_jax.rewards.sandbox import SandboxLimits, SandboxResult

_MAX_ERROR_CHARS = 300

# The candidate's server. It runs nothing of the solution before the first call arrives.
_CANDIDATE = r"""
import ast, json, os
calls = os.fdopen(CALLS_FD, "rb")
def answer(line, namespace):
    request = json.loads(line)
    try:
        function = namespace[request["name"]]
        args = ast.literal_eval(request["args"])
        kwargs = ast.literal_eval(request["kwargs"])
        reply = {"id": request["id"], "value": repr(function(*args, **kwargs))}
    except BaseException as e:
        reply = {"id": request["id"], "error": "%s: %s" % (type(e).__name__, e)}
    data = (json.dumps(reply) + "\n").encode()
    while data:
        data = data[os.write(REPLIES_FD, data):]
line = calls.readline()
namespace = {"__name__": "solution"}
try:
    with open("solution.py") as f:
        exec(compile(f.read(), "solution.py", "exec"), namespace)
except BaseException as e:
    namespace = {}  # Every call then fails with KeyError.
    os.write(2, ("solution.py did not load: %s: %s\n" % (type(e).__name__, e)).encode())
while line:
    answer(line, namespace)
    line = calls.readline()
"""

# The tester. Trusted code: it runs the hidden tests against proxies of the candidate's functions.
_TESTER = r"""
import ast, json, os, select, sys, time
try:
    import ctypes
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no /proc access to this process.
except Exception:
    pass
spec = json.loads(sys.stdin.read())
nonce, calls_fd, replies_fd = spec["nonce"], spec["calls_fd"], spec["replies_fd"]
state = {"alive": True, "id": 0, "buffer": b"", "deadline": 0.0}

class CandidateGone(Exception):
    pass

def wait_for(fd, for_write):
    left = state["deadline"] - time.monotonic()
    ready = select.select([], [fd], [], max(left, 0)) if for_write else select.select(
        [fd], [], [], max(left, 0))
    if not (ready[1] if for_write else ready[0]):
        state["alive"] = False
        raise CandidateGone("no answer within the time of this test")

def send(data):
    while data:
        wait_for(calls_fd, True)
        try:
            data = data[os.write(calls_fd, data):]
        except OSError:
            state["alive"] = False
            raise CandidateGone("the candidate exited")

def receive_line():
    while b"\n" not in state["buffer"]:
        wait_for(replies_fd, False)
        chunk = os.read(replies_fd, 65536)
        if not chunk or len(state["buffer"]) > spec["max_reply_bytes"]:
            state["alive"] = False
            raise CandidateGone("the candidate exited or answered too much")
        state["buffer"] += chunk
    line, state["buffer"] = state["buffer"].split(b"\n", 1)
    return json.loads(line)

class Remote:
    def __init__(self, name):
        self.name = name
    def __call__(self, *args, **kwargs):
        if not state["alive"]:
            raise CandidateGone("the candidate is gone")
        state["id"] += 1
        request = {"id": state["id"], "name": self.name, "args": repr(args), "kwargs": repr(kwargs)}
        send((json.dumps(request) + "\n").encode())
        reply = receive_line()
        while reply.get("id") != state["id"]:
            reply = receive_line()
        if "value" not in reply:
            raise RuntimeError(str(reply.get("error"))[:300])
        return ast.literal_eval(str(reply["value"]))

for index, source in enumerate(spec["tests"]):
    state["deadline"] = time.monotonic() + spec["per_test_seconds"]
    namespace = {"__name__": "__hidden_test__"}
    namespace.update({name: Remote(name) for name in spec["function_names"]})
    try:
        exec(compile(source, "<test %d>" % index, "exec"), namespace)
        verdict, error = "pass", ""
    except BaseException as e:
        verdict, error = "fail", ("%s: %s" % (type(e).__name__, e))[:300]
    print(nonce, index, verdict, json.dumps(error), flush=True)
"""


@dataclasses.dataclass(frozen=True)
class CodeTestsDetail:
    """Per-test outcome and the two sandbox runs.

    Attributes:
      passed: one bool per test.
      errors: one message per test ("" when it passed; "no result" when the tester never
        reported it).
      candidate: the candidate's run (its stdout and stderr, its end).
      tester: the tester's run.
    """

    passed: tuple[bool, ...]
    errors: tuple[str, ...]
    candidate: SandboxResult
    tester: SandboxResult


class CodeTestsResult(NamedTuple):
    """`(all_passed, fraction_passed, detail)`."""

    all_passed: bool
    fraction_passed: float
    detail: CodeTestsDetail


def humaneval_tests(test: str, entry_point: str) -> list[str]:
    """A HumanEval problem's `test` (which defines `check(candidate)`) as one hidden test."""
    return [f"{test}\n\ncheck({entry_point})\n"]


def run_tests(
    solution: str,
    tests: Sequence[str],
    function_names: Sequence[str],
    *,
    limits: SandboxLimits | None = None,
    per_test_seconds: float = 5.0,
    backend: str = "bwrap",
) -> CodeTestsResult:
    """Runs the hidden `tests` against `solution`, each in the tester, calls in the candidate.

    Args:
      solution: Python source of the candidate (model-written; untrusted).
      tests: test sources (trusted), each a test; asserts or a call of a checking function.
      function_names: the names the tests call that the solution must define.
      limits: the candidate's sandbox limits (`SandboxLimits()` when None); its wall time also
        bounds the whole run.
      per_test_seconds: wall time of each test's calls to the candidate.
      backend: the sandbox backend: "bwrap", or "rlimits" for trusted code and tests only (the
        candidate can read its user's files on the host, the tests' dataset included).

    Returns:
      CodeTestsResult(all_passed, fraction_passed, detail).

    Raises:
      ValueError: a bad argument, named.
    """
    limits = SandboxLimits() if limits is None else limits
    _check_arguments(solution, tests, function_names, per_test_seconds)
    nonce = secrets.token_hex(16)
    calls_r, calls_w = os.pipe()
    replies_r, replies_w = os.pipe()
    box: dict[str, SandboxResult | Exception] = {}
    stop, started = threading.Event(), threading.Event()
    candidate_code = _CANDIDATE.replace("CALLS_FD", str(calls_r))
    candidate_code = candidate_code.replace("REPLIES_FD", str(replies_w))

    def run_candidate():
        try:
            box["candidate"] = sandbox.run(
                candidate_code,
                files={"solution.py": solution},
                limits=limits,
                backend=backend,
                pass_fds=(calls_r, replies_w),
                stop=stop,
                started=started,
            )
        except Exception as e:  # A bad argument: raised again in the caller's thread below.
            box["candidate"] = e
        finally:
            started.set()

    thread = threading.Thread(target=run_candidate, name="sandbox-candidate", daemon=True)
    thread.start()
    try:
        started.wait()
        # The tester must see end-of-file when the candidate dies: only the candidate may hold
        # the write end of the replies.
        os.close(replies_w)
        os.close(calls_r)
        spec = {
            "nonce": nonce,
            "calls_fd": calls_w,
            "replies_fd": replies_r,
            "tests": list(tests),
            "function_names": list(function_names),
            "per_test_seconds": per_test_seconds,
            "max_reply_bytes": limits.max_output_bytes,
        }
        tester = sandbox.run(
            _TESTER,
            stdin=json.dumps(spec).encode(),
            limits=_tester_limits(limits),
            backend=backend,
            pass_fds=(calls_w, replies_r),
        )
    finally:
        os.close(calls_w)
        os.close(replies_r)
        stop.set()
        thread.join()
    if isinstance(box["candidate"], Exception):
        raise box["candidate"]
    passed, errors = _verdicts(tester.stdout, nonce, len(tests))
    detail = CodeTestsDetail(passed, errors, box["candidate"], tester)
    return CodeTestsResult(all(passed), sum(passed) / len(tests), detail)


def _check_arguments(solution, tests, function_names, per_test_seconds) -> None:
    if not isinstance(solution, str):
        raise ValueError(f"solution={solution!r:.80} is not a string")
    if isinstance(tests, str) or not tests or not all(isinstance(t, str) for t in tests):
        raise ValueError(f"tests={tests!r:.80} is not a non-empty list of strings")
    if isinstance(function_names, str) or not function_names:
        raise ValueError(f"function_names={function_names!r:.80} is not a non-empty list")
    for name in function_names:
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"function name {name!r} is not a Python identifier")
        if hasattr(builtins, name):
            # The candidate would answer for a builtin the tests rely on (len, sorted, ...).
            raise ValueError(f"function name {name!r} shadows a builtin")
    if not isinstance(per_test_seconds, (int, float)) or not math.isfinite(per_test_seconds):
        raise ValueError(f"per_test_seconds={per_test_seconds!r} is not a finite number")
    if per_test_seconds <= 0:
        raise ValueError(f"per_test_seconds={per_test_seconds!r} must be positive")


def _tester_limits(limits: SandboxLimits) -> SandboxLimits:
    return SandboxLimits(
        cpu_seconds=max(1, math.ceil(limits.wall_seconds)),
        wall_seconds=limits.wall_seconds,
        memory_bytes=max(limits.memory_bytes, 1 << 30),
        max_processes=8,
        max_output_bytes=1 << 20,
        max_file_bytes=1 << 20,
    )


def _verdicts(stdout: bytes, nonce: str, count: int) -> tuple[tuple[bool, ...], tuple[str, ...]]:
    """The first `<nonce> <index> pass|fail <json error>` line per index; others are ignored."""
    found: dict[int, tuple[bool, str]] = {}
    for line in stdout.decode(errors="replace").splitlines():
        parts = line.split(" ", 3)
        if len(parts) != 4 or parts[0] != nonce or not parts[1].isdigit():
            continue
        index = int(parts[1])
        if index < count and index not in found and parts[2] in ("pass", "fail"):
            try:
                error = str(json.loads(parts[3]))[:_MAX_ERROR_CHARS]
            except ValueError:
                error = parts[3][:_MAX_ERROR_CHARS]
            found[index] = (parts[2] == "pass", error)
    outcomes = [found.get(i, (False, "no result")) for i in range(count)]
    return tuple(p for p, _ in outcomes), tuple(e for _, e in outcomes)
