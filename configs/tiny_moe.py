"""configs/tiny.py with a mixture-of-experts model: Qwen3-MoE-style, 8 experts, top 2.

Command:
  python -m rlvr_jax.main --config=configs/tiny_moe.py --workdir=/tmp/tiny_moe

The `tiny-moe` preset (`model/config.py`): 2 layers of width 64, each MLP 8 experts of width 32
with 2 per token (renormalised, as Qwen3-MoE), random weights, a character tokenizer; the task,
reward and GRPO settings of configs/tiny.py. The dispatch is dropless ("auto": "blocked" on CPU,
docs/model.md), so the rollout and the update route and weigh every token alike.
"""

import ml_collections

from configs import tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = tiny.get_config(arg)
    c.model.source = "random:tiny-moe"
    return c
