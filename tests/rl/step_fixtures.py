"""A tiny model, prompts and a jittable reward for train-step tests (PPO, LoRA)."""

import jax.numpy as jnp

from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.model import config as config_lib
from rlvr_jax.rl import train_step as ts
from rlvr_jax.sampling.config import SamplerConfig
from rlvr_jax.sampling.host import bucket_and_pad

B, G = 4, 4


def reward_fn(rollout, targets):
    """Rewards some rows of a random model earn and others not (see tests/test_sharding.py)."""
    del targets
    hits_N = jnp.sum((rollout.tokens_NT % 3 == 0) & rollout.mask_NT, axis=1)
    correct_N = (hits_N >= 2).astype(jnp.float32)
    return correct_N + 0.1 * hits_N, {"correct": correct_N}


def tiny_setup():
    """(model config, sampler config, batch(i)): B addition prompts x G rows for step i."""
    tok = Tokenizer.from_characters("0123456789+-*=")
    cfg = config_lib.PRESETS["tiny"].replace(vocab_size=32)
    prompts = [tok.encode(f"{i}+{j}=") for i in range(4) for j in range(4)]

    def batch(i: int) -> ts.Batch:
        ids = prompts[(i * B) % 16 : (i * B) % 16 + B]
        prompt_NP, lengths_N = bucket_and_pad(ids, [8], tok.pad_id, G)
        return ts.Batch(jnp.asarray(prompt_NP), jnp.asarray(lengths_N))

    sampler = SamplerConfig(max_new_tokens=6, eos_ids=tok.eos_ids, pad_id=tok.pad_id)
    return cfg, sampler, batch
