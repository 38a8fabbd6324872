#!/usr/bin/env bash
# Installs what is missing, checks formatting and the README's figures, builds and runs every
# test:
#   1. release build (CUDA driver and kernels compiled when the toolkit is here; their tests
#      skip, and are reported as skipped, without a GPU) + the installed-package consumer check;
#   2. the README's first command, scripts/run.sh --demo-only (the demo model served, one chat
#      exchange checked) in a fresh build directory (tests and benchmarks off, as a newcomer
#      builds it), run.sh's simulation on the suite's directory, and the library alone with
#      tests, benchmarks and tools all off;
#   3. the CPU suite under AddressSanitizer + UndefinedBehaviorSanitizer;
#   4. the CPU suite under ThreadSanitizer;
# and, first, the lock annotations checked by Clang's thread-safety analysis and the real API
# clients installed (npm ci: the OpenAI Node SDK and LangChain JS that the release suite's
# clients.conformance test drives against `kvvm serve`).
# Warnings are errors under CI (CI=true: the ci-* presets), not on a user's newer compiler.
# Ends with one line "N passed, N failed, N skipped" over all of it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
kvvm_install_dependencies "${KVVM_TEST_PACKAGES[@]}"
jobs=$(kvvm_jobs)
# ccache: the README-command check below builds with run.sh's preset, which differs from the
# CI presets only by -Werror; left out of the hash, run.sh's build reuses the CI build's
# objects (the CI build runs first, so nothing it compiled escaped -Werror).
export CCACHE_IGNOREOPTIONS="-Werror"
presets=(release asan tsan)
if [[ -n ${CI:-} ]]; then presets=(ci-release ci-asan ci-tsan); fi

echo "== format (clang-format, Google base, 100 columns)"
mapfile -t sources < <(git ls-files '*.h' '*.cc' '*.cuh' '*.cu' 2>/dev/null || true)
if ((${#sources[@]} > 0)); then
  clang-format --dry-run -Werror "${sources[@]}"
fi

passed=0 failed=0 skipped=0

# Lock requirements are annotations (include/kvvm/base/mutex.h) that only Clang checks: every source
# that takes a kvvm::Mutex or states a lock requirement is compiled by clang++ with
# -Wthread-safety as an error (syntax only: GCC builds the binaries).
thread_safety() {
  local sources
  mapfile -t sources < <(git grep -l 'MutexLock\|KVVM_REQUIRES\|KVVM_EXCLUDES' -- '*.cc')
  ((${#sources[@]} > 0)) || return 1
  printf '%s\n' "${sources[@]}" | xargs -P "$jobs" -I{} clang++ -std=c++20 -fsyntax-only \
    -Wthread-safety -Werror=thread-safety -Iinclude -Isrc -I. -Itools/kvvm {}
}
# ThreadSanitizer finds races, so its suite leaves out the suites that start no thread: the
# library's reference-model and property runs, fault sweeps and reservation tests (one thread
# driving an arena, a pool and a governor; commit-ahead, the library's one thread, is off in
# them), the trace and tokenizer-input fuzzing and the e4m3 sweep. They were 375 of the TSan
# suite's 1,040 test-seconds; the release and AddressSanitizer + UBSan suites run them all.
# The speculative-decoding suites (the acceptance rule's sampling sweeps, and engines stepped on
# the test's thread: the proposers are the stepping thread's alone) run over models whose
# threads the other engine suites already race-check.
single_threaded='(^|/)(ArenaModelTest|ReservationModelTest|ReservationTest|FaultSweepTest|'
single_threaded+='ArenaShareSweepTest|PrefixCachePropertyTest|PrefixCacheTest|TraceJsonl|'
single_threaded+='TokenizerErrors|Fp8Element|DraftModelPairs|DraftModel|Speculative|'
single_threaded+='SpeculativeGrammar|SpeculativeFixtures)[./]'
run_suite() {  # preset
  local preset=$1 log
  log=$(mktemp)
  echo "== $preset: configure and build (at ${SECONDS} s)"
  kvvm_configure "$preset" "build/$preset"
  cmake --build --preset "$preset" -j "$jobs"
  echo "== $preset: test (at ${SECONDS} s)"
  local status=0
  # The property tests draw 100 random operation sequences in the release suite; under a
  # sanitizer (5-30x slower) 25 sequences exercise the same code paths for memory errors and
  # races at a quarter of the time (each run draws new sequences). RC_PARAMS from the caller
  # wins.
  # CTest starts the longest tests first once it has their times; a fresh build directory has
  # none, so they come from tests/long_tests.txt ("seconds name", CTest's file is "name runs
  # seconds"; names hold spaces). The sanitized suites run a googletest suite per CTest test,
  # whose COST tests/suite_tests.cmake sums from the same file.
  local costs="build/$preset/Testing/Temporary/CTestCostData.txt"
  if [[ ! -s $costs && $preset != *san ]]; then
    mkdir -p "$(dirname "$costs")"
    { sed -n 's/^\([0-9][0-9]*\) \(.*\)$/\2 1 \1/p' tests/long_tests.txt; echo ---; } >"$costs"
  fi
  local rc_params=${RC_PARAMS:-}
  if [[ -z $rc_params && $preset == *san* ]]; then rc_params="max_success=25"; fi
  # The test presets set OPENBLAS_NUM_THREADS=1: OpenBLAS starts a thread pool in every
  # process that loads it, whose threads spin (sched_yield) waiting for work; CTest starts the
  # binary once per test, two at a time, and the pool cost 0.07 s a start and a core taken
  # from the other test (the CPU model's GEMMs here are small).
  local exclude=()
  if [[ $preset == *tsan ]]; then exclude=(--exclude-regex "$single_threaded"); fi
  env ${rc_params:+RC_PARAMS=$rc_params} ctest --preset "$preset" -j "$jobs" "${exclude[@]}" 2>&1 |
    tee "$log" || status=$?
  local total fails skips
  total=$(sed -n 's/.*tests passed, [0-9]* tests failed out of \([0-9]*\).*/\1/p' "$log" | tail -1)
  fails=$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of.*/\1/p' "$log" | tail -1)
  skips=$(grep -c '\*\*\*Skipped\|Not Run' "$log" || true)
  total=${total:-0} fails=${fails:-0}
  if ((total == 0)); then
    echo "kvvm: $preset ran no test"
    fails=1
    status=1
  fi
  passed=$((passed + total - fails - skips))
  failed=$((failed + fails))
  skipped=$((skipped + skips))
  rm -f "$log"
  return $status
}
check() {  # name command...: one more passed or failed check
  local name=$1
  shift
  echo "== $name (at ${SECONDS} s)"
  if "$@"; then
    passed=$((passed + 1))
  else
    echo "kvvm: FAILED: $name"
    failed=$((failed + 1))
    return 1
  fi
}

overall=0
# The README's figures are docs/PERFORMANCE.md's (seconds, python3's standard library only),
# and the check does fail on a figure that differs.
check "figures: the README's against docs/PERFORMANCE.md" bash scripts/check-figures.sh ||
  overall=1
check "figures: the check names an altered figure" bash tests/check-figures-test.sh || overall=1
check "lock requirements (clang -Wthread-safety)" thread_safety || overall=1
# The versions tests/clients/package-lock.json pins; without them clients.conformance fails.
# The JSON Schema validator the structured-output tests run (they skip without it, so its absence
# fails here instead).
check "schema validator: python3 -c 'import jsonschema' (python3-jsonschema)" \
  python3 -c 'import jsonschema' || overall=1
check "real API clients: npm ci (openai, @langchain/openai)" \
  npm ci --prefix tests/clients --no-audit --no-fund --quiet || overall=1
run_suite "${presets[0]}" || overall=1

consumer() {
  rm -rf build/install build/consumer
  cmake --install "build/${presets[0]}" --prefix "$PWD/build/install" >/dev/null &&
    cmake -S tests/consumer -B build/consumer -DCMAKE_PREFIX_PATH="$PWD/build/install" \
      >/dev/null &&
    cmake --build build/consumer -j "$jobs" >/dev/null &&
    build/consumer/consumer
}
check "consumer: find_package(kvvm) from the installed tree" consumer || overall=1

# Both README commands on one tree, in either order: run.sh first in a fresh directory (its
# main job: serve the demo model, one chat exchange, whose answer must be the right sum), then
# this script's configuration there must bring the test target back (building it would only
# repeat the suite's build); and run.sh after this script's suite must build and run on the
# directory the suite used (its simulation mode).
newcomer() {
  rm -rf build/newcomer
  local exchange
  exchange=$(KVVM_BUILD_DIR=build/newcomer bash scripts/run.sh --demo-only) || {
    echo "$exchange"
    return 1
  }
  echo "$exchange"
  grep -qx 'assistant: 521' <<<"$exchange" &&
    kvvm_configure "${presets[0]}" build/newcomer &&
    # grep reads the whole list (no -q): quitting at the first match would end make's write
    # with SIGPIPE, which pipefail reports as a failure.
    cmake --build build/newcomer --target help | grep '\<kvvm_tests\>' >/dev/null &&
    grep -q '^KVVM_BUILD_TESTS:BOOL=ON$' build/newcomer/CMakeCache.txt &&
    echo "after run.sh, the test configuration builds kvvm_tests again" &&
    KVVM_BUILD_DIR="build/${presets[0]}" bash scripts/run.sh simulate --requests 300 --rate 30 \
      >/dev/null
}
check "the README's commands in either order: run.sh, then test.sh's build, then run.sh" \
  newcomer || overall=1

library_only() {
  rm -rf build/library-only
  kvvm_configure "${presets[0]}" build/library-only -DKVVM_BUILD_TESTS=OFF \
    -DKVVM_BUILD_BENCH=OFF -DKVVM_BUILD_TOOLS=OFF &&
    cmake --build build/library-only -j "$jobs"
}
check "the library alone: tests, benchmarks and tools off" library_only || overall=1

run_suite "${presets[1]}" || overall=1
run_suite "${presets[2]}" || overall=1

echo "== done (at ${SECONDS} s)"
echo "$passed passed, $failed failed, $skipped skipped"
exit $overall
