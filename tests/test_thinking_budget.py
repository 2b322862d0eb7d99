"""Accuracy against the thinking budget on the tiny model: the early-end rate and the table."""

import pytest

from configs import tiny
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.evals import thinking_budget
from rlvr_jax.program.parts import build
from rlvr_jax.program.studies import pipeline_eval


def _settings():
    c = tiny.get_config()
    c.model.tokenizer = "chars:0123456789+-*=()"
    c.data.template = "text:{question}=*"  # the prompt opens the thinking block
    c.data.num_eval = 16
    c.eval.batch_prompts = 16
    c.rl.sampler.max_new_tokens = 5
    return c


def test_early_end_rate_falls_as_the_budget_grows():
    c = _settings()
    tok = build.build_tokenizer(settings_lib.settings_from_config(c).model)
    # A random model with tied embeddings repeats its last token: a two-token opening ("=*")
    # keeps its repeated "*" from reopening the block.
    c.rl.sampler.think_open = tuple(tok.encode("=*"))
    c.rl.sampler.think_close = tuple(tok.encode(")"))
    c.rl.sampler.think_stop = tuple(tok.encode(")"))
    tok, params, model_cfg, s = build.policy_and_settings(settings_lib.settings_from_config(c))
    examples = build.load_examples(s.data)[1]
    points = thinking_budget.budget_curve(params, model_cfg, tok, s, examples, (0, 1, 3))
    assert [p.budget for p in points] == [0, 1, 3]
    none, one, three = points
    assert none.early_end_rate == 0.0  # no budget: nothing is injected
    # Greedy rows agree up to the budget, so a shorter budget ends at least as many thoughts.
    assert one.early_end_rate >= three.early_end_rate
    assert one.early_end_rate > 0  # a random model rarely closes its block in one token
    for p in points:
        assert 0 <= p.accuracy <= 1 and 1 <= p.length <= 5
    # The pipeline's columns are the same points.
    columns = pipeline_eval.budget_rates(params, model_cfg, tok, s, examples, (1, 3))
    assert columns == {
        "acc. budget 1": one.accuracy,
        "early end budget 1": one.early_end_rate,
        "acc. budget 3": three.accuracy,
        "early end budget 3": three.early_end_rate,
    }


def test_table_by_hand():
    points = [
        thinking_budget.BudgetPoint(0, 0.5, 0.0, 4.0, 0.25),
        thinking_budget.BudgetPoint(2, 0.25, 0.75, 3.5, 0.0),
    ]
    lines = thinking_budget.markdown_table(points).splitlines()
    assert lines[2] == "| none | 0.500 | 0.000 | 4.0 | 0.250 |"
    assert lines[3] == "| 2 | 0.250 | 0.750 | 3.5 | 0.000 |"


def test_a_budget_needs_the_think_tokens():
    c = _settings()
    tok, params, model_cfg, s = build.policy_and_settings(settings_lib.settings_from_config(c))
    with pytest.raises(ValueError, match="needs think_open"):
        thinking_budget.budget_curve(
            params, model_cfg, tok, s, build.load_examples(s.data)[1], (2,)
        )
