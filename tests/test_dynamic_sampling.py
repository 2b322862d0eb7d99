"""DAPO dynamic sampling in the training loop: rounds, the kept groups, and a real run."""

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from rlvr_jax.data.datasets import Example
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.stages import rl_stage
from rlvr_jax.rl import dynamic_sampling
from rlvr_jax.types import Rollout

G = 2


def _rollout(rows: int, width: int, marker: int) -> Rollout:
    """A stand-in rollout whose tokens carry `marker` and the row index, to trace rows."""
    tokens = np.stack([np.full((3,), marker * 100 + i) for i in range(rows)])
    return Rollout(
        prompt_NP=jnp.ones((rows, width), jnp.int32),
        prompt_lengths_N=jnp.full((rows,), width, jnp.int32),
        tokens_NT=jnp.asarray(tokens, jnp.int32),
        logp_NT=jnp.zeros((rows, 3)),
        mask_NT=jnp.ones((rows, 3), bool),
        injected_NT=jnp.zeros((rows, 3), bool),
        lengths_N=jnp.full((rows,), 3, jnp.int32),
        finish_N=jnp.ones((rows,), jnp.int32),
    )


def test_rounds_keep_groups_with_reward_variance_then_top_up():
    # Round 0: groups (1,1) (0,1); round 1: (0,0) (1,0); round 2 is never needed.
    plans = [([1, 1, 0, 1], 4), ([0, 0, 1, 0], 6), ([0, 0, 0, 0], 4)]
    calls = []

    def draw():
        i = len(calls)
        calls.append(i)
        return [Example(f"p{i}{b}", "q", "1", "t") for b in range(2)], i

    def verify(examples, i):
        rewards, width = plans[i]
        r = np.asarray(rewards, np.float32)
        return dynamic_sampling.Round(examples, _rollout(4, width, i), r, {"correct": r})

    rollout, rewards, parts, rounds, metrics = dynamic_sampling.dynamic_sampling_batch(
        draw, verify, batch_prompts=2, group_size=G, max_rounds=3, pad_id=0
    )
    assert len(rounds) == 2 and metrics["dynamic_sampling/rounds"] == 2
    assert metrics["dynamic_sampling/kept"] == 2 and metrics["dynamic_sampling/dropped"] == 2
    # Kept: group 1 of round 0 (rows 2, 3) and group 1 of round 1 (rows 2, 3).
    np.testing.assert_array_equal(np.asarray(rollout.tokens_NT)[:, 0], [2, 3, 102, 103])
    np.testing.assert_array_equal(rewards, [0, 1, 1, 0])
    np.testing.assert_array_equal(parts["correct"], rewards)
    # Prompts are left-padded to the widest round's bucket.
    assert rollout.prompt_NP.shape == (4, 6)
    np.testing.assert_array_equal(np.asarray(rollout.prompt_NP)[0], [0, 0, 1, 1, 1, 1])


def test_rounds_run_out_and_the_batch_is_topped_up_with_dropped_groups():
    def draw():
        return [Example("a", "q", "1", "t"), Example("b", "q", "1", "t")], None

    def verify(examples, _):
        r = np.ones((4,), np.float32)
        return dynamic_sampling.Round(examples, _rollout(4, 4, 0), r, {"correct": r})

    rollout, rewards, _, rounds, metrics = dynamic_sampling.dynamic_sampling_batch(
        draw, verify, batch_prompts=2, group_size=G, max_rounds=2, pad_id=0
    )
    assert len(rounds) == 2 and rollout.tokens_NT.shape[0] == 4
    assert metrics["dynamic_sampling/padded"] == 2 and metrics["dynamic_sampling/full"] == 1


def test_tiny_run_with_dynamic_sampling(tmp_path):
    from configs import tiny

    config = tiny.get_config()
    config.train.steps = 3
    config.train.use_tensorboard = False
    config.data.dynamic_sampling = True
    config.data.dynamic_max_rounds = 3
    config.data.sampler = "curriculum"
    result = rl_stage.run(settings_lib.settings_from_config(config), tmp_path, log=lambda _: None)
    assert result["steps"] == 3
    lines = (Path(tmp_path) / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    steps = [r for r in rows if "dynamic_sampling/rounds" in r]
    assert len(steps) == 3
    B = config.train.batch_prompts
    for r in steps:
        assert 1 <= r["dynamic_sampling/rounds"] <= 3
        assert r["dynamic_sampling/generated"] == B * r["dynamic_sampling/rounds"]
        kept = min(r["dynamic_sampling/kept"], B)
        # The batch trained on has at most the topped-up groups without variance.
        assert r["adv/frac_zero_variance"] * B <= B - kept + 1e-6
        # Every round's rows were verified; the kept groups trained on are the useful ones.
        G = config.rl.group_size
        assert r["useful/verified"] == G * r["dynamic_sampling/generated"]
        assert r["useful/trajectories"] == G * kept
        assert r["useful/tokens"] >= r["rollout/tokens"]
        assert r["time/rollout"] > 0 and r["time/update"] > 0
    # Every attempted group, kept or not, updated the curriculum's statistics.
    generated = sum(r["dynamic_sampling/generated"] for r in steps)
    n_train = config.data.num_train - config.data.num_eval
    assert steps[-1]["curriculum/seen_fraction"] * n_train <= generated
    assert steps[-1]["curriculum/seen_fraction"] * n_train > B
