"""What each backend isolates and bounds, as verified on this host: the choice of backend, the
private /proc, SysV IPC and /tmp of the fallback, a memory bound on the whole run, and a program
that outlives SIGXCPU.

A test of a protection runs where `protections` reports it and otherwise pins the gap (the code
does reach it), so the report stays true; on a root host with bubblewrap, everything runs.
"""

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid

import pytest

from rlvr_jax.rewards import sandbox, sandbox_limits
from rlvr_jax.rewards.sandbox import SandboxLimits


def _backend_param(name):
    reason = sandbox.bwrap_unavailable_reason() if name == "bwrap" else None
    return pytest.param(name, marks=pytest.mark.skipif(reason is not None, reason=str(reason)))


BACKENDS = [_backend_param("bwrap"), _backend_param("rlimits")]


def _needs(backend, protection):
    if protection not in sandbox.protections(backend):
        pytest.skip(
            f"{backend} has no {protection} on this host: "
            f"{sandbox_limits.cgroup_unavailable_reason() or sandbox.describe(backend)}"
        )


def _run_cgroups_left():
    """The run cgroups of this process that still exist (each run removes its own)."""
    home = sandbox_limits._home()[0]
    if home is None:
        return []
    return [n for d in {home.memory, home.pids} - {None} for n in os.listdir(d) if n[:4] == "run_"]


@pytest.mark.parametrize("name", ["auto", "docker", ""])
def test_an_unknown_backend_is_refused_naming_the_allowed_ones(name):
    for call in (sandbox.check_backend, sandbox.protections, sandbox.describe):
        with pytest.raises(ValueError, match=r"is not one of \('bwrap', 'rlimits'\)"):
            call(name)
    with pytest.raises(ValueError, match=r"is not one of \('bwrap', 'rlimits'\)"):
        sandbox.run("0", backend=name)


def test_bwrap_that_cannot_start_is_refused_naming_the_fix_and_the_opt_in(monkeypatch):
    reason = "setting up uid map: Permission denied"
    monkeypatch.setattr(sandbox, "bwrap_unavailable_reason", lambda: reason)
    for call in (lambda: sandbox.check_backend("bwrap"), lambda: sandbox.run("0")):
        with pytest.raises(sandbox.SandboxUnavailableError) as refused:
            call()
        message = str(refused.value)
        assert isinstance(refused.value, ValueError)
        assert reason in message
        assert "apt-get install bubblewrap" in message and "`bubblewrap`" in message
        assert 'reward.sandbox_backend="rlimits"' in message and "trusted" in message
    assert sandbox.protections("bwrap") == frozenset()
    assert reason in sandbox.describe("bwrap")
    sandbox.check_backend("rlimits")  # The explicit opt-in still starts.


@pytest.mark.parametrize("backend", BACKENDS)
def test_describe_names_the_backend_what_it_protects_and_what_it_lacks(backend):
    has = sandbox.protections(backend)
    assert has <= set(sandbox.PROTECTIONS)
    line = sandbox.describe(backend)
    assert "\n" not in line and repr(backend) in line
    protects, lacks = line.split("; lacks ")
    assert all((name in protects) == (name in has) for name in sandbox.PROTECTIONS)
    assert all((name in lacks) == (name not in has) for name in sandbox.PROTECTIONS)


def test_protections_come_from_a_probe_run_not_from_the_backend_name():
    """The fallback without namespaces is probed like the others: it reports none of them."""
    failed, bare = sandbox._probe("rlimits", "none")
    assert failed is None
    assert not bare & {"network", "pid_namespace", "ipc_namespace", "mount_namespace"}
    assert "private_proc" not in bare and "filesystem" not in bare
    if sandbox._fallback_level() == "private":
        assert {"network", "pid_namespace", "ipc_namespace", "mount_namespace", "private_proc"} <= (
            sandbox.protections("rlimits")
        )


@pytest.fixture
def fresh_probes():
    """Clears the once-per-process probes before and after the test."""
    caches = (sandbox_limits.binary, sandbox._fallback_level, sandbox._probe, sandbox._bwrap_probe)
    for cache in caches:
        cache.cache_clear()
    yield
    for cache in caches:
        cache.cache_clear()


def test_the_fallback_finds_unshare_off_the_trainers_path(monkeypatch, fresh_probes):
    if sandbox_limits.binary("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert os.path.isabs(sandbox_limits.binary("unshare"))
    assert "network" in sandbox.protections("rlimits")
    code = "import os\nprint(os.readlink('/proc/self/ns/net'))"
    inside = sandbox.run(code, backend="rlimits").stdout.decode().strip()
    assert inside.startswith("net:[") and inside != os.readlink("/proc/self/ns/net")


@pytest.mark.parametrize("backend", BACKENDS)
def test_proc_shows_no_host_process(backend):
    marker = uuid.uuid4().hex
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    code = (  # The marker comes on stdin, so no process of the sandbox carries it.
        "import os, sys\n"
        "marker = sys.stdin.buffer.read()\n"
        "seen = 0\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        seen += marker in open(f'/proc/{pid}/cmdline', 'rb').read()\n"
        "    except OSError:\n"
        "        pass\n"
        "print('seen', seen)\n"
    )
    try:
        result = sandbox.run(code, stdin=marker.encode(), backend=backend)
    finally:
        host.kill()
        host.wait()
    assert result.returncode == 0, result.stderr
    if "private_proc" in sandbox.protections(backend):
        assert result.stdout == b"seen 0\n"
    else:
        assert result.stdout == b"seen 1\n"  # THE FALLBACK WITHOUT NAMESPACES SEES THEM.


def _host_segments(key):
    with open("/proc/sysvipc/shm") as f:
        next(f)
        return [int(line.split()[1]) for line in f if int(line.split()[0]) == key]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sysv_segment_does_not_outlive_the_run(backend):
    if not os.path.exists("/proc/sysvipc/shm"):
        pytest.skip("no /proc/sysvipc/shm on this host")
    key = secrets.randbelow(1 << 30) + 1
    code = (
        "import ctypes, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('segment', libc.shmget(int(sys.argv[1]), 4096, 0o1000 | 0o600))\n"  # IPC_CREAT
    )
    result = sandbox.run(["python3", "-I", "-S", "-c", code, str(key)], backend=backend)
    assert result.returncode == 0 and int(result.stdout.split()[1]) >= 0, result
    left = _host_segments(key)
    for shmid in left:
        subprocess.run(["ipcrm", "-m", str(shmid)], check=False)
    if "ipc_namespace" in sandbox.protections(backend):
        assert left == []
    else:
        assert len(left) == 1  # THE FALLBACK WITHOUT AN IPC NAMESPACE LEAVES IT BEHIND.


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_unix_socket_of_the_host_in_the_temporary_directory_is_unreachable(backend):
    directory = tempfile.mkdtemp(prefix="sandbox_test_")
    os.chmod(directory, 0o777)  # Reachable by anyone: only the sandbox can stop the connect.
    path = os.path.join(directory, "socket")
    code = (
        "import socket, sys\n"
        "try:\n"
        "    socket.socket(socket.AF_UNIX).connect(sys.argv[1])\n"
        "    print('connected')\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
    )
    try:
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(path)
            os.chmod(path, 0o777)
            listener.listen(1)
            listener.settimeout(0)
            result = sandbox.run(["python3", "-I", "-S", "-c", code, path], backend=backend)
            if {"filesystem", "mount_namespace"} & sandbox.protections(backend):
                assert result.stdout.startswith(b"refused"), result
                with pytest.raises(BlockingIOError):
                    listener.accept()
            else:
                assert result.stdout == b"connected\n"  # THE FALLBACK WITHOUT A MOUNT NAMESPACE.
    finally:
        shutil.rmtree(directory, ignore_errors=True)


MEMFDS = """
import os
chunk = b"x" * (16 << 20)
fds = []
for i in range(64):
    fd = os.memfd_create("m%d" % i)
    os.write(fd, chunk)
    fds.append(fd)
print("held", len(fds), flush=True)
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_memfds_cannot_hold_more_than_the_memory_limit(backend):
    """64 memfds of 16 MiB (1 GiB, none of it in the address space) under a 128 MiB limit."""
    _needs(backend, "memory_total")
    limits = SandboxLimits(memory_bytes=128 << 20, wall_seconds=20)
    result = sandbox.run(MEMFDS, limits=limits, backend=backend)
    assert b"held 64" not in result.stdout
    assert result.killed_reason == "memory", result
    assert _run_cgroups_left() == []
    assert sandbox.run("print(6 * 7)", backend=backend).stdout == b"42\n"


CHILDREN = """
import os, select, time
r, w = os.pipe()
for i in range(6):
    if os.fork() == 0:
        os.close(r)
        block = b"x" * (100 << 20)
        os.write(w, b"h")
        time.sleep(60)
        os._exit(0)
os.close(w)
held = 0
while held < 6:
    if select.select([r], [], [], 0.05)[0]:
        held += len(os.read(r, 6))
    elif os.waitpid(-1, os.WNOHANG)[0]:
        print("held", held, "then a child ended", flush=True)
        os._exit(3)
print("all held", flush=True)
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_children_cannot_hold_more_than_the_memory_limit_together(backend):
    """6 children of 100 MiB each under a 256 MiB limit: each fits its own RLIMIT_AS, together
    they would hold 600 MiB."""
    _needs(backend, "memory_total")
    limits = SandboxLimits(memory_bytes=256 << 20, wall_seconds=20)
    result = sandbox.run(CHILDREN, limits=limits, backend=backend)
    assert b"all held" not in result.stdout
    assert result.killed_reason == "memory", result
    assert _run_cgroups_left() == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_program_that_handles_sigxcpu_is_reported_as_cpu_time(backend):
    threads = threading.active_count()
    limits = SandboxLimits(cpu_seconds=1, wall_seconds=15)
    code = "import signal\nsignal.signal(signal.SIGXCPU, lambda *a: None)\nwhile True: pass"
    result = sandbox.run(code, limits=limits, backend=backend)
    assert result.returncode == -signal.SIGKILL  # At the hard limit, one second later.
    assert result.killed_reason == "cpu_time" and not result.timed_out
    assert result.wall_seconds < limits.wall_seconds
    assert threading.active_count() == threads
