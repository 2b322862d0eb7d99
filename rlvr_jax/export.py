"""Command: a run's policy as a Hugging Face directory that `transformers` and vLLM load.

  python -m rlvr_jax.export --workdir=runs/tiny --out=/tmp/tiny_hf [--step=N] [--dtype=bfloat16] \\
      [--overwrite] [--adapter]

It reads the run's settings (`<workdir>/settings.json`), rebuilds the train state's layout without
loading any weights, restores the newest readable (or the named) checkpoint into it
(`program.parts.build.restore_policy`; an unreadable newer checkpoint is skipped with a warning),
and writes config.json, safetensors and the tokenizer files (`model.hf.save_hf`). A LoRA run's
adapters are merged into the weights, or with `--adapter` written alone as a PEFT adapter
directory over `model.source` (`model.lora_export.save_peft_adapter`).

`--out` must be absent or empty unless `--overwrite`: then the new directory is written beside it
and renamed into its place, so no file of the old one (an old shard or shard index, which loaders
would prefer) remains.

With `--out` inside the workdir (e.g. `<workdir>/hf`) the export writes into the run's directory
and takes its lock (`program.runtime.workdir_lock`): while a trainer runs there it refuses at once,
naming the trainer's pid, with exit status 2. An `--out` elsewhere only reads the checkpoints and
takes no lock. An error in what was asked (a workdir that is not a run, a step it does not hold or
cannot read, a non-empty `--out`) is one line on stderr and exit status 2
(`program.runtime.user_errors`; `--verbose` adds the traceback).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import jax
from absl import app, flags, logging

from rlvr_jax.config_types import UserError
from rlvr_jax.model import hf, lora_export
from rlvr_jax.model import lora as lora_lib
from rlvr_jax.program.parts.build import restore_policy
from rlvr_jax.program.runtime import user_errors, workdir_lock
from rlvr_jax.program.runtime.checkpoint import CheckpointError
from rlvr_jax.program.settings import SETTINGS_FILE

_WORKDIR = flags.DEFINE_string("workdir", None, "The run's workdir.", required=True)
_OUT = flags.DEFINE_string("out", None, "The Hugging Face directory to write.", required=True)
_STEP = flags.DEFINE_integer(
    "step",
    -1,
    "Checkpoint step; it must exist (default -1: the newest readable one, skipping unreadable "
    "newer ones with a warning).",
)
_DTYPE = flags.DEFINE_string(
    "dtype", "", "Storage dtype: float32 or bfloat16 (default: the model's)."
)
_ADAPTER = flags.DEFINE_bool(
    "adapter",
    False,
    "For a LoRA run: write a PEFT adapter directory (the adapters only, loaded by peft over "
    "the base) instead of merged weights.",
)
_OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "Replace a non-empty --out directory whole (default: refuse)."
)
flags.DEFINE_bool(user_errors.VERBOSE_FLAG, False, user_errors.VERBOSE_HELP)


def main(argv: list[str]) -> None:
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax logs every restore stage at INFO
    if _STEP.value < -1:
        raise app.UsageError(f"--step={_STEP.value}: give a step >= 0, or -1 for the newest")
    # A directory without a run's settings holds no run to protect (and gets no lock file).
    is_run = (Path(_WORKDIR.value) / SETTINGS_FILE).is_file()
    inside = is_run and workdir_lock.inside(_OUT.value, _WORKDIR.value)
    with contextlib.ExitStack() as stack:
        if inside:
            try:
                stack.enter_context(workdir_lock.hold(_WORKDIR.value, "export"))
            except workdir_lock.WorkdirBusyError as e:
                print(f"export: {e}", file=sys.stderr)
                sys.exit(workdir_lock.BUSY_EXIT_STATUS)
        _export()


def _export() -> None:
    try:
        # Checked before the restore too, which can take minutes on a large model.
        hf.check_output_dir(_OUT.value, _OVERWRITE.value)
        params, cfg, tok, settings, step = restore_policy(
            _WORKDIR.value, None if _STEP.value < 0 else _STEP.value
        )
        if _ADAPTER.value:
            if params.lora is None:
                raise UserError(
                    f"--adapter: {_WORKDIR.value} is not a LoRA run (model.lora.rank=0)"
                )
            out = lora_export.save_peft_adapter(
                params.lora,
                lora_lib.adapter_config(params.lora),
                cfg,
                _OUT.value,
                base_model_name_or_path=settings.model.source,
                overwrite=_OVERWRITE.value,
            )
            params = params.lora
        else:
            out = hf.save_hf(
                params,
                cfg,
                _OUT.value,
                tokenizer=tok,
                dtype=_DTYPE.value or None,
                overwrite=_OVERWRITE.value,
            )
    except FileExistsError as e:
        raise UserError(f"--out: {e}; pass --overwrite to replace it whole") from e
    except CheckpointError as e:
        # The run the flags point at is unreadable (a missing one is a NotFoundError already):
        # the message says which checkpoint, and why.
        raise UserError(str(e)) from e
    n = sum(x.size for x in jax.tree.leaves(params))
    print(f"wrote {out}: step {step} of {_WORKDIR.value}, {cfg.model_type}, {n} parameters")


if __name__ == "__main__":
    user_errors.run("export", main)
