"""A finished run, recognised from its workdir before anything is loaded.

Host code. A run is finished when its ledger ends with the evaluation after training (the
`FINAL` record) at the step of its newest checkpoint, whatever the stage writes after that
evaluation is there and newer than it (the SFT stage's export), and the settings asked for now
are the ones the run saved in `<workdir>/settings.json` (apart from the end and pad ids the
tokenizer fills in). The same command run again then prints the recorded result instead of
loading the model, compiling and evaluating once more (`program.stages.dispatch.run`). Anything
else goes through the run skeleton as before: a run killed during its final evaluation (no final
record), one extended by more steps or run with any other setting changed, one whose ledger or
settings cannot be read.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from rlvr_jax.program.runtime import ledger
from rlvr_jax.program.runtime.resume_settings import TOKENIZER_FILLED, resume_differences
from rlvr_jax.program.settings import SETTINGS_FILE, Settings

CHECKPOINTS = "checkpoints"


def held_out_line(
    before: Mapping[str, Any] | None, after: Mapping[str, Any], eval_unit: str
) -> str:
    """ "held-out accuracy: before 0.578, after 0.844 (128 prompts, greedy)" from the
    evaluations' records (without `before` when the ledger lacks it)."""
    acc = f"after {after['eval/accuracy']:.3f}"
    if before is not None:
        acc = f"before {before['eval/accuracy']:.3f}, {acc}"
    return f"held-out accuracy: {acc} ({int(after['eval/num_prompts'])} {eval_unit})"


@dataclasses.dataclass(frozen=True)
class Finished:
    """What a finished run recorded.

    Attributes:
      workdir: the run's directory.
      step: the step it finished at (its final evaluation's and newest checkpoint's).
      eval_before: the evaluation before training, or None where the ledger lacks it.
      eval_after: the evaluation after training.
    """

    workdir: Path
    step: int
    eval_before: dict[str, Any] | None
    eval_after: dict[str, Any]

    def summary(self, eval_unit: str, length_field: str | None) -> str:
        """The lines a rerun prints: the recorded result, then how to evaluate again or train
        further (`length_field`, the setting that sets the run's length, or None)."""
        further = f"; raise --config.{length_field} to train further" if length_field else ""
        return (
            f"{self.workdir}: finished at step {self.step}; recorded "
            f"{held_out_line(self.eval_before, self.eval_after, eval_unit)}.\n"
            f"--reevaluate evaluates the final checkpoint again{further}."
        )

    def result(self) -> dict[str, Any]:
        """The keys every stage's `run` returns, as recorded, with "finished": True."""
        return {
            "eval_before": self.eval_before,
            "eval_after": self.eval_after,
            "steps": self.step,
            "resumed_from": self.step,
            "finished": True,
        }


def checkpoint_steps(workdir: str | Path) -> list[int]:
    """The steps of the complete checkpoints in `<workdir>/checkpoints`, from its listing alone:
    orbax renames a step into place only once it is complete."""
    try:
        names = [p.name for p in (Path(workdir) / CHECKPOINTS).iterdir()]
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def _recorded(workdir: Path, settings: Settings, after_final: Sequence[Path]) -> Finished | None:
    try:
        records = ledger.read_metrics(workdir)
        saved = json.loads((workdir / SETTINGS_FILE).read_text())
    except (OSError, ValueError):
        return None  # the run skeleton reports what is wrong
    final = ledger.final_eval(records)
    steps = checkpoint_steps(workdir)
    if final is None or records[-1].get(ledger.RECORD) != ledger.FINAL:
        return None
    if not steps or steps[-1] != final["step"]:
        return None
    for path in after_final:
        if not path.exists() or path.stat().st_mtime < final["time"]:
            return None
    # Tokenizer ids filled at run time are in the saved settings only.
    free = frozenset() if settings.rl.sampler.eos_ids else TOKENIZER_FILLED
    if not isinstance(saved, dict) or resume_differences(saved, settings, free=free):
        return None
    return Finished(workdir, final["step"], ledger.initial_eval(records), final)


def find(
    workdir: str | Path, settings: Settings, after_final: Sequence[Path] = ()
) -> Finished | None:
    """The finished run in `workdir` (see the module docstring), or None.

    Args:
      workdir: the run's directory.
      settings: the settings asked for now.
      after_final: what the stage writes after its final evaluation; each must exist and be
        newer than that evaluation's record.

    With several processes this is a collective: the run counts as finished only where every
    process reads it so (each then returns the same answer).
    """
    found = _recorded(Path(workdir), settings, after_final)
    if jax.process_count() == 1:
        return found
    from jax.experimental import multihost_utils

    votes = multihost_utils.process_allgather(np.array(found is not None, np.int32))
    return found if np.min(votes) else None
