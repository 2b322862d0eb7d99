#!/usr/bin/env bash
# Creates a TPU VM: a single host (ACCEL=v4-8, v5litepod-8) or a pod slice (ACCEL=v4-32, ...).
#   ACCEL=v4-8 ZONE=us-central2-b tpu_scripts/create.sh [--dry-run] [--spot]
set -euo pipefail
# shellcheck source=tpu_scripts/common.sh
source "$(dirname "$0")/common.sh"
parse_common_flags "$@"
extra=()
for a in "${ARGS[@]+"${ARGS[@]}"}"; do
  case "$a" in
    --spot) extra+=(--spot) ;;
    *) echo "create.sh: unknown argument '$a' (known: --dry-run, --spot)" >&2; exit 2 ;;
  esac
done
pflag="$(project_flag)"
run gcloud compute tpus tpu-vm create "$TPU_NAME" --zone="$ZONE" ${pflag:+"$pflag"} \
  --accelerator-type="$ACCEL" --version="$VERSION" "${extra[@]+"${extra[@]}"}"
