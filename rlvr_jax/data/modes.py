"""Thinking and non-thinking prompts: each question asked in one mode, as Qwen3's general RL.

Qwen3's last stage trains one model on prompts of both modes and rewards it, among other things,
for following the mode it was asked in. `ask_in_modes` gives each example a mode, drawn from its
id (so the draw does not depend on the order or number of examples) with probability
`think_share` of thinking, and asks for it in one of two ways:

* `switch="flag"`: "/think" or "/no_think" after the question (`prompt_text`).
* `switch="enable_thinking"`: the chat template's `enable_thinking` variable, per example
  (`meta["enable_thinking"]`, which `templates.encode_prompts` passes to the template).

Either way `meta["think"]` records the mode, for the "mode" format reward
(`rewards.format.mode_reward`).

Host code, standard library only.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

from rlvr_jax.data.example import Example

THINK_FLAG, NO_THINK_FLAG = "/think", "/no_think"
SWITCHES = ("flag", "enable_thinking")


def thinks(example_id: str, think_share: float, seed: int) -> bool:
    """Whether the example with this id is asked in thinking mode: a uniform draw from a hash of
    the seed and the id, below `think_share`."""
    digest = hashlib.sha256(f"{seed}:{example_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < think_share


def ask_in_modes(
    examples: Sequence[Example], switch: str, think_share: float = 0.5, seed: int = 0
) -> list[Example]:
    """The examples, each asked in its mode (see the module docstring).

    Raises:
      ValueError: an unknown switch, or `think_share` outside [0, 1].
    """
    if switch not in SWITCHES:
        raise ValueError(f"switch={switch!r}; expected one of {SWITCHES}")
    if not 0.0 <= think_share <= 1.0:
        raise ValueError(f"think_share={think_share} must be in [0, 1]")
    out = []
    for ex in examples:
        think = thinks(ex.id, think_share, seed)
        meta = {**ex.meta, "think": think}
        prompt = ex.prompt_text
        if switch == "flag":
            prompt = f"{prompt} {THINK_FLAG if think else NO_THINK_FLAG}"
        else:
            meta["enable_thinking"] = think
        out.append(dataclasses.replace(ex, prompt_text=prompt, meta=meta))
    return out
