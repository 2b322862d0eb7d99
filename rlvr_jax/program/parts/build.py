"""The pieces a stage or a command builds from the settings: tokenizer, policy, examples.

`load_policy` loads weights from `model.source`; `critic_state` builds PPO's value model;
`restore_policy` rebuilds a run's train state layout (with its value model, if it has one)
without allocating it and restores the newest readable (or a named) checkpoint into it, so
that eval and export read a run exactly as it trained.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import jax

from rlvr_jax.config_types import ConfigError, NotFoundError
from rlvr_jax.data import datasets, modes
from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer, load_tokenizer
from rlvr_jax.model import config as config_lib
from rlvr_jax.model import hf, loading
from rlvr_jax.model import lora as lora_lib
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import Params, init_params
from rlvr_jax.program.runtime import checkpoint as ckpt_lib
from rlvr_jax.program.settings import DataSettings, ModelSettings, Settings, load_settings
from rlvr_jax.rl import state as state_lib
from rlvr_jax.rl import value as value_lib
from rlvr_jax.sampling.config import SamplerConfig

CHECKPOINTS = "checkpoints"


def build_tokenizer(model: ModelSettings) -> Tokenizer:
    """The tokenizer named by the settings (a character one for "chars:...")."""
    if model.tokenizer.startswith("chars:"):
        return Tokenizer.from_characters(model.tokenizer.removeprefix("chars:"))
    if model.tokenizer:
        return load_tokenizer(model.tokenizer)
    tok = load_tokenizer(model.source)
    if tok is None:
        raise ConfigError(
            f"model.source={model.source!r} has no tokenizer; set model.tokenizer "
            "(e.g. 'chars:0123456789+-*=')"
        )
    return tok


def sampler_config(settings: Settings, tok: Tokenizer) -> SamplerConfig:
    """`rl.sampler` with the tokenizer's end and pad ids where the config sets none."""
    cfg = settings.rl.sampler
    if not cfg.eos_ids:
        cfg = dataclasses.replace(cfg, eos_ids=tok.eos_ids, pad_id=tok.pad_id)
    return cfg


def with_tokenizer_ids(settings: Settings, tok: Tokenizer) -> Settings:
    """The settings with `rl.sampler`'s end and pad ids filled from the tokenizer."""
    rl = dataclasses.replace(settings.rl, sampler=sampler_config(settings, tok))
    return dataclasses.replace(settings, rl=rl)


def policy_and_settings(
    settings: Settings,
) -> tuple[Tokenizer, Params, ModelConfig, Settings]:
    """What every stage starts from: the tokenizer, the policy's weights and architecture, and
    the settings with the tokenizer's end and pad ids filled in."""
    tok = build_tokenizer(settings.model)
    params, model_cfg = load_policy(settings.model, tok, settings.train.seed)
    return tok, params, model_cfg, with_tokenizer_ids(settings, tok)


def model_overrides(model: ModelSettings, tok: Tokenizer) -> dict[str, Any]:
    """The `ModelConfig` fields the settings set on top of the source's: numerics, and for a
    random model with a character tokenizer, a vocabulary that fits it."""
    out: dict[str, Any] = dict(
        dtype=model.dtype,
        param_dtype=model.param_dtype,
        remat=model.remat,
        attention=model.attention,
        attention_block=model.attention_block,
        moe_dispatch=model.moe_dispatch,
    )
    if model.source.startswith("random:") and model.tokenizer.startswith("chars:"):
        out["vocab_size"] = max(tok.vocab_size, 8)
    return out


def _check_vocab(tok: Tokenizer, cfg: ModelConfig) -> None:
    if tok.vocab_size > cfg.vocab_size:
        raise ConfigError(
            f"tokenizer has {tok.vocab_size} ids but the model's vocabulary is {cfg.vocab_size}"
        )


def load_policy(model: ModelSettings, tok: Tokenizer, seed: int) -> tuple[Params, ModelConfig]:
    """Weights and architecture from `model.source`, with the settings' overrides.

    Raises:
      ConfigError: when the tokenizer has more ids than the model's vocabulary.
    """
    params, cfg = loading.load_model(model.source, seed=seed, **model_overrides(model, tok))
    _check_vocab(tok, cfg)
    return with_adapters(params, cfg, model, seed), cfg


def with_adapters(params: Params, cfg: ModelConfig, model: ModelSettings, seed: int) -> Params:
    """`params` with fresh LoRA adapters when `model.lora` is on (the base int8 with
    `model.lora.base="int8"`); unchanged otherwise. Fresh adapters leave the model's outputs as
    they were (B = 0)."""
    if not model.lora.enabled:
        return params
    if model.lora.base == "int8":
        params = lora_lib.quantize_int8(params)
    # A key of its own, so the adapters do not depend on how the base was initialised.
    key = jax.random.fold_in(jax.random.key(seed), 0x10A)
    return dataclasses.replace(params, lora=lora_lib.init_lora(key, cfg, model.lora.config()))


def base_source(model: ModelSettings) -> str | None:
    """Where a checkpoint's frozen weights (the KL reference, a LoRA policy's base) are rebuilt
    from, so that they are not written with it; None for a random initialisation."""
    return None if model.source.startswith("random:") else model.source


def policy_config(model: ModelSettings, tok: Tokenizer) -> ModelConfig:
    """The architecture `load_policy` would give, read without loading the weights where the
    source allows (presets and Hugging Face directories; GGUF files are read whole)."""
    overrides = model_overrides(model, tok)
    source = model.source
    if source.startswith("random:"):
        name = source.removeprefix("random:")
        if name not in config_lib.PRESETS:
            raise ConfigError(f"model.source={source!r}: unknown preset {name!r}")
        cfg = config_lib.PRESETS[name].replace(**overrides)
    elif source == loading.EMBEDDED or source.endswith(".gguf"):
        cfg = loading.load_model(source, **overrides)[1]
    else:
        cfg = hf.load_config(hf.resolve_checkpoint(source), **overrides)
    _check_vocab(tok, cfg)
    return cfg


def critic_state(settings: Settings, params: Params) -> state_lib.CriticState | None:
    """The value model's initial state for `rl.critic` (None without one): a zero head, and for
    a separate critic a copy of `params` or, with `rl.critic.init` a workdir, the policy
    weights of that run's newest checkpoint (same architecture as this run's policy)."""
    critic = settings.rl.critic
    if not critic.enabled:
        return None
    backbone = None
    if critic.kind == "model" and critic.init != "policy":
        if not Path(critic.init, "settings.json").is_file():
            raise ConfigError(
                f"rl.critic.init={critic.init!r}: neither 'policy' nor a run's workdir (no "
                "settings.json there)"
            )
        # A LoRA run's policy: its adapters merged into plain weights.
        backbone = lora_lib.merge_lora(restore_policy(critic.init)[0])
        shapes = lambda p: jax.tree.map(lambda x: (x.shape, x.dtype), p)  # noqa: E731
        if shapes(dataclasses.replace(backbone, lm_head=None)) != shapes(
            dataclasses.replace(params, lm_head=None)
        ):
            raise ConfigError(
                f"rl.critic.init={critic.init!r}: that run's weights do not have this policy's "
                "architecture and dtypes"
            )
    return state_lib.init_critic_state(value_lib.init_critic(critic, params, backbone), critic)


def restore_policy(
    workdir: str | os.PathLike, step: int | None = None
) -> tuple[Params, ModelConfig, Tokenizer, Settings, int]:
    """The policy parameters of a run's checkpoint.

    Args:
      workdir: the run's workdir (settings.json and checkpoints/).
      step: which checkpoint; None for the newest readable one (a newer checkpoint whose files
        are damaged is skipped with a warning naming it, see `Checkpointer.restore`).

    Returns:
      (params, model config, tokenizer, the run's settings, the step of the checkpoint read).

    Raises:
      NotFoundError: for a workdir without settings or without a checkpoint.
      CheckpointError: `step` does not exist (the message lists the steps that do), or it is
        unreadable, or (with no step) every checkpoint is.
    """
    workdir = Path(workdir)
    settings = load_settings(workdir)
    if not (workdir / CHECKPOINTS).is_dir():  # said before the checkpoint library says more
        raise NotFoundError(f"{workdir / CHECKPOINTS} holds no checkpoint (it does not exist)")
    tok = build_tokenizer(settings.model)
    cfg = policy_config(settings.model, tok)
    ckpt = ckpt_lib.Checkpointer(workdir / CHECKPOINTS, every_steps=0, read_only=True)
    try:
        if ckpt.latest_step() is None:
            raise NotFoundError(f"{workdir / CHECKPOINTS} holds no checkpoint")
        optimizer = state_lib.make_optimizer(settings.optim)

        # A checkpoint of a LoRA run may hold its adapters only: the base is loaded here.
        base = None
        if settings.model.lora.enabled:
            base = load_policy(settings.model, tok, settings.train.seed)[0]

        def target(meta: dict[str, Any]) -> state_lib.TrainState:
            # The layout only: no parameter or optimizer memory is allocated before the restore
            # (but a LoRA base, loaded above). Built per checkpoint, as each records whether it
            # holds reference parameters.
            def init():
                params = init_params(jax.random.key(0), cfg) if base is None else base
                critic = None
                if meta.get("has_critic"):
                    rl = dataclasses.replace(
                        settings.rl, critic=dataclasses.replace(settings.rl.critic, init="policy")
                    )
                    critic = critic_state(dataclasses.replace(settings, rl=rl), params)
                use_ref = bool(meta["ref_saved"])
                return state_lib.init_train_state(
                    params, optimizer, jax.random.key(0), use_ref, critic
                )

            abstract = jax.eval_shape(init)
            return abstract if base is None else dataclasses.replace(abstract, params=base)

        state, _ = ckpt.restore(target, step)
        step = ckpt.restored_step
    finally:
        ckpt.close()
    return state.params, cfg, tok, settings, step


def load_examples(data: DataSettings) -> tuple[list[Example], list[Example], list[str]]:
    """Training and evaluation examples, and notes about skipped rows for the log. With
    `data.modes`, each is asked in thinking or non-thinking mode (`data.modes`)."""
    notes = []
    common = dict(
        seed=data.seed,
        level=data.levels or data.level,
        weights=data.weights,
        task_config=data.task_config,
        exclude_multiple_choice=data.exclude_multiple_choice,
        exclude_true_false=data.exclude_true_false,
    )
    total = (data.num_train or 0) + (0 if data.eval_split else data.num_eval)
    examples, report = datasets.load(
        data.name, data.path or None, data.split, num=total or None, **common
    )
    if report is not None and report.num_skipped:
        notes.append(report.summary())
    if data.eval_split:
        evals, report = datasets.load(
            data.name, data.path or None, data.eval_split, num=data.num_eval, **common
        )
        if report is not None and report.num_skipped:
            notes.append(report.summary())
        train = examples
    else:
        if data.num_eval >= len(examples):
            raise ConfigError(
                f"data.num_eval={data.num_eval} leaves no training prompts out of {len(examples)}"
            )
        train, evals = datasets.split_holdout(examples, data.num_eval, seed=data.seed)
    if data.num_train:
        train = train[: data.num_train]
    if data.modes:
        train = modes.ask_in_modes(train, data.modes, data.think_share, data.seed)
        evals = modes.ask_in_modes(evals, data.modes, data.think_share, data.seed)
    return train, evals, notes
