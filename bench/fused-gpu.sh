#!/usr/bin/env bash
# The decode step's fused kernels on a GPU, each figure beside the unfused step in the same
# run: `kvvm bench engine` decode (graphs, eager, preallocated) on the Qwen2.5-0.5B and
# Llama-3-8B shapes (--load-format dummy: a config only), at batches 1 to 256 over 128-token
# prompts, once as built (fused) and once with --unfused-kernels (one kernel per op, cuBLAS
# for every projection, single-block argmax). Prints one line per (shape, batch): ms/step of
# both and their ratio.
# Usage: OUT=dir CLI=build/gpu/tools/kvvm/kvvm bench/fused-gpu.sh. Needs python3 for the configs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/out/fused}"
CLI="${CLI:-$ROOT/build/gpu/tools/kvvm/kvvm}"
WORK="${WORK:-/tmp/kvvm-bench-models}"
SHAPES="${SHAPES:-qwen2.5-0.5b llama-3-8b}"
BATCHES="${BATCHES:-1,2,4,8,16,32,64,128,256}"
DECODE_TOKENS="${DECODE_TOKENS:-32}"
KV_BUDGET="${KV_BUDGET:-40GiB}"
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$ROOT/bench${PYTHONPATH:+:$PYTHONPATH}"

for shape in $SHAPES; do
  dir="$WORK/$shape-config"
  [[ -f "$dir/config.json" ]] || python3 "$ROOT/bench/weights_hf.py" --model "$dir" --config-only "$shape"
  for kernels in fused unfused; do
    flags=()
    [[ "$kernels" == unfused ]] && flags=(--unfused-kernels)
    echo "== kvvm bench engine, $shape (dummy), $kernels kernels"
    "$CLI" bench engine --model "$dir" --backend cuda --load-format dummy --kv-budget "$KV_BUDGET" \
      --max-context 8192 --batches "$BATCHES" --prompt-tokens 128 --decode-tokens "$DECODE_TOKENS" \
      --no-trace "${flags[@]}" --json >"$OUT/engine-$shape-$kernels.json"
  done
  python3 - "$OUT/engine-$shape-fused.json" "$OUT/engine-$shape-unfused.json" "$shape" <<'PY' |
import json, sys
fused, unfused = (json.load(open(p))["decode"]["runs"] for p in sys.argv[1:3])
base = {(r["mode"], r["batch"]): r for r in unfused}
print(f"{sys.argv[3]}: mode batch | fused ms/step (tok/s) | unfused ms/step (tok/s) | unfused/fused")
for r in fused:
    b = base.get((r["mode"], r["batch"]))
    if not b or not r.get("ms_per_step") or not b.get("ms_per_step"):
        continue
    print(f'{r["mode"]:>12} {r["batch"]:>4} | {r["ms_per_step"]:.3f} ({r["decode_tokens_per_s"]:.0f}) | '
          f'{b["ms_per_step"]:.3f} ({b["decode_tokens_per_s"]:.0f}) | {b["ms_per_step"] / r["ms_per_step"]:.2f}x')
PY
    tee "$OUT/summary-$shape.txt"
done
