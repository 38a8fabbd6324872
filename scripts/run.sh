#!/usr/bin/env bash
# Installs what is missing, builds, and runs kvvm's main job on its defaults: today
# `kvvm info` (backend, granularity, memory, and the measured cost of each VMM operation),
# on CUDA when a GPU is present and on the host backend otherwise.
# Usage: scripts/run.sh [kvvm info options, e.g. --json or --backend host]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
kvvm_install_dependencies
cmake --preset release -DKVVM_BUILD_TESTS=OFF -DKVVM_BUILD_BENCH=OFF >/dev/null
cmake --build --preset release -j "$(kvvm_jobs)"
exec build/release/tools/kvvm/kvvm info "$@"
