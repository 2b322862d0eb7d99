"""What bounds a sandbox run: its limits, rlimits per process, a cgroup for the whole run, and
the end of all its processes with it.

Host code, standard library only. Two layers of limits (`SandboxLimits`):

* The launcher (`LAUNCHER`), a small program run by the sandboxed interpreter just before the
  command: it sets the rlimits (CPU time, address space, processes, file size, open files) and,
  for the fallback backend, first makes the fallback's private mounts and drops its privileges.
* A cgroup per run where the host allows it (the trainer runs as root and a cgroup v2 tree with
  the memory and pids controllers, or cgroup v1 memory and pids hierarchies, is writable): its
  memory limit bounds the memory of all the sandbox's processes together (anonymous memory,
  memfds, tmpfs, page cache, kernel memory), its pids limit all its tasks. The sandbox joins it
  before anything of it runs: a root shell writes its own pid into the run's `cgroup.procs`, then
  `setpriv` drops to the sandbox's user and executes the backend, so every process of the run is
  born inside. The cgroups live under one directory per trainer process, removed at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
import time

# The sandbox's own processes beside the command's (bwrap's monitor or unshare, the launcher).
PIDS_OVERHEAD = 4
_REMOVE_SECONDS = 2.0
_STALE_SECONDS = 3600.0
_PREFIX = "rlvr_sandbox_"
_SEARCH_PATH = "/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/bin"

# Runs inside the sandbox with the sandboxed interpreter; argv: the limits, the fallback's set-up
# (empty for none), the command. As pid 1 of a pid namespace (bwrap's `--as-pid-1`, the
# fallback's `unshare --pid --fork`) it must not exec: the kernel shields pid 1 from signals it
# has no handler for, which would make SIGXCPU a no-op. So there it forks the command, reaps
# orphans, and exits with the command's status (128 + signal when killed, like bwrap); the CPU
# time of what it reaped reaches the parent with its own. The set-up, as root of the fallback's
# user namespace: no new privileges, a small private tmpfs over each directory to hide (where
# other processes leave sockets and files), the scratch directory bound back at its path, then a
# nested user namespace that maps only the sandbox's user, so after the exec the code holds no
# capability and cannot undo the mounts.
LAUNCHER = r"""
import os, resource, sys
cpu, mem, nproc, fsize, nofile = (int(v) for v in sys.argv[1].split(","))
setup = sys.argv[2].split("\n") if sys.argv[2] else []
argv = sys.argv[3:]
def private_mounts(uid, size, hide):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    def check(ret, what):
        if ret != 0:
            err = ctypes.get_errno()
            raise OSError(err, "%s: %s" % (what, os.strerror(err)))
    check(libc.prctl(38, 1, 0, 0, 0), "no_new_privs")
    here = os.getcwd()
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    options = ("size=%d,mode=1777" % size).encode()
    for path in hide:
        if os.path.isdir(path) and not os.path.islink(path):
            check(libc.mount(b"tmpfs", path.encode(), b"tmpfs", 6, options), "tmpfs " + path)
    try:
        covered = os.stat(here)[1:3] != os.fstat(fd)[1:3]
    except OSError:
        covered = True
    if covered:
        os.makedirs(here, exist_ok=True)
        check(libc.mount(b"/proc/self/fd/%d" % fd, here.encode(), None, 4096, None), "bind")
    os.close(fd)
    os.chdir(here)
    check(libc.unshare(0x10000000), "user namespace")
    for name, value in (("setgroups", "deny"), ("uid_map", "%d 0 1" % uid),
                        ("gid_map", "%d 0 1" % uid)):
        with open("/proc/self/" + name, "w") as f:
            f.write(value)
def start():
    limits = [(resource.RLIMIT_CPU, (cpu, cpu + 1)), (resource.RLIMIT_AS, (mem, mem)),
              (resource.RLIMIT_FSIZE, (fsize, fsize)), (resource.RLIMIT_NOFILE, (nofile, nofile)),
              (resource.RLIMIT_CORE, (0, 0))]
    if nproc > 0:
        limits.append((resource.RLIMIT_NPROC, (nproc, nproc)))
    try:
        for which, value in limits:
            resource.setrlimit(which, value)
        os.execvp(argv[0], argv)
    except OSError as e:
        os.write(2, ("sandbox: cannot start %r: %s\n" % (argv[0], e)).encode())
    os._exit(127)
if setup:
    try:
        private_mounts(int(setup[0]), int(setup[1]), setup[2:])
    except OSError as e:
        os.write(2, ("sandbox: cannot set up: %s\n" % e).encode())
        os._exit(125)
if os.getpid() != 1:
    start()
child = os.fork()
if child == 0:
    start()
while True:
    pid, status = os.wait()
    if pid == child:
        break
code = os.waitstatus_to_exitcode(status)
os._exit(128 - code if code < 0 else code)
"""

# The join: a root shell moves itself into each cgroup, then executes the rest of its argv.
_JOIN = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do echo 0 >"$1" || exit 125; shift; n=$((n - 1)); done; '
    'exec "$@"'
)


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits; `ValueError` names the first bad value.

    Attributes:
      cpu_seconds: CPU time of each process (RLIMIT_CPU, whole seconds; SIGXCPU, then SIGKILL
        one second later).
      wall_seconds: wall time of the whole run, enforced by the parent.
      memory_bytes: address space of each process (RLIMIT_AS) and, where the host allows a
        cgroup per run (`protections` has "memory_total"), the memory of all its processes
        together.
      max_processes: processes and threads the sandbox may hold at once (RLIMIT_NPROC in its user
        namespace; with "pids_total" also a cgroup pids limit, plus the sandbox's own helpers).
      max_output_bytes: stdout and stderr together; the run is killed past it.
      max_file_bytes: size of any one file the code writes (RLIMIT_FSIZE); also the size of each
        private tmpfs (bwrap's /dev/shm, the fallback's /tmp and the like).
      max_open_files: file descriptors per process (RLIMIT_NOFILE).
    """

    cpu_seconds: int = 10
    wall_seconds: float = 20.0
    memory_bytes: int = 1 << 30
    max_processes: int = 32
    max_output_bytes: int = 1 << 20
    max_file_bytes: int = 16 << 20
    max_open_files: int = 256

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            wanted_int = field.type in (int, "int")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"SandboxLimits.{field.name}={value!r} is not a number")
            if wanted_int and not isinstance(value, int):
                raise ValueError(f"SandboxLimits.{field.name}={value!r} is not an integer")
            if not math.isfinite(value) or value <= 0:
                raise ValueError(
                    f"SandboxLimits.{field.name}={value!r} must be positive and finite"
                )


def launcher_args(limits: SandboxLimits, nproc: bool, setup: list[str]) -> list[str]:
    """The launcher's two leading arguments: the rlimits, and the fallback's set-up or ""."""
    values = (
        limits.cpu_seconds,
        limits.memory_bytes,
        limits.max_processes if nproc else 0,
        limits.max_file_bytes,
        limits.max_open_files,
    )
    return [",".join(str(v) for v in values), "\n".join(setup)]


@functools.cache
def binary(name: str) -> str | None:
    """The absolute path of a host program, looked up once on PATH and the system directories
    (never on the sandbox's PATH), or None."""
    path = os.pathsep.join(p for p in (os.environ.get("PATH", ""), _SEARCH_PATH) if p)
    found = shutil.which(name, path=path)
    return os.path.realpath(found) if found else None


@dataclasses.dataclass(frozen=True)
class RunCgroup:
    """One run's cgroup, or this process's, under which the runs' are (one directory per
    controller hierarchy; the same one for cgroup v2)."""

    version: int
    memory: str | None
    pids: str | None

    @property
    def dirs(self) -> list[str]:
        return sorted({d for d in (self.memory, self.pids) if d is not None})

    def oom_kills(self) -> int:
        """How many processes the kernel killed for the run's memory limit."""
        if self.memory is None:
            return 0
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        return _counter(os.path.join(self.memory, name), "oom_kill")

    def pids_refusals(self) -> int:
        """How many forks the run's pids limit refused."""
        return 0 if self.pids is None else _counter(os.path.join(self.pids, "pids.events"), "max")

    def kill(self) -> None:
        """Kills every process in the run's cgroup, also those that left its process group."""
        for d in self.dirs:
            with contextlib.suppress(OSError):
                _write(os.path.join(d, "cgroup.kill"), "1")
                continue
            for _ in range(100):
                pids = _procs(d)
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.001)

    def remove(self) -> None:
        """Removes the run's cgroups once their processes are gone (left for later otherwise)."""
        deadline = time.monotonic() + _REMOVE_SECONDS
        for d in self.dirs:
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        with _lock:
                            _leftovers.append(d)
                        break
                    time.sleep(0.002)


_lock = threading.Lock()
_leftovers: list[str] = []
_homes: dict[int, tuple[RunCgroup | None, str | None]] = {}


def cgroup_unavailable_reason() -> str | None:
    """Why runs get no cgroup here, or None when they do (probed once per process)."""
    return _home()[1]


def has_memory_total() -> bool:
    home = _home()[0]
    return home is not None and home.memory is not None


def has_pids_total() -> bool:
    home = _home()[0]
    return home is not None and home.pids is not None


def create_run_cgroup(limits: SandboxLimits) -> RunCgroup | None:
    """A fresh cgroup for one run with its limits written, or None where the host has none.

    Raises:
      OSError: the host has cgroups for runs, but this one could not be made.
    """
    home = _home()[0]
    if home is None:
        return None
    _retry_leftovers()
    name = "run_" + secrets.token_hex(8)
    run = RunCgroup(
        home.version,
        home.memory and os.path.join(home.memory, name),
        home.pids and os.path.join(home.pids, name),
    )
    try:
        for d in run.dirs:
            os.mkdir(d, 0o700)
        _write_limits(run, limits.memory_bytes, limits.max_processes + PIDS_OVERHEAD)
    except OSError:
        run.remove()
        raise
    return run


def join_prefix(run: RunCgroup | None, uid: int | None) -> list[str]:
    """The argv prefix that starts the sandbox inside `run`, dropping to `uid` when not None.

    Empty when `run` is None (then the caller spawns the sandbox as `uid` itself).
    """
    if run is None:
        return []
    procs = [os.path.join(d, "cgroup.procs") for d in run.dirs]
    prefix = [binary("sh"), "-c", _JOIN, "sh", str(len(procs)), *procs]
    if uid is not None:
        prefix += [binary("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    return prefix


def _write_limits(run: RunCgroup, memory: int, pids: int) -> None:
    if run.version == 2:
        if run.memory is not None:
            _write(os.path.join(run.memory, "memory.max"), str(memory))
            with contextlib.suppress(FileNotFoundError):
                _write(os.path.join(run.memory, "memory.swap.max"), "0")
    elif run.memory is not None:
        _write(os.path.join(run.memory, "memory.limit_in_bytes"), str(memory))
        with contextlib.suppress(OSError):  # Only where swap accounting is on.
            _write(os.path.join(run.memory, "memory.memsw.limit_in_bytes"), str(memory))
    if run.pids is not None:
        _write(os.path.join(run.pids, "pids.max"), str(pids))


def _home() -> tuple[RunCgroup | None, str | None]:
    with _lock:
        if os.getpid() not in _homes:
            _homes[os.getpid()] = _find_home()
            if _homes[os.getpid()][0] is not None:
                atexit.register(_remove_home, os.getpid())
        return _homes[os.getpid()]


def _find_home() -> tuple[RunCgroup | None, str | None]:
    if os.geteuid() != 0:
        return None, "the trainer does not run as root, so it cannot make cgroups"
    if binary("sh") is None or binary("setpriv") is None:
        return None, "sh or setpriv (util-linux) is not installed"
    try:
        mounts, own = _mounts(), _own_cgroups()
    except OSError as e:
        return None, f"cannot read the cgroup mounts: {e}"
    tag = f"{_PREFIX}{os.getpid()}_{secrets.token_hex(4)}"
    home = _v2_home(mounts, own, tag) or _v1_home(mounts, own, tag)
    if home is None:
        return None, (
            "no writable cgroup v2 tree with the memory and pids controllers and no cgroup v1 "
            "memory hierarchy"
        )
    for d in {home.memory, home.pids} - {None}:
        _sweep(os.path.dirname(d))
    return home, None


def _sweep(base: str) -> None:
    """Removes the cgroups left in `base` by trainer processes that ended without clean-up
    (killed), an hour after their last change; one that still holds a process stays."""
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            top = os.path.join(base, name)
            pid = name[len(_PREFIX) :].split("_")[0]
            if not name.startswith(_PREFIX) or not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
                continue
            with contextlib.suppress(OSError):
                if time.time() - os.stat(top).st_mtime > _STALE_SECONDS:
                    for d in [os.path.join(top, n) for n in os.listdir(top)] + [top]:
                        with contextlib.suppress(OSError):
                            os.rmdir(d)  # Only cgroup directories go; their files cannot.


def _v2_home(mounts, own, tag) -> RunCgroup | None:
    for fstype, root, point, _ in mounts:
        if fstype != "cgroup2":
            continue
        candidates = [point] + [_under(point, root, p) for c, p in own.items() if c == ""]
        for base in dict.fromkeys(c for c in candidates if c is not None):
            try:
                enabled = _read(os.path.join(base, "cgroup.subtree_control")).split()
            except OSError:
                continue
            if "memory" not in enabled:
                continue
            home = os.path.join(base, tag)
            controllers = " ".join("+" + c for c in ("memory", "pids") if c in enabled)
            try:
                os.mkdir(home, 0o700)
                _write(os.path.join(home, "cgroup.subtree_control"), controllers)
                found = RunCgroup(2, home, home if "pids" in enabled else None)
                _check_home(found)
                return found
            except OSError:
                with contextlib.suppress(OSError):
                    os.rmdir(home)
    return None


def _v1_home(mounts, own, tag) -> RunCgroup | None:
    found = {}
    for controller in ("memory", "pids"):
        path = next((p for c, p in own.items() if controller in c.split(",")), None)
        for fstype, root, point, options in mounts:
            if fstype != "cgroup" or path is None or controller not in options.split(","):
                continue
            base = _under(point, root, path)
            if base is None:
                continue
            with contextlib.suppress(OSError):
                os.mkdir(os.path.join(base, tag), 0o700)
                found[controller] = os.path.join(base, tag)
                break
    home = RunCgroup(1, found.get("memory"), found.get("pids"))
    try:
        if home.memory is None:
            raise OSError("no cgroup v1 memory hierarchy")
        _check_home(home)
    except OSError:
        _remove_home_dirs(home)
        return None
    return home


def _check_home(home: RunCgroup) -> None:
    """Makes, limits, reads back and removes one cgroup; raises OSError where that fails."""
    probe = RunCgroup(
        home.version,
        home.memory and os.path.join(home.memory, "probe"),
        home.pids and os.path.join(home.pids, "probe"),
    )
    for d in probe.dirs:
        os.mkdir(d, 0o700)
    try:
        _write_limits(probe, 64 << 20, 8)
        name = "memory.max" if home.version == 2 else "memory.limit_in_bytes"
        if int(_read(os.path.join(probe.memory, name))) != 64 << 20:
            raise OSError("the memory limit did not hold")
        if probe.pids is not None and _read(os.path.join(probe.pids, "pids.max")).strip() != "8":
            raise OSError("the pids limit did not hold")
    finally:
        for d in probe.dirs:
            with contextlib.suppress(OSError):
                os.rmdir(d)


def _under(point: str, root: str, path: str) -> str | None:
    """Where the cgroup `path` of a hierarchy appears under a mount of its `root`, or None."""
    if root == "/":
        return point + (path if path != "/" else "")
    if path == root or path.startswith(root + "/"):
        return point + path[len(root) :]
    return None


def _mounts() -> list[tuple[str, str, str, str]]:
    """(filesystem type, root, mount point, super options) of each mount of this process."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            fields, after = left.split(), right.split()
            found.append((after[0], _unescape(fields[3]), _unescape(fields[4]), after[2]))
    return found


def _unescape(field: str) -> str:
    """A path from /proc/self/mountinfo, where space, tab, newline and backslash are octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _own_cgroups() -> dict[str, str]:
    """Controllers ("" for cgroup v2) -> this process's cgroup path."""
    own = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            own[controllers] = path
    return own


def _retry_leftovers() -> None:
    with _lock:
        left = list(_leftovers)
        _leftovers.clear()
    for d in left:
        try:
            os.rmdir(d)
        except FileNotFoundError:
            pass
        except OSError:
            with _lock:
                _leftovers.append(d)


def _remove_home(pid: int) -> None:
    if pid != os.getpid():
        return
    _retry_leftovers()
    home = _homes.get(pid, (None, None))[0]
    if home is not None:
        _remove_home_dirs(home)


def _remove_home_dirs(home: RunCgroup) -> None:
    for d in {home.memory, home.pids} - {None}:
        with contextlib.suppress(OSError):
            os.rmdir(d)


def _procs(d: str) -> list[int]:
    try:
        return [int(p) for p in _read(os.path.join(d, "cgroup.procs")).split()]
    except (OSError, ValueError):
        return []


def _counter(path: str, key: str) -> int:
    try:
        for line in _read(path).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def reap(proc: subprocess.Popen) -> tuple[int, float]:
    """Waits for the sandbox's first process: its exit code and the CPU seconds of it and every
    descendant it (or the namespace's first process) reaped."""
    for stream in (proc.stdout, proc.stderr):
        stream.close()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except ChildProcessError:
        return proc.wait(), 0.0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def kill_group(proc: subprocess.Popen) -> None:
    """Kills the sandbox's process group; its pid namespace goes with its first process.

    By pid, not `proc.kill()`, which would reap the process and lose its resource usage; the pid
    is not reused before `reap` waits for it.
    """
    for target in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            target(proc.pid, signal.SIGKILL)


def _state_and_parent(pid: int) -> tuple[str, int] | None:
    """A process's state letter and parent pid from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0].decode(), int(fields[1])


def process_tree(root: int) -> list[int]:
    """`root` and its live descendants, from one pass over /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := _state_and_parent(int(entry))) is not None:
            children.setdefault(found[1], []).append(int(entry))
    tree, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        tree.append(pid)
        frontier.extend(children.get(pid, ()))
    return tree


def wait_gone(pids: list[int], timeout: float) -> None:
    """Waits (at most `timeout` seconds) until every pid is gone or a zombie."""
    deadline = time.monotonic() + timeout
    while True:
        pids = [p for p in pids if (found := _state_and_parent(p)) and found[0] not in "ZX"]
        if not pids or time.monotonic() > deadline:
            return
        time.sleep(0.005)
