"""The software-engineering environment's pieces: the workspace, its tools' checks, the scorer.

Host code. A `Workspace` is one episode's copy of a generated repository (`data.swe_repos`),
held by the host as path -> text. The agent changes it only through the edit and write tools,
and only in the allowed files (the package's source); `run_command` runs a command in a fresh
sandbox scratch directory holding a copy of the workspace, and whatever the command writes
there is deleted with it. So the patch an episode ends with is exactly the allowed files that
differ from the pristine repository.

`score_patch` runs the hidden tests: a fresh copy of the pristine repository with the patch's
files applied, in its own sandbox, a driver that calls each test's function with literal
arguments (sent on stdin, never written to disk) and prints the `repr` of each value; the
expected values never leave the host, which compares them. A patch that prints fake results
would have to know the right values, which is to say fix the bug.

`probe_reasons` and `tamper_reasons` are heuristics that count suspicious actions (reading
/proc or the environment, paths outside the repository, touching tests or the evaluator's
hooks); they label, the sandbox and the tools' checks are what block.
"""

from __future__ import annotations

import ast
import json
import math
import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from rlvr_jax.data import swe_repos
from rlvr_jax.envs.environment import ToolCallError
from rlvr_jax.rewards import sandbox

# Files whose presence changes how Python or a test runner starts: never allowed.
EVALUATOR_HOOKS = ("conftest.py", "sitecustomize.py", "usercustomize.py", "pytest.ini", "setup.cfg")
_PROBE_WORDS = re.compile(
    r"\b(environ|getenv|printenv|socket|urllib|http\.client|requests|ctypes|subprocess|"
    r"os\.system|proc/self)\b"
)
_PROBE_COMMANDS = {"env", "printenv", "set", "id", "whoami", "ps", "mount", "ip", "curl", "wget"}
_ABSOLUTE = re.compile(r"(^|[\s'\"=(,:])[/~]")
_PARENT = re.compile(r"(^|[/\s'\"=(,:])\.\.($|[/\s'\"),])")
_WRITES = re.compile(r"\b(rm|mv|cp|sed|truncate|tee|unlink|remove|write_text|open)\b|>")
_DRIVER = r"""
import importlib, json, sys
sys.path.insert(0, ".")
out = sys.stdout
calls = json.loads(sys.stdin.read())
for i, (module, function, args) in enumerate(calls):
    try:
        value = getattr(importlib.import_module(module), function)(*args)
        line = json.dumps({"i": i, "value": repr(value)})
    except BaseException as e:
        line = json.dumps({"i": i, "error": type(e).__name__})
    out.write(line + "\n")
    out.flush()
"""


def repo_path(path: Any) -> str:
    """A path relative to the repository root, normalised; `ToolCallError` for anything that
    leaves it (absolute, `..`, `~`) or is not a string."""
    if not isinstance(path, str):
        raise ToolCallError('"path" must be a string')
    if path.startswith(("/", "~")) or "\\" in path or "\0" in path:
        raise ToolCallError(f"{path!r} is outside the repository: use a relative path")
    norm = posixpath.normpath(path.strip() or ".")
    if norm == ".." or norm.startswith("../"):
        raise ToolCallError(f"{path!r} is outside the repository")
    return "" if norm == "." else norm


def is_test_file(path: str) -> bool:
    """A visible test, the test runner, or a file that hooks into how tests run."""
    name = posixpath.basename(path)
    return (
        path.startswith("tests/")
        or name.startswith("test_")
        or name == "run_tests.py"
        or name in EVALUATOR_HOOKS
        or name.endswith(".pth")
    )


def probe_reasons(text: str) -> bool:
    """Whether a command or path looks at the host: absolute or parent paths, /proc, the
    environment variables, the network."""
    words = text.split()
    return bool(
        _ABSOLUTE.search(text)
        or _PARENT.search(text)
        or _PROBE_WORDS.search(text)
        or (words and words[0] in _PROBE_COMMANDS)
    )


def tamper_reasons(command: str) -> bool:
    """Whether a command looks like it changes tests or evaluator hooks."""
    mentions = "test" in command or any(h.split(".")[0] in command for h in EVALUATOR_HOOKS)
    return (mentions and bool(_WRITES.search(command))) or ".pth" in command


def command_argv(command: Any) -> str | list[str]:
    """A command line as the sandbox takes it: Python source for `python ...` (the sandbox's
    interpreter, `FILE`, `-m MODULE` or `-c CODE`, with arguments), else an argv list (no
    shell: no pipes, redirections or variables).

    Raises:
      ToolCallError: for an empty or unparsable command.
    """
    if not isinstance(command, str) or not command.strip():
        raise ToolCallError('"command" must be a non-empty string')
    try:
        words = shlex.split(command)
    except ValueError as e:
        raise ToolCallError(f"cannot parse the command: {e}") from None
    if words[0] not in ("python", "python3"):
        return words
    rest = words[1:]
    while rest and rest[0] in ("-u", "-B", "-I", "-S", "-E"):
        rest.pop(0)
    if not rest:
        raise ToolCallError("python needs a file, -m MODULE or -c CODE (no interactive shell)")
    if rest[0] == "-c" and len(rest) > 1:
        run = f"exec(compile({rest[1]!r}, '<string>', 'exec'), {{'__name__': '__main__'}})"
        argv = ["-c", *rest[2:]]
    elif rest[0] == "-m" and len(rest) > 1:
        run = f"runpy.run_module({rest[1]!r}, run_name='__main__', alter_sys=True)"
        argv = [rest[1], *rest[2:]]
    elif not rest[0].startswith("-"):
        run = f"runpy.run_path({rest[0]!r}, run_name='__main__')"
        argv = rest
    else:
        raise ToolCallError(f"unsupported python option {rest[0]!r}")
    return f"import runpy, sys\nsys.path.insert(0, '.')\nsys.argv = {argv!r}\n{run}\n"


def run_command(
    command: Any,
    files: Mapping[str, str],
    limits: sandbox.SandboxLimits,
    backend: str,
    max_chars: int,
) -> tuple[str, bool]:
    """Runs a command on a throwaway copy of `files`: (its output and exit status, failed).

    Failed means a limit killed it; a non-zero exit (failing tests) is an answer, not a tool
    error."""
    argv = command_argv(command)
    r = sandbox.run(argv, files=dict(files), limits=limits, backend=backend)
    out = r.stdout.decode("utf-8", "replace") + r.stderr.decode("utf-8", "replace")
    failed = r.killed_reason is not None
    if len(out) > max_chars:
        out = out[:max_chars] + f"\n[output cut at {max_chars} characters]"
    status = r.killed_reason or f"exit status {r.returncode}"
    return f"{out.rstrip()}\n[{status}]".lstrip(), failed


def _close(got: Any, expected: Any) -> bool:
    if isinstance(expected, float):
        return (
            isinstance(got, (int, float))
            and not isinstance(got, bool)
            and math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9)
        )
    return type(got) is type(expected) and got == expected


def score_patch(
    pristine: Mapping[str, str],
    patch: Mapping[str, str],
    tests: Sequence[swe_repos.HiddenTest],
    package: str,
    limits: sandbox.SandboxLimits,
    backend: str,
) -> list[bool]:
    """Which hidden tests pass on `pristine` with the files of `patch` applied.

    Only the patch's files replace the pristine ones, so nothing else an episode did (an edited
    test, a conftest.py) is in the copy; the tests are data sent on stdin; the expected values
    are compared here, on the host.
    """
    files = {**pristine, **patch}
    calls = [[f"{package}.{t.module}", t.function, list(t.args)] for t in tests]
    r = sandbox.run(
        _DRIVER, files=files, stdin=json.dumps(calls).encode(), limits=limits, backend=backend
    )
    results: dict[int, Any] = {}
    for line in r.stdout.decode("utf-8", "replace").splitlines():
        try:
            row = json.loads(line)
            i = int(row["i"]) if isinstance(row, dict) else -1
        except (ValueError, KeyError, TypeError, RecursionError):
            continue
        if 0 <= i < len(tests):
            results[i] = row  # the driver's own line for a test comes after the call
    passed = []
    for i, t in enumerate(tests):
        row = results.get(i, {})
        try:
            ok = "value" in row and _close(ast.literal_eval(row["value"]), t.expected)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            ok = False
        passed.append(ok)
    return passed
