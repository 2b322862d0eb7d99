"""Two processes on localhost, 4 CPU devices each, train on one mesh spanning both.

They run the fused step, save a checkpoint (orbax, every process writing its own shards), restore
it into the sharded state and run another step; the result must equal one process with 8 devices.
The worker is this file run as a module: `python -m tests.test_multihost PROCESS_ID PORT OUT`.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
MESH = (2, 2, 2)
STEPS = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(jax, mesh, checkpoint_dir=None):
    """`STEPS` sharded steps; with `checkpoint_dir`, a save and restore after the first.

    Returns: (per-step metrics as numpy dicts, the final state's leaves gathered to numpy).
    """
    from jax.experimental import multihost_utils

    from rlvr_jax.model import sharding
    from rlvr_jax.program.runtime import checkpoint as ckpt_lib
    from rlvr_jax.rl import sharding_plan
    from rlvr_jax.rl import state as state_lib
    from rlvr_jax.rl import train_step as ts
    from tests.test_sharding import B, G, _fresh_state, make_task

    cfg, rl, ocfg, reward_fn, batch = make_task()
    opt, state = _fresh_state(cfg, ocfg)
    plan = sharding_plan.plan_step(state, cfg, mesh, B * G)
    state = sharding.place(state, plan.state)
    step = ts.build_train_step(
        cfg, rl, opt, state_lib.learning_rate_schedule(ocfg), reward_fn, plan
    )
    metrics = []
    for i in range(STEPS):
        state, m = step(state, sharding.place(batch(i), plan.rows))
        metrics.append({k: np.asarray(v) for k, v in jax.device_get(m.metrics).items()})
        if checkpoint_dir is not None and i == 0:
            with ckpt_lib.Checkpointer(checkpoint_dir, every_steps=1, ref_source=None) as ck:
                ck.save(1, state, {"step": 1, "process": jax.process_index()}, force=True)
                ck.wait()
                restored, host = ck.restore(state)
            assert host["step"] == 1
            # The primary process alone wrote the host JSON.
            assert host["process"] == 0, host
            for got, want in zip(
                jax.tree.leaves(restored), jax.tree.leaves(plan.state), strict=True
            ):
                assert got.sharding.is_equivalent_to(want, got.ndim), (got.sharding, want)
            state = restored
    raw = lambda x: (
        jax.random.key_data(x) if jax.numpy.issubdtype(x.dtype, jax.dtypes.prng_key) else x
    )  # noqa: E731
    leaves = [
        np.asarray(multihost_utils.process_allgather(raw(x), tiled=True))
        for x in jax.tree.leaves(state)
    ]
    return metrics, leaves


def _worker(process_id: int, port: int, out: str) -> None:
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", 4)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id
    )
    assert jax.device_count() == 8 and jax.local_device_count() == 4
    from rlvr_jax.model import sharding

    mesh = sharding.make_mesh(sharding.MeshConfig(*MESH))
    assert {d.process_index for d in mesh.devices.flat} == {0, 1}
    metrics, leaves = _train(jax, mesh, checkpoint_dir=Path(out) / "checkpoints")
    np.savez(
        Path(out) / f"process{process_id}.npz",
        **{f"m{i}/{k}": v for i, m in enumerate(metrics) for k, v in m.items()},
        **{f"leaf{i}": x for i, x in enumerate(leaves)},
    )
    jax.distributed.shutdown()


@pytest.mark.processes
def test_two_processes_train_like_one_with_eight_devices(tmp_path):
    import jax

    from rlvr_jax.model import sharding

    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.test_multihost", str(i), str(port), str(tmp_path)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    # The single-process reference, while the workers start.
    want_metrics, want_leaves = _train(jax, sharding.make_mesh(sharding.MeshConfig(*MESH)))
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out
    for i in range(2):
        got = np.load(tmp_path / f"process{i}.npz")
        for s, want in enumerate(want_metrics):
            for k, v in want.items():
                np.testing.assert_allclose(got[f"m{s}/{k}"], v, atol=2e-5, rtol=1e-5, err_msg=k)
        for j, want in enumerate(want_leaves):
            np.testing.assert_allclose(got[f"leaf{j}"], want, atol=1e-4, err_msg=f"leaf {j}")
    assert float(want_metrics[0]["reward/std"]) > 0
    assert (tmp_path / "checkpoints" / "1" / "host").is_dir()


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
