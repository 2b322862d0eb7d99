"""The problem sources this project knows, and how one of their rows becomes an `Example`.

Host code. A `SourceSpec` names a dataset's question and answer fields, how the answer field gives
the gold answer (`scalar_answer`, `gsm8k_gold`) and where the hubs keep it; `example_from_row`
and `example_record` turn one parsed JSONL or hub row into an `Example` or raise the
`MalformedRowError` that says why not. Multiple-choice and true/false answers are detected here
for the loaders' filters.

A float answer keeps the exact decimal text it was written with when a float cannot hold it
(`jsonl.LiteralFloat`): `123456789012345678.0` is the gold "123456789012345678", never the
nearest float, "123456789012345680".
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from rlvr_jax.data.example import Example
from rlvr_jax.data.jsonl import LiteralFloat, MalformedRowError

# ---------------------------------------------------------------------------------------------
# Answers


_MAX_EXPONENT = 400  # of an exact decimal answer: its text stays short


def _exact_text(literal: str) -> str:
    """The decimal `literal` written out exactly: "123456789012345678.0" is 123456789012345678."""
    exact = Decimal(literal)
    if abs(exact.adjusted()) > _MAX_EXPONENT:
        raise MalformedRowError("bad_answer", f"the answer {literal} is out of range")
    if exact == exact.to_integral_value():
        return str(int(exact))
    return format(exact.normalize(), "f")


def scalar_answer(value: Any) -> str:
    """A gold answer as a string; floats that are whole numbers lose their ".0" (AMC's 27.0), and
    a float read from a number it cannot hold is that number's exact text (`jsonl.LiteralFloat`).
    """
    if value is None:
        raise MalformedRowError("missing_field", "the answer is null")
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MalformedRowError("bad_answer", f"the answer {value!r} is not finite")
        if isinstance(value, LiteralFloat):
            return _exact_text(value.literal)
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str):
        return value.strip()
    raise MalformedRowError(
        "bad_answer", f"the answer has type {type(value).__name__}, not a scalar"
    )


def gsm8k_gold(solution: Any) -> str:
    """The final answer of a GSM8K solution: the text after the last "####", commas removed.

    Raises:
      MalformedRowError: when the solution has no "####" marker or is not a string.
    """
    text = scalar_answer(solution)
    if "####" not in text:
        raise MalformedRowError("no_final_answer", "the solution has no '####' final answer")
    return text.rsplit("####", 1)[1].strip().replace(",", "")


_CALCULATOR = re.compile(r"<<[^<>]*>>")


def gsm8k_thought(solution: Any) -> str:
    """The reasoning of a GSM8K solution: the text before its last "####", without the
    calculator annotations ("<<48/2=24>>"); "" when it has none."""
    if not isinstance(solution, str) or "####" not in solution:
        return ""
    return _CALCULATOR.sub("", solution.rsplit("####", 1)[0]).strip()


# ---------------------------------------------------------------------------------------------
# Multiple-choice and true/false detection

_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|textrm)\s*\{([^{}]*)\}")
_CHOICE_IN_PARENS = re.compile(r"\(([A-J])\)")
_CHOICE_AT_LINE_START = re.compile(r"(?m)^\s*([A-J])[.):]\s")
_YES_NO = frozenset({"true", "false", "yes", "no"})


def _bare_answer(answer: str) -> str:
    """The answer without LaTeX text wrappers, dollar signs, spaces and a final period."""
    prev = None
    while prev != answer:
        prev, answer = answer, _WRAPPERS.sub(r"\1", answer)
    return answer.replace("$", "").strip().rstrip(".").strip()


def is_multiple_choice(question: str, answer: str) -> bool:
    """Whether the answer is a choice letter (or letters) offered in the question.

    "\\text{(C)}" with "(A) Line (B) Circle (C) Plane" in the question is one; "C" with no choice
    list in the question is not (it could be a point's name).
    """
    letters = [p.strip().strip("()").strip() for p in _bare_answer(answer).split(",")]
    if not letters or any(len(x) != 1 or x not in "ABCDEFGHIJ" for x in letters):
        return False
    choices = set(_CHOICE_IN_PARENS.findall(question)) | set(
        _CHOICE_AT_LINE_START.findall(question)
    )
    return len(choices) >= 2 and set(letters) <= choices


def is_true_false(answer: str) -> bool:
    """Whether the answer is True/False or Yes/No (any case, LaTeX text wrappers ignored)."""
    return _bare_answer(answer).lower() in _YES_NO


# ---------------------------------------------------------------------------------------------
# Sources


@dataclasses.dataclass(frozen=True)
class SourceSpec:
    """How the rows of one dataset map to `Example`s, and where the hubs keep it.

    Attributes:
      name: the dataset name ("gsm8k").
      question_field: the row field that holds the question.
      answer_field: the row field that holds the gold answer (or a solution holding it).
      gold: turns the answer field into the gold string.
      thought: the reasoning in the answer field, kept as `meta["thought"]` (the thinking rows of
        `sft.traces`), or None where the field holds only the answer.
      difficulty_fields: fields tried in order for the difficulty (the first present is used).
      hf: (path, config name, default split) on the Hugging Face hub, or None.
      tfds: (builder name, default split) in TFDS, or None.
    """

    name: str
    question_field: str
    answer_field: str
    gold: Callable[[Any], str] = scalar_answer
    thought: Callable[[Any], str] | None = None
    difficulty_fields: tuple[str, ...] = ("difficulty", "level")
    hf: tuple[str, str | None, str] | None = None
    tfds: tuple[str, str] | None = None


SOURCES: dict[str, SourceSpec] = {
    "gsm8k": SourceSpec(
        "gsm8k",
        "question",
        "answer",
        gold=gsm8k_gold,
        thought=gsm8k_thought,
        hf=("openai/gsm8k", "main", "test"),
        tfds=("gsm8k", "test"),
    ),
    "math500": SourceSpec(
        "math500", "problem", "answer", hf=("HuggingFaceH4/MATH-500", None, "test")
    ),
    "aime": SourceSpec("aime", "problem", "answer", hf=("HuggingFaceH4/aime_2024", None, "train")),
    "amc": SourceSpec("amc", "problem", "answer", hf=("AI-MO/aimo-validation-amc", None, "train")),
}


def spec_of(name: str) -> SourceSpec:
    if name not in SOURCES:
        raise ValueError(f"dataset {name!r} is not known; known: {sorted(SOURCES)}")
    return SOURCES[name]


def _difficulty(row: Mapping[str, Any], fields: Sequence[str]) -> float | None:
    for f in fields:
        value = row.get(f)
        if value is None:
            continue
        if isinstance(value, str):  # Hugging Face MATH: "Level 3"
            m = re.search(r"-?\d+(?:\.\d+)?", value)
            if m is None:
                raise MalformedRowError("bad_difficulty", f"{f}={value!r} holds no number")
            return float(m.group())
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise MalformedRowError("bad_difficulty", f"{f}={value!r} is not a number")
    return None


def example_from_row(
    row: Any, spec: SourceSpec, split: str, index: int, fields: tuple[str, str]
) -> Example:
    """One source row as an Example; raises `MalformedRowError`."""
    if not isinstance(row, Mapping):
        raise MalformedRowError(
            "not_an_object", f"the row is a {type(row).__name__}, not an object"
        )
    question_field, answer_field = fields
    for f in (question_field, answer_field):
        if f not in row:
            raise MalformedRowError("missing_field", f"the row has no {f!r} field")
    question = row[question_field]
    if not isinstance(question, str) or not question.strip():
        raise MalformedRowError(
            "empty_question", f"{question_field}={question!r} is not a non-empty string"
        )
    gold = spec.gold(row[answer_field])
    if not gold:
        raise MalformedRowError(
            "empty_answer", f"{answer_field}={row[answer_field]!r} gives an empty answer"
        )
    thought = spec.thought(row[answer_field]) if spec.thought is not None else ""
    return Example(
        id=f"{spec.name}/{split}/{index}",
        prompt_text=question.strip(),
        answer=gold,
        source=spec.name,
        difficulty=_difficulty(row, spec.difficulty_fields),
        meta={"thought": thought} if thought else {},
    )


def example_record(row: Any) -> Example:
    """An `Example.to_json` object back as an Example; raises `MalformedRowError`."""
    if not isinstance(row, Mapping):
        raise MalformedRowError(
            "not_an_object", f"the row is a {type(row).__name__}, not an object"
        )
    for f in ("id", "prompt_text", "answer", "source"):
        if f not in row:
            raise MalformedRowError("missing_field", f"the record has no {f!r} field")
        if not isinstance(row[f], str):
            raise MalformedRowError("bad_field", f"{f}={row[f]!r} is not a string")
    if not row["answer"].strip():
        raise MalformedRowError("empty_answer", "the answer is empty")
    meta, hidden = row.get("meta") or {}, row.get("hidden") or {}
    if not isinstance(meta, Mapping) or not isinstance(hidden, Mapping):
        raise MalformedRowError("bad_field", "meta and hidden must be objects")
    return Example(
        id=row["id"],
        prompt_text=row["prompt_text"],
        answer=row["answer"].strip(),
        source=row["source"],
        difficulty=_difficulty(row, ("difficulty",)),
        meta=dict(meta),
        hidden=dict(hidden),
    )
