"""The objective-bias study: GRPO and its corrected variants on one prompt set and rollout budget.

Command (CPU; 12 min 7 s for the nine GRPO-family variants on a shared 2-core CPU, 2026-11-29;
the ppo variant added 7 minutes under a heavier load and kimi 3 min 27 s, 2026-12-01):
  python -m rlvr_jax.ablate --config=configs/ablation.py --workdir=/tmp/ablation
On a single-host TPU VM (docs/ablation/README.md: splitting the variants over several VMs):
  python -m rlvr_jax.ablate --config=configs/ablation.py:qwen --workdir=/mnt/disk/ablation \\
    --config.model.source=/path/to/Qwen2.5-Math-1.5B

Model and task: the from-scratch 2-layer `random:tiny` model on single-digit addition. RL alone
cannot start it (0.125 held-out accuracy after 1000 steps, measured), so 30 SFT steps first
(`ablation.warm_start`, 0.188 held-out greedy accuracy); then every variant from that policy,
200 steps x 16 prompts x 8 samples, seeds 0-4. `:qwen`: GSM8K with a Qwen2.5-Math checkpoint and
the math verifier, 32 prompts x 8 samples, 512 new tokens, 100 steps, no warm start.

Expected result: the table in docs/ablation/README.md, written to `<workdir>/ablation.md` with
plots and one run directory per variant and seed (a rerun skips finished runs). `:qwen`: not
measured.
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
