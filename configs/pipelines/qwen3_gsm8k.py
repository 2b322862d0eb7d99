"""Qwen3's recipe on Qwen3-0.6B and GSM8K, for one accelerator: long-CoT cold start -> reasoning
RL -> thinking-mode fusion.

Command (a TPU VM or a GPU host; GSM8K from the hub or `--config.data.path`, e.g.
`../shared/data/gsm8k`):
  python -m rlvr_jax.pipeline --config=configs/pipelines/qwen3_gsm8k.py --workdir=runs/qwen3_gsm8k

The base is `configs/qwen_small.py:qwen3` (Qwen3-0.6B, bf16, remat, the math verifier) with Qwen3's
own chat template in thinking mode ("qwen3_thinking") and no format reward. The thoughts are
GSM8K's written solutions (the text before "####", without the calculator annotations:
`data.datasets.gsm8k_thought`), the answers "The answer is \\boxed{N}." The mode is the chat
template's `enable_thinking`, per row (`sft.fusion`, switch "enable_thinking"): a thinking row is
"<think>\\n{solution}\\n</think>\\n\\n{answer}", a non-thinking row is the answer after the empty
block the template writes into the prompt. The stages:
  1. think_sft: SFT on thinking rows only (every training problem with its solution), 200 steps
     of 32 sequences, lr 1e-5;
  2. rl_think: 200 GRPO steps of 32 prompts x 8 samples in thinking mode, lr 1e-6;
  3. fusion: SFT on half thinking, half non-thinking rows, 100 steps, lr 5e-6; as in Qwen3, the
     thinking rows are the RL model's own answers, 4 sampled per training problem in thinking
     mode and verified (`program.studies.rejection`); a problem with none keeps its non-thinking
     row;
  4. rl_general: 100 GRPO steps on prompts of both modes (`data.modes="enable_thinking"`, half
     of them thinking), rewarded for the answer and, with weight 0.5, for following the mode.
The baseline spends the same 600 steps on the fusion SFT alone, from Qwen3-0.6B (its thinking
rows sampled from Qwen3-0.6B itself).

After every stage, on 256 GSM8K test problems: greedy accuracy in thinking mode (the base
template) and under each mode ("think": `qwen3_thinking`, "no_think": `qwen3_non_thinking`),
with lengths and the share of answers with a non-empty thinking block; then greedy accuracy and
the early-end rate at thinking budgets of 32, 64 and 128 tokens in thinking mode.

Hardware: as configs/qwen_small.py (one accelerator with 32 GiB or more). Expected result: none
measured; no accelerator or Qwen weights were available here, only the settings are checked
(tests/test_pipeline.py). The miniature of the same recipe, measured on a CPU, is
`configs/pipelines/qwen3_tiny.py` (docs/pipelines.md).
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
