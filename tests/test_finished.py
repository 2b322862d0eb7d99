"""A rerun of a finished run prints its recorded result and loads nothing; `--reevaluate`, a run
killed before its final record and an extended run go through the run skeleton as before."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from configs import sft_tiny
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.runtime import finished, ledger
from rlvr_jax.program.stages import dispatch, sft_stage
from tests.test_bad_settings import _tiny
from tests.test_main import REPO, TINY


def _settings(**overrides):
    base = dict(
        train__steps=2,
        train__use_tensorboard=False,
        train__checkpoint_every=1,
        eval__batch_prompts=64,
    )
    return settings_lib.settings_from_config(_tiny(**{**base, **overrides}))


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """One finished 2-step run of the tiny config; tests use copies of it."""
    workdir = tmp_path_factory.mktemp("base") / "run"
    dispatch.run(_settings(), workdir, log=lambda _: None)
    return workdir


@pytest.fixture
def run(base_run, tmp_path):
    shutil.copytree(base_run, tmp_path / "run")
    return tmp_path / "run"


def _ledger(workdir):
    return (workdir / ledger.METRICS_FILE).read_bytes()


def _refuse_to_load(monkeypatch, stage="rl"):
    def run_stage(*args, **kwargs):
        raise AssertionError("the stage ran: the model was loaded")

    monkeypatch.setitem(dispatch.STAGES, stage, run_stage)


def test_a_rerun_prints_the_recorded_result_and_loads_nothing(run, monkeypatch):
    before = _ledger(run)
    records = ledger.read_metrics(run)
    first, final = ledger.initial_eval(records), ledger.final_eval(records)
    _refuse_to_load(monkeypatch)
    lines = []
    out = dispatch.run(_settings(), run, log=lines.append, skip_finished=True)
    assert lines == [
        f"{run}: finished at step 2; recorded held-out accuracy: before "
        f"{first['eval/accuracy']:.3f}, after {final['eval/accuracy']:.3f} (64 prompts, greedy)."
        "\n--reevaluate evaluates the final checkpoint again; raise --config.train.steps to train "
        "further."
    ]
    assert _ledger(run) == before  # nothing evaluated, nothing rewritten
    assert out["finished"] and out["steps"] == 2 and out["resumed_from"] == 2
    assert out["eval_after"] == final and out["eval_before"] == first


def test_reevaluate_evaluates_the_final_checkpoint_again(run):
    recorded = ledger.final_eval(ledger.read_metrics(run))
    lines = []
    out = dispatch.run(_settings(), run, log=lines.append)  # what main does with --reevaluate
    assert "finished" not in out and out["resumed_from"] == 2 and out["steps"] == 2
    assert any(x.startswith("held-out accuracy: before") for x in lines)
    records = ledger.read_metrics(run)
    kinds = [(r["step"], r[ledger.RECORD]) for r in records]
    assert kinds == [(0, "eval"), (1, "startup"), (1, "step"), (2, "step"), (2, "final")]
    again = ledger.final_eval(records)
    assert again["time"] > recorded["time"]  # a new evaluation, of the same checkpoint
    assert again["eval/accuracy"] == recorded["eval/accuracy"]


def test_a_run_killed_before_its_final_record_evaluates_on_rerun(run):
    path = run / ledger.METRICS_FILE
    lines = path.read_text().splitlines(keepends=True)
    assert json.loads(lines[-1])[ledger.RECORD] == ledger.FINAL
    path.write_text("".join(lines[:-1]))
    out = dispatch.run(_settings(), run, log=lambda _: None, skip_finished=True)
    assert "finished" not in out and out["eval_after"] is not None
    assert ledger.final_eval(ledger.read_metrics(run))["step"] == 2


def test_a_finished_run_extended_trains_further(run):
    out = dispatch.run(_settings(train__steps=3), run, log=lambda _: None, skip_finished=True)
    assert "finished" not in out and out["resumed_from"] == 2 and out["steps"] == 3
    records = ledger.read_metrics(run)
    assert [r["step"] for r in ledger.step_rows(records)] == [1, 2, 3]
    assert ledger.final_eval(records)["step"] == 3


def test_what_is_not_finished(run):
    s = _settings()
    saved = json.loads((run / settings_lib.SETTINGS_FILE).read_text())
    # The end ids: filled by the tokenizer in the saved settings, empty in `s`.
    assert saved["rl"]["sampler"]["eos_ids"] not in ([], [3]) and not s.rl.sampler.eos_ids
    assert finished.find(run, s) is not None
    # Any setting changed, also one a resume may change freely: the result is of other settings.
    assert finished.find(run, _settings(eval__batch_prompts=32)) is None
    assert finished.find(run, _settings(train__steps=3)) is None
    # Explicit end ids are compared.
    assert finished.find(run, _settings(**{"rl.sampler__eos_ids": (3,)})) is None
    # The newest checkpoint is not the final evaluation's step.
    shutil.rmtree(run / "checkpoints" / "2")
    assert finished.find(run, s) is None


def test_what_a_stage_writes_after_its_final_evaluation_must_be_newer(run):
    export = run / "hf"
    s = _settings()
    assert finished.find(run, s, [export]) is None  # killed before it was written
    export.mkdir()
    final_time = ledger.final_eval(ledger.read_metrics(run))["time"]
    os.utime(export, (final_time - 60, final_time - 60))
    assert finished.find(run, s, [export]) is None  # an earlier run's
    os.utime(export, (final_time + 1, final_time + 1))
    assert finished.find(run, s, [export]) is not None


def test_an_sft_run_is_finished_once_its_export_is_written(tmp_path, monkeypatch):
    c = sft_tiny.get_config()
    c.train.steps, c.train.use_tensorboard, c.sft.eval, c.sft.export = 2, False, True, True
    s = settings_lib.settings_from_config(c)
    workdir = tmp_path / "sft"
    dispatch.run(s, workdir, log=lambda _: None, skip_finished=True)
    export = workdir / sft_stage.EXPORT_DIR
    assert export.is_dir()
    with monkeypatch.context() as m:
        _refuse_to_load(m, "sft")
        lines = []
        out = dispatch.run(s, workdir, log=lines.append, skip_finished=True)
    assert out["finished"] and "raise --config.train.steps to train further" in lines[0]
    # Killed while exporting: the stage runs, evaluates and exports again.
    shutil.rmtree(export)
    out = dispatch.run(s, workdir, log=lambda _: None, skip_finished=True)
    assert "finished" not in out and out["export"] == export and export.is_dir()


def test_a_damaged_ledger_is_left_to_the_run_skeleton(run):
    (run / ledger.METRICS_FILE).write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    assert finished.find(run, _settings()) is None


@pytest.mark.slow
def test_main_reruns_a_finished_run_without_loading_and_reevaluates_on_request(tmp_path):
    workdir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "rlvr_jax.main",
        f"--config={TINY}",
        f"--workdir={workdir}",
        "--config.train.steps=2",
        f"--compile_cache={tmp_path / 'cache'}",
    ]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))

    def launch(*flags):
        proc = subprocess.run(
            [*cmd, *flags], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    launch()
    before = _ledger(workdir)
    out = launch()
    assert f"{workdir}: finished at step 2; recorded held-out accuracy: before " in out
    assert "first step after" not in out and "held-out accuracy before RL" not in out
    assert _ledger(workdir) == before
    out = launch("--reevaluate")
    assert "finished at step" not in out
    assert "metrics: resuming from checkpoint step 2; keeping 2 step rows" in out
    assert "held-out accuracy: before" in out
    assert _ledger(workdir) != before
