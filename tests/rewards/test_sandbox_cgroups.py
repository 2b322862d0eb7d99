"""Where the per-run cgroups go, read from the mount table and /proc/self/cgroup: cgroup v2 and v1
trees laid out as plain directories (the kernel's side is in test_sandbox_isolation.py)."""

import os

from rlvr_jax.rewards import sandbox_limits
from rlvr_jax.rewards.sandbox import SandboxLimits


def _cgroup_dir(path, controllers="", enabled=""):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "cgroup.controllers"), "w") as f:
        f.write(controllers)
    with open(os.path.join(path, "cgroup.subtree_control"), "w") as f:
        f.write(enabled)


def test_v2_home_goes_under_the_root_when_its_controllers_are_enabled_there(tmp_path):
    """A systemd host: memory and pids enabled at the root, the trainer in a busy scope below."""
    root = str(tmp_path)
    _cgroup_dir(root, "cpu memory pids", "cpu memory pids")
    _cgroup_dir(f"{root}/user.slice/session.scope", "memory pids", "")
    mounts = [("cgroup2", "/", root, "rw,nsdelegate")]
    home = sandbox_limits._v2_home(mounts, {"": "/user.slice/session.scope"}, "rlvr_sandbox_1_a")
    assert home == sandbox_limits.RunCgroup(
        2, f"{root}/rlvr_sandbox_1_a", f"{root}/rlvr_sandbox_1_a"
    )
    with open(f"{root}/rlvr_sandbox_1_a/cgroup.subtree_control") as f:
        assert f.read() == "+memory +pids"
    with open(f"{root}/rlvr_sandbox_1_a/probe/memory.max") as f:
        assert f.read() == str(64 << 20)  # The check wrote a limit into a cgroup of its own.


def test_v2_without_the_memory_controller_enabled_gives_no_home(tmp_path):
    """A container whose namespace root holds processes: nothing is enabled for children."""
    _cgroup_dir(str(tmp_path), "memory pids", "")
    mounts = [("cgroup2", "/", str(tmp_path), "rw")]
    assert sandbox_limits._v2_home(mounts, {"": "/"}, "rlvr_sandbox_1_a") is None
    assert os.listdir(tmp_path) == ["cgroup.controllers", "cgroup.subtree_control"]


def test_v1_home_goes_below_the_trainers_own_cgroups(tmp_path):
    memory, pids = tmp_path / "memory", tmp_path / "pids"
    os.makedirs(memory / "a")  # The mount shows the hierarchy from /container down.
    os.makedirs(pids)
    mounts = [
        ("cgroup", "/container", str(memory), "rw,memory"),
        ("cgroup", "/", str(pids), "rw,pids"),
        ("cgroup", "/", str(tmp_path / "cpu"), "rw,cpu,cpuacct"),
    ]
    own = {"memory": "/container/a", "pids": "/", "cpu,cpuacct": "/"}
    home = sandbox_limits._v1_home(mounts, own, "rlvr_sandbox_1_a")
    assert home == sandbox_limits.RunCgroup(
        1, f"{memory}/a/rlvr_sandbox_1_a", f"{pids}/rlvr_sandbox_1_a"
    )


def test_limits_and_counters_are_read_from_the_version_s_files(tmp_path):
    for version, memory_file, events in (
        (2, "memory.max", "memory.events"),
        (1, "memory.limit_in_bytes", "memory.oom_control"),
    ):
        run = sandbox_limits.RunCgroup(version, str(tmp_path), str(tmp_path))
        limits = SandboxLimits(memory_bytes=128 << 20, max_processes=16)
        sandbox_limits._write_limits(run, limits.memory_bytes, limits.max_processes + 4)
        assert (tmp_path / memory_file).read_text() == str(128 << 20)
        assert (tmp_path / "pids.max").read_text() == "20"
        (tmp_path / events).write_text("low 0\noom 2\noom_kill 3\n")
        (tmp_path / "pids.events").write_text("max 5\n")
        assert (run.oom_kills(), run.pids_refusals()) == (3, 5)


def test_mount_table_paths_are_unescaped():
    assert sandbox_limits._unescape(r"/sys/fs/cgroup/with\040space") == "/sys/fs/cgroup/with space"
    assert sandbox_limits._under("/mnt", "/", "/a/b") == "/mnt/a/b"
    assert sandbox_limits._under("/mnt", "/a", "/a/b") == "/mnt/b"
    assert sandbox_limits._under("/mnt", "/a", "/c") is None
