#!/usr/bin/env bash
# Installs what is missing, builds, and runs kvvm's main job on its defaults: `kvvm simulate`,
# which replays a generated ShareGPT-like trace (3000 requests, 4 tenants with 512-token system
# prompts) for llama-3-8b on a 40 GiB budget with an 8K max context through kvvm's real arena
# and, on the same trace, the baselines (preallocate; paged-16 without and with vLLM-style
# prefix caching), and prints them side by side.
# It runs on CUDA when a GPU is present and on the host backend otherwise.
# Usage: scripts/run.sh [kvvm simulate options, e.g. --json, --backend host, --plot out.png]
# Environment: KVVM_BUILD_DIR (default build/release), KVVM_ENABLE_CUDA (AUTO, ON, OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
kvvm_install_dependencies
build_dir=${KVVM_BUILD_DIR:-build/release}
# Only the tool is needed here; the tests and benchmarks are scripts/test.sh's.
# Under CI, the CI preset (warnings are errors there), so this build shares its objects with
# scripts/test.sh's through ccache.
preset=release
if [[ -n ${CI:-} ]]; then preset=ci-release; fi
kvvm_configure "$preset" "$build_dir" -DKVVM_ENABLE_CUDA="${KVVM_ENABLE_CUDA:-AUTO}" \
  -DKVVM_BUILD_TESTS=OFF -DKVVM_BUILD_BENCH=OFF -DKVVM_BUILD_TOOLS=ON
cmake --build "$build_dir" -j "$(kvvm_jobs)" --target kvvm_cli
exec "$build_dir/tools/kvvm/kvvm" simulate "$@"
