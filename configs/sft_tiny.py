"""SFT cold start of the from-scratch tiny model on single-digit addition demonstrations.

Command:
  python -m rlvr_jax.main --config=configs/sft_tiny.py --workdir=/tmp/sft_tiny

Hardware: a laptop CPU, seconds. The model, tokenizer, task and prompt template are those of
`configs/tiny.py`; the demonstrations are the training problems with their answer as the response
("3+4=" -> "7" and the end token), and the loss is the token-mean NLL of the response tokens. The
held-out greedy accuracy (64 problems) is printed before and after.

Expected result (measured on a 2-core CPU with the command above, 2026-12-01): loss 2.8556 at
step 1, 0.2743 at step 150; held-out greedy accuracy 0.000 before, 0.578 after.

The policy is written to `<workdir>/hf` at the end (config.json, safetensors, tokenizer files);
the RL stage starts from that directory (not from the SFT workdir's checkpoint, whose optimizer
state and step count belong to SFT):
  python -m rlvr_jax.main --config=configs/tiny.py --workdir=/tmp/tiny_rl \
    --config.model.source=/tmp/sft_tiny/hf --config.optim.learning_rate=3e-4
(the character tokenizer is saved in that directory too and loads from it; configs/tiny.py's
`model.tokenizer="chars:..."` names the same one.)

To fine-tune on a file of demonstrations instead, set `sft.path` to a JSONL file with one
{"prompt": ..., "response": ...} (or {"question": ..., "solution": ...}) object a line.
"""

import ml_collections

from configs import tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = tiny.get_config(arg)
    c.train.stage = "sft"
    c.train.steps = 150
    c.train.log_every = 25
    c.train.checkpoint_every = 50
    c.sft.batch_size = 32
    c.sft.buckets = (8,)
    c.optim.learning_rate = 3e-3
    c.optim.schedule = "constant"
    return c
