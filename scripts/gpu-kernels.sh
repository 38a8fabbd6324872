#!/usr/bin/env bash
# gpu-kernels.sh: the attention kernels' step of the GPU check, also run alone.
#
# Needs a configured and built tree (BUILD, default build/gpu, with kvvm_tests and kvvm):
#   1. the attention tests (CUDA kernels against the float64 reference, graph replay across
#      growth), XML to kernels-tests.xml;
#   2. RUNS (default 3) repetitions, each into $OUT/runN/, of: bench/sdpa_baseline.py (PyTorch
#      SDPA, flash, decode shapes and prefill rows) -> sdpa.json, kvvm bench decode --baseline
#      -> decode.txt / decode.json, kvvm bench prefill --baseline -> prefill.txt / prefill.json;
#      then bench/attention_summary.py over the runs: medians, spreads and the acceptance goals
#      -> $OUT/attention-summary.md (printed last); the last run's decode table also goes to
#      $OUT/decode.txt (gpu-check.sh shows it);
#   3. compute-sanitizer memcheck on the kernel tests and racecheck on the split-K decode and
#      prefill tests, when compute-sanitizer is installed and the device supports it
#      (Firecracker machines; gVisor answers "Device not supported");
#   4. Nsight Compute (when ncu is installed; NCU=0 skips): DRAM throughput, occupancy and its
#      limits, registers and time of the decode kernels at 1,32768,32/8,128 token-major ->
#      $OUT/ncu-decode.txt, and of the 4K prefill -> $OUT/ncu-prefill.txt.
# The device tool returns few files: with PACK=1 (default) the runs and the logs are packed
# into $OUT/attention-runs.tgz and removed, leaving attention-summary.md, decode.txt,
# ncu-*.txt and the archive. Exit status: non-zero when a step failed (a failed ncu step is
# reported, not counted: counters may be off limits to the user).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
OUT="${OUT:-$ROOT/out}"
BUILD="${BUILD:-build/gpu}"
SANITIZE="${SANITIZE:-1}"
SANITIZERS="${SANITIZERS:-memcheck racecheck}"  # which of the two (one alone fits a short call)
TESTS_TOO="${TESTS_TOO:-1}"  # 0: skip step 1 (gpu-check.sh already ran the whole suite)
RUNS="${RUNS:-3}"  # 0: no benchmark runs (the sanitizers only, when the device time is short)
NCU="${NCU:-1}"
PACK="${PACK:-1}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
status=0
TESTS="$BUILD/tests/kvvm_tests"
CLI="$BUILD/tools/kvvm/kvvm"

if [[ "$TESTS_TOO" == 1 ]]; then
  echo "==> kernels: attention tests"
  "$TESTS" --gtest_filter='*Attention*' --gtest_output="xml:$OUT/kernels-tests.xml" \
    >"$OUT/kernels-tests.log" 2>&1 || status=1
  grep -E '^\[  (PASSED|FAILED) \]|Failure|seed' "$OUT/kernels-tests.log" | head -40
fi

# PyTorch and kvvm one after the other in each run, so both see the same machine state.
runs=()
for ((r = 1; r <= RUNS; ++r)); do
  dir="$OUT/run$r"
  mkdir -p "$dir"
  runs+=("$dir")
  echo "==> kernels: run $r/$RUNS: PyTorch baseline"
  PYTHONUNBUFFERED=1 python3 bench/sdpa_baseline.py --json "$dir/sdpa.json" >"$dir/sdpa.txt" 2>&1 ||
    status=1
  tail -n 20 "$dir/sdpa.txt"
  echo "==> kernels: run $r/$RUNS: kvvm bench decode"
  "$CLI" bench decode --baseline "$dir/sdpa.json" --json "$dir/decode.json" >"$dir/decode.txt" 2>&1 ||
    status=1
  cat "$dir/decode.txt"
  echo "==> kernels: run $r/$RUNS: kvvm bench prefill"
  "$CLI" bench prefill --baseline "$dir/sdpa.json" --json "$dir/prefill.json" \
    >"$dir/prefill.txt" 2>&1 || status=1
  cat "$dir/prefill.txt"
done
if ((RUNS > 0)); then
  cp "$OUT/run$RUNS/decode.txt" "$OUT/decode.txt" 2>/dev/null || true
  echo "==> kernels: summary of $RUNS run(s) -> $OUT/attention-summary.md (printed at the end)"
  python3 bench/attention_summary.py "${runs[@]}" --out "$OUT/attention-summary.md" >/dev/null ||
    status=1
fi

if [[ "$SANITIZE" == 1 ]] && command -v compute-sanitizer >/dev/null 2>&1; then
  # A subset of the suite: the masking tests (stale tail; planned, forced and no split), two
  # decode configurations at every length up to 32768, prefill (whole and chunked), and the
  # graph test under memcheck; then racecheck on the shared-memory reductions of decode
  # (split-K partials and merge) and prefill.
  filter='*Masking*:*CausalPrefill*d128_g4:*CausalPrefill*d64_g7:*Graph*tokenmajor'
  filter+=':*DecodeMatches*tokenmajor_fp16_d128_g4:*DecodeMatches*headmajor_bf16_d64_g7'
  # Weights streamed through a ring of 2 slots, eager and in a replayed graph (the copies into
  # the slots land while kernels read the weights). Memcheck only: racecheck sees shared-memory
  # hazards inside a kernel, not the order of a copy stream against the compute stream (which
  # the tests' bit-equal logits prove), and over their 400 steps it ran past this step's time.
  filter+=':*WeightStreamCuda*/8:*WeightStreamCuda*/9'
  filter+=':*ChunkedPrefill*:WideGroups*bf16_d128_g12*'
  # The model's own kernels (embedding, RMSNorm, RoPE, SiLU-mul, bias, argmax, sampling), one
  # step of the CUDA model through them, and its decode graphs (capture, padded replays).
  filter+=':ModelKernelsCuda*:ModelCudaTest*:ModelKernelsSampling*Small*:ModelKernelsSampling*Tiny*'
  filter+=':ModelCudaGraphTest*'
  # The fp8 (e4m3) cache: append of every 16-bit value, decode of two configurations at every
  # length, prefill, per-head scales, and the model's calibration (its maxima kernel).
  filter+=':Fp8AppendCuda*:*DecodeMatches*tokenmajor_bf16_d128_g4_fp8kv'
  filter+=':*DecodeMatches*headmajor_fp16_d64_g7_fp8kv:*CausalPrefill*d128_g4_fp8kv'
  filter+=':Fp8HeadScalesCuda*:KvCalibrationCuda*:KvHeadScalesModelCuda*'
  # The fused step's kernels: GEMV (small shapes; the float64 test's large ones would outlast
  # the step under the sanitizer; every split and unroll, 16-bit, FP8 and FP8 on the tensor
  # cores, whose rounds end past a row's end) and RoPE fused with the append on 16-bit and fp8
  # caches.
  filter+=':FusedStepKernelsCuda.GemvGives*:FusedStepKernelsCuda.RopeAppend*'
  filter+=':*GemvMatchesAFloat64ReferenceWithEverySplitAndUnroll'
  # Qwen3's per-head q / k norms, and greedy rows that copy the argmax they are given.
  filter+=':HeadNormCuda*:ModelKernelsSampling*Greedy*'
  # The overlapped launches' readers behind a late copy, the projections and the step's other
  # kernels (the sanitizer serializes them: this checks their accesses, not the overlap).
  filter+=':OverlappedLaunch*:OverlappedStepKernels*'
  # The RMSNorm's and SiLU-mul's quantized rows, in every kernel shape and fallback.
  filter+=':Fp8KernelsCuda.NormAndSiluMulWriteTheQuantizationsBits'
  if [[ " $SANITIZERS " == *" memcheck "* ]]; then
    echo "==> kernels: compute-sanitizer memcheck ($filter)"
    timeout 200 compute-sanitizer --tool memcheck --error-exitcode 99 "$TESTS" --gtest_filter="$filter" \
      >"$OUT/kernels-memcheck.log" 2>&1 || status=1
    tail -n 5 "$OUT/kernels-memcheck.log"
  fi
  filter='*Masking*:*CausalPrefill*tokenmajor_fp16_d128_g4:ModelKernelsCuda*'
  filter+=':*DecodeMatches*tokenmajor_bf16_d128_g4:*ChunkedPrefill*tokenmajor_bf16_d64_g4'
  filter+=':ModelKernelsSampling*TinyVocabularies*'
  filter+=':*DecodeMatches*tokenmajor_bf16_d128_g4_fp8kv:*CausalPrefill*tokenmajor_bf16_d128_g4_fp8kv'
  filter+=':FusedStepKernelsCuda.GemvGives*'  # the GEMV's sum of its warps' partials
  filter+=':*GemvMatchesAFloat64ReferenceWithEverySplitAndUnroll'  # every split's partials
  filter+=':Fp8KernelsCuda.NormAndSiluMulWriteTheQuantizationsBits'  # the row maxima's partials
  if [[ " $SANITIZERS " == *" racecheck "* ]]; then
    echo "==> kernels: compute-sanitizer racecheck ($filter)"
    timeout 200 compute-sanitizer --tool racecheck --error-exitcode 99 "$TESTS" --gtest_filter="$filter" \
      >"$OUT/kernels-racecheck.log" 2>&1 || status=1
    tail -n 5 "$OUT/kernels-racecheck.log"
  fi
fi

if [[ "$NCU" == 1 ]] && command -v ncu >/dev/null 2>&1; then
  # --clock-control none: the clocks the benchmarks ran at, not ncu's locked base clock.
  metrics=dram__bytes_read.sum.per_second,dram__throughput.avg.pct_of_peak_sustained_elapsed
  metrics+=,sm__warps_active.avg.pct_of_peak_sustained_active,sm__maximum_warps_per_active_cycle_pct
  metrics+=,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem
  metrics+=,launch__registers_per_thread,gpu__time_duration.sum
  echo "==> kernels: ncu, decode 1,32768,32/8,128 token-major"
  timeout 300 ncu --clock-control none --metrics "$metrics" -k regex:decode -s 3 -c 1 \
    "$CLI" bench decode --shape 1,32768,32/8,128 --layout token-major --iterations 1 --samples 1 \
    >"$OUT/ncu-decode.txt" 2>&1 || echo "ncu decode FAILED (see ncu-decode.txt)"
  grep -E 'decode|dram__|sm__|launch__|gpu__time|ERR' "$OUT/ncu-decode.txt" | head -40
  echo "==> kernels: ncu, prefill 4096 token-major"
  timeout 300 ncu --clock-control none --metrics "$metrics" -k regex:prefill -s 3 -c 1 \
    "$CLI" bench prefill --case 4096 --layout token-major --iterations 1 --samples 1 \
    >"$OUT/ncu-prefill.txt" 2>&1 || echo "ncu prefill FAILED (see ncu-prefill.txt)"
  grep -E 'prefill|dram__|sm__|launch__|gpu__time|ERR' "$OUT/ncu-prefill.txt" | head -40
fi

if [[ "$PACK" == 1 ]]; then
  packed=()
  for item in "${runs[@]}" "$OUT"/kernels-*.log "$OUT"/kernels-*.xml; do
    [[ -e "$item" ]] && packed+=("$(basename "$item")")
  done
  if ((${#packed[@]})) && tar -czf "$OUT/attention-runs.tgz" -C "$OUT" "${packed[@]}"; then
    (cd "$OUT" && rm -rf -- "${packed[@]}")
  fi
fi

echo "==> kernels: attention summary ($OUT/attention-summary.md)"
cat "$OUT/attention-summary.md" 2>/dev/null || echo "no summary (see the runs above)"
exit $status
