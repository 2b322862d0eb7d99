"""configs/qwen_small.py is consistent: settings, data, template, sizes (no 0.5B model is run).

GSM8K comes from the Hugging Face hub by default, which no test reaches: the hub test stands in a
fake `datasets` module, and the local-path override reads the shared JSONL copy where it exists.
"""

import sys
import types
from pathlib import Path

import jax
import numpy as np
import pytest

from configs import qwen_small
from rlvr_jax.data import templates
from rlvr_jax.model import config as config_lib
from rlvr_jax.model import transformer as tf
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.parts import build
from rlvr_jax.rl import state as state_lib
from tests.shared_data import needs_shared_data

REPO = Path(__file__).resolve().parents[1]
# The override the config's docstring gives, relative to the checkout.
LOCAL_GSM8K = "../shared/data/gsm8k"


def _settings(arg=None, **data):
    config = qwen_small.get_config(arg)
    config.model.source = f"random:{qwen_small.PRESETS[config.model.source]}"
    for key, value in data.items():
        config.data[key] = value
    return settings_lib.settings_from_config(config)


@pytest.mark.parametrize(
    "arg, model_type", [(None, "qwen2"), ("qwen2.5", "qwen2"), ("qwen3", "qwen3")]
)
def test_config_is_consistent(arg, model_type):
    preset = qwen_small.PRESETS[qwen_small.get_config(arg).model.source]
    s = _settings(arg)
    assert s.train.stage == "rl"
    assert (s.reward.verifier, s.reward.format, s.data.template) == ("math", "r1", "r1_zero")
    assert not templates.get_template(s.data.template).chat
    # No path: the hub, so a checkout anywhere needs no sibling data directory.
    assert (s.data.name, s.data.path, s.data.split, s.data.eval_split) == (
        "gsm8k",
        "",
        "train",
        "test",
    )
    assert s.data.num_eval == 256

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


def test_default_reads_both_gsm8k_splits_from_the_hub(monkeypatch):
    calls = []
    rows = {"train": 1007, "test": 1003}

    def load_dataset(path, config, split):
        calls.append((path, config, split))
        return [
            {"question": f"{split} question {i}?", "answer": f"work\n#### {i:,}"}
            for i in range(rows[split])
        ]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    s = _settings()
    train_ex, eval_ex, notes = build.load_examples(s.data)
    assert calls == [("openai/gsm8k", "main", "train"), ("openai/gsm8k", "main", "test")]
    assert notes == []
    assert len(train_ex) == 1007 and len(eval_ex) == s.data.num_eval == 256
    assert train_ex[0].id == "gsm8k/train/0" and eval_ex[0].id == "gsm8k/test/0"
    assert eval_ex[-1].answer == "255" and train_ex[-1].answer == "1006"  # "1,006": commas go


@needs_shared_data
def test_local_path_override_reads_the_shared_copy(monkeypatch):
    monkeypatch.chdir(REPO)  # the docstring's path is relative to the checkout
    # The hub must not be consulted when a path is given.
    monkeypatch.setitem(sys.modules, "datasets", None)
    s = _settings(path=LOCAL_GSM8K)
    assert LOCAL_GSM8K in qwen_small.__doc__
    train_ex, eval_ex, notes = build.load_examples(s.data)
    assert notes == []
    assert len(train_ex) == 7473 and len(eval_ex) == s.data.num_eval == 256
    assert {ex.source for ex in train_ex + eval_ex} == {"gsm8k"}
    assert all(ex.answer.lstrip("-").replace(".", "").isdigit() for ex in eval_ex)
    assert len(train_ex) >= s.train.batch_prompts


def test_unknown_argument_is_named():
    with pytest.raises(ValueError, match="qwen_small.py:llama"):
        qwen_small.get_config("llama")


def test_long_answer_setting_thinks_within_a_budget_with_continuous_batching():
    s = _settings("qwen3_long")
    assert s.data.template == "qwen3_thinking" and s.reward.verifier == "math"
    sampler = s.rl.sampler
    assert sampler.max_new_tokens == 4096 and 0 < sampler.think_budget < 4096
    assert sampler.think_open == (qwen_small.QWEN3_THINK_OPEN,)
    assert sampler.think_stop[-len(sampler.think_close) :] == sampler.think_close
    rows = s.train.batch_prompts * s.rl.group_size
    assert s.rl.slots_for(rows) == rows // 4  # continuous batching at this length
    assert s.rl.auto_microbatches and s.rl.memory_budget_gib == 16.0
    assert templates.get_template(s.data.template).chat
