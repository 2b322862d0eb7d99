"""The sampler's settings: static ones that shape the program, per-call ones that are arrays.

Static settings (`SamplerConfig`: length, method, top-k, stop ids and sequences, think budget) are
a hashable static argument; per-call values (`SamplingParams`: temperature, top-p, min-p, one value
per row) are arrays, so new values never recompile.

Shapes: N rows, W matched-token window.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.model import decode

Array = jax.Array
METHODS = ("sample", "greedy")


def _int_tuple(name: str, value: Sequence[int]) -> tuple[int, ...]:
    out = tuple(int(v) for v in value)
    if any(v < 0 for v in out):
        raise ValueError(f"{name}={out} holds a negative token id")
    return out


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """Static sampler settings; a change compiles a new program.

    Attributes:
      max_new_tokens: T, the fixed number of generated columns.
      method: "sample" (temperature, top-k, top-p, min-p) or "greedy" (argmax).
      top_k: keep the k largest logits before top-p and min-p; 0 keeps all. Static because it
        sets a shape; a small k also makes top-p cheap (it then works on k sorted values).
      eos_ids: a sampled token among these ends its row (finish reason "eos").
      stop_sequences: token sequences that end a row once its generated tokens end with one of
        them (finish reason "stop"); the sequence stays in the output. A stop string must be given
        as the token sequence(s) it is generated as.
      pad_id: written after a row's end.
      think_open: the token sequence that opens a thinking block (Qwen3: `<think>`).
      think_close: the sequence that closes it (Qwen3: `</think>`).
      think_budget: after this many tokens inside an open thinking block, `think_stop` is
        injected; 0 disables the budget.
      think_stop: the injected early-stop text, which must end with `think_close`.
      attention_chunk: decode attention reads the filled cache prefix rounded up to a multiple
        of this many slots past the prompt; 0 reads the whole cache.
      layer_loop: "scan", "unroll" or "auto" (unroll on CPU); see `rlvr_jax.model.decode`.
      cache_dtype: dtype of the KV cache; None means the model's compute dtype.
      prompt_group: rows come in groups of this many copies of one prompt
        (`bucket_and_pad(..., group_size)`): each group's prompt is prefilled once and its
        keys/values copied to the group's rows. 1 prefills every row.
    """

    max_new_tokens: int
    method: str = "sample"
    top_k: int = 0
    eos_ids: tuple[int, ...] = ()
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    pad_id: int = 0
    think_open: tuple[int, ...] = ()
    think_close: tuple[int, ...] = ()
    think_budget: int = 0
    think_stop: tuple[int, ...] = ()
    attention_chunk: int = 32
    layer_loop: str = "auto"
    cache_dtype: str | None = None
    prompt_group: int = 1

    def __post_init__(self):
        setf = functools.partial(object.__setattr__, self)
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be at least 1")
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r}; expected one of {METHODS}")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 keeps every token)")
        if self.pad_id < 0:
            raise ValueError(f"pad_id={self.pad_id} must be a token id (>= 0)")
        if self.attention_chunk < 0:
            raise ValueError(f"attention_chunk={self.attention_chunk} must be >= 0")
        if self.layer_loop not in decode.LAYER_LOOPS:
            raise ValueError(
                f"layer_loop={self.layer_loop!r}; expected one of {decode.LAYER_LOOPS}"
            )
        if self.prompt_group < 1:
            raise ValueError(f"prompt_group={self.prompt_group} must be at least 1")
        if self.think_budget < 0:
            raise ValueError(f"think_budget={self.think_budget} must be >= 0 (0 disables it)")
        setf("eos_ids", _int_tuple("eos_ids", self.eos_ids))
        seqs = tuple(_int_tuple("stop_sequences", s) for s in self.stop_sequences)
        if any(not s for s in seqs):
            raise ValueError(f"stop_sequences={seqs} holds an empty sequence")
        setf("stop_sequences", seqs)
        for name in ("think_open", "think_close", "think_stop"):
            setf(name, _int_tuple(name, getattr(self, name)))
        if self.think_budget:
            if not (self.think_open and self.think_close and self.think_stop):
                raise ValueError(
                    f"think_budget={self.think_budget} needs think_open, think_close and "
                    f"think_stop; got {self.think_open}, {self.think_close}, {self.think_stop}"
                )
            if self.think_open == self.think_close:
                raise ValueError(f"think_open and think_close are both {self.think_open}")
            n = len(self.think_close)
            if self.think_stop[-n:] != self.think_close:
                raise ValueError(
                    f"think_stop={self.think_stop} must end with think_close={self.think_close} "
                    "so that the injected text closes the thinking block"
                )

    @property
    def match_window(self) -> int:
        """W: how many trailing tokens the stop and think matchers look at."""
        seqs = (*self.stop_sequences, self.think_open, self.think_close)
        return max([1, *(len(s) for s in seqs)])


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-call, per-row sampling values; build them with `sampling_params`."""

    temperature_N: Array  # (N,) f32 > 0; ignored by greedy
    top_p_N: Array  # (N,) f32 in (0, 1]; 1 disables
    min_p_N: Array  # (N,) f32 in [0, 1); 0 disables


def sampling_params(
    num_rows: int,
    temperature: float | Sequence[float] = 1.0,
    top_p: float | Sequence[float] = 1.0,
    min_p: float | Sequence[float] = 0.0,
) -> SamplingParams:
    """Validated per-row sampling values; scalars are broadcast to all `num_rows` rows.

    Raises:
      ValueError: naming the first value outside its range: temperature must be > 0 and finite,
        top_p in (0, 1], min_p in [0, 1).
    """
    t, p, m = check_sampling_values(num_rows, temperature, top_p, min_p)
    return SamplingParams(jnp.asarray(t), jnp.asarray(p), jnp.asarray(m))


def check_sampling_values(
    num_rows: int,
    temperature: float | Sequence[float] = 1.0,
    top_p: float | Sequence[float] = 1.0,
    min_p: float | Sequence[float] = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`sampling_params`'s checks, on the host: the (num_rows,) temperature, top_p and min_p.

    Settings validated at import time use this one: a jax array would start the backend there,
    before `jax.distributed.initialize` can run.

    Raises:
      ValueError: as `sampling_params`.
    """

    def rows(name: str, value, ok, rule: str) -> np.ndarray:
        arr = np.asarray(value, np.float32)
        if arr.ndim > 1 or (arr.ndim == 1 and arr.shape[0] != num_rows):
            raise ValueError(f"{name} has shape {arr.shape}; expected a scalar or ({num_rows},)")
        arr = np.broadcast_to(arr, (num_rows,))
        bad = ~ok(arr)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"{name}={float(arr[i])!r} (row {i}) is outside {rule}")
        return arr

    with np.errstate(invalid="ignore"):
        t = rows("temperature", temperature, lambda a: (a > 0) & np.isfinite(a), "(0, inf)")
        p = rows("top_p", top_p, lambda a: (a > 0) & (a <= 1), "(0, 1]")
        m = rows("min_p", min_p, lambda a: (a >= 0) & (a < 1), "[0, 1)")
    return t, p, m
