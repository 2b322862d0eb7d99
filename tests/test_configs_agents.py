"""configs/agent_swe.py, configs/agent_math_tool.py and configs/pipelines/tool_math.py build
valid settings and their tasks; the SFT stage's scripted tool episodes."""

import dataclasses
import string

import pytest

from configs import agent_math_tool, agent_swe
from configs.pipelines import tool_math
from rlvr_jax.config_types import ConfigError
from rlvr_jax.data import templates
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.single_turn import build_task
from rlvr_jax.envs.swe import SweTask
from rlvr_jax.envs.tool_math import MathToolTask
from rlvr_jax.program.parts import build
from rlvr_jax.program.settings import settings_from_config
from rlvr_jax.program.stages import sft_stage
from rlvr_jax.program.studies import pipeline
from tests.envs.fixtures import QWEN_STYLE


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
        assert task.sandbox_backend == s.reward.sandbox_backend == "bwrap"


def test_the_swe_task_refuses_examples_that_are_not_repositories():
    s = settings_from_config(agent_swe.get_config(), check_devices=False)
    tok = Tokenizer.from_characters(string.printable)
    examples = build.load_examples(
        settings_from_config(agent_math_tool.get_config(), check_devices=False).data
    )[1]
    with pytest.raises(Exception, match="swe_repos"):
        build_task(s.reward, tok, 256, examples, s.data.template)


def test_the_tool_math_configs_build():
    s = settings_from_config(agent_math_tool.get_config(), check_devices=False)
    assert (s.data.level, s.reward.tool_system) == (6, agent_math_tool.SYSTEM)
    notool = settings_from_config(agent_math_tool.get_config("notool"), check_devices=False)
    assert s.reward.multi_turn and not notool.reward.multi_turn
    assert notool.reward.verifier == "math" and notool.data == dataclasses.replace(
        s.data, template=notool.data.template, buckets=notool.data.buckets
    )
    with pytest.raises(ValueError, match="'notool'"):
        agent_math_tool.get_config("tool")

    config = tool_math.get_config("seed=2")
    ps, base = pipeline.split_config(config)
    built = [
        settings_from_config(pipeline.stage_config(base, st, base.model.source)) for st in ps.stages
    ]
    assert [b.train.stage for b in built] == ["sft", "rl"]
    assert all(b.reward.verifier == "math_tool" and b.train.seed == 2 for b in built)
    assert built[0].data == built[1].data == s.data
    with pytest.raises(ValueError, match="unknown argument 'seeds'"):
        tool_math.get_config("seeds=2")


def test_the_sft_stage_plays_a_tool_tasks_scripted_episodes():
    """Without `sft.path`, a multi-turn task's demonstrations are its scripted episodes, the
    loss on the model's turns only; a data set without a script is refused, naming it."""
    c = agent_math_tool.get_config()
    c.data.num_train, c.data.num_eval = 4, 2
    c.reward.workers = 1
    c.sft.buckets = (512,)  # one character a token
    s = settings_from_config(c, check_devices=False)
    tok = Tokenizer.from_characters(string.printable, chat_template=QWEN_STYLE)
    template = templates.get_template(s.data.template)
    train, evals, _ = build.load_examples(s.data)
    lines = []
    with build_task(s.reward, tok, 256, evals, s.data.template) as task:
        enc = sft_stage._encoded(s, tok, template, train, task, lines.append)  # noqa: SLF001
        assert len(enc.ids) == 4 and enc.trained is not None
        assert lines == ["4 scripted tool episodes" + lines[0].split("episodes", 1)[1]]
        for trained, p in zip(enc.trained, enc.prompt_lengths, strict=True):
            assert not any(trained[:p]) and trained[-1] and not all(trained[p:])
        unscripted = [dataclasses.replace(ex, meta={}) for ex in train]
        with pytest.raises(ConfigError, match="no scripted demonstration of the 4 training"):
            sft_stage._encoded(s, tok, template, unscripted, task, print)  # noqa: SLF001
