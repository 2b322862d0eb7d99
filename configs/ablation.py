"""The objective-bias study: GRPO and its corrected variants on one prompt set and rollout budget.

Command (CPU, the shipped setting; 12 minutes measured on 2 shared cores for the nine GRPO-family
variants, 2026-11-29; the ppo variant added 7 minutes under a heavier load, kimi 3.5 minutes,
2026-12-01):
  python -m rlvr_jax.ablate --config=configs/ablation.py --workdir=/tmp/ablation

It writes `/tmp/ablation/ablation.md` (the table), `/tmp/ablation/plots/*.png` and one run
directory per variant and seed under `/tmp/ablation/runs/`. Rerunning the command skips runs
that finished and redraws the table and plots.

The model. A from-scratch model cannot start RL here: the 2-layer `random:tiny` model trained
by RL alone on single-digit addition learns the answer format, not the sums (held-out accuracy
0.125 after 1000 steps, measured). So the study first fine-tunes it on demonstrations for 30
steps (`ablation.warm_start`, the R1 "cold start"), which leaves it at 0.188 held-out greedy
accuracy: groups of 8 then hold a mix of successes and failures, which is where the variants
differ. Every variant and seed starts from that same
warm-started policy. The RL budget is the same for all: 200 steps x 16 prompts x 8 samples
(25,600 verified samples), 6 new tokens at most, lr 1e-3 (Adam, constant), on-policy (one
update per rollout, so the clipped and unclipped surrogates coincide). Seeds 0..4 change the
rollout sampling (`train.seed`); the prompts, their order and the starting weights stay fixed.
Five seeds, because the spread between seeds is large at this scale.

Caveats the numbers carry: level-1 arithmetic has only 100 distinct problems, so the 256
"held-out" prompts repeat problems seen in training (accuracy measures the policy on this
task, not generalisation); responses are one or two digits and an end token, so the length
effects that the aggregations are about have little room to appear.

On a TPU with Qwen (`configs/ablation.py:qwen`), on a single-host TPU VM:
  python -m rlvr_jax.ablate --config=configs/ablation.py:qwen --workdir=/mnt/disk/ablation \\
    --config.model.source=/path/to/Qwen2.5-Math-1.5B
runs the same variants on GSM8K (train split; 256 problems of the test split for evaluation),
verified by the math verifier in a host process pool, bf16, 32 prompts x 8 samples a step, 512
new tokens, 100 steps, no warm start. `model.source` may be a local Hugging Face directory or a
hub id; `data.path` can point at local GSM8K JSONL. The workdir must be a local path (the table
and plots are written with plain file IO). `--config.ablation.variants=grpo,dr_grpo` splits the
variants over several VMs; copy their `runs/` into one workdir and run once more to draw the
joint table (finished runs are skipped). This setting has not been run; its budget is a
starting point, and `--config.train.steps` sets a shorter first look.
"""

import ml_collections

from rlvr_jax.program.settings import default_config

VARIANTS = (
    "grpo",
    "dr_grpo",
    "rloo",
    "grpo_no_std",
    "token_mean",
    "kimi_length",
    "curriculum",
    "no_std_curriculum",
    "expert_iteration",
    "ppo",
    "kimi",
)


def _tiny() -> ml_collections.ConfigDict:
    c = default_config()
    c.model.source = "random:tiny"
    c.model.tokenizer = "chars:0123456789+-*="
    c.data.name = "arithmetic"
    c.data.level = 1
    c.data.num_train = 1024
    c.data.num_eval = 256
    c.data.template = "text:{question}="
    c.data.buckets = (8,)
    c.reward.verifier = "arithmetic"
    c.reward.format_weight = 0.5
    c.rl.group_size = 8
    c.rl.sampler.max_new_tokens = 6
    c.rl.group_grad_norms = True
    c.optim.learning_rate = 1e-3
    c.optim.schedule = "constant"
    c.train.steps = 200
    c.train.batch_prompts = 16
    c.train.log_every = 50
    c.train.eval_every = 50
    c.train.checkpoint_every = 0
    c.train.use_tensorboard = False
    c.eval.batch_prompts = 64
    c.sft.buckets = (8,)  # the warm start's demonstrations: "9+9=18" and the end token
    c.ablation = ml_collections.ConfigDict(
        {
            "variants": ",".join(VARIANTS),
            "seeds": "0,1,2,3,4",
            "kimi_length_weight": 0.5,
            "warm_start": {
                "steps": 30,
                "batch_size": 32,
                "learning_rate": 3e-3,
                "seed": 0,
            },
        }
    )
    return c


def _qwen() -> ml_collections.ConfigDict:
    c = default_config()
    c.model.source = "Qwen/Qwen2.5-Math-1.5B"
    c.model.dtype = "bfloat16"
    c.model.remat = True
    c.data.name = "gsm8k"
    c.data.split = "train"
    c.data.eval_split = "test"
    c.data.num_eval = 256
    c.data.template = "qwen_math_boxed"
    c.data.buckets = (256,)
    c.reward.verifier = "math"
    c.reward.workers = 8
    c.rl.group_size = 8
    c.rl.sampler.max_new_tokens = 512
    c.rl.group_grad_norms = True
    c.rl.num_microbatches = 4
    c.optim.learning_rate = 1e-6
    c.optim.schedule = "constant"
    c.train.steps = 100
    c.train.batch_prompts = 32
    c.train.log_every = 5
    c.train.eval_every = 25
    c.train.checkpoint_every = 25
    c.eval.batch_prompts = 64
    c.ablation = ml_collections.ConfigDict(
        {
            "variants": ",".join(VARIANTS),
            "seeds": "0,1,2",
            "kimi_length_weight": 0.5,
            "warm_start": {"steps": 0, "batch_size": 32, "learning_rate": 1e-5, "seed": 0},
        }
    )
    return c


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """ "" or "tiny": the CPU study; "qwen": the TPU one (see the module docstring)."""
    if arg in (None, "", "tiny"):
        return _tiny()
    if arg == "qwen":
        return _qwen()
    raise ValueError(f"configs/ablation.py: unknown argument {arg!r}; expected 'tiny' or 'qwen'")
