"""The metrics ledger's files, written in the caller's thread: one append per record.

A failed write (a full disk, a read-only workdir) raises `MetricsWriteError` naming the path and
the error at the step that hit it, and the file is cut back to its last whole record. TensorBoard
event records are framed here (tensorboardX builds the summaries) rather than through
tensorboardX's writer thread, whose queue blocks forever once the thread dies on a write error.

"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
import socket
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np


class MetricsWriteError(OSError):
    """A metrics file could not be written: a full disk, a read-only directory, an I/O error.

    The message names the path and the error ("metrics: cannot write /w/metrics.jsonl: [Errno 28]
    No space left on device"); `errno`, `strerror` and `filename` are those of the cause.
    """

    def __str__(self) -> str:
        # OSError would rebuild its message from errno and filename; keep the one written.
        return str(self.args[0]) if self.args else super().__str__()


def write_error(path: Any, e: OSError, what: str = "write", why: str = "") -> MetricsWriteError:
    cause = f"[Errno {e.errno}] {e.strerror}" if e.errno and e.strerror else str(e)
    err = MetricsWriteError(f"metrics: cannot {what} {path}{why}: {cause or type(e).__name__}")
    err.errno, err.strerror, err.filename = e.errno, e.strerror, str(path)
    return err


def open_append(path: Path) -> Any:
    """Opens `path` for appending, unbuffered, so each append is one write that fails at once.

    The one place files are opened for appending, so tests can inject I/O faults here.
    """
    return open(path, "ab", buffering=0)  # noqa: SIM115


class AppendFile:
    """A file that grows by whole records: an append that fails is cut off again, so a full disk
    leaves no torn line (or broken event record) ahead of what a resumed run appends."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self._f = open_append(path)
            self._size = self._f.seek(0, os.SEEK_END)
        except OSError as e:
            raise write_error(path, e, "open", " for appending") from e

    def append(self, data: bytes) -> None:
        try:
            view = memoryview(data)
            while view:
                n = self._f.write(view)
                if not n:  # would loop forever otherwise
                    raise OSError(errno.EIO, "the write made no progress")
                view = view[n:]
        except OSError as e:
            with contextlib.suppress(OSError):  # shrinking needs no free space
                self._f.truncate(self._size)
            raise write_error(self.path, e) from e
        self._size += len(data)

    def sync(self) -> None:
        try:
            os.fsync(self._f.fileno())
        except OSError as e:
            raise write_error(self.path, e, "sync") from e

    def close(self) -> None:
        try:
            self._f.close()
        except OSError as e:
            raise write_error(self.path, e, "close") from e


@functools.cache
def tensorflow_bins() -> list[float]:
    """TensorFlow's default histogram bucket limits (tensorboardX's `bins="tensorflow"`)."""
    positive, v = [], 1e-12
    while v < 1e20:
        positive.append(v)
        v *= 1.1
    return [-x for x in reversed(positive)] + [0.0] + positive


class EventFile:
    """A TensorBoard event file, written in the caller's thread: one append per step.

    tensorboardX's `SummaryWriter` hands events to a background thread through a bounded queue.
    When a write fails (a full disk) that thread dies, and a later `add_scalar` blocks forever on
    the full queue. Written here, the failure is an exception in the step that hit it.
    """

    def __init__(self, logdir: Path, purge_step: int, now: float):
        from tensorboardX import summary
        from tensorboardX.proto import event_pb2
        from tensorboardX.record_writer import masked_crc32c

        self._summary, self._pb, self._crc = summary, event_pb2, masked_crc32c
        try:
            logdir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise write_error(logdir, e, "create") from e
        # pid and a counter: two writers in one second (a quick restart) get two files.
        name = f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}"
        self._file = AppendFile(logdir / f"{name}.{next(EVENT_FILES)}")
        self.path = self._file.path
        # The restart marker makes TensorBoard hide events an earlier attempt wrote from
        # `purge_step` on.
        start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
        self.write(
            [
                event_pb2.Event(wall_time=now, step=purge_step, file_version="brain.Event:2"),
                event_pb2.Event(wall_time=now, step=purge_step, session_log=start),
            ]
        )

    def events(self, step: int, now: float, values: Mapping[str, Any]) -> list[Any]:
        """The step's scalars and histograms as events."""
        summaries = []
        for name, v in values.items():
            if isinstance(v, int | float):
                summaries.append(self._summary.scalar(name, v))
            elif not isinstance(v, list) or not v or any(x is None for x in v):
                continue
            elif name.endswith("_hist"):  # counts of the values 0, 1, ..., len - 1
                if sum(v) > 0:
                    summaries.append(self._summary.histogram_raw(name, **histogram_args(v)))
            else:  # one value per item (per prompt, say): their distribution
                hist = self._summary.histogram(name, np.asarray(v), tensorflow_bins())
                summaries.append(hist)
        return [self._pb.Event(wall_time=now, step=step, summary=s) for s in summaries]

    def write(self, events: Sequence[Any]) -> None:
        """Appends `events` (TFRecord framing: length, its crc, data, its crc) in one write."""
        out = []
        for event in events:
            data = event.SerializeToString()
            header = struct.pack("<Q", len(data))
            out += [header, struct.pack("<I", self._crc(header)), data]
            out.append(struct.pack("<I", self._crc(data)))
        self._file.append(b"".join(out))

    def sync(self) -> None:
        self._file.sync()

    def close(self) -> None:
        self._file.close()


EVENT_FILES = itertools.count()


def histogram_args(counts: list[float]) -> dict[str, Any]:
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
