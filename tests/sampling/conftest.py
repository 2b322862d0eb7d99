"""The `tiny` fixture: tiny random `transformers` models and their weights in our tree."""

from __future__ import annotations

import pytest
import torch

from rlvr_jax.model import hf
from tests.model.hf_fixtures import make_tiny_hf


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """kind -> (torch model, params, cfg); weights scaled up so greedy paths do not collapse."""
    cache = {}

    def get(kind: str):
        if kind not in cache:
            d = tmp_path_factory.mktemp(kind)
            model = make_tiny_hf(kind, d)
            with torch.no_grad():
                for p in model.parameters():
                    if p.ndim == 2:
                        p.mul_(10.0)
            model.save_pretrained(d)
            params, cfg = hf.load_hf(d)
            cache[kind] = (model, params, cfg)
        return cache[kind]

    return get
