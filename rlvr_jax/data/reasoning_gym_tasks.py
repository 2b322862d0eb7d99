"""reasoning-gym's procedural tasks as `Example`s, at chosen difficulty levels, from a seed.

Host code. The `reasoning-gym` package (extra `.[tasks]`, imported here only when called) makes
problems of about a hundred tasks, each from a config dataclass with a seed, and defines for most
of them a curriculum: attributes (number of terms, word length, grid size, ...) with ordered
levels. Level L of this module sets every attribute of the task's curriculum to its level L - 1
(capped at the attribute's last level; reasoning-gym counts from 0, this project's difficulty
levels from 1, as arithmetic's and MATH's do), so level 1 is the easiest. `task_config` overrides
single config fields after that, per task.

A dataset name is "reasoning_gym:<task>" or, for a mix, "reasoning_gym:<task>,<task>,...", with
optional weights (the share of each task's examples; equal by default). Each task is made at each
requested level in equal shares, and each (task, level) pair from its own seed derived from the
run's seed, the task name and the level, so adding a task to a mix does not change the problems
of the others. The examples of the mix are then interleaved by a seeded shuffle.

Only tasks whose scorer was reviewed (`rewards.rg_scoring.SCORERS`) can be made: an example's
`hidden` carries what the scorer needs (the task, the reasoning-gym entry and the config, as JSON),
and `envs.reasoning_gym_task` runs that scorer in the verifier pool or the sandbox.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlvr_jax.config_types import MissingPackageError
from rlvr_jax.data.example import Example
from rlvr_jax.rewards import rg_scoring

PREFIX = "reasoning_gym:"
SOURCE = "rg"


def is_reasoning_gym(name: str) -> bool:
    """Whether a dataset name selects reasoning-gym tasks."""
    return name.startswith(PREFIX)


def task_names(name: str) -> tuple[str, ...]:
    """The tasks of a "reasoning_gym:a,b" dataset name, in order.

    Raises:
      ValueError: for an empty list, a repeated task, or a task outside the reviewed list.
    """
    if not is_reasoning_gym(name):
        raise ValueError(f"{name!r} does not start with {PREFIX!r}")
    tasks = tuple(t.strip() for t in name[len(PREFIX) :].split(","))
    if not tasks or any(not t for t in tasks):
        raise ValueError(f"data.name={name!r} names no task after {PREFIX!r}")
    if len(set(tasks)) != len(tasks):
        raise ValueError(f"data.name={name!r} names a task twice")
    for t in tasks:
        rg_scoring.placement(t)
    return tasks


def _factory() -> Any:
    try:
        return importlib.import_module("reasoning_gym.factory")
    except ImportError as e:
        raise MissingPackageError(
            "reasoning-gym tasks need the `reasoning-gym` package: pip install -e '.[tasks]'"
        ) from e


def parse_task_config(text: str, tasks: Sequence[str]) -> dict[str, dict[str, Any]]:
    """`data.task_config`: a JSON object {task: {config field: value}} ("" for none).

    Raises:
      ValueError: for bad JSON, or a task that is not in the mix.
    """
    if not text.strip():
        return {}
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"data.task_config is not JSON: {e}") from e
    if not isinstance(parsed, dict) or not all(isinstance(v, dict) for v in parsed.values()):
        raise ValueError("data.task_config must be a JSON object of objects: {task: {field: v}}")
    unknown = sorted(set(parsed) - set(tasks))
    if unknown:
        raise ValueError(f"data.task_config names tasks not in data.name: {unknown}")
    return parsed


def task_configuration(task: str, level: int, overrides: Mapping[str, Any], seed: int, size: int):
    """The reasoning-gym config of `task` at `level` (1 = easiest), `overrides` applied.

    Raises:
      ValueError: for a level below 1, a level above 1 for a task without a curriculum, or an
        override that is not a field of the task's config (named).
    """
    factory = _factory()
    if level < 1:
        raise ValueError(f"reasoning-gym level {level} must be >= 1")
    _, config_cls = factory.DATASETS[task]
    fields = {"seed": seed, "size": size}
    if task in factory.CURRICULA:
        curriculum = factory.create_curriculum(task)
        curriculum.set_global_level(level - 1)
        config = curriculum.generate_configuration(fields)
    elif level == 1:
        config = config_cls(**fields)
    else:
        raise ValueError(f"reasoning-gym task {task!r} has no difficulty levels; use level 1")
    names = {f.name for f in dataclasses.fields(config_cls)}
    bad = sorted(set(overrides) - names)
    if bad:
        raise ValueError(
            f"data.task_config[{task!r}]: {bad} are not fields of {config_cls.__name__}"
        )
    config = dataclasses.replace(config, **overrides)
    if hasattr(config, "validate"):
        config.validate()
    return config


def max_level(task: str) -> int:
    """The highest level that changes `task` (1 for a task without a curriculum)."""
    factory = _factory()
    if task not in factory.CURRICULA:
        return 1
    attributes = factory.create_curriculum(task).attributes.values()
    return max(len(a.levels) for a in attributes) if attributes else 1


def _shares(num: int, weights: Sequence[float]) -> list[int]:
    """`num` split by `weights`, largest remainders first (ties to the earlier task)."""
    total = float(sum(weights))
    exact = [num * w / total for w in weights]
    counts = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: num - sum(counts)]:
        counts[i] += 1
    return counts


def _config_json(config: Any) -> str:
    """The config's fields that JSON gives back with their type; the others (a date, an enum, a
    tuple) keep their defaults when the scorer rebuilds the dataset (no reviewed scorer reads
    them)."""
    kept = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        try:
            back = json.loads(json.dumps(value))
            if back == value and type(back) is type(value):
                kept[field.name] = value
        except (TypeError, ValueError):
            continue
    return json.dumps(kept, sort_keys=True)


def _task_seed(seed: int, task: str, level: int) -> int:
    return (seed * 1_000_003 + zlib.crc32(task.encode()) * 101 + level) % (2**31)


def reasoning_gym_examples(
    name: str,
    num: int,
    seed: int,
    levels: int | Sequence[int] = 1,
    weights: Sequence[float] = (),
    task_config: str = "",
) -> list[Example]:
    """Examples of the reasoning-gym tasks of `name` (see the module docstring).

    Args:
      name: "reasoning_gym:<task>[,<task>...]".
      num: how many examples in all.
      seed: the same arguments give the same examples.
      levels: one level or several, mixed in equal shares within each task (1 = easiest).
      weights: one weight per task (empty: equal).
      task_config: JSON {task: {config field: value}} applied after the level's settings.

    Returns:
      Examples with the task's question as prompt_text, its answer as answer, source
      "rg:<task>", difficulty the level, meta {"task", "level"} and hidden {"rg_task",
      "rg_entry", "rg_config"} (JSON strings for the scorer); ids "rg/<task>/<level>/<seed>/<i>".

    Raises:
      ValueError: for bad settings, naming them.
    """
    tasks = task_names(name)
    if num < 1:
        raise ValueError(f"reasoning-gym tasks need num > 0, got {num}")
    level_list = [levels] if isinstance(levels, int) else [int(x) for x in levels]
    if not level_list or len(set(level_list)) != len(level_list):
        raise ValueError(f"levels={levels!r} must be distinct and non-empty")
    weights = tuple(weights) or (1.0,) * len(tasks)
    if len(weights) != len(tasks) or any(not w > 0 for w in weights):
        raise ValueError(f"data.weights={weights} must hold one positive weight per task {tasks}")
    overrides = parse_task_config(task_config, tasks)
    factory = _factory()
    out: list[Example] = []
    for task, task_num in zip(tasks, _shares(num, weights), strict=True):
        for level, count in zip(
            level_list, _shares(task_num, [1.0] * len(level_list)), strict=True
        ):
            if not count:
                continue
            task_seed = _task_seed(seed, task, level)
            config = task_configuration(task, level, overrides.get(task, {}), task_seed, count)
            dataset = factory.DATASETS[task][0](config=config)
            config_json = _config_json(config)
            for i in range(count):
                entry = dataset[i]
                out.append(
                    Example(
                        id=f"rg/{task}/{level}/{seed}/{i}",
                        prompt_text=entry["question"],
                        answer=str(entry["answer"]),
                        source=f"{SOURCE}:{task}",
                        difficulty=float(level),
                        meta={"task": task, "level": level},
                        hidden={
                            "rg_task": task,
                            "rg_entry": json.dumps(
                                {
                                    "question": entry["question"],
                                    "answer": entry["answer"],
                                    "metadata": entry["metadata"],
                                },
                                default=list,
                            ),
                            "rg_config": config_json,
                        },
                    )
                )
    order = np.random.default_rng(seed).permutation(len(out))
    return [out[i] for i in order]
