"""Hugging Face checkpoints: export round trip, sharded files, and clear errors on bad input."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from rlvr_jax.model import config as config_lib
from rlvr_jax.model import hf
from rlvr_jax.model import transformer as tf
from tests.model.hf_fixtures import make_tiny_hf


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("qwen2")
    make_tiny_hf("qwen2", directory)
    return directory


def _tokens():
    return np.random.default_rng(0).integers(0, 128, (2, 9))


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
def test_export_round_trip_through_transformers(kind, tmp_path):
    cfg = config_lib.PRESETS["tiny"].replace(
        model_type=kind,
        vocab_size=128,
        qkv_bias=kind == "qwen2",
        qk_norm=kind == "qwen3",
        tie_embeddings=kind != "qwen2",
        rope_scaling=config_lib.RopeScaling(8.0, 1.0, 4.0, 64) if kind == "llama" else None,
    )
    params = tf.init_params(jax.random.key(1), cfg)
    # Non-trivial norms and biases, so a dropped or swapped tensor would show.
    params = jax.tree.map(lambda x: x + 0.05 * jnp.cos(jnp.arange(x.size).reshape(x.shape)), params)
    out = hf.save_hf(params, cfg, tmp_path / "export")
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokens = _tokens()
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(tokens)).logits.numpy()
    ours, _ = tf.forward(params, jnp.asarray(tokens), jnp.broadcast_to(jnp.arange(9), (2, 9)), cfg)
    assert np.abs(np.asarray(ours) - ref).max() <= 1e-4
    reloaded, cfg2 = hf.load_hf(out)
    assert cfg2 == cfg
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(reloaded), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_sharded_checkpoint_with_index(qwen2_dir, tmp_path):
    params, cfg = hf.load_hf(qwen2_dir)
    out = hf.save_hf(params, cfg, tmp_path / "sharded", max_shard_bytes=20_000)
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) > 2 and (out / "model.safetensors.index.json").exists()
    again, _ = hf.load_hf(out)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert sum(p.numel() for p in model.parameters()) == tf.count_params(params)


def test_bfloat16_export_and_load(qwen2_dir, tmp_path):
    params, cfg = hf.load_hf(qwen2_dir)
    out = hf.save_hf(params, cfg, tmp_path / "bf16", dtype="bfloat16")
    half, cfg_half = hf.load_hf(out, param_dtype="bfloat16", dtype="bfloat16")
    assert half.embed.dtype == jnp.bfloat16 and cfg_half.dtype == "bfloat16"
    np.testing.assert_allclose(
        np.asarray(half.embed, np.float32), np.asarray(params.embed), rtol=1e-2, atol=1e-3
    )


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _rewrite_tensors(directory, edit):
    path = directory / "model.safetensors"
    tensors = {k: np.array(v) for k, v in hf.read_safetensors(path).items()}
    edit(tensors)
    path.unlink()
    hf.write_safetensors(path, tensors)


def test_missing_tensor_is_named(qwen2_dir, tmp_path):
    d = _copy(qwen2_dir, tmp_path / "m")
    _rewrite_tensors(d, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(hf.CheckpointError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        hf.load_hf(d)


def test_wrong_shape_is_named(qwen2_dir, tmp_path):
    d = _copy(qwen2_dir, tmp_path / "s")

    def edit(t):
        t["model.layers.0.self_attn.k_proj.weight"] = np.zeros((48, 64), np.float32)

    _rewrite_tensors(d, edit)
    with pytest.raises(hf.CheckpointError, match=r"k_proj\.weight.*\(48, 64\).*\(32, 64\)"):
        hf.load_hf(d)


def test_weights_of_another_architecture_are_refused(qwen2_dir, tmp_path):
    d = _copy(qwen2_dir, tmp_path / "a")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "llama"  # qwen2 weights carry q/k/v biases that llama does not have
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(hf.CheckpointError, match=r"self_attn\.\w_proj\.bias"):
        hf.load_hf(d)


def test_unknown_model_type_is_named(qwen2_dir, tmp_path):
    d = _copy(qwen2_dir, tmp_path / "u")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "mistral"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="model_type='mistral'"):
        hf.load_hf(d)


def test_missing_config_field_is_named(qwen2_dir, tmp_path):
    d = _copy(qwen2_dir, tmp_path / "f")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["intermediate_size"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="intermediate_size"):
        hf.load_hf(d)


def test_truncated_file_is_reported(qwen2_dir, tmp_path):
    d = _copy(qwen2_dir, tmp_path / "t")
    path = d / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(hf.CheckpointError, match="model.safetensors"):
        hf.load_hf(d)


def test_missing_shard_is_named(qwen2_dir, tmp_path):
    params, cfg = hf.load_hf(qwen2_dir)
    out = hf.save_hf(params, cfg, tmp_path / "sh", max_shard_bytes=20_000)
    (out / "model-00002-of-{:05d}.safetensors".format(len(list(out.glob("model-*"))))).unlink()
    with pytest.raises(hf.CheckpointError, match="model-00002-of"):
        hf.load_hf(out)


def test_unreachable_hub_id_says_where_to_put_files(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="local-dir"):
        hf.resolve_checkpoint("Qwen/Qwen2.5-0.5B-Instruct")
    with pytest.raises(FileNotFoundError, match="downloads are disabled"):
        hf.resolve_checkpoint("Qwen/Qwen2.5-0.5B-Instruct", allow_download=False)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        hf.resolve_checkpoint("/no/such/dir")
