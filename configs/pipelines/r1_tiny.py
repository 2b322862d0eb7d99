"""The DeepSeek-R1 recipe in miniature: SFT cold start -> RL -> rejection-sampled SFT -> RL with
a reward model.

Command (CPU):
  python -m rlvr_jax.pipeline --config=configs/pipelines/r1_tiny.py --workdir=/tmp/r1_tiny

The model, tokenizer, task and template are `configs/tiny.py`'s: a 2-layer from-scratch model on
single-digit addition, verified in JAX over tokens. The stages:
  1. sft_cold: supervised cold start on demonstrations (the training problems with their answer
     as the response: at this scale the "traces" are the answers), 60 steps;
  2. rl: GRPO with the correctness reward plus 0.5 x format (a number, then the end token),
     from the cold start's weights, 40 steps;
  3. rs_sft: 4 answers sampled per training problem from the RL policy, the verified ones kept
     (distinct), and 30 SFT steps on them;
  4. rm: a reward model (the rs_sft policy with a scalar head, Bradley-Terry loss) on pairs
     built from the training problems, the right answer chosen over another problem's, 300
     steps; not a policy stage (no row in the table, its pairwise accuracy in the log);
  5. rl_general: R1's last stage, GRPO with the reward model's score (whitened per batch,
     weight 0.5) beside the verifier's correctness and format, from the rs_sft policy, 20 steps.
The baseline branch spends the same 150 policy steps on the cold start's SFT alone, from the same
starting model (`--config.pipeline.baseline=rl` spends them on RL alone instead). After every
stage the same suite runs on the 64 held-out problems: greedy accuracy, pass@1/4/8 and mean@8
from 8 samples at temperature 1, length, truncation, format and language-consistency rates.

Output: /tmp/r1_tiny/pipeline.md (the table, also printed), pipeline.png, and one workdir per
stage (`1_sft_cold/`, `2_rl/`, `3_rs_sft/`, `4_rm/`, `5_rl_general/`, `baseline_sft_cold/`); a
rerun skips finished stages and resumes a partly trained one.

Expected result (measured on a 2-core CPU shared with other jobs, 2026-12-02; the whole table is
in docs/pipelines.md): greedy held-out accuracy 0.000 (start) -> 0.453 (sft_cold) -> 0.516 (rl)
-> 0.625 (rs_sft) -> 0.609 (rl_general), pass@8 0.953 at the end; the reward model's held-out
pairwise accuracy 0.859; the 150-step SFT-only baseline 0.797 greedy, 0.984 pass@8.
2 min 1 s with an empty compile cache, 1 min 39 s with most programs in it.
"""

import ml_collections

from configs import tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = tiny.get_config(arg)
    c.train.checkpoint_every = 20
    c.train.eval_every = 0  # the pipeline evaluates after every stage
    c.eval.in_stage = False  # not the RL stages themselves too, before and after
    c.train.log_every = 10
    c.train.use_tensorboard = False
    c.sft.buckets = (8,)  # "9+9=18" and the end token
    c.sft.batch_size = 32
    c.sft.eval = False
    c.rm.batch_size = 32
    c.rm.num_eval = 64
    c.rm.buckets = (8,)
    c.pipeline = ml_collections.ConfigDict(
        {
            "stages": [
                {
                    "name": "sft_cold",
                    "overrides": {
                        "train.stage": "sft",
                        "train.steps": 60,
                        "optim.learning_rate": 3e-3,
                    },
                },
                {
                    "name": "rl",
                    "overrides": {
                        "train.stage": "rl",
                        "train.steps": 40,
                        "optim.learning_rate": 3e-4,
                    },
                },
                {
                    "name": "rs_sft",
                    "overrides": {
                        "train.stage": "sft",
                        "train.steps": 30,
                        "optim.learning_rate": 1e-3,
                    },
                    "rejection_samples": 4,
                },
                {
                    "name": "rm",
                    "overrides": {
                        "train.stage": "rm",
                        "train.steps": 300,
                        "optim.learning_rate": 3e-3,
                    },
                },
                {
                    "name": "rl_general",
                    "overrides": {
                        "train.stage": "rl",
                        "train.steps": 20,
                        "optim.learning_rate": 3e-4,
                        "reward.rm_path": "@rm",
                        "reward.rm_weight": 0.5,
                        "reward.rm_norm": "batch",
                    },
                },
            ],
            "baseline": "sft_cold",
            "eval_samples": 8,
            "eval_ks": "1,4,8",
            "eval_temperature": 1.0,
        }
    )
    return c
