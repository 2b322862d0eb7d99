"""configs/tiny_moe.py: a mixture-of-experts policy trains with RL on a CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from configs import tiny_moe
from rlvr_jax.model import config as config_lib
from rlvr_jax.program import settings as settings_lib

REPO = Path(__file__).resolve().parents[1]


def test_the_config_is_the_tiny_task_on_an_moe_model():
    s = settings_lib.settings_from_config(tiny_moe.get_config())
    assert s.model.source == "random:tiny-moe" and s.model.moe_dispatch == "auto"
    assert config_lib.PRESETS["tiny-moe"].is_moe
    assert (s.data.name, s.reward.verifier, s.train.steps) == ("arithmetic", "arithmetic", 20)


@pytest.mark.slow
def test_rl_raises_the_reward_of_the_moe_model(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "rlvr_jax.main",
        f"--config={REPO / 'configs' / 'tiny_moe.py'}",
        f"--workdir={tmp_path / 'run'}",
    ]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    reward = {r["step"]: r["reward/mean"] for r in rows if "reward/mean" in r}
    # Seeded on CPU: 0.09 at step 5, 0.55 at step 20 (2026-12-04).
    assert reward[20] > reward[5] + 0.2, reward
