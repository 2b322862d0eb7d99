"""Device memory of the step's programs, and the fewest microbatches whose update fits.

XLA knows a program's memory before it runs: `compiled.memory_analysis()` gives each device's
arguments, outputs, temporaries and the outputs aliased to donated arguments. Compiling on
`jax.ShapeDtypeStruct`s (or on arrays, which `lower` only reads the shapes of) allocates nothing,
so `rl.num_microbatches = "auto"` can try candidate counts before the first step and keep the
fewest that fit, instead of a user finding the count by running out of memory; and
`mesh.seq = "auto"` can try seq splits of the mesh the same way (`smallest_seq`).

Host code: it compiles programs and reads their analyses; nothing here is traced.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

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


def abstract_like(tree: Any, shardings: Any) -> Any:
    """`jax.ShapeDtypeStruct`s of `tree`'s leaves carrying `shardings` (one sharding, or a tree
    like `tree`'s): what `lower` compiles on without anything placed or allocated."""
    if isinstance(shardings, jax.sharding.Sharding):
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=shardings), tree
        )
    return jax.tree.map(
        lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), tree, shardings
    )


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


def memory_budget(rl: RLConfig, setting: str = 'rl.num_microbatches="auto"') -> int:
    """The per-device bytes an "auto" setting (`num_microbatches`, `mesh.seq`) may fill:
    `rl.memory_budget_gib` when set, else the device's own limit.

    Raises:
      ValueError: when neither is known (a CPU without `rl.memory_budget_gib`), naming
        `setting`.
    """
    if rl.memory_budget_gib > 0:
        return int(rl.memory_budget_gib * GiB)
    limit = device_memory_limit()
    if limit is None:
        raise ValueError(
            f"{setting} needs a memory budget: the {jax.default_backend()} "
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

    @property
    def memory(self) -> ProgramMemory:
        """The memory of the count kept (the last compiled)."""
        return self.tried[-1][1]

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.budget

    def least(self) -> tuple[int, ProgramMemory]:
        """The count that compiled to the least memory, and that memory."""
        return min(self.tried, key=lambda cm: cm[1].total)

    def summary(self) -> str:
        tried = ", ".join(f"{c}: {format_bytes(m.total)}" for c, m in self.tried)
        return (
            f'rl.num_microbatches="auto" -> {self.count} (per-device peak '
            f"{format_bytes(self.tried[-1][1].total)} of a {format_bytes(self.budget)} budget; "
            f"compiled {tried})"
        )


def microbatch_search(
    rl: RLConfig,
    num_rows: int,
    measure: Callable[[RLConfig], ProgramMemory],
    budget: int,
) -> MicrobatchChoice:
    """Compiles counts in increasing order until one fits `budget`, and keeps the last compiled
    (`MicrobatchChoice.fits` says whether it fits); a number in `rl.num_microbatches` is the
    only count. Arguments as `fewest_microbatches`'."""
    if not rl.auto_microbatches:
        count = rl.microbatch_count()
        return MicrobatchChoice(count, budget, ((count, measure(rl)),))
    tried = []
    for count in microbatch_candidates(rl, num_rows):
        tried.append((count, measure(dataclasses.replace(rl, num_microbatches=count))))
        if tried[-1][1].total <= budget:
            break
    return MicrobatchChoice(tried[-1][0], budget, tuple(tried))


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
    choice = microbatch_search(rl, num_rows, measure, budget)
    if choice.fits or not rl.auto_microbatches:
        return choice
    best_count, best = choice.least()
    raise ValueError(
        f'rl.num_microbatches="auto": no microbatch count of {num_rows} rows fits '
        f"{format_bytes(budget)} per device; the least, {best_count} microbatches, needs "
        f"{format_bytes(best.total)} (of which {format_bytes(best.arguments)} are parameters, "
        "optimizer state and inputs): use fewer rows or shorter answers, shard over more "
        "devices, or turn on model.remat"
    )


@dataclasses.dataclass(frozen=True)
class SeqChoice:
    """What `smallest_seq` chose, and each split it compiled with its microbatch search."""

    seq: int
    budget: int
    tried: tuple[tuple[int, MicrobatchChoice], ...]

    def summary(self, auto_microbatches: bool) -> str:
        choice = self.tried[-1][1]
        count = f', rl.num_microbatches="auto" -> {choice.count}' if auto_microbatches else ""
        tried = ", ".join(f"{s}: {format_bytes(c.least()[1].total)}" for s, c in self.tried)
        return (
            f'mesh.seq="auto" -> {self.seq}{count} (per-device peak '
            f"{format_bytes(choice.memory.total)} of a {format_bytes(self.budget)} budget; "
            f"compiled seq {tried})"
        )


def smallest_seq(
    candidates: Sequence[int], search: Callable[[int], MicrobatchChoice], budget: int
) -> SeqChoice:
    """The smallest seq split (the least communication) whose step fits `budget` bytes.

    Args:
      candidates: seq sizes, smallest first.
      search: the microbatch search (`microbatch_search`) of the step on the mesh of a seq size.
      budget: per-device bytes (`memory_budget`).

    Raises:
      ValueError: when no candidate fits, naming the least memory any needs and the budget.
    """
    tried = []
    for seq in candidates:
        tried.append((seq, search(seq)))
        if tried[-1][1].fits:
            return SeqChoice(seq, budget, tuple(tried))
    seq, choice = min(tried, key=lambda sc: sc[1].least()[1].total)
    count, best = choice.least()
    raise ValueError(
        f'mesh.seq="auto": no seq split in {list(candidates)} fits {format_bytes(budget)} per '
        f"device; the least, seq={seq} with {count} microbatch(es), needs "
        f"{format_bytes(best.total)} (of which {format_bytes(best.arguments)} are parameters, "
        "optimizer state and inputs): use more microbatches, fewer rows or shorter answers, "
        "more devices, or model.remat"
    )
