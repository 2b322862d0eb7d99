"""Scoring reasoning-gym answers: a reviewed list of scorers, each run where it is safe.

Host code. The `reasoning-gym` package (extra `.[tasks]`) ships a scorer with every task,
`dataset.score_answer(answer, entry) -> float` in [0, 1]. Several of them pass the model's text to
Python's `eval` (or to sympy's `parse_expr`, which calls `eval`), so no scorer runs in the trainer
process: `score` is the function a `pool.VerifierPool` runs (process isolation, a deadline per
item), and `SCORERS` says, for each task this project supports, how its scorer runs there:

* "pool": the scorer only compares strings and numbers (`==`, `Decimal`, `Fraction`, `int`,
  regular expressions, `json.loads`). It runs in the worker with `builtins.eval` and
  `builtins.exec` replaced by a guard that raises, so a scorer that reached them (a package
  upgrade, a code path the review missed) scores 0 as a crash instead of evaluating model text.
* "sandbox": the scorer calls `eval` on text. The scorer's module-level name `eval` is bound, for
  the duration of the call, to `sandboxed_eval`: the text is evaluated by a bare interpreter in
  `rewards.sandbox` (the backend `score` is given, `reward.sandbox_backend`: bubblewrap, or the
  rlimits fallback for trusted tests only) and only the `repr` of the value comes back, read
  with `ast.literal_eval` (plain data, never code). The rest of the scorer, the comparison, runs
  in the worker. What the model can forge this way is the value of its own answer, which it
  could have written directly.

Tasks whose scorer evaluates text with sympy (`puzzle24`, `countdown`, `polynomial_multiplication`,
`simple_integration`, `intermediate_integration`) are not listed: sympy is not importable inside
the sandbox, and their scorer must not run outside it. Tasks not listed are refused when the data
is made (`data.reasoning_gym_tasks`), so a task is only trained on after its scorer was read.

The answer a scorer receives is `extract_answer(response)`: the last `<answer>` block or
`\\boxed{}` (after a closing `</think>` when there is one), as for math, else the whole response
without surrounding white space.

A reasoning-gym score is partial credit for many tasks (a sorted list with one word out of
place, a valid but longer path); `score` returns it unchanged, and the task counts an answer
correct only at 1.0 (`envs.reasoning_gym_task`).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import dataclasses
import functools
import importlib
import json
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from rlvr_jax.rewards import math as math_reward
from rlvr_jax.rewards import sandbox

POOL = "pool"
SANDBOX = "sandbox"

# The reviewed list: task name -> where its scorer runs. Each entry was classified by reading the
# scorer in reasoning-gym 0.1.25 (`score_answer` and the helpers it calls); the comment names
# what the scorer does with the answer. tests/rewards/test_rg_scoring.py fails when a "pool"
# scorer reaches eval or exec, or a "sandbox" scorer's eval does not go through the sandbox.
SCORERS: dict[str, str] = {
    # The default `ProceduralDataset.score_answer`: ==, `in`, length ratio.
    "basic_arithmetic": POOL,
    "base_conversion": POOL,
    "caesar_cipher": POOL,
    "count_bits": POOL,
    "count_primes": POOL,
    "course_schedule": POOL,
    "gcd": POOL,
    "isomorphic_strings": POOL,
    "largest_island": POOL,
    "lcm": POOL,
    "leg_counting": POOL,
    "letter_counting": POOL,
    "maze": POOL,
    "number_filtering": POOL,
    "ransom_note": POOL,
    "rotate_matrix": POOL,
    "simple_equations": POOL,
    "syllogism": POOL,
    "word_sequence_reversal": POOL,
    # Own scorers, strings and numbers only.
    "calendar_arithmetic": POOL,  # weekday names, int(), exp of the relative error
    "chain_sum": POOL,  # utils.compute_decimal_reward: Decimal ==, `in`
    "coin_flip": POOL,  # Fraction(), float tolerance, common prefix
    "decimal_chain_sum": POOL,  # Decimal ==
    "family_relationships": POOL,  # lower-cased ==
    "fraction_simplification": POOL,  # a regular expression and int()
    "letter_jumble": POOL,  # == and word-by-word matches
    "manipulate_matrix": POOL,  # ==, whitespace re-joined, `in`
    "products": POOL,  # utils.compute_decimal_reward
    "shortest_path": POOL,  # == and a walk of the grid by direction words
    "spell_backward": POOL,  # lower-cased ==, per-character matches
    "time_intervals": POOL,  # split and int() of times and day counts
    "word_sorting": POOL,  # re.split and list ==
    # `eval` on text (the answer, or the gold when it is not JSON).
    "binary_matrix": SANDBOX,  # eval(answer) as a list of lists
    "n_queens": SANDBOX,  # eval(answer) as a board
    "number_sorting": SANDBOX,  # eval(gold) when json.loads fails
    "spiral_matrix": SANDBOX,  # eval(answer) as a list
    "string_insertion": SANDBOX,  # eval(answer) as a list of characters
}

# A check for `VerifierPool(..., warmup=WARMUP)`: it imports reasoning-gym in each worker before
# the worker takes items, so the import is not charged to an item's deadline.
WARMUP = ("<answer>0</answer>", "basic_arithmetic", '{"answer": "0", "metadata": {}}', "{}")

# Evaluates the text on stdin and prints the repr of its value (runs inside the sandbox).
_EVALUATOR = "import sys\nsys.stdout.write(repr(eval(sys.stdin.read())))\n"
_EVAL_LIMITS = sandbox.SandboxLimits(
    cpu_seconds=2, wall_seconds=4.0, memory_bytes=256 << 20, max_output_bytes=1 << 16
)
# The literal_eval of a value's repr; deeper structures are refused (the parser recurses).
_MAX_REPR_CHARS = 1 << 16


class EvalRefusedError(RuntimeError):
    """A scorer reached `eval` or `exec` where it must not."""


def extract_answer(response: str) -> str:
    """The answer a scorer receives (see the module docstring)."""
    found = math_reward.extract_answer(response)
    return found if found is not None else response.strip()


def sandboxed_eval(
    source: Any, globals_: Any = None, locals_: Any = None, *, backend: str = "bwrap"
) -> Any:
    """`eval(source)` inside the sandbox (`backend`); the value comes back as plain data.

    Raises:
      EvalRefusedError: for a call with namespaces (no listed scorer makes one).
      ValueError: when the evaluation failed, ran out of time, or its value is not plain data
        (what a scorer's `except` clause takes for an unparseable answer); also where the
        sandbox cannot start (`sandbox.SandboxUnavailableError`).
    """
    if globals_ is not None or locals_ is not None or not isinstance(source, str):
        raise EvalRefusedError("sandboxed_eval takes one string, no namespaces")
    result = sandbox.run(
        _EVALUATOR,
        stdin=source.encode("utf-8", "replace"),
        limits=_EVAL_LIMITS,
        backend=backend,
    )
    if result.returncode != 0 or result.killed_reason is not None:
        raise ValueError(f"the sandboxed eval failed ({result.killed_reason or result.returncode})")
    text = result.stdout.decode("utf-8", "replace")
    if len(text) > _MAX_REPR_CHARS:
        raise ValueError("the sandboxed eval's value is too long")
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
        raise ValueError(f"the sandboxed eval's value is not plain data: {e}") from e


def _refuse(*args: Any, **kwargs: Any) -> Any:
    del args, kwargs
    raise EvalRefusedError("a reasoning-gym scorer reached eval or exec outside the sandbox")


@contextlib.contextmanager
def guarded(module_name: str, placement: str, backend: str = "bwrap") -> Iterator[None]:
    """Runs a scorer of `module_name` with `builtins.eval`/`exec` refused and, for "sandbox",
    the module's own `eval` bound to `sandboxed_eval` in `backend`."""
    module = sys.modules[module_name]
    saved = builtins.eval, builtins.exec
    had_own = "eval" in vars(module)
    own = vars(module).get("eval")
    builtins.eval, builtins.exec = _refuse, _refuse
    if placement == SANDBOX:
        module.eval = functools.partial(sandboxed_eval, backend=backend)
    try:
        yield
    finally:
        builtins.eval, builtins.exec = saved
        if placement == SANDBOX:
            if had_own:
                module.eval = own
            else:
                del module.eval


def placement(task: str) -> str:
    """Where `task`'s scorer runs: "pool" or "sandbox".

    Raises:
      ValueError: for a task that is not in the reviewed list, naming the supported ones.
    """
    if task not in SCORERS:
        raise ValueError(
            f"reasoning-gym task {task!r} is not in the reviewed list of scorers "
            f"(rewards.rg_scoring.SCORERS); supported: {', '.join(sorted(SCORERS))}"
        )
    return SCORERS[task]


@functools.cache
def _dataset(task: str, config_json: str) -> Any:
    """The task's dataset object with the config the examples were made with (one per worker)."""
    factory = importlib.import_module("reasoning_gym.factory")
    dataset_cls, config_cls = factory.DATASETS[task]
    fields = json.loads(config_json)
    names = {f.name for f in dataclasses.fields(config_cls)}
    config = config_cls(**{k: v for k, v in fields.items() if k in names})
    return dataset_cls(config=config)


def score_answer(
    answer: str,
    task: str,
    entry: Mapping[str, Any],
    config_json: str = "{}",
    backend: str = "bwrap",
) -> float:
    """The task's own score of an extracted `answer` for `entry`, run where `SCORERS` says
    ("sandbox" evaluations in the sandbox `backend`).

    Call it in a verifier process (`score`), never in the trainer: for "sandbox" tasks it
    rebinds a name of the scorer's module while it runs.
    """
    where = placement(task)
    dataset = _dataset(task, config_json)
    with guarded(type(dataset).__module__, where, backend):
        value = dataset.score_answer(answer, dict(entry))
    return float(value)


def score(
    response: str, task: str, entry_json: str, config_json: str, backend: str = "bwrap"
) -> float:
    """The reasoning-gym score of a response: the function to give `pool.VerifierPool`, with
    items `(response, task, entry_json, config_json, backend)` (`Example.hidden` holds the
    middle three; `backend` is `reward.sandbox_backend`)."""
    answer = extract_answer(response)
    return score_answer(answer, task, json.loads(entry_json), config_json, backend)
