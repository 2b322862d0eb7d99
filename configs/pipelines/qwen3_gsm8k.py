"""Qwen3's recipe on Qwen3-0.6B and GSM8K, for one accelerator: long-CoT cold start -> reasoning
RL -> thinking-mode fusion -> general RL.

Command (a TPU VM or a GPU host, 32 GiB or more; GSM8K from the hub or `--config.data.path`):
  python -m rlvr_jax.pipeline --config=configs/pipelines/qwen3_gsm8k.py --workdir=runs/qwen3_gsm8k

Model and task: `configs/qwen_small.py:qwen3` with Qwen3's chat template in thinking mode and no
format reward; the thoughts are GSM8K's written solutions (`data.datasets.gsm8k_thought`), the
answers "The answer is \\boxed{N}.", the mode the template's `enable_thinking`, per row. Stages:
think_sft (200 SFT steps of 32 on thinking rows, lr 1e-5); rl_think (200 GRPO steps of 32 x 8,
lr 1e-6); fusion (100 SFT steps, lr 5e-6, half non-thinking rows, the thinking ones the RL
model's own verified answers, 4 sampled a problem); rl_general (100 GRPO steps on both modes,
rewarded for the answer and, with weight 0.5, for following the mode). Baseline: the fusion SFT
alone for 600 steps. Evaluated on 256 test problems: per mode accuracy, length and thought rate,
and accuracy at thinking budgets of 32, 64 and 128 tokens.

Expected result: not measured (no accelerator or Qwen weights were available); only the settings
are checked (tests/test_pipeline.py). Its CPU miniature is configs/pipelines/qwen3_tiny.py.
"""

import ml_collections

from configs import qwen_small


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    c = qwen_small.get_config("qwen3")
    c.data.template = "qwen3_thinking"
    c.reward.format = "none"
    c.reward.format_weight = 0.0
    c.sft.buckets = (512, 768)
    c.sft.batch_size = 32
    c.sft.eval = False
    c.sft.response_format = "The answer is \\boxed{{answer}}."
    c.train.eval_every = 0  # the pipeline evaluates after every stage
    c.eval.in_stage = False  # not the RL stages themselves too, before and after
    fusion = {"switch": "enable_thinking"}
    c.pipeline = ml_collections.ConfigDict(
        {
            "stages": [
                {
                    "name": "think_sft",
                    "overrides": {
                        "train.stage": "sft",
                        "train.steps": 200,
                        "optim.learning_rate": 1e-5,
                    },
                    "fusion": {**fusion, "think_fraction": 1.0},
                },
                {"name": "rl_think", "overrides": {"train.stage": "rl", "train.steps": 200}},
                {
                    "name": "fusion",
                    "overrides": {
                        "train.stage": "sft",
                        "train.steps": 100,
                        "optim.learning_rate": 5e-6,
                    },
                    "fusion": {**fusion, "think_fraction": 0.5},
                    "rejection_samples": 4,
                },
                {
                    "name": "rl_general",
                    "overrides": {
                        "train.stage": "rl",
                        "train.steps": 100,
                        "data.modes": "enable_thinking",
                        "reward.format": "mode",
                        "reward.format_weight": 0.5,
                    },
                },
            ],
            "baseline": "fusion",
            "eval_samples": 0,
            "eval_modes": {"think": "qwen3_thinking", "no_think": "qwen3_non_thinking"},
            "eval_think_budgets": "32,64,128",
            "eval_budget_mode": "think",
            "headline": "think acc.",
        }
    )
    return c
