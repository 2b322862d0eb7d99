"""benchmarks/device_check.py, the script for the first accelerator, keeps working: on the CPU
with the tiny model it prints its one table, every row filled."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS = (
    "peaks",
    "attention parity, bf16",
    "decode step",
    "update (padded)",
    "packed / padded update",
    "sampler/trainer mismatch, bf16",
)


def test_the_device_check_prints_its_table_on_a_cpu():
    args = ["--model", "tiny", "--runs", "1", "--attention-length", "256"]
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "device_check.py"),
            *args,
            "--max-new-tokens",
            "32",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table = {
        line.split("|")[1].strip(): line.split("|")[2].strip()
        for line in done.stdout.splitlines()
        if line.startswith("| ") and not line.startswith("| check")
    }
    assert tuple(table) == ROWS
    assert "nan" not in " ".join(table.values()).lower()
    # The blockwise path agrees with the dense reference in bf16 (rounding only).
    forward = float(table["attention parity, bf16"].split()[1].rstrip(","))
    assert forward < 0.05
    assert "x time" in table["packed / padded update"]
