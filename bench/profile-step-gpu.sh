#!/usr/bin/env bash
# ncu over consecutive batch-1 decode steps of the Llama-3-8B shape (--load-format dummy), fused
# and unfused kernels: per kernel its GPU time and DRAM bytes, summarised by
# bench/step_profile.py (kernels per step, kernel time per step, GB/s per kernel class). The
# steps are those of `kvvm bench engine --batches 1` in graphs mode (ncu profiles each graph
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
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$ROOT/bench${PYTHONPATH:+:$PYTHONPATH}"
dir="$WORK/$SHAPE-config"
[[ -f "$dir/config.json" ]] || python3 "$ROOT/bench/weights_hf.py" --model "$dir" --config-only "$SHAPE"
for kernels in fused unfused; do
  flags=()
  [[ "$kernels" == unfused ]] && flags=(--unfused-kernels)
  echo "== ncu, $SHAPE batch 1, $kernels kernels"
  ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    --csv --page raw --print-units base --launch-skip "$LAUNCH_SKIP" --launch-count "$LAUNCH_COUNT" \
    "$CLI" bench engine --model "$dir" --backend cuda --load-format dummy --kv-budget 8GiB \
    --max-context 4096 --batches 1 --prompt-tokens 128 --decode-tokens 64 --no-trace \
    "${flags[@]}" --json >"$OUT/ncu-$SHAPE-$kernels.csv" 2>"$OUT/ncu-$SHAPE-$kernels.log" || true
  python3 "$ROOT/bench/step_profile.py" "$OUT/ncu-$SHAPE-$kernels.csv" \
    >"$OUT/profile-$SHAPE-$kernels.json" 2>"$OUT/profile-$SHAPE-$kernels.txt" || true
  cat "$OUT/profile-$SHAPE-$kernels.txt"
done

# The preallocated engine against the arena at batch 16, same kernels and lengths: ncu times
# only the decode-attention kernels of the three modes (graphs, eager, preallocated; in that
# order, each a warm-up and DECODE steps), to see whether the attention over fully committed
# slots is what is slower.
if [[ "${PREALLOCATED:-1}" != 0 ]]; then
  dir="$WORK/llama-3-8b-config"
  [[ -f "$dir/config.json" ]] || python3 "$ROOT/bench/weights_hf.py" --model "$dir" --config-only llama-3-8b
  echo "== ncu, llama-3-8b batch 16, decode attention of graphs / eager / preallocated"
  ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum --kernel-name regex:decode \
    --csv --page raw --print-units base \
    "$CLI" bench engine --model "$dir" --backend cuda --load-format dummy --kv-budget 40GiB \
    --max-context 8192 --batches 16 --prompt-tokens 128 --decode-tokens 16 --no-trace --json \
    >"$OUT/ncu-preallocated.csv" 2>"$OUT/ncu-preallocated.log" || true
  python3 - "$OUT/ncu-preallocated.csv" <<'PY' | tee "$OUT/preallocated.txt"
import csv, sys
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
rows = []
for r in csv.DictReader(lines):
    try:
        rows.append((float(r["gpu__time_duration.sum"]), float(r["dram__bytes_read.sum"] or 0)))
    except (KeyError, ValueError):
        pass
third = len(rows) // 3
for name, part in (("graphs", rows[:third]), ("eager", rows[third:2 * third]),
                   ("preallocated", rows[2 * third:])):
    if part:
        t = sum(p[0] for p in part)
        print(f"{name:12} {len(part)} decode kernels: mean {t / len(part) / 1e3:.2f} us, "
              f"{sum(p[1] for p in part) / t:.0f} GB/s")
PY
fi
