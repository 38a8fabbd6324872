#!/usr/bin/env bash
# Installs what is missing, builds, and runs kvvm's main job on its defaults: `kvvm simulate`,
# which replays a generated ShareGPT-like trace (3000 requests, 4 tenants with 512-token system
# prompts) for llama-3-8b on a 40 GiB budget with an 8K max context through kvvm's real arena
# and, on the same trace, the preallocate and paged-16 baselines, and prints them side by side.
# It runs on CUDA when a GPU is present and on the host backend otherwise.
# Usage: scripts/run.sh [kvvm simulate options, e.g. --json, --backend host, --plot out.png]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
kvvm_install_dependencies
cmake --preset release -DKVVM_BUILD_TESTS=OFF -DKVVM_BUILD_BENCH=OFF >/dev/null
cmake --build --preset release -j "$(kvvm_jobs)"
exec build/release/tools/kvvm/kvvm simulate "$@"
