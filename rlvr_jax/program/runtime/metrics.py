"""The metrics ledger: every metric of every step to JSONL, TensorBoard, optionally Weights &
Biases, and a progress line on the console.

Host code. A step's metrics arrive as a flat dict of device scalars (and the odd list, such as a
histogram of group success counts); `MetricsWriter.write` fetches them with one `device_get`, so
the only host sync per step is the one the caller chooses to make (ideally after dispatching the
next step). Only process 0 writes; other processes get a writer whose methods do nothing.

`workdir/metrics.jsonl` holds one JSON object per record: "step", the record's kind ("record":
`STEP` for a training step's row, which may carry a periodic evaluation too; `EVAL` for the
evaluation before training, at step 0; `FINAL` for the evaluation after training, at the last
step; `STARTUP` for what the process spent before its first step, at that step: compilations,
reads from the compile cache, and the seconds of the evaluation before training, of waiting for
the programs compiled ahead and of the first step itself), wall-clock "time", then the metrics.
Every record is kept, so a training row and the final evaluation of the same step are two lines.
Non-finite values are written as null (strict JSON) and counted. When a run resumes from a
checkpoint, step rows past the restored step and the previous attempt's final evaluation are
dropped, so the file describes one history; steps before it that have no rows (the file deleted
or cut short) are named in a warning on the console, and the run goes on (`ledger.resume`).
Reading and rewriting the file is `program.runtime.ledger`, whose names this module re-exports.

Every file is written in the caller's thread, one append per step, so a full disk or a read-only
directory stops the run at that step with one `MetricsWriteError` naming the path and the error,
instead of a background writer dying and a later write waiting on it forever.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

import jax
import numpy as np

from rlvr_jax.config_types import MissingPackageError
from rlvr_jax.program.runtime import event_files, ledger
from rlvr_jax.program.runtime.event_files import MetricsWriteError
from rlvr_jax.program.runtime.ledger import (
    EVAL,
    FINAL,
    METRICS_FILE,
    RECORD,
    RECORD_KINDS,
    STARTUP,
    STEP,
    final_eval,
    initial_eval,
    read_metrics,
    series,
    step_rows,
    truncate_metrics,
)

__all__ = [
    "EVAL",
    "FINAL",
    "METRICS_FILE",
    "RECORD",
    "RECORD_KINDS",
    "ROLLOUT_TOKENS",
    "STARTUP",
    "STEP",
    "STEP_TIME",
    "TOKENS_PER_S",
    "MetricsWriteError",
    "MetricsWriter",
    "StageTimer",
    "final_eval",
    "initial_eval",
    "read_metrics",
    "series",
    "step_rows",
    "tokens_per_second",
    "truncate_metrics",
]

# Names the writer derives throughput from.
STEP_TIME = "time/step"
ROLLOUT_TOKENS = "rollout/tokens"
TOKENS_PER_S = "throughput/tokens_per_s"
_RESERVED = ("step", RECORD, "time")

# Console headline: (label, metric name, format).
_HEADLINE = (
    ("reward", "reward/mean", "{:.3f}"),
    ("acc", "accuracy", "{:.3f}"),
    ("len", "length/mean", "{:.0f}"),
    ("kl", "kl/mean", "{:.2e}"),
    ("s/step", STEP_TIME, "{:.2f}"),
    ("tok/s", TOKENS_PER_S, "{:.0f}"),
    # Verified useful trajectories per hour of step time (`program.runtime.useful`).
    ("useful/h", "useful/per_hour", "{:.0f}"),
)
_BAR_WIDTH = 20


# ---------------------------------------------------------------------------------------------
# Timing


class StageTimer:
    """Wall-clock durations of the named stages of one step, as "time/<stage>" metrics.

    JAX dispatches asynchronously: a stage that launches device work must block on its result
    (`jax.block_until_ready`) inside the `with` block, or the time lands in a later stage::

        timer = StageTimer()
        with timer.stage("step"):
            with timer.stage("rollout"):
                rollout = jax.block_until_ready(rollout_fn(params, batch, key))
            ...
        metrics.update(timer.metrics())
    """

    def __init__(self) -> None:
        self._durations: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Times the body; a stage entered twice in one step accumulates."""
        if not name or "/" in name:
            raise ValueError(f"stage name {name!r} must be non-empty and contain no '/'")
        start = time.perf_counter()
        try:
            yield
        finally:
            self.record(name, time.perf_counter() - start)

    def record(self, name: str, seconds: float) -> None:
        """Adds a duration measured elsewhere."""
        if not seconds >= 0:
            raise ValueError(f"duration of stage {name!r} is {seconds}; must be >= 0")
        self._durations[name] = self._durations.get(name, 0.0) + float(seconds)

    def metrics(self, reset: bool = True) -> dict[str, float]:
        """{"time/<stage>": seconds}; clears the timer for the next step unless `reset=False`."""
        out = {f"time/{name}": seconds for name, seconds in self._durations.items()}
        if reset:
            self._durations = {}
        return out


def tokens_per_second(num_tokens: float, seconds: float) -> float:
    """Throughput; NaN when no time has elapsed (so it is reported as missing, not infinite)."""
    if seconds <= 0:
        return math.nan
    return float(num_tokens) / float(seconds)


# ---------------------------------------------------------------------------------------------
# Values


def _to_python(name: str, value: Any) -> float | int | list | None:
    """A fetched metric as a JSON value: scalars to float (int for integers), 1-D arrays and
    sequences to lists of floats, non-finite floats to NaN (turned into null by the caller)."""
    if isinstance(value, bool | np.bool_):
        return int(value)
    if isinstance(value, int | np.integer):
        return int(value)
    arr = np.asarray(value)
    if arr.dtype.kind == "V" and jax.dtypes.issubdtype(arr.dtype, np.floating):
        arr = arr.astype(np.float32)  # bfloat16 (a bf16 model's grad_norm): numpy kind "V"
    if arr.dtype == object or arr.dtype.kind not in "biuf":
        raise TypeError(f"metric {name!r} has non-numeric value {value!r}")
    if arr.ndim == 0:
        return int(arr) if arr.dtype.kind in "biu" else float(arr)
    if arr.ndim == 1:
        return [float(x) for x in arr]
    raise ValueError(f"metric {name!r} has shape {arr.shape}; expected a scalar or a 1-D list")


def _flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise TypeError(f"metric name {key!r} must be a str")
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "/"))
        else:
            out[name] = value
    return out


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _scrub(name: str, value: Any, bad: list[str]) -> Any:
    """Non-finite floats (also inside lists) become None; their names go to `bad`."""
    if isinstance(value, float) and not math.isfinite(value):
        bad.append(name)
        return None
    if isinstance(value, list) and not all(math.isfinite(x) for x in value):
        bad.append(name)
        return [_finite_or_none(x) for x in value]
    return value


# ---------------------------------------------------------------------------------------------
# The writer


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError as e:
        raise MissingPackageError(
            "use_wandb=True but the `wandb` package is not installed; `pip install wandb` or "
            "turn W&B logging off"
        ) from e
    return wandb


def _format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class MetricsWriter:
    """Writes each step's metrics to JSONL, TensorBoard, W&B and the console (process 0 only).

    Every file is written in the caller's thread and a write that fails (a full disk, a
    read-only directory) raises `MetricsWriteError` at once, naming the path and the error; the
    writer then releases its files and every later `write` raises the same error. `close` never
    raises over an exception already on its way (it logs its own failure instead), and after a
    failed write it only releases what is left.

    Args:
      workdir: where metrics.jsonl, the TensorBoard events (`workdir/tensorboard`) and the W&B
        files go.
      process_index: this process's index (`jax.process_index()`); only 0 writes.
      use_tensorboard: write TensorBoard event files.
      use_wandb: log to Weights & Biases (the `wandb` package is imported only then).
      log_every: console lines every this many steps (files get every step).
      total_steps: the run's length, for the progress bar and the time remaining.
      resume_step: the step the run restarts from; the JSONL keeps the records up to it but not
        an earlier attempt's final evaluation (`truncate_metrics`), and TensorBoard hides its
        events after it. 0 (a fresh run) drops any earlier history. One console line says what
        is kept and what is dropped to be written again (`ledger.Resumed.summary`); steps up to
        it without a row are named in a warning (`ledger.Resumed.warning`).
      wandb_project, wandb_name, wandb_config: passed to `wandb.init`; the run id is kept in
        `workdir/wandb_run_id` so a resumed run continues the same W&B run.
      stream: the console (default stdout). A terminal gets one self-overwriting progress line;
        anything else (a log file) one line per logging interval.

    Attributes:
      nonfinite: how many times each metric was written as null.
      missing_eval: a resumed ledger without the evaluation before training (the caller may
        write it again from the checkpoint).

    Raises:
      MetricsWriteError: from the constructor, `write`, `flush` and `close` when a file cannot be
        created or written.
      ValueError: a resumed ledger with a damaged line before its last (named by file and line).
    """

    def __init__(
        self,
        workdir: str | Path,
        process_index: int = 0,
        use_tensorboard: bool = True,
        use_wandb: bool = False,
        log_every: int = 1,
        total_steps: int | None = None,
        resume_step: int = 0,
        wandb_project: str | None = None,
        wandb_name: str | None = None,
        wandb_config: Mapping[str, Any] | None = None,
        stream: TextIO | None = None,
    ):
        if log_every < 1:
            raise ValueError(f"log_every={log_every} must be at least 1")
        if total_steps is not None and total_steps < 1:
            raise ValueError(f"total_steps={total_steps} must be at least 1 (or None)")
        if resume_step < 0:
            raise ValueError(f"resume_step={resume_step} must be >= 0")
        self.workdir = Path(workdir)
        self.active = process_index == 0
        self.log_every = log_every
        self.total_steps = total_steps
        self.nonfinite: Counter[str] = Counter()
        self.missing_eval = False
        self._stream = stream if stream is not None else sys.stdout
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._jsonl: event_files.AppendFile | None = None
        self._tb: event_files.EventFile | None = None
        self._wandb_run = None
        self._first: tuple[int, float] | None = None  # (step, time) of the first write
        self._bar_open = False
        self._closed = False
        self._error: MetricsWriteError | None = None  # the first failed write
        if not self.active:
            return
        wandb = _import_wandb() if use_wandb else None  # fail before any file is opened
        try:
            try:
                self.workdir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise event_files.write_error(self.workdir, e, "create") from e
            resumed = ledger.resume(self.workdir, resume_step)
            self.missing_eval = resume_step > 0 and not resumed.has_eval
            said = resumed.summary() if resumed.existed else None
            if said is not None:
                self._print(said)
            gap = resumed.warning(self.workdir / METRICS_FILE)
            if gap is not None:
                logging.warning("%s", gap)
                self._print(gap)
            self._jsonl = event_files.AppendFile(self.workdir / METRICS_FILE)
            if use_tensorboard:
                self._tb = event_files.EventFile(
                    self.workdir / "tensorboard", resume_step + 1, time.time()
                )
            if wandb is not None:
                self._wandb_run = self._init_wandb(wandb, wandb_project, wandb_name, wandb_config)
        except BaseException:
            self._release()
            self._closed = True
            raise

    def _init_wandb(
        self,
        wandb: Any,
        project: str | None,
        name: str | None,
        config: Mapping[str, Any] | None,
    ) -> Any:
        id_file = self.workdir / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.exists() else None
        run = wandb.init(
            project=project,
            name=name,
            config=dict(config or {}),
            dir=str(self.workdir),
            id=run_id,
            resume="allow",
        )
        if run_id is None and getattr(run, "id", None):
            try:
                id_file.write_text(str(run.id))
            except OSError as e:
                raise event_files.write_error(id_file, e) from e
        return run

    def write(
        self, step: int, metrics: Mapping[str, Any], record: str = STEP
    ) -> dict[str, Any] | None:
        """Records one step's metrics, or an evaluation. One `device_get` fetches every value.

        Args:
          step: the step number (a Python int): 0 for the evaluation before training, the last
            step for the final one.
          metrics: a flat (or nested, joined with "/") dict of scalars or 1-D lists; JAX or numpy
            values are fine.
          record: the kind of record, one of `RECORD_KINDS`: `STEP` (a training step, with any
            periodic evaluation), `EVAL` (before training) or `FINAL` (after training).

        Returns:
          The record as written to JSONL (process 0), or None (other processes).

        Raises:
          MetricsWriteError: a file could not be written (now or at an earlier write).
        """
        if self._error is not None:
            raise self._again()
        if self._closed:
            raise RuntimeError(f"MetricsWriter({str(self.workdir)!r}) is closed")
        if not self.active:
            return None
        if isinstance(step, bool) or not isinstance(step, int | np.integer):
            raise TypeError(f"step={step!r} must be an int")
        step = int(step)
        if record not in RECORD_KINDS:
            raise ValueError(f"record={record!r}; expected one of {RECORD_KINDS}")
        flat = _flatten(metrics)
        if any(name in flat for name in _RESERVED):
            raise ValueError(f"metric names {_RESERVED} are reserved for the ledger")
        fetched = jax.device_get(flat)
        values = {name: _to_python(name, v) for name, v in fetched.items()}
        if TOKENS_PER_S not in values and ROLLOUT_TOKENS in values and STEP_TIME in values:
            values[TOKENS_PER_S] = tokens_per_second(values[ROLLOUT_TOKENS], values[STEP_TIME])
        bad: list[str] = []
        values = {name: _scrub(name, v, bad) for name, v in values.items()}
        for name in bad:
            if not self.nonfinite[name]:
                logging.warning("metric %s is not finite at step %d (written as null)", name, step)
            self.nonfinite[name] += 1
        now = time.time()
        if self._first is None and record == STEP:  # evaluations would skew the time left
            self._first = (step, now)
        entry = {"step": step, RECORD: record, "time": now, **values}
        # Built before anything is written, so a bad value cannot leave the files disagreeing.
        events = [] if self._tb is None else self._tb.events(step, now, values)
        try:
            self._jsonl.append((json.dumps(entry, allow_nan=False) + "\n").encode())
            if self._tb is not None:
                self._tb.write(events)
            if self._wandb_run is not None:
                scalars = {k: v for k, v in values.items() if isinstance(v, int | float)}
                self._wandb_run.log(scalars, step=step)
            last = self.total_steps is not None and step >= self.total_steps
            if record != STARTUP and (step % self.log_every == 0 or last):
                self._console(step, values, now)
        except MetricsWriteError as e:
            self._fail(e)
            raise
        return entry

    def _fail(self, error: MetricsWriteError) -> None:
        """Keeps the first failure and lets go of the files: nothing more is written."""
        self._error = error
        self._release()

    def _again(self) -> MetricsWriteError:
        first = self._error
        err = MetricsWriteError(f"{first} (an earlier write failed; the writer is stopped)")
        err.errno, err.strerror, err.filename = first.errno, first.strerror, first.filename
        return err

    def _release(self) -> None:
        """Closes the files, ignoring their errors (there is already one to report)."""
        for sink in (self._jsonl, self._tb):
            if sink is not None:
                with contextlib.suppress(OSError):
                    sink.close()
        self._jsonl = self._tb = None

    def _console(self, step: int, values: Mapping[str, Any], now: float) -> None:
        parts = []
        for label, name, fmt in _HEADLINE:
            v = values.get(name)
            if isinstance(v, int | float):
                parts.append(f"{label} {fmt.format(v)}")
        if self.total_steps:
            frac = min(max(step / self.total_steps, 0.0), 1.0)
            filled = int(round(frac * _BAR_WIDTH))
            head = f"[{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] {step}/{self.total_steps}"
            # Timed from the first step written, so the first step's compilation is excluded.
            first_step, first_time = self._first or (step, now)
            if step > first_step and step < self.total_steps:
                eta = (now - first_time) / (step - first_step) * (self.total_steps - step)
                parts.append(f"eta {_format_duration(eta)}")
        else:
            head = f"step {step}"
        line = " | ".join([head, *parts])
        if self._tty:
            text = "\r\x1b[2K" + line
            self._bar_open = True
            if self.total_steps is not None and step >= self.total_steps:
                text += "\n"
                self._bar_open = False
            self._emit(text)
        else:
            self._emit(line + "\n")

    def _emit(self, text: str) -> None:
        """Writes to the console; stdout redirected to a full disk fails like a file."""
        try:
            self._stream.write(text)
            self._stream.flush()
        except OSError as e:
            raise event_files.write_error(getattr(self._stream, "name", "the console"), e) from e

    def _print(self, message: str) -> None:
        """A full line on the console, not overwritten by the progress bar."""
        text = message + "\n"
        if self._bar_open:
            text = "\n" + text
            self._bar_open = False
        self._emit(text)

    def print(self, message: str) -> None:
        """Prints a message (process 0 only) without garbling the progress line."""
        if self.active:
            self._print(message)

    def flush(self) -> None:
        """Forces the ledger and the TensorBoard events to stable storage (`fsync`).

        Each `write` already hands them to the operating system; this is for a caller that wants
        them to survive a machine crash too.
        """
        if self._error is not None:
            raise self._again()
        try:
            for sink in (self._jsonl, self._tb):
                if sink is not None:
                    sink.sync()
        except MetricsWriteError as e:
            self._fail(e)
            raise

    def close(self) -> None:
        """Closes every sink; a summary of non-finite metrics goes to the console.

        Idempotent. After a failed write it only releases what is left and raises nothing (the
        failure was raised already). A failure while closing is raised, unless an exception is
        being handled (`close` in an `except` block or `__exit__`): then it is logged, so the
        first error is the one that propagates.
        """
        self._close(in_flight=sys.exc_info()[1] is not None)

    def _close(self, in_flight: bool) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.active:
            return
        errors: list[MetricsWriteError] = []
        if self._error is None:
            try:
                if self.nonfinite:
                    counts = ", ".join(f"{k} x{n}" for k, n in sorted(self.nonfinite.items()))
                    self._print(f"metrics: non-finite values written as null: {counts}")
                elif self._bar_open:
                    self._bar_open = False
                    self._emit("\n")
            except MetricsWriteError as e:
                errors.append(e)
        for sink in (self._jsonl, self._tb):
            if sink is not None:
                try:
                    sink.close()
                except MetricsWriteError as e:
                    errors.append(e)
        self._jsonl = self._tb = None
        if self._wandb_run is not None:
            run, self._wandb_run = self._wandb_run, None
            run.finish()
        if errors and self._error is None:
            self._error = errors[0]
            if not in_flight:
                raise errors[0]
            logging.error("%s (while closing after another error)", errors[0])

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._close(in_flight=exc is not None)
