"""Verified useful trajectories: the count from hand-made rewards, the per-step rates, the
dynamic-sampling step's counts over its rounds, a run's rate from its ledger, and a tiny run's
ledger and progress line."""

import json
import math
import types

import jax.numpy as jnp
import numpy as np
import pytest

from configs import tiny
from rlvr_jax.data.datasets import Example
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.runtime import useful
from rlvr_jax.program.stages import rl_stage
from rlvr_jax.rl import dynamic_sampling, outputs
from rlvr_jax.types import Rollout

# ---------------------------------------------------------------------------------------------
# The count


@pytest.mark.parametrize(
    "rewards, G, want",
    [
        ([1, 1, 0, 0, 0.5, 0.5], 2, 0),  # every group all equal: correct, wrong, a constant
        ([1, 0, 1, 1, 0, 0], 2, 2),  # one mixed group of three
        ([1, 0, 0, 1, 1, 0], 3, 6),  # G = 3: both groups hold a 0 and a 1
        ([1, 0, 0, 1, 1, 1], 3, 3),  # G = 3: the second group is all correct
        ([1, 1, 1, 1], 4, 0),  # one group, all correct
        ([1.0, 1.5, 0.0, 0.0], 2, 2),  # both correct, a shaped reward apart: useful
        ([0.0, -0.0, 2.0, 2.0 + 1e-6], 2, 2),  # -0 equals 0; a difference of 1e-6 counts
        ([0.25], 1, 0),  # G = 1: no group baseline, nothing useful
    ],
)
def test_useful_rows_count_the_groups_whose_rewards_differ(rewards, G, want):
    got = outputs.useful_rows(np.asarray(rewards, np.float32), G)
    assert float(got) == want


def test_sampled_tokens_leave_injected_tokens_out():
    rollout = _rollout(2, marker=0, injected=((0, 1),))
    assert float(outputs.sampled_tokens(rollout)) == 2 * 3 - 1


def test_rates_by_hand():
    r = useful.rates(trajectories=6, verified=8, tokens=24, seconds=2.0)
    assert r == {
        useful.FRACTION: 0.75,
        useful.PER_HOUR: 3600 * 6 / 2.0,
        useful.PER_1K_TOKENS: 1000 * 6 / 24,
    }
    empty = useful.rates(trajectories=0, verified=0, tokens=0, seconds=0.0)
    assert all(math.isnan(v) for v in empty.values())
    step = {
        useful.TRAJECTORIES: 4,
        **useful.step_counts(verified=8, tokens=40),
        "time/step": 0.5,
    }
    assert useful.step_rates(step)[useful.PER_HOUR] == 3600 * 4 / 0.5
    del step["time/step"]
    assert useful.step_rates(step) == {}


def test_a_runs_rate_leaves_step_one_out_and_skips_rows_without_the_metric():
    records = [
        {"step": 0, "record": "eval", "eval/accuracy": 0.5},
        {"step": 1, "record": "step", useful.TRAJECTORIES: 8.0, "time/step": 30.0},
        {"step": 2, "record": "step", useful.TRAJECTORIES: 4.0, "time/step": 1.0},
        {"step": 3, "record": "step", useful.TRAJECTORIES: 2.0, "time/step": 2.0},
        {"step": 4, "record": "step", "time/step": 5.0},  # an older row: no count
        {"step": 4, "record": "final", useful.TRAJECTORIES: 99.0, "time/step": 1.0},
    ]
    assert useful.run_per_hour(records) == pytest.approx(3600 * 6 / 3)
    only_first = [records[1]]
    assert useful.run_per_hour(only_first) == pytest.approx(3600 * 8 / 30)
    assert math.isnan(useful.run_per_hour([{"step": 1, "time/step": 1.0}]))
    assert math.isnan(useful.run_per_hour([]))


# ---------------------------------------------------------------------------------------------
# Dynamic sampling: every round verified, the trained rows' groups useful

G = 2


def _rollout(rows: int, marker: int, injected=()) -> Rollout:
    """A stand-in rollout of 3 tokens a row; `injected` (row, position) pairs are forced."""
    inj = np.zeros((rows, 3), bool)
    for n, t in injected:
        inj[n, t] = True
    return Rollout(
        prompt_NP=jnp.ones((rows, 2), jnp.int32),
        prompt_lengths_N=jnp.full((rows,), 2, jnp.int32),
        tokens_NT=jnp.full((rows, 3), marker, jnp.int32),
        logp_NT=jnp.zeros((rows, 3)),
        mask_NT=jnp.ones((rows, 3), bool),
        injected_NT=jnp.asarray(inj),
        lengths_N=jnp.full((rows,), 3, jnp.int32),
        finish_N=jnp.ones((rows,), jnp.int32),
    )


def _dynamic_step(plans, max_rounds):
    """`rl_stage`'s dynamic-sampling batch over rounds of hand-made rewards (B = 2 prompts, G
    = 2), its update a stand-in that reports `useful_rows` of the rows it trains on."""
    s = types.SimpleNamespace(
        train=types.SimpleNamespace(batch_prompts=2),
        rl=types.SimpleNamespace(group_size=G),
        data=types.SimpleNamespace(dynamic_max_rounds=max_rounds),
    )
    trained = []

    def select(i):
        return i + 1, [Example(f"p{i}{b}", "q", "1", "t") for b in range(2)], i

    def rollout_round(state, chosen, i):
        r = np.asarray(plans[i], np.float32)
        rollout = _rollout(4, i, injected=((0, 2),))  # one forced token a round
        return state, dynamic_sampling.Round(list(chosen), rollout, r, {"correct": r})

    def update(state, rollout, rewards, parts):
        trained.append(np.asarray(rewards))
        metrics = {outputs.USEFUL_TRAJECTORIES: outputs.useful_rows(rewards, G)}
        rows = outputs.RowResults(parts["correct"], np.zeros(4), np.asarray(rollout.lengths_N))
        return state, outputs.StepOutput(metrics, rows)

    batch = rl_stage._dynamic_batch(s, select, rollout_round, update, pad_id=0)
    _, _, out, extra, attempts = batch(None, 0)
    return out, extra, attempts, trained[0]


def test_dynamic_sampling_counts_every_rounds_rows_as_verified():
    # Round 0: groups (1,1) all equal, (0,1) kept; round 1: (0,0) all equal, (1,0) kept.
    out, extra, attempts, trained = _dynamic_step([[1, 1, 0, 1], [0, 0, 1, 0]], max_rounds=3)
    assert len(attempts) == 2
    np.testing.assert_array_equal(trained, [0, 1, 1, 0])
    assert float(out.metrics[useful.TRAJECTORIES]) == 4  # both trained groups are mixed
    assert extra[useful.VERIFIED] == 8  # the dropped groups' rows were verified too
    assert extra[useful.TOKENS] == 2 * (4 * 3 - 1)  # every round's, forced tokens left out
    assert extra["dynamic_sampling/rounds"] == 2


def test_dynamic_sampling_top_up_groups_are_not_useful():
    # The rounds run out with one mixed group; the batch is topped up with an all-equal one.
    out, extra, _, trained = _dynamic_step([[1, 1, 0, 1], [0, 0, 0, 0]], max_rounds=2)
    np.testing.assert_array_equal(trained, [0, 1, 1, 1])
    assert float(out.metrics[useful.TRAJECTORIES]) == 2
    assert extra[useful.VERIFIED] == 8
    assert useful.rates(2, extra[useful.VERIFIED], 1, 1.0)[useful.FRACTION] == 0.25


# ---------------------------------------------------------------------------------------------
# A tiny run


def test_a_tiny_runs_ledger_and_progress_line_hold_the_useful_trajectories(tmp_path, capsys):
    c = tiny.get_config()
    c.train.steps = 3
    c.train.use_tensorboard = False
    c.train.checkpoint_every = 0
    c.eval.in_stage = False
    rl_stage.run(settings_lib.settings_from_config(c), tmp_path, log=lambda _: None)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["record"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    B, G = c.train.batch_prompts, c.rl.group_size
    for r in steps:
        # The in-graph verifier's rewards, per group: G useful rows per group whose rewards
        # differ, the groups the advantage statistics call zero-variance excepted.
        mixed_groups = round(B * (1 - r["adv/frac_zero_variance"]))
        assert r[useful.TRAJECTORIES] == G * mixed_groups
        if r["reward/std"] == 0:
            assert r[useful.TRAJECTORIES] == 0
        assert r[useful.VERIFIED] == B * G
        assert r[useful.TOKENS] == r["rollout/tokens"]  # nothing injected
        assert r[useful.TOKENS] == r[outputs.SAMPLED_TOKENS]
        assert r[useful.FRACTION] == pytest.approx(r[useful.TRAJECTORIES] / (B * G))
        assert r[useful.PER_HOUR] == pytest.approx(3600 * r[useful.TRAJECTORIES] / r["time/step"])
        assert r[useful.PER_1K_TOKENS] == pytest.approx(
            1000 * r[useful.TRAJECTORIES] / r[useful.TOKENS]
        )
    assert any(r[useful.TRAJECTORIES] > 0 for r in steps)
    # The progress line of the last step shows its rate.
    (last,) = [x for x in capsys.readouterr().out.splitlines() if "3/3" in x]
    assert f"useful/h {steps[-1][useful.PER_HOUR]:.0f}" in last
