"""The processes of a run over several hosts start with the same settings and the same code.

Each process of a `jax.distributed` run parses its own command line and config file and imports
its own copy of the package. A worker whose config file or checkout differs from the others (a
stale copy on one VM, a flag given to one host only) would otherwise join the same collectives
with different programs or data: at best a hang, at worst a run that trains on something else.
`check_processes_agree` runs before anything is loaded: every process publishes its settings
(`settings.plain_settings`) and a fingerprint of the package's source in the coordination
service's key-value store, reads every other process's, and refuses to start on a difference,
naming the process and the fields.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import jax

from rlvr_jax.config_types import ConfigError
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.runtime.resume_settings import flatten

PACKAGE = Path(__file__).resolve().parents[2]
KEY = "rlvr_jax/start/{process}"
# How long a process waits for the others to publish theirs: they start at different times, and
# each one parses its config (importing configs that import the package) before it gets here.
TIMEOUT_S = 600


@functools.cache
def code_fingerprint() -> str:
    """sha256 over the package's Python sources (relative path and content, in path order):
    two checkouts that would run different code differ here."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(str(path.relative_to(PACKAGE)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def start_record(settings: settings_lib.Settings) -> dict[str, Any]:
    """What must agree across processes: the settings as settings.json lays them out, and the
    code's fingerprint."""
    return {"settings": settings_lib.plain_settings(settings), "code": code_fingerprint()}


def differences(mine: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """The fields where two start records differ, as "field: mine -> theirs" (sorted)."""
    a, b = flatten(mine["settings"]), flatten(theirs["settings"])
    a["code"], b["code"] = mine["code"], theirs["code"]
    return [
        f"{name}: {a.get(name, '<absent>')!r} -> {b.get(name, '<absent>')!r}"
        for name in sorted(set(a) | set(b))
        if a.get(name, "<absent>") != b.get(name, "<absent>")
    ]


def check_processes_agree(settings: settings_lib.Settings, timeout_s: float = TIMEOUT_S) -> None:
    """Raises ConfigError unless every process of this `jax.distributed` run started with the
    same settings and code as this one; nothing to do in a run of one process.

    Needs `jax.distributed.initialize` to have run (its coordination service holds the
    records).
    """
    count, me = jax.process_count(), jax.process_index()
    if count == 1:
        return
    # jax has no public handle on its coordination service's key-value store; the private one
    # is imported here so that only a run of several processes depends on it.
    from jax._src import distributed

    client = distributed.global_state.client
    mine = start_record(settings)
    client.key_value_set(KEY.format(process=me), json.dumps(mine, sort_keys=True))
    for other in range(count):
        if other == me:
            continue
        try:
            raw = client.blocking_key_value_get(KEY.format(process=other), int(timeout_s * 1000))
        except Exception as e:  # the client raises its own runtime error on a timeout
            raise ConfigError(
                f"process {other} did not publish its settings within {timeout_s:.0f} s: "
                f"is it running the same command? ({type(e).__name__}: {e})"
            ) from e
        diff = differences(mine, json.loads(raw))
        if diff:
            shown = "; ".join(diff[:8]) + (f"; and {len(diff) - 8} more" if len(diff) > 8 else "")
            raise ConfigError(
                f"process {other} started differently from process {me} (this one -> "
                f"process {other}): {shown}. Every process must run the same command and code"
            )
