"""A disk cache of converted weights, so that a second launch skips parsing and dequantizing GGUF.

Host code (files). Reading the embedded SmolLM2 GGUF file costs about 7 s on a 2-core CPU: 5 s
for the reader to parse the metadata (49k tokens and merges, one numpy view each), 2 s to
dequantize, unpermute and stack the weights. This cache keeps, per GGUF file, its parsed header
(metadata, tensor names, `rope_freqs`) as JSON and the converted `Params` as safetensors, and
reads them back in about a second.

Where: `$RLVR_JAX_WEIGHT_CACHE` if set ("none" or "" turns the cache off), else
`cache_root() / "weights"`, beside the compile cache (`~/.cache/rlvr_jax`, or under
`$XDG_CACHE_HOME`). One directory per GGUF file, named by the SHA-256 of its bytes.

Keys. The file's bytes are hashed on every launch (once per process): about 0.1 s for the
embedded model's 98 MB, 1 s a GB, a small fraction of dequantizing the same file. Size and
modification time are not trusted: a file copied with its times preserved, or a cache directory
shared across machines, would serve stale weights. A parameter entry is keyed by that hash,
`FORMAT` (bumped when the conversion changes) and every `ModelConfig` field except those that
shape only the computation (`COMPUTE_ONLY_FIELDS`): a field added to the config later is keyed
by default, so it can cause a miss but never a stale hit. So `param_dtype="bfloat16"` is another
entry, `remat=True` is not.

Writes go to a temporary file in the same directory, renamed into place, so a reader never sees
a partial file. Reads check the entry's key and a CRC-32 of every tensor; an unreadable,
truncated or corrupt entry is reported in one log line and rebuilt, and a cache that cannot be
written is reported and skipped: the cache never fails a load.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import save_file

from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import Layers, Params

ENV_VAR = "RLVR_JAX_WEIGHT_CACHE"
FORMAT = 1
COMPUTE_ONLY_FIELDS = ("dtype", "remat", "attention", "attention_block")
_HEADER = "header.json"
# What a damaged entry raises on the way in: the file system (OSError), JSON and our header,
# offset, key and checksum checks (ValueError), a missing or unknown field (KeyError, TypeError).
_READ_ERRORS = (OSError, ValueError, KeyError, TypeError)


def cache_root() -> Path:
    """`$XDG_CACHE_HOME/rlvr_jax` (or `~/.cache/rlvr_jax`): the root of this package's caches."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "rlvr_jax"


def cache_dir() -> Path | None:
    """The weight cache's directory, or None when `$RLVR_JAX_WEIGHT_CACHE` turns it off."""
    value = os.environ.get(ENV_VAR)
    if value is None:
        return cache_root() / "weights"
    if value.strip().lower() in ("", "none"):
        return None
    return Path(value).expanduser()


@functools.lru_cache(maxsize=8)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    # The stat fields only key this process's memo: a file replaced in place is hashed again.
    del size, mtime_ns
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_digest(path: str | os.PathLike) -> str:
    """The SHA-256 (hex) of a file's bytes, computed once per process and file version."""
    st = os.stat(path)
    return _digest(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


def _warn(what: str, path: Path, e: BaseException) -> None:
    logging.warning("weight cache: %s %s (%s: %s)", what, path, type(e).__name__, e)


def _write_atomic(path: Path, write: Callable[[str], None]) -> bool:
    """`write(temp_path)`, then renames the temporary file to `path`; False (logged) on failure."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        write(tmp)
        os.replace(tmp, path)
        return True
    except (OSError, SafetensorError, ValueError, TypeError) as e:
        _warn("cannot write", path, e)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        return False


# ---------------------------------------------------------------------------------------------
# Headers: what parsing the file gives (metadata, tensor names, small tensors) as JSON


def read_header(directory: Path, digest: str) -> dict[str, Any] | None:
    """The header stored for the file of `digest`, or None (a damaged one is logged)."""
    path = directory / digest / _HEADER
    if not path.is_file():
        return None
    try:
        entry = json.loads(path.read_text())
        if entry["format"] != FORMAT or entry["digest"] != digest:
            raise ValueError(f"entry is for {entry['digest']!r}, format {entry['format']}")
        return entry["header"]
    except _READ_ERRORS as e:
        _warn("rebuilding unreadable", path, e)
        return None


def write_header(directory: Path, digest: str, header: dict[str, Any]) -> None:
    """Stores `header` (JSON values) for the file of `digest`; a header that JSON would not give
    back equal (tuples, bytes) is not stored."""
    text = json.dumps({"format": FORMAT, "digest": digest, "header": header})
    if json.loads(text)["header"] != header:
        logging.warning("weight cache: a GGUF header does not round-trip through JSON; not cached")
        return
    _write_atomic(directory / digest / _HEADER, lambda tmp: Path(tmp).write_text(text))


# ---------------------------------------------------------------------------------------------
# Parameters


def params_key(digest: str, cfg: ModelConfig) -> str:
    """The key of the `Params` converted from the file of `digest` for `cfg` (see the module
    docstring)."""
    fields = {
        f.name: repr(getattr(cfg, f.name))
        for f in dataclasses.fields(cfg)
        if f.name not in COMPUTE_ONLY_FIELDS
    }
    text = json.dumps({"format": FORMAT, "digest": digest, "config": fields}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _params_path(directory: Path, digest: str, key: str) -> Path:
    return directory / digest / f"params-{key[:32]}.safetensors"


def _flatten(params: Params) -> dict[str, np.ndarray]:
    out = {}
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        if isinstance(value, Layers):
            for g in dataclasses.fields(value):
                if getattr(value, g.name) is not None:
                    out[f"layers.{g.name}"] = np.asarray(getattr(value, g.name))
        elif value is not None:
            out[f.name] = np.asarray(value)
    return out


def _device(a: np.ndarray) -> jax.Array:
    # `jax.device_put`, not `jnp.asarray`: the latter compiles a small program per shape and
    # dtype (about 0.1 s each on a 2-core CPU, 0.85 s for SmolLM2's 8 shapes). Not aliased: the
    # parameters own their buffers (they are donated later), not the cache file's pages.
    return jax.device_put(a, may_alias=False)


def _unflatten(arrays: dict[str, np.ndarray]) -> Params:
    layers = {k.removeprefix("layers."): v for k, v in arrays.items() if k.startswith("layers.")}
    top = {k: v for k, v in arrays.items() if not k.startswith("layers.")}
    return Params(
        embed=_device(top.pop("embed")),
        final_norm=_device(top.pop("final_norm")),
        lm_head=_device(top.pop("lm_head")) if "lm_head" in top else None,
        layers=Layers(**{k: _device(v) for k, v in layers.items()}),
        **top,  # An unknown name fails here (TypeError), as a damaged entry.
    )


def _crc(a: np.ndarray) -> str:
    return f"{zlib.crc32(np.ascontiguousarray(a).view(np.uint8)):08x}"


_DTYPES = {"F32": np.float32, "BF16": jnp.bfloat16, "F16": np.float16}


def _map_safetensors(path: Path) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """(metadata, tensors) of a safetensors file, the tensors as views of a read-only memory map.

    Mapping rather than reading saves a copy: `read_params` checksums the views and hands them to
    `jax.device_put`, which makes the one copy. Entries are replaced by rename, never rewritten in
    place, so a mapped file does not change under its reader.

    Raises:
      ValueError: for a header that does not describe the file (a truncated file among them).
    """
    data = np.memmap(path, np.uint8, mode="r")
    if data.size < 8:
        raise ValueError(f"{data.size} bytes is too short for a safetensors file")
    n = int(data[:8].view("<u8")[0])
    if n > data.size - 8:
        raise ValueError(f"header of {n} bytes in a file of {data.size}")
    header = json.loads(bytes(data[8 : 8 + n]))
    body = data[8 + n :]
    meta = header.pop("__metadata__", {})
    arrays = {}
    for name, t in header.items():
        dtype = np.dtype(_DTYPES[t["dtype"]])
        begin, end = t["data_offsets"]
        if not 0 <= begin <= end <= body.size or end - begin != dtype.itemsize * int(
            np.prod(t["shape"])
        ):
            raise ValueError(f"{name}: offsets {begin}..{end} do not fit the file or the shape")
        arrays[name] = body[begin:end].view(dtype).reshape(t["shape"])
    return meta, arrays


def read_params(directory: Path, digest: str, key: str, param_dtype: str) -> Params | None:
    """The cached `Params` of `key`, or None when absent or damaged (logged, to be rebuilt)."""
    path = _params_path(directory, digest, key)
    if not path.is_file():
        return None
    try:
        meta, arrays = _map_safetensors(path)
        if meta.get("key") != key:
            raise ValueError(f"entry key {meta.get('key')!r} is not {key!r}")
        sums = json.loads(meta["crc32"])
        if set(sums) != set(arrays):
            raise ValueError(f"tensors {sorted(arrays)} do not match {sorted(sums)}")
        for name, a in arrays.items():
            if a.dtype != jnp.dtype(param_dtype):
                raise ValueError(f"{name} has dtype {a.dtype}, expected {param_dtype}")
            if _crc(a) != sums[name]:
                raise ValueError(f"{name} fails its CRC-32 check")
        return _unflatten(arrays)
    except _READ_ERRORS as e:
        _warn("rebuilding unreadable", path, e)
        return None


def write_params(directory: Path, digest: str, key: str, params: Params) -> None:
    """Stores `params` under `key` (atomically; a failure is logged and ignored)."""
    arrays = _flatten(params)
    meta = {"key": key, "crc32": json.dumps({n: _crc(a) for n, a in arrays.items()})}
    _write_atomic(
        _params_path(directory, digest, key), lambda tmp: save_file(arrays, tmp, metadata=meta)
    )
