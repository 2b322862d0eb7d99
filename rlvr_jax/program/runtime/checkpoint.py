"""Checkpoints of a run: the train state through orbax, host state as JSON, and preemption.

Host code. One checkpoint is one orbax step directory `<directory>/<step>/` with three items:

- `state`: the `TrainState` as a dict of arrays (step, params, optimizer state, the PRNG key as
  its raw `key_data`, and the reference parameters only when they cannot be rebuilt from a
  source); for a LoRA policy whose base the source rebuilds, the adapters only;
- `host`: whatever JSON the caller passes (data position, curriculum statistics, metrics step);
- `meta`: this module's own record (format version, where the reference parameters come from,
  the PRNG implementation, wall-clock time).

Orbax writes each step into a temporary directory and renames it when complete, so a save that is
interrupted (preemption, crash, full disk) never becomes the latest checkpoint. Saves are
asynchronous by default: `save` returns once the arrays are copied to host memory and the files
are written in the background; `close` (or `wait`) waits for the last one.

`restore` without a step takes the newest checkpoint that reads back: a step whose files are
damaged (a truncated array file, unreadable metadata, a missing item) is reported in a warning and
the previous one is tried, so one bad write costs the steps since the previous checkpoint, not the
run. A checkpoint that reads but does not fit the caller's state is the caller's error and is
raised. `discard_after` then removes the newer steps, so that saving continues from the restored
one. An asynchronous save that fails is raised by the next `wait`, `close` or save, once, as a
`CheckpointError` naming the step's directory, chained to the original error (an `OSError` for a
full disk); orbax's background threads of that save are released then (`checkpoint_threads`), so
a failed save never keeps the process from exiting. `abandon` gives up a save in flight (a second
Ctrl-C). A checkpoints path that is a file is refused when the directory is opened.

Every process of a multi-host run calls `save`, `restore` and `discard_after` (orbax coordinates
them); only the primary process writes the JSON items.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from rlvr_jax.model import lora as lora_lib
from rlvr_jax.program.runtime import checkpoint_layout as layout
from rlvr_jax.program.runtime import checkpoint_threads
from rlvr_jax.program.runtime.checkpoint_layout import (
    CheckpointError,
    CorruptCheckpointError,
    MissingCheckpointError,
)
from rlvr_jax.rl.state import TrainState

FORMAT_VERSION = 1
_STATE, _HOST, _META = "state", "host", "meta"
# How orbax names a leaf on disk ("opt_state.1.0.mu.embed").
_leaf_name = layout.leaf_name

# The metadata `restore` reads; a record without them is damaged.
_META_KEYS = ("ref_source", "ref_saved", "rng_impl")


def _check_json(host: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of `host` through JSON, so later mutation by the caller cannot race an
    asynchronous write; non-serialisable values are reported by key."""
    if not isinstance(host, Mapping):
        raise TypeError(f"host state must be a mapping, got {type(host).__name__}")
    out = {}
    for key, value in host.items():
        if not isinstance(key, str):
            raise TypeError(f"host state key {key!r} must be a str, got {type(key).__name__}")
        try:
            out[key] = json.loads(json.dumps(value))
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"host state entry {key!r} (a {type(value).__name__}) is not JSON-serialisable: {e}"
            ) from e
    return out


class Checkpointer:
    """Saves every `every_steps` steps (and when forced, e.g. at the end), keeps the last `keep`.

    Args:
      directory: where the step directories go (created if missing).
      every_steps: `should_save(step)` is true when `step % every_steps == 0`; 0 saves only when
        forced.
      keep: how many of the most recent checkpoints to keep.
      ref_source: where the reference parameters come from ("embedded", a Hugging Face directory
        or hub id). When set, the reference parameters are recorded by this string and not
        written; on restore the caller reloads them. None means they are not reproducible from a
        source and are written with the state (when the state has them). The same source
        rebuilds a LoRA policy's frozen base, so with it only the adapters are written.
      save_ref: write the reference parameters even when `ref_source` is set.
      async_save: write in a background thread after the device-to-host copy.
      read_only: only read (an evaluator watching a directory the trainer writes): nothing is
        deleted, saving is an error. A writer removes temporary directories left by interrupted
        saves when it opens the directory.

    Attributes:
      restored_step: the step the last `restore` read (after any fallback), None before one.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        every_steps: int,
        keep: int = 3,
        ref_source: str | None = None,
        save_ref: bool = False,
        async_save: bool = True,
        read_only: bool = False,
    ):
        if every_steps < 0:
            raise ValueError(f"every_steps={every_steps} must be >= 0 (0: only forced saves)")
        if keep < 1:
            raise ValueError(f"keep={keep} must be at least 1")
        if ref_source is not None and not (isinstance(ref_source, str) and ref_source):
            raise ValueError(f"ref_source={ref_source!r} must be a non-empty string or None")
        # epath, so that "gs://..." directories work as well as local ones.
        self.directory = epath.Path(directory)
        if "://" not in str(directory):
            self.directory = self.directory.absolute()
        self.read_only = read_only
        self.every_steps = every_steps
        self.keep = keep
        self.ref_source = ref_source
        self.save_ref = save_ref or ref_source is None
        local = "://" not in str(directory)
        if local and self.directory.exists() and not self.directory.is_dir():
            raise CheckpointError(
                f"checkpoint directory {self.directory} is not a directory (a file is in its "
                "place); move it away or use another workdir"
            )
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=not read_only,
            read_only=read_only,
            enable_async_checkpointing=async_save,
            # Temporary directories of interrupted saves are never read; a writer deletes them.
            cleanup_tmp_directories=not read_only,
        )
        try:
            self._manager = ocp.CheckpointManager(
                self.directory,
                options=options,
                # Handlers up front, so metadata can be read before the first restore.
                item_handlers={
                    _STATE: ocp.StandardCheckpointHandler(),
                    _HOST: ocp.JsonCheckpointHandler(),
                    _META: ocp.JsonCheckpointHandler(),
                },
            )
        except Exception as e:
            raise CheckpointError(f"cannot open checkpoint directory {self.directory}: {e}") from e
        # Orbax deletes the temporary directories of interrupted saves in the background and
        # awaits that only in its next save; wait now, so that opening a writer is enough.
        await_cleanup = getattr(self._manager, "_maybe_await_cleanup_tmp_directory", None)
        if not read_only and await_cleanup is not None:
            try:
                await_cleanup()
            except OSError as e:
                # The array writes of a save that failed can still be landing in its temporary
                # directory. Such a directory is never read, so it costs disk space, not the
                # run; orbax would otherwise raise this again at the first save.
                logging.warning("cannot remove a temporary directory in %s: %s", self.directory, e)
                self._manager._cleanup_tmp_directory_future = None
        self.restored_step: int | None = None
        self._saving: int | None = None  # the step of the save that `wait` waits for
        # Orbax's operation ids of the saves whose background threads may still run.
        self._operations: set[str] = set()
        self._closed = False

    # -- queries --------------------------------------------------------------------------------

    def all_steps(self) -> list[int]:
        """Steps of the complete checkpoints on disk, ascending (after any save in flight)."""
        self.wait()
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None when there is none."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def should_save(self, step: int) -> bool:
        """Whether `step` falls on the saving interval."""
        return self.every_steps > 0 and step > 0 and step % self.every_steps == 0

    def step_dir(self, step: int) -> epath.Path:
        """The directory of one step's checkpoint."""
        return self.directory / str(step)

    # -- save -----------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        state: TrainState,
        host: Mapping[str, Any] | None = None,
        *,
        force: bool = False,
    ) -> bool:
        """Saves `state` and `host` as checkpoint `step` when due (or when `force`).

        Args:
          step: the checkpoint's step number (a Python int: the loop counter, not a device value).
          state: the train state; its PRNG key may be a typed key or raw uint32 key data.
          host: JSON-serialisable host state (data position, curriculum, metrics step, ...).
          force: save even off the interval (the final step, a preemption).

        Returns:
          Whether a save was started. A step that is already on disk is not written again.
        """
        if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
            raise ValueError(f"step={step!r} must be a non-negative Python int")
        step = int(step)
        if self.read_only:
            raise CheckpointError(f"{self} is read-only; cannot save step {step}")
        if self._closed:
            raise CheckpointError(f"{self} is closed; cannot save step {step}")
        if not (force or self.should_save(step)):
            return False
        if step in self.all_steps():
            logging.info("checkpoint step %d already exists in %s; not saved again", step, self)
            return False
        host = _check_json(host or {})
        tree, meta = self._to_tree(state)
        meta["time"] = time.time()
        self._saving = step
        try:
            return bool(
                self._manager.save(
                    step,
                    args=ocp.args.Composite(
                        **{
                            _STATE: ocp.args.StandardSave(tree),
                            _HOST: ocp.args.JsonSave(host),
                            _META: ocp.args.JsonSave(meta),
                        }
                    ),
                    force=True,
                )
            )
        except Exception as e:
            self._release_threads()
            raise CheckpointError(f"saving step {step} to {self.step_dir(step)} failed: {e}") from e
        finally:
            operation = checkpoint_threads.current_operation()
            if operation is not None:
                self._operations.add(operation)

    def _to_tree(self, state: TrainState) -> tuple[dict[str, Any], dict[str, Any]]:
        # A LoRA policy whose base the source rebuilds saves its adapters only.
        has_lora = lora_lib.adapters_of(state.params) is not None
        adapters_only = has_lora and self.ref_source is not None
        params = {"lora": state.params.lora} if adapters_only else state.params
        tree = {"step": state.step, "params": params, "opt_state": state.opt_state}
        if layout.is_key(state.rng):
            tree["rng"] = jax.random.key_data(state.rng)
            rng_impl = str(jax.random.key_impl(state.rng))
        else:
            tree["rng"] = state.rng
            rng_impl = None
        ref_saved = state.ref_params is not None and self.save_ref
        if ref_saved:
            tree["ref_params"] = state.ref_params
        if state.critic is not None:
            tree["critic"] = state.critic
        meta = {
            "version": FORMAT_VERSION,
            "ref_source": self.ref_source,
            "ref_saved": ref_saved,
            "has_ref": state.ref_params is not None,
            "rng_impl": rng_impl,
            "has_critic": state.critic is not None,
            "has_lora": has_lora,
            "adapters_only": adapters_only,
        }
        return tree, meta

    # -- restore --------------------------------------------------------------------------------

    def read_meta(self, step: int | None = None) -> dict[str, Any]:
        """This module's record of checkpoint `step` (default: the latest): "ref_source",
        "ref_saved", "has_ref", "rng_impl", "time", "version".

        Raises:
          CorruptCheckpointError: the record is missing or unreadable.
        """
        step = self._resolve_step(step)
        self._check_items(step)
        return self._check_meta(step, self._restore_items(step, {_META: ocp.args.JsonRestore()}))

    def restore(
        self,
        target: TrainState | Callable[[dict[str, Any]], TrainState],
        step: int | None = None,
    ) -> tuple[TrainState, dict[str, Any]] | None:
        """Restores checkpoint `step` (default: the newest readable one) into `target`'s layout.

        Without a step, a checkpoint whose files cannot be read (`CorruptCheckpointError`) is
        skipped with a warning naming it and why, and the next older one is tried. A checkpoint
        that reads but does not fit `target` stops the search: that is the caller's error, and an
        older step would hide it. `restored_step` tells which step was read.

        Args:
          target: a state (concrete or from `jax.eval_shape`) whose leaves give the shapes,
            dtypes and shardings to restore into; with explicit shardings the restore is sharded.
            Or a function from the checkpoint's metadata (as `read_meta` returns it) to such a
            state, for a caller whose layout depends on what was saved (e.g. "ref_saved").
          step: which checkpoint; None for the newest readable one.

        Returns:
          `(state, host)`, or None when the directory holds no checkpoint. When the reference
          parameters were recorded by source rather than saved, `state.ref_params` is
          `target.ref_params` if those are concrete arrays (the caller loaded them from the
          source) and None otherwise (the caller loads them from `read_meta()["ref_source"]`).

        Raises:
          CorruptCheckpointError: the named step, or every step, cannot be read (the message
            names each step and why).
          CheckpointError: the step does not exist, or the checkpoint does not match `target`.
        """
        if step is not None:
            out = self._restore_step(target, self._resolve_step(step))
            self.restored_step = step
            return out
        steps = self.all_steps()
        bad: list[tuple[int, CorruptCheckpointError]] = []
        for candidate in reversed(steps):
            try:
                out = self._restore_step(target, candidate)
            except CorruptCheckpointError as e:
                logging.warning(
                    "checkpoint step %d is unreadable, trying the previous one: %s", candidate, e
                )
                bad.append((candidate, e))
                continue
            if bad:
                logging.warning(
                    "restored checkpoint step %d of %s; the newer steps %s are unreadable",
                    candidate,
                    self.directory,
                    [b for b, _ in bad],
                )
            self.restored_step = candidate
            return out
        if bad:
            raise CorruptCheckpointError(
                f"no readable checkpoint in {self.directory}: "
                + "; ".join(f"step {b}: {e}" for b, e in bad)
            ) from bad[0][1]
        return None

    def _restore_step(
        self, target: TrainState | Callable[[dict[str, Any]], TrainState], step: int
    ) -> tuple[TrainState, dict[str, Any]]:
        # The small JSON items first: a damaged step is found before any array is read.
        self._check_items(step)
        items = self._restore_items(
            step, {_META: ocp.args.JsonRestore(), _HOST: ocp.args.JsonRestore()}
        )
        meta = self._check_meta(step, items)
        host = items[_HOST] if items[_HOST] is not None else {}
        if not isinstance(host, dict):
            raise CorruptCheckpointError(
                f"checkpoint {self.step_dir(step)} (step {step}) has host state {host!r}; "
                "expected a JSON object"
            )
        if callable(target):
            target = target(meta)
        where = f"checkpoint {self.step_dir(step)} (step {step})"
        abstract, target_is_key = layout.abstract_target(where, meta, target, self.ref_source)
        try:
            saved_tree = self._manager.item_metadata(step)[_STATE]
        except Exception as e:
            raise CorruptCheckpointError(
                f"cannot read the array metadata of {where}: {layout.reason(e)}"
            ) from e
        layout.check_layout(where, saved_tree, abstract)
        tree = self._restore_items(step, {_STATE: ocp.args.StandardRestore(abstract)})[_STATE]
        rng = tree["rng"]
        if target_is_key:
            rng = jax.random.wrap_key_data(rng, impl=meta["rng_impl"])
            if rng.dtype != target.rng.dtype:
                raise CheckpointError(
                    f"checkpoint {self.step_dir(step)} (step {step}) has a {rng.dtype} PRNG key; "
                    f"the target's is {target.rng.dtype}"
                )
        if meta["ref_saved"]:
            ref = tree["ref_params"]
        else:
            ref = target.ref_params if layout.is_concrete(target.ref_params) else None
        params = tree["params"]
        if meta.get("adapters_only"):
            params = dataclasses.replace(target.params, lora=params["lora"])
        state = TrainState(
            step=tree["step"],
            params=params,
            opt_state=tree["opt_state"],
            ref_params=ref,
            rng=rng,
            critic=tree.get("critic"),
        )
        return state, host

    def _resolve_step(self, step: int | None) -> int:
        steps = self.all_steps()
        if step is None:
            if not steps:
                raise MissingCheckpointError(f"no checkpoint in {self.directory}")
            return steps[-1]
        if step not in steps:
            raise MissingCheckpointError(
                f"no checkpoint for step {step} in {self.directory}; available steps: {steps}"
            )
        return step

    def _check_items(self, step: int) -> None:
        path = self.step_dir(step)
        missing = [name for name in (_STATE, _HOST, _META) if not (path / name).is_dir()]
        if missing:
            present = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
            raise CorruptCheckpointError(
                f"checkpoint {path} (step {step}) is incomplete or corrupt: missing {missing}, "
                f"found {present}; delete it or restore another step of {self.all_steps()}"
            )

    def _check_meta(self, step: int, items: dict[str, Any]) -> dict[str, Any]:
        meta = items[_META]
        if not isinstance(meta, dict) or meta.get("version") != FORMAT_VERSION:
            raise CorruptCheckpointError(
                f"checkpoint {self.step_dir(step)} (step {step}) has metadata {meta!r}; expected "
                f"format version {FORMAT_VERSION}"
            )
        missing = [key for key in _META_KEYS if key not in meta]
        if missing:
            raise CorruptCheckpointError(
                f"checkpoint {self.step_dir(step)} (step {step}) has metadata {meta!r} without "
                f"{missing}"
            )
        return meta

    def _restore_items(self, step: int, args: dict[str, Any]) -> dict[str, Any]:
        self.wait()
        try:
            restored = self._manager.restore(step, args=ocp.args.Composite(**args))
        except Exception as e:
            raise CorruptCheckpointError(
                f"cannot restore checkpoint {self.step_dir(step)} (step {step}): {layout.reason(e)}"
            ) from e
        return {name: restored[name] for name in args}

    # -- resuming from an older step ------------------------------------------------------------

    def discard_after(self, step: int) -> list[int]:
        """Deletes the checkpoints newer than `step`, so that saving continues from `step`.

        A run that resumes from an older step (on purpose, or because `restore` skipped an
        unreadable newer one) calls this: otherwise the newer checkpoints would stay the latest,
        and `save` would not write their steps again.

        Returns:
          The steps deleted, ascending.
        """
        if self.read_only:
            raise CheckpointError(f"{self} is read-only; cannot discard steps after {step}")
        newer = [s for s in self.all_steps() if s > step]
        for s in newer:
            try:
                self._manager.delete(s)
            except Exception as e:
                raise CheckpointError(
                    f"cannot delete checkpoint {self.step_dir(s)} (step {s}): "
                    f"{type(e).__name__}: {e}"
                ) from e
        if newer:
            logging.warning(
                "deleted checkpoint steps %s of %s, newer than step %d", newer, self.directory, step
            )
            self._manager.reload()
        return newer

    # -- lifetime -------------------------------------------------------------------------------

    def wait(self) -> None:
        """Blocks until an asynchronous save in flight is on disk.

        Raises:
          CheckpointError: that save failed; the message names its step and directory, and the
            original error (e.g. an `OSError` for a full disk) is its `__cause__`. Raised once:
            later calls see no save in flight. Orbax's background threads of the failed save
            are released first (`checkpoint_threads`), so none is left waiting for a step that
            will never come and the process can exit.
        """
        try:
            self._manager.wait_until_finished()
        except Exception as e:
            self._release_threads()
            step, self._saving = self._saving, None
            where = f"step {step} to {self.step_dir(step)}" if step is not None else "a step"
            raise CheckpointError(
                f"saving {where} in {self.directory} failed: {layout.reason(e)}"
            ) from e
        self._operations.clear()

    def _release_threads(self, timeout_s: float = 10.0) -> None:
        checkpoint_threads.release(self._operations, timeout_s)
        self._operations.clear()

    def complete_steps(self) -> list[int]:
        """The steps of the complete checkpoints in the directory, read from its listing alone
        (also after `abandon`): orbax renames a step into place only once it is complete."""
        try:
            names = [p.name for p in self.directory.iterdir()]
        except OSError:
            return []
        return sorted(int(n) for n in names if n.isdigit())

    def abandon(self, timeout_s: float = 30.0) -> None:
        """Gives up a save in flight and releases the manager, waiting at most about `timeout_s`.

        For stopping at once (a second Ctrl-C): the save in flight is cancelled (it may still
        complete if its writes were done), its temporary directory is never read and is removed
        by the next writer, and the complete checkpoints stay as they were. Errors are logged,
        not raised. Nothing can be saved afterwards.
        """
        if self._closed:
            return
        self._closed = True
        self._release_threads(timeout_s)
        done = threading.Event()

        def close() -> None:
            try:
                self._manager.close()
            except Exception as e:  # noqa: BLE001 - given up: reported, not raised
                logging.warning("releasing %s after giving up its save: %r", self, e)
            finally:
                done.set()

        threading.Thread(target=close, name="checkpoint-abandon", daemon=True).start()
        if not done.wait(timeout_s):
            logging.error("%s did not release its save within %.0f s; leaving it", self, timeout_s)

    def close(self) -> None:
        """Waits for the last save and releases the manager; a second call does nothing.

        Raises:
          CheckpointError: the last save failed (see `wait`). The manager is released first, and
            an error while releasing it after a failed save is logged, not raised, so the error
            that explains the failure is the one the caller sees.
        """
        if self._closed:
            return
        self._closed = True
        first: CheckpointError | None = None
        try:
            self.wait()
        except CheckpointError as e:
            first = e
        try:
            self._manager.close()
        except Exception as e:
            if first is None:
                raise CheckpointError(
                    f"closing the checkpoints in {self.directory} failed: {type(e).__name__}: {e}"
                ) from e
            logging.error("closing %s after a failed save also failed: %r", self, e)
        if first is not None:
            raise first

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.close()
            return
        if issubclass(exc_type, KeyboardInterrupt):
            self.abandon()
            return
        # The body's error is the one to see; a failed save is logged beside it, not instead.
        try:
            self.close()
        except CheckpointError as e:
            logging.error("%s", e)

    def __repr__(self) -> str:
        return f"Checkpointer({str(self.directory)!r}, every_steps={self.every_steps})"
