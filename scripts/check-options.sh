#!/usr/bin/env bash
# Configures and builds every combination of the build options (KVVM_BUILD_TESTS,
# KVVM_BUILD_BENCH, KVVM_BUILD_TOOLS each ON/OFF; KVVM_ENABLE_CUDA ON/OFF) in build/options/,
# so an option that only builds beside another is found. CUDA ON needs the toolkit; without it
# those eight combinations are reported as skipped. Ends with "N passed, N failed, N skipped".
# Usage: scripts/check-options.sh [--keep]   (--keep leaves the build directories)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
kvvm_install_dependencies
jobs=$(kvvm_jobs)
keep=0
[[ ${1:-} == --keep ]] && keep=1
passed=0 failed=0 skipped=0
mkdir -p build/options
for cuda in OFF ON; do
  if [[ $cuda == ON ]] && ! command -v nvcc >/dev/null 2>&1 &&
    [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
    echo "== CUDA ON: no CUDA toolkit here, skipped"
    skipped=$((skipped + 8))
    continue
  fi
  for tests in OFF ON; do
    for bench in OFF ON; do
      for tools in OFF ON; do
        name="cuda-$cuda.tests-$tests.bench-$bench.tools-$tools"
        dir="build/options/$name"
        echo "== $name"
        rm -rf "$dir"
        if kvvm_configure release "$dir" -DKVVM_ENABLE_CUDA=$cuda -DKVVM_BUILD_TESTS=$tests \
          -DKVVM_BUILD_BENCH=$bench -DKVVM_BUILD_TOOLS=$tools &&
          cmake --build "$dir" -j "$jobs" >"$dir.log" 2>&1; then
          passed=$((passed + 1))
        else
          echo "kvvm: $name does not build; the last lines of $dir.log:"
          tail -20 "$dir.log" || true
          failed=$((failed + 1))
        fi
        ((keep)) || rm -rf "$dir"
      done
    done
  done
done
echo "$passed passed, $failed failed, $skipped skipped"
((failed == 0))
