"""Learned reward parts for a run: the reward model read from its run, the judge's weights.

`restore_reward_model` reads the newest checkpoint of a reward-model run (`train.stage="rm"`);
`wrap_task` wraps the verifier's task with the parts `reward.rm_path` and `reward.judge_model`
ask for (`envs.learned_rewards`), their weights placed on the policy's mesh with the policy's
sharding table, so that scoring a rollout is one jitted program on the devices that hold it.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import jax
import jax.numpy as jnp

from rlvr_jax.config_types import ConfigError, NotFoundError
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.learned_rewards import with_learned_rewards
from rlvr_jax.envs.task import Task
from rlvr_jax.model import sharding
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.heads import ScalarHead
from rlvr_jax.model.transformer import Params, init_params
from rlvr_jax.program.parts import build
from rlvr_jax.program.runtime import checkpoint as ckpt_lib
from rlvr_jax.program.settings import Settings, load_settings
from rlvr_jax.rewards import reward_model as rm_lib
from rlvr_jax.rl import state as state_lib
from rlvr_jax.rl.sharding_plan import param_shardings

# Text whose encoding must agree between the policy's and the reward model's tokenizers.
_PROBE = "0123456789+-*= abcdefghijklmnopqrstuvwxyz"


def rm_train_state(params: rm_lib.RewardModelParams, settings: Settings) -> state_lib.TrainState:
    """The reward-model stage's train state: the run skeleton's `TrainState`, no reference."""
    optimizer = state_lib.make_optimizer(settings.optim)
    return state_lib.init_train_state(
        params, optimizer, jax.random.key(settings.train.seed + 1), use_reference=False
    )


def restore_reward_model(
    workdir: str | os.PathLike,
) -> tuple[rm_lib.RewardModelParams, ModelConfig, Tokenizer, int]:
    """The reward model of a `train.stage="rm"` run's newest readable checkpoint.

    Returns:
      (params, architecture, tokenizer, the checkpoint's step).

    Raises:
      ConfigError: `workdir` is not a reward-model run's workdir.
      NotFoundError: it holds no checkpoint.
    """
    workdir = Path(workdir)
    if not (workdir / "settings.json").is_file():
        raise ConfigError(f"reward.rm_path={str(workdir)!r} is not a run's workdir")
    settings = load_settings(workdir)
    if settings.train.stage != "rm":
        raise ConfigError(
            f"reward.rm_path={str(workdir)!r} is a train.stage={settings.train.stage!r} run, not "
            "a reward model (train.stage='rm')"
        )
    tok = build.build_tokenizer(settings.model)
    cfg = build.policy_config(settings.model, tok)

    def init():
        params = rm_lib.init_reward_model(init_params(jax.random.key(0), cfg))
        return rm_train_state(params, settings)

    ckpt = ckpt_lib.Checkpointer(workdir / build.CHECKPOINTS, every_steps=0, read_only=True)
    try:
        if ckpt.latest_step() is None:
            raise NotFoundError(f"{workdir / build.CHECKPOINTS} holds no checkpoint")
        state, _ = ckpt.restore(jax.eval_shape(init))
        step = ckpt.restored_step
    finally:
        ckpt.close()
    return state.params, cfg, tok, step


def _encode(tok: Tokenizer, text: str) -> list[int] | None:
    try:
        return tok.encode(text)
    except (ValueError, KeyError):  # a character tokenizer refuses text outside its alphabet
        return None


def _check_same_tokenizer(a: Tokenizer, b: Tokenizer, what: str) -> None:
    same = (a.vocab_size, tuple(a.eos_ids), a.pad_id) == (b.vocab_size, tuple(b.eos_ids), b.pad_id)
    if not same or _encode(a, _PROBE) != _encode(b, _PROBE):
        raise ConfigError(f"{what} does not use this run's tokenizer")


def place_reward_model(
    params: rm_lib.RewardModelParams, cfg: ModelConfig, mesh: jax.sharding.Mesh
) -> rm_lib.RewardModelParams:
    """The reward model on `mesh`, its decoder split as the policy's is."""
    rep = sharding.replicated(mesh)
    shardings = rm_lib.RewardModelParams(
        param_shardings(cfg, mesh, params.backbone), ScalarHead(rep, rep)
    )
    return sharding.place(params, shardings)


def _judge(
    s: Settings, tok: Tokenizer, policy: Params, model_cfg: ModelConfig, mesh
) -> tuple[Params, ModelConfig, Tokenizer]:
    if s.reward.judge_model == "policy":
        # A copy: the policy's own buffers are donated to the first update.
        params, cfg = jax.tree.map(jnp.copy, policy), model_cfg
    else:
        model = dataclasses.replace(s.model, source=s.reward.judge_model)
        params, cfg = build.load_policy(model, tok, s.train.seed)
    return sharding.place(params, param_shardings(cfg, mesh, params)), cfg, tok


def wrap_task(
    task: Task,
    s: Settings,
    tok: Tokenizer,
    policy: Params,
    model_cfg: ModelConfig,
    mesh: jax.sharding.Mesh,
    log=print,
) -> Task:
    """`task` with the learned parts the settings ask for, or `task` itself when none.

    Raises:
      ConfigError: a reward model or judge that does not fit this run (another tokenizer).
    """
    reward_model = judge = None
    if s.reward.rm_path:
        params, cfg, rm_tok, step = restore_reward_model(s.reward.rm_path)
        _check_same_tokenizer(tok, rm_tok, f"the reward model in {s.reward.rm_path!r}")
        reward_model = (place_reward_model(params, cfg, mesh), cfg)
        log(f"reward part 'preference': the reward model of {s.reward.rm_path} at step {step}")
    if s.reward.judge_model:
        judge = _judge(s, tok, policy, model_cfg, mesh)
        log(f"reward part 'judge': {s.reward.judge_model} ({s.reward.judge_verdict})")
    if reward_model is None and judge is None:
        return task
    return with_learned_rewards(task, s.reward, reward_model, judge, s.eval.batch_prompts)
