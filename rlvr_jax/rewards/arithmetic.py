"""Arithmetic: problems generated offline and a verifier written in JAX over tokens.

Because the verifier is a jittable function of the sampled tokens, a train step on this task is one
XLA program (rollout, reward, advantages, update) with no host round trip.

The verifier reads the *last number* in a response: the last maximal run of digit tokens, with a
minus sign token directly before it. It needs a tokenizer that spells every digit as its own token
(character tokenizers, SmolLM2, Qwen2/3 all do); `DigitTable.from_tokenizer` checks that.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.types import FINISH_LENGTH

Array = jax.Array
OPERATORS = "+-*"


@dataclasses.dataclass(frozen=True)
class Problem:
    """One generated problem: the expression text (no "="), and its integer value."""

    expression: str
    answer: int


def generate_problems(
    num: int,
    seed: int,
    num_operands: int = 2,
    max_digits: int = 1,
    operators: str = "+",
    allow_negative: bool = False,
) -> list[Problem]:
    """Random problems with a difficulty knob.

    Args:
      num: how many.
      seed: numpy seed; the same arguments give the same problems.
      num_operands: terms per expression (>= 2).
      max_digits: each operand has 1..max_digits digits.
      operators: drawn from "+", "-", "*".
      allow_negative: keep problems whose value is negative (else they are redrawn).
    """
    if num_operands < 2:
        raise ValueError(f"num_operands={num_operands} must be at least 2")
    if max_digits < 1:
        raise ValueError(f"max_digits={max_digits} must be at least 1")
    bad = set(operators) - set(OPERATORS) or (not operators and {""})
    if bad:
        raise ValueError(f"operators={operators!r}: each must be one of {OPERATORS!r}")
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < num:
        terms = [int(rng.integers(0, 10**max_digits)) for _ in range(num_operands)]
        ops = [operators[int(rng.integers(len(operators)))] for _ in range(num_operands - 1)]
        expr = str(terms[0]) + "".join(f"{o}{t}" for o, t in zip(ops, terms[1:], strict=True))
        value = _evaluate(terms, ops)
        if value < 0 and not allow_negative:
            continue
        out.append(Problem(expr, value))
    return out


def _evaluate(terms: list[int], ops: list[str]) -> int:
    """The value with the usual precedence (* before + and -), without eval."""
    sums, product = [], terms[0]
    signs = [1]
    for op, t in zip(ops, terms[1:], strict=True):
        if op == "*":
            product *= t
        else:
            sums.append(product)
            signs.append(1 if op == "+" else -1)
            product = t
    sums.append(product)
    return sum(s * v for s, v in zip(signs, sums, strict=True))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DigitTable:
    """Which token ids are digits (value 0-9, else -1), and the id of the minus sign."""

    digit_of_V: Array  # (V,) int32
    minus_id: Array  # () int32, -1 when the vocabulary has none

    @classmethod
    def from_tokenizer(cls, tokenizer, vocab_size: int) -> DigitTable:
        """Builds the table from a tokenizer in which "0".."9" and "-" are single tokens.

        Raises:
          ValueError: naming a digit the tokenizer splits or merges.
        """
        table = np.full((vocab_size,), -1, np.int32)
        for d in range(10):
            ids = tokenizer.encode(str(d))
            if len(ids) != 1:
                raise ValueError(f"the tokenizer spells digit {d} as {ids}, not one token")
            table[ids[0]] = d
        minus = tokenizer.encode("-")
        return cls(jnp.asarray(table), jnp.asarray(minus[0] if len(minus) == 1 else -1, jnp.int32))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Answers:
    """Expected answers of N rows, as digits (most significant first, left-aligned)."""

    digits_NA: Array  # (N, A) int32, -1 past the answer's length
    length_N: Array  # (N,) int32 number of digits
    negative_N: Array  # (N,) bool


def encode_answers(values: list[int], width: int) -> Answers:
    """Host: the `Answers` of integer values, `width` digit columns (A)."""
    digits = np.full((len(values), width), -1, np.int32)
    lengths = np.zeros((len(values),), np.int32)
    for i, v in enumerate(values):
        s = str(abs(int(v)))
        if len(s) > width:
            raise ValueError(f"answer {v} has more than width={width} digits")
        digits[i, : len(s)] = [int(c) for c in s]
        lengths[i] = len(s)
    negative = np.asarray([v < 0 for v in values], bool)
    return Answers(jnp.asarray(digits), jnp.asarray(lengths), jnp.asarray(negative))


def last_number(
    tokens_NT: Array, mask_NT: Array, table: DigitTable, width: int
) -> tuple[Array, Array, Array, Array]:
    """The last number in each response, in JAX.

    Returns:
      (digits_NA (-1 past its length), length_N, negative_N, found_N); only the first `width`
      digits are returned, and `length_N` counts them all.
    """
    N, T = tokens_NT.shape
    digit_NT = jnp.where(mask_NT, table.digit_of_V[tokens_NT], -1)
    is_digit = digit_NT >= 0
    t = jnp.arange(T)
    end_N = jnp.max(jnp.where(is_digit, t, -1), axis=1)  # last digit, -1 if none
    # The run starts after the last non-digit at or before `end`.
    gap_N = jnp.max(jnp.where(~is_digit & (t <= end_N[:, None]), t, -1), axis=1)
    start_N = gap_N + 1
    found_N = end_N >= 0
    length_N = jnp.where(found_N, end_N - start_N + 1, 0)
    cols = start_N[:, None] + jnp.arange(width)
    digits_NA = jnp.take_along_axis(digit_NT, jnp.clip(cols, 0, T - 1), axis=1)
    digits_NA = jnp.where(jnp.arange(width) < length_N[:, None], digits_NA, -1)
    before = jnp.take_along_axis(tokens_NT, jnp.clip(gap_N, 0, T - 1)[:, None], axis=1)[:, 0]
    before_real = jnp.take_along_axis(mask_NT, jnp.clip(gap_N, 0, T - 1)[:, None], axis=1)[:, 0]
    negative_N = found_N & (gap_N >= 0) & before_real & (before == table.minus_id)
    return digits_NA, length_N, negative_N, found_N


def arithmetic_reward(
    tokens_NT: Array,
    mask_NT: Array,
    eos_N: Array,
    answers: Answers,
    table: DigitTable,
) -> tuple[Array, dict[str, Array]]:
    """Reward parts of N responses: `correct` (the last number equals the answer) and `format`
    (the response contains a number and ended with an eos token rather than running out).

    Args:
      tokens_NT: generated tokens.
      mask_NT: which are real.
      eos_N: the row ended with an eos / stop token.
      answers: the expected values.
      table: digit token ids.

    Returns:
      (correct_N f32, {"correct": ..., "format": ...}); weigh the parts with `combine`.
    """
    width = answers.digits_NA.shape[1]
    digits, length, negative, found = last_number(tokens_NT, mask_NT, table, width)
    same_digits = jnp.all(digits == answers.digits_NA, axis=1)
    correct = found & (length == answers.length_N) & same_digits & (negative == answers.negative_N)
    fmt = found & eos_N
    parts = {"correct": correct.astype(jnp.float32), "format": fmt.astype(jnp.float32)}
    return parts["correct"], parts


def make_reward_fn(table: DigitTable, format_weight: float = 0.0):
    """A jittable `reward_fn(rollout, answers)` for `train_step.build_train_step`.

    The reward is `correct + format_weight * format`; both parts are reported.
    """

    def reward_fn(rollout, answers: Answers):
        ended = rollout.finish_N != FINISH_LENGTH
        correct, parts = arithmetic_reward(
            rollout.tokens_NT, rollout.mask_NT, ended, answers, table
        )
        return correct + format_weight * parts["format"], parts

    return reward_fn
