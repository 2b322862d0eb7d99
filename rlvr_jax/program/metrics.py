"""The metrics ledger: every metric of every step to JSONL, TensorBoard, optionally Weights &
Biases, and a progress line on the console.

Host code. A step's metrics arrive as a flat dict of device scalars (and the odd list, such as a
histogram of group success counts); `MetricsWriter.write` fetches them with one `device_get`, so
the only host sync per step is the one the caller chooses to make (ideally after dispatching the
next step). Only process 0 writes; other processes get a writer whose methods do nothing.

`workdir/metrics.jsonl` holds one JSON object per step: "step", wall-clock "time", then the
metrics. Non-finite values are written as null (strict JSON) and counted. When a run resumes from
a checkpoint, entries past the restored step are dropped so the file describes one history.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

import jax
import numpy as np

METRICS_FILE = "metrics.jsonl"
# Names the writer derives throughput from, and the stage names the training loop uses.
STEP_TIME = "time/step"
ROLLOUT_TOKENS = "rollout/tokens"
TOKENS_PER_S = "throughput/tokens_per_s"
STAGES = ("select", "rollout", "verify", "update", "step")

# Console headline: (label, metric name, format).
_HEADLINE = (
    ("reward", "reward/mean", "{:.3f}"),
    ("acc", "accuracy", "{:.3f}"),
    ("len", "length/mean", "{:.0f}"),
    ("kl", "kl/mean", "{:.2e}"),
    ("s/step", STEP_TIME, "{:.2f}"),
    ("tok/s", TOKENS_PER_S, "{:.0f}"),
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


def read_metrics(workdir: str | Path) -> list[dict[str, Any]]:
    """The entries of `workdir/metrics.jsonl`, sorted by step; a later entry for a step replaces
    an earlier one. A torn last line (a crash mid-write) is ignored; a bad line elsewhere is an
    error naming the file and line. No file: an empty list."""
    path = Path(workdir) / METRICS_FILE
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    by_step: dict[int, dict[str, Any]] = {}
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            step = int(entry["step"])
        except (ValueError, KeyError, TypeError) as e:
            if i == len(lines) - 1:  # torn final write: no trailing newline after it
                logging.warning("%s: ignoring an incomplete last line", path)
                break
            raise ValueError(f"{path}:{i + 1}: not a metrics entry ({e}): {line[:200]!r}") from e
        by_step[step] = entry
    return [by_step[s] for s in sorted(by_step)]


def truncate_metrics(workdir: str | Path, after_step: int) -> int:
    """Drops the entries of `workdir/metrics.jsonl` with step > `after_step` (rewritten through a
    temporary file and an atomic rename). Returns how many were dropped."""
    path = Path(workdir) / METRICS_FILE
    if not path.exists():
        return 0
    entries = read_metrics(workdir)
    kept = [e for e in entries if e["step"] <= after_step]
    raw_lines = sum(1 for line in path.read_text(encoding="utf-8").split("\n") if line.strip())
    if len(kept) == raw_lines:
        return 0
    tmp = path.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for entry in kept:
            f.write(json.dumps(entry, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return raw_lines - len(kept)


# ---------------------------------------------------------------------------------------------
# The writer


def _histogram_args(counts: list[float]) -> dict[str, Any]:
    """TensorBoard histogram fields for counts of the integer values 0, 1, ..., len - 1 (such as
    the number of groups with i correct samples): bucket i spans (i - 0.5, i + 0.5]."""
    values = [i for i, c in enumerate(counts) if c > 0]
    return {
        "min": float(values[0]),
        "max": float(values[-1]),
        "num": float(sum(counts)),
        "sum": float(sum(i * c for i, c in enumerate(counts))),
        "sum_squares": float(sum(i * i * c for i, c in enumerate(counts))),
        "bucket_limits": [i + 0.5 for i in range(len(counts))],
        "bucket_counts": [float(c) for c in counts],
    }


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError as e:
        raise ImportError(
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

    Args:
      workdir: where metrics.jsonl, the TensorBoard events (`workdir/tensorboard`) and the W&B
        files go.
      process_index: this process's index (`jax.process_index()`); only 0 writes.
      use_tensorboard: write TensorBoard event files (tensorboardX).
      use_wandb: log to Weights & Biases (the `wandb` package is imported only then).
      log_every: console lines every this many steps (files get every step).
      total_steps: the run's length, for the progress bar and the time remaining.
      resume_step: the step the run restarts from; entries after it are dropped from the JSONL
        and TensorBoard hides its events after it. 0 (a fresh run) drops any earlier history.
      wandb_project, wandb_name, wandb_config: passed to `wandb.init`; the run id is kept in
        `workdir/wandb_run_id` so a resumed run continues the same W&B run.
      stream: the console (default stdout). A terminal gets one self-overwriting progress line;
        anything else (a log file) one line per logging interval.
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
        self._stream = stream if stream is not None else sys.stdout
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._tb = None
        self._wandb_run = None
        self._first: tuple[int, float] | None = None  # (step, time) of the first write
        self._bar_open = False
        self._closed = False
        if not self.active:
            return
        wandb = _import_wandb() if use_wandb else None  # fail before any file is opened
        self.workdir.mkdir(parents=True, exist_ok=True)
        dropped = truncate_metrics(self.workdir, resume_step)
        if dropped:
            self._print(f"metrics: dropped {dropped} entries after step {resume_step} (resumed)")
        # Open for the writer's lifetime (closed in `close`); lines are flushed one by one.
        self._file = open(self.workdir / METRICS_FILE, "a", encoding="utf-8")  # noqa: SIM115
        if use_tensorboard:
            from tensorboardX import SummaryWriter

            # purge_step hides events a previous attempt wrote after the resume point.
            self._tb = SummaryWriter(
                str(self.workdir / "tensorboard"),
                purge_step=resume_step + 1,
                flush_secs=30,
            )
        if wandb is not None:
            self._wandb_run = self._init_wandb(wandb, wandb_project, wandb_name, wandb_config)

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
            id_file.write_text(str(run.id))
        return run

    def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any] | None:
        """Records one step. One `device_get` fetches every value.

        Args:
          step: the step number (a Python int).
          metrics: a flat (or nested, joined with "/") dict of scalars or 1-D lists; JAX or numpy
            values are fine.

        Returns:
          The entry as written to JSONL (process 0), or None (other processes).
        """
        if self._closed:
            raise RuntimeError(f"MetricsWriter({str(self.workdir)!r}) is closed")
        if not self.active:
            return None
        if isinstance(step, bool) or not isinstance(step, int | np.integer):
            raise TypeError(f"step={step!r} must be an int")
        step = int(step)
        flat = _flatten(metrics)
        if "step" in flat or "time" in flat:
            raise ValueError("metric names 'step' and 'time' are reserved for the ledger")
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
        if self._first is None:
            self._first = (step, now)
        entry = {"step": step, "time": now, **values}
        self._file.write(json.dumps(entry, allow_nan=False) + "\n")
        self._file.flush()
        scalars = {k: v for k, v in values.items() if isinstance(v, int | float)}
        if self._tb is not None:
            for name, v in scalars.items():
                self._tb.add_scalar(name, v, step, walltime=now)
            for name, v in values.items():
                if not isinstance(v, list) or not v or any(x is None for x in v):
                    continue
                if name.endswith("_hist"):  # counts of the values 0, 1, ..., len - 1
                    if sum(v) > 0:
                        self._tb.add_histogram_raw(
                            name, **_histogram_args(v), global_step=step, walltime=now
                        )
                else:  # one value per item (per prompt, say): their distribution
                    self._tb.add_histogram(name, np.asarray(v), step, walltime=now)
        if self._wandb_run is not None:
            self._wandb_run.log(scalars, step=step)
        last = self.total_steps is not None and step >= self.total_steps
        if step % self.log_every == 0 or last:
            self._console(step, values, now)
        return entry

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
            self._stream.write("\r\x1b[2K" + line)
            self._bar_open = True
            if self.total_steps is not None and step >= self.total_steps:
                self._stream.write("\n")
                self._bar_open = False
        else:
            self._stream.write(line + "\n")
        self._stream.flush()

    def _print(self, message: str) -> None:
        """A full line on the console, not overwritten by the progress bar."""
        if self._bar_open:
            self._stream.write("\n")
            self._bar_open = False
        self._stream.write(message + "\n")
        self._stream.flush()

    def print(self, message: str) -> None:
        """Prints a message (process 0 only) without garbling the progress line."""
        if self.active:
            self._print(message)

    def flush(self) -> None:
        """Pushes buffered TensorBoard events to disk."""
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        """Flushes and closes every sink; a summary of non-finite metrics goes to the console."""
        if self._closed:
            return
        self._closed = True
        if not self.active:
            return
        if self.nonfinite:
            counts = ", ".join(f"{k} x{n}" for k, n in sorted(self.nonfinite.items()))
            self._print(f"metrics: non-finite values written as null: {counts}")
        elif self._bar_open:
            self._stream.write("\n")
            self._bar_open = False
        self._file.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
