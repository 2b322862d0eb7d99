"""The judge's grading prompt and verdict parsing, on hand-made answers."""

import pytest

from rlvr_jax.rewards import judge
from rlvr_jax.rewards.config import RewardSettings


@pytest.mark.parametrize(
    "text, want",
    [
        ("YES", 1.0),
        (" yes.", 1.0),
        ("**NO**", 0.0),
        ("No, the answer is wrong. Yes would need 4.", 0.0),  # the first verdict counts
        ("Yesterday it was no", 0.0),  # "Yesterday" is not a YES
        ("Nope", None),
        ("", None),
        ("I cannot tell", None),
    ],
)
def test_yes_no_verdicts(text, want):
    assert judge.parse_verdict(text, "yes_no") == want


@pytest.mark.parametrize(
    "text, want",
    [
        ("Score: 7", 0.7),
        ("score = 7/10", 0.7),
        ("The score is 3.5 out of 10", 0.35),
        ("It gets 3 out of 10", 0.3),  # no "score": the first number
        ("My score is 12", 1.0),  # clipped to the scale
        ("-4", 0.0),
        ("excellent", None),
    ],
)
def test_score_verdicts(text, want):
    got = judge.parse_verdict(text, "score", max_score=10)
    assert got == pytest.approx(want) if want is not None else got is None


def test_grading_prompt_fills_both_placeholders_and_leaves_other_braces():
    t = 'Q: {question}\nA: {response}\nReply {"verdict": YES|NO}'
    out = judge.grading_prompt(t, "1+1?", "it is {question}")
    assert out == 'Q: 1+1?\nA: it is {question}\nReply {"verdict": YES|NO}'
    with pytest.raises(ValueError, match="response"):
        judge.check_template("Q: {question}")
    with pytest.raises(ValueError, match="judge_verdict"):
        RewardSettings(judge_verdict="maybe")
    with pytest.raises(ValueError, match="lacks"):
        RewardSettings(judge_model="policy", judge_template="no placeholders")
