#!/usr/bin/env bash
# gpu-kernels.sh: the attention kernels' step of the GPU check, also run alone.
#
# Needs a configured and built tree (BUILD, default build/gpu, with kvvm_tests and kvvm):
#   1. the attention tests (CUDA kernels against the float64 reference, graph replay across
#      growth), XML to $OUT/kernels-tests.xml;
#   2. bench/sdpa_baseline.py (PyTorch SDPA, flash backend, enable_gqa) -> $OUT/sdpa.json;
#   3. kvvm bench decode --baseline sdpa.json -> $OUT/decode.txt and decode.json;
#   4. compute-sanitizer memcheck on the kernel tests and racecheck on the split-K decode and
#      prefill tests, when compute-sanitizer is installed and the device supports it
#      (Firecracker machines; gVisor answers "Device not supported").
# Logs go to $OUT/kernels-*.log. Exit status: non-zero when a step failed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/out}"
BUILD="${BUILD:-build/gpu}"
SANITIZE="${SANITIZE:-1}"
TESTS_TOO="${TESTS_TOO:-1}"  # 0: skip step 1 (gpu-check.sh already ran the whole suite)
mkdir -p "$OUT"
status=0
TESTS="$BUILD/tests/kvvm_tests"
CLI="$BUILD/tools/kvvm/kvvm"

if [[ "$TESTS_TOO" == 1 ]]; then
  echo "==> kernels: attention tests"
  "$TESTS" --gtest_filter='*Attention*' --gtest_output="xml:$OUT/kernels-tests.xml" \
    >"$OUT/kernels-tests.log" 2>&1 || status=1
  grep -E '^\[  (PASSED|FAILED) \]|Failure|seed' "$OUT/kernels-tests.log" | head -40
fi

echo "==> kernels: PyTorch baseline"
PYTHONUNBUFFERED=1 python3 bench/sdpa_baseline.py --json "$OUT/sdpa.json" 2>&1 |
  tee "$OUT/kernels-sdpa.log" || status=1

echo "==> kernels: kvvm bench decode"
"$CLI" bench decode --baseline "$OUT/sdpa.json" --json "$OUT/decode.json" 2>&1 |
  tee "$OUT/decode.txt" || status=1

if [[ "$SANITIZE" == 1 ]] && command -v compute-sanitizer >/dev/null 2>&1; then
  # A subset of the suite: the masking tests (stale tail; planned, forced and no split), two
  # decode configurations at every length up to 32768 (group tiles 4 and 8), prefill and the
  # graph test under memcheck; then racecheck on the shared-memory reductions of decode
  # (split-K partials and merge) and prefill.
  filter='*Masking*:*CausalPrefill*d128_g4:*CausalPrefill*d64_g7:*Graph*tokenmajor'
  filter+=':*DecodeMatches*tokenmajor_fp16_d128_g4:*DecodeMatches*headmajor_bf16_d64_g7'
  # The model's own kernels (embedding, RMSNorm, RoPE, SiLU-mul, bias, argmax, sampling), one
  # step of the CUDA model through them, and its decode graphs (capture, padded replays).
  filter+=':ModelKernelsCuda*:ModelCudaTest*:ModelKernelsSampling*Small*:ModelKernelsSampling*Tiny*'
  filter+=':ModelCudaGraphTest*'
  echo "==> kernels: compute-sanitizer memcheck ($filter)"
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 99 "$TESTS" --gtest_filter="$filter" \
    >"$OUT/kernels-memcheck.log" 2>&1 || status=1
  tail -n 5 "$OUT/kernels-memcheck.log"
  filter='*Masking*:*CausalPrefill*tokenmajor_fp16_d128_g4:ModelKernelsCuda*'
  filter+=':ModelKernelsSampling*TinyVocabularies*'
  echo "==> kernels: compute-sanitizer racecheck ($filter)"
  timeout 200 compute-sanitizer --tool racecheck --error-exitcode 99 "$TESTS" --gtest_filter="$filter" \
    >"$OUT/kernels-racecheck.log" 2>&1 || status=1
  tail -n 5 "$OUT/kernels-racecheck.log"
fi
exit $status
