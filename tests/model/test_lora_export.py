"""LoRA export: a PEFT adapter directory that `peft` loads onto a `transformers` model, and merged
weights that `transformers` loads, both giving our logits; the adapter directory reads back."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import peft
import pytest
import torch
import transformers

from rlvr_jax.model import config as config_lib
from rlvr_jax.model import hf, lora_export
from rlvr_jax.model import lora as lora_lib
from rlvr_jax.model import transformer as tf
from tests.model.hf_fixtures import make_tiny_hf


def _trained(lora, seed=1, std=0.05):
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda x: jnp.asarray(np.asarray(x) + std * rng.standard_normal(x.shape, np.float32)), lora
    )


def _batch():
    rng = np.random.default_rng(0)
    mask = np.ones((2, 9), bool)
    mask[1, :4] = False
    return np.where(mask, rng.integers(1, 128, (2, 9)), 0), mask


def _ours(params, cfg, lora, tokens, mask):
    positions = tf.positions_from_mask(jnp.asarray(mask))
    fwd = jax.jit(
        lambda p, ad: tf.forward(p, jnp.asarray(tokens), positions, cfg, None, mask, lora=ad)
    )
    return np.asarray(fwd(params, lora)[0])


def _torch_logits(model, tokens, mask):
    with torch.no_grad():
        return model(
            input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64))
        ).logits.numpy()


# qwen2: q/k/v biases, untied head; qwen3: head_dim 32 with D = 64 and 4 heads, so o's input
# (H * Dh = 128) differs from D and a transposed layout could not pass by accident.
@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_peft_adapter_and_merged_export_give_our_logits_in_transformers(kind, tmp_path):
    model = make_tiny_hf(kind, tmp_path / "base")
    params, cfg = hf.load_hf(tmp_path / "base")
    lora_cfg = lora_lib.LoraConfig(rank=4, alpha=12.0)
    lora = _trained(lora_lib.init_lora(jax.random.key(0), cfg, lora_cfg))
    tokens, mask = _batch()
    ours = _ours(params, cfg, lora, tokens, mask)
    assert np.abs(ours - _ours(params, cfg, None, tokens, mask))[mask].max() > 1e-2

    out = lora_export.save_peft_adapter(
        lora, lora_cfg, cfg, tmp_path / "adapter", base_model_name_or_path=str(tmp_path / "base")
    )
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 12.0, "LORA")
    assert config["target_modules"] == [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
    ]  # fmt: skip
    tensors = hf.read_safetensors(out / "adapter_model.safetensors")
    key = "base_model.model.model.layers.1.self_attn.o_proj"
    assert tensors[f"{key}.lora_A.weight"].shape == (4, cfg.num_heads * cfg.head_dim)
    assert tensors[f"{key}.lora_B.weight"].shape == (cfg.embed_dim, 4)
    assert len(tensors) == 2 * 7 * cfg.num_layers

    with_adapter = peft.PeftModel.from_pretrained(model, out).eval()
    ref = _torch_logits(with_adapter, tokens, mask)
    assert np.abs(ours - ref)[mask].max() <= 1e-4

    merged_dir = lora_export.save_merged_hf(params, lora, cfg, tmp_path / "merged")
    merged = transformers.AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    assert np.abs(ours - _torch_logits(merged.eval(), tokens, mask))[mask].max() <= 1e-4

    back, back_cfg = lora_export.load_peft_adapter(out, cfg)
    assert back_cfg == lora_cfg
    for a, b in zip(jax.tree.leaves(lora), jax.tree.leaves(back), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_merged_export_of_an_int8_base_with_some_targets(tmp_path):
    mcfg = config_lib.PRESETS["tiny"].replace(vocab_size=128)
    params = lora_lib.quantize_int8(tf.init_params(jax.random.key(1), mcfg))
    lora_cfg = lora_lib.LoraConfig(rank=2, alpha=2.0, targets=("v", "down"))
    lora = _trained(lora_lib.init_lora(jax.random.key(2), mcfg, lora_cfg))
    tokens, mask = _batch()
    ours = _ours(params, mcfg, lora, tokens, mask)
    out = lora_export.save_merged_hf(params, lora, mcfg, tmp_path / "merged")
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert np.abs(ours - _torch_logits(model, tokens, mask))[mask].max() <= 1e-4
    adapter = lora_export.save_peft_adapter(lora, lora_cfg, mcfg, tmp_path / "adapter")
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["target_modules"] == ["v_proj", "down_proj"]


def test_export_refuses_mismatched_settings_and_reads_no_unsupported_adapter(tmp_path):
    mcfg = config_lib.PRESETS["tiny"].replace(vocab_size=128)
    lora_cfg = lora_lib.LoraConfig(rank=2, alpha=4.0, targets=("q",))
    lora = lora_lib.init_lora(jax.random.key(0), mcfg, lora_cfg)
    with pytest.raises(ValueError, match="do not match the LoraConfig"):
        lora_export.save_peft_adapter(lora, lora_lib.LoraConfig(rank=2, alpha=8.0), mcfg, tmp_path)
    out = lora_export.save_peft_adapter(lora, lora_cfg, mcfg, tmp_path / "a")
    with pytest.raises(FileExistsError):
        lora_export.save_peft_adapter(lora, lora_cfg, mcfg, out)
    path = out / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "use_rslora": True}))
    with pytest.raises(hf.CheckpointError, match="use_rslora=True is not supported"):
        lora_export.load_peft_adapter(out, mcfg)
