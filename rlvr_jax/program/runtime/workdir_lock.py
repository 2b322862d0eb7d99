"""One run per workdir: an exclusive lock on `<workdir>/.lock` while a process writes there.

Host code. Two trainers on one workdir would interleave their ledgers and delete each other's
checkpoints, so whatever writes into a run's workdir holds the lock: training (`main`, and
`program.runtime.run.run_stage` for callers in a process of their own), `eval` when its JSON goes
into the workdir, `export` when `--out` lies inside it. A second one refuses at once with
`WorkdirBusyError`, naming the holder's pid, host, purpose and start time; the commands then exit
with status `BUSY_EXIT_STATUS` (2). Reading a run's checkpoints (`eval --out` elsewhere, `export`
to another directory) takes no lock: orbax renames a checkpoint into place only when it is
complete, so a reader never sees half a save, and a running trainer can be evaluated.

The lock is `fcntl.flock` on the file, so the kernel releases it when the holder exits in any way
(SIGKILL included) and a stale lock file never blocks a later run. The file stays in place after
a run: deleting it would let a process that opened the old file and one that creates a new one
both hold "the" lock. It records the holder (JSON: pid, host, purpose, start time, command) for
the message a refused process prints. Taking the lock again in the process that holds it only
counts (main holds it; the run skeleton inside it takes it again); `flock` itself would refuse
a second open file of the same process.

In a multi-host run only the primary process takes the lock (the others write through orbax to
the same checkpoints). Some network file systems do not implement `flock`; there the lock fails
with an `OSError` naming the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = ".lock"
# The exit status of a command refused because another process holds the workdir.
BUSY_EXIT_STATUS = 2


class WorkdirBusyError(RuntimeError):
    """Another process holds the workdir's lock; the message names it.

    Attributes:
      workdir: the workdir.
      holder: what the lock file says about the holder ({} when it says nothing readable).
    """

    def __init__(self, message: str, workdir: Path, holder: dict):
        super().__init__(message)
        self.workdir = workdir
        self.holder = holder


@dataclasses.dataclass
class _Held:
    fd: int
    count: int


_HELD: dict[str, _Held] = {}
_GUARD = threading.Lock()


def _key(workdir: Path) -> str:
    return os.path.realpath(workdir)


def read_holder(workdir: str | os.PathLike) -> dict:
    """What `<workdir>/.lock` says about its holder (or last holder): {} when nothing readable.

    The file outlives its holder, so this alone does not tell whether the lock is held; `acquire`
    does.
    """
    try:
        holder = json.loads((Path(workdir) / LOCK_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def describe(holder: dict) -> str:
    """ "pid 123 on host h (training, since 2025-01-01 12:00:00)", or a note that it is unknown."""
    if "pid" not in holder:
        return "a process that has not recorded itself in the lock file yet"
    since = holder.get("since")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if since else "?"
    return (
        f"pid {holder['pid']} on host {holder.get('host', '?')} "
        f"({holder.get('purpose', '?')}, since {when})"
    )


def _busy(workdir: Path) -> WorkdirBusyError:
    holder = {}
    # The holder writes its record right after locking: give a very fresh one a moment.
    for _ in range(20):
        holder = read_holder(workdir)
        if holder:
            break
        time.sleep(0.05)
    pid = holder.get("pid")
    training = holder.get("purpose") == "training"
    stop = f" (`kill {pid}` stops it at its next step, saved)" if pid and training else ""
    return WorkdirBusyError(
        f"{workdir} is in use by {describe(holder)}: {workdir / LOCK_FILE} is locked, and two "
        f"processes writing one workdir would corrupt its ledger and checkpoints. Wait for it to "
        f"end{stop}, or use another workdir.",
        workdir,
        holder,
    )


def acquire(workdir: str | os.PathLike, purpose: str) -> None:
    """Takes the workdir's lock (creating the directory and the lock file as needed).

    Args:
      workdir: the run's directory.
      purpose: what this process does there ("training", "evaluation", "export"), for the
        message another process gets.

    Raises:
      WorkdirBusyError: another process holds it.
      OSError: the lock file cannot be created or locked (a read-only directory, a file system
        without `flock`); the message names the file.
    """
    workdir = Path(workdir)
    key = _key(workdir)
    with _GUARD:
        held = _HELD.get(key)
        if held is not None:
            held.count += 1
            return
        path = workdir / LOCK_FILE
        try:
            workdir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise OSError(e.errno, f"cannot create the workdir lock {path}: {e.strerror}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise OSError(e.errno, f"cannot lock {path}: {e.strerror}") from e
            try:
                raise _busy(workdir) from None
            finally:
                os.close(fd)
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "purpose": purpose,
            "since": time.time(),
            "command": " ".join(sys.argv),
        }
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        except OSError as e:
            os.close(fd)
            raise OSError(e.errno, f"cannot write the workdir lock {path}: {e.strerror}") from e
        _HELD[key] = _Held(fd, 1)


def release(workdir: str | os.PathLike) -> None:
    """Gives back one `acquire` of this process; the last one unlocks. Not held: nothing."""
    key = _key(Path(workdir))
    with _GUARD:
        held = _HELD.get(key)
        if held is None:
            return
        held.count -= 1
        if held.count:
            return
        del _HELD[key]
        # Closing the file releases the flock.
        with contextlib.suppress(OSError):
            os.close(held.fd)


def held(workdir: str | os.PathLike) -> bool:
    """Whether this process holds the workdir's lock."""
    with _GUARD:
        return _key(Path(workdir)) in _HELD


@contextlib.contextmanager
def hold(workdir: str | os.PathLike, purpose: str, enabled: bool = True) -> Iterator[None]:
    """Holds the workdir's lock for the body (see `acquire`); `enabled=False` (a multi-host
    run's other processes) takes none."""
    if not enabled:
        yield
        return
    acquire(workdir, purpose)
    try:
        yield
    finally:
        release(workdir)


def inside(path: str | os.PathLike, workdir: str | os.PathLike) -> bool:
    """Whether `path` is `workdir` or lies below it (symbolic links resolved)."""
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(workdir))
