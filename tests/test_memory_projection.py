"""benchmarks/memory.py's projection: the step-time arithmetic behaves as its docstring says, and
`--project` prints one filled row per mesh from programs it compiled (tiny model, 8 fake CPU
devices standing in for a v5e-8)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def memory():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("memory_bench", ROOT / "benchmarks/memory.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["memory_bench"] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("memory_bench", None)
        sys.path.remove(str(ROOT / "benchmarks"))


def _seconds(memory, mesh, chip="v5p-64", rows=512, length=4096, micro=1, name="qwen3-8b"):
    chip = memory.CHIPS[chip]
    sizes = dict(zip(("data", "fsdp", "tensor"), mesh, strict=True))
    cfg = memory.PRESETS[name]
    return memory.projected_seconds(cfg, chip, sizes, rows, 256, length, micro, 0.4)


def test_the_training_layout_gathers_the_weights_at_every_decode_step(memory):
    fsdp = _seconds(memory, (1, 32, 1))
    tensor = _seconds(memory, (1, 4, 8))
    # Qwen3-8B's 16.4 GB of bf16 weights over 600 GB/s x 0.4, 31/32 of them, 4,096 times.
    assert fsdp["rollout bound"] == "interconnect"
    per_step = 2 * 8_190_735_360 * 31 / 32 / (600e9 * 0.4)
    assert fsdp["rollout"] == pytest.approx(4096 * per_step, rel=0.01)
    # Tensor parallelism splits what each chip reads and gathers; gathering once removes it.
    assert tensor["rollout"] < fsdp["rollout"] / 4
    assert fsdp["rollout, gathered once"] < fsdp["rollout"]
    assert fsdp["copy GiB"] == pytest.approx(8 * tensor["copy GiB"])


def test_the_update_pays_for_tensor_parallel_activations(memory):
    fsdp = _seconds(memory, (1, 32, 1))
    tensor = _seconds(memory, (1, 4, 8))
    assert fsdp["update TFLOP"] == tensor["update TFLOP"]  # the same work
    assert fsdp["update bound"] == "FLOPs"
    moved = lambda t: t["update parts"]["interconnect"]  # noqa: E731
    assert moved(tensor) > 2 * moved(fsdp) > 0
    # Twice the chips, half the FLOP time.
    small = _seconds(memory, (1, 16, 1), chip="v5e-16")
    large = _seconds(memory, (1, 32, 1), chip="v5e-32")
    assert small["update bound"] == large["update bound"] == "FLOPs"
    assert small["update"] == pytest.approx(2 * large["update"])


def test_project_prints_a_row_per_mesh_from_compiled_programs():
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "memory.py"),
            "--models=tiny",
            "--chip=v5e-8",
            "--project=1,8,1;2,2,2",
            "--rows=32",
            "--prompt=8",
            "--length=16",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| tiny |")]
    assert [r.split("|")[2].strip() for r in rows] == ["1, 8, 1", "2, 2, 2"], done.stdout
    for row in rows:
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert len(cells) == 11 and all(cells), row
        assert cells[5] == "yes" and float(cells[3]) >= 0  # the compiled update's GiB
