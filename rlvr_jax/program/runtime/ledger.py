"""The metrics ledger's file, `<workdir>/metrics.jsonl`: its records, reading them, and making it
one history again when a run resumes.

Host code; `program.runtime.metrics.MetricsWriter` writes the file (and re-exports these names). One
JSON object per line: "step", the record's kind ("record": `STEP`, `EVAL`, `FINAL`, `STARTUP`; see
`program.runtime.metrics`), wall-clock "time", then the metrics.

Damage is reported, never guessed around: a torn last line (a crash mid-write, also one cut
inside a multi-byte character) is ignored with a warning; any other line that is not a UTF-8
JSON record is an error naming the file and the line number. When a run resumes, `resume` drops
what came after the restored step and an earlier final evaluation, says what it keeps and drops
(`Resumed.summary`), and reports the steps the ledger has no rows for (the file deleted or cut
short by hand): the checkpoint is intact and training goes on; only those rows are gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlvr_jax.program.runtime import event_files

METRICS_FILE = "metrics.jsonl"
# The kinds of record, in the "record" field of each line.
STEP = "step"
EVAL = "eval"
FINAL = "final"
STARTUP = "startup"
RECORD_KINDS = (STEP, EVAL, FINAL, STARTUP)
RECORD = "record"


def _record(path: Path, number: int, raw: bytes) -> dict[str, Any]:
    """One line as a record; ValueError (naming `path:number`) when it is not one."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path}:{number}: not UTF-8 text ({e.reason} at byte {e.start + 1} of the line): "
            f"{raw[:200]!r}"
        ) from e
    try:
        record = json.loads(line)
        record["step"] = int(record["step"])
        # Ledgers written before records had kinds hold training rows only as far as the reader
        # can tell.
        kind = record.setdefault(RECORD, STEP)
        if kind not in RECORD_KINDS:
            raise ValueError(f"unknown record kind {kind!r}")
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}:{number}: not a metrics entry ({e}): {line[:200]!r}") from e
    return record


def _parse(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The records of the ledger at `path` and its number of non-empty lines."""
    lines = path.read_bytes().split(b"\n")
    records, raw_lines = [], 0
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        raw_lines += 1
        try:
            records.append(_record(path, i + 1, raw))
        except ValueError:
            if i == len(lines) - 1:  # torn final write: no trailing newline after it
                logging.warning("%s: ignoring an incomplete last line", path)
                break
            raise
    return records, raw_lines


def read_metrics(workdir: str | Path) -> list[dict[str, Any]]:
    """Every record of `workdir/metrics.jsonl`, in the order written.

    Each record has "step", "record" (one of `RECORD_KINDS`; `STEP` where an older ledger has no
    such field), "time" and the metrics. A torn last line (a crash mid-write) is ignored; a bad
    line elsewhere (not JSON, not a record, not UTF-8) is a `ValueError` naming the file and
    line. No file: an empty list.
    """
    path = Path(workdir) / METRICS_FILE
    if not path.exists():
        return []
    return _parse(path)[0]


def step_rows(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The training steps' rows of `records` (periodic evaluations included), in order."""
    return [dict(r) for r in records if r.get(RECORD, STEP) == STEP]


def initial_eval(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The evaluation before training (the last `EVAL` record), or None."""
    found = [r for r in records if r.get(RECORD) == EVAL]
    return dict(found[-1]) if found else None


def final_eval(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The evaluation after training (the last `FINAL` record), or None (a run still going, or
    one stopped before writing it)."""
    found = [r for r in records if r.get(RECORD) == FINAL]
    return dict(found[-1]) if found else None


def series(
    records: Sequence[Mapping[str, Any]], key: str, drop_missing: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the scalar metric `key` over the records that hold it, as float64.

    Args:
      records: ledger records, in order.
      key: the metric name.
      drop_missing: leave out null (non-finite when written) and non-numeric values instead of
        returning them as NaN (a plot wants the gap; a sum wants them gone).
    """
    steps, values = [], []
    for r in records:
        if key not in r:
            continue
        v = r[key]
        number = isinstance(v, int | float) and not isinstance(v, bool)
        if drop_missing and not number:
            continue
        steps.append(r["step"])
        values.append(float(v) if number else math.nan)
    return np.asarray(steps, np.float64), np.asarray(values, np.float64)


@dataclasses.dataclass(frozen=True)
class Resumed:
    """The ledger as a run resuming from `step` found it.

    Attributes:
      step: the restored step.
      dropped: lines dropped (records after the step, earlier final evaluations, a torn line).
      existed: whether the file was there at all.
      missing_steps: steps 1..`step` that have no training row.
      has_eval: whether the evaluation before training is recorded.
      kept_rows: the training rows kept (those of steps 1..`step`).
      later: records dropped because their step is after `step` (with `step` 0: every record).
      finals: final evaluations dropped at or before `step` (the resumed run writes its own).
    """

    step: int
    dropped: int
    existed: bool
    missing_steps: tuple[int, ...]
    has_eval: bool
    kept_rows: int = 0
    later: int = 0
    finals: int = 0

    def summary(self) -> str | None:
        """One line on what the ledger keeps for the resumed run and what it drops to be written
        again; None for a fresh run in a workdir without an earlier ledger."""
        torn = self.dropped - self.later - self.finals
        if self.step == 0:
            if not self.dropped:
                return None
            return (
                f"metrics: no checkpoint to resume from, so the run starts over: the {self.dropped}"
                " records of an earlier attempt are dropped"
            )
        kept = f"keeping {self.kept_rows} step rows"
        if self.has_eval:
            kept += " and the evaluation before training"
        parts = [f"metrics: resuming from checkpoint step {self.step}", kept]
        if self.later:
            parts.append(
                f"dropping {self.later} records of the steps after {self.step}, which run again"
            )
        if self.finals:
            parts.append(
                "the final evaluation recorded earlier is dropped: it runs again when the run "
                "reaches its last step"
            )
        if torn:
            parts.append("an incomplete last line is dropped")
        return "; ".join(parts)

    def warning(self, path: Path) -> str | None:
        """One line on the rows the ledger lacks, or None when it lacks none."""
        if not self.missing_steps:
            return None
        what = "is missing" if not self.existed else "has no rows for some steps"
        return (
            f"metrics: {path} {what}: steps {spans(self.missing_steps)} have no rows (the run "
            f"resumes from its checkpoint at step {self.step}, which is intact; only those rows "
            "are lost)"
        )


def spans(steps: Sequence[int]) -> str:
    """ "1-3, 5, 7-8" for [1, 2, 3, 5, 7, 8]."""
    out, start, prev = [], None, None
    for s in [*sorted(steps), None]:
        if start is not None and (s is None or s != prev + 1):
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if s is not None and start is None:
            start = s
        prev = s
    return ", ".join(out)


def resume(workdir: str | Path, after_step: int) -> Resumed:
    """Makes `workdir/metrics.jsonl` the history of a run restarting from `after_step`
    (`truncate_metrics`) and says what it holds of steps 1..`after_step`.

    Raises:
      MetricsWriteError: the ledger cannot be read or rewritten (see `truncate_metrics`).
      ValueError: a line before the last is not a record (named by file and line).
    """
    path = Path(workdir) / METRICS_FILE
    try:
        existed = path.exists()
        records, raw_lines = _parse(path) if existed else ([], 0)
    except OSError as e:
        raise event_files.write_error(path, e, "read") from e
    kept = [r for r in records if after_step > 0 and r["step"] <= after_step and r[RECORD] != FINAL]
    if len(kept) != raw_lines:
        _rewrite(path, kept, after_step)
    rows = [r["step"] for r in kept if r[RECORD] == STEP]
    have = set(rows)
    later = sum(after_step == 0 or r["step"] > after_step for r in records)
    return Resumed(
        step=after_step,
        dropped=raw_lines - len(kept),
        existed=existed,
        missing_steps=tuple(s for s in range(1, after_step + 1) if s not in have),
        has_eval=any(r[RECORD] == EVAL for r in kept),
        kept_rows=len(rows),
        later=later,
        finals=sum(0 < r["step"] <= after_step and r[RECORD] == FINAL for r in records),
    )


def _rewrite(path: Path, records: Sequence[Mapping[str, Any]], after_step: int) -> None:
    tmp = path.with_suffix(".jsonl.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, allow_nan=False) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        # A half-written copy would only take space the run is short of.
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        why = f" (dropping the records after step {after_step} on resume)"
        raise event_files.write_error(path, e, "rewrite", why) from e


def truncate_metrics(workdir: str | Path, after_step: int) -> int:
    """Makes `workdir/metrics.jsonl` the history of a run restarting from `after_step`.

    Drops the records with step > `after_step` and every `FINAL` record (the evaluation an
    earlier attempt wrote when it stopped; the resumed run writes its own). `after_step=0` is a
    fresh run: everything is dropped, the evaluation before training included, since that run
    evaluates again. The file is rewritten through a temporary file and an atomic rename.

    Returns:
      How many lines were dropped (a torn last line counts).

    Raises:
      MetricsWriteError: the ledger cannot be read or rewritten (a full disk, a read-only
        directory); the ledger is left as it was.
    """
    return resume(workdir, after_step).dropped
