"""LoRA through the RL stage: a run on a local Hugging Face base trains the adapters, saves them
alone (the base is rebuilt from its source), resumes, and eval and export read it."""

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import tiny
from rlvr_jax.config_types import ConfigError
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.model import hf, loading, lora_export
from rlvr_jax.model import lora as lora_lib
from rlvr_jax.model import transformer as tf
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.parts import build
from rlvr_jax.program.runtime import checkpoint as ckpt_lib
from rlvr_jax.program.stages import rl_stage

ALPHABET = "0123456789+-*="


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    """A tiny random model saved as a Hugging Face directory: a base a source rebuilds."""
    tok = Tokenizer.from_characters(ALPHABET)
    params, cfg = loading.load_model("random:tiny", seed=3, vocab_size=max(tok.vocab_size, 8))
    return hf.save_hf(params, cfg, tmp_path_factory.mktemp("base") / "hf")


def _config(base: Path, steps: int):
    c = tiny.get_config()
    c.model.source = str(base)
    c.model.tokenizer = f"chars:{ALPHABET}"
    c.model.lora.rank = 4
    c.model.lora.alpha = 8.0
    c.model.lora.targets = ("q", "v", "gate", "up", "down")
    c.data.num_train = 64
    c.data.num_eval = 8
    c.eval.batch_prompts = 8
    c.train.batch_prompts = 4
    c.train.steps = steps
    c.train.checkpoint_every = 1
    c.train.use_tensorboard = False
    c.optim.learning_rate = 1e-2
    c.rl.loss.kl_beta = 0.05
    return c


def _run(config, workdir: Path) -> list[dict]:
    rl_stage.run(settings_lib.settings_from_config(config), workdir, log=lambda _: None)
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "reward/mean" in r]


def test_lora_run_saves_adapters_only_resumes_and_exports(base_dir, tmp_path):
    workdir = tmp_path / "run"
    first = _run(_config(base_dir, 1), workdir)
    # Step 1 samples from base + fresh adapters (B = 0): the policy is the reference.
    assert first[0]["kl/mean"] == pytest.approx(0.0, abs=1e-6)
    rows = _run(_config(base_dir, 2), workdir)
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["grad_norm"] > 0
    ck = ckpt_lib.Checkpointer(workdir / "checkpoints", every_steps=0, read_only=True)
    try:
        meta = ck.read_meta(2)
    finally:
        ck.close()
    assert meta["adapters_only"] and meta["ref_source"] == str(base_dir)

    # Eval and export read the run: the base from the source, the adapters from the checkpoint.
    params, cfg, tok, settings, step = build.restore_policy(workdir)
    assert step == 2 and params.lora is not None and params.lora.k is None
    base, _ = hf.load_hf(base_dir)
    np.testing.assert_array_equal(params.layers.q, base.layers.q)
    assert float(jnp.abs(params.lora.q.b).max()) > 0  # trained
    out = hf.save_hf(params, cfg, tmp_path / "export", tokenizer=tok)
    merged, _ = hf.load_hf(out)
    tokens = jnp.asarray([tok.encode("12+3=")])
    positions = jnp.arange(tokens.shape[1])[None]
    want = tf.forward(params, tokens, positions, cfg)[0]
    got = tf.forward(merged, tokens, positions, cfg)[0]
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert np.abs(tf.forward(base, tokens, positions, cfg)[0] - want).max() > 1e-4

    # The export command writes the adapters alone in PEFT's format, over the source.
    out = tmp_path / "adapter"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "rlvr_jax.export",
            f"--workdir={workdir}",
            f"--out={out}",
            "--adapter",
        ],
        check=True,
        capture_output=True,
    )
    adapters, lora_cfg = lora_export.load_peft_adapter(out, cfg)
    assert lora_cfg.rank == 4 and json.loads((out / "adapter_config.json").read_text())[
        "base_model_name_or_path"
    ] == str(base_dir)
    for x, y in zip(jax.tree.leaves(adapters), jax.tree.leaves(params.lora), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6)

    # A resume that turns LoRA off is refused, naming the field.
    config = _config(base_dir, 3)
    config.model.lora.rank = 0
    with pytest.raises(ckpt_lib.CheckpointError, match="model.lora.rank must match"):
        _run(config, workdir)


def test_lora_settings_name_the_bad_field():
    config = tiny.get_config()
    config.model.lora.rank = 4
    config.model.lora.targets = ("q", "attn")
    with pytest.raises(ConfigError, match="model.lora.targets"):
        settings_lib.settings_from_config(config)
    config.model.lora.targets = ("q",)
    config.model.lora.alpha = -1.0
    with pytest.raises(ConfigError, match="model.lora.alpha"):
        settings_lib.settings_from_config(config)
    config = tiny.get_config()
    config.model.lora.base = "int8"
    with pytest.raises(ConfigError, match="model.lora.base"):
        settings_lib.settings_from_config(config)
    config.model.lora.rank = 8
    config.rl.advantage.estimator = "gae"
    config.rl.critic.kind = "model"
    with pytest.raises(ConfigError, match="rl.critic.kind='head'"):
        settings_lib.settings_from_config(config)


def test_int8_base_is_quantised_at_load_with_fresh_adapters():
    s = settings_lib.settings_from_config(tiny.get_config())
    model = s.model.__class__(
        source=s.model.source,
        tokenizer=s.model.tokenizer,
        lora=settings_lib.LoraSettings(rank=2, base="int8"),
    )
    tok = build.build_tokenizer(model)
    params, cfg = build.load_policy(model, tok, seed=0)
    assert isinstance(params.layers.q, lora_lib.Int8Weight) and params.lora.q.a.shape[-1] == 2
    plain, _ = build.load_policy(s.model, tok, seed=0)
    tokens = jnp.asarray([tok.encode("1+2=")])
    positions = jnp.arange(tokens.shape[1])[None]
    logits = jax.jit(lambda p: tf.forward(p, tokens, positions, cfg)[0])
    # Fresh adapters change nothing; int8 rounding changes the logits a little.
    np.testing.assert_allclose(logits(params), logits(plain), atol=0.05)
