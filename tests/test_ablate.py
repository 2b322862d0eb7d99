"""The ablation study: variant configs, the statistics, a trimmed study end to end, the CLI."""

import dataclasses
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from configs import ablation as ablation_config
from rlvr_jax.config_types import ConfigError
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.runtime import metrics as metrics_lib
from rlvr_jax.program.studies import ablation


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
            {"step": 2, "record": "final", "eval/accuracy": 0.5},  # shares the last step
        ],
    )  # fmt: skip
    assert [e["step"] for e in metrics_lib.step_rows(entries)] == [1, 2]
    result = {
        "rows_per_step": 8,
        "eval_before": {"eval/accuracy": 0.25, "eval/length": 3.0},
        "eval_after": {"eval/accuracy": 0.5, "eval/length": 2.0},
    }
    s = ablation.run_stats(entries, result)
    assert s["zero_variance"] == pytest.approx(0.375)
    # Under 4 steps every step counts: 4 + 2 correct of lengths 2 and 3, 4 + 6 wrong of 4 and 5.
    assert s["len_correct"] == pytest.approx((4 * 2 + 2 * 3) / 6)
    assert s["len_incorrect"] == pytest.approx((4 * 4 + 6 * 5) / 10)
    assert s["successes"] == pytest.approx(6.0)
    # Step 1 (compilation) is left out: 2 successes in 1 s.
    assert s["successes_per_minute"] == pytest.approx(120.0)
    # The table's throughput: useful trajectories per hour, step 1 left out: 6 in 1 s.
    assert s["useful_per_hour"] == pytest.approx(3600 * 6.0)
    summary = ablation.summarize({"grpo": [s, {**s, "acc_after": 0.75}]})
    assert summary["grpo"]["acc_after"] == pytest.approx((0.625, math.sqrt(0.03125)))
    table = ablation.markdown_table(summary, 2).splitlines()
    assert table[0].endswith("| zero-var. groups | useful / h |")
    (row,) = [line for line in table if line.startswith("| grpo |")]
    assert row.endswith("| 0.375 | 21600 |")
    # A ledger from before the metric: n/a in the table.
    old = [{k: v for k, v in e.items() if k != "useful/trajectories"} for e in entries]
    s_old = ablation.run_stats(old, result)
    assert math.isnan(s_old["useful_per_hour"])
    assert ablation.markdown_table(ablation.summarize({"grpo": [s_old]}), 1).count("| n/a |") == 1


def test_grad_norm_by_success_by_hand():
    entries = [
        {"step": 1, "groups/grad_norm": [1.0, 3.0, 2.0], "groups/success_rate": [0.0, 0.0, 0.5]},
        {"step": 2, "groups/grad_norm": [5.0], "groups/success_rate": [1.0]},
    ]
    entries.append({"step": 2, "record": "final", "groups/grad_norm": [9.0]})  # not a step row
    out = ablation.grad_norm_by_success([entries], 2)
    np.testing.assert_allclose(out, [2.0, 2.0, 5.0])
    assert np.isnan(ablation.grad_norm_by_success([[{"step": 1}]], 2)).all()


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
        assert f"| {name} | {ablation.VARIANTS[name][0]} | {acc:.3f} ± 0.000 |" in table
        zero_var = np.mean([e["adv/frac_zero_variance"] for e in steps])
        assert summary["per_seed"][name][0]["zero_variance"] == pytest.approx(zero_var)
        for e in steps:  # the per-prompt diagnostic: one finite norm per group
            norms, rates = e["groups/grad_norm"], e["groups/success_rate"]
            assert len(norms) == len(rates) == 4
            assert all(n >= 0 and math.isfinite(n) for n in norms)
            hist = np.bincount(np.rint(np.asarray(rates) * 4).astype(int), minlength=5)
            assert hist.tolist() == e["groups/success_hist"]
    assert out["warm_start"]["source"].endswith("hf")
    names = sorted(p.name for p in out["plots"])
    assert names == ["accuracy.png", "grad_norm_vs_success.png", "length.png", "success_hist.png"]
    for p in out["plots"]:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # A second call trains nothing and redraws the same table.
    ledgers = sorted((tmp_path / "runs").glob("*/seed_0/metrics.jsonl"))
    stamps = [p.stat().st_mtime_ns for p in ledgers]
    again = ablation.run_ablation(c, tmp_path, log=messages.append)
    assert again["table"] == table
    assert [p.stat().st_mtime_ns for p in ledgers] == stamps and len(ledgers) == 2


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
