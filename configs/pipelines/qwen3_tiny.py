"""Qwen3's recipe in miniature: long-CoT cold start -> reasoning RL -> thinking-mode fusion.

Command (CPU):
  python -m rlvr_jax.pipeline --config=configs/pipelines/qwen3_tiny.py --workdir=/tmp/qwen3_tiny

A from-scratch 2-layer model (`configs/tiny.py`'s) with a character tokenizer on two-digit
addition and subtraction (arithmetic level 2), checked by the math verifier on the text after
the thinking block ("#### <answer>"). The thought of each training problem is its column
arithmetic (`sft.traces`: "47+38" -> "47+30=77\\n77+8=85"). The mode is chosen per prompt by a
flag after the question, as Qwen3's "/think" and "/no_think" (`sft.fusion`, switch "flag"):
  "47+38 /think=<think>\\n47+30=77\\n77+8=85\\n</think>\\n\\n#### 85"
  "47+38 /no_think=<think>\\n\\n</think>\\n\\n#### 85"
The stages:
  1. think_sft: the long-CoT cold start, SFT on thinking rows only (every training problem with
     its thought, flag "/think");
  2. rl_think: GRPO on the "/think" prompts with the math verifier;
  3. fusion: SFT on half thinking, half non-thinking rows (seeded per problem), so that one
     model answers in both modes;
  4. rl_general: 40 GRPO steps (lr 1e-4) on prompts of both modes (`data.modes="flag"`, half
     of them "/think"), rewarded for the answer and, with weight 0.5, for following the mode
     ("mode" format: a non-empty thinking block under "/think", none under "/no_think"), as
     Qwen3's general RL.
The baseline spends the same number of steps on the fusion SFT alone, from the start.

`--config=configs/pipelines/qwen3_tiny.py:samples=4` is Qwen3's own fusion stage: its thinking
rows are the RL model's answers, 4 sampled per training problem under "/think" and verified
(`program.studies.rejection`); a problem with no verified answer keeps only its non-thinking row.
That variant has no baseline: the random starting model has no verified answers to sample.

After every stage, on 64 held-out problems: greedy accuracy with no flag (a prompt no stage
trained on), and under each flag ("think", "no_think") greedy accuracy, length and the share of
responses with a non-empty thinking block; then greedy accuracy and the early-end rate at
thinking budgets of 8, 16 and 32 tokens under "/think" (the budget counts every token
after "<think>" until "</think>" is complete: the example above needs 26).

Output: /tmp/qwen3_tiny/pipeline.md (the table, also printed), pipeline.png and one workdir per
stage.

Expected result (measured on a 2-core CPU, 2026-12-02, about 10 min; the whole table is in
docs/pipelines.md): "/think" accuracy 0.797 after the cold start, 0.844 after RL, 0.844 after
fusion, 0.875 after general RL; "/no_think" 0.000 after fusion, with an empty thinking block in
every answer; budgets of 8 and 16 tokens end nearly every thought and leave about 0.1; the
1,580-step fusion-only baseline 0.375 "/think", 0.125 "/no_think". Another CPU gave 0.859 after
the cold start: float results differ between machines.
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
