"""Checkpoints: bit-exact round trips, keep-last-n, host JSON, reference by path, atomicity,
corrupt directories and the fallback past them, failed saves, sharded restore and the SIGTERM
guard."""

import dataclasses
import errno
import gc
import json
import os
import re
import shutil
import signal
import threading

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from rlvr_jax.model import config as config_lib
from rlvr_jax.model import transformer as tf
from rlvr_jax.program.runtime import checkpoint as ckpt_lib
from rlvr_jax.program.runtime import preemption
from rlvr_jax.rl import state as state_lib


def _raw(x):
    return jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x


def _assert_same(a, b):
    """Same tree structure, dtypes and bits (PRNG keys compared by their raw data)."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(_raw(x)), np.asarray(_raw(y)))


_init_params = jax.jit(tf.init_params, static_argnums=1)


def _state(seed: int, use_reference: bool = True, rng=None) -> state_lib.TrainState:
    """A tiny state whose every leaf is distinct: random parameters, random Adam moments and a
    non-zero update count (as after some training)."""
    params = _init_params(jax.random.key(seed), config_lib.PRESETS["tiny"])
    optimizer = state_lib.make_optimizer(state_lib.OptimConfig(learning_rate=1e-3))
    rng = jax.random.key(seed + 100) if rng is None else rng
    state = state_lib.init_train_state(params, optimizer, rng, use_reference)
    draw = np.random.default_rng(seed)

    def perturb(x):
        if jnp.issubdtype(x.dtype, jnp.floating):
            return jnp.asarray(draw.standard_normal(x.shape), x.dtype)
        return x + 3 + seed

    return dataclasses.replace(
        state, step=state.step + 5 + seed, opt_state=jax.tree.map(perturb, state.opt_state)
    )


@pytest.fixture(scope="module")
def saved():
    """One state, and an unrelated one of the same layout to restore into."""
    return _state(0), _state(1)


def _saved_paths(step_dir) -> str:
    return (step_dir / "state" / "_METADATA").read_text()


def test_round_trip_is_bit_exact_with_saved_reference(tmp_path, saved):
    state, other = saved
    host = {"data_position": 17, "curriculum": {"easy": [3, 4], "hard": 0.25}, "metrics_step": 1}
    with ckpt_lib.Checkpointer(tmp_path, every_steps=1, ref_source=None) as ckpt:
        assert ckpt.save(1, state, host)
    ckpt = ckpt_lib.Checkpointer(tmp_path, every_steps=1)
    restored, host_back = ckpt.restore(other)
    _assert_same(restored, state)
    assert host_back == host
    assert jnp.issubdtype(restored.rng.dtype, jax.dtypes.prng_key)
    # The key still draws the same numbers.
    np.testing.assert_array_equal(
        jax.random.uniform(restored.rng, (4,)), jax.random.uniform(state.rng, (4,))
    )
    meta = ckpt.read_meta()
    assert meta["ref_saved"] and meta["ref_source"] is None
    assert meta["rng_impl"] == "threefry2x32"
    assert "ref_params" in _saved_paths(ckpt.step_dir(1))
    ckpt.close()


def test_reference_recorded_by_path_not_written(tmp_path, saved):
    state, other = saved
    with ckpt_lib.Checkpointer(tmp_path, every_steps=1, ref_source="embedded") as ckpt:
        ckpt.save(3, state, {"data_position": 5})
        meta = ckpt.read_meta(3)
        assert meta["ref_source"] == "embedded" and not meta["ref_saved"]
        assert "ref_params" not in _saved_paths(ckpt.step_dir(3))
        assert "params" in _saved_paths(ckpt.step_dir(3))

        # A concrete target (the caller reloaded the reference from its source) keeps its own.
        restored, host = ckpt.restore(other)
        assert host == {"data_position": 5}
        _assert_same(restored.params, state.params)
        _assert_same(restored.opt_state, state.opt_state)
        assert restored.ref_params is other.ref_params

        # An abstract target cannot supply them: the caller reloads from meta["ref_source"].
        restored, _ = ckpt.restore(jax.eval_shape(lambda: other))
        assert restored.ref_params is None
        _assert_same(restored.params, state.params)
        _assert_same(restored.rng, state.rng)


def test_save_ref_overrides_the_source(tmp_path, saved):
    state, other = saved
    with ckpt_lib.Checkpointer(tmp_path, every_steps=1, ref_source="/m", save_ref=True) as ckpt:
        ckpt.save(2, state)
        assert ckpt.read_meta()["ref_saved"]
        restored, host = ckpt.restore(other)
    _assert_same(restored, state)
    assert host == {}


def test_state_without_reference_and_raw_key(tmp_path):
    state = _state(2, use_reference=False, rng=jax.random.PRNGKey(7))
    other = _state(3, use_reference=False, rng=jax.random.PRNGKey(8))
    with ckpt_lib.Checkpointer(tmp_path, every_steps=1) as ckpt:
        ckpt.save(4, state)
        assert ckpt.read_meta()["rng_impl"] is None
        restored, _ = ckpt.restore(other)
    assert restored.ref_params is None
    _assert_same(restored, state)
    assert restored.rng.dtype == jnp.uint32


def test_interval_keep_last_n_and_no_double_save(tmp_path, saved):
    state, _ = saved
    with ckpt_lib.Checkpointer(tmp_path, every_steps=2, keep=2, ref_source="embedded") as ckpt:
        assert ckpt.restore(state) is None
        assert ckpt.latest_step() is None
        started = [ckpt.save(step, state, {"step": step}) for step in range(1, 8)]
        assert started == [False, True, False, True, False, True, False]
        assert ckpt.save(7, state, {"step": 7}, force=True)
        assert not ckpt.save(7, state, {"step": 7}, force=True)  # already on disk
        ckpt.wait()
        assert ckpt.all_steps() == [6, 7]
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["6", "7"]
        assert ckpt.restore(state)[1] == {"step": 7}
        assert ckpt.restore(state, step=6)[1] == {"step": 6}
        with pytest.raises(ckpt_lib.CheckpointError, match=r"step 5 .*\[6, 7\]"):
            ckpt.restore(state, step=5)


def test_interrupted_save_is_not_the_latest(tmp_path, saved):
    state, other = saved
    with ckpt_lib.Checkpointer(tmp_path, every_steps=1, ref_source="embedded") as ckpt:
        ckpt.save(4, state, {"at": 4})
    # What a save killed mid-write leaves behind: orbax's temporary directory, half filled.
    partial = tmp_path / "9.orbax-checkpoint-tmp-1700000000000000"
    (partial / "state").mkdir(parents=True)
    (partial / "state" / "manifest.ocdbt").write_bytes(b"\x00garbage")
    with ckpt_lib.Checkpointer(tmp_path, read_only=True, every_steps=1) as reader:
        assert reader.latest_step() == 4
        restored, host = reader.restore(other)
        with pytest.raises(ckpt_lib.CheckpointError, match="read-only; cannot save step 5"):
            reader.save(5, state)
    assert host == {"at": 4}
    _assert_same(restored.params, state.params)
    assert partial.exists()  # a reader deletes nothing
    with ckpt_lib.Checkpointer(tmp_path, every_steps=1, ref_source="embedded") as ckpt:
        assert ckpt.latest_step() == 4
        assert not partial.exists()  # a writer clears what the interrupted save left


def test_corrupt_directory_names_path_and_step(tmp_path, saved, caplog):
    state, other = saved
    with ckpt_lib.Checkpointer(tmp_path, every_steps=1, ref_source="embedded") as ckpt:
        ckpt.save(4, state, {"at": 4})
        ckpt.save(5, state, {"at": 5})
    # Step 5's tree metadata is truncated; a stray "9" directory holds nothing.
    index = tmp_path / "5" / "state" / "_METADATA"
    index.write_bytes(index.read_bytes()[:10])
    (tmp_path / "9").mkdir()
    (tmp_path / "9" / "junk").write_text("x")
    ckpt = ckpt_lib.Checkpointer(tmp_path, every_steps=1, ref_source="embedded")
    with pytest.raises(ckpt_lib.CorruptCheckpointError, match=r"9 \(step 9\) is incomplete"):
        ckpt.restore(other, step=9)
    with pytest.raises(ckpt_lib.CorruptCheckpointError, match=r"5 \(step 5\)") as e:
        ckpt.restore(other, step=5)
    assert str(tmp_path / "5") in str(e.value)
    with caplog.at_level("WARNING"):
        restored, host = ckpt.restore(other)
    assert host == {"at": 4} and ckpt.restored_step == 4
    _assert_same(restored.params, state.params)
    skipped = [r.getMessage() for r in caplog.records if "is unreadable, trying" in r.getMessage()]
    assert [m.split()[2] for m in skipped] == ["9", "5"]
    ckpt.close()


def _truncate_largest_array_file(step_dir):
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file()]
    largest = max(files, key=lambda p: p.stat().st_size)
    largest.write_bytes(largest.read_bytes()[: largest.stat().st_size // 2])


# What a failing disk or an interrupted copy can leave in a finished step directory, and a
# word of the reason each is reported with.
_CORRUPTIONS = {
    "truncated array file": (_truncate_largest_array_file, "cannot restore"),
    "garbage meta": (
        lambda d: (d / "meta" / "metadata").write_bytes(b"\x00{not json"),
        "JSONDecodeError",
    ),
    "garbage host": (
        lambda d: (d / "host" / "metadata").write_bytes(b"\x00{not json"),
        "JSONDecodeError",
    ),
    "meta without keys": (
        lambda d: (d / "meta" / "metadata").write_text('{"version": 1}'),
        "without",
    ),
    "missing state item": (lambda d: shutil.rmtree(d / "state"), r"missing \['state'\]"),
    "missing host item": (lambda d: shutil.rmtree(d / "host"), r"missing \['host'\]"),
}


@pytest.fixture
def three_steps(tmp_path):
    """Steps 1, 2, 3 of a run, each with a different state; returns the states by step."""
    states = {step: _state(step) for step in (1, 2, 3)}
    with ckpt_lib.Checkpointer(tmp_path, every_steps=1, ref_source="embedded") as ckpt:
        for step, state in states.items():
            ckpt.save(step, state, {"at": step})
    return tmp_path, states


# Once one array read fails, orbax abandons the reads of the others unawaited; they are collected
# at the end of the test (not in a later one) and their notices dropped.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("kind", list(_CORRUPTIONS))
def test_unreadable_latest_falls_back_to_the_previous_step(three_steps, kind, caplog):
    directory, states = three_steps
    corrupt, reason = _CORRUPTIONS[kind]
    corrupt(directory / "3")
    target = jax.eval_shape(lambda: states[1])
    with ckpt_lib.Checkpointer(directory, every_steps=1, ref_source="embedded") as ckpt:
        with caplog.at_level("WARNING"):
            restored, host = ckpt.restore(target)
        assert host == {"at": 2} and ckpt.restored_step == 2
        _assert_same(restored.params, states[2].params)
        _assert_same(restored.opt_state, states[2].opt_state)
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        bad = [m for m in warnings if m.startswith("checkpoint step 3 is unreadable")]
        assert len(bad) == 1 and str(directory / "3") in bad[0]
        assert re.search(reason, bad[0]), bad[0]
        # Named explicitly, the bad step is an error, not a fallback.
        with pytest.raises(ckpt_lib.CorruptCheckpointError, match=r"step 3") as e:
            ckpt.restore(target, step=3)
        assert str(directory / "3") in str(e.value)
        assert ckpt.restored_step == 2
    gc.collect()


def test_every_step_unreadable_is_one_error_naming_each(three_steps, caplog):
    directory, states = three_steps
    _truncate_largest_array_file(directory / "3")
    (directory / "2" / "meta" / "metadata").write_bytes(b"\x00")
    shutil.rmtree(directory / "1" / "host")
    ckpt = ckpt_lib.Checkpointer(directory, every_steps=1, read_only=True)
    with pytest.raises(ckpt_lib.CorruptCheckpointError, match="no readable checkpoint") as e:
        ckpt.restore(jax.eval_shape(lambda: states[1]))
    message = str(e.value)
    for step in (3, 2, 1):
        assert f"step {step}: " in message and str(directory / str(step)) in message
    assert ckpt.restored_step is None
    ckpt.close()


def test_discard_after_lets_saving_continue_from_an_older_step(three_steps):
    directory, states = three_steps
    (directory / "3" / "meta" / "metadata").write_bytes(b"\x00")
    reader = ckpt_lib.Checkpointer(directory, read_only=True, every_steps=1)
    with pytest.raises(ckpt_lib.CheckpointError, match="read-only"):
        reader.discard_after(2)
    reader.close()
    target = jax.eval_shape(lambda: states[1])
    with ckpt_lib.Checkpointer(directory, every_steps=1, ref_source="embedded") as ckpt:
        ckpt.restore(target)
        assert ckpt.restored_step == 2
        assert ckpt.discard_after(ckpt.restored_step) == [3]
        assert ckpt.all_steps() == [1, 2] and not (directory / "3").exists()
        assert ckpt.discard_after(2) == []
        # Step 3 is written again, from the resumed state, and is the latest once more.
        assert ckpt.save(3, states[1], {"at": "3 again"})
        restored, host = ckpt.restore(target)
    assert host == {"at": "3 again"}
    _assert_same(restored.params, states[1].params)
    with ckpt_lib.Checkpointer(directory, every_steps=1, ref_source="embedded") as ckpt:
        assert ckpt.discard_after(0) == [1, 2, 3] and ckpt.latest_step() is None


@pytest.fixture
def disk_full(monkeypatch):
    """Every JSON item orbax writes fails as on a full disk (in its background thread)."""

    async def fail(self, item, directory):
        raise OSError(errno.ENOSPC, "No space left on device", str(directory / "metadata"))

    monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", fail)


def _assert_is_the_disk_error(e, directory, step):
    assert isinstance(e.__cause__, OSError) and e.__cause__.errno == errno.ENOSPC
    message = str(e)
    assert f"step {step} to {directory / str(step)}" in message
    assert "No space left on device" in message and str(directory) in message


def _release_then_fail(ckpt, message):
    """Makes releasing the manager of `ckpt` fail after it has released it."""
    release = ckpt._manager.close

    def close():
        release()
        raise RuntimeError(message)

    ckpt._manager.close = close


def test_failed_async_save_is_raised_by_close_not_a_cleanup_error(tmp_path, saved, disk_full):
    state, _ = saved
    ckpt = ckpt_lib.Checkpointer(tmp_path, every_steps=1, ref_source="embedded")
    assert ckpt.save(2, state)
    _release_then_fail(ckpt, "a secondary error while releasing")
    with pytest.raises(ckpt_lib.CheckpointError) as e:
        ckpt.close()
    _assert_is_the_disk_error(e.value, tmp_path, 2)
    ckpt.close()  # released: nothing more to report
    # With nothing to report first, an error while releasing is raised itself.
    with ckpt_lib.Checkpointer(tmp_path / "other", every_steps=1) as ckpt:
        _release_then_fail(ckpt, "release failed")
        with pytest.raises(ckpt_lib.CheckpointError, match="release failed"):
            ckpt.close()


def test_failed_async_save_is_raised_once_by_wait_or_the_next_save(tmp_path, saved, disk_full):
    state, _ = saved
    with (
        pytest.raises(ckpt_lib.CheckpointError) as e,
        ckpt_lib.Checkpointer(tmp_path, every_steps=1, ref_source="embedded") as ckpt,
    ):
        ckpt.save(1, state)
    _assert_is_the_disk_error(e.value, tmp_path, 1)

    # Fresh directories: the failed save's array writes may still be landing in its own.
    ckpt = ckpt_lib.Checkpointer(tmp_path / "b", every_steps=1, ref_source="embedded")
    ckpt.save(3, state)
    with pytest.raises(ckpt_lib.CheckpointError) as e:
        ckpt.save(4, state)  # the next save reports the failure of the previous one
    _assert_is_the_disk_error(e.value, tmp_path / "b", 3)
    assert ckpt.all_steps() == []  # the failed save is not a checkpoint
    ckpt.close()  # already reported

    ckpt = ckpt_lib.Checkpointer(tmp_path / "c", every_steps=1, ref_source="embedded")
    ckpt.save(5, state)
    with pytest.raises(ckpt_lib.CheckpointError) as e:
        ckpt.wait()
    _assert_is_the_disk_error(e.value, tmp_path / "c", 5)
    ckpt.wait()
    ckpt.close()


def test_an_error_in_the_body_is_not_replaced_by_a_failed_save(tmp_path, saved, disk_full, caplog):
    state, _ = saved
    with (
        pytest.raises(ZeroDivisionError),
        caplog.at_level("ERROR"),
        ckpt_lib.Checkpointer(tmp_path, every_steps=1, ref_source="embedded") as ckpt,
    ):
        ckpt.save(1, state)
        1 / 0  # noqa: B018
    logged = [r.getMessage() for r in caplog.records if r.name == "root"]
    assert any("saving step 1" in m and "No space left" in m for m in logged)


def test_mismatched_target_is_a_clear_error(tmp_path, saved):
    state, _ = saved
    small = _state(0)
    small = dataclasses.replace(
        small, params=dataclasses.replace(small.params, embed=small.params.embed[:8])
    )
    with ckpt_lib.Checkpointer(tmp_path, every_steps=1) as ckpt:
        ckpt.save(1, state)
        ckpt.save(2, state)
        # A readable checkpoint that does not fit is the caller's error: no fallback to step 1.
        with pytest.raises(
            ckpt_lib.CheckpointError, match=r"step 2.*params.embed: saved \(512, 64\)"
        ) as e:
            ckpt.restore(small)
        assert not isinstance(e.value, ckpt_lib.CorruptCheckpointError)
        no_ref = dataclasses.replace(state, ref_params=None)
        with pytest.raises(ckpt_lib.CheckpointError, match="reference parameters"):
            ckpt.restore(no_ref)


def test_bad_arguments_name_the_value(tmp_path, saved):
    state, _ = saved
    with pytest.raises(ValueError, match="keep=0"):
        ckpt_lib.Checkpointer(tmp_path, every_steps=1, keep=0)
    with pytest.raises(ValueError, match="every_steps=-1"):
        ckpt_lib.Checkpointer(tmp_path, every_steps=-1)
    with ckpt_lib.Checkpointer(tmp_path, every_steps=1) as ckpt:
        with pytest.raises(TypeError, match="'curriculum'"):
            ckpt.save(1, state, {"curriculum": {1, 2}})
        with pytest.raises(ValueError, match="step=-3"):
            ckpt.save(-3, state)
        assert ckpt.all_steps() == []


def test_restore_follows_the_target_sharding(tmp_path, saved):
    state, other = saved
    mesh = Mesh(np.array(jax.devices()[:8]), ("fsdp",))
    replicated = NamedSharding(mesh, P())
    rows = NamedSharding(mesh, P("fsdp"))

    def place(x):
        sharded = x.ndim >= 1 and x.shape[0] % 8 == 0 and x.shape[0] >= 64
        return jax.device_put(x, rows if sharded else replicated)

    target = jax.tree.map(place, other)
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), target
    )
    with ckpt_lib.Checkpointer(tmp_path, every_steps=1, ref_source="embedded") as ckpt:
        ckpt.save(1, state)
        for into in (target, abstract):
            restored, _ = ckpt.restore(into)
            assert restored.params.embed.sharding == rows
            assert restored.opt_state[1][0].mu.embed.sharding == rows
            assert restored.step.sharding == replicated
            _assert_same(restored.params, state.params)
            _assert_same(restored.rng, state.rng)


def test_preemption_guard_catches_sigterm_and_restores_handler():
    before = signal.getsignal(signal.SIGTERM)
    with preemption.PreemptionGuard() as guard:
        assert not guard.requested and not guard.should_stop()
        assert signal.getsignal(signal.SIGTERM) != before
        os.kill(os.getpid(), signal.SIGTERM)
        # The handler runs at the next bytecode boundary of the main thread.
        for _ in range(1000):
            if guard.requested:
                break
        assert guard.requested and guard.should_stop()
        assert guard.received == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) == before
    with pytest.raises(RuntimeError, match="already installed"), guard, guard:
        pass
    assert signal.getsignal(signal.SIGTERM) == before


def test_host_json_is_copied_at_save_time(tmp_path, saved):
    state, other = saved
    host = {"curriculum": {"a": [1]}}
    with ckpt_lib.Checkpointer(tmp_path, every_steps=1, ref_source="embedded") as ckpt:
        ckpt.save(1, state, host)
        host["curriculum"]["a"].append(2)  # mutation after save must not leak into the file
        _, back = ckpt.restore(other)
    assert back == {"curriculum": {"a": [1]}}
    assert json.loads((tmp_path / "1" / "meta" / "metadata").read_text())["version"] == 1


def _orbax_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if type(t).__module__.startswith("orbax.")]


def test_a_failed_save_leaves_no_background_thread_waiting(tmp_path, saved):
    """The checkpoints replaced by a file: orbax's writers of the save wait for a directory that
    is never made; the error releases them, so nothing keeps the process from exiting."""
    state, other = saved
    ckpt = ckpt_lib.Checkpointer(tmp_path / "ck", every_steps=1, ref_source="embedded")
    ckpt.save(1, state)
    ckpt.wait()
    (tmp_path / "ck").rename(tmp_path / "aside")
    (tmp_path / "ck").write_text("")
    with pytest.raises(ckpt_lib.CheckpointError, match="Not a directory") as e:
        ckpt.save(2, state)
        ckpt.wait()
    assert f"step 2 to {tmp_path / 'ck' / '2'}" in str(e.value)
    assert _orbax_threads() == []
    ckpt.close()
    (tmp_path / "ck").unlink()
    (tmp_path / "aside").rename(tmp_path / "ck")
    with ckpt_lib.Checkpointer(tmp_path / "ck", every_steps=1, ref_source="embedded") as again:
        restored, _ = again.restore(other)
    _assert_same(restored.params, state.params)


def test_a_file_in_place_of_the_directory_is_refused_when_opened(tmp_path):
    (tmp_path / "ck").write_text("")
    with pytest.raises(ckpt_lib.CheckpointError, match=r"ck is not a directory \(a file is in"):
        ckpt_lib.Checkpointer(tmp_path / "ck", every_steps=1)


def test_keyboard_interrupt_gives_up_the_save_in_flight(tmp_path, saved):
    state, other = saved
    with (
        pytest.raises(KeyboardInterrupt),
        ckpt_lib.Checkpointer(tmp_path, every_steps=1, ref_source="embedded") as ckpt,
    ):
        ckpt.save(1, state)
        ckpt.wait()
        ckpt.save(2, state)
        raise KeyboardInterrupt
    assert _orbax_threads() == []
    assert ckpt.complete_steps()[0] == 1  # step 2 may have completed, or not
    with pytest.raises(ckpt_lib.CheckpointError, match="read-only|closed|cannot"):
        ckpt.save(3, state)
    with ckpt_lib.Checkpointer(tmp_path, every_steps=1, ref_source="embedded") as again:
        assert again.all_steps() == ckpt.complete_steps()
        restored, _ = again.restore(other)
        again.save(3, state)
    _assert_same(restored.params, state.params)
    # The given-up save's temporary directory is never a step; a writer removes it, unless its
    # array writes were still landing when that writer opened (logged): then the next one does.
    with ckpt_lib.Checkpointer(tmp_path, every_steps=1, ref_source="embedded") as last:
        assert 3 in last.all_steps()
    assert not any("tmp" in p.name for p in tmp_path.iterdir())
