"""Device memory of the step's programs, and the fewest microbatches whose update fits.

XLA knows a program's memory before it runs: `compiled.memory_analysis()` gives each device's
arguments, outputs, temporaries and the outputs aliased to donated arguments. Compiling on
`jax.ShapeDtypeStruct`s (or on arrays, which `lower` only reads the shapes of) allocates nothing,
so `rl.num_microbatches = "auto"` can try candidate counts before the first step and keep the
fewest that fit, instead of a user finding the count by running out of memory.

Host code: it compiles programs and reads their analyses; nothing here is traced.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax

from rlvr_jax.rl.config import RLConfig

GiB = 1 << 30


def format_bytes(num: int) -> str:
    """Bytes in GiB, MiB or KiB, whichever reads best."""
    for unit, size in (("GiB", GiB), ("MiB", 1 << 20)):
        if num >= size:
            return f"{num / size:.2f} {unit}"
    return f"{num / 1024:.1f} KiB"


@dataclasses.dataclass(frozen=True)
class ProgramMemory:
    """Per-device bytes of one compiled program (`memory_analysis`).

    `total` counts an output aliased to a donated argument once: arguments + outputs - aliased
    + temporaries, the most the program holds at once.
    """

    arguments: int
    outputs: int
    aliased: int
    temps: int

    @property
    def total(self) -> int:
        return self.arguments + self.outputs - self.aliased + self.temps


def program_memory(compiled: jax.stages.Compiled) -> ProgramMemory:
    """The per-device memory of a compiled program.

    Raises:
      ValueError: where the backend gives no memory analysis.
    """
    m = compiled.memory_analysis()
    if m is None:
        raise ValueError(f"the {jax.default_backend()} backend gives no memory analysis")
    return ProgramMemory(
        arguments=m.argument_size_in_bytes,
        outputs=m.output_size_in_bytes,
        aliased=m.alias_size_in_bytes,
        temps=m.temp_size_in_bytes,
    )


def device_memory_limit(device: jax.Device | None = None) -> int | None:
    """The bytes a program may use on `device` (default: the first local one) as the runtime
    reports them (GPU, TPU), or None (CPU reports nothing)."""
    device = device or jax.local_devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # some backends raise instead of returning None
        return None
    if not stats:
        return None
    return stats.get("bytes_limit") or stats.get("bytes_reservable_limit")


def memory_budget(rl: RLConfig) -> int:
    """The per-device bytes `num_microbatches="auto"` may fill: `rl.memory_budget_gib` when set,
    else the device's own limit.

    Raises:
      ValueError: when neither is known (a CPU without `rl.memory_budget_gib`).
    """
    if rl.memory_budget_gib > 0:
        return int(rl.memory_budget_gib * GiB)
    limit = device_memory_limit()
    if limit is None:
        raise ValueError(
            f'rl.num_microbatches="auto" needs a memory budget: the {jax.default_backend()} '
            "device reports no memory limit, so set rl.memory_budget_gib"
        )
    return int(limit)


def microbatch_candidates(rl: RLConfig, num_rows: int) -> list[int]:
    """Microbatch counts that split each minibatch of `num_rows` rows evenly, fewest first."""
    per_minibatch = num_rows // rl.num_minibatches
    return [c for c in range(1, per_minibatch + 1) if per_minibatch % c == 0]


@dataclasses.dataclass(frozen=True)
class MicrobatchChoice:
    """What `fewest_microbatches` chose, and every count it compiled with its memory."""

    count: int
    budget: int
    tried: tuple[tuple[int, ProgramMemory], ...]

    def summary(self) -> str:
        tried = ", ".join(f"{c}: {format_bytes(m.total)}" for c, m in self.tried)
        return (
            f'rl.num_microbatches="auto" -> {self.count} (per-device peak '
            f"{format_bytes(self.tried[-1][1].total)} of a {format_bytes(self.budget)} budget; "
            f"compiled {tried})"
        )


def fewest_microbatches(
    rl: RLConfig,
    num_rows: int,
    measure: Callable[[RLConfig], ProgramMemory],
    budget: int,
) -> MicrobatchChoice:
    """The fewest microbatches whose program fits `budget` bytes per device.

    Args:
      rl: the settings, `num_microbatches` "auto" (or a number, which is kept as it is).
      num_rows: N rows of a step.
      measure: compiles the step for a candidate `RLConfig` and returns its memory
        (`program_memory`); it is called for counts in increasing order until one fits.
      budget: per-device bytes (`memory_budget`).

    Raises:
      ValueError: when not even one row per microbatch fits, naming the smallest figure.
    """
    if not rl.auto_microbatches:
        count = rl.microbatch_count()
        return MicrobatchChoice(count, budget, ((count, measure(rl)),))
    tried = []
    for count in microbatch_candidates(rl, num_rows):
        memory = measure(dataclasses.replace(rl, num_microbatches=count))
        tried.append((count, memory))
        if memory.total <= budget:
            return MicrobatchChoice(count, budget, tuple(tried))
    best_count, best = min(tried, key=lambda cm: cm[1].total)
    raise ValueError(
        f'rl.num_microbatches="auto": no microbatch count of {num_rows} rows fits '
        f"{format_bytes(budget)} per device; the least, {best_count} microbatches, needs "
        f"{format_bytes(best.total)} (of which {format_bytes(best.arguments)} are parameters, "
        "optimizer state and inputs): use fewer rows or shorter answers, shard over more "
        "devices, or turn on model.remat"
    )
