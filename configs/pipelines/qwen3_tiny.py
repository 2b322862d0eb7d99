"""Qwen3's recipe in miniature: long-CoT cold start -> reasoning RL -> thinking-mode fusion ->
general RL.

Command (CPU; `:samples=4` takes the fusion stage's thinking rows from the RL model, verified):
  python -m rlvr_jax.pipeline --config=configs/pipelines/qwen3_tiny.py --workdir=/tmp/qwen3_tiny

Model and task: `configs/tiny.py`'s from-scratch 2-layer model with a character tokenizer on
two-digit addition and subtraction, the math verifier on the text after the thinking block. A
problem's thought is its column arithmetic, the mode a flag after the question:
  "47+38 /think=<think>\\n47+30=77\\n77+8=85\\n</think>\\n\\n#### 85"
Stages: think_sft (1,200 SFT steps on thinking rows), rl_think (40 GRPO steps on "/think"),
fusion (300 SFT steps, half thinking, half non-thinking rows), rl_general (40 GRPO steps, lr
1e-4, both modes, rewarded for the answer and, with weight 0.5, for following the mode).
Baseline: the fusion SFT alone for the same 1,580 steps. Evaluated on 64 held-out problems,
greedy, under each flag and at thinking budgets of 8, 16 and 32 tokens.

Expected result (2-core CPU, 2026-12-02, about 10 min; docs/pipelines.md): "/think" accuracy
0.797 after the cold start, 0.844 after RL, 0.844 after fusion, 0.875 after general RL;
"/no_think" 0.000 after fusion; the baseline 0.375 "/think", 0.125 "/no_think". Another CPU
gave 0.859 after the cold start: float results differ between machines.
"""

import ml_collections

from configs import tiny

# Digits and operators, the answer marker, the think tags and the mode flags.
ALPHABET = "0123456789+-*=# <>/\nthinko_"
THINK = "text:{question} /think="
NO_THINK = "text:{question} /no_think="


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    args = dict(kv.split("=", 1) for kv in (arg or "").split(",") if kv)
    unknown = sorted(set(args) - {"samples"})
    if unknown:
        raise ValueError(f"unknown argument {unknown[0]!r}; known: samples=N")
    samples = int(args.get("samples", 0))
    c = tiny.get_config()
    c.model.tokenizer = "chars:" + ALPHABET
    c.data.level = 2
    c.data.num_train = 2048
    c.data.num_eval = 64
    c.data.buckets = (16,)  # "47+38 /no_think="
    c.reward.verifier = "math"
    c.reward.format_weight = 0.0
    c.rl.sampler.max_new_tokens = 48  # the longest training answer: 47 tokens, end included
    c.train.batch_prompts = 16
    c.train.checkpoint_every = 50
    c.train.eval_every = 0  # the pipeline evaluates after every stage
    c.eval.in_stage = False  # not the RL stages themselves too, before and after
    c.train.log_every = 20
    c.train.use_tensorboard = False
    c.sft.buckets = (64,)
    c.sft.batch_size = 64
    c.sft.eval = False
    c.sft.response_format = "#### {answer}"
    c.pipeline = ml_collections.ConfigDict(
        {
            "stages": [
                {
                    "name": "think_sft",
                    "overrides": {
                        "train.stage": "sft",
                        "train.steps": 1200,
                        "optim.learning_rate": 3e-3,
                    },
                    "fusion": {"think_fraction": 1.0},
                },
                {
                    "name": "rl_think",
                    "overrides": {
                        "train.stage": "rl",
                        "train.steps": 40,
                        "optim.learning_rate": 3e-4,
                        "data.template": THINK,
                    },
                },
                {
                    "name": "fusion",
                    "overrides": {
                        "train.stage": "sft",
                        "train.steps": 300,
                        "optim.learning_rate": 1e-3,
                    },
                    "fusion": {"think_fraction": 0.5},
                    "rejection_samples": samples,
                },
                {
                    "name": "rl_general",
                    "overrides": {
                        "train.stage": "rl",
                        "train.steps": 40,
                        # 3e-4 (rl_think's) cost 0.094 of "/think" accuracy here (docs/pipelines.md)
                        "optim.learning_rate": 1e-4,
                        "data.modes": "flag",
                        "reward.format": "mode",
                        "reward.format_weight": 0.5,
                    },
                },
            ],
            "baseline": "" if samples else "fusion",
            "eval_samples": 0,  # greedy only: the modes are the point here
            "headline": "think acc.",
            "eval_modes": {"think": THINK, "no_think": NO_THINK},
            "eval_think_budgets": "8,16,32",
            "eval_budget_mode": "think",
        }
    )
    return c
