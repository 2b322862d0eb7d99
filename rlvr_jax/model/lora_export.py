"""LoRA adapters out (and back in): merged Hugging Face weights, or a PEFT adapter directory.

Host code (numpy, files). Two forms:

* `save_merged_hf`: the base with every adapter merged (W + alpha / r * A @ B; an int8 base is
  dequantised first), written by `hf.save_hf`: a plain checkpoint `transformers` and vLLM load.
* `save_peft_adapter`: adapter_config.json and adapter_model.safetensors as PEFT writes them, for
  `peft.PeftModel.from_pretrained(base_model, directory)` (or vLLM's LoRA support) over the
  base checkpoint the run started from. Tensor names are
  `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight` (and lora_B, o_proj,
  mlp.gate_proj, ...); lora_A is (r, in) and lora_B (out, r), torch Linear's layout. Ours flatten
  to (in, r) and (r, out) as `hf.py` flattens the weights ((D, H, Dh) -> (D, H * Dh), index
  h * Dh + d; o's (H, Dh) input the same way), then transpose. The safetensors checkpoints carry
  no RoPE permutation (only GGUF does), so none is applied.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.model import hf
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.lora import IN_DIMS, TARGETS, LoraConfig, LoraParams, LowRank, merge_lora
from rlvr_jax.model.transformer import Params, param_shapes

HF_MODULES = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
_PREFIX = "base_model.model.model.layers"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def save_merged_hf(
    params: Params,
    lora: LoraParams | None,
    cfg: ModelConfig,
    directory: str | os.PathLike,
    **kwargs: Any,
) -> Path:
    """Writes the merged model as a Hugging Face checkpoint; `kwargs` go to `hf.save_hf`
    (tokenizer, dtype, max_shard_bytes, overwrite). Returns the directory."""
    return hf.save_hf(merge_lora(params, lora), cfg, directory, **kwargs)


def _check(lora: LoraParams, lora_cfg: LoraConfig) -> None:
    present = tuple(n for n in TARGETS if getattr(lora, n) is not None)
    if set(present) != set(lora_cfg.targets) or not math.isclose(lora.scale, lora_cfg.scale):
        raise ValueError(
            f"adapters (targets {present}, scale {lora.scale}) do not match the LoraConfig "
            f"(targets {lora_cfg.targets}, scale {lora_cfg.scale})"
        )


def peft_tensors(lora: LoraParams, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """The adapters under PEFT's names and layouts, f32."""
    host = jax.device_get(lora)
    out = {}
    for name in TARGETS:
        ad = getattr(host, name)
        if ad is None:
            continue
        r = ad.a.shape[-1]
        for i in range(cfg.num_layers):
            a_in_r = np.asarray(ad.a[i], np.float32).reshape(-1, r)
            b_r_out = np.asarray(ad.b[i], np.float32).reshape(r, -1)
            key = f"{_PREFIX}.{i}.{HF_MODULES[name]}"
            out[f"{key}.lora_A.weight"] = np.ascontiguousarray(a_in_r.T)
            out[f"{key}.lora_B.weight"] = np.ascontiguousarray(b_r_out.T)
    return out


def save_peft_adapter(
    lora: LoraParams,
    lora_cfg: LoraConfig,
    cfg: ModelConfig,
    directory: str | os.PathLike,
    base_model_name_or_path: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Writes a PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors).

    Args:
      lora: the adapters (`init_lora`'s tree, trained).
      lora_cfg: their settings; must match `lora` (targets, alpha / rank).
      cfg: the base architecture.
      directory: absent or empty unless `overwrite`; its parent is created if needed.
      base_model_name_or_path: recorded in the config for PEFT's `from_pretrained(adapter)`.
      overwrite: write into a directory that holds files (same-named files are replaced).

    Returns:
      `directory`, as an absolute path.

    Raises:
      ValueError: `lora` and `lora_cfg` disagree.
      FileExistsError: as `hf.check_output_dir`.
    """
    _check(lora, lora_cfg)
    directory = hf.check_output_dir(directory, overwrite)
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": lora_cfg.rank,
        "lora_alpha": lora_cfg.alpha,
        "lora_dropout": 0.0,
        "target_modules": [HF_MODULES[n].split(".")[-1] for n in TARGETS if n in lora_cfg.targets],
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "layers_to_transform": None,
    }
    hf.write_safetensors(directory / ADAPTER_WEIGHTS, peft_tensors(lora, cfg))
    with open(directory / ADAPTER_CONFIG, "w") as f:
        json.dump(config, f, indent=2)
    return directory


def load_peft_adapter(
    directory: str | os.PathLike, cfg: ModelConfig
) -> tuple[LoraParams, LoraConfig]:
    """Reads a PEFT LoRA adapter directory of a `cfg` model back into (adapters, settings).

    Raises:
      hf.CheckpointError: a setting this model does not support (dropout aside, which only
        matters in training: rsLoRA, DoRA, biases, per-layer ranks, other modules), or a
        missing or misshapen tensor.
    """
    directory = Path(directory)
    with open(directory / ADAPTER_CONFIG) as f:
        config = json.load(f)
    unsupported = {
        "peft_type": config.get("peft_type") != "LORA",
        "use_rslora": config.get("use_rslora", False),
        "use_dora": config.get("use_dora", False),
        "bias": config.get("bias", "none") != "none",
        "fan_in_fan_out": config.get("fan_in_fan_out", False),
        "rank_pattern": bool(config.get("rank_pattern")),
        "alpha_pattern": bool(config.get("alpha_pattern")),
        "layers_to_transform": config.get("layers_to_transform") is not None,
        "modules_to_save": bool(config.get("modules_to_save")),
    }
    bad = [k for k, v in unsupported.items() if v]
    if bad:
        raise hf.CheckpointError(
            f"{directory / ADAPTER_CONFIG}: {bad[0]}={config.get(bad[0])!r} is not supported"
        )
    by_hf = {HF_MODULES[n].split(".")[-1]: n for n in TARGETS}
    modules = config["target_modules"]
    if isinstance(modules, str) or any(m not in by_hf for m in modules):
        raise hf.CheckpointError(
            f"{directory / ADAPTER_CONFIG}: target_modules={modules!r}; supported: {list(by_hf)}"
        )
    lora_cfg = LoraConfig(
        rank=config["r"], alpha=config["lora_alpha"], targets=tuple(by_hf[m] for m in modules)
    )
    tensors = hf.read_safetensors(directory / ADAPTER_WEIGHTS)
    shapes = param_shapes(cfg).layers
    r = lora_cfg.rank
    adapters = {}
    for name in lora_cfg.targets:
        w_shape = getattr(shapes, name).shape[1:]
        ins, outs = w_shape[: IN_DIMS[name]], w_shape[IN_DIMS[name] :]
        a_L, b_L = [], []
        for i in range(cfg.num_layers):
            key = f"{_PREFIX}.{i}.{HF_MODULES[name]}"
            wants = (("lora_A", (r, math.prod(ins))), ("lora_B", (math.prod(outs), r)))
            for part, want in wants:
                t = tensors.get(f"{key}.{part}.weight")
                if t is None or t.shape != want:
                    got = "missing" if t is None else f"shape {t.shape}"
                    raise hf.CheckpointError(
                        f"{directory / ADAPTER_WEIGHTS}: {key}.{part}.weight is {got}, "
                        f"expected shape {want}"
                    )
            a_L.append(np.asarray(tensors[f"{key}.lora_A.weight"], np.float32).T.reshape(*ins, r))
            b_L.append(np.asarray(tensors[f"{key}.lora_B.weight"], np.float32).T.reshape(r, *outs))
        adapters[name] = LowRank(a=jnp.asarray(np.stack(a_L)), b=jnp.asarray(np.stack(b_L)))
    return LoraParams(scale=lora_cfg.scale, **adapters), lora_cfg
