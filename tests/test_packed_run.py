"""A whole RL run with the packed update (`rl.pack`) gives the padded run's numbers.

No KL term here: at the first step the policy is its reference, and Adam would turn the KL
gradient's float noise (1e-9, different in the two layouts) into a visible update; the KL
estimators are compared at the update level in tests/rl/test_packing.py."""

import json
from pathlib import Path

import numpy as np
import pytest

from configs import tiny
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.stages import rl_stage
from rlvr_jax.rl import packing as packing_lib

SKIP = ("time/", "throughput/", "verifier/", "useful/", "startup/")


def _run(workdir: Path, **rl) -> list[dict]:
    c = tiny.get_config()
    c.data.num_train = 64
    c.data.num_eval = 8
    c.eval.batch_prompts = 8
    c.train.batch_prompts = 4
    c.train.steps = 3
    c.train.use_tensorboard = False
    c.rl.num_microbatches = 2
    for key, value in rl.items():
        setattr(c.rl, key, value)
    rl_stage.run(settings_lib.settings_from_config(c), workdir, log=lambda _: None)
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("minibatches", [1, 2])
def test_packed_and_padded_runs_log_the_same_metrics(tmp_path, monkeypatch, minibatches):
    # The tiny task's 3-token answers save too few positions for packing to pay
    # (`packing.worth_packing`); the run compares numbers, so it packs anyway.
    monkeypatch.setattr(packing_lib, "WORTH_PACKING", 10.0)
    taken = []  # each step's layouts
    worth = rl_stage._worth
    monkeypatch.setattr(rl_stage, "_worth", lambda *a: taken.append(x := worth(*a)) or x)
    padded = _run(tmp_path / "padded", pack=False, num_minibatches=minibatches)
    packed = _run(tmp_path / "packed", pack=True, num_minibatches=minibatches)
    assert len(taken) == 3 * (1 + (minibatches > 1)) and all(x is not None for x in taken)
    assert [r["step"] for r in packed] == [r["step"] for r in padded]
    for x, y in zip(padded, packed, strict=True):
        keys = {k for k, v in x.items() if not k.startswith(SKIP) and not isinstance(v, str)}
        assert keys <= set(y), keys - set(y)
        for k in sorted(keys):
            np.testing.assert_allclose(y[k], x[k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert any(r.get("grad_norm", 0) > 0 for r in packed)
