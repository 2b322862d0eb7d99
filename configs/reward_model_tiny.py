"""A reward model for the tiny model's single-digit addition: a learned verifier, in seconds.

Command (a laptop CPU):
  python -m rlvr_jax.main --config=configs/reward_model_tiny.py --workdir=/tmp/rm_tiny
An RL run then adds its score as the reward part "preference":
  python -m rlvr_jax.main --config=configs/tiny.py --workdir=/tmp/tiny_rm_rl \\
    --config.reward.rm_path=/tmp/rm_tiny --config.reward.rm_weight=0.5

Model and task: `configs/tiny.py`'s decoder with a scalar head read at the end token, trained
with the Bradley-Terry loss; `rm.path` is empty, so the pairs come from the task's examples, the
right answer ("3+4=" -> "7") chosen over another problem's ("3+4=" -> "9"). A JSONL file of
{"prompt", "chosen", "rejected"} objects in `rm.path` replaces them (docs/reward_models.md).

Expected result (2-core CPU shared with other jobs, 2026-12-01): loss 0.6931 at step 1, 0.2852
at step 800; held-out pairwise accuracy (64 pairs) 0.000 before (a zero head ties every pair),
0.797 after. At 200 steps the loss had barely moved (0.685, accuracy 0.500): telling the
answers apart needs the model to learn addition.
"""

import ml_collections

from configs import tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = tiny.get_config(arg)
    c.train.stage = "rm"
    c.train.steps = 800
    c.train.log_every = 100
    c.train.checkpoint_every = 200
    c.rm.batch_size = 32
    c.rm.num_eval = 64
    c.rm.buckets = (8,)
    c.optim.learning_rate = 3e-3
    c.optim.schedule = "constant"
    return c
