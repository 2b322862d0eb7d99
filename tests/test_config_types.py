"""Config dicts become typed dataclasses; unknown, missing and mistyped fields are named."""

import dataclasses
from typing import Literal

import pytest

from rlvr_jax.config_types import ConfigError, from_config


@dataclasses.dataclass(frozen=True)
class Inner:
    rate: float = 0.5
    mode: Literal["a", "b"] = "a"
    cap: float | None = None


@dataclasses.dataclass(frozen=True)
class Outer:
    count: int
    inner: Inner = Inner()
    sizes: tuple[int, ...] = (1,)
    flag: bool = False

    def __post_init__(self):
        if self.count < 0:
            raise ValueError(f"count={self.count} must be >= 0")


def test_builds_nested_and_coerces_losslessly():
    out = from_config(Outer, {"count": 3, "inner": {"rate": 1, "cap": 2}, "sizes": [4, 5]})
    assert out == Outer(count=3, inner=Inner(rate=1.0, cap=2.0), sizes=(4, 5))
    assert isinstance(out.inner.rate, float)


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"count": 1, "inner": {"rat": 1}}, r"unknown setting cfg\.inner\.rat"),
        ({}, r"missing setting cfg\.count"),
        ({"count": "3"}, r"cfg\.count='3' must be an integer"),
        ({"count": 1.5}, r"cfg\.count=1\.5 must be an integer"),
        ({"count": 1, "flag": 1}, r"cfg\.flag=1 must be true or false"),
        ({"count": 1, "inner": {"mode": "c"}}, r"cfg\.inner\.mode='c'"),
        ({"count": 1, "sizes": "12"}, r"cfg\.sizes='12' must be a sequence"),
        ({"count": 1, "sizes": [1, "x"]}, r"cfg\.sizes\[1\]='x'"),
        ({"count": -1}, r"cfg: count=-1 must be >= 0"),
        ({"count": 1, "inner": 3}, r"cfg\.inner must be a mapping"),
    ],
)
def test_bad_settings_are_named(cfg, message):
    with pytest.raises(ConfigError, match=message):
        from_config(Outer, cfg, "cfg")
