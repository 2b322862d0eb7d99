"""The DeepSeek-R1 recipe on Qwen3-0.6B, for one accelerator: SFT cold start -> RL -> RS-SFT.

Command (a TPU VM or a GPU host; GSM8K from the hub or `--config.data.path`; the cold start's
reasoning traces from a JSONL file of {"prompt", "response"} rows, the first stage's `sft.path`):
  python -m rlvr_jax.pipeline \\
      --config=configs/pipelines/r1_qwen3.py:traces=/data/traces.jsonl --workdir=runs/r1_qwen3
Without `:traces=...` the cold start fine-tunes on the GSM8K training answers in the R1 format
with an empty thought ("</think> <answer>ANSWER</answer>", after the template's "<think>"): it
teaches the format, not reasoning.

The base is `configs/qwen_small.py:qwen3` (Qwen3-0.6B, bf16, remat, the R1-Zero template, the
math verifier plus 0.1 x the R1 format, 512 new tokens). The stages:
  1. sft_cold: 200 SFT steps of 32 sequences on the traces (responses in the R1 format,
     "<think>...</think> <answer>...</answer>"), lr 1e-5;
  2. rl: 200 GRPO steps of 32 prompts x 8 samples, lr 1e-6;
  3. rs_sft: 4 answers per GSM8K training problem sampled from the RL policy, the verified ones
     kept, 100 SFT steps, lr 5e-6.
The baseline branch spends the same 500 steps on RL alone from Qwen3-0.6B. After every stage:
greedy accuracy on 256 GSM8K test problems, pass@1/4 and mean@4 from 4 samples, length,
truncation, R1 format rate and language consistency.

Hardware: as configs/qwen_small.py (one accelerator with 32 GiB or more). Expected result: none
measured; no accelerator or Qwen weights were available here, only the settings are checked
(tests/test_pipeline.py). Treat the step counts and learning rates as a starting point.
"""

import ml_collections

from configs import qwen_small


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    traces = (arg or "").removeprefix("traces=")
    c = qwen_small.get_config("qwen3")
    c.sft.buckets = (512, 768)
    c.sft.batch_size = 32
    c.sft.eval = False
    c.sft.response_format = " </think> <answer>{answer}</answer>"
    c.train.eval_every = 0  # the pipeline evaluates after every stage
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
            ],
            "baseline": "rl",
            "eval_samples": 4,
            "eval_ks": "1,4",
            "eval_temperature": 1.0,
        }
    )
    return c
