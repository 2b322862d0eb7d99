"""Pipelines: the config, the table by hand, a trimmed R1 pipeline end to end with its resume."""

import dataclasses
import json
import math
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs.pipelines import qwen3_gsm8k, qwen3_tiny, r1_qwen3, r1_tiny
from rlvr_jax.config_types import ConfigError
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.model import hf
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.evals import thinking_budget
from rlvr_jax.program.parts import build
from rlvr_jax.program.runtime import metrics as metrics_lib
from rlvr_jax.program.studies import pipeline, pipeline_eval, rejection
from rlvr_jax.rewards import format as fmt


def _stage_settings(config):
    ps, base = pipeline.split_config(config)
    return ps, [
        settings_lib.settings_from_config(pipeline.stage_config(base, s, base.model.source))
        for s in ps.stages
    ]


def test_shipped_configs_build_every_stage():
    ps, built = _stage_settings(r1_tiny.get_config())
    assert [s.name for s in ps.stages] == ["sft_cold", "rl", "rs_sft", "rm", "rl_general"]
    assert [s.train.stage for s in built] == ["sft", "rl", "sft", "rm", "rl"]
    assert [s.train.steps for s in built] == [60, 40, 30, 300, 20]
    assert [s.rejection_samples for s in ps.stages] == [0, 0, 4, 0, 0]
    assert all(s.sft.export for s in built)
    assert ps.baseline == "sft_cold" and ps.eval_ks == (1, 4, 8)
    # The stages differ from the base only where their overrides say.
    assert built[0].data == built[1].data == built[2].data == built[4].data
    assert built[4].reward.rm_path == "@rm" and built[1].reward.rm_path == ""

    config = r1_qwen3.get_config("traces=/data/traces.jsonl,prefs=/data/prefs.jsonl")
    config.model.source = "random:qwen3-0.6b"  # no weights offline; the settings are the point
    ps, built = _stage_settings(config)
    assert built[0].sft.path == "/data/traces.jsonl" and built[2].sft.path == ""
    assert built[1].reward.verifier == "math" and built[1].reward.format == "r1"
    assert ps.baseline == "rl" and ps.stages[2].rejection_samples == 4
    assert [s.train.stage for s in built] == ["sft", "rl", "sft", "rm", "rl"]
    assert built[3].rm.path == "/data/prefs.jsonl" and built[4].reward.rm_path == "@rm"
    with pytest.raises(ValueError, match="unknown argument 'trace'"):
        r1_qwen3.get_config("trace=/data/traces.jsonl")

    config = qwen3_gsm8k.get_config()
    config.model.source = "random:qwen3-0.6b"
    ps, built = _stage_settings(config)
    assert [s.train.stage for s in built] == ["sft", "rl", "sft", "rl"]
    assert [s.fusion.switch for s in (ps.stages[0], ps.stages[2])] == ["enable_thinking"] * 2
    assert (built[3].data.modes, built[3].reward.format) == ("enable_thinking", "mode")
    assert built[1].data.template == "qwen3_thinking" and built[1].reward.format == "none"
    assert built[0].sft.response_format.replace("{answer}", "18") == "The answer is \\boxed{18}."
    assert ps.headline == "think acc." and dict(ps.eval_modes)["no_think"] == "qwen3_non_thinking"
    assert [s.rejection_samples for s in ps.stages] == [0, 0, 4, 0]


def test_qwen3_tiny_builds_every_stage_and_its_fusion_rows(tmp_path):
    config = qwen3_tiny.get_config()
    ps, built = _stage_settings(config)
    assert [s.train.stage for s in built] == ["sft", "rl", "sft", "rl"]
    assert [s.fusion.think_fraction if s.fusion else None for s in ps.stages] == [
        1.0, None, 0.5, None,
    ]  # fmt: skip
    assert (built[3].data.modes, built[3].reward.format, built[3].reward.format_weight) == (
        "flag", "mode", 0.5,
    )  # fmt: skip
    assert built[3].data.template == built[0].data.template  # the flags are in the questions
    assert built[1].data.template == qwen3_tiny.THINK and built[1].reward.verifier == "math"
    assert dict(ps.eval_modes) == {"think": qwen3_tiny.THINK, "no_think": qwen3_tiny.NO_THINK}
    assert ps.eval_think_budgets == (8, 16, 32) and ps.eval_budget_mode == "think"
    assert ps.headline == "think acc." and ps.eval_samples == 0
    assert ps.stages[2].rejection_samples == 0 and ps.baseline == "fusion"
    sampled, _ = pipeline.split_config(qwen3_tiny.get_config("samples=4"))
    assert sampled.stages[2].rejection_samples == 4 and sampled.baseline == ""
    with pytest.raises(ValueError, match="unknown argument 'sample'"):
        qwen3_tiny.get_config("sample=4")

    config.data.num_train = 64
    _, base = pipeline.split_config(config)
    tok = build.build_tokenizer(built[0].model)
    for stage, thinking in ((ps.stages[0], {True}), (ps.stages[2], {True, False})):
        c = pipeline.stage_config(base, stage, "random:tiny")
        path = pipeline.write_fusion_data(c, stage.fusion, tmp_path / stage.name / "fusion.jsonl")
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(rows) == 64
        modes = set()
        for row in rows:
            question, flag = row["prompt"].rsplit(" ", 1)
            value = str(eval(question))  # noqa: S307 - generated arithmetic
            assert row["response"].endswith(f"</think>\n\n#### {value}")
            modes.add(flag == "/think")
            empty = row["response"] == f"<think>\n\n</think>\n\n#### {value}"
            assert empty == (flag == "/no_think"), row
            tok.encode(row["prompt"] + "=" + row["response"])  # every character is in the alphabet
        assert modes == thinking
        # A rerun reads the rows it wrote.
        assert pipeline.write_fusion_data(c, stage.fusion, path).read_text() == path.read_text()


def test_fusion_thoughts_from_samples_drawn_in_thinking_mode(tmp_path, monkeypatch):
    """Qwen3's fusion stage: the policy is sampled on the thinking row's own prompt, and its
    verified thinking answers become the thinking rows (the sampler is replaced here by answers
    written by hand: the wiring is the point; the trimmed R1 pipeline below runs the same
    function with the real sampler, without the thinking switch)."""
    config = qwen3_tiny.get_config()
    config.data.num_train = 8
    ps, base = pipeline.split_config(config)
    stage = dataclasses.replace(ps.stages[2], rejection_samples=2)
    c = pipeline.stage_config(base, stage, "random:tiny")
    settings = settings_lib.settings_from_config(c)
    tok = build.build_tokenizer(settings.model)
    prompts = []

    def fake_generate(params, ids, score, *, group_size, **kw):
        prompts.extend(tok.decode(p) for p in ids)
        texts, correct = [], []
        for i, text in enumerate(prompts):
            value = eval(text.split(" ")[0])  # noqa: S307 - generated arithmetic
            # The first prompt gets no verified answer; the others one, in their second sample.
            texts += ["#### 0", f"<think>\nt{i}\n</think>\n\n#### {value}"]
            correct += [False, i > 0]
        return np.asarray(correct), np.asarray(texts, dtype=object)

    monkeypatch.setattr(rejection, "generate_in_batches", fake_generate)
    samples = tmp_path / "rejection.jsonl"
    rejection.sample_demonstrations(settings, 2, samples, log=print, thinking_switch="flag")
    assert len(prompts) == 8 and all(p.endswith(" /think=") for p in prompts)
    messages = []
    out = tmp_path / "f.jsonl"
    out = pipeline.write_fusion_data(c, stage.fusion, out, samples, messages.append)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 8
    thinking = [r for r in rows if r["prompt"].endswith("/think")]
    assert thinking and all(r["response"].startswith("<think>\nt") for r in thinking)
    assert rows[0]["prompt"].endswith("/no_think")  # no verified sample: no thought
    assert messages == [
        f"fusion data: {len(thinking)} thinking and {8 - len(thinking)} non-thinking rows; "
        "7 of 8 prompts have a thought from verified samples"
    ]
    with pytest.raises(ValueError, match="thinking modes need chat=True"):
        rejection.sample_demonstrations(settings, 2, samples, thinking_switch="enable_thinking")


def test_bad_pipelines_are_named(tmp_path):
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
    c.pipeline.stages[1]["overrides"]["reward.rm_path"] = "@rm"  # the rm stage comes later
    ps, base = pipeline.split_config(c)
    with pytest.raises(ConfigError, match="'rl': reward.rm_path='@rm' names no earlier reward"):
        pipeline._check_stages(base, ps)
    c = r1_tiny.get_config()
    c.pipeline.baseline = "rm"
    ps, base = pipeline.split_config(c)
    with pytest.raises(ConfigError, match="baseline='rm' is a reward-model stage"):
        pipeline._check_stages(base, ps)
    rl_general = pipeline.stage_config(base, ps.stages[4], "random:tiny")
    with pytest.raises(ConfigError, match="rm_path='@rm' names no earlier stage"):
        pipeline.resolve_stage_refs(rl_general, {"sft_cold": tmp_path})
    resolved = pipeline.resolve_stage_refs(rl_general, {"rm": tmp_path / "4_rm"})
    assert resolved.reward.rm_path == str(tmp_path / "4_rm")
    c = r1_tiny.get_config()
    c.pipeline.stages[1]["fusion"] = {"think_fraction": 0.5}
    ps, base = pipeline.split_config(c)
    with pytest.raises(ConfigError, match="'rl': fusion data needs train.stage='sft'"):
        pipeline._check_stages(base, ps)
    c.pipeline.stages[1]["fusion"] = {"think_fraction": 1.5}
    with pytest.raises(ConfigError, match="think_fraction=1.5"):
        pipeline.split_config(c)
    c = r1_tiny.get_config()
    c.pipeline.stages[2]["fusion"] = {"switch": "enable_thinking"}  # rs_sft, 4 samples
    ps, base = pipeline.split_config(c)
    with pytest.raises(ConfigError, match="'rs_sft': fusion samples with enable_thinking need a"):
        pipeline._check_stages(base, ps)
    c = qwen3_tiny.get_config()
    c.pipeline.eval_think_budgets = "8,16k"
    with pytest.raises(ConfigError, match="eval_think_budgets='8,16k' is not a list of integers"):
        pipeline.split_config(c)
    c = qwen3_tiny.get_config()
    c.pipeline.stages[0]["fusion"]["think_fraction"] = "all"
    with pytest.raises(ConfigError, match=r"stages\[0\].fusion=.*'all'"):
        pipeline.split_config(c)
    c = qwen3_tiny.get_config()
    c.pipeline.eval_budget_mode = "thinking"
    with pytest.raises(ConfigError, match="eval_budget_mode='thinking'"):
        pipeline.split_config(c)
    c = qwen3_tiny.get_config()
    c.pipeline.eval_modes = {"think": "txt:{question}"}
    with pytest.raises(ConfigError, match="eval_modes.think: prompt template 'txt:{question}'"):
        pipeline._check_stages(*reversed(pipeline.split_config(c)))
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
    for r, think in zip(rows, (0.5, 0.75, 0.25, 0.5), strict=True):
        r["eval"]["think acc."] = think
    table = pipeline_eval.markdown_table(rows, headline="think acc.").splitlines()
    assert table[0] == "| stage | steps | greedy acc. | think acc. | format rate | Δ think acc. |"
    assert table[4] == "| 2_rl | 5 | 0.375 | 0.250 | n/a | -0.500 |"
    # An RL stage's useful trajectories per hour: a column after the steps, n/a for the others.
    rows[2]["useful_per_hour"] = 1234.4
    rows[1]["useful_per_hour"] = None  # an SFT stage's record
    table = pipeline_eval.markdown_table(rows).splitlines()
    assert table[0] == (
        "| stage | steps | useful / h | greedy acc. | think acc. | format rate | Δ acc. |"
    )
    assert table[3] == "| 1_sft | 10 | n/a | 0.500 | 0.750 | n/a | +0.250 |"
    assert table[4] == "| 2_rl | 5 | 1234 | 0.375 | 0.250 | n/a | -0.125 |"


def test_a_multi_turn_tasks_row_has_its_tool_rates():
    everything = {"mean@1": 0.5, "length/mean": 80.0, "length/truncated": 0.0}
    episodes = {"tool_call_rate": 0.75, "tool_calls": 1.0, "tool_errors": 0.25, "turns": 2.0}
    result = {"greedy": {"all": everything, "arithmetic": everything}, "episodes": episodes}
    assert pipeline_eval.summarize(result, {}) == {
        "greedy acc.": 0.5,
        "length": 80.0,
        "truncated": 0.0,
        "tool-call rate": 0.75,
        "tool errors": 0.25,
    }
    del result["episodes"]
    assert "tool-call rate" not in pipeline_eval.summarize(result, {})


def test_thinking_blocks_and_think_tokens():
    assert fmt.has_thought("<think>\n47+30=77\n</think>\n\n#### 77")
    assert fmt.has_thought("<think>\n47+3")  # never closed, but something in it
    assert not fmt.has_thought("<think>\n\n</think>\n\n#### 77")
    assert not fmt.has_thought("#### 77 </think> 4")
    c = pipeline.split_config(qwen3_tiny.get_config())[1]
    s = settings_lib.settings_from_config(c)
    tok = build.build_tokenizer(s.model)
    filled = thinking_budget.with_think_tokens(s, tok).rl.sampler
    assert tok.decode(filled.think_open) == "<think>" and len(filled.think_open) == 7
    assert tok.decode(filled.think_close) == "</think>"
    assert tok.decode(filled.think_stop) == "\n</think>"
    c.rl.sampler.think_open, c.rl.sampler.think_close = (5,), (6,)
    c.rl.sampler.think_stop = (6,)
    s = settings_lib.settings_from_config(c)
    assert thinking_budget.with_think_tokens(s, tok) is s  # the config's own are kept


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
    cold, _, rs, rm, _ = c.pipeline.stages
    cold["overrides"]["train.steps"] = 40  # enough for some verified answers to sample
    rs["overrides"]["train.steps"] = rs_steps
    rs["rejection_samples"] = 2
    rm["overrides"]["train.steps"] = 2
    c.rm.num_eval = 16
    c.pipeline.stages = [cold, rs, rm]
    c.pipeline.eval_samples = 2
    c.pipeline.eval_ks = "1,2"
    # A mode whose template is the base's: its greedy results must be the suite's own.
    c.pipeline.eval_modes = {"plain": c.data.template}
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
    # The reward-model stage: from the last policy's weights, not a row, not in the step count.
    (rm,) = out["reward_models"]
    assert (rm["stage"], rm["steps"], rm["kind"]) == ("3_rm", 2, "rm")
    assert rm["started_from"] == out["rows"][2]["source"]
    assert 0 <= rm["eval"]["eval/accuracy"] <= 1
    assert (tmp_path / "3_rm" / "checkpoints" / "2").is_dir()
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
    for row in out["rows"]:
        e = row["eval"]
        assert (e["plain acc."], e["plain length"]) == (e["greedy acc."], e["length"])
        assert e["plain thought rate"] == 0.0
    table = (tmp_path / "pipeline.md").read_text()
    assert table == out["table"]
    for label in [*labels, "baseline_sft_cold"]:
        assert f"| {label} |" in table
    assert out["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # A rerun trains nothing; a longer last stage (train.steps may change on resume) resumes it
    # from its checkpoint at step 2 and leaves the stage before it alone.
    ledgers = {label: tmp_path / label / "metrics.jsonl" for label in [*labels[1:], "3_rm"]}
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
    assert ledgers["3_rm"].stat().st_mtime_ns == stamps["3_rm"]

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
