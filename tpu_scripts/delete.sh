#!/usr/bin/env bash
# Deletes the TPU VM.   tpu_scripts/delete.sh [--dry-run]
set -euo pipefail
# shellcheck source=tpu_scripts/common.sh
source "$(dirname "$0")/common.sh"
parse_common_flags "$@"
pflag="$(project_flag)"
run gcloud compute tpus tpu-vm delete "$TPU_NAME" --zone="$ZONE" ${pflag:+"$pflag"} --quiet
