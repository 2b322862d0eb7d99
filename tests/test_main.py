"""The program end to end on the tiny config: runs, fails early on bad settings, resumes exactly."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlvr_jax.config_types import ConfigError
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.stages import rl_stage

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "configs" / "tiny.py")
# Metrics that depend on the wall clock, not on the computation.
CLOCK = ("time", "throughput/", "useful/per_hour")


def _main(workdir, *overrides, wait=True, cache=None):
    cmd = [sys.executable, "-m", "rlvr_jax.main", f"--config={TINY}", f"--workdir={workdir}"]
    cmd += [f"--config.{o}" for o in overrides]
    if cache is not None:
        cmd.append(f"--compile_cache={cache}")
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if wait:
        out, _ = proc.communicate(timeout=600)
        return proc.returncode, out
    return proc


def _metrics(workdir):
    rows = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "reward/mean" in r}


def _deterministic(row):
    return {k: v for k, v in row.items() if not k.startswith(CLOCK)}


def _wait_for_step(workdir, step, proc, timeout=300):
    path = Path(workdir) / "metrics.jsonl"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.stdout.read()}")
        if path.exists() and any(s >= step for s in _metrics(workdir)):
            return
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached in {timeout}s")


def _first_step(out: str) -> tuple[str, str]:
    """The programs a launch compiled and those it read from the compile cache, as its "first
    step after" line names them."""
    line = next(x for x in out.splitlines() if x.startswith("first step after"))
    compiled, _, cached = line.partition("read from the compile cache")
    return compiled, cached


def _startup(workdir) -> list[dict]:
    rows = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("record") == "startup"]


@pytest.mark.slow
def test_sigkill_then_resume_gives_the_same_metrics(tmp_path):
    """Also the persistent compile cache: the killed launch is a second launch of the same config
    (another workdir, so nothing but the cache is shared) and reads its big programs from it."""
    common = ("train.steps=10", "train.checkpoint_every=2", "train.log_every=1")
    cache = tmp_path / "cache"
    rc, out = _main(tmp_path / "straight", *common, cache=cache)
    assert rc == 0, out
    straight = _metrics(tmp_path / "straight")
    compiled, _ = _first_step(out)
    (first,) = _startup(tmp_path / "straight")
    assert "jit(step)" in compiled and first["startup/programs_from_cache"] == 0
    assert any(cache.iterdir())

    proc = _main(tmp_path / "killed", *common, wait=False, cache=cache)
    _wait_for_step(tmp_path / "killed", 7, proc)
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate()
    reached = max(_metrics(tmp_path / "killed"))
    assert reached < 10  # it really was interrupted
    compiled, cached = _first_step(out)
    assert "jit(step)" in cached and "jit(step)" not in compiled
    (second,) = _startup(tmp_path / "killed")
    assert second["startup/programs_from_cache"] >= 2  # the fused step and the sampler
    total = lambda r: r["startup/programs_compiled"] + r["startup/programs_from_cache"]  # noqa: E731
    assert total(second) == total(first)
    assert second["startup/programs_compiled"] == 0  # the small ones are kept too
    assert second["step"] == 1 and second["startup/seconds"] > 0
    rc, out = _main(tmp_path / "killed", *common, cache=cache)
    assert rc == 0, out
    assert "resumed from step" in out
    resumed = _metrics(tmp_path / "killed")
    assert sorted(resumed) == list(range(1, 11))
    for step in (8, 9, 10):
        assert _deterministic(resumed[step]) == _deterministic(straight[step]), step


@pytest.mark.slow
def test_sigterm_saves_and_exits_cleanly(tmp_path):
    proc = _main(tmp_path, "train.steps=100000", "train.checkpoint_every=0", wait=False)
    _wait_for_step(tmp_path, 3, proc)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    (line,) = [x for x in out.splitlines() if x.startswith("stopped at step ")]
    step = int(line.split()[3])
    assert f"stopped at step {step} by SIGTERM: checkpoint step {step} is saved" in line
    saved = [int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()]
    assert step >= 3 and max(saved) == step


def test_settings_errors_name_the_field():
    from configs import tiny

    config = tiny.get_config()
    config.rl.group_size = 1
    with pytest.raises(ConfigError, match="group_size=1"):
        settings_lib.settings_from_config(config)
    config = tiny.get_config()
    config.rl.loss = {"clip_hihg": 0.3}
    with pytest.raises(ConfigError, match=r"rl\.loss\.clip_hihg"):
        settings_lib.settings_from_config(config)
    config = tiny.get_config()
    config.train.batch_prompts = 3
    config.rl.num_minibatches = 5
    with pytest.raises(ValueError, match="5 minibatches"):
        settings_lib.settings_from_config(config)


def test_rows_that_do_not_split_over_the_mesh_fail_before_compiling():
    from configs import tiny

    config = tiny.get_config()  # 8 host devices in tests: mesh (1, 8, 1) by default
    config.train.batch_prompts = 3
    with pytest.raises(ConfigError, match=r"batch_prompts=3 x rl.group_size=4 = 12 rows"):
        settings_lib.settings_from_config(config)
    config.mesh.data, config.mesh.fsdp = 3, 1
    with pytest.raises(ConfigError, match="mesh"):
        settings_lib.settings_from_config(config)
    # A finished run's settings read back on other hardware are not checked against it.
    assert settings_lib.settings_from_config(config, check_devices=False).mesh.data == 3
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, 2, -1
    config.train.batch_prompts = 1  # 4 rows over fsdp=2, tensor 4
    assert settings_lib.settings_from_config(config).mesh.shape(8) == (1, 2, 4)


def test_tiny_run_in_process(tmp_path):
    from configs import tiny

    config = tiny.get_config()
    config.train.steps = 4
    config.train.use_tensorboard = False
    lines = []
    result = rl_stage.run(settings_lib.settings_from_config(config), tmp_path, log=lines.append)
    assert result["steps"] == 4
    assert 0.0 <= result["eval_after"]["eval/accuracy"] <= 1.0
    assert any("before" in line and "after" in line for line in lines)
    rows = _metrics(tmp_path)
    assert sorted(rows) == [1, 2, 3, 4]
    assert len(rows[4]["groups/success_hist"]) == config.rl.group_size + 1


def test_a_stage_without_its_own_evaluation_trains_and_records_none(tmp_path):
    """`eval.in_stage=False` (the pipelines, which evaluate each stage's policy themselves):
    no held-out evaluation before or after, only the steps."""
    from configs import tiny

    config = tiny.get_config()
    config.train.steps = 2
    config.train.use_tensorboard = False
    config.eval.in_stage = False
    lines = []
    result = rl_stage.run(settings_lib.settings_from_config(config), tmp_path, log=lines.append)
    assert result["steps"] == 2 and result["eval_before"] is result["eval_after"] is None
    assert not any("held-out" in line for line in lines)
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["record"] for r in records] == ["startup", "step", "step"]
    assert records[0]["startup/eval_before_seconds"] == 0.0


def test_host_verifier_path_reports_every_stage(tmp_path):
    from configs import tiny

    config = tiny.get_config()
    config.train.steps = 2
    config.train.use_tensorboard = False
    config.reward.verifier = "math"
    # Prompts in both thinking modes, rewarded for following theirs (`data.modes`).
    config.model.tokenizer = "chars:0123456789+-*=/thinko_ <>"
    config.data.modes = "flag"
    config.data.buckets = (16,)  # "12+3 /no_think="
    config.reward.format = "mode"
    config.reward.format_weight = 0.5
    config.rl.num_microbatches = "auto"  # the update is compiled on its shapes first
    config.rl.memory_budget_gib = 1.0
    lines = []
    result = rl_stage.run(settings_lib.settings_from_config(config), tmp_path, log=lines.append)
    assert result["steps"] == 2
    (chosen,) = [line for line in lines if line.startswith('rl.num_microbatches="auto"')]
    assert '"auto" -> 1 (' in chosen and "of a 1.00 GiB budget; compiled 1: " in chosen
    row = _metrics(tmp_path)[2]
    n = config.train.batch_prompts * config.rl.group_size
    assert row["verifier/checks"] == 2 * n + 64  # two steps, plus the eval before training
    for stage in ("prompt_selection", "rollout", "verification", "update", "step"):
        assert row[f"time/{stage}"] > 0
    # A random policy thinks by chance at most: it follows "/no_think" and not "/think".
    assert 0 < row["reward/format"] < 1


def test_default_config_lets_every_field_be_overridden():
    config = settings_lib.default_config()
    config.rl.advantage.estimator = "dr_grpo"
    config.rl.loss.dual_clip = 3.0
    config.rl.sampler.max_new_tokens = 16
    s = settings_lib.settings_from_config(config)
    assert s.rl.advantage.std_scaling == "none"
    assert s.rl.loss.dual_clip == 3.0
