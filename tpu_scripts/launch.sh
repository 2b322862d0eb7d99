#!/usr/bin/env bash
# Launches the trainer on every worker at once. On a slice of several workers (slice_workers in
# common.sh) it passes --distributed: the workers' processes then train as one run
# (jax.distributed.initialize() finds them), and WORKDIR must be a directory every worker sees
# (docs/scaling.md).
#   tpu_scripts/launch.sh [--dry-run] CONFIG [WORKDIR] [-- extra absl flags]
# Output goes to ~/rlvr_jax/WORKDIR/log.txt on each worker; fetch it with fetch_logs.sh.
set -euo pipefail
# shellcheck source=tpu_scripts/common.sh
source "$(dirname "$0")/common.sh"
parse_common_flags "$@"
set -- "${ARGS[@]+"${ARGS[@]}"}"
if [[ $# -lt 1 ]]; then
  echo "usage: launch.sh [--dry-run] CONFIG [WORKDIR] [-- flags]" >&2
  exit 2
fi
config="$1"
shift
# WORKDIR is optional, so in "CONFIG -- flags" the "--" is not a workdir.
workdir="runs/$(basename "$config" .py)"
if [[ $# -ge 1 && "$1" != "--" ]]; then
  workdir="$1"
  shift
fi
[[ "${1:-}" == "--" ]] && shift
# Every piece taken from the command line is quoted for the worker's shell (see shell_quote), so
# each arrives there as exactly one argument, whatever spaces, quotes or ';' it holds.
q_workdir="$(shell_quote "$workdir")"
workers="$(slice_workers)"
distributed=()
if ((workers > 1)); then
  distributed=(--distributed)
fi
q_args="$(shell_quote "--config=$config" "--workdir=$workdir" ${distributed[@]+"${distributed[@]}"} ${1+"$@"})"
on_all_workers "cd ~/rlvr_jax && . ~/venv/bin/activate && mkdir -p -- $q_workdir && \
nohup python -m rlvr_jax.main $q_args > $q_workdir/log.txt 2>&1 &"
