"""Pipelines: the config, the table by hand, a trimmed R1 pipeline end to end with its resume."""

import json
import math
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs.pipelines import r1_qwen3, r1_tiny
from rlvr_jax.config_types import ConfigError
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.model import hf
from rlvr_jax.program import build, pipeline, pipeline_eval
from rlvr_jax.program import metrics as metrics_lib
from rlvr_jax.program import settings as settings_lib


def _stage_settings(config):
    ps, base = pipeline.split_config(config)
    return ps, [
        settings_lib.settings_from_config(pipeline.stage_config(base, s, base.model.source))
        for s in ps.stages
    ]


def test_shipped_configs_build_every_stage():
    ps, built = _stage_settings(r1_tiny.get_config())
    assert [s.name for s in ps.stages] == ["sft_cold", "rl", "rs_sft"]
    assert [s.train.stage for s in built] == ["sft", "rl", "sft"]
    assert [s.train.steps for s in built] == [60, 40, 30]
    assert [s.rejection_samples for s in ps.stages] == [0, 0, 4]
    assert all(s.sft.export for s in built)
    assert ps.baseline == "sft_cold" and ps.eval_ks == (1, 4, 8)
    # The stages differ from the base only where their overrides say.
    assert built[0].data == built[1].data == built[2].data

    config = r1_qwen3.get_config("traces=/data/traces.jsonl")
    config.model.source = "random:qwen3-0.6b"  # no weights offline; the settings are the point
    ps, built = _stage_settings(config)
    assert built[0].sft.path == "/data/traces.jsonl" and built[2].sft.path == ""
    assert built[1].reward.verifier == "math" and built[1].reward.format == "r1"
    assert ps.baseline == "rl" and ps.stages[2].rejection_samples == 4


def test_bad_pipelines_are_named():
    c = r1_tiny.get_config()
    c.pipeline.stages[1]["overrides"]["rl.loss.aggregaton"] = "token_mean"
    ps, base = pipeline.split_config(c)
    with pytest.raises(ConfigError, match="aggregaton"):
        pipeline.stage_config(base, ps.stages[1], "random:tiny")
    c = r1_tiny.get_config()
    c.pipeline.baseline = "ppo"
    with pytest.raises(ConfigError, match="baseline='ppo'"):
        pipeline.split_config(c)
    c = r1_tiny.get_config()
    c.pipeline.stages[2]["name"] = "rl"
    with pytest.raises(ConfigError, match="repeat"):
        pipeline.split_config(c)
    c = r1_tiny.get_config()
    c.pipeline.evals = 3
    with pytest.raises(ConfigError, match="pipeline.evals"):
        pipeline.split_config(c)
    c = r1_tiny.get_config()
    del c["pipeline"]
    with pytest.raises(ConfigError, match="no 'pipeline' section"):
        pipeline.split_config(c)


def test_table_by_hand():
    rows = [
        {"stage": "0_start", "steps": 0, "from": None, "eval": {"greedy acc.": 0.25}},
        {"stage": "1_sft", "steps": 10, "from": "0_start", "eval": {"greedy acc.": 0.5}},
        {
            "stage": "2_rl",
            "steps": 5,
            "from": "1_sft",
            "eval": {"greedy acc.": 0.375, "format rate": math.nan},
        },
        {"stage": "baseline_sft", "steps": 15, "from": "0_start", "eval": {"greedy acc.": 0.625}},
    ]
    table = pipeline_eval.markdown_table(rows).splitlines()
    assert table[0] == "| stage | steps | greedy acc. | format rate | Δ acc. |"
    assert table[2] == "| 0_start | 0 | 0.250 | n/a |  |"
    assert table[3] == "| 1_sft | 10 | 0.500 | n/a | +0.250 |"
    assert table[4] == "| 2_rl | 5 | 0.375 | n/a | -0.125 |"
    assert table[5] == "| baseline_sft | 15 | 0.625 | n/a | +0.375 |"


def test_response_text_drops_only_the_end_token():
    tok = Tokenizer.from_characters("0123456789+=")
    ids = tok.encode("12")
    assert pipeline_eval.response_text([*ids, tok.eos_ids[0]], tok) == "12"
    assert pipeline_eval.response_text(ids, tok) == "12"  # truncated: nothing to drop


def _trimmed(rs_steps):
    """r1_tiny without its RL stage (whose compilation would take most of the test's time; the
    pipeline treats every stage alike), on fewer prompts."""
    c = r1_tiny.get_config()
    c.data.num_train = 128  # enough verified answers to fill an SFT batch of 16
    c.data.num_eval = 16
    c.eval.batch_prompts = 16
    c.train.checkpoint_every = 2
    c.sft.batch_size = 16
    cold, _, rs = c.pipeline.stages
    cold["overrides"]["train.steps"] = 40  # enough for some verified answers to sample
    rs["overrides"]["train.steps"] = rs_steps
    rs["rejection_samples"] = 2
    c.pipeline.stages = [cold, rs]
    c.pipeline.eval_samples = 2
    c.pipeline.eval_ks = "1,2"
    return c


def test_trimmed_r1_pipeline_end_to_end_and_resume(tmp_path):
    messages = []
    out = pipeline.run_pipeline(_trimmed(rs_steps=2), tmp_path, log=messages.append)
    labels = ["0_start", "1_sft_cold", "2_rs_sft"]
    assert [r["stage"] for r in out["rows"]] == labels
    assert [r["steps"] for r in out["rows"]] == [0, 40, 2]
    # Each stage started from the previous one's exported weights.
    assert out["rows"][1]["started_from"] == "random:tiny"
    assert out["rows"][2]["started_from"] == out["rows"][1]["source"]
    for row in out["rows"][1:]:
        assert (tmp_path / row["stage"] / "hf" / "config.json").is_file()
    # The equal-compute branch: the cold start's SFT alone, from the starting model, for the
    # pipeline's 42 steps.
    (base,) = out["baselines"]
    assert (base["stage"], base["steps"]) == ("baseline_sft_cold", 42)
    assert base["started_from"] == "random:tiny"
    demos = (tmp_path / "2_rs_sft" / "rejection.jsonl").read_text().splitlines()
    assert demos
    for line in demos:  # every kept answer is verified: its last number is the sum, then the end
        row = json.loads(line)
        a, b = row["prompt"].split("+")
        assert re.findall(r"\d+", row["response"])[-1] == str(int(a) + int(b)) == row["answer"]
    suite = out["rows"][0]["eval"]
    for name in ("greedy acc.", "pass@1", "pass@2", "mean@2", "length", "truncated",
                 "format rate", "language consistency"):  # fmt: skip
        assert name in suite, name
    assert suite["pass@2"] >= suite["pass@1"]
    table = (tmp_path / "pipeline.md").read_text()
    assert table == out["table"]
    for label in [*labels, "baseline_sft_cold"]:
        assert f"| {label} |" in table
    assert out["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # A rerun trains nothing; a longer last stage (train.steps may change on resume) resumes it
    # from its checkpoint at step 2 and leaves the stage before it alone.
    ledgers = {label: tmp_path / label / "metrics.jsonl" for label in labels[1:]}
    stamps = {k: p.stat().st_mtime_ns for k, p in ledgers.items()}
    again = pipeline.run_pipeline(_trimmed(rs_steps=2), tmp_path, log=messages.append)
    assert again["table"] == out["table"]
    assert {k: p.stat().st_mtime_ns for k, p in ledgers.items()} == stamps
    (tmp_path / "2_rs_sft" / "stage.json").unlink()
    (tmp_path / "baseline_sft_cold" / "stage.json").unlink()
    messages.clear()
    longer = pipeline.run_pipeline(_trimmed(rs_steps=4), tmp_path, log=messages.append)
    assert any("resumed from step 2" in m for m in messages)
    assert [r["steps"] for r in longer["rows"]] == [0, 40, 4]
    records = metrics_lib.read_metrics(tmp_path / "2_rs_sft")
    assert [r["step"] for r in metrics_lib.step_rows(records)] == [1, 2, 3, 4]
    assert longer["baselines"][0]["steps"] == 44
    assert ledgers["1_sft_cold"].stat().st_mtime_ns == stamps["1_sft_cold"]

    # An RL stage does not export itself: the pipeline writes its weights from the newest
    # checkpoint, as here from the cold start's.
    exported = pipeline.export_policy(tmp_path / "1_sft_cold")
    params = hf.load_hf(exported)[0]
    own = build.restore_policy(tmp_path / "1_sft_cold")[0]
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(own), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_command_line_requires_a_config(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "rlvr_jax.pipeline", f"--workdir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode != 0
    assert "--config=configs/pipelines/<name>.py is required" in result.stderr
