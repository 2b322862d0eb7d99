"""The policy of a run as a Hugging Face directory that `transformers` and vLLM load.

Command:
  python -m rlvr_jax.export --workdir=runs/tiny --out=/tmp/tiny_hf [--step=N] [--dtype=bfloat16]

It reads the run's settings (`<workdir>/settings.json`, written by `train.run` and `sft.run`),
rebuilds the train state's layout without loading any weights (from the model preset or the
source's config.json), restores the latest (or the named) checkpoint into it, and writes
config.json, safetensors and the tokenizer files (`model.hf.save_hf`).

Also the policy helpers the stages and `rlvr_jax.eval` share: `load_policy` (weights from a
source) and `restore_policy` (weights from a run's checkpoint).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax

from rlvr_jax import train
from rlvr_jax.config_types import ConfigError
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.model import config as config_lib
from rlvr_jax.model import hf, loading
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import Params, init_params
from rlvr_jax.program import checkpoint as ckpt_lib
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.rl import state as state_lib

CHECKPOINTS = "checkpoints"


def model_overrides(model: settings_lib.ModelSettings, tok: Tokenizer) -> dict[str, Any]:
    """The `ModelConfig` fields the settings set on top of the source's (as `train.run` does):
    numerics, and for a random model with a character tokenizer, a vocabulary that fits it."""
    out: dict[str, Any] = dict(dtype=model.dtype, param_dtype=model.param_dtype, remat=model.remat)
    if model.source.startswith("random:") and model.tokenizer.startswith("chars:"):
        out["vocab_size"] = max(tok.vocab_size, 8)
    return out


def _check_vocab(tok: Tokenizer, cfg: ModelConfig) -> None:
    if tok.vocab_size > cfg.vocab_size:
        raise ConfigError(
            f"tokenizer has {tok.vocab_size} ids but the model's vocabulary is {cfg.vocab_size}"
        )


def load_policy(
    model: settings_lib.ModelSettings, tok: Tokenizer, seed: int
) -> tuple[Params, ModelConfig]:
    """Weights and architecture from `model.source`, with the settings' overrides.

    Raises:
      ConfigError: when the tokenizer has more ids than the model's vocabulary.
    """
    params, cfg = loading.load_model(model.source, seed=seed, **model_overrides(model, tok))
    _check_vocab(tok, cfg)
    return params, cfg


def policy_config(model: settings_lib.ModelSettings, tok: Tokenizer) -> ModelConfig:
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


def restore_policy(
    workdir: str | os.PathLike, step: int | None = None
) -> tuple[Params, ModelConfig, Tokenizer, settings_lib.Settings, int]:
    """The policy parameters of a run's checkpoint.

    Args:
      workdir: the run's workdir (settings.json and checkpoints/).
      step: which checkpoint; None for the latest.

    Returns:
      (params, model config, tokenizer, the run's settings, the checkpoint's step).

    Raises:
      FileNotFoundError: for a workdir without settings or without a checkpoint.
    """
    workdir = Path(workdir)
    settings = settings_lib.load_settings(workdir)
    tok = train.build_tokenizer(settings.model)
    cfg = policy_config(settings.model, tok)
    ckpt = ckpt_lib.Checkpointer(workdir / CHECKPOINTS, every_steps=0, read_only=True)
    try:
        if ckpt.latest_step() is None:
            raise FileNotFoundError(f"{workdir / CHECKPOINTS} holds no checkpoint")
        step = ckpt.latest_step() if step is None else step
        meta = ckpt.read_meta(step)
        optimizer = state_lib.make_optimizer(settings.optim)
        # The layout only: no parameter or optimizer memory is allocated before the restore.
        target = jax.eval_shape(
            lambda: state_lib.init_train_state(
                init_params(jax.random.key(0), cfg),
                optimizer,
                jax.random.key(0),
                use_reference=bool(meta["ref_saved"]),
            )
        )
        state, _ = ckpt.restore(target, step)
    finally:
        ckpt.close()
    return state.params, cfg, tok, settings, step


def export(
    workdir: str | os.PathLike,
    out: str | os.PathLike,
    step: int | None = None,
    dtype: str | None = None,
) -> Path:
    """Writes a run's policy (latest or `step` checkpoint) as a Hugging Face directory.

    Args:
      workdir: the run's workdir.
      out: the directory to write (created if needed).
      step: which checkpoint; None for the latest.
      dtype: storage dtype ("float32", "bfloat16"); default the model's parameter dtype.

    Returns:
      The directory.
    """
    params, cfg, tok, _, _ = restore_policy(workdir, step)
    return hf.save_hf(params, cfg, out, tokenizer=tok, dtype=dtype)


def main(argv: list[str]) -> None:
    from absl import flags, logging

    del argv
    logging.set_verbosity(logging.WARNING)  # orbax logs every restore stage at INFO
    f = flags.FLAGS
    params, cfg, tok, _, step = restore_policy(f.workdir, None if f.step < 0 else f.step)
    out = hf.save_hf(params, cfg, f.out, tokenizer=tok, dtype=f.dtype or None)
    n = sum(x.size for x in jax.tree.leaves(params))
    print(f"wrote {out}: step {step} of {f.workdir}, {cfg.model_type}, {n} parameters")


if __name__ == "__main__":
    from absl import app, flags

    flags.DEFINE_string("workdir", None, "The run's workdir.", required=True)
    flags.DEFINE_string("out", None, "The Hugging Face directory to write.", required=True)
    flags.DEFINE_integer("step", -1, "Checkpoint step (default: the latest).")
    flags.DEFINE_string("dtype", "", "Storage dtype: float32 or bfloat16 (default: the model's).")
    app.run(main)
