"""Partial rollouts through the RL stage: with a budget above every answer the run is the plain
run; with a small one rows carry over between steps, with their versions, and survive a
restart."""

import json
from pathlib import Path

import numpy as np
import pytest

from configs import tiny
from rlvr_jax.config_types import ConfigError
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.stages import rl_stage

# Rates and values that the path the step takes cannot change (timings, the partial metrics).
# The sampler/trainer mismatch is float noise, which the prefill layout changes.
SKIP = ("time/", "throughput/", "useful/per_hour", "partial/", "verifier/", "mismatch/")


def _config(steps: int, budget: int):
    c = tiny.get_config()
    c.data.num_train = 72
    c.data.num_eval = 8
    c.eval.batch_prompts = 8
    c.train.batch_prompts = 4
    c.train.steps = steps
    c.train.checkpoint_every = 1
    c.train.use_tensorboard = False
    c.rl.loss.tis_cap = 2.0
    c.rl.partial_budget = budget
    return c


def _steps(workdir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "reward/mean" in r]


def _run(config, workdir: Path) -> list[dict]:
    s = settings_lib.settings_from_config(config)
    rl_stage.run(s, workdir, log=lambda _: None)
    return _steps(workdir)


def _assert_same_steps(a: list[dict], b: list[dict]) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b, strict=True):
        keys = {k for k, v in x.items() if not k.startswith(SKIP) and not isinstance(v, str)}
        keys &= set(y)
        assert keys >= {"reward/mean", "loss/pg", "grad_norm", "length/mean"}
        for k in sorted(keys):
            np.testing.assert_allclose(
                np.asarray(x[k]), np.asarray(y[k]), rtol=2e-4, atol=1e-6, err_msg=k
            )


def test_a_budget_above_every_answer_trains_like_the_plain_step(tmp_path):
    plain = _run(_config(steps=2, budget=0), tmp_path / "plain")
    # One round of max_new_tokens per step: the same rows, verified on the host.
    partial = _run(_config(steps=2, budget=3), tmp_path / "partial")
    _assert_same_steps(plain, partial)
    for r in partial:
        assert r["partial/rounds"] == 1
        # One round: the useful-trajectory counts are the plain step's (compared above).
        assert r["useful/verified"] == 4 * 4 and r["useful/tokens"] == r["rollout/tokens"]
        assert r["partial/version_lag_max"] == 0
        assert r["partial/running_groups"] == r["partial/waiting_groups"] == 0


def test_rows_carry_over_with_their_versions_and_survive_a_restart(tmp_path):
    def config(steps):
        c = _config(steps, budget=2)
        c.rl.sampler.max_new_tokens = 8
        # End ids "0", "1" and "2" besides the end token: answers end at scattered lengths, so
        # groups complete in different rounds and some run on into the next step.
        c.rl.sampler.eos_ids = (1, 2, 3, 4)
        c.rl.sampler.pad_id = 0
        return c

    whole = _run(config(steps=4), tmp_path / "whole")
    assert any(r["partial/version_lag_max"] > 0 for r in whole)
    assert any(r["partial/multi_round_rows"] > 0 for r in whole)
    assert any(r["partial/running_groups"] > 0 for r in whole[:-1])
    # A row is verified in the step that finishes it (B x G rows a step, trained on then); its
    # tokens count in the steps that sample them: the run's sampled tokens are those of the
    # rows trained on and of the groups still pending at the end.
    assert all(r["useful/verified"] == 4 * 4 for r in whole)
    sampled = sum(r["useful/tokens"] for r in whole)
    trained = sum(r["rollout/tokens"] for r in whole)
    pending = whole[-1]["partial/running_groups"] + whole[-1]["partial/waiting_groups"]
    assert sampled >= trained and (sampled > trained) == (pending > 0)
    for r in whole:
        assert r["partial/rounds"] >= 1
        assert 0 < r["rollout/slot_utilisation"] <= 1
        assert 0 <= r["partial/version_lag_mean"] <= r["partial/version_lag_max"]
    # Stopped after step 2 and resumed: the running groups come back from the checkpoint.
    _run(config(steps=2), tmp_path / "restarted")
    s = settings_lib.settings_from_config(config(steps=4))
    result = rl_stage.run(s, tmp_path / "restarted", log=lambda _: None)
    assert result["resumed_from"] == 2
    _assert_same_steps(whole, _steps(tmp_path / "restarted"))


def test_partial_rollouts_and_dynamic_sampling_are_refused_together():
    c = _config(steps=1, budget=2)
    c.data.dynamic_sampling = True
    with pytest.raises(ConfigError, match="rl.partial_budget=2 with data.dynamic_sampling"):
        settings_lib.settings_from_config(c)
