#!/usr/bin/env bash
# The decode step's fused kernels on a GPU, each figure beside the unfused step in the same
# run: `kvvm bench engine` decode (graphs, eager, preallocated) on the Qwen2.5-0.5B and
# Llama-3-8B shapes (--load-format dummy: a config only), at batches 1 to 256 over 128-token
# prompts, once as built (fused) and once as the baseline: BASELINE=unfused (the default:
# --unfused-kernels, one kernel per op, cuBLAS for every projection, single-block argmax) or
# BASELINE=in-order (--in-order-launches: the same kernels, none overlapping the one before it).
# Prints one line per (shape, batch): ms/step of both and their ratio.
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
BASELINE="${BASELINE:-unfused}"
case "$BASELINE" in
  unfused) baseline_flag=--unfused-kernels ;;
  in-order) baseline_flag=--in-order-launches ;;
  *)
    echo "fused-gpu: BASELINE is '$BASELINE'; it takes unfused or in-order" >&2
    exit 2
    ;;
esac
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$ROOT/bench${PYTHONPATH:+:$PYTHONPATH}"

for shape in $SHAPES; do
  dir="$WORK/$shape-config"
  [[ -f "$dir/config.json" ]] || python3 "$ROOT/bench/weights_hf.py" --model "$dir" --config-only "$shape"
  for kernels in fused "$BASELINE"; do
    flags=()
    [[ "$kernels" == "$BASELINE" ]] && flags=("$baseline_flag")
    echo "== kvvm bench engine, $shape (dummy), $kernels"
    "$CLI" bench engine --model "$dir" --backend cuda --load-format dummy --kv-budget "$KV_BUDGET" \
      --max-context 8192 --batches "$BATCHES" --prompt-tokens 128 --decode-tokens "$DECODE_TOKENS" \
      --no-trace "${flags[@]}" --json >"$OUT/engine-$shape-$kernels.json"
  done
  python3 - "$OUT/engine-$shape-fused.json" "$OUT/engine-$shape-$BASELINE.json" "$shape" "$BASELINE" <<'PY' |
import json, sys
fused, baseline = (json.load(open(p))["decode"]["runs"] for p in sys.argv[1:3])
base = {(r["mode"], r["batch"]): r for r in baseline}
name = sys.argv[4]
print(f"{sys.argv[3]}: mode batch | fused ms/step (tok/s) | {name} ms/step (tok/s) | {name}/fused")
for r in fused:
    b = base.get((r["mode"], r["batch"]))
    if not b or not r.get("ms_per_step") or not b.get("ms_per_step"):
        continue
    print(f'{r["mode"]:>12} {r["batch"]:>4} | {r["ms_per_step"]:.3f} ({r["decode_tokens_per_s"]:.0f}) | '
          f'{b["ms_per_step"]:.3f} ({b["decode_tokens_per_s"]:.0f}) | {b["ms_per_step"] / r["ms_per_step"]:.2f}x')
PY
    tee "$OUT/summary-$shape.txt"
done
