"""The weight cache: a second load reads it and gives the same bits, damage is rebuilt, keys
separate what differs, and turned off it writes nothing."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import jax
import numpy as np
import pytest

from rlvr_jax.model import gguf, weight_cache
from tests.model.test_gguf import TINY, _random_params, write_gguf


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv(weight_cache.ENV_VAR, str(directory))
    return directory


@pytest.fixture
def model(tmp_path) -> Path:
    return write_gguf(tmp_path / "tiny.gguf", _random_params(TINY), TINY)


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.rglob("params-*.safetensors"))


def _assert_same(a, b) -> None:
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(leaves_a, leaves_b, strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _load(path: Path, **overrides):
    """A load as a fresh process does it (the reader and header memos cleared)."""
    gguf._open_key.cache_clear()
    gguf._header_key.cache_clear()
    return gguf.load_gguf(path, **overrides)


def _forbid_reading_gguf(monkeypatch) -> None:
    def fail(key):
        raise AssertionError(f"opened {key[0]} although the cache holds it")

    monkeypatch.setattr(gguf, "_open_key", fail)


def test_second_load_reads_the_cache_bit_identical(cache, model, monkeypatch):
    first, cfg1 = _load(model)
    assert len(_entries(cache)) == 1
    assert (cache / weight_cache.file_digest(model) / "header.json").is_file()
    gguf._header_key.cache_clear()
    _forbid_reading_gguf(monkeypatch)
    second, cfg2 = gguf.load_gguf(model)
    assert cfg2 == cfg1
    _assert_same(second, first)
    assert gguf.read_metadata(model)["general.architecture"] == "llama"


def test_cache_holds_what_the_uncached_load_gives(cache, model, monkeypatch):
    cached, _ = _load(model, param_dtype="bfloat16")
    cached, _ = _load(model, param_dtype="bfloat16")
    monkeypatch.setenv(weight_cache.ENV_VAR, "none")
    plain, _ = _load(model, param_dtype="bfloat16")
    _assert_same(cached, plain)


@pytest.mark.parametrize("damage", ["truncate", "flip_byte", "garbage"])
def test_a_damaged_entry_is_reported_and_rebuilt(cache, model, monkeypatch, caplog, damage):
    want, _ = _load(model)
    (entry,) = _entries(cache)
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip_byte":
        data[-5] ^= 0xFF  # inside the last tensor's data: only the checksum sees it
    else:
        data = bytearray(b"not a safetensors file")
    entry.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        got, _ = _load(model)
    _assert_same(got, want)
    assert [r for r in caplog.records if "rebuilding unreadable" in r.getMessage()]
    assert entry.read_bytes() != bytes(data)  # rewritten
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _load(model)
    assert not caplog.records


def test_a_damaged_header_is_rebuilt(cache, model, monkeypatch, caplog):
    want, cfg = _load(model)
    header = cache / weight_cache.file_digest(model) / "header.json"
    header.write_text('{"format": 1, "dig')
    with caplog.at_level(logging.WARNING):
        got, got_cfg = _load(model)
    assert got_cfg == cfg
    _assert_same(got, want)
    assert [r for r in caplog.records if "rebuilding unreadable" in r.getMessage()]
    assert header.read_text().startswith('{"format": 1, "digest"')


def test_param_dtype_makes_another_entry_remat_does_not(cache, model, monkeypatch):
    f32, _ = _load(model)
    _load(model, remat=True, dtype="bfloat16")
    assert len(_entries(cache)) == 1
    bf16, _ = _load(model, param_dtype="bfloat16")
    assert len(_entries(cache)) == 2
    assert {x.dtype for x in jax.tree.leaves(bf16)} == {np.dtype("bfloat16")}
    gguf._header_key.cache_clear()
    _forbid_reading_gguf(monkeypatch)
    again, _ = gguf.load_gguf(model)
    _assert_same(again, f32)


def test_another_file_with_the_same_size_and_time_is_another_entry(cache, tmp_path, monkeypatch):
    a = write_gguf(tmp_path / "a.gguf", _random_params(TINY, seed=0), TINY)
    b = write_gguf(tmp_path / "b.gguf", _random_params(TINY, seed=5), TINY)
    want_b, _ = _load(b)
    _load(a)
    # b's bytes move under a's name, size and modification time: the cache must not serve a's.
    st = a.stat()
    assert b.stat().st_size == st.st_size
    b.replace(a)
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))
    weight_cache._digest.cache_clear()
    got, _ = _load(a)
    _assert_same(got, want_b)


def test_turned_off_writes_nothing(tmp_path, model, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv(weight_cache.ENV_VAR, "none")
    assert weight_cache.cache_dir() is None
    params, _ = _load(model)
    assert jax.tree.leaves(params)
    assert not (tmp_path / "xdg").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]


def test_default_directory_is_beside_the_compile_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(weight_cache.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert weight_cache.cache_dir() == tmp_path / "rlvr_jax" / "weights"


def test_an_unwritable_cache_is_skipped(tmp_path, model, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(weight_cache.ENV_VAR, str(blocker / "cache"))
    with caplog.at_level(logging.WARNING):
        params, _ = _load(model)
    assert jax.tree.leaves(params)
    assert [r for r in caplog.records if "cannot write" in r.getMessage()]
