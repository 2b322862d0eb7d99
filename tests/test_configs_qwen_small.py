"""configs/qwen_small.py is consistent: settings, data, template, sizes (no 0.5B model is run)."""

from pathlib import Path

import jax
import numpy as np
import pytest

from configs import qwen_small
from rlvr_jax import train
from rlvr_jax.data import templates
from rlvr_jax.model import config as config_lib
from rlvr_jax.model import transformer as tf
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.rl import state as state_lib

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "arg, model_type", [(None, "qwen2"), ("qwen2.5", "qwen2"), ("qwen3", "qwen3")]
)
def test_config_is_consistent(arg, model_type, monkeypatch):
    monkeypatch.chdir(REPO)  # data.path is relative to the checkout, as the docstring says
    config = qwen_small.get_config(arg)
    preset = qwen_small.PRESETS[config.model.source]
    config.model.source = f"random:{preset}"
    s = settings_lib.settings_from_config(config)
    assert s.train.stage == "rl"
    assert (s.reward.verifier, s.reward.format, s.data.template) == ("math", "r1", "r1_zero")
    assert not templates.get_template(s.data.template).chat

    train_ex, eval_ex, notes = train.load_examples(s.data)
    assert notes == []
    assert len(train_ex) == 7473 and len(eval_ex) == s.data.num_eval == 256
    assert {ex.source for ex in train_ex + eval_ex} == {"gsm8k"}
    assert all(ex.answer.lstrip("-").replace(".", "").isdigit() for ex in eval_ex)
    assert len(train_ex) >= s.train.batch_prompts

    cfg = config_lib.PRESETS[preset].replace(
        dtype=s.model.dtype, param_dtype=s.model.param_dtype, remat=s.model.remat
    )
    assert cfg.model_type == model_type
    assert max(s.data.buckets) + s.rl.sampler.max_new_tokens <= cfg.max_position_embeddings
    # The docstring's memory arithmetic: f32 parameters, gradients and two Adam moments.
    state = jax.eval_shape(
        lambda: state_lib.init_train_state(
            tf.init_params(jax.random.key(0), cfg),
            state_lib.make_optimizer(s.optim),
            jax.random.key(0),
            use_reference=s.rl.loss.kl_beta > 0,
        )
    )
    nbytes = sum(x.size * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(state.params))
    nbytes += sum(
        x.size * np.dtype(x.dtype).itemsize
        for x in jax.tree.leaves(state.opt_state)
        if hasattr(x, "dtype")
    )
    grads = sum(x.size * 4 for x in jax.tree.leaves(state.params))
    assert 6 * 2**30 < nbytes + grads < 12 * 2**30
    assert state.ref_params is None  # no KL term: no reference copy
    rows = s.train.batch_prompts * s.rl.group_size
    assert rows % (s.rl.num_minibatches * s.rl.num_microbatches) == 0


def test_unknown_argument_is_named():
    with pytest.raises(ValueError, match="qwen_small.py:llama"):
        qwen_small.get_config("llama")
