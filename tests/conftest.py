"""Tests run on the CPU with 8 host devices, so mesh code is exercised without accelerators."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Tests never write converted weights into the user's cache; test_weight_cache uses tmp dirs.
os.environ.setdefault("RLVR_JAX_WEIGHT_CACHE", "none")

import jax  # noqa: E402

jax.config.update("jax_platform_name", "cpu")
jax.config.update("jax_num_cpu_devices", 8)
