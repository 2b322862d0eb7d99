"""Settings that would poison a run fail before anything compiles, naming the field; a run whose
update goes non-finite stops with an error instead of training on NaN."""

import importlib.util
import math
import os
import subprocess
import sys

import pytest

from rlvr_jax.config_types import ConfigError
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.runtime.metrics import read_metrics
from rlvr_jax.program.runtime.run import NonFiniteError, non_finite
from rlvr_jax.program.stages import rl_stage
from tests.test_main import REPO, TINY


def _tiny(**overrides):
    """The tiny config with `section__field=value` overrides (dots for nested sections)."""
    spec = importlib.util.spec_from_file_location("tiny", TINY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    for dotted, value in overrides.items():
        section, _, name = dotted.partition("__")
        node = config
        for part in section.split("."):
            node = node[part]
        node[name] = value
    return config


BAD = [
    ("optim__learning_rate", math.inf, "optim.learning_rate=inf must be a finite number"),
    ("optim__learning_rate", 0.0, "learning_rate=0.0 must be positive"),
    ("optim__weight_decay", math.nan, "optim.weight_decay=nan must be a finite number"),
    ("optim__weight_decay", -0.1, "weight_decay=-0.1 must be >= 0"),
    ("optim__b1", 2.0, r"b1=2.0 must be in \[0, 1\)"),
    ("optim__b2", -0.5, r"b2=-0.5 must be in \[0, 1\)"),
    ("optim__eps", 0.0, "eps=0.0 must be positive"),
    ("rl__temperature", math.inf, "rl.temperature=inf must be a finite number"),
    ("rl__top_p", 2.0, "top_p=2.0"),
    ("rl__min_p", -1.0, "min_p=-1.0"),
    ("reward__format_weight", math.nan, "reward.format_weight=nan must be a finite number"),
    ("reward__length_weight", math.inf, "reward.length_weight=inf must be a finite number"),
    ("reward__overlong_cache", -1, "overlong_cache=-1 must be >= 0"),
    ("reward__sandbox_backend", "auto", "reward.sandbox_backend='auto'"),
    ("reward__sandbox_backend", "docker", "reward.sandbox_backend='docker'"),
    ("train__batch_prompts", 0, "batch_prompts=0 must be >= 1"),
    ("train__batch_prompts", -4, "batch_prompts=-4 must be >= 1"),
    ("train__steps", -1, "steps=-1 must be >= 0"),
    ("train__keep_checkpoints", 0, "keep_checkpoints=0 must be >= 1"),
    ("train__checkpoint_every", -1, "checkpoint_every=-1 must be >= 0"),
    ("train__eval_every", -2, "eval_every=-2 must be >= 0"),
    ("train__log_every", 0, "log_every=0 must be >= 1"),
    ("eval__batch_prompts", 0, "batch_prompts=0 must be >= 1"),
    ("data__num_eval", -1, "num_eval=-1"),
    ("data__num_train", -5, "num_train=-5"),
    ("data__buckets", (), r"buckets=\(\) must be positive prompt lengths"),
    ("data__buckets", (8, 0), r"buckets=\(8, 0\) must be positive prompt lengths"),
    ("rl__group_size", 0, "group_size"),
    ("rl.sampler__max_new_tokens", 0, "max_new_tokens=0 must be at least 1"),
    ("sft__batch_size", -1, "batch_size=-1"),
    ("rl__num_microbatches", "many", "rl.num_microbatches='many'"),
    ("rl__num_microbatches", 0, "num_microbatches=0 must be at least 1"),
    ("rl__memory_budget_gib", -1.0, "memory_budget_gib=-1.0 must be >= 0"),
    ("rl__decode_slots", 0, "rl.decode_slots=0 must be >= 1"),
    ("rl__decode_slots", 1000, "rl.decode_slots=1000 exceeds the 64 rows"),
]


@pytest.mark.parametrize("field,value,message", BAD)
def test_a_bad_setting_fails_naming_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message):
        settings_lib.settings_from_config(_tiny(**{field: value}))


def test_a_periodic_evaluation_needs_the_stages_own():
    with pytest.raises(ConfigError, match=r"train.eval_every=2 with eval.in_stage=False"):
        settings_lib.settings_from_config(_tiny(train__eval_every=2, eval__in_stage=False))


def test_the_tiny_config_itself_is_accepted():
    settings_lib.settings_from_config(_tiny())


def test_microbatches_take_a_number_or_auto():
    s = settings_lib.settings_from_config(_tiny(rl__num_microbatches="auto"))
    assert s.rl.num_microbatches == "auto" and s.rl.auto_microbatches
    assert settings_lib.settings_from_config(_tiny(rl__num_microbatches=4)).rl.num_microbatches == 4


def test_non_finite_losses_and_norms_are_found():
    assert non_finite({"loss/pg": 0.5, "grad_norm": 1.0, "reward/mean": math.nan}) == {}
    found = non_finite({"loss/pg": math.nan, "update_norm": math.inf, "sft/loss": 1.0})
    assert set(found) == {"loss/pg", "update_norm"}
    assert set(non_finite({"sft/grad_norm": math.nan, "groups/grad_norm": [math.nan]})) == {
        "sft/grad_norm"
    }


def test_a_run_whose_update_goes_non_finite_stops_with_an_error(tmp_path):
    # A finite but absurd learning rate: the first update overflows.
    config = _tiny(
        optim__learning_rate=1e30,
        train__steps=4,
        train__checkpoint_every=1,
        train__use_tensorboard=False,
        optim__max_grad_norm=0.0,
    )
    settings = settings_lib.settings_from_config(config)
    with pytest.raises(NonFiniteError, match=r"step 1: update_norm=inf.*last checkpoint: none"):
        rl_stage.run(settings, tmp_path, log=lambda _: None)
    rows = [r for r in read_metrics(tmp_path) if r["record"] == "step"]
    assert [r["step"] for r in rows] == [1]  # the failing step's row is in the ledger
    assert rows[0]["update_norm"] is None  # written as null
    saved = [p for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()]
    assert not saved  # the state after the failed update was not saved


@pytest.mark.parametrize("code", [0, 3])
def test_a_config_file_that_calls_sys_exit_is_a_config_error(tmp_path, code):
    config = tmp_path / "exits.py"
    config.write_text(f"import sys\n\n\ndef get_config():\n    sys.exit({code})\n")
    proc = subprocess.run(
        [sys.executable, "-m", "rlvr_jax.main", f"--config={config}", f"--workdir={tmp_path}/w"],
        cwd=REPO,
        env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr  # a user error (`user_errors`), not the file's code
    assert f"exits.py ended the process while loading (sys.exit({code}))" in proc.stderr
    assert not (tmp_path / "w").exists()
