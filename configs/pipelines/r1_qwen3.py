"""The DeepSeek-R1 recipe on Qwen3-0.6B, for one accelerator: SFT cold start -> RL -> RS-SFT ->
RL with a reward model.

Command (a TPU VM or a GPU host, 32 GiB or more; GSM8K from the hub or `--config.data.path`):
  python -m rlvr_jax.pipeline --workdir=runs/r1_qwen3 \\
      --config=configs/pipelines/r1_qwen3.py:traces=/data/traces.jsonl,prefs=/data/prefs.jsonl
`traces=`: the cold start's {"prompt", "response"} rows in the R1 format; without it, GSM8K's
answers with an empty thought (the format, not reasoning). `prefs=`: the reward model's
{"prompt", "chosen", "rejected"} rows; without it, the gold answer over another problem's.

Model and task: `configs/qwen_small.py:qwen3` (bf16, remat, the R1-Zero template, the math
verifier plus 0.1 x the R1 format, 512 new tokens). Stages: sft_cold (200 SFT steps of 32, lr
1e-5); rl (200 GRPO steps of 32 x 8, lr 1e-6); rs_sft (4 answers per problem from the RL
policy, the verified kept, 100 SFT steps, lr 5e-6); rm (200 Bradley-Terry steps); rl_general
(100 GRPO steps with the reward model's score, whitened, weight 0.5). Baseline: RL alone for
600 steps. Evaluated on 256 GSM8K test problems.

Expected result: not measured (no accelerator or Qwen weights were available); only the settings
are checked (tests/test_pipeline.py). Treat the step counts and learning rates as a start.
"""

import ml_collections

from configs import qwen_small


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    args = dict(kv.split("=", 1) for kv in (arg or "").split(",") if kv)
    unknown = sorted(set(args) - {"traces", "prefs"})
    if unknown:
        raise ValueError(f"unknown argument {unknown[0]!r}; known: traces=PATH, prefs=PATH")
    traces = args.get("traces", "")
    c = qwen_small.get_config("qwen3")
    c.sft.buckets = (512, 768)
    c.sft.batch_size = 32
    c.sft.eval = False
    c.sft.response_format = " </think> <answer>{answer}</answer>"
    c.train.eval_every = 0  # the pipeline evaluates after every stage
    c.eval.in_stage = False  # not the RL stages themselves too, before and after
    c.rm.path = args.get("prefs", "")
    c.rm.buckets = (512, 768)
    c.rm.batch_size = 16
    c.pipeline = ml_collections.ConfigDict(
        {
            "stages": [
                {
                    "name": "sft_cold",
                    "overrides": {
                        "train.stage": "sft",
                        "train.steps": 200,
                        "sft.path": traces,
                        "optim.learning_rate": 1e-5,
                    },
                },
                {"name": "rl", "overrides": {"train.stage": "rl", "train.steps": 200}},
                {
                    "name": "rs_sft",
                    "overrides": {
                        "train.stage": "sft",
                        "train.steps": 100,
                        "optim.learning_rate": 5e-6,
                    },
                    "rejection_samples": 4,
                },
                {
                    "name": "rm",
                    "overrides": {
                        "train.stage": "rm",
                        "train.steps": 200,
                        "optim.learning_rate": 5e-6,
                    },
                },
                {
                    "name": "rl_general",
                    "overrides": {
                        "train.stage": "rl",
                        "train.steps": 100,
                        "reward.rm_path": "@rm",
                        "reward.rm_weight": 0.5,
                        "reward.rm_norm": "batch",
                    },
                },
            ],
            "baseline": "rl",
            "eval_samples": 4,
            "eval_ks": "1,4",
            "eval_temperature": 1.0,
        }
    )
    return c
