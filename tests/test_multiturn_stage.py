"""The RL step with a multi-turn task (`reward.verifier="math_tool"`): episodes instead of one
decode, then the host path's verification and update, on a tiny random model."""

from __future__ import annotations

import dataclasses
import string

import jax
import numpy as np
import pytest

from configs import tiny
from rlvr_jax.config_types import ConfigError
from rlvr_jax.data import curriculum as curriculum_lib
from rlvr_jax.data import templates
from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.environment import StepResult, ToolResponseFormat
from rlvr_jax.envs.tool_math import MathToolEnv, MathToolTask
from rlvr_jax.model import sharding
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.parts import build
from rlvr_jax.program.stages import rl_stage
from rlvr_jax.rl import sharding_plan
from rlvr_jax.rl import state as state_lib
from tests.envs.fixtures import QWEN_STYLE

ALPHABET = string.printable
STOPS = "!abcdefgh"  # common enough that a random model's rows stop on them


class EveryStopIsACall(MathToolEnv):
    """Every turn that ends on the stop token is answered with an observation, so a random
    model's episodes have several turns."""

    def step(self, action_text: str) -> StepResult:
        if action_text[-1:] in STOPS:
            return StepResult("ok", False, {"correct": 0.0}, tool_calls=1)
        return super().step(action_text)


class Task(MathToolTask):
    def environment(self):
        return EveryStopIsACall(self.tok, verify=lambda t, g: 0.0, system=self.system)


def _settings(**reward):
    c = tiny.get_config()
    c.model.tokenizer = "chars:" + ALPHABET
    c.data.buckets = (128,)
    c.reward.verifier = "math_tool"
    c.reward.format_weight = 0.0
    c.reward.max_turns = 3
    c.reward.turn_tokens = 4
    c.reward.workers = 1
    for k, v in reward.items():
        setattr(c.reward, k, v)
    c.rl.group_size = 2
    c.rl.sampler.max_new_tokens = 16
    c.train.batch_prompts = 4
    return settings_lib.settings_from_config(c)


@pytest.mark.slow
def test_a_multi_turn_step_trains_on_episodes():
    s = _settings(overlap_tools=True, tool_system="Tools.")
    _, params, model_cfg, s = build.policy_and_settings(s)
    tok = Tokenizer.from_characters(ALPHABET, chat_template=QWEN_STYLE)
    examples = [Example(f"q/{i}", f"{i}+1?", str(i + 1), "test") for i in range(8)]
    encoded = templates.EncodedPrompts(
        [tok.encode(ex.prompt_text) for ex in examples], examples, 0, (), 128, 5
    )
    optimizer = state_lib.make_optimizer(s.optim)
    state = state_lib.init_train_state(params, optimizer, jax.random.key(1), use_reference=False)
    plan = sharding_plan.plan_step(state, model_cfg, sharding.make_mesh(s.mesh), 8)
    state = sharding.place(state, plan.state)
    sampler = curriculum_lib.EpochSampler(examples, shuffle=True)
    with Task(tok, s.reward) as task:
        assert task.overlap_tools and task.system == "Tools."
        task.stop_sequences = tuple((i,) for i in tok.encode(STOPS))
        task.response_format = ToolResponseFormat("[", "]")  # room for turns in 16 tokens
        step, _ = rl_stage.build_rl_step(s, model_cfg, task, sampler, encoded, plan, tok.pad_id)
        data = sampler.init(0)
        for _ in range(2):
            state, data, metrics = step(state, data)
    assert int(jax.device_get(state.step)) == 2
    for key in (
        "episode/turns",
        "episode/tool_calls",
        "episode/decode_seconds",
        "episode/truncated_tokens",
        "reward/mean",
        "loss/pg",
    ):
        assert key in metrics, key
    assert np.isfinite(metrics["loss/pg"])
    assert metrics["episode/rounds"] >= 1
    assert metrics["episode/turns"] > 1
    assert metrics["episode/tool_calls"] > 0 and metrics["episode/observation_tokens"] > 0
    # One verified trajectory per episode; its sampled tokens leave the observations out.
    assert metrics["useful/verified"] == 8
    observed = 8 * metrics["episode/observation_tokens"]
    assert metrics["useful/tokens"] == pytest.approx(metrics["rollout/tokens"] - observed)
    assert metrics["useful/trajectories"] in (0, 2, 4, 6, 8)
    assert metrics["useful/fraction"] == metrics["useful/trajectories"] / 8
    # Partial rollouts would cut episodes across steps: refused.
    loss = dataclasses.replace(s.rl.loss, tis_cap=2.0)
    partial = dataclasses.replace(s, rl=dataclasses.replace(s.rl, partial_budget=2, loss=loss))
    with Task(tok, s.reward) as task, pytest.raises(ConfigError, match="partial_budget"):
        rl_stage.build_rl_step(partial, model_cfg, task, sampler, encoded, plan, tok.pad_id)
