"""SFT: the loss counts response tokens only, bad rows are counted, the tiny model learns
addition from demonstrations, a run resumes exactly, and the export is what RL starts from."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import sft_tiny
from rlvr_jax.config_types import ConfigError
from rlvr_jax.data import datasets, templates
from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.single_turn import build_task
from rlvr_jax.model import config as config_lib
from rlvr_jax.model import loading
from rlvr_jax.model import transformer as tf
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.evals.evaluation import heldout_evaluator
from rlvr_jax.program.parts import build
from rlvr_jax.program.stages import sft_stage
from rlvr_jax.sft import traces
from rlvr_jax.sft.data import (
    demonstrations_from_examples,
    encode_demonstrations,
    load_demonstrations,
)
from rlvr_jax.sft.step import make_batch, sft_loss

REPO = Path(__file__).resolve().parents[1]


def _config(**overrides):
    c = sft_tiny.get_config()
    c.train.use_tensorboard = False
    for dotted, value in overrides.items():
        section, name = dotted.split("__")
        c[section][name] = value
    return c


def _metrics(workdir):
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "sft/loss" in r}


def test_loss_mask_covers_the_response_and_end_token_only():
    batch = make_batch([[5, 6, 7, 8, 1], [5, 9, 1]], [2, 2], buckets=(4, 8, 16), pad_id=0)
    np.testing.assert_array_equal(
        batch.tokens_NS, [[5, 6, 7, 8, 1, 0, 0, 0], [5, 9, 1, 0, 0, 0, 0, 0]]
    )
    np.testing.assert_array_equal(batch.mask_NS.sum(1), [5, 3])
    # Position t predicts token t + 1: row 0's targets 7, 8, 1 sit at positions 1, 2, 3.
    np.testing.assert_array_equal(
        batch.loss_mask_NT.astype(int), [[0, 1, 1, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0, 0]]
    )
    with pytest.raises(ValueError, match="largest bucket"):
        make_batch([[1] * 17], [3], buckets=(16,), pad_id=0)
    with pytest.raises(ValueError, match="prompt length 3"):
        make_batch([[5, 6, 1]], [3], buckets=(8,), pad_id=0)


def test_loss_is_the_token_mean_nll_of_response_tokens():
    cfg = config_lib.PRESETS["tiny"].replace(vocab_size=32)
    params = tf.init_params(jax.random.key(0), cfg)
    ids = [[3, 4, 5, 6, 7, 1], [3, 9, 10, 1]]
    prompt_lengths = [3, 1]
    batch = jax.tree.map(jnp.asarray, make_batch(ids, prompt_lengths, (8,), pad_id=0))
    loss_fn = jax.jit(sft_loss, static_argnums=2)
    loss, num = loss_fn(params, batch, cfg)
    logp = jax.nn.log_softmax(
        jax.jit(tf.forward, static_argnums=3)(
            params, batch.tokens_NS, jnp.broadcast_to(jnp.arange(8), (2, 8)), cfg
        )[0]
    )
    nll = [
        -logp[i, t - 1, seq[t]]
        for i, (seq, p) in enumerate(zip(ids, prompt_lengths, strict=True))
        for t in range(p, len(seq))
    ]
    assert int(num) == len(nll) == 3 + 3
    np.testing.assert_allclose(float(loss), float(np.mean(nll)), rtol=1e-5)
    # Padding is neither attended to nor scored: other pad ids leave the loss as it was.
    padded = dataclasses.replace(batch, tokens_NS=jnp.where(batch.mask_NS, batch.tokens_NS, 11))
    np.testing.assert_allclose(float(loss_fn(params, padded, cfg)[0]), float(loss), rtol=1e-6)


def test_malformed_rows_are_counted_and_skipped(tmp_path):
    path = tmp_path / "demos.jsonl"
    rows = [
        json.dumps({"prompt": "1+2", "response": "3"}),
        json.dumps({"question": "2+2", "solution": "4", "answer": "4", "source": "s"}),
        "{not json",
        json.dumps({"prompt": "3+3"}),
        json.dumps({"prompt": "4+4", "response": "   "}),
        json.dumps(["a", "list"]),
        "",
        json.dumps({"prompt": "5+5", "response": "10", "id": "x"}),
        json.dumps({"prompt": "6+6", "response": "12", "id": "x"}),
    ]
    path.write_text("\n".join(rows) + "\n")
    demos, report = load_demonstrations(path)
    assert [(d.prompt, d.response) for d in demos] == [("1+2", "3"), ("2+2", "4"), ("5+5", "10")]
    assert demos[1].answer == "4" and demos[1].source == "s" and demos[0].id == "demos/0"
    assert report.rows == 8 and report.loaded == 3
    assert dict(report.skipped) == {
        "bad_json": 1,
        "missing_field": 1,
        "empty_response": 1,
        "not_an_object": 1,
        "duplicate_id": 1,
    }
    assert "skipped 5 malformed" in report.summary()
    demos, _ = load_demonstrations(path, "question", "solution")
    assert [d.prompt for d in demos] == ["2+2"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{\n")
    with pytest.raises(ValueError, match="malformed"):
        load_demonstrations(bad)


def test_demonstrations_are_templated_like_rl_prompts():
    tok = Tokenizer.from_characters("0123456789+-*=")
    template = templates.get_template("text:{question}=")
    examples = datasets.arithmetic_examples(16, seed=0)
    demos = demonstrations_from_examples(examples)
    enc = encode_demonstrations(demos, template, tok, max_len=8)
    rl = templates.encode_prompts(examples, template, tok, (8,))
    for ids, p, prompt_ids, ex in zip(enc.ids, enc.prompt_lengths, rl.ids, examples, strict=True):
        assert ids[:p] == prompt_ids
        assert ids[p:] == [*tok.encode(ex.answer), tok.eos_ids[0]]
    short = encode_demonstrations(demos, template, tok, max_len=6)
    assert short.num_too_long == sum(len(i) > 6 for i in enc.ids) > 0
    assert "skipped" in short.summary()


def test_thought_in_the_response_format_is_the_worked_arithmetic():
    """ "{thought}" writes the expression one place value at a time (`sft.traces`): a worked
    answer whose last number is the gold answer, the one the verifier reads."""
    examples = datasets.arithmetic_examples(32, seed=0, level=3)
    demos = demonstrations_from_examples(examples, "{thought}", traces.thought_for)
    for demo, ex in zip(demos, examples, strict=True):
        lines = demo.response.split("\n")
        assert lines == traces.arithmetic_steps(ex.meta["expression"])
        assert lines[-1].rpartition("=")[2] == ex.answer
    by_hand = Example(id="e", prompt_text="85+63-51", answer="97", source="arithmetic",
                      meta={"expression": "85+63-51"})  # fmt: skip
    (demo,) = demonstrations_from_examples([by_hand], "{thought} so {answer}", traces.thought_for)
    assert demo.response == "85+60=145\n145+3=148\n148-50=98\n98-1=97 so 97"
    # A format without "{thought}" ignores the function; one with it needs a thought.
    assert demonstrations_from_examples([by_hand], "{answer}", None)[0].response == "97"
    no_thought = dataclasses.replace(by_hand, source="gsm8k", meta={})
    with pytest.raises(ValueError, match="'e' \\(gsm8k\\) has none"):
        demonstrations_from_examples([no_thought], "{thought}", traces.thought_for)
    with pytest.raises(ValueError, match="asks for a thought"):
        demonstrations_from_examples([by_hand], "{thought}")


def test_main_learns_addition_from_a_file_and_exports(tmp_path):
    """`main` with train.stage="sft": demonstrations from a JSONL file (with bad rows) on the
    from-scratch tiny model."""
    path = tmp_path / "demos.jsonl"
    examples = datasets.arithmetic_examples(512, seed=7)
    lines = [json.dumps({"prompt": ex.prompt_text, "response": ex.answer}) for ex in examples]
    path.write_text("\n".join([*lines, "{broken", json.dumps({"prompt": "1+1"})]) + "\n")
    workdir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "rlvr_jax.main",
        f"--config={REPO / 'configs' / 'sft_tiny.py'}",
        f"--workdir={workdir}",
        f"--config.sft.path={path}",
        "--config.train.use_tensorboard=false",
    ]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skipped 2 malformed" in proc.stdout
    assert "512 demonstrations fit in 8 tokens" in proc.stdout
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/accuracy" in r]
    losses = _metrics(workdir)
    steps = sft_tiny.get_config().train.steps
    assert sorted(losses) == list(range(1, steps + 1))
    assert losses[steps]["sft/loss"] < 0.5 * losses[1]["sft/loss"]
    # From scratch the model writes no correct sum; 64 held-out prompts, so 0.5 is far off noise.
    assert [r["step"] for r in evals] == [0, steps]
    assert evals[0]["eval/accuracy"] <= 0.05
    assert evals[1]["eval/accuracy"] >= 0.5

    # The exported directory is the policy: it reloads to the same greedy accuracy.
    export = workdir / sft_stage.EXPORT_DIR
    assert sorted(p.name for p in export.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    params, cfg = loading.load_model(str(export))
    settings = settings_lib.load_settings(workdir)
    assert settings.train.stage == "sft" and settings.sft.path == str(path)
    tok = build.build_tokenizer(settings.model)
    sampler = dataclasses.replace(settings.rl.sampler, eos_ids=tok.eos_ids, pad_id=tok.pad_id)
    s = dataclasses.replace(settings, rl=dataclasses.replace(settings.rl, sampler=sampler))
    _, eval_ex, _ = build.load_examples(s.data)
    enc = templates.encode_prompts(eval_ex, templates.get_template(s.data.template), tok, (8,))
    task = build_task(s.reward, tok, cfg.vocab_size, enc.examples, s.data.template)
    acc = heldout_evaluator(cfg, s, task, tok, enc.ids, enc.examples)(params)
    assert acc["eval/accuracy"] == evals[1]["eval/accuracy"]


def test_resume_gives_the_same_losses(tmp_path):
    config = _config(sft__eval=False, sft__export=False, train__checkpoint_every=3)
    config.train.steps = 8
    settings = settings_lib.settings_from_config(config)
    straight = sft_stage.run(settings, tmp_path / "a", log=lambda _: None)
    assert straight["resumed_from"] == 0
    # The same run interrupted after step 6: its last checkpoint is that of step 6.
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "8")
    lines = []
    resumed = sft_stage.run(settings, tmp_path / "b", log=lines.append)
    assert resumed["resumed_from"] == 6 and any("resumed from step 6" in x for x in lines)
    a, b = _metrics(tmp_path / "a"), _metrics(tmp_path / "b")
    assert sorted(b) == list(range(1, 9))
    for step in (7, 8):
        for name in ("sft/loss", "sft/grad_norm", "sft/tokens", "sft/epoch", "sft/lr"):
            assert a[step][name] == b[step][name], (step, name)
    assert a[7]["sft/loss"] != a[8]["sft/loss"]


def test_settings_errors_fail_before_compiling(tmp_path):
    with pytest.raises(ConfigError, match="sft: batch_size=0"):
        settings_lib.settings_from_config(_config(sft__batch_size=0))
    with pytest.raises(ConfigError, match="sft: prompt_field"):
        settings_lib.settings_from_config(_config(sft__prompt_field="q"))
    with pytest.raises(ConfigError, match=r"sft: buckets=\(1,\)"):
        settings_lib.settings_from_config(_config(sft__buckets=(1,)))
    with pytest.raises(ConfigError, match="train.stage='ppo'"):
        settings_lib.settings_from_config(_config(train__stage="ppo"))
    with pytest.raises(ConfigError, match="sft.batch_size=4096 exceeds"):
        s = settings_lib.settings_from_config(_config(sft__batch_size=4096))
        sft_stage.run(s, tmp_path, print)
