"""The reward-model stage: a run on preference pairs (bad rows counted) learns them, and an RL
run's task reads its checkpoint as the "preference" part, on the policy's mesh."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from configs import reward_model_tiny, tiny
from rlvr_jax.config_types import ConfigError
from rlvr_jax.data.example import Example
from rlvr_jax.envs.learned_rewards import RewardModelTask
from rlvr_jax.envs.task import Task, host_rewards
from rlvr_jax.model import sharding
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.parts import build, learned_rewards
from rlvr_jax.program.runtime import resume_settings
from rlvr_jax.program.stages import dispatch
from rlvr_jax.types import FINISH_EOS, Rollout


class ZeroTask(Task):
    name = "zero"

    def score(self, rollout, examples_N):
        return {"correct": np.zeros(rollout.tokens_NT.shape[0], np.float32)}


def _digits(rng, lo, hi):
    return "".join(map(str, rng.integers(0, 10, rng.integers(lo, hi))))


@pytest.fixture(scope="module")
def rm_run(tmp_path_factory):
    """A 20-step reward-model run on pairs that prefer 1-2 digit answers to 5-7 digit ones."""
    root = tmp_path_factory.mktemp("rm")
    rng = np.random.default_rng(0)
    rows = [
        json.dumps(
            {"prompt": f"{q}+{q}", "chosen": _digits(rng, 1, 3), "rejected": _digits(rng, 5, 8)}
        )
        for q in rng.integers(0, 10, 200)
    ]
    rows.insert(3, json.dumps({"prompt": "1+1", "chosen": "2"}))  # line 4: no "rejected"
    (root / "prefs.jsonl").write_text("\n".join(rows) + "\n")
    c = reward_model_tiny.get_config()
    c.rm.path = str(root / "prefs.jsonl")
    c.rm.buckets = (16,)
    c.rm.batch_size = 16
    c.rm.num_eval = 32
    c.train.steps = 20
    c.train.use_tensorboard = False
    lines = []
    workdir = root / "run"
    result = dispatch.run(settings_lib.settings_from_config(c), workdir, log=lines.append)
    return c, workdir, result, lines


def test_the_stage_learns_the_preference_and_names_bad_rows(rm_run):
    _, _, result, lines = rm_run
    assert any("missing_field: 1 (lines 4)" in line for line in lines), lines
    assert result["eval_before"]["eval/accuracy"] == 0.0  # a zero head ties every pair
    assert result["eval_after"]["eval/accuracy"] > 0.8, result
    assert result["eval_after"]["eval/num_prompts"] == 32
    assert result["loss_last"] < result["loss_first"]


def test_an_rl_task_scores_with_the_trained_reward_model(rm_run):
    c, workdir, _, _ = rm_run
    c = c.copy_and_resolve_references()
    c.train.stage = "rl"
    c.reward.rm_path = str(workdir)
    s = settings_lib.settings_from_config(c)
    tok, policy, cfg, s = build.policy_and_settings(s)
    mesh = sharding.make_mesh(s.mesh)
    task = learned_rewards.wrap_task(ZeroTask(), s, tok, policy, cfg, mesh, log=lambda _: None)
    assert isinstance(task, RewardModelTask)
    assert task.params.head.w_D.sharding.mesh == mesh
    prompt = tok.encode("3+3=")
    responses = [tok.encode(t) + [tok.eos_ids[0]] for t in ("6", "12", "8372615", "555555")]
    T = 10
    tokens = np.full((4, T), tok.pad_id, np.int32)
    for i, r in enumerate(responses):
        tokens[i, : len(r)] = r
    rollout = Rollout(
        prompt_NP=jnp.asarray([prompt] * 4, jnp.int32),
        prompt_lengths_N=jnp.full((4,), len(prompt), jnp.int32),
        tokens_NT=jnp.asarray(tokens),
        logp_NT=jnp.zeros((4, T)),
        mask_NT=jnp.asarray(tokens != tok.pad_id),
        injected_NT=jnp.zeros((4, T), bool),
        lengths_N=jnp.asarray([len(r) for r in responses], jnp.int32),
        finish_N=jnp.full((4,), FINISH_EOS, jnp.int32),
    )
    examples = [Example("q", "3+3", "6", "test")] * 4
    rewards, parts = host_rewards(task, rollout, examples, s.reward, G=4)
    assert min(parts["preference"][:2]) > max(parts["preference"][2:]), parts
    np.testing.assert_allclose(rewards, parts["preference"] * s.reward.rm_weight, rtol=1e-6)
    # A workdir that is not a reward-model run is refused by name.
    c.reward.rm_path = str(workdir.parent)
    bad = settings_lib.settings_from_config(c)
    with pytest.raises(ConfigError, match="not a run's workdir"):
        learned_rewards.wrap_task(ZeroTask(), bad, tok, policy, cfg, mesh)


def test_a_checkpoint_that_predates_the_new_fields_resumes_at_their_defaults():
    s = settings_lib.settings_from_config(tiny.get_config())
    saved = settings_lib.plain_settings(s)
    del saved["rm"]
    for name in ("rm_path", "rm_weight", "judge_model", "judge_template"):
        del saved["reward"][name]
    assert resume_settings.resume_differences(saved, s) == []
    c = tiny.get_config()
    c.reward.rm_weight = 2.0
    changed = resume_settings.resume_differences(saved, settings_lib.settings_from_config(c))
    assert changed == ["reward.rm_weight: '<absent>' in the checkpoint, 2.0 now"]
