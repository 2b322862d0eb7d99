"""The objective-bias study where length can matter: step-by-step arithmetic, answers of tens of
tokens whose length is the policy's choice.

Command (CPU; 63 min 39 s for the warm start and all 33 runs on a 2-core CPU shared with other
jobs, load average about 7 to 13, 2026-12-04):
  python -m rlvr_jax.ablate --config=configs/ablation_long.py --workdir=/tmp/ablation_long

Model and task: the from-scratch 2-layer `random:tiny` model on level-3 arithmetic (three terms
of up to two digits, + and -: "85+63-51="). The cold start (`ablation.warm_start`, 800 SFT
steps) teaches it the expression worked one place value at a time, one step a line
(`sft.response_format="{thought}"`, `sft.traces.thought_for`: "85+60=145\\n145+3=148\\n..."),
14 to 40 characters (one token each); the verifier reads the last number, so a shorter answer
(skipped steps, or the number alone) or a longer one (repeated or extra lines, up to the 96-token
budget) scores the same when its last number is right: the length is the policy's choice. After
the cold start the held-out greedy accuracy is 0.35 and about a third of the training samples
(temperature 1) are correct, so groups of 8 mix successes and failures. Then every variant of
configs/ablation.py from that policy, 100 steps x 8 prompts x 8 samples (6,400 verified samples
a run), Adam at 3e-4 (constant), seeds 0-2; each run's final checkpoint also gets pass@1, 4 and 8
from 8 samples per held-out prompt (`ablation.pass_at_k`).

The cost per RL step (64 rows x 96 new tokens) measured on that machine before choosing the
sizes: 0.3 s at a load average of 5, 1.0 to 1.3 s at 9 to 12 (grpo; after the first run the
programs come from the persistent compile cache). The `random:tiny` model rather than the
embedded SmolLM2 (30 layers, 135M parameters, not timed here): the 33 runs had to fit in about
an hour of that CPU.

Expected result: the long-answer table and plots of docs/ablation/README.md (held-out greedy
accuracy 0.352 -> 0.45 to 0.49 for the GRPO family, answer lengths within about a token of the
start except kimi_length, which collapses to one digit, and ppo).
"""

import ml_collections

from configs import ablation


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The long-answer study (the module docstring); `arg` is not used."""
    del arg
    c = ablation.get_config("tiny")
    c.model.tokenizer = "chars:0123456789+-*=\n"  # the line break separates the steps
    c.data.level = 3
    c.data.num_train = 2048
    c.data.num_eval = 128
    c.data.buckets = (12,)
    c.rl.sampler.max_new_tokens = 96  # over twice the longest worked answer (40)
    c.optim.learning_rate = 3e-4
    c.train.steps = 100
    c.train.batch_prompts = 8
    c.train.log_every = 10
    c.train.eval_every = 0
    c.eval.batch_prompts = 128
    c.sft.response_format = "{thought}"
    c.sft.buckets = (64,)  # prompt (<= 9) + worked answer (<= 40) + end token
    c.ablation.seeds = "0,1,2"
    c.ablation.warm_start.steps = 800
    c.ablation.warm_start.batch_size = 32
    c.ablation.warm_start.learning_rate = 3e-3
    c.ablation.pass_at_k = ml_collections.ConfigDict({"samples": 8, "ks": "1,4,8"})
    return c
