#!/usr/bin/env bash
# ncu over consecutive decode steps (batch 1 unless BATCH) of the Llama-3-8B shape (dummy
# weights), fused and unfused kernels: per kernel its GPU time and DRAM bytes, summarised by
# bench/step_profile.py (kernels per step, kernel time per step, GB/s per kernel class). The
# steps are those of `kvvm bench engine --batches BATCH` in graphs mode (ncu profiles each graph
# node as a kernel); LAUNCH_SKIP passes the weights' fill, the warm-up and the prefill.
# Usage: OUT=dir CLI=build/gpu/tools/kvvm/kvvm bench/profile-step-gpu.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/out/profile}"
CLI="${CLI:-$ROOT/build/gpu/tools/kvvm/kvvm}"
WORK="${WORK:-/tmp/kvvm-bench-models}"
SHAPE="${SHAPE:-llama-3-8b}"
LAUNCH_SKIP="${LAUNCH_SKIP:-3000}"
LAUNCH_COUNT="${LAUNCH_COUNT:-1200}"
KERNELS="${KERNELS:-fused unfused}"  # which of the two to profile
BATCH="${BATCH:-1}"                  # the decode batch (LAUNCH_SKIP must then pass its prefill)
DECODE_TOKENS="${DECODE_TOKENS:-64}"
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$ROOT/bench${PYTHONPATH:+:$PYTHONPATH}"
dir="$WORK/$SHAPE-config"
[[ -f "$dir/config.json" ]] || python3 "$ROOT/bench/weights_hf.py" --model "$dir" --config-only "$SHAPE"
for kernels in $KERNELS; do
  flags=()
  [[ "$kernels" == unfused ]] && flags=(--unfused-kernels)
  echo "== ncu, $SHAPE batch $BATCH, $kernels kernels"
  ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    --csv --page raw --print-units base --launch-skip "$LAUNCH_SKIP" --launch-count "$LAUNCH_COUNT" \
    "$CLI" bench engine --model "$dir" --backend cuda --load-format dummy --kv-budget 8GiB \
    --max-context 4096 --batches "$BATCH" --prompt-tokens 128 --decode-tokens "$DECODE_TOKENS" --no-trace \
    "${flags[@]}" --json >"$OUT/ncu-$SHAPE-b$BATCH-$kernels.csv" 2>"$OUT/ncu-$SHAPE-b$BATCH-$kernels.log" || true
  python3 "$ROOT/bench/step_profile.py" "$OUT/ncu-$SHAPE-b$BATCH-$kernels.csv" \
    >"$OUT/profile-$SHAPE-b$BATCH-$kernels.json" 2>"$OUT/profile-$SHAPE-b$BATCH-$kernels.txt" || true
  cat "$OUT/profile-$SHAPE-b$BATCH-$kernels.txt"
done

# The preallocated engine against the arena at batch 16, same kernels and lengths: ncu times
# every kernel of the three modes (graphs, eager, preallocated; each a warm-up and DECODE
# steps) with --cache-control none, so each kernel meets the caches and TLBs the one before
# left (ncu's default flushes them, which would hide a difference in address translation),
# and bench/step_profile.py --phases prints each mode's decode steps apart.
if [[ "${PREALLOCATED:-1}" != 0 ]]; then
  dir="$WORK/llama-3-8b-config"
  [[ -f "$dir/config.json" ]] || python3 "$ROOT/bench/weights_hf.py" --model "$dir" --config-only llama-3-8b
  echo "== ncu, llama-3-8b batch 16, every kernel of graphs / eager / preallocated"
  ncu --metrics gpu__time_duration.sum --cache-control none --csv --page raw --print-units base \
    "$CLI" bench engine --model "$dir" --backend cuda --load-format dummy --kv-budget 40GiB \
    --max-context 8192 --batches 16 --prompt-tokens 128 --decode-tokens "${DECODE:-8}" \
    --no-trace --json >"$OUT/ncu-preallocated.csv" 2>"$OUT/ncu-preallocated.log" || true
  python3 "$ROOT/bench/step_profile.py" --phases "$OUT/ncu-preallocated.csv" |
    tee "$OUT/preallocated.txt"
fi
