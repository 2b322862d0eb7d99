"""Tool use learned by the embedded SmolLM2-135M-Instruct: a short SFT cold start on scripted
tool episodes, then GRPO with the tool.

Command (CPU, offline; the `python` tool runs in bubblewrap, `apt-get install bubblewrap`, or
the pipeline refuses to start; `:seed=N` for another training seed, in its own workdir):
  python -m rlvr_jax.pipeline --config=configs/pipelines/tool_math.py --workdir=/tmp/tool_math

Task: `configs/agent_math_tool.py`'s products of two numbers of up to three digits ("850*636"),
a `python` tool in the sandbox, the boxed final answer checked by the math verifier. Stages:
sft_cold (3 SFT steps on scripted gold episodes, lr 3e-5, so that the tool format is only
partly learned); rl (15 GRPO steps of 4 prompts x 4 episodes, temperature 0.7, lr 1e-5, reward 1
for a correct final answer). Evaluated on 64 held-out problems: accuracy, the tool-call rate and
tool errors per episode (docs/agents.md).

Expected result (2-core CPU, 2026-12-02, 19 min 42 s; docs/agents.md has the seeds): accuracy
0.000 at the start (tool-call rate 0), 0.000 after the cold start (tool-call rate 1.000: it
calls the tool right but imitates the tool's message instead of boxing the number), 1.000 after
RL.
"""

import ml_collections

from configs import agent_math_tool


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    args = dict(kv.split("=", 1) for kv in (arg or "").split(",") if kv)
    unknown = sorted(set(args) - {"seed"})
    if unknown:
        raise ValueError(f"unknown argument {unknown[0]!r}; known: seed=N")
    c = agent_math_tool.get_config()
    c.train.seed = int(args.get("seed", 0))
    c.train.eval_every = 0  # the pipeline evaluates after every stage
    c.eval.in_stage = False  # not the RL stages themselves too, before and after
    c.train.log_every = 5
    c.train.checkpoint_every = 10
    c.train.use_tensorboard = False
    c.sft.eval = False
    c.pipeline = ml_collections.ConfigDict(
        {
            "stages": [
                {
                    "name": "sft_cold",
                    "overrides": {
                        "train.stage": "sft",
                        "train.steps": 3,
                        "optim.learning_rate": 3e-5,
                    },
                },
                {
                    "name": "rl",
                    "overrides": {
                        "train.stage": "rl",
                        "train.steps": 15,
                        "optim.learning_rate": 1e-5,
                    },
                },
            ],
        }
    )
    return c
