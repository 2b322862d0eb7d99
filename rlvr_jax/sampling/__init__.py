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
finish reasons in `rlvr_jax.types`. Import each name from its module: this file imports
nothing, so loading one module never loads the others.
"""
