"""configs/agent_swe.py and configs/agent_math_tool.py build valid settings and their tasks."""

import string

import pytest

from configs import agent_math_tool, agent_swe
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.single_turn import build_task
from rlvr_jax.envs.swe import SweTask
from rlvr_jax.envs.tool_math import MathToolTask
from rlvr_jax.program import build
from rlvr_jax.program.settings import settings_from_config


@pytest.mark.parametrize(
    "config, verifier, task_type",
    [(agent_swe, "swe", SweTask), (agent_math_tool, "math_tool", MathToolTask)],
)
def test_the_agent_configs_build_their_tasks(config, verifier, task_type):
    c = config.get_config()
    c.data.num_train = 8  # generating the config's 256 repositories takes seconds
    s = settings_from_config(c, check_devices=False)
    assert s.reward.verifier == verifier and s.reward.max_turns > 1
    train, evals, _ = build.load_examples(s.data)
    assert len(evals) == s.data.num_eval and train
    tok = Tokenizer.from_characters(string.printable)
    with build_task(s.reward, tok, 256, train + evals, s.data.template) as task:
        assert type(task) is task_type
        assert task.stop_sequences == ((*tok.encode("</tool_call>"),),)


def test_the_swe_task_refuses_examples_that_are_not_repositories():
    s = settings_from_config(agent_swe.get_config(), check_devices=False)
    tok = Tokenizer.from_characters(string.printable)
    examples = build.load_examples(
        settings_from_config(agent_math_tool.get_config(), check_devices=False).data
    )[1]
    with pytest.raises(Exception, match="swe_repos"):
        build_task(s.reward, tok, 256, examples, s.data.template)
