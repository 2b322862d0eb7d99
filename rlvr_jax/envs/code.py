"""Code synthesis against hidden unit tests (HumanEval-style), verified in the code sandbox.

Host code. `CodeTestsTask` (`reward.verifier="code_tests"`) turns each response into a program
(`extract_solution`), runs the problem's hidden tests against it with `rewards.code_tests`
(the program in one sandbox, the tests in another, both in `reward.sandbox_backend`; see
docs/sandbox.md), and returns the parts "correct" (every test passed) and "tests_passed" (the
fraction). The rows of a batch are checked concurrently by a thread pool of `reward.workers`
threads: each check waits on sandbox subprocesses, so threads suffice and the trainer process
never runs model-written code.

Anything that goes wrong (no code, a syntax error, a crash, a hang, a sandbox that would not
start) scores 0 and is counted in `stats()`; `score` never raises for what a response does.

The extraction rule, in order:
1. A fenced block (```python, ```py or a bare ```; an unclosed last block counts, for responses
   cut at the length limit): the first that defines the entry point at column 0, else the first.
   A block that defines the entry point is appended to the problem's prompt, so the prompt's
   imports and helper functions stay available and the block's definition replaces the stub; a
   block that does not is taken as the function's body and appended to the prompt.
2. No fence, but a line `def <entry_point>(` at column 0: the response is a whole program,
   appended to the prompt the same way.
3. Otherwise HumanEval's completion format: the response continues the prompt's function, up to
   the first non-blank line at column 0 (where the body ends; HumanEval's own stop sequences
   "\\ndef", "\\nclass", "\\nif", "\\nprint", "\\n#" cut at the same places).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import re
import threading
import time
from collections.abc import Sequence

import numpy as np
from absl import logging

from rlvr_jax.config_types import ConfigError
from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.task import Task, response_texts
from rlvr_jax.rewards import code_tests, sandbox
from rlvr_jax.rewards.config import RewardSettings
from rlvr_jax.types import Rollout

# A fenced block: its language tag (python, py, python3 or none) and body; an unclosed last block
# runs to the end of the text.
_FENCE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)(?:\n[ \t]*```|\Z)", re.DOTALL)
# The end of a function body: a non-blank line that starts at column 0.
_BODY_END = re.compile(r"\n(?=\S)")


def _defines(code: str, entry_point: str) -> bool:
    return (
        re.search(rf"(?m)^(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(", code)
        is not None
    )


def extract_solution(response: str, prompt: str, entry_point: str) -> str:
    """The program a response gives for a problem (the rule is in the module docstring).

    Args:
      response: the model's text.
      prompt: the problem's prompt (imports, signature, docstring), as the model saw it.
      entry_point: the function the tests call.

    Returns:
      Python source: the prompt followed by the response's code.
    """
    blocks = [m.group(2) for m in _FENCE.finditer(response)]
    if blocks:
        whole = [b for b in blocks if _defines(b, entry_point)]
        if whole:
            return f"{prompt}\n\n{whole[0]}\n"
        return prompt + blocks[0] + "\n"
    if _defines(response, entry_point):
        return f"{prompt}\n\n{response}\n"
    return prompt + _BODY_END.split(response, maxsplit=1)[0].rstrip() + "\n"


def hidden_tests(example: Example) -> tuple[list[str], str]:
    """(test sources, entry point) of a code problem, from its `hidden` data.

    `hidden` holds "entry_point" and either "test" (HumanEval: code that defines
    `check(candidate)`, one test) or "tests" (a list of sources, e.g. MBPP's asserts, each a
    test). The prompt's helper code ("helpers") runs in the tester ahead of each test, so tests
    that use the prompt's helpers (HumanEval/32's `poly`, /38's `encode_cyclic`) read the
    dataset's version of them, not the program's.

    Raises:
      KeyError: when the example carries no hidden tests.
    """
    hidden = example.hidden
    entry = hidden["entry_point"]
    helpers = hidden.get("helpers", "")
    if "tests" in hidden:
        tests = list(hidden["tests"])
    else:
        tests = code_tests.humaneval_tests(hidden["test"], entry)
    return [f"{helpers}\n\n{t}" if helpers else t for t in tests], entry


@dataclasses.dataclass
class CodeStats:
    """Counters since the task started.

    Attributes:
      checks: responses checked.
      passed: responses that passed every test.
      timeouts: a test's calls past the deadline, or a sandbox past its wall time.
      crashes: the program did not load, exited, or was killed by a memory, process or output
        limit.
      sandbox_errors: the check itself failed (a sandbox that would not start, a tester with no
        verdict).
      seconds: wall time spent inside `score`.
    """

    checks: int = 0
    passed: int = 0
    timeouts: int = 0
    crashes: int = 0
    sandbox_errors: int = 0
    seconds: float = 0.0


def _outcome(result: code_tests.CodeTestsResult) -> str:
    """The check's end: "passed", "failed", "timeout", "crash" or "sandbox_error"."""
    if result.all_passed:
        return "passed"
    detail = result.detail
    errors = " ".join(detail.errors)
    killed = {detail.candidate.killed_reason, detail.tester.killed_reason}
    if "no answer within the time" in errors or killed & {"wall_time", "cpu_time"}:
        return "timeout"
    if (
        "CandidateGone" in errors
        or killed & {"memory", "processes", "output"}
        or b"did not load" in detail.candidate.stderr
    ):
        return "crash"
    if "no result" in detail.errors:
        return "sandbox_error"
    return "failed"


class CodeTestsTask(Task):
    """A program checked against the problem's hidden unit tests in the sandbox: parts "correct"
    (all tests pass) and "tests_passed" (the fraction)."""

    name = "code_tests"

    def __init__(
        self,
        tok: Tokenizer,
        reward: RewardSettings,
        limits: sandbox.SandboxLimits | None = None,
    ):
        """Args:
        tok: decodes the responses.
        reward: `workers` (checks at once), `deadline_s` (each test's time) and
          `sandbox_backend` (where the programs and the tests run).
        limits: the program's sandbox limits; by default `deadline_s` bounds the CPU time and
          twice it plus 5 s the wall time of a whole check.
        """
        self.tok = tok
        self.per_test_seconds = reward.deadline_s
        self.limits = limits or sandbox.SandboxLimits(
            cpu_seconds=max(1, math.ceil(reward.deadline_s)),
            wall_seconds=2 * reward.deadline_s + 5.0,
        )
        self.sandbox_backend = reward.sandbox_backend
        self.counts = CodeStats()
        self._lock = threading.Lock()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=reward.workers, thread_name_prefix="code-tests"
        )

    @classmethod
    def build(
        cls, tok: Tokenizer, reward: RewardSettings, examples: Sequence[Example]
    ) -> CodeTestsTask:
        """The task for `examples`, which must all carry hidden tests.

        Raises:
          ConfigError: naming the first example without them.
        """
        bad = next(
            (
                ex
                for ex in examples
                if "entry_point" not in ex.hidden or not {"test", "tests"} & set(ex.hidden)
            ),
            None,
        )
        if bad is not None:
            raise ConfigError(
                f"reward.verifier='code_tests' needs examples with hidden tests; {bad.id!r} has "
                "none (use data.name='humaneval')"
            )
        return cls(tok, reward)

    def check(self, response: str, example: Example) -> tuple[float, float]:
        """(correct, fraction of tests passed) of one response; never raises."""
        try:
            tests, entry = hidden_tests(example)
            solution = extract_solution(response, example.prompt_text, entry)
            result = code_tests.run_tests(
                solution,
                tests,
                [entry],
                limits=self.limits,
                per_test_seconds=self.per_test_seconds,
                backend=self.sandbox_backend,
            )
            outcome = _outcome(result)
            fraction = float(result.fraction_passed)
        except Exception as e:  # A check that cannot run scores 0; the run goes on.
            logging.warning(
                "code_tests: the check of %s failed: %s: %s", example.id, type(e).__name__, e
            )
            outcome, fraction = "sandbox_error", 0.0
        with self._lock:
            self.counts.checks += 1
            if outcome == "passed":
                self.counts.passed += 1
            elif outcome == "timeout":
                self.counts.timeouts += 1
            elif outcome == "crash":
                self.counts.crashes += 1
            elif outcome == "sandbox_error":
                self.counts.sandbox_errors += 1
        return float(outcome == "passed"), fraction

    def part_names(self) -> tuple[str, ...]:
        return ("correct", "tests_passed")

    def score(self, rollout: Rollout, examples_N: Sequence[Example]) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        texts = response_texts(self.tok, rollout)
        futures = [
            self._executor.submit(self.check, text, ex)
            for text, ex in zip(texts, examples_N, strict=True)
        ]
        results = [f.result() for f in futures]
        with self._lock:
            self.counts.seconds += time.perf_counter() - start
        return {
            "correct": np.asarray([r[0] for r in results], np.float32),
            "tests_passed": np.asarray([r[1] for r in results], np.float32),
        }

    def stats(self) -> dict[str, float]:
        with self._lock:
            counts = dataclasses.asdict(self.counts)
        out = {f"verifier/{k}": float(v) for k, v in counts.items()}
        seconds = counts["seconds"]
        out["verifier/checks_per_s"] = counts["checks"] / seconds if seconds > 0 else 0.0
        return out

    def close(self) -> None:
        self._executor.shutdown(wait=True)
