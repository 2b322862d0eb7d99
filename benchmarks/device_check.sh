#!/usr/bin/env bash
# The first run on an accelerator (a GPU or TPU), at most 5 minutes: attention kernel parity in
# bf16, decode rate against memory bandwidth, update rate against peak FLOP/s, packed against
# padded update, sampler/trainer mismatch on SmolLM2. Prints one table (benchmarks/README.md
# says where to record it). Extra arguments go to device_check.py (`--model tiny` on a CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
exec timeout 300 python benchmarks/device_check.py "$@"
