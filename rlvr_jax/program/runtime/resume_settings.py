"""Which settings a resumed run may change, and what a checkpoint's recorded settings say
changed.

A checkpoint records the settings it was saved with (`settings.plain_settings`). A resume that
changes a field outside `RESUME_FREE` changes what the optimizer state, the data position or the
curriculum statistics mean: `resume_differences` names each such field, and the run refuses
to start unless `allow_changed_settings` (`runtime/run.py`); a finished run's rerun compares
the same way (`runtime/finished.py`).
"""

from __future__ import annotations

import json
from typing import Any

from rlvr_jax.program.settings import Settings, default_config, plain_settings

# Settings a resumed run may change freely: how long it runs, how often it logs, evaluates and
# saves, how the same computation is laid out (mesh, chunking, rematerialisation, workers), and
# which sandbox runs the model's code.
# Every other field changes what the checkpoint's optimizer state, data position or curriculum
# statistics mean, and a resume that changes one needs `allow_changed_settings`.
RESUME_FREE = frozenset(
    {
        "train.steps",
        "train.log_every",
        "train.eval_every",
        "train.checkpoint_every",
        "train.keep_checkpoints",
        "train.use_tensorboard",
        "train.compile_ahead",
        "eval.batch_prompts",
        "eval.in_stage",
        "reward.workers",
        "reward.deadline_s",
        "reward.sandbox_backend",
        "model.remat",
        "model.attention",
        "model.attention_block",
        "model.moe_dispatch",
        "rl.logprob_chunk",
        "rl.num_microbatches",
        "rl.sampler.attention_chunk",
        "rl.sampler.layer_loop",
        "mesh.data",
        "mesh.fsdp",
        "mesh.tensor",
        "mesh.expert",
        "mesh.seq",
    }
)


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """{"rl": {"group_size": 8}} -> {"rl.group_size": 8}."""
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else k))
    return out


# The fields the tokenizer fills at run time where the config leaves `rl.sampler.eos_ids` empty
# (`program.parts.build.with_tokenizer_ids`).
TOKENIZER_FILLED = frozenset({"rl.sampler.eos_ids", "rl.sampler.pad_id"})


def resume_differences(
    saved: dict[str, Any], settings: Settings, free: frozenset[str] = RESUME_FREE
) -> list[str]:
    """The fields, outside `free` (`RESUME_FREE`), where `settings` differ from the
    `plain_settings` a checkpoint recorded, as "field: saved -> now" lines (sorted).

    Fields the tokenizer fills at run time (`rl.sampler.eos_ids`, `pad_id`) compare as the run
    saw them: both sides come from the same filling. A field the checkpoint predates (absent
    from its record) that is at its default now is not a difference: a new field's default
    keeps what runs did before it existed.
    """
    old, new = flatten(saved), flatten(plain_settings(settings))
    defaults = flatten(json.loads(json.dumps(default_config().to_dict())))
    out = []
    for name in sorted(set(old) | set(new)):
        if name in free:
            continue
        a, b = old.get(name, "<absent>"), new.get(name, "<absent>")
        if a == "<absent>" and name in defaults and defaults[name] == b:
            continue
        if a != b:
            out.append(f"{name}: {a!r} in the checkpoint, {b!r} now")
    return out
