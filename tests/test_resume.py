"""Resume refuses settings that change what a checkpoint means, names them, and leaves the run's
settings.json alone; a termination signal during start-up ends the run with a message."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from rlvr_jax.config_types import ConfigError
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.runtime import resume_settings
from rlvr_jax.program.stages import rl_stage
from tests.test_bad_settings import _tiny
from tests.test_main import REPO, TINY


def _settings(**overrides):
    base = dict(
        train__steps=4,
        train__use_tensorboard=False,
        train__log_every=1,
        train__checkpoint_every=1,
        train__keep_checkpoints=5,
    )
    return settings_lib.settings_from_config(_tiny(**{**base, **overrides}))


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """One finished 4-step run with a checkpoint at every step; tests resume copies of it."""
    workdir = tmp_path_factory.mktemp("base")
    rl_stage.run(_settings(), workdir, log=lambda _: None)
    return workdir


@pytest.fixture
def finished(base_run, tmp_path):
    shutil.copytree(base_run, tmp_path / "run")
    return tmp_path / "run"


def test_a_changed_group_size_is_refused_naming_both_values(finished):
    before = (finished / settings_lib.SETTINGS_FILE).read_text()
    changed = _settings(train__steps=5, **{"rl__group_size": 2})
    with pytest.raises(ConfigError) as e:
        rl_stage.run(changed, finished, log=lambda _: None)
    message = str(e.value)
    assert "rl.group_size: 4 in the checkpoint, 2 now" in message
    assert "--allow_changed_settings" in message
    assert (finished / settings_lib.SETTINGS_FILE).read_text() == before


def test_every_changed_field_is_listed(finished):
    changed = _settings(train__steps=5, data__seed=5, optim__b1=0.5)
    with pytest.raises(ConfigError) as e:
        rl_stage.run(changed, finished, log=lambda _: None)
    assert "data.seed: 0 in the checkpoint, 5 now" in str(e.value)
    assert "optim.b1: 0.9 in the checkpoint, 0.5 now" in str(e.value)


def test_free_settings_change_without_a_flag():
    diffs = resume_settings.resume_differences(
        settings_lib.plain_settings(_settings()),
        _settings(train__steps=9, train__checkpoint_every=3, eval__batch_prompts=16),
    )
    assert diffs == []


def test_a_deliberate_change_is_accepted_and_logged(finished):
    lines = []
    out = rl_stage.run(
        _settings(train__steps=5, optim__learning_rate=1e-3),
        finished,
        log=lines.append,
        allow_changed_settings=True,
    )
    assert out["steps"] == 5 and out["resumed_from"] == 4
    assert any("optim.learning_rate: 0.003 in the checkpoint, 0.001 now" in x for x in lines)
    saved = json.loads((finished / settings_lib.SETTINGS_FILE).read_text())
    assert saved["optim"]["learning_rate"] == 1e-3  # the settings the run now continues with


@pytest.mark.slow
def test_sigterm_during_start_up_says_nothing_was_trained(tmp_path):
    workdir = tmp_path / "run"
    cmd = [sys.executable, "-m", "rlvr_jax.main", f"--config={TINY}", f"--workdir={workdir}"]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 300
    # The workdir appears when the skeleton opens it, before the first evaluation compiles.
    while not workdir.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, (out, err)
    assert "stopped by SIGTERM outside the training loop" in err
    assert "this process has trained nothing yet" in err
    # The message comes first; only background threads stopped at exit may print after it.
    assert "Traceback" not in err.split("stopped by SIGTERM")[0]
    checkpoints = workdir / "checkpoints"
    assert not checkpoints.exists() or not any(p.name.isdigit() for p in checkpoints.iterdir())


def _step_rows(workdir):
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if r["record"] == "step"]


def test_resume_from_an_explicit_step_drops_what_came_after(finished):
    lines = []
    out = rl_stage.run(_settings(), finished, log=lines.append, resume_step=2)
    assert out["resumed_from"] == 2 and out["steps"] == 4
    assert any("removed checkpoints [3, 4]" in x for x in lines)
    assert _step_rows(finished) == [1, 2, 3, 4]


def test_an_unreadable_latest_checkpoint_falls_back_to_the_previous_one(finished, caplog):
    (finished / "checkpoints" / "4" / "meta" / "metadata").write_text("{not json")
    out = rl_stage.run(_settings(train__steps=5), finished, log=lambda _: None)
    assert out["resumed_from"] == 3 and out["steps"] == 5
    assert "checkpoint step 4 is unreadable" in caplog.text
    assert _step_rows(finished) == [1, 2, 3, 4, 5]
