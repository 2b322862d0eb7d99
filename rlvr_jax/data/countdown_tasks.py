"""Countdown problems, generated offline and solvable by construction.

A problem gives 3 or 4 numbers and a target; the answer is an expression that uses each number
exactly once with + - * / and equals the target (the TinyZero task). Each problem is made by
combining its numbers in a random expression tree and taking the tree's value as the target, so
at least one solution exists. That solution is the gold answer (`Example.answer`, also kept in
`meta["solution"]`): an expression such as "(3 + 5) * 2" whose integer literals are exactly the
given numbers and whose value is the target, so `rewards.countdown.score(response, gold)` recovers
both from it. A bare target is never a gold answer, and never scores.

Every intermediate value of the construction is a non-negative integer (subtraction takes the
larger operand first, division only where it is exact), so the target is an integer and the kept
solution needs no fractions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlvr_jax.data.example import Example

COUNTDOWN_OPERATORS = "+-*/"
# Draws per requested problem before giving up on settings that cannot produce targets.
_MAX_DRAWS_PER_PROBLEM = 1000


def _combine(a: int, b: int, op: str) -> int | None:
    """`a op b` as an integer, or None where the construction does not allow it."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b if a >= b else None
    if op == "*":
        return a * b
    return a // b if b != 0 and a % b == 0 else None


def _random_tree(
    numbers: Sequence[int], operators: str, rng: np.random.Generator
) -> tuple[int, str]:
    """Combines random pairs until one node is left; returns (value, fully bracketed text)."""
    nodes = [(n, str(n)) for n in numbers]
    while len(nodes) > 1:
        i, j = (int(k) for k in rng.choice(len(nodes), size=2, replace=False))
        (a, ta), (b, tb) = nodes[i], nodes[j]
        for op in rng.permutation(list(operators)):
            value = _combine(a, b, op)
            left, right = ta, tb
            if value is None and op in "-/":  # try the operands the other way round
                value, left, right = _combine(b, a, op), tb, ta
            if value is not None:
                break
        else:
            # Only "-" or "/" allowed and neither order works (e.g. 3 / 2): give up this draw.
            return -1, ""
        text = f"{left} {op} {right}"
        nodes = [nd for k, nd in enumerate(nodes) if k not in (i, j)]
        nodes.append((value, f"({text})" if len(nodes) else text))
    return nodes[0]


def countdown_question(numbers: Sequence[int], target: int, operators: str) -> str:
    """The question text, as in TinyZero (the answer format belongs to the prompt template).

    It says "exactly once" where TinyZero says "can only be used once": TinyZero's verifier, and
    `rewards.countdown`, require every number, so the question states the rule that is scored.
    """
    ops = ", ".join(operators)
    return (
        f"Using the numbers [{', '.join(map(str, numbers))}], create an equation that equals "
        f"{target}. You can use basic arithmetic operations ({ops}) and each number must be "
        "used exactly once."
    )


def countdown_examples(
    num: int,
    seed: int,
    num_numbers: Sequence[int] = (3, 4),
    min_number: int = 1,
    max_number: int = 100,
    min_target: int = 1,
    max_target: int = 1000,
    operators: str = COUNTDOWN_OPERATORS,
) -> list[Example]:
    """Countdown problems with integer targets in [min_target, max_target].

    Args:
      num: how many.
      seed: the same arguments give the same problems.
      num_numbers: how many numbers a problem has, drawn uniformly from these (each 2..6).
      min_number: smallest number offered.
      max_number: largest number offered.
      min_target: smallest target kept.
      max_target: largest target kept (draws outside the range are redrawn).
      operators: the allowed operators, a subset of "+-*/".

    Returns:
      Examples with the question as prompt_text, a solution expression as answer (the gold
      format of `rewards.countdown.score`), the number count as difficulty, and meta
      {"numbers", "target", "solution"}; ids "countdown/{seed}/{i}".

    Raises:
      ValueError: for invalid settings, naming them, or when the settings yield too few targets
        in range.
    """
    if num < 0:
        raise ValueError(f"num={num} must be >= 0")
    counts = tuple(int(k) for k in num_numbers)
    if not counts or any(not 2 <= k <= 6 for k in counts):
        raise ValueError(f"num_numbers={tuple(num_numbers)}: each count must be in [2, 6]")
    if not 0 <= min_number <= max_number:
        raise ValueError(f"numbers range [{min_number}, {max_number}] is empty or negative")
    if min_target > max_target:
        raise ValueError(f"target range [{min_target}, {max_target}] is empty")
    bad = set(operators) - set(COUNTDOWN_OPERATORS)
    if bad or not operators:
        raise ValueError(f"operators={operators!r}: each must be one of {COUNTDOWN_OPERATORS!r}")
    operators = "".join(dict.fromkeys(operators))
    rng = np.random.default_rng(seed)
    out: list[Example] = []
    draws = 0
    while len(out) < num:
        draws += 1
        if draws > _MAX_DRAWS_PER_PROBLEM * max(num, 1):
            raise ValueError(
                f"after {draws - 1} draws only {len(out)} of {num} countdown problems had a "
                f"target in [{min_target}, {max_target}] with numbers in "
                f"[{min_number}, {max_number}] and operators {operators!r}"
            )
        k = counts[int(rng.integers(len(counts)))]
        numbers = [int(x) for x in rng.integers(min_number, max_number + 1, size=k)]
        target, solution = _random_tree(numbers, operators, rng)
        if not solution or not min_target <= target <= max_target:
            continue
        out.append(
            Example(
                id=f"countdown/{seed}/{len(out)}",
                prompt_text=countdown_question(numbers, target, operators),
                answer=solution,
                source="countdown",
                difficulty=float(k),
                meta={"numbers": numbers, "target": target, "solution": solution},
            )
        )
    return out
