"""The ablation study: variant configs, the statistics, a trimmed study end to end, the CLI."""

import dataclasses
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from configs import ablation as ablation_config
from configs import ablation_long
from rlvr_jax.config_types import ConfigError
from rlvr_jax.data import templates
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.parts import build
from rlvr_jax.program.runtime import metrics as metrics_lib
from rlvr_jax.program.studies import ablation
from rlvr_jax.program.studies import ablation_stats as stats
from rlvr_jax.sft import data as sft_data
from rlvr_jax.sft import traces


def _split(**section):
    c = ablation_config.get_config()
    for k, v in section.items():
        c.ablation[k] = v
    return ablation.split_config(c)


def test_every_variant_builds_settings_that_differ_only_where_named():
    settings, base = _split()
    assert settings.variants == ablation_config.VARIANTS
    assert settings.seeds == (0, 1, 2, 3, 4)
    built = {
        name: settings_lib.settings_from_config(ablation.variant_config(base, name, 7, settings))
        for name in settings.variants
    }
    grpo = built["grpo"]
    assert grpo.train.seed == 7
    assert (grpo.rl.advantage.estimator, grpo.rl.advantage.std_scaling) == ("grpo", "group")
    assert grpo.rl.loss.aggregation == "seq_mean_token_mean"
    assert built["dr_grpo"].rl.advantage.std_scaling == "none"
    assert built["dr_grpo"].rl.loss.aggregation == "dr_grpo_constant"
    assert built["rloo"].rl.advantage.estimator == "rloo"
    assert built["grpo_no_std"].rl.advantage.std_scaling == "none"
    assert built["token_mean"].rl.loss.aggregation == "token_mean"
    assert built["kimi_length"].reward.length_weight == settings.kimi_length_weight > 0
    assert built["curriculum"].data.sampler == "curriculum"
    ei = built["expert_iteration"]
    assert (ei.rl.advantage.estimator, ei.rl.loss.policy_loss) == ("expert_iteration", "reinforce")
    ppo = built["ppo"]
    assert (ppo.rl.advantage.estimator, ppo.rl.critic.kind) == ("gae", "model")
    assert all(s.rl.critic.kind == "none" for name, s in built.items() if name != "ppo")
    for name, s in built.items():
        # Same prompts and budget everywhere.
        same = dataclasses.replace(s.data, sampler="epoch")
        assert same == dataclasses.replace(grpo.data, sampler="epoch"), name
        assert (s.train.steps, s.train.batch_prompts, s.rl.group_size) == (
            grpo.train.steps,
            grpo.train.batch_prompts,
            grpo.rl.group_size,
        )
        assert s.rl.sampler == grpo.rl.sampler, name


def test_qwen_config_builds():
    settings, base = ablation.split_config(ablation_config.get_config("qwen"))
    s = settings_lib.settings_from_config(ablation.variant_config(base, "rloo", 0, settings))
    assert s.reward.verifier == "math" and s.rl.group_grad_norms
    assert settings.warm_start_steps == 0


def test_long_answer_config_builds_every_variant():
    """configs/ablation_long.py: the step-by-step cold start and room for longer answers."""
    settings, base = ablation.split_config(ablation_long.get_config())
    assert settings.variants == ablation_config.VARIANTS and len(settings.seeds) >= 3
    assert settings.warm_start_steps > 0 and settings.pass_at_k_samples >= max(settings.pass_at_k)
    for name in settings.variants:
        s = settings_lib.settings_from_config(ablation.variant_config(base, name, 0, settings))
        assert s.sft.response_format == "{thought}" and s.data.level == 3
        assert s.rl.sampler.max_new_tokens >= 2 * 40  # twice the longest worked answer
    # Every worked answer of the training prompts fits the cold start's sequence bucket.
    sft = settings_lib.settings_from_config(base)
    tok = build.build_tokenizer(sft.model)
    template = templates.get_template(sft.data.template)
    demos = sft_data.demonstrations_from_examples(
        build.load_examples(sft.data)[0], sft.sft.response_format, traces.thought_for
    )
    enc = sft_data.encode_demonstrations(demos, template, tok, max(sft.sft.buckets))
    assert enc.num_too_long == 0 and len(enc.ids) == sft.data.num_train
    assert min(len(d.response) for d in demos) >= 10


def test_bad_settings_are_named():
    with pytest.raises(ConfigError, match="'a2c'"):
        _split(variants="grpo,a2c")
    with pytest.raises(ConfigError, match="seeds"):
        _split(seeds="0,0")
    c = ablation_config.get_config()
    c.ablation.sedes = "1"
    with pytest.raises(ConfigError, match="ablation.sedes"):
        ablation.split_config(c)
    settings, base = _split()
    with pytest.raises(ConfigError, match="'rl.loss.aggregaton'"):
        ablation.override(base, "rl.loss.aggregaton", "token_mean")
    with pytest.raises(ConfigError, match="ks="):
        _split(pass_at_k={"samples": 4, "ks": "0,4"})
    with pytest.raises(ConfigError, match="ablation.pass_at_k.temperature"):
        _split(pass_at_k={"samples": 4, "temperature": 0.5})
    settings, _ = _split(pass_at_k={"samples": 4, "ks": "1,4"})
    assert (settings.pass_at_k_samples, settings.pass_at_k) == (4, (1, 4))


def _ledger(tmp_path, entries):
    with open(tmp_path / "metrics.jsonl", "w") as f:
        for e in entries:
            f.write(json.dumps({"time": 0.0, **e}) + "\n")
    return metrics_lib.read_metrics(tmp_path)


def test_run_stats_by_hand(tmp_path):
    entries = _ledger(
        tmp_path,
        [
            {"step": 0, "record": "eval", "eval/accuracy": 0.25},
            {"step": 1, "record": "step", "accuracy": 0.5, "time/step": 30.0,
             "adv/frac_zero_variance": 0.5, "length/correct": 2.0, "length/incorrect": 4.0,
             "useful/trajectories": 4.0},
            {"step": 2, "record": "step", "accuracy": 0.25, "time/step": 1.0,
             "adv/frac_zero_variance": 0.25, "length/correct": 3.0, "length/incorrect": 5.0,
             "useful/trajectories": 6.0},
            {"step": 3, "record": "step", "accuracy": 0.0, "time/step": 1.0,
             "adv/frac_zero_variance": 1.0, "length/correct": None, "length/incorrect": 7.0,
             "useful/trajectories": 0.0},
            {"step": 4, "record": "step", "accuracy": 1.0, "time/step": 2.0,
             "adv/frac_zero_variance": 1.0, "length/correct": 6.0, "length/incorrect": None,
             "useful/trajectories": 0.0},
            {"step": 4, "record": "final", "eval/accuracy": 0.5},  # shares the last step
        ],
    )  # fmt: skip
    assert [e["step"] for e in metrics_lib.step_rows(entries)] == [1, 2, 3, 4]
    result = {
        "rows_per_step": 8,
        "eval_before": {"eval/accuracy": 0.25, "eval/length": 3.0},
        "eval_after": {"eval/accuracy": 0.5, "eval/length": 2.0},
    }
    passk = {"pass@1": 0.25, "pass@4": 0.75, "mean@4": 0.25, "greedy": 0.5, "samples": 4}
    s = stats.run_stats(entries, result, passk)
    assert s["zero_variance"] == pytest.approx((0.5 + 0.25 + 1 + 1) / 4)
    # First quarter (step 1): 4 correct of length 2, 4 wrong of length 4. Last quarter (step 4):
    # 8 correct of length 6, no wrong one.
    assert (s["len_correct_first"], s["len_incorrect_first"]) == (2.0, 4.0)
    assert s["len_correct"] == 6.0 and math.isnan(s["len_incorrect"])
    assert math.isnan(s["len_gap"]) and math.isnan(s["len_incorrect_growth"])
    assert (s["pass@1"], s["pass@4"], s["mean@4"]) == (0.25, 0.75, 0.25)
    assert "greedy" not in s and "samples" not in s
    assert s["successes"] == pytest.approx(4 + 2 + 0 + 8)
    # Step 1 (compilation) is left out: 2 + 0 + 8 successes in 4 s.
    assert s["successes_per_minute"] == pytest.approx(60 * 10 / 4)
    # The table's throughput: useful trajectories per hour, step 1 left out: 6 in 4 s.
    assert s["useful_per_hour"] == pytest.approx(3600 * 6.0 / 4)
    # Three steps or fewer: every step is first and last quarter.
    short = stats.run_stats(entries[:3], result)
    assert short["len_correct"] == short["len_correct_first"] == pytest.approx((8 + 6) / 6)
    assert short["len_incorrect_growth"] == 0.0
    assert short["len_gap"] == pytest.approx((4 * 4 + 6 * 5) / 10 - (8 + 6) / 6)

    summary = stats.summarize({"grpo": [s, {**s, "acc_after": 0.75}], "dr_grpo": [short]})
    sd = math.sqrt(0.03125)
    assert summary["grpo"]["acc_after"] == pytest.approx((0.625, sd, sd / math.sqrt(2)))
    assert summary["dr_grpo"]["acc_after"] == (0.5, 0.0, 0.0)
    assert "pass@4" not in summary["dr_grpo"]  # its runs had no pass@k
    table = stats.markdown_table(summary, 2).splitlines()
    assert table[0].startswith("| variant | held-out greedy | gain | pass@1 | pass@4 |")
    assert table[0].endswith("| zero-var. groups | useful / h |")
    assert len(table[1].split("|")) == len(table[0].split("|"))
    (row,) = [line for line in table if line.startswith("| grpo |")]
    assert row.startswith(f"| grpo | 0.625 ± {sd / math.sqrt(2):.3f} | +0.375 ± ")
    assert "| 0.250 ± 0.000 | 0.750 ± 0.000 | 2.0 → 6.0 ± 0.0 | 4.0 → n/a | n/a |" in row
    assert row.endswith("| 0.688 ± 0.000 | 5400 ± 0 |")
    (row,) = [line for line in table if line.startswith("| dr_grpo (1 seed) |")]
    assert "| n/a | n/a |" in row  # no pass@k for this run
    contrasts = stats.contrast_table(summary).splitlines()
    (row,) = [line for line in contrasts if line.startswith("| grpo − dr_grpo |")]
    assert row.startswith(
        f"| grpo − dr_grpo | both of Dr. GRPO's changes | +0.125 ± {sd / math.sqrt(2):.3f} |"
    )
    assert len(contrasts) == 2 + 1 + 2  # header, one pair, the note
    assert stats.contrast_table({"grpo": summary["grpo"]}) == ""
    # A ledger from before the metric: n/a in the table.
    old = [{k: v for k, v in e.items() if k != "useful/trajectories"} for e in entries]
    s_old = stats.run_stats(old, result)
    assert math.isnan(s_old["useful_per_hour"])
    (row,) = [
        line
        for line in stats.markdown_table(stats.summarize({"grpo": [s_old]}), 1).splitlines()
        if line.startswith("| grpo |")
    ]
    assert row.endswith("| n/a |")


def test_grad_norm_by_success_by_hand():
    entries = [
        {"step": 1, "groups/grad_norm": [1.0, 3.0, 2.0], "groups/success_rate": [0.0, 0.0, 0.5]},
        {"step": 2, "groups/grad_norm": [5.0], "groups/success_rate": [1.0]},
    ]
    entries.append({"step": 2, "record": "final", "groups/grad_norm": [9.0]})  # not a step row
    out = stats.grad_norm_by_success([entries], 2)
    np.testing.assert_allclose(out, [2.0, 2.0, 5.0])
    assert np.isnan(stats.grad_norm_by_success([[{"step": 1}]], 2)).all()


def test_trimmed_study_end_to_end(tmp_path):
    c = ablation_config.get_config()
    # Two variants that share the step program (the sampler differs, on the host): one compile.
    c.ablation.variants = "grpo,difficulty_curriculum"
    c.ablation.seeds = "0"
    c.ablation.warm_start.steps = 1
    c.ablation.warm_start.batch_size = 8
    c.sft.eval = False  # the warm start's own evaluation is the SFT tests' business
    c.data.num_train = 32
    c.data.num_eval = 8
    c.eval.batch_prompts = 8
    c.train.steps = 3
    c.train.eval_every = 2
    c.train.batch_prompts = 4
    c.rl.group_size = 4
    c.rl.sampler.max_new_tokens = 4
    c.ablation.pass_at_k = {"samples": 2, "ks": "1,2,4"}
    messages = []
    out = ablation.run_ablation(c, tmp_path, log=messages.append)

    table = (tmp_path / "ablation.md").read_text()
    summary = json.loads((tmp_path / "summary.json").read_text())
    for name in ("grpo", "difficulty_curriculum"):
        run_dir = tmp_path / "runs" / name / "seed_0"
        result = json.loads((run_dir / "result.json").read_text())
        records = metrics_lib.read_metrics(run_dir)
        steps = metrics_lib.step_rows(records)
        assert [e["step"] for e in steps] == [1, 2, 3]
        assert [r["step"] for r in records if "eval/accuracy" in r] == [0, 2, 3]
        assert (
            metrics_lib.final_eval(records)["eval/accuracy"]
            == result["eval_after"]["eval/accuracy"]
        )
        acc = result["eval_after"]["eval/accuracy"]
        assert f"| {name} | {acc:.3f} ± 0.000 |" in table
        zero_var = np.mean([e["adv/frac_zero_variance"] for e in steps])
        assert summary["per_seed"][name][0]["zero_variance"] == pytest.approx(zero_var)
        # pass@k of the final checkpoint: k above the 2 samples dropped; its greedy accuracy is
        # the run's own final evaluation, the same weights.
        passk = json.loads((run_dir / ablation.PASS_AT_K).read_text())
        assert sorted(k for k in passk if k.startswith("pass@")) == ["pass@1", "pass@2"]
        assert passk["greedy"] == pytest.approx(acc) and passk["step"] == 3
        assert passk["pass@1"] == pytest.approx(passk["mean@2"])
        assert 0 <= passk["pass@1"] <= passk["pass@2"] <= 1
        assert summary["per_seed"][name][0]["pass@2"] == passk["pass@2"]
        for e in steps:  # the per-prompt diagnostic: one finite norm per group
            norms, rates = e["groups/grad_norm"], e["groups/success_rate"]
            assert len(norms) == len(rates) == 4
            assert all(n >= 0 and math.isfinite(n) for n in norms)
            hist = np.bincount(np.rint(np.asarray(rates) * 4).astype(int), minlength=5)
            assert hist.tolist() == e["groups/success_hist"]
    assert out["warm_start"]["source"].endswith("hf")
    names = sorted(p.name for p in out["plots"])
    assert names == [
        "accuracy.png",
        "grad_norm_vs_success.png",
        "length.png",
        "length_by_variant.png",
        "success_hist.png",
    ]
    for p in out["plots"]:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # A second call trains nothing and redraws the same table.
    ledgers = sorted((tmp_path / "runs").glob("*/seed_0/metrics.jsonl"))
    ledgers += sorted((tmp_path / "runs").glob(f"*/seed_0/{ablation.PASS_AT_K}"))
    stamps = [p.stat().st_mtime_ns for p in ledgers]
    again = ablation.run_ablation(c, tmp_path, log=messages.append)
    assert again["table"] == table
    assert [p.stat().st_mtime_ns for p in ledgers] == stamps and len(ledgers) == 4

    # Finished runs only: a seed that never ran is named under the table, not trained.
    c.ablation.seeds = "0,1"
    partial = ablation.run_ablation(c, tmp_path, log=messages.append, finished_only=True)
    assert partial["missing"] == ["grpo seed 1", "difficulty_curriculum seed 1"]
    assert not list((tmp_path / "runs").glob("*/seed_1"))
    assert (
        f"| grpo (1 seed) | {summary['per_seed']['grpo'][0]['acc_after']:.3f} ± 0.000 |"
        in (partial["table"])
    )
    assert partial["table"].endswith(
        "Not finished, left out (2): grpo seed 1, difficulty_curriculum seed 1.\n"
    )


def test_finished_only_without_runs_is_an_error(tmp_path):
    c = ablation_config.get_config()
    c.ablation.variants = "grpo"
    with pytest.raises(ConfigError, match="no finished run of \\('grpo',\\)"):
        ablation.run_ablation(c, tmp_path, log=lambda _: None, finished_only=True)
    assert not (tmp_path / "warm_start").exists()


def test_command_line_requires_config_and_workdir(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "rlvr_jax.ablate", f"--workdir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode != 0
    assert "--config=configs/ablation.py and --workdir=W are required" in result.stderr
    assert not (tmp_path / "ablation.md").exists()


def test_group_grad_norms_are_each_prompts_share_of_the_gradient():
    """With one group holding all the reward variance, its norm is the whole update's (SGD at
    lr 1) and the other groups' are zero."""
    import jax
    import jax.numpy as jnp
    import optax

    from rlvr_jax.data.tokenizer import Tokenizer
    from rlvr_jax.model import config as config_lib
    from rlvr_jax.model import transformer as tf
    from rlvr_jax.rl import state as state_lib
    from rlvr_jax.rl import train_step as ts
    from rlvr_jax.sampling.config import SamplerConfig
    from rlvr_jax.sampling.host import bucket_and_pad
    from rlvr_jax.types import FINISH_EOS, Rollout

    B, G = 4, 4
    tok = Tokenizer.from_characters("0123456789+-*=")
    cfg = config_lib.PRESETS["tiny"].replace(vocab_size=32)
    prompt_NP, lengths_N = bucket_and_pad(
        [tok.encode(f"{i}+{i}=") for i in range(B)], [8], tok.pad_id, G
    )
    T, N = 3, B * G
    tokens_NT = jax.random.randint(jax.random.key(2), (N, T), 0, 10)  # any digits will do
    rollout = Rollout(
        prompt_NP=jnp.asarray(prompt_NP),
        prompt_lengths_N=jnp.asarray(lengths_N),
        tokens_NT=tokens_NT,
        logp_NT=jnp.zeros((N, T)),
        mask_NT=jnp.arange(T)[None, :] < jnp.arange(N)[:, None] % T + 1,  # lengths 1, 2, 3
        injected_NT=jnp.zeros((N, T), bool),
        lengths_N=jnp.arange(N) % T + 1,
        finish_N=jnp.full((N,), FINISH_EOS),
    )
    sampler = SamplerConfig(max_new_tokens=T, eos_ids=tok.eos_ids, pad_id=tok.pad_id)
    rl = ts.RLConfig(group_size=G, sampler=sampler, group_grad_norms=True)
    sgd = optax.sgd(1.0)
    sched = state_lib.learning_rate_schedule(state_lib.OptimConfig(schedule="constant"))
    params = tf.init_params(jax.random.key(0), cfg)
    fresh = jax.tree.map(jnp.copy, params)  # the update donates the state
    state = state_lib.init_train_state(fresh, sgd, jax.random.key(1), use_reference=False)
    correct_N = jnp.asarray([1, 0, 0, 0] + [0] * G + [1] * G + [0] * G, jnp.float32)
    parts = {"correct": correct_N}
    new, out = ts.build_update(cfg, rl, sgd, sched)(state, rollout, correct_N, parts)
    metrics = out.metrics
    step_norm = optax.global_norm(jax.tree.map(jnp.subtract, new.params, params))
    norms = np.asarray(metrics["groups/grad_norm"])
    np.testing.assert_allclose(metrics["groups/success_rate"], [0.25, 0, 1, 0])
    assert norms[0] == pytest.approx(float(step_norm), rel=1e-4) and norms[0] > 0
    np.testing.assert_array_equal(norms[1:], 0.0)
