#!/usr/bin/env bash
# Launches the trainer on every worker at once (multi-host runs call jax.distributed.initialize()).
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
workdir="${2:-runs/$(basename "$config" .py)}"
shift $(( $# >= 2 ? 2 : 1 ))
[[ "${1:-}" == "--" ]] && shift
flags="$*"
on_all_workers "cd ~/rlvr_jax && . ~/venv/bin/activate && mkdir -p $workdir && \
nohup python -m rlvr_jax.main --config=$config --workdir=$workdir $flags \
> $workdir/log.txt 2>&1 &"
