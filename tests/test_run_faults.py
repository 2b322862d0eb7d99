"""`python -m rlvr_jax.main` never hangs after an error and stops cleanly on Ctrl-C: a save that
fails (read-only checkpoints, a file in their place) ends the process non-zero, promptly, with
the checkpoint before it intact; SIGINT during an asynchronous save saves and stops like
SIGTERM; a second SIGINT stops at once.

"Promptly" is a subprocess timeout well under orbax's 300 s coordination timeout (what a hang
waited for), never an assertion on speed."""

import dataclasses
import glob
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.parts import build
from rlvr_jax.program.runtime import workdir_lock
from rlvr_jax.program.stages import rl_stage
from tests.test_bad_settings import _tiny
from tests.test_main import _main

# A hang waited for orbax's 300 s timeout; a run that stops within this did not hang.
EXIT_BOUND_S = 120
ENDLESS = ("train.steps=100000", "train.checkpoint_every=2", "train.log_every=1")


def _complete_steps(workdir) -> list[int]:
    d = Path(workdir) / "checkpoints"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def _assert_restorable(workdir, step):
    params, _, _, _, read = build.restore_policy(workdir, step)
    assert read == step and params is not None


def _bind_read_only(d):
    """Makes `d` read-only for every process (as root, chmod would not); skips where mounting
    is not allowed."""
    for cmd in (["mount", "--bind", str(d), str(d)], ["mount", "-o", "remount,bind,ro", str(d)]):
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except FileNotFoundError:
            pytest.skip("no `mount` command: a read-only bind mount needs root with CAP_SYS_ADMIN")
        if done.returncode:
            subprocess.run(["umount", "-l", str(d)], capture_output=True, timeout=60)
            pytest.skip(
                "cannot bind-mount read-only here (needs root with CAP_SYS_ADMIN): "
                f"{done.stderr.strip() or done.returncode}"
            )


def _wait_for_checkpoint(workdir, proc, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.stdout.read()}")
        if _complete_steps(workdir):
            return
        time.sleep(0.02)
    raise AssertionError(f"no checkpoint in {timeout} s")


def _wait_for_save_in_flight(workdir, proc, timeout=300):
    """Returns once a checkpoint's temporary directory exists: orbax is writing it."""
    pattern = str(Path(workdir) / "checkpoints" / "*.orbax-checkpoint-tmp*")
    deadline = time.time() + timeout
    while time.time() < deadline:
        if glob.glob(pattern):
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.stdout.read()}")
        time.sleep(0.002)
    raise AssertionError(f"no save observed in flight in {timeout} s")


def _stop_and_wait(proc):
    try:
        out, _ = proc.communicate(timeout=EXIT_BOUND_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        tail = out[-3000:]
        raise AssertionError(f"still running {EXIT_BOUND_S} s after the fault: {tail}") from None
    return proc.returncode, out


@pytest.mark.slow
def test_read_only_checkpoints_mid_run_end_the_run_promptly_with_the_last_one_intact(tmp_path):
    proc = _main(tmp_path, *ENDLESS, wait=False)
    checkpoints = tmp_path / "checkpoints"
    try:
        _wait_for_checkpoint(tmp_path, proc)
        _bind_read_only(checkpoints)
        try:
            rc, out = _stop_and_wait(proc)
        finally:
            subprocess.run(["umount", "-l", str(checkpoints)], capture_output=True, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 1, out
    assert "CheckpointError" in out and "Read-only file system" in out
    steps = _complete_steps(tmp_path)
    assert steps
    _assert_restorable(tmp_path, steps[-1])


@pytest.mark.slow
def test_a_file_in_place_of_the_checkpoints_mid_run_ends_the_run_promptly(tmp_path):
    proc = _main(tmp_path, *ENDLESS, wait=False)
    checkpoints, aside = tmp_path / "checkpoints", tmp_path / "checkpoints.aside"
    try:
        _wait_for_checkpoint(tmp_path, proc)
        checkpoints.rename(aside)
        checkpoints.write_text("not a directory\n")
        rc, out = _stop_and_wait(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 1, out
    assert "Not a directory" in out or "not a directory" in out
    checkpoints.unlink()
    aside.rename(checkpoints)
    steps = _complete_steps(tmp_path)
    assert steps
    _assert_restorable(tmp_path, steps[-1])


def test_a_file_as_the_checkpoints_dir_is_refused_at_start(tmp_path):
    (tmp_path / "checkpoints").write_text("")
    rc, out = _main(tmp_path, "train.steps=2")
    assert rc == 1, out
    assert f"checkpoint directory {tmp_path / 'checkpoints'} is not a directory" in out


def test_a_read_only_workdir_is_refused_at_start_naming_the_lock(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    _bind_read_only(workdir)
    try:
        rc, out = _main(workdir, "train.steps=2")
    finally:
        subprocess.run(["umount", "-l", str(workdir)], capture_output=True, timeout=60)
    assert rc == 1, out
    assert f"cannot create the workdir lock {workdir / '.lock'}: Read-only file system" in out


@pytest.mark.slow
def test_sigint_during_an_asynchronous_save_saves_the_next_step_and_exits_zero(tmp_path):
    proc = _main(tmp_path, *ENDLESS, wait=False)
    try:
        _wait_for_checkpoint(tmp_path, proc)
        _wait_for_save_in_flight(tmp_path, proc)
        proc.send_signal(signal.SIGINT)
        rc, out = _stop_and_wait(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    (line,) = [x for x in out.splitlines() if x.startswith("stopped at step ")]
    step = int(line.split()[3])
    assert f"stopped at step {step} by SIGINT: checkpoint step {step} is saved in" in line
    assert "nothing has been trained" not in out and "Traceback" not in out
    steps = _complete_steps(tmp_path)
    assert steps[-1] == step and len(steps) >= 2
    # The one before the signal, and the one saved on stopping.
    _assert_restorable(tmp_path, steps[-2])
    _assert_restorable(tmp_path, step)


def _lines_of(proc):
    """Collects `proc`'s output lines on a thread: (the lines, an event set once the first
    SIGINT is acknowledged, the thread)."""
    lines, seen = [], threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("SIGINT received:"):
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return lines, seen, reader


@pytest.mark.slow
def test_a_second_sigint_ends_the_process_at_once_with_status_130(tmp_path):
    # An evaluation every step keeps the loop busy after the first signal, so the second one
    # lands in it (after the loop, the entry point's handler also exits with 130).
    proc = _main(tmp_path, *ENDLESS, "train.eval_every=1", wait=False)
    try:
        _wait_for_checkpoint(tmp_path, proc)
        lines, seen, reader = _lines_of(proc)
        _wait_for_save_in_flight(tmp_path, proc)
        proc.send_signal(signal.SIGINT)
        assert seen.wait(EXIT_BOUND_S), "".join(lines)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {EXIT_BOUND_S} s after a second SIGINT") from None
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(60)
    out = "".join(lines)
    assert proc.returncode == 130, out
    assert "interrupted by a second SIGINT: stopped at once" in out or (
        "stopped by SIGINT outside the training loop, after it" in out
    )
    steps = _complete_steps(tmp_path)
    assert steps
    _assert_restorable(tmp_path, steps[-1])


def test_a_second_sigint_in_the_loop_gives_up_the_save_in_flight(tmp_path, monkeypatch):
    """In process, so the second signal lands in a step for sure: `KeyboardInterrupt` at once,
    the handlers and the lock given back, no orbax thread left, and the run resumes."""
    settings = settings_lib.settings_from_config(
        _tiny(train__steps=20, train__checkpoint_every=2, train__use_tensorboard=False)
    )
    real = rl_stage.run_stage

    def run_stage(stage, *args, **kwargs):
        inner, calls = stage.step, []

        def step(state, data_state):
            out = inner(state, data_state)
            calls.append(None)
            if len(calls) == 3:  # step 2's save was just started
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.5)  # interrupted: the handler notes the request to stop
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(60)  # interrupted by the second: KeyboardInterrupt
            return out

        return real(dataclasses.replace(stage, step=step), *args, **kwargs)

    monkeypatch.setattr(rl_stage, "run_stage", run_stage)
    before = signal.getsignal(signal.SIGINT)
    lines = []
    with pytest.raises(KeyboardInterrupt):
        rl_stage.run(settings, tmp_path, log=lines.append)
    assert signal.getsignal(signal.SIGINT) == before
    (line,) = [x for x in lines if x.startswith("interrupted by a second SIGINT")]
    assert f"complete checkpoints in {tmp_path / 'checkpoints'}:" in line
    orbax = [t.name for t in threading.enumerate() if "orbax" in type(t).__module__]
    assert orbax == []
    assert not workdir_lock.held(tmp_path)
    assert 3 not in _complete_steps(tmp_path)
    monkeypatch.undo()
    resumed = rl_stage.run(
        dataclasses.replace(settings, train=dataclasses.replace(settings.train, steps=4)),
        tmp_path,
        log=lambda _: None,
    )
    assert resumed["resumed_from"] in (0, 2) and resumed["steps"] == 4
