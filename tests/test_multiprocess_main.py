"""`python -m rlvr_jax.main --distributed` as two processes of 4 CPU devices each on localhost.

The two processes form one run on one 8-device mesh (JAX's multi-controller runtime, the
coordinator on a free local port): they train the tiny config, save checkpoints together into one
workdir and resume together. The ledger, which process 0 alone writes, must hold what one process
with 8 devices writes, within the float tolerances of `tests/test_multihost.py`. Every launch
runs under a deadline; when one process fails or the deadline passes, every process is killed.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "configs" / "tiny.py")
DEVICES = 8
# Metrics that depend on the wall clock, not on the computation.
CLOCK = ("time", "throughput/", "useful/per_hour")
CLOCK_UNITS = ("_per_s", "seconds")
DEADLINE_S = 400
# One fused program per step: 6 steps, checkpoints at 3 and 6.
FUSED = ("train.steps=6", "train.checkpoint_every=3", "train.log_every=1")
# The host path: jitted rollout -> the math verifier in each process's pool -> jitted update;
# the thinking-mode format part gives the rewards of a random policy their spread.
HOST = (
    "train.steps=2",
    "train.checkpoint_every=0",
    "train.log_every=1",
    "train.use_tensorboard=False",
    "reward.verifier=math",
    "model.tokenizer=chars:0123456789+-*=/thinko_ <>",
    "data.modes=flag",
    "data.buckets=(16,)",
    "reward.format=mode",
    "reward.format_weight=0.5",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(local_devices: int) -> dict[str, str]:
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    flags.append(f"--xla_force_host_platform_device_count={local_devices}")
    return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), XLA_FLAGS=" ".join(flags))


def _run(
    workdir: Path,
    logs: Path,
    overrides,
    *flags: str,
    processes: int = 1,
    during: Callable[[list[subprocess.Popen]], None] | None = None,
    statuses: Sequence[int | tuple[int, ...]] | None = None,
    only: dict[int, Sequence[str]] | None = None,
) -> list[str]:
    """Runs main as `processes` processes (one: not distributed) sharing the 8 devices; returns
    each one's output.

    `during(processes)`, when given, runs once they have started (a fault to inject); then each
    process must end by itself with its status in `statuses` (default: 0 for all; a tuple: any of
    those). `only` adds flags to one process's command (process id -> flags). Without `during`,
    a process that ends with another status ends the others at once (they would wait in a
    collective). Fails, with every output, on another status; every process still running after
    `DEADLINE_S` is killed.
    """
    port = _free_port()
    cmd = [sys.executable, "-m", "rlvr_jax.main", f"--config={TINY}", f"--workdir={workdir}"]
    cmd += [f"--config.{o}" for o in overrides] + [f"--compile_cache={logs / 'cache'}", *flags]
    logs.mkdir(parents=True, exist_ok=True)
    launch = len(list(logs.glob(f"{workdir.name}-*-0.log")))  # this workdir's launches so far
    files = [logs / f"{workdir.name}-{launch}-{i}.log" for i in range(processes)]
    want = [s if isinstance(s, tuple) else (s,) for s in statuses or [0] * processes]
    procs = []
    try:
        for i, path in enumerate(files):
            distributed = [
                "--distributed",
                f"--coordinator=127.0.0.1:{port}",
                f"--num_processes={processes}",
                f"--process_id={i}",
            ]
            with open(path, "w") as out:
                procs.append(
                    subprocess.Popen(
                        cmd + (distributed if processes > 1 else []) + [*(only or {}).get(i, ())],
                        cwd=REPO,
                        env=_env(DEVICES // processes),
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
        deadline = time.monotonic() + DEADLINE_S
        if during is not None:
            during(procs)
        # One that ends as it should (e.g. 2, refused) leaves the others to end by themselves.
        unwanted = lambda i, p: p.poll() is not None and p.poll() not in want[i]  # noqa: E731
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if during is None and any(unwanted(i, p) for i, p in enumerate(procs)):
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    outs = [path.read_text() for path in files[: len(procs)]]
    report = "\n".join(
        f"--- process {i}: exit {p.returncode}\n{out}"
        for i, (p, out) in enumerate(zip(procs, outs, strict=True))
    )
    got = [p.returncode for p in procs]
    assert all(g in w for g, w in zip(got, want, strict=True)), report
    return outs


def _at_step(workdir: Path, step: int, signum: int, process: int):
    """A `during` for `_run`: waits for the ledger's row of `step`, then sends `signum` to
    `process`."""

    def during(procs: list[subprocess.Popen]) -> None:
        path = workdir / "metrics.jsonl"
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline and all(p.poll() is None for p in procs):
            if path.exists() and step in _steps_written(path):
                procs[process].send_signal(signum)
                return
            time.sleep(0.1)
        raise AssertionError(f"step {step} was not reached")

    return during


def _steps_written(path: Path) -> set[int]:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]
    return {r["step"] for r in rows if r.get("record", "step") == "step"}


def _ledger(workdir: Path) -> dict[tuple[str, int], dict]:
    """The ledger's records by (record, step), startup records left out; each must be there once
    (two writers would have written two)."""
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    keys = [(r.get("record", "step"), r["step"]) for r in rows if r.get("record") != "startup"]
    assert len(keys) == len(set(keys)), keys
    return {(r.get("record", "step"), r["step"]): r for r in rows if r.get("record") != "startup"}


def _clock(name: str) -> bool:
    return name.startswith(CLOCK) or name.endswith(CLOCK_UNITS)


def _assert_same(got: dict, want: dict, keys) -> None:
    for key in keys:
        g, w = got[key], want[key]
        names = sorted(k for k in w if not _clock(k))
        assert sorted(k for k in g if not _clock(k)) == names, key
        for name in names:
            if isinstance(w[name], (int, float)) and not isinstance(w[name], bool):
                np.testing.assert_allclose(
                    g[name], w[name], atol=2e-5, rtol=1e-5, err_msg=f"{key} {name}"
                )
            else:
                assert g[name] == w[name], (key, name)


def _steps(ledger: dict) -> list[int]:
    return sorted(step for record, step in ledger if record == "step")


@pytest.mark.processes
def test_two_processes_train_save_and_resume_like_one_with_eight_devices(tmp_path):
    logs = tmp_path / "logs"
    _run(tmp_path / "one", logs, FUSED)
    want = _ledger(tmp_path / "one")
    assert _steps(want) == [1, 2, 3, 4, 5, 6]
    assert want[("step", 6)]["loss/pg"] != 0 and want[("step", 1)]["reward/std"] > 0

    two = tmp_path / "two"
    outs = _run(two, logs, FUSED, processes=2)
    assert _steps(_ledger(two)) == [1, 2, 3, 4, 5, 6]
    _assert_same(_ledger(two), want, want)
    # One held-out figure, the same in both processes (before and after training).
    heldout = [[x for x in out.splitlines() if x.startswith("held-out accuracy")] for out in outs]
    assert len(heldout[0]) == 2 and heldout[0] == heldout[1], heldout
    # Only process 0 draws the progress bar (the ledger's console side).
    assert "| reward " in outs[0] and "| reward " not in outs[1]
    assert sorted(p.name for p in (two / "checkpoints").iterdir()) == ["3", "6"]

    # Both resume from step 3: step 6 goes, steps 4 to 6 are trained again and match.
    outs = _run(two, logs, FUSED, "--step=3", processes=2)
    for out in outs:
        assert "resumed from step 3" in out and "removed checkpoints [6]" in out
    resumed = _ledger(two)
    assert _steps(resumed) == [1, 2, 3, 4, 5, 6]
    _assert_same(resumed, want, want)
    assert sorted(p.name for p in (two / "checkpoints").iterdir()) == ["3", "6"]


@pytest.mark.processes
def test_two_processes_on_the_host_verifier_path_train_like_one(tmp_path):
    logs = tmp_path / "logs"
    _run(tmp_path / "one", logs, HOST)
    want = _ledger(tmp_path / "one")
    assert _steps(want) == [1, 2]
    assert want[("step", 1)]["reward/std"] > 0 and want[("step", 1)]["verifier/checks"] > 0
    _run(tmp_path / "two", logs, HOST, processes=2)
    _assert_same(_ledger(tmp_path / "two"), want, want)


# Long enough for a signal to land in the loop; checkpoints every 2 steps.
ENDLESS = ("train.steps=100000", "train.checkpoint_every=2", "train.log_every=1")


@pytest.mark.processes
def test_a_stop_signal_on_one_process_stops_both_at_one_saved_step(tmp_path):
    logs, two = tmp_path / "logs", tmp_path / "two"
    # SIGTERM to process 1: process 0, which writes the ledger, did not receive it.
    outs = _run(two, logs, ENDLESS, processes=2, during=_at_step(two, 3, signal.SIGTERM, 1))
    stopped = [[x for x in out.splitlines() if x.startswith("stopped at step ")] for out in outs]
    (own,), (other,) = stopped[1], stopped[0]
    step = int(own.split()[3])
    assert own.startswith(f"stopped at step {step} by SIGTERM: checkpoint step {step} is saved")
    assert other.startswith(f"stopped at step {step} by a stop signal on another process")
    assert step >= 3 and _steps(_ledger(two)) == list(range(1, step + 1))
    assert str(step) in [p.name for p in (two / "checkpoints").iterdir()]

    # The same command on both resumes; two more steps.
    more = ("train.steps=" + str(step + 2), *ENDLESS[1:])
    for out in _run(two, logs, more, processes=2):
        assert f"resumed from step {step}" in out
    assert _steps(_ledger(two)) == list(range(1, step + 3))


@pytest.mark.processes
def test_a_killed_process_ends_the_other_then_both_resume(tmp_path):
    logs, two = tmp_path / "logs", tmp_path / "two"
    # SIGKILL to process 1 mid-run: process 0 ends by itself (`_run` kills only what outlives its
    # deadline), one of two ways. A collective in flight when the peer died fails at once (status
    # 1, the collective's error); one entered later waits until the coordination service, missing
    # the lost process's heartbeats for --heartbeat_timeout seconds, aborts it naming process 1.
    outs = _run(
        two,
        logs,
        ENDLESS,
        "--heartbeat_timeout=20",
        processes=2,
        during=_at_step(two, 3, signal.SIGKILL, 1),
        statuses=[(1, -signal.SIGABRT), -signal.SIGKILL],
    )
    failed = "JaxRuntimeError" in outs[0] and "Gloo" in outs[0]
    named = "tasks are unhealthy (stopped sending heartbeats):\n1\n" in outs[0]
    assert failed or named, outs[0]
    saved = sorted(int(p.name) for p in (two / "checkpoints").iterdir() if p.name.isdigit())
    assert saved and saved[-1] >= 2
    # Both resume from the newest complete checkpoint and reach the end, each step's row once.
    end = ("train.steps=" + str(saved[-1] + 2), *ENDLESS[1:])
    for out in _run(two, logs, end, processes=2):
        assert f"resumed from step {saved[-1]}" in out
    assert _steps(_ledger(two)) == list(range(1, saved[-1] + 3))


@pytest.mark.processes
def test_processes_that_start_differently_are_refused_before_the_first_step(tmp_path):
    logs, two = tmp_path / "logs", tmp_path / "two"
    outs = _run(two, logs, FUSED, processes=2, only={1: ["--config.train.seed=7"]}, statuses=[2, 2])
    assert "process 1 started differently from process 0" in outs[0], outs[0]
    assert "train.seed: 0 -> 7" in outs[0], outs[0]
    assert "train.seed: 7 -> 0" in outs[1], outs[1]
    assert not (two / "metrics.jsonl").exists()  # refused before anything ran


def test_main_leaves_the_backend_to_jax_distributed():
    """Importing main and loading a config start no JAX backend, which would make
    `jax.distributed.initialize` (the first thing `main --distributed` runs) fail."""
    code = (
        "import jax, sys\n"
        "import rlvr_jax.main\n"
        "from configs import tiny\n"
        "tiny.get_config()\n"
        f"jax.distributed.initialize('127.0.0.1:{_free_port()}', num_processes=1, process_id=0)\n"
        "assert jax.process_count() == 1\n"
        "jax.distributed.shutdown()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=_env(1),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("module", "says"),
    [
        ("rlvr_jax.eval", "rlvr_jax.eval runs in one process; run it on one host"),
        ("rlvr_jax.pipeline", "rlvr_jax.pipeline runs in one process"),
        ("rlvr_jax.ablate", "rlvr_jax.ablate runs its study in one process"),
    ],
)
def test_entry_points_of_one_process_refuse_distributed(module, says, tmp_path):
    cmd = [sys.executable, "-m", module, "--distributed", f"--config={TINY}"]
    result = subprocess.run(
        [*cmd, f"--workdir={tmp_path}"],
        cwd=REPO,
        env=_env(1),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2  # a user error: one line
    assert f"--distributed: {says}" in result.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (
            ["--num_processes=2", "--process_id=0"],
            "--num_processes=2 --process_id=0: these set up a run over several processes; add "
            "--distributed",
        ),
        (["--coordinator=127.0.0.1:1"], "--coordinator=127.0.0.1:1: these set up"),
        (
            ["--distributed", "--num_processes=2", "--process_id=2"],
            "--process_id=2 must be below --num_processes=2",
        ),
    ],
)
def test_main_refuses_process_flags_that_cannot_start(flags, says, tmp_path):
    cmd = [sys.executable, "-m", "rlvr_jax.main", f"--config={TINY}", f"--workdir={tmp_path}"]
    result = subprocess.run(
        cmd + flags, cwd=REPO, env=_env(1), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2  # a user error: one line
    assert says in result.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("config", ["sft_tiny", "reward_model_tiny"])
def test_stages_of_one_device_refuse_several_processes(config, monkeypatch, tmp_path):
    import importlib

    import jax

    from rlvr_jax.config_types import ConfigError
    from rlvr_jax.program import settings as settings_lib
    from rlvr_jax.program.stages import dispatch

    settings = settings_lib.settings_from_config(
        importlib.import_module(f"configs.{config}").get_config()
    )
    stage = settings.train.stage
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ConfigError, match=f"train.stage='{stage}' trains in one process"):
        dispatch.run(settings, tmp_path)
    assert not any(tmp_path.iterdir())


def test_a_different_checkout_is_a_difference():
    from configs import tiny
    from rlvr_jax.program.runtime import agreement
    from rlvr_jax.program.settings import settings_from_config

    mine = agreement.start_record(settings_from_config(tiny.get_config()))
    assert agreement.differences(mine, mine) == []
    theirs = {**mine, "code": "0" * 16}
    assert agreement.differences(mine, theirs) == [f"code: {mine['code']!r} -> {'0' * 16!r}"]


def test_editing_a_source_file_changes_the_code_fingerprint(tmp_path, monkeypatch):
    from rlvr_jax.program.runtime import agreement

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 2\n")
    monkeypatch.setattr(agreement, "PACKAGE", tmp_path)
    agreement.code_fingerprint.cache_clear()
    try:
        before = agreement.code_fingerprint()
        (tmp_path / "model" / "a.py").write_text("x = 2\n")
        agreement.code_fingerprint.cache_clear()
        assert agreement.code_fingerprint() != before
    finally:
        agreement.code_fingerprint.cache_clear()
