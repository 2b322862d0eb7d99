"""GRPO on GSM8K with Qwen2.5-0.5B-Instruct (or Qwen3-0.6B with `:qwen3`), R1 template.

Commands (GSM8K from the hub, `pip install -e ".[datasets]"`, or local JSONL, e.g.
`--config.data.path=../shared/data/gsm8k`; weights from the hub or `--config.model.source=DIR`):
  python -m rlvr_jax.main --config=configs/qwen_small.py --workdir=runs/qwen_small
  python -m rlvr_jax.main --config=configs/qwen_small.py:qwen3 --workdir=runs/qwen3_small
  python -m rlvr_jax.main --config=configs/qwen_small.py:qwen3_long --workdir=runs/qwen3_long
  python -m rlvr_jax.eval --workdir=runs/qwen_small

Task: GSM8K's training problems, the first 256 test problems held out; the R1-Zero template; the
reward is correctness (the math verifier on the <answer> block) plus 0.1 x the R1 format.
`:qwen3_long`: Qwen3's thinking template, answers of up to 4,096 tokens (docs/stages.md).

Hardware: one accelerator with 32 GiB or more (on a 16 GiB v5e chip, `train.batch_prompts=16`).
By arithmetic, not measurement: f32 parameters, gradients and Adam moments about 8 GiB; 256 rows
x 832 tokens of bf16 activations at the 24 layer boundaries (remat, 4 microbatches) about 9 GiB;
the bf16 KV cache of the rollout about 2.6 GiB.

Expected result: not measured (no TPU, GPU or Qwen weights were available); only the settings
are checked (tests/test_configs_qwen_small.py). Treat the hyperparameters as a starting point.
"""

import ml_collections

from rlvr_jax.program.settings import default_config

SOURCES = {
    "": "Qwen/Qwen2.5-0.5B-Instruct",
    "qwen2.5": "Qwen/Qwen2.5-0.5B-Instruct",
    "qwen3": "Qwen/Qwen3-0.6B",
    "qwen3_long": "Qwen/Qwen3-0.6B",
}
# Qwen3's <think> and </think> token ids (its tokenizer's added tokens).
QWEN3_THINK_OPEN, QWEN3_THINK_CLOSE = 151667, 151668
# The architecture preset of each source (`model.config.PRESETS`), for shape checks.
PRESETS = {
    "Qwen/Qwen2.5-0.5B-Instruct": "qwen2.5-0.5b",
    "Qwen/Qwen3-0.6B": "qwen3-0.6b",
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arg = arg or ""
    if arg not in SOURCES:
        raise ValueError(f"configs/qwen_small.py:{arg}: expected one of {sorted(SOURCES)}")
    c = default_config()
    c.model.source = SOURCES[arg]
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"
    c.model.remat = True
    c.data.name = "gsm8k"
    c.data.path = ""  # the hub; see the docstring for local JSONL
    c.data.split = "train"
    c.data.eval_split = "test"
    c.data.num_eval = 256
    c.data.template = "r1_zero"
    c.data.buckets = (192, 256, 320)
    c.reward.verifier = "math"
    c.reward.format = "r1"
    c.reward.format_weight = 0.1
    c.reward.workers = 8
    c.rl.group_size = 8
    c.rl.sampler.max_new_tokens = 512
    c.rl.temperature = 1.0
    c.rl.num_microbatches = 4
    c.rl.logprob_chunk = 128
    c.optim.learning_rate = 1e-6
    c.optim.warmup_steps = 10
    c.optim.total_steps = 200
    c.optim.schedule = "constant"
    c.optim.weight_decay = 0.0
    c.train.steps = 200
    c.train.batch_prompts = 32
    c.train.log_every = 1
    c.train.eval_every = 25
    c.train.checkpoint_every = 25
    c.eval.batch_prompts = 128
    if arg == "qwen3_long":
        _long_answers(c)
    return c


def _long_answers(c: ml_collections.ConfigDict) -> None:
    """Thinking mode at 4,096 generated tokens (see the docstring)."""
    c.data.template = "qwen3_thinking"
    c.reward.format = "none"  # the chat template's thinking block, not R1's tags
    c.rl.sampler.max_new_tokens = 4096
    c.rl.sampler.think_open = (QWEN3_THINK_OPEN,)
    c.rl.sampler.think_close = (QWEN3_THINK_CLOSE,)
    c.rl.sampler.think_stop = (QWEN3_THINK_CLOSE,)
    c.rl.sampler.think_budget = 3584
    c.rl.decode_slots = "auto"
    c.rl.num_microbatches = "auto"
    c.rl.memory_budget_gib = 16.0
    c.rl.logprob_chunk = 512
    c.train.batch_prompts = 8
    c.eval.batch_prompts = 32
