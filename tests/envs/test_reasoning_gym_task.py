"""`reward.verifier="reasoning_gym"`: the task scores decoded responses with the reasoning-gym
scorers in the verifier pool, and the evaluation tables break results down by task and level."""

import numpy as np
import pytest

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (extra .[tasks])")

from rlvr_jax.config_types import ConfigError  # noqa: E402
from rlvr_jax.data import reasoning_gym_tasks as rgt  # noqa: E402
from rlvr_jax.data.example import Example  # noqa: E402
from rlvr_jax.data.tokenizer import Tokenizer  # noqa: E402
from rlvr_jax.envs.single_turn import ReasoningGymTask, build_task  # noqa: E402
from rlvr_jax.program.evals import evaluation  # noqa: E402
from rlvr_jax.rewards.config import RewardSettings  # noqa: E402
from tests.envs.test_tasks import _rollout  # noqa: E402

ALPHABET = "0123456789 <>/answerboxd{}\\"


def test_the_task_scores_correct_at_one_and_keeps_partial_credit():
    tok = Tokenizer.from_characters(ALPHABET)
    examples = rgt.reasoning_gym_examples("reasoning_gym:gcd,lcm", 4, seed=0)
    reward = RewardSettings(verifier="reasoning_gym", workers=1, deadline_s=30.0)
    task = build_task(reward, tok, tok.vocab_size, examples, "plain")
    assert isinstance(task, ReasoningGymTask)
    with task:
        responses = [
            f"<answer>{examples[0].answer}</answer>",
            f"\\boxed{{{examples[1].answer}}}",
            "<answer>0</answer>",
            f"<answer>0{examples[3].answer}0</answer>",  # the gold inside: partial credit
        ]
        parts = task.score(_rollout(tok, responses, T=60), examples)
        np.testing.assert_array_equal(parts["correct"], [1, 1, 0, 0])
        assert parts["rg_score"][2] == 0.0 and 0.0 < parts["rg_score"][3] < 1.0
        assert task.stats()["verifier/checks"] == 4.0
        assert tuple(parts) == task.part_names()


def test_the_task_refuses_examples_of_another_source():
    tok = Tokenizer.from_characters(ALPHABET)
    reward = RewardSettings(verifier="reasoning_gym")
    with pytest.raises(ConfigError, match="'e0' is not one"):
        build_task(reward, tok, tok.vocab_size, [Example("e0", "q", "1", "gsm8k")], "plain")


def test_tables_break_down_by_source_and_by_level_where_a_source_has_several():
    examples = [
        Example("a", "q", "1", "rg:gcd", 1.0),
        Example("b", "q", "1", "rg:gcd", 2.0),
        Example("c", "q", "1", "rg:lcm", 1.0),
    ]
    groupings = evaluation.breakdowns(examples)
    assert groupings == [
        ["rg:gcd", "rg:gcd", "rg:lcm"],
        ["rg:gcd/level1", "rg:gcd/level2", "rg:lcm"],
    ]
    table = evaluation._table(groupings, np.asarray([[True], [False], [True]]), None, None, (1,))
    assert table["rg:gcd"]["mean@1"] == 0.5
    assert table["rg:gcd/level1"]["mean@1"] == 1.0 and table["rg:gcd/level2"]["mean@1"] == 0.0
    # One difficulty per source: no level rows.
    assert evaluation.breakdowns(examples[:1] + examples[2:]) == [["rg:gcd", "rg:lcm"]]
