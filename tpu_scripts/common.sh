#!/usr/bin/env bash
# Shared settings and helpers for the TPU scripts. Source it; do not run it.
#
# Settings come from the environment:
#   TPU_NAME     name of the TPU VM or pod slice            (default: rlvr-jax)
#   ZONE         GCP zone                                   (default: us-central2-b)
#   ACCEL        accelerator type, e.g. v4-8, v5litepod-8, v4-32 (a pod slice)  (default: v4-8)
#   VERSION      TPU software version                       (default: tpu-ubuntu2204-base)
#   PROJECT      GCP project (optional; gcloud's default otherwise)
#   REPO_URL     git URL of this repository, cloned on every worker
#   WORKERS      how many workers (hosts) the slice has (default: asked of gcloud; with --dry-run,
#                worked out from ACCEL); launch.sh passes --distributed to a slice of several
#   DRY_RUN=1    print the gcloud commands instead of running them (also: --dry-run flag)

TPU_NAME="${TPU_NAME:-rlvr-jax}"
ZONE="${ZONE:-us-central2-b}"
ACCEL="${ACCEL:-v4-8}"
VERSION="${VERSION:-tpu-ubuntu2204-base}"
PROJECT="${PROJECT:-}"
REPO_URL="${REPO_URL:-}"
WORKERS="${WORKERS:-}"
DRY_RUN="${DRY_RUN:-0}"

parse_common_flags() {
  ARGS=()
  for a in "$@"; do
    case "$a" in
      --dry-run) DRY_RUN=1 ;;
      *) ARGS+=("$a") ;;
    esac
  done
}

project_flag() {
  if [[ -n "$PROJECT" ]]; then
    printf -- '--project=%s' "$PROJECT"
  fi
}

# Runs (or, with DRY_RUN=1, prints) one command, quoting each argument.
run() {
  if [[ "$DRY_RUN" == "1" ]]; then
    printf '%q ' "$@"
    printf '\n'
  else
    "$@"
  fi
}

# Prints its arguments as words for a POSIX shell, separated by spaces: each one in single
# quotes, with every ' written as '\''. The remote command is a string that the worker's login
# shell parses again, so a config, workdir, flag or URL pasted into it unquoted would split at
# spaces or run a second command after a ';'. Single quotes rather than printf %q: its $'...'
# form is bash-only, and this output is read by whatever shell the worker's user has.
# The output always ends in a quote, so $(...) loses no trailing newline of an argument.
shell_quote() {
  local a rest head q="'" sep="" out=""
  for a in "$@"; do
    rest="$a"
    head=""
    while [[ "$rest" == *"$q"* ]]; do
      head+="${rest%%"$q"*}'\\''"
      rest="${rest#*"$q"}"
    done
    out+="$sep'$head$rest'"
    sep=" "
  done
  printf '%s' "$out"
}

# Runs a shell snippet on every worker of the TPU VM (one host or a whole pod slice).
on_all_workers() {
  local cmd="$1"
  local pflag
  pflag="$(project_flag)"
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" ${pflag:+"$pflag"} \
    --worker=all --command="$cmd"
}

# Prints how many workers (hosts) an accelerator type has: ACCEL's number counts TensorCores for
# v2, v3, v4 and v5p (8 to a host) and chips for v5e and v6e (8 on a single host, 4 to a host in
# a larger slice). Fails, naming WORKERS, for a type it does not know.
accelerator_workers() {
  local accel="$1" n
  n="${accel##*-}"
  if [[ ! "$n" =~ ^[0-9]+$ ]]; then
    echo "cannot tell the workers of ACCEL=$accel; set WORKERS to the slice's number of hosts" >&2
    return 2
  fi
  case "$accel" in
    v2-* | v3-* | v4-* | v5p-*) echo $(((n + 7) / 8)) ;;
    v5litepod-* | v5e-* | v6e-*) if ((n <= 8)); then echo 1; else echo $((n / 4)); fi ;;
    *)
      echo "cannot tell the workers of ACCEL=$accel; set WORKERS to the slice's number of hosts" >&2
      return 2
      ;;
  esac
}

# Prints how many workers the TPU VM has: WORKERS if set; with --dry-run, ACCEL's count
# (accelerator_workers: nothing is asked of gcloud then); otherwise its network endpoints, one per
# worker, as gcloud describes the VM.
slice_workers() {
  local pflag endpoints
  if [[ -n "$WORKERS" ]]; then
    if [[ ! "$WORKERS" =~ ^[1-9][0-9]*$ ]]; then
      echo "WORKERS=$WORKERS: give the slice's number of hosts, a positive integer" >&2
      return 2
    fi
    echo "$WORKERS"
    return
  fi
  if [[ "$DRY_RUN" == "1" ]]; then
    accelerator_workers "$ACCEL"
    return
  fi
  pflag="$(project_flag)"
  endpoints="$(gcloud compute tpus tpu-vm describe "$TPU_NAME" --zone="$ZONE" ${pflag:+"$pflag"} \
    --format='value(networkEndpoints[].ipAddress)')"
  if [[ -z "$endpoints" ]]; then
    echo "gcloud lists no worker of TPU VM $TPU_NAME in $ZONE; set WORKERS to its number of hosts" >&2
    return 2
  fi
  # One address per worker, separated by ';'.
  local semis="${endpoints//[^;]/}"
  echo $((${#semis} + 1))
}
