#!/usr/bin/env bash
# Installs what is missing, checks formatting, builds and runs every test:
#   1. release build (CUDA driver compiled when the toolkit is here; its tests skip, and are
#      reported as skipped, without a GPU) + the installed-package consumer check;
#   2. the CPU suite under AddressSanitizer + UndefinedBehaviorSanitizer;
#   3. the CPU suite under ThreadSanitizer.
# Ends with one line "N passed, N failed, N skipped" over all three runs.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
kvvm_install_dependencies
jobs=$(kvvm_jobs)

echo "== format (clang-format, Google base, 100 columns)"
mapfile -t sources < <(git ls-files '*.h' '*.cc' '*.cuh' '*.cu' 2>/dev/null || true)
if ((${#sources[@]} > 0)); then
  clang-format --dry-run -Werror "${sources[@]}"
fi

passed=0 failed=0 skipped=0
run_suite() {  # preset
  local preset=$1 log
  log=$(mktemp)
  echo "== $preset: configure and build"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "$jobs"
  echo "== $preset: test"
  local status=0
  ctest --preset "$preset" -j "$jobs" 2>&1 | tee "$log" || status=$?
  local total fails skips
  total=$(sed -n 's/.*tests passed, [0-9]* tests failed out of \([0-9]*\).*/\1/p' "$log" | tail -1)
  fails=$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of.*/\1/p' "$log" | tail -1)
  skips=$(grep -c '\*\*\*Skipped\|Not Run' "$log" || true)
  total=${total:-0} fails=${fails:-0}
  passed=$((passed + total - fails - skips))
  failed=$((failed + fails))
  skipped=$((skipped + skips))
  rm -f "$log"
  return $status
}

overall=0
run_suite release || overall=1

echo "== consumer: find_package(kvvm) from the installed tree"
rm -rf build/install build/consumer
cmake --install build/release --prefix "$PWD/build/install" >/dev/null
cmake -S tests/consumer -B build/consumer -DCMAKE_PREFIX_PATH="$PWD/build/install" >/dev/null
cmake --build build/consumer -j "$jobs" >/dev/null
if build/consumer/consumer; then passed=$((passed + 1)); else failed=$((failed + 1)); overall=1; fi

run_suite asan || overall=1
run_suite tsan || overall=1

echo "$passed passed, $failed failed, $skipped skipped"
exit $overall
