"""PPO through the RL stage: a separate critic trains beside the policy, is checkpointed with
it, and a killed run resumes to the same numbers; eval and export read the run."""

import json
from pathlib import Path

import numpy as np
import pytest

from configs import tiny
from rlvr_jax.config_types import ConfigError
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.parts import build
from rlvr_jax.program.stages import rl_stage

SKIP = ("time/", "throughput/", "useful/per_hour", "verifier/")


def _config(steps: int):
    c = tiny.get_config()
    c.data.num_train = 64
    c.data.num_eval = 8
    c.eval.batch_prompts = 8
    c.train.batch_prompts = 4
    c.train.steps = steps
    c.train.checkpoint_every = 1
    c.train.use_tensorboard = False
    c.rl.advantage.estimator = "gae"
    c.rl.advantage.std_scaling = "batch"
    c.rl.critic.kind = "model"
    c.rl.critic.learning_rate = 1e-3
    c.rl.critic.warmup_steps = 1
    return c


def _run(config, workdir: Path) -> list[dict]:
    rl_stage.run(settings_lib.settings_from_config(config), workdir, log=lambda _: None)
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "reward/mean" in r]


def test_ppo_run_trains_the_critic_and_resumes_to_the_same_numbers(tmp_path):
    straight = _run(_config(3), tmp_path / "straight")
    assert [r["step"] for r in straight] == [1, 2, 3]
    assert [r["value/warmup"] for r in straight] == [1.0, 0.0, 0.0]
    for r in straight:  # a batch whose rewards are all 0 has nothing for the critic to fit
        assert np.isfinite(r["loss/value"]) and (r["value/grad_norm"] > 0) == (r["reward/std"] > 0)
    assert any(r["value/grad_norm"] > 0 for r in straight)
    _run(_config(1), tmp_path / "resumed")
    resumed = _run(_config(3), tmp_path / "resumed")
    assert [r["step"] for r in resumed] == [1, 2, 3]
    for x, y in zip(straight, resumed, strict=True):
        keys = {k for k, v in x.items() if not k.startswith(SKIP) and not isinstance(v, str)}
        assert {"loss/value", "value/explained_variance", "grad_norm"} <= keys
        for k in sorted(keys & set(y)):
            np.testing.assert_allclose(x[k], y[k], rtol=2e-4, atol=1e-6, err_msg=k)
    # eval and export read the policy of a run whose checkpoints also hold the critic.
    params, *_, step = build.restore_policy(tmp_path / "resumed")
    assert step == 3 and params.layers.q.shape[0] == 2

    # Another run's critic can start from this run's trained policy (rl.critic.init=<workdir>).
    config = _config(1)
    config.rl.critic.init = str(tmp_path / "resumed")
    s = settings_lib.settings_from_config(config)
    fresh, _ = build.load_policy(s.model, build.build_tokenizer(s.model), s.train.seed)
    critic = build.critic_state(s, fresh).params
    assert critic.backbone.lm_head is None
    np.testing.assert_array_equal(critic.backbone.layers.q, params.layers.q)
    assert not np.array_equal(critic.backbone.layers.q, fresh.layers.q)
    config.rl.critic.init = str(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="neither 'policy' nor a run's workdir"):
        build.critic_state(settings_lib.settings_from_config(config), fresh)
    config.rl.critic.init = str(tmp_path / "resumed")
    config.model.param_dtype = "bfloat16"  # weights the checkpoint's do not fit
    other = settings_lib.settings_from_config(config)
    half, _ = build.load_policy(other.model, build.build_tokenizer(other.model), 0)
    with pytest.raises(ConfigError, match="do not have this policy's architecture"):
        build.critic_state(other, half)
