"""Tests run on the CPU with 8 host devices, so mesh code is exercised without accelerators."""

import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Tests never write converted weights into the user's cache; test_weight_cache uses tmp dirs.
os.environ.setdefault("RLVR_JAX_WEIGHT_CACHE", "none")
# XLA:CPU's LLVM passes at level 0: the suite is dominated by compiling small programs, which this
# cuts by about 40% (measured on tests/rl/test_train_step.py); the matmuls are library calls either
# way. Commands and benchmarks keep the default level. Subprocesses of the tests inherit it.
# The concurrency-optimised scheduler off: with it, the host path's update on 8 host devices
# (the packed grouped forward's all-gathers) deadlocked in XLA:CPU's collective rendezvous in 6
# of 8 runs of tests/test_main.py::test_host_verifier_path_reports_every_stage ("Expected 8
# threads to join the rendezvous", then an abort that takes the worker down); with it off, in 0
# of 9. Speed is the same either way (the microbatch tests of tests/rl/test_train_step.py, two
# interleaved runs each: 51.8 and 56.7 s off, 56.2 and 53.2 s on).
# XLA:CPU's older loop emitters instead of its fusion emitters: they compile the same programs
# in about a third of the CPU time (the default update of tests/rl/test_train_step.py: 4.1 s ->
# 1.2 s, its rollout 1.3 s -> 0.4 s), and what the tests run takes no longer (the 40 steps of
# test_mean_reward_rises_on_arithmetic_from_scratch, compiles included: 9.5 -> 5.6 CPU s).
_SUITE_FLAGS = (
    "--xla_backend_optimization_level=0",
    "--xla_cpu_enable_concurrency_optimized_scheduler=false",
    "--xla_cpu_use_fusion_emitters=false",
)
for _flag in _SUITE_FLAGS:
    if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import jax  # noqa: E402

jax.config.update("jax_platform_name", "cpu")
jax.config.update("jax_num_cpu_devices", 8)

from rlvr_jax.program.runtime import compilation  # noqa: E402

# One persistent compile cache for the whole session, shared by the xdist workers (they inherit
# the environment the controller sets here before it starts them): many tests compile the same
# tiny-model programs, and each is then compiled once. Removed when the session ends.
_CACHE_ENV = "RLVR_JAX_TEST_COMPILE_CACHE"


def pytest_configure(config):
    if not hasattr(config, "workerinput") and _CACHE_ENV not in os.environ:
        config._rlvr_jax_cache = tempfile.mkdtemp(prefix="rlvr_jax_test_compile_cache_")
        os.environ[_CACHE_ENV] = config._rlvr_jax_cache
    # Every program, as for the commands (`compilation.MIN_COMPILE_SECONDS`): the suite compiles
    # many small ones again and again (initialisations, samplers of the same shapes).
    compilation.enable_cache(os.environ[_CACHE_ENV])


def pytest_unconfigure(config):
    path = getattr(config, "_rlvr_jax_cache", None)
    if path:
        shutil.rmtree(path, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """The long tests first (those marked slow, then the stage-level files in tests/ itself), so
    that the two workers end on short unit tests instead of waiting on one long test each."""
    top = Path(__file__).parent

    def rank(item) -> int:
        if item.get_closest_marker("slow") is not None:
            return 0
        return 1 if Path(item.path).parent == top else 2

    items.sort(key=rank)
