#!/usr/bin/env bash
# Copies WORKDIR from worker 0 (the one that writes metrics) to ./fetched/.
#   tpu_scripts/fetch_logs.sh [--dry-run] WORKDIR
set -euo pipefail
# shellcheck source=tpu_scripts/common.sh
source "$(dirname "$0")/common.sh"
parse_common_flags "$@"
set -- "${ARGS[@]+"${ARGS[@]}"}"
if [[ $# -ne 1 ]]; then
  echo "usage: fetch_logs.sh [--dry-run] WORKDIR" >&2
  exit 2
fi
# scp's older protocol hands the remote path to the worker's shell, which would split it or run
# what follows a ';'; the newer one (SFTP) takes it literally, so no quoting is right for both.
# Paths are therefore limited to characters that no shell treats specially.
if [[ ! "$1" =~ ^[A-Za-z0-9._/+=@,:-]+$ ]]; then
  echo "fetch_logs.sh: WORKDIR may hold only letters, digits and ._/+=@,:- (got '$1')" >&2
  exit 2
fi
pflag="$(project_flag)"
run mkdir -p fetched
run gcloud compute tpus tpu-vm scp --recurse --zone="$ZONE" ${pflag:+"$pflag"} --worker=0 \
  "$TPU_NAME:~/rlvr_jax/$1" fetched/
