"""KV-cache sampler: prefill, then one jitted `lax.while_loop` of one-token decode steps.

Modules, by concept:

* `config`: static settings (`SamplerConfig`) apart from per-call, per-row values
  (`SamplingParams`), so new values never recompile;
* `choice`: the token choice (greedy, temperature, top-k, top-p, min-p) and the per-row draw;
* `stops`: end ids, stop sequences and the think budget;
* `loop`: the program (`generate`, jitted once; `sample`, with checks of host inputs);
* `continuous`: the same rollout with fewer decode slots than rows, each slot taking the next
  queued row when its row ends (`generate_continuous`, `sample_continuous`), and the slot
  utilisation of either program (`RolloutStats`, `static_stats`, `summarize`);
* `host`: prompts to fixed-shape batches (`bucket_and_pad`), batched generation over many prompts
  (`generate_in_batches`), completions back to lists.

The model side (prefill, the decode step, the cache) lives in `rlvr_jax.model`; the rollout and
finish reasons in `rlvr_jax.types`. Their names used with the sampler are re-exported here.
"""

from rlvr_jax.sampling.choice import choose_tokens, row_uniforms
from rlvr_jax.sampling.config import METHODS, SamplerConfig, SamplingParams, sampling_params
from rlvr_jax.sampling.continuous import (
    RolloutStats,
    auto_slots,
    generate_continuous,
    sample_continuous,
    static_stats,
    summarize,
)
from rlvr_jax.sampling.host import bucket_and_pad, completions, generate_in_batches
from rlvr_jax.sampling.loop import generate, init_decode_cache, num_cache_slots, sample
from rlvr_jax.types import FINISH_EOS, FINISH_LENGTH, FINISH_NAMES, FINISH_STOP, Rollout

__all__ = [
    "FINISH_EOS",
    "FINISH_LENGTH",
    "FINISH_NAMES",
    "FINISH_STOP",
    "METHODS",
    "Rollout",
    "RolloutStats",
    "SamplerConfig",
    "SamplingParams",
    "auto_slots",
    "bucket_and_pad",
    "choose_tokens",
    "completions",
    "generate",
    "generate_continuous",
    "generate_in_batches",
    "init_decode_cache",
    "num_cache_slots",
    "row_uniforms",
    "sample",
    "sample_continuous",
    "sampling_params",
    "static_stats",
    "summarize",
]
