"""A from-scratch tiny model on single-digit addition: the whole loop in seconds, for tests.

Command:
  python -m rlvr_jax.main --config=configs/tiny.py --workdir=/tmp/tiny

A 2-layer Qwen2-style model with a character tokenizer, random weights, GRPO with the in-graph
arithmetic verifier (one XLA program per step). The reward is correctness plus 0.5 x format (a
number, then the end token); from scratch the model first learns the format.
"""

import ml_collections

from rlvr_jax.program.settings import default_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    c = default_config()
    c.model.source = "random:tiny"
    c.model.tokenizer = "chars:0123456789+-*="
    c.data.name = "arithmetic"
    c.data.num_train = 512
    c.data.num_eval = 64
    c.data.template = "text:{question}="
    c.data.buckets = (8,)
    c.reward.verifier = "arithmetic"
    c.reward.format_weight = 0.5
    c.rl.group_size = 4
    c.rl.sampler.max_new_tokens = 3
    c.optim.learning_rate = 3e-3
    c.optim.schedule = "constant"
    c.train.steps = 20
    c.train.batch_prompts = 16
    c.train.log_every = 5
    c.train.checkpoint_every = 10
    c.eval.batch_prompts = 32
    return c
