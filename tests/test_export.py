"""`python -m rlvr_jax.export`: a tiny RL run's checkpoint as a Hugging Face directory that
`transformers` loads with the same logits."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from configs import tiny
from rlvr_jax import export, train
from rlvr_jax.model import hf, loading
from rlvr_jax.model import transformer as tf
from rlvr_jax.program import settings as settings_lib

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("tiny_run")
    train.run(settings_lib.settings_from_config(_tiny()), workdir, log=lambda _: None)
    return workdir


def _tiny():
    config = tiny.get_config()
    config.train.steps = 3
    config.train.checkpoint_every = 2
    config.train.use_tensorboard = False
    return config


def test_settings_are_saved_and_read_back(tiny_run):
    assert settings_lib.load_settings(tiny_run) == settings_lib.settings_from_config(_tiny())


def test_export_cli_matches_transformers(tiny_run, tmp_path):
    out = tmp_path / "hf"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "rlvr_jax.export", f"--workdir={tiny_run}", f"--out={out}"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "step 3" in proc.stdout

    params, cfg, tok, _, step = export.restore_policy(tiny_run)
    assert step == 3
    # The export holds the trained weights of the last checkpoint, not the initial ones.
    exported, cfg2 = hf.load_hf(out)
    assert cfg2 == cfg
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(exported), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    init, _ = loading.load_model("random:tiny", seed=0, vocab_size=cfg.vocab_size)
    assert not np.array_equal(np.asarray(init.embed), np.asarray(exported.embed))

    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = np.asarray([tok.encode("3+4=5"), tok.encode("9+9=18")[:5]])
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids)).logits.numpy()
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    ours, _ = tf.forward(params, jnp.asarray(ids), positions, cfg)
    assert np.abs(np.asarray(ours) - ref).max() <= 1e-4
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tok.encode("3+4=", add_special_tokens=False) == tok.encode("3+4=")


def test_export_of_an_earlier_step_in_bfloat16(tiny_run, tmp_path):
    out = export.export(tiny_run, tmp_path / "bf16", step=2, dtype="bfloat16")
    params, _, _, _, _ = export.restore_policy(tiny_run, step=2)
    exported, _ = hf.load_hf(out, param_dtype="float32")
    np.testing.assert_allclose(
        np.asarray(exported.embed), np.asarray(params.embed), rtol=1e-2, atol=1e-3
    )
    assert hf.read_safetensors(out / "model.safetensors")["model.norm.weight"].dtype.name == (
        "bfloat16"
    )


def test_a_workdir_without_a_run_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="settings.json"):
        export.restore_policy(tmp_path)
    settings_lib.save_settings(settings_lib.settings_from_config(tiny.get_config()), tmp_path)
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        export.restore_policy(tmp_path)
