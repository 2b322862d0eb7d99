"""benchmarks/rollout.py's host simulation of the two decode loops (`schedule`), which its
on-paper TPU projection reads: the simulated decode steps equal the steps the loops ran, and
the projection charges a rollout for the rows and windows it computes."""

import importlib.util
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from rlvr_jax.model import decode
from rlvr_jax.model.config import PRESETS
from rlvr_jax.sampling.config import SamplerConfig, sampling_params
from rlvr_jax.sampling.continuous import generate_continuous
from rlvr_jax.sampling.loop import generate, num_cache_slots

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(
            "rollout_bench", ROOT / "benchmarks/rollout.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["rollout_bench"] = module
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("rollout_bench", None)
        sys.path.remove(str(ROOT / "benchmarks"))


def test_the_simulated_schedule_runs_the_steps_the_loops_ran(bench):
    import workloads

    N, T, P = 24, 40, 8
    cfg = PRESETS["tiny"].replace(num_layers=1)
    params, cfg, end = workloads.forced_length_model(cfg, T)
    want = np.random.default_rng(0).integers(1, T + 1, N).astype(np.int32)
    want[5] = 1  # a row that ends with its first token
    prompt, lengths = workloads.forcing_prompts(want, T, P, 512, np.random.default_rng(1))
    scfg = SamplerConfig(max_new_tokens=T, eos_ids=(end,), attention_chunk=8)
    windows = decode.attention_windows(P, num_cache_slots(P, scfg), scfg.attention_chunk)
    args = (params, prompt, lengths, jax.random.key(0), sampling_params(N), None)
    r, _ = generate(*args, model_cfg=cfg, cfg=scfg)
    np.testing.assert_array_equal(np.asarray(r.lengths_N), want)
    static = bench.schedule(want, None, P, windows)
    assert len(static) == want.max() - 1 and all(rows == N for rows, _, _ in static)
    assert [w for _, w, _ in static] == sorted(w for _, w, _ in static)  # the window grows
    # The live rows fill at most the window each: a per-row kernel reads less.
    assert all(filled <= rows * w for rows, w, filled in static)
    seconds = {None: bench.on_paper(static, params, cfg)}
    for M in (1, 4, 7, N):
        _, stats, _ = generate_continuous(*args, model_cfg=cfg, cfg=scfg, num_slots=M)
        steps = bench.schedule(want, M, P, windows)
        assert len(steps) == int(stats.decode_steps), M
        assert all(rows == M and w in windows and filled <= M * w for rows, w, filled in steps)
        seconds[M] = bench.on_paper(steps, params, cfg)
        assert bench.on_paper(steps, params, cfg, ragged=True) <= seconds[M]
    # As many slots as rows is the static loop's schedule, but a window shrinks when the rows
    # feeding the largest slots end; a model this small reads mostly weights, once a step, so
    # fewer slots (more steps) cost more.
    assert seconds[N] <= seconds[None] < seconds[7] < seconds[4] < seconds[1]
