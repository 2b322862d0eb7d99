"""`python -m rlvr_jax.eval` on a briefly fine-tuned tiny model: greedy accuracy as the training
loop measures it, pass@k and mean@n from samples, per-source tables, the JSON and the table; a
missing --step named with the available ones, an unreadable latest checkpoint skipped."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from configs import sft_tiny
from rlvr_jax.data import datasets, templates
from rlvr_jax.envs.single_turn import build_task
from rlvr_jax.envs.task import Task
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.evals import evaluation
from rlvr_jax.program.evals.evaluation import heldout_evaluator
from rlvr_jax.program.parts import build
from rlvr_jax.program.stages import sft_stage
from rlvr_jax.types import FINISH_LENGTH

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny model part-way through learning addition (accuracy well inside (0, 1))."""
    workdir = tmp_path_factory.mktemp("sft_run")
    config = sft_tiny.get_config()
    config.train.steps = 60
    config.train.use_tensorboard = False
    config.sft.eval = False
    config.sft.export = False
    sft_stage.run(settings_lib.settings_from_config(config), workdir, log=lambda _: None)
    return workdir


@pytest.fixture(scope="module")
def policy(run):
    params, cfg, tok, settings, _ = build.restore_policy(run)
    _, heldout, _ = build.load_examples(settings.data)
    return params, cfg, tok, settings, heldout


def test_greedy_accuracy_is_the_training_loops(policy):
    params, cfg, tok, settings, heldout = policy
    result = evaluation.evaluate(params, cfg, tok, settings, heldout)
    sampler = dataclasses.replace(settings.rl.sampler, eos_ids=tok.eos_ids, pad_id=tok.pad_id)
    s = dataclasses.replace(settings, rl=dataclasses.replace(settings.rl, sampler=sampler))
    enc = templates.encode_prompts(
        heldout, templates.get_template(s.data.template), tok, s.data.buckets
    )
    task = build_task(s.reward, tok, cfg.vocab_size, enc.examples, s.data.template)
    loop = heldout_evaluator(cfg, s, task, tok, enc.ids, enc.examples)(params)
    greedy = result["greedy"]["all"]
    assert 0.1 < greedy["mean@1"] < 0.95
    assert greedy["mean@1"] == loop["eval/accuracy"]
    assert greedy["length/mean"] == pytest.approx(loop["eval/length"])
    assert greedy["length/truncated"] == loop["eval/truncated"]
    assert result["num_prompts"] == greedy["prompts"] == len(heldout)
    assert "sampled" not in result


def test_samples_give_pass_at_k_and_mean_at_n(policy):
    params, cfg, tok, settings, heldout = policy
    # Near-zero temperature: every sample is the greedy answer, so every statistic equals it.
    cold = evaluation.EvalOptions(num_samples=4, ks=(1, 2, 4), temperature=1e-4)
    result = evaluation.evaluate(params, cfg, tok, settings, heldout, cold)
    greedy, sampled = result["greedy"]["all"]["mean@1"], result["sampled"]["all"]
    for name in ("mean@4", "pass@1", "pass@2", "pass@4"):
        assert sampled[name] == pytest.approx(greedy), name
    # At temperature 1 the samples differ: pass@k grows with k, pass@1 is mean@n.
    # Same shapes as above (n=4): the sampler program is reused, only the temperature changes.
    warm = evaluation.EvalOptions(num_samples=4, ks=(1, 2, 4, 16), temperature=1.0, seed=3)
    sampled = evaluation.evaluate(params, cfg, tok, settings, heldout, warm)["sampled"]["all"]
    assert sampled["samples"] == 4 and "pass@16" not in sampled
    assert sampled["pass@1"] == pytest.approx(sampled["mean@4"])
    assert sampled["pass@1"] < sampled["pass@2"] < sampled["pass@4"] <= 1.0


def test_per_source_tables(policy):
    params, cfg, tok, settings, heldout = policy
    half = len(heldout) // 2
    mixed = [dataclasses.replace(ex, source="a") for ex in heldout[:half]]
    mixed += [dataclasses.replace(ex, source="b") for ex in heldout[half:]]
    result = evaluation.evaluate(params, cfg, tok, settings, mixed)["greedy"]
    assert sorted(result) == ["a", "all", "b"]
    assert result["a"]["prompts"] + result["b"]["prompts"] == result["all"]["prompts"]
    weighted = (
        result["a"]["mean@1"] * result["a"]["prompts"]
        + result["b"]["mean@1"] * result["b"]["prompts"]
    ) / result["all"]["prompts"]
    assert weighted == pytest.approx(result["all"]["mean@1"])


def test_cli_on_named_datasets_writes_json_and_a_table(run, tmp_path):
    for name, level in (("easy", 1), ("hard", 2)):
        examples = [
            dataclasses.replace(ex, source=name)
            for ex in datasets.arithmetic_examples(24, seed=5, level=level)
        ]
        datasets.write_examples(tmp_path / f"{name}.jsonl", examples)
    out = tmp_path / "result.json"
    specs = f"examples:{tmp_path / 'easy.jsonl'},examples:{tmp_path / 'hard.jsonl'}"
    cmd = [
        sys.executable,
        "-m",
        "rlvr_jax.eval",
        f"--workdir={run}",
        f"--datasets={specs}",
        "--n=4",
        "--k=1,4",
        f"--out={out}",
    ]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["checkpoint_step"] == 60 and result["num_prompts"] == 48
    assert sorted(result["sampled"]) == ["all", "easy", "hard"]
    assert result["sampled"]["easy"]["prompts"] == 24
    # The model only saw single-digit sums: two-digit subtraction stays (nearly) unsolved.
    assert result["greedy"]["easy"]["mean@1"] > result["greedy"]["hard"]["mean@1"]
    header = next(line for line in proc.stdout.splitlines() if line.startswith("source"))
    assert header.split() == ["source", "prompts", "greedy", "mean@4", "pass@1", "pass@4"] + [
        "len@4",
        "trunc",
    ]
    assert any(line.split()[0] == "hard" for line in proc.stdout.splitlines() if line.strip())


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="num_samples=-1"):
        evaluation.EvalOptions(num_samples=-1)
    with pytest.raises(ValueError, match="temperature"):
        evaluation.EvalOptions(temperature=0.0)


class _TextTask(Task):
    """A host verifier: the decoded response must be the answer, then the end token."""

    name = "text"

    def __init__(self, tok):
        self.tok = tok

    def score(self, rollout, rows):
        tokens, lengths, finish = jax.device_get(
            (rollout.tokens_NT, rollout.lengths_N, rollout.finish_N)
        )
        correct = [
            float(
                f != FINISH_LENGTH and self.tok.decode(t[:n], skip_special_tokens=True) == ex.answer
            )
            for t, n, f, ex in zip(tokens, lengths, finish, rows, strict=True)
        ]
        return {"correct": np.asarray(correct, np.float32)}


def test_host_verifier_path_agrees_with_the_in_graph_one(policy):
    params, cfg, tok, settings, heldout = policy
    sampler = dataclasses.replace(settings.rl.sampler, eos_ids=tok.eos_ids, pad_id=tok.pad_id)
    enc = templates.encode_prompts(
        heldout, templates.get_template(settings.data.template), tok, settings.data.buckets
    )
    in_graph_task = build_task(settings.reward, tok, cfg.vocab_size, enc.examples, "")
    # The shapes of the sampling test above (32 prompts x 4), so nothing compiles again.
    common = dict(buckets=(8,), pad_id=tok.pad_id, batch_prompts=32, seed=1)
    args = (params, cfg)
    rest = (enc.ids, enc.examples, sampler, 4)
    in_graph = evaluation.generate_and_score(*args, in_graph_task, *rest, **common)
    host = evaluation.generate_and_score(*args, _TextTask(tok), *rest, **common)
    assert in_graph[0].shape == (len(heldout), 4) and 0 < in_graph[0].mean() < 1
    for a, b in zip(in_graph, host, strict=True):
        np.testing.assert_array_equal(a, b)


def _eval(*flags: str, path_first: Path | None = None, **env_vars: str):
    path = str(REPO) if path_first is None else f"{path_first}{os.pathsep}{REPO}"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=path, **env_vars)
    cmd = [sys.executable, "-m", "rlvr_jax.eval", *flags]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


# A stand-in for Hugging Face `datasets`: it records what it is asked, and has no network.
_FAKE_DATASETS = """
import json, os

def load_dataset(path, config=None, split=None):
    with open(os.environ["ASKED_FILE"], "a") as f:
        f.write(json.dumps([path, config, split]) + "\\n")
    raise ConnectionError("no network here")
"""


def test_cli_asks_the_hub_for_each_datasets_own_split(tmp_path):
    """`--datasets=aime` without --data_path asks the hub for AIME 2024's only split, "train";
    a --split it lacks is named, with the splits it has, and the hub is not asked."""
    fake = tmp_path / "fake"
    (fake / "datasets").mkdir(parents=True)
    (fake / "datasets" / "__init__.py").write_text(_FAKE_DATASETS)
    asked = tmp_path / "asked.jsonl"
    flags = (f"--config={REPO / 'configs' / 'tiny.py'}", "--datasets=aime")
    out = f"--out={tmp_path / 'r.json'}"
    proc = _eval(*flags, out, path_first=fake, ASKED_FILE=str(asked))
    assert proc.returncode != 0
    assert "could not load 'aime' from Hugging Face 'HuggingFaceH4/aime_2024' split 'train'" in (
        proc.stderr
    )
    assert [json.loads(line) for line in asked.read_text().splitlines()] == [
        ["HuggingFaceH4/aime_2024", None, "train"]
    ]

    asked.unlink()
    proc = _eval(*flags, "--split=test", out, path_first=fake, ASKED_FILE=str(asked))
    assert proc.returncode != 0
    assert (
        "--datasets=aime --split='test': Hugging Face dataset 'HuggingFaceH4/aime_2024' has no "
        "split 'test' (asked for 'test'); its splits: ['train']"
    ) in proc.stderr
    assert not asked.exists() and not (tmp_path / "r.json").exists()


def test_cli_names_a_missing_step_with_the_available_ones(run, tmp_path):
    proc = _eval(f"--workdir={run}", "--step=55", f"--out={tmp_path / 'r.json'}")
    assert proc.returncode != 0
    assert "no checkpoint for step 55" in proc.stderr and "available steps: [50, 60]" in proc.stderr
    assert not (tmp_path / "r.json").exists()


def test_cli_names_bad_thinking_budgets_before_loading_anything(tmp_path):
    proc = _eval(f"--workdir={tmp_path / 'nothing'}", "--think_budgets=8,sixteen")
    assert proc.returncode != 0
    assert "--think_budgets='8,sixteen' is not a list of integers" in proc.stderr


def test_cli_skips_an_unreadable_latest_checkpoint_with_a_warning(run, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(run, workdir)
    (workdir / build.CHECKPOINTS / "60" / "meta" / "metadata").write_bytes(b"\x00{not json")
    datasets.write_examples(tmp_path / "few.jsonl", datasets.arithmetic_examples(4, seed=5))
    out = tmp_path / "r.json"
    proc = _eval(
        f"--workdir={workdir}", f"--datasets=examples:{tmp_path / 'few.jsonl'}", f"--out={out}"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(out.read_text())["checkpoint_step"] == 50
    assert "checkpoint step 60 is unreadable" in proc.stderr and "JSONDecodeError" in proc.stderr
    assert str(workdir / build.CHECKPOINTS / "60") in proc.stderr
    # What it evaluated is step 50 of the run.
    params, *_, step = build.restore_policy(workdir)
    step50, *_ = build.restore_policy(run, step=50)
    assert step == 50
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(step50), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_cli_thinking_budget_curve_under_another_template(tmp_path):
    """A random model in a thinking block that its prompt opened never closes it by itself: at
    every budget the sampler ends the thought, and the curve is in the JSON and the table."""
    out = tmp_path / "r.json"
    proc = _eval(
        f"--config={REPO / 'configs' / 'tiny.py'}",
        "--config.model.tokenizer=chars:0123456789+-*=<>/thinko\n",
        "--config.data.num_eval=4",
        "--config.data.buckets=(16,)",
        "--template=text:{question}=<think>",
        "--think_budgets=2,3",
        "--max_new_tokens=12",
        f"--out={out}",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert [p["budget"] for p in result["think_budget"]] == [2, 3]
    assert result["template"] == "text:{question}=<think>"
    for p in result["think_budget"]:
        assert p["early_end_rate"] == 1.0 and p["accuracy"] == 0.0
        # The budget's tokens, then "\n</think>" injected (9 tokens), then the model's own.
        assert p["length"] >= p["budget"] + 9
    assert "| thinking budget | accuracy | early-end rate |" in proc.stdout
