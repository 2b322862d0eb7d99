"""`python -m rlvr_jax.export`: a tiny RL run's checkpoint as a Hugging Face directory that
`transformers` loads with the same logits; a non-empty --out is refused or replaced whole; a
missing --step is named; an unreadable latest checkpoint is skipped with a warning."""

import gc
import os
import shutil
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
from rlvr_jax.model import hf, loading
from rlvr_jax.model import transformer as tf
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.parts import build
from rlvr_jax.program.runtime.checkpoint import CheckpointError
from rlvr_jax.program.stages import rl_stage

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("tiny_run")
    rl_stage.run(settings_lib.settings_from_config(_tiny()), workdir, log=lambda _: None)
    return workdir


def _tiny():
    config = tiny.get_config()
    config.train.steps = 3
    config.train.checkpoint_every = 2
    config.train.use_tensorboard = False
    return config


def test_settings_are_saved_and_read_back(tiny_run):
    # As the run used them: the tokenizer's end and pad ids filled in.
    settings = settings_lib.settings_from_config(_tiny())
    expected = build.with_tokenizer_ids(settings, build.build_tokenizer(settings.model))
    assert settings_lib.load_settings(tiny_run) == expected


def _export(workdir, out, *flags) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "rlvr_jax.export", f"--workdir={workdir}", f"--out={out}", *flags]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def _assert_params_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_export_cli_matches_transformers(tiny_run, tmp_path):
    out = tmp_path / "hf"
    proc = _export(tiny_run, out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "step 3" in proc.stdout

    params, cfg, tok, _, step = build.restore_policy(tiny_run)
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
    params, cfg, tok, _, _ = build.restore_policy(tiny_run, step=2)
    out = hf.save_hf(params, cfg, tmp_path / "bf16", tokenizer=tok, dtype="bfloat16")
    exported, _ = hf.load_hf(out, param_dtype="float32")
    np.testing.assert_allclose(
        np.asarray(exported.embed), np.asarray(params.embed), rtol=1e-2, atol=1e-3
    )
    assert hf.read_safetensors(out / "model.safetensors")["model.norm.weight"].dtype.name == (
        "bfloat16"
    )


def test_a_workdir_without_a_run_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="settings.json"):
        build.restore_policy(tmp_path)
    settings_lib.save_settings(settings_lib.settings_from_config(tiny.get_config()), tmp_path)
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        build.restore_policy(tmp_path)


def test_export_over_an_old_sharded_checkpoint_needs_overwrite_and_replaces_it(tiny_run, tmp_path):
    params, cfg, tok, _, _ = build.restore_policy(tiny_run)
    init, _ = loading.load_model("random:tiny", seed=0, vocab_size=cfg.vocab_size)
    out = tmp_path / "hf"
    # An older export of other weights, in two shards and an index (which loaders prefer).
    total = sum(a.nbytes for a in hf.params_to_hf_tensors(init, cfg).values())
    hf.save_hf(init, cfg, out, tokenizer=tok, max_shard_bytes=total * 2 // 3)
    old = _files(out)
    assert "model-00001-of-00002.safetensors" in old and "model.safetensors.index.json" in old

    proc = _export(tiny_run, out)
    assert proc.returncode != 0
    assert f"{out} is not empty" in proc.stderr and "--overwrite" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert _files(out) == old

    proc = _export(tiny_run, out, "--overwrite")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exported, _ = hf.load_hf(out)
    _assert_params_equal(exported, params)
    names = set(_files(out))
    assert "model.safetensors" in names and "config.json" in names
    assert not [n for n in names if n.startswith("model-") or n.endswith(".index.json")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # nothing left beside it


def test_save_hf_refuses_a_non_empty_directory_and_keeps_it_on_failure(tiny_run, tmp_path):
    params, cfg, _, _, _ = build.restore_policy(tiny_run)
    out = tmp_path / "hf"
    out.mkdir()
    hf.save_hf(params, cfg, out)  # an empty directory is fine
    before = _files(out)
    with pytest.raises(FileExistsError, match=f"{out} is not empty .*model.safetensors"):
        hf.save_hf(params, cfg, out)
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="not a directory"):
        hf.save_hf(params, cfg, tmp_path / "file", overwrite=True)

    class BrokenTokenizer:
        def save_pretrained(self, directory):
            raise OSError(28, "No space left on device")

    # A write that fails part-way leaves the old directory as it was, and no temporary one.
    with pytest.raises(OSError, match="No space left"):
        hf.save_hf(params, cfg, out, tokenizer=BrokenTokenizer(), overwrite=True)
    assert _files(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "hf"]


def test_a_step_that_does_not_exist_is_named_with_the_available_ones(tiny_run, tmp_path):
    with pytest.raises(
        CheckpointError, match=r"no checkpoint for step 7 .*available steps: \[2, 3\]"
    ):
        build.restore_policy(tiny_run, step=7)
    proc = _export(tiny_run, tmp_path / "hf", "--step=7")
    assert proc.returncode != 0
    assert "no checkpoint for step 7" in proc.stderr and "available steps: [2, 3]" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "hf").exists()


# Reading the truncated step abandons orbax's other array reads unawaited; they are collected at
# the end of the test (not in a later one) and their notices dropped.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_export_skips_an_unreadable_latest_checkpoint(tiny_run, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(tiny_run, workdir)
    step3 = workdir / build.CHECKPOINTS / "3" / "state"
    largest = max((p for p in step3.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    largest.write_bytes(largest.read_bytes()[:100])

    out = tmp_path / "hf"
    proc = _export(workdir, out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "step 2 of" in proc.stdout
    assert "checkpoint step 3 is unreadable" in proc.stderr
    assert str(workdir / build.CHECKPOINTS / "3") in proc.stderr
    step2, *_ = build.restore_policy(tiny_run, step=2)
    _assert_params_equal(hf.load_hf(out)[0], step2)
    # Named explicitly, the unreadable step is an error.
    with pytest.raises(CheckpointError, match="step 3"):
        build.restore_policy(workdir, step=3)
    gc.collect()
