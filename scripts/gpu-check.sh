#!/usr/bin/env bash
# gpu-check.sh: build kvvm with CUDA on a GPU machine and run everything that needs a GPU.
#
# Configures a release build in build/gpu with -DKVVM_ENABLE_CUDA=ON, builds it with every
# core, runs the test suite (build/gpu/tests/kvvm_tests), `kvvm info --backend cuda` (text
# and --json) and the benchmarks when they were built, and prints a short summary. Every log
# and result lands in $OUT (default ./out):
#   build.log configure.log tests.log tests.xml info.txt info.json bench.log bench.json
#   generate.txt (the demo model's answer on CUDA), generate.md / generate.json (kvvm
#   generate beside HF transformers; bench/generate_hf.py, BENCH_GENERATE=0 skips it)
#   nvidia-smi.txt summary.txt, and the attention kernels' step (scripts/gpu-kernels.sh:
#   kvvm bench decode against bench/sdpa_baseline.py, compute-sanitizer) in decode.txt and
#   kernels/
# Exit status: non-zero when a test failed or any step failed.
#
# Before the first call: scripts/gpu-carry.sh (here, with Debian reachable) fills .carry/debs.
# The machine has no network: headers missing there (CLI11, nlohmann-json, rapidcheck) are
# carried in .carry/include, librapidcheck.a in .carry/lib, and CMake package files, when
# carried, under .carry/lib/cmake or .carry/share; this script points the compiler and CMake
# at .carry when it exists.
#
# Usage: scripts/gpu-check.sh            (from anywhere; runs in the repository root)
#   QUICK=1 GTEST_FILTER='*Weight*' scripts/gpu-check.sh   (build and those tests only)
#   OUT=/some/dir scripts/gpu-check.sh   (results elsewhere)
#   JOBS=8 CMAKE_EXTRA="-DKVVM_WERROR=ON" scripts/gpu-check.sh
#   SHARDS=4 (default) runs the suite again as that many concurrent processes on the one GPU
#   (SHARD_FILTER narrows them; 0: skipped); MEMCHECK=0 skips compute-sanitizer memcheck over
#   the sharing, fork and copy-on-write sweeps. Both run with QUICK=1 too.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BUILD="${BUILD:-build/gpu}"
JOBS="${JOBS:-$(nproc)}"
read -r -a CMAKE_EXTRA_ARGS <<<"${CMAKE_EXTRA:-}"

failed_steps=()

# step NAME LOG COMMAND...: runs COMMAND, tees stdout+stderr to LOG, records a failure.
step() {
  local name="$1" log="$2"
  shift 2
  echo "==> ${name}: $*"
  local rc=0
  set +e
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  if ((rc != 0)); then
    echo "==> ${name} FAILED (exit ${rc}); log: ${log}"
    failed_steps+=("${name} (exit ${rc}, ${log})")
  fi
  return 0
}

step_failed() {  # step_failed NAME: true when the step NAME was recorded as failed
  local entry
  for entry in "${failed_steps[@]+"${failed_steps[@]}"}"; do
    [[ "$entry" == "$1 "* ]] && return 0
  done
  return 1
}

# --- Environment -------------------------------------------------------------------------
CMAKE_PATH_ARGS=()
if [[ -d "$ROOT/.carry" ]]; then
  echo "==> using carried dependencies in $ROOT/.carry"
  export CPATH="$ROOT/.carry/include${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$ROOT/.carry/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
  CMAKE_PATH_ARGS+=("-DCMAKE_PREFIX_PATH=$ROOT/.carry"
    "-DCMAKE_INCLUDE_PATH=$ROOT/.carry/include"
    "-DCMAKE_LIBRARY_PATH=$ROOT/.carry/lib")
fi
# Debian packages of header-only or static dependencies, carried as .deb files: unpacked
# into a private prefix (never into /), which CMake then searches.
if compgen -G "$ROOT/.carry/debs/*.deb" >/dev/null; then
  DEPS="${TMPDIR:-/tmp}/kvvm-deps"
  mkdir -p "$DEPS"
  for deb in "$ROOT"/.carry/debs/*.deb; do dpkg -x "$deb" "$DEPS"; done
  CMAKE_PATH_ARGS+=("-DCMAKE_PREFIX_PATH=$DEPS/usr;$ROOT/.carry")
  # Run-time libraries of the carried packages (utf8proc, OpenBLAS): dpkg -x does not run
  # their alternatives or ldconfig, so the tests and the tool find them through the path.
  DEPS_LIB="$DEPS/usr/lib/x86_64-linux-gnu"
  export LD_LIBRARY_PATH="$DEPS_LIB:$DEPS_LIB/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "==> unpacked carried packages into $DEPS"
fi
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"  # lets find_package(CUDAToolkit) find the toolkit
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
else
  echo "nvidia-smi not found" >"$OUT/nvidia-smi.txt"
fi
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -a)"
  echo "compiler: $(c++ --version 2>/dev/null | head -n1 || echo unknown)"
  echo "cmake: $(cmake --version | head -n1)"
  echo "nvcc: $(command -v nvcc >/dev/null && nvcc --version | tail -n1 || echo none)"
  echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo 'no commit')"
} | tee "$OUT/environment.txt"

# --- Configure and build -----------------------------------------------------------------
# The test files one by one (KVVM_UNITY_BUILD=OFF): many cores compile them as fast as the
# batches of 8 that help a 2-core machine, and a newer GCC than CI's saw other -O3 false
# positives (-Wstringop-overread) in a batch than in the files alone.
step configure "$OUT/configure.log" \
  cmake -S "$ROOT" -B "$BUILD" \
  -DCMAKE_BUILD_TYPE=Release \
  -DKVVM_ENABLE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DKVVM_UNITY_BUILD=OFF \
  "${CMAKE_PATH_ARGS[@]+"${CMAKE_PATH_ARGS[@]}"}" \
  "${CMAKE_EXTRA_ARGS[@]+"${CMAKE_EXTRA_ARGS[@]}"}"
if step_failed configure; then
  echo "configure failed: if CLI11 or nlohmann_json is not found, carry its CMake package" \
    "files too (e.g. .carry/lib/cmake/CLI11/CLI11Config.cmake), or pass" \
    "CMAKE_EXTRA=-DKVVM_BUILD_TOOLS=OFF"
else
  step build "$OUT/build.log" cmake --build "$BUILD" -j "$JOBS"
fi
built=1
if step_failed configure || step_failed build; then built=0; fi

# --- Tests ---------------------------------------------------------------------------------
TESTS="$BUILD/tests/kvvm_tests"
passed="-" failed="-" skipped="-"
if ((built)) && [[ -x "$TESTS" ]]; then
  step tests "$OUT/tests.log" "$TESTS" "--gtest_output=xml:$OUT/tests.xml"
  passed="$(grep -oE '^\[  PASSED  \] [0-9]+ test' "$OUT/tests.log" | grep -oE '[0-9]+' | tail -n1 || true)"
  failed="$(grep -oE '^\[  FAILED  \] [0-9]+ tests?, listed below' "$OUT/tests.log" |
    grep -oE '[0-9]+' | tail -n1 || true)"
  skipped="$(grep -oE '^\[  SKIPPED \] [0-9]+ tests?, listed below' "$OUT/tests.log" |
    grep -oE '[0-9]+' | tail -n1 || true)"
  passed="${passed:-0}" failed="${failed:-0}" skipped="${skipped:-0}"
elif ((built)); then
  failed_steps+=("tests (no test binary at $TESTS)")
fi

# --- The suite again as concurrent shards on the one GPU ------------------------------------
# Contention is what exposed a copy that outlived its failed fence: with several processes on
# the GPU, a copy queued behind other work is still running when a rollback after a failed
# fence returns, and unmapping what it writes kills the context (every later CUDA test of that
# process then fails with an illegal address). SHARDS=N processes at once (default 4; 0 or 1:
# skipped), each a gtest shard of the whole suite (SHARD_FILTER narrows it, GTEST_FILTER does
# not), each with its own log.
run_shards() {  # run_shards N
  local n=$1 i rc=0 pids=()
  for ((i = 0; i < n; i++)); do
    GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i "$TESTS" --gtest_filter="${SHARD_FILTER:-*}" \
      >"$OUT/shard$i.log" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < n; i++)); do
    if wait "${pids[i]}"; then
      echo "shard $i of $n: $(grep -E '^\[  PASSED  \]' "$OUT/shard$i.log" | tail -n1)"
    else
      rc=1
      echo "shard $i of $n FAILED:"
      grep -E '^\[  FAILED  \] [A-Za-z]' "$OUT/shard$i.log" | sort -u | head -n 40
    fi
  done
  return "$rc"
}
shards_state="not run"
if ((built)) && [[ -x "$TESTS" ]] && ((${SHARDS:-4} > 1)); then
  step shards "$OUT/shards.log" run_shards "${SHARDS:-4}"
  shards_state="${SHARDS:-4} concurrent shards passed"
  step_failed shards && shards_state="FAILED ($OUT/shards.log)"
fi

# --- compute-sanitizer memcheck over the sweeps that copy and fence ------------------------
# Sharing, fork and copy-on-write under every injected fault, the fences failing with the
# copies still running (the sweeps hold each copy behind a spinning kernel on a GPU): an
# access to memory a rollback unmapped is an error here even when the context survives it.
# MEMCHECK=0 skips it. Left out: the test whose child process writes a read-only window from
# a kernel on purpose (under memcheck that child never ended in 8 minutes on an H100).
memcheck_state="not run"
if ((built)) && [[ -x "$TESTS" ]] && [[ "${MEMCHECK:-1}" != 0 ]] &&
  command -v compute-sanitizer >/dev/null 2>&1; then
  step memcheck "$OUT/memcheck.log" compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$TESTS" --gtest_filter='ArenaShareSweepTest/cuda*:UnconfirmedCopyTest/cuda*:ArenaShareTest/cuda*:CopyOnWriteTest*-*AWriteIntoASharedWindowFaults*'
  memcheck_state="passed (share, fork and copy-on-write sweeps)"
  step_failed memcheck && memcheck_state="FAILED ($OUT/memcheck.log)"
fi

# QUICK=1: the build and the tests only (GTEST_FILTER narrows them), for a check before the
# whole run.
if [[ "${QUICK:-0}" == 1 ]]; then
  {
    echo "tests: ${passed} passed, ${failed} failed, ${skipped} skipped"
    echo "shards: ${shards_state}"
    echo "memcheck: ${memcheck_state}"
  } | tee "$OUT/summary.txt"
  for entry in "${failed_steps[@]+"${failed_steps[@]}"}"; do echo "FAILED: $entry"; done
  ((${#failed_steps[@]} == 0))
  exit
fi

# --- kvvm info -----------------------------------------------------------------------------
CLI="$BUILD/tools/kvvm/kvvm"
if ((built)) && [[ -x "$CLI" ]]; then
  step info "$OUT/info.txt" "$CLI" info --backend cuda --granules 256
  echo "==> info --json"
  set +e
  "$CLI" info --backend cuda --granules 256 --json >"$OUT/info.json" 2>"$OUT/info.json.stderr"
  rc=$?
  set -e
  cat "$OUT/info.json"
  if ((rc != 0)); then
    cat "$OUT/info.json.stderr"
    failed_steps+=("info --json (exit ${rc}, $OUT/info.json.stderr)")
  fi
elif ((built)); then
  echo "no kvvm tool at $CLI (KVVM_BUILD_TOOLS=OFF?)" | tee "$OUT/info.txt"
fi

# --- Benchmarks ----------------------------------------------------------------------------
BENCH="$BUILD/bench/kvvm_bench"
bench_state="not built"
if ((built)) && [[ -x "$BENCH" ]]; then
  step bench "$OUT/bench.log" "$BENCH" "--benchmark_out=$OUT/bench.json" \
    --benchmark_out_format=json
  bench_state="ran ($OUT/bench.json)"
  step_failed bench && bench_state="FAILED ($OUT/bench.log)"
fi

# --- Growth benchmark: per-token growth cost and the decode loop -----------------------------
growth_state="not run"
if ((built)) && [[ -x "$CLI" ]] && "$CLI" bench --help >/dev/null 2>&1; then
  step growth "$OUT/growth.txt" "$CLI" bench growth --backend cuda
  set +e
  "$CLI" bench growth --backend cuda --json >"$OUT/growth.json" 2>>"$OUT/growth.stderr"
  set -e
  growth_state="ran ($OUT/growth.txt, growth.json)"
  step_failed growth && growth_state="FAILED ($OUT/growth.txt)"
fi

# --- Sharing benchmark: savings and the cost of the boundary copy / copy-on-write ------------
share_state="not run"
if ((built)) && [[ -x "$CLI" ]] && "$CLI" bench share --help >/dev/null 2>&1; then
  step share "$OUT/share.txt" "$CLI" bench share --backend cuda
  share_state="ran ($OUT/share.txt)"
  step_failed share && share_state="FAILED ($OUT/share.txt)"
fi

# --- kvvm simulate on the GPU's arena: the README's main job, built-in defaults ------------
simulate_state="not run"
if ((built)) && [[ -x "$CLI" ]] && "$CLI" simulate --help >/dev/null 2>&1; then
  step simulate "$OUT/simulate.txt" "$CLI" simulate --backend cuda
  simulate_state="ran ($OUT/simulate.txt)"
  step_failed simulate && simulate_state="FAILED ($OUT/simulate.txt)"
fi

# --- The model on CUDA: the demo model's chat answer, and generate beside HF ----------------
generate_state="not run"
if ((built)) && [[ -x "$CLI" ]] && "$CLI" generate --help >/dev/null 2>&1; then
  step generate "$OUT/generate.txt" "$CLI" generate --model "$ROOT/models/kvvm-adder" \
    --backend cuda --chat "What is 482 + 39?"
  generate_state="ran ($OUT/generate.txt)"
  # `kvvm generate` beside HF transformers on Qwen2.5-0.5B- and Llama-3-8B-shaped random
  # checkpoints (minutes: the 8B one is written to disk first). BENCH_GENERATE=0 skips it.
  if [[ "${BENCH_GENERATE:-1}" != 0 ]] && python3 -c 'import transformers' 2>/dev/null; then
    step bench_generate "$OUT/bench_generate.log" python3 "$ROOT/bench/generate_hf.py" \
      --kvvm "$CLI" --out "$OUT"
    generate_state="ran ($OUT/generate.txt, generate.md)"
  fi
  step_failed generate && generate_state="FAILED ($OUT/generate.txt)"
  step_failed bench_generate && generate_state="FAILED ($OUT/bench_generate.log)"
fi

# --- Attention kernels: bench decode against PyTorch SDPA, compute-sanitizer ---------------
# The attention tests already ran in the suite above; scripts/gpu-kernels.sh adds the decode
# benchmark, the PyTorch baseline and the sanitizer runs. Its files go to $OUT/kernels (packed
# into logs.tgz below) except the decode table, kept beside the summary.
kernels_state="not run"
if ((built)) && [[ -x "$CLI" ]]; then
  mkdir -p "$OUT/kernels"
  step kernels "$OUT/kernels.log" env OUT="$OUT/kernels" BUILD="$BUILD" TESTS_TOO=0 \
    "$ROOT/scripts/gpu-kernels.sh"
  cp "$OUT/kernels/decode.txt" "$OUT/decode.txt" 2>/dev/null || true
  cp "$OUT/kernels/attention-summary.md" "$OUT/attention-summary.md" 2>/dev/null || true
  kernels_state="ran ($OUT/attention-summary.md, decode.txt; kernels/ in logs.tgz)"
  step_failed kernels && kernels_state="FAILED ($OUT/kernels.log)"
fi

# --- Summary -------------------------------------------------------------------------------
{
  echo
  echo "================ kvvm gpu-check summary ================"
  printf '%-10s %s\n' "gpu" "$(nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader 2>/dev/null | head -n1 || echo unknown)"
  printf '%-10s passed %s, failed %s, skipped %s  (%s)\n' "tests" "$passed" "$failed" \
    "$skipped" "$OUT/tests.xml"
  printf '%-10s %s\n' "shards" "$shards_state"
  printf '%-10s %s\n' "memcheck" "$memcheck_state"
  printf '%-10s %s\n' "bench" "$bench_state"
  printf '%-10s %s\n' "growth" "$growth_state"
  printf '%-10s %s\n' "share" "$share_state"
  printf '%-10s %s\n' "generate" "$generate_state"
  if [[ -s "$OUT/generate.md" ]]; then
    echo "generate (bench/generate_hf.py, batch 1, bf16, 128 + 128 tokens):"
    cat "$OUT/generate.md"
  fi
  if [[ -s "$OUT/share.txt" ]]; then
    echo "share (kvvm bench share --backend cuda):"
    sed 's/^/  /' "$OUT/share.txt"
  fi
  printf '%-10s %s\n' "simulate" "$simulate_state"
  if [[ -s "$OUT/simulate.txt" ]]; then
    echo "simulate (kvvm simulate --backend cuda):"
    sed 's/^/  /' "$OUT/simulate.txt"
  fi
  printf '%-10s %s\n' "kernels" "$kernels_state"
  if [[ -s "$OUT/attention-summary.md" ]]; then
    echo "attention kernels beside PyTorch SDPA (medians of the runs; bench/attention_summary.py):"
    cat "$OUT/attention-summary.md"
  fi
  if [[ -s "$OUT/info.txt" ]]; then
    echo "info (kvvm info --backend cuda):"
    sed 's/^/  /' "$OUT/info.txt"
  fi
  if [[ -s "$OUT/tests.log" ]] && grep -q '^\[ CUDA \]' "$OUT/tests.log"; then
    echo "CUDA behaviour observed by the tests:"
    grep '^\[ CUDA \]' "$OUT/tests.log" | sed 's/^\[ CUDA \] /  /'
  fi
  if [[ -s "$OUT/tests.log" ]] && grep -q '^\[  FAILED  \] [A-Za-z]' "$OUT/tests.log"; then
    echo "failed tests:"
    grep '^\[  FAILED  \] [A-Za-z]' "$OUT/tests.log" | sort -u | sed 's/^\[  FAILED  \] /  /'
  fi
  if ((${#failed_steps[@]} > 0)); then
    echo "failed steps:"
    printf '  %s\n' "${failed_steps[@]}"
  fi
  echo "results in $OUT"
} | tee "$OUT/summary.txt"

# The device tool brings back at most 8 files: keep the summary, the info table and JSON,
# the benchmark JSON and the test XML as they are, and pack every log into one archive.
(cd "$OUT" && tar czf logs.tgz --ignore-failed-read -- *.log *.stderr environment.txt \
  nvidia-smi.txt info.txt share.txt simulate.txt kernels 2>/dev/null &&
  rm -rf -- *.log *.stderr environment.txt nvidia-smi.txt info.txt share.txt simulate.txt \
    kernels) || true

if ((${#failed_steps[@]} > 0)) || [[ "$failed" != "-" && "$failed" != "0" ]]; then
  exit 1
fi
exit 0
