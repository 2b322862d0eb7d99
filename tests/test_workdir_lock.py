"""One run per workdir: a second trainer, or an eval/export writing into a running run's
workdir, refuses at once naming the holder's pid (exit status 2); readers go ahead; the kernel
releases the lock of a killed process."""

import json
import os
import signal
import subprocess
import sys

import pytest

from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.runtime import workdir_lock
from rlvr_jax.program.stages import rl_stage
from tests.test_bad_settings import _tiny
from tests.test_main import REPO, _main, _metrics, _wait_for_step

ENV = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
# A refusal comes before anything is loaded; this only keeps a hang from stalling the suite.
BOUND_S = 120


def _try_lock(workdir, purpose="training") -> subprocess.CompletedProcess:
    """Another process's `acquire` on `workdir`: exit 0 when it got the lock, 3 when refused."""
    code = (
        "import sys\n"
        "from rlvr_jax.program.runtime import workdir_lock\n"
        "try:\n"
        f"    workdir_lock.acquire({str(workdir)!r}, {purpose!r})\n"
        "except workdir_lock.WorkdirBusyError as e:\n"
        "    print(e); sys.exit(3)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=BOUND_S
    )


def _command(module, *args) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", f"rlvr_jax.{module}", *args]
    return subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)


@pytest.fixture
def held(tmp_path):
    """`tmp_path/run` locked by this process as a trainer would."""
    workdir = tmp_path / "run"
    with workdir_lock.hold(workdir, "training"):
        yield workdir


def test_a_second_process_is_refused_at_once_naming_the_holder(held):
    done = _try_lock(held)  # a lock that waited would time out here: this process holds it
    assert done.returncode == 3, done.stderr
    assert f"{held} is in use by pid {os.getpid()} on host " in done.stdout
    assert "(training, since " in done.stdout and f"`kill {os.getpid()}`" in done.stdout
    record = json.loads((held / workdir_lock.LOCK_FILE).read_text())
    assert record["pid"] == os.getpid() and record["purpose"] == "training"


def test_the_holder_takes_it_again_and_the_last_release_frees_it(tmp_path):
    workdir_lock.acquire(tmp_path, "training")
    workdir_lock.acquire(tmp_path / ".", "training")  # the same directory, spelled otherwise
    workdir_lock.release(tmp_path)
    assert workdir_lock.held(tmp_path) and _try_lock(tmp_path).returncode == 3
    workdir_lock.release(tmp_path)
    assert not workdir_lock.held(tmp_path)
    assert _try_lock(tmp_path).returncode == 0  # that process exited: free again
    assert _try_lock(tmp_path).returncode == 0


def test_a_killed_holder_leaves_no_lock_behind(tmp_path):
    code = (
        "import sys, time\n"
        "from rlvr_jax.program.runtime import workdir_lock\n"
        f"workdir_lock.acquire({str(tmp_path)!r}, 'training')\n"
        "print('locked', flush=True)\n"
        "time.sleep(600)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], env=ENV, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline() == "locked\n"
        assert _try_lock(tmp_path).returncode == 3
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=BOUND_S)
    finally:
        if child.poll() is None:
            child.kill()
    assert _try_lock(tmp_path).returncode == 0


def test_main_on_a_locked_workdir_exits_2_before_writing_anything(held):
    rc, out = _main(held, "train.steps=2")
    assert rc == workdir_lock.BUSY_EXIT_STATUS, out
    assert f"main: {held} is in use by pid {os.getpid()}" in out
    assert sorted(p.name for p in held.iterdir()) == [workdir_lock.LOCK_FILE]


@pytest.mark.slow
def test_a_second_trainer_on_a_running_workdir_is_refused_and_the_first_goes_on(tmp_path):
    first = _main(tmp_path, "train.steps=100000", "train.checkpoint_every=0", wait=False)
    try:
        _wait_for_step(tmp_path, 2, first)
        rc, out = _main(tmp_path, "train.steps=20")
        assert rc == workdir_lock.BUSY_EXIT_STATUS, out
        assert f"is in use by pid {first.pid} on host " in out and "(training, since " in out
        _wait_for_step(tmp_path, 5, first)
        first.send_signal(signal.SIGTERM)
        out, _ = first.communicate(timeout=BOUND_S)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, out
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in lines if r["record"] == "step"]
    assert steps == list(range(1, len(steps) + 1))  # one history: the first run's alone
    assert len(_metrics(tmp_path)) == len(steps)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("finished")
    settings = settings_lib.settings_from_config(
        _tiny(train__steps=2, train__use_tensorboard=False)
    )
    rl_stage.run(settings, workdir, log=lambda _: None)
    return workdir


def test_eval_into_a_running_runs_workdir_is_refused_and_reading_it_is_not(finished, tmp_path):
    with workdir_lock.hold(finished, "training"):
        done = _command("eval", f"--workdir={finished}")
        assert done.returncode == workdir_lock.BUSY_EXIT_STATUS, done.stderr
        assert f"eval: {finished} is in use by pid {os.getpid()}" in done.stderr
        assert "pass --out=<a path outside the workdir>" in done.stderr
        assert not (finished / "eval").exists()
        out = tmp_path / "heldout.json"
        done = _command("eval", f"--workdir={finished}", f"--out={out}")
        assert done.returncode == 0, done.stderr
        assert json.loads(out.read_text())["checkpoint_step"] == 2
    # Nobody holds it: the default output goes into the workdir, under the lock.
    done = _command("eval", f"--workdir={finished}")
    assert done.returncode == 0, done.stderr
    assert (finished / "eval" / "heldout-step2.json").is_file()


def test_export_into_a_running_runs_workdir_is_refused_and_elsewhere_is_not(finished, tmp_path):
    with workdir_lock.hold(finished, "training"):
        done = _command("export", f"--workdir={finished}", f"--out={finished / 'hf'}")
        assert done.returncode == workdir_lock.BUSY_EXIT_STATUS, done.stderr
        assert f"export: {finished} is in use by pid {os.getpid()}" in done.stderr
        assert not (finished / "hf").exists()
        done = _command("export", f"--workdir={finished}", f"--out={tmp_path / 'hf'}")
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "hf" / "config.json").is_file()
