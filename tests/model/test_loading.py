"""Every weight source a config can name resolves, and a bad one is named in the error."""

import jax
import numpy as np
import pytest

from rlvr_jax.data import tokenizer as tokenizer_lib
from rlvr_jax.model import hf, loading
from rlvr_jax.model import transformer as tf


def test_random_preset_is_seeded():
    a, cfg = loading.load_model("random:tiny", seed=3, dtype="bfloat16")
    b, _ = loading.load_model("random:tiny", seed=3)
    c, _ = loading.load_model("random:tiny", seed=4)
    assert cfg.dtype == "bfloat16" and cfg.model_type == "qwen2"
    np.testing.assert_array_equal(np.asarray(a.embed), np.asarray(b.embed))
    assert not np.array_equal(np.asarray(a.embed), np.asarray(c.embed))
    assert tokenizer_lib.load_tokenizer("random:tiny") is None


def test_hf_directory_source(tmp_path):
    params, cfg = loading.load_model("random:tiny")
    hf.save_hf(params, cfg, tmp_path / "ckpt")
    again, cfg2 = loading.load_model(str(tmp_path / "ckpt"))
    assert cfg2 == cfg
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_bad_sources_are_named():
    with pytest.raises(ValueError, match="'nope'"):
        loading.load_model("random:nope")
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        loading.load_model("/tmp/missing.gguf")
    with pytest.raises(FileNotFoundError, match="/no/such/checkpoint"):
        loading.load_model("/no/such/checkpoint")


@pytest.mark.slow
def test_embedded_source_is_smollm2():
    params, cfg = loading.load_model("embedded")
    assert cfg.num_layers == 30 and tf.count_params(params) == 134_515_008
    tok = tokenizer_lib.load_tokenizer("embedded")
    assert tok.decode(tok.encode("Paris")) == "Paris"
