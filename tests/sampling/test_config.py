"""Static settings and per-row values: errors that name the bad value, hashable configs."""

from __future__ import annotations

import pytest

from rlvr_jax.sampling.config import SamplerConfig, sampling_params


def test_config_errors_name_the_bad_value():
    with pytest.raises(ValueError, match="think_stop=.*must end with think_close"):
        SamplerConfig(8, think_open=(1,), think_close=(2,), think_budget=4, think_stop=(3, 4))
    with pytest.raises(ValueError, match="think_budget=4 needs"):
        SamplerConfig(8, think_budget=4)
    with pytest.raises(ValueError, match="method='beam'"):
        SamplerConfig(8, method="beam")
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        SamplerConfig(0)
    with pytest.raises(ValueError, match="layer_loop='python'"):
        SamplerConfig(8, layer_loop="python")
    with pytest.raises(ValueError, match="empty sequence"):
        SamplerConfig(8, stop_sequences=((1, 2), ()))
    with pytest.raises(ValueError, match="top_p=0.0 \\(row 1\\)"):
        sampling_params(3, top_p=[1.0, 0.0, 0.5])
    with pytest.raises(ValueError, match="top_p=1.5"):
        sampling_params(3, top_p=1.5)
    with pytest.raises(ValueError, match="min_p=1.0"):
        sampling_params(3, min_p=1.0)
    with pytest.raises(ValueError, match="temperature=nan"):
        sampling_params(3, temperature=float("nan"))
    with pytest.raises(ValueError, match="temperature=0.0"):
        sampling_params(3, temperature=0.0)
    with pytest.raises(ValueError, match=r"expected a scalar or \(3,\)"):
        sampling_params(3, temperature=[1.0, 1.0])
    # Configs are hashable static arguments, lists included.
    assert hash(SamplerConfig(4, eos_ids=[1, 2], stop_sequences=[[3, 4]])) == hash(
        SamplerConfig(4, eos_ids=(1, 2), stop_sequences=((3, 4),))
    )
