#!/usr/bin/env bash
# The fp8 (e4m3) KV cache on a GPU, each figure beside its bf16 counterpart in the same run:
#   decode   `kvvm bench decode` over a bf16 cache and an fp8 one (bf16 queries and outputs)
#            beside PyTorch SDPA flash over bf16 K / V (bench/sdpa_baseline.py --dtype bfloat16);
#   engine   `kvvm bench engine` on a Llama-3-8B-shaped model (--load-format dummy: a config
#            only) at a fixed KV budget: decode at batch 32 over 4K-token prompts, and the
#            ShareGPT-like trace at one saturating rate (peak concurrency, output tokens/s),
#            with --kv-dtype bf16 and fp8.
# Usage: OUT=dir CLI=build/gpu/tools/kvvm/kvvm bench/kv-fp8-gpu.sh [decode] [engine]
# (default both). Needs torch for the SDPA baseline and the config.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/out/kv-fp8}"
CLI="${CLI:-$ROOT/build/gpu/tools/kvvm/kvvm}"
WORK="${WORK:-/tmp/kvvm-bench-models}"
KV_BUDGET="${KV_BUDGET:-40GiB}"
RATE="${RATE:-64}"
REQUESTS="${REQUESTS:-1200}"
DURATION="${DURATION:-30}"
MAX_RUNNING="${MAX_RUNNING:-512}"
PARTS=("$@")
[[ ${#PARTS[@]} -eq 0 ]] && PARTS=(decode engine)
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$ROOT/bench${PYTHONPATH:+:$PYTHONPATH}"

for part in "${PARTS[@]}"; do
  case "$part" in
    decode)
      python3 "$ROOT/bench/sdpa_baseline.py" --dtype bfloat16 --no-prefill \
        --json "$OUT/sdpa-bf16.json" | tee "$OUT/sdpa-bf16.txt"
      "$CLI" bench decode --element bf16 --layout token-major --baseline "$OUT/sdpa-bf16.json" \
        --json "$OUT/decode-bf16.json" | tee "$OUT/decode-bf16.txt"
      "$CLI" bench decode --element bf16 --kv-dtype fp8 --baseline "$OUT/sdpa-bf16.json" \
        --json "$OUT/decode-fp8.json" | tee "$OUT/decode-fp8.txt"
      ;;
    engine)
      dir="$WORK/llama-3-8b-config"
      [[ -f "$dir/config.json" ]] ||
        python3 "$ROOT/bench/weights_hf.py" --model "$dir" --config-only llama-3-8b
      for kv in bf16 fp8; do
        echo "== kvvm bench engine, llama-3-8b (dummy), $kv KV, $KV_BUDGET"
        "$CLI" bench engine --model "$dir" --backend cuda --load-format dummy \
          --kv-budget "$KV_BUDGET" --kv-dtype "$kv" --max-context 8192 --max-running "$MAX_RUNNING" \
          --batches 32 --prompt-tokens 4096 --decode-tokens 64 --rates "$RATE" \
          --requests "$REQUESTS" --duration-limit "$DURATION" --json >"$OUT/engine-$kv.json"
        python3 - "$OUT/engine-$kv.json" <<'PY' | tee "$OUT/engine-$kv.txt"
import json, sys
r = json.load(open(sys.argv[1]))
print({k: r.get(k) for k in ("model", "kv_budget", "kv_dtype", "kv_bytes_per_token", "max_running")})
for row in r.get("decode", {}).get("runs", []):
    print({k: row.get(k) for k in ("mode", "batch", "decode_tokens_per_s", "ms_per_step", "skipped")})
for run in r.get("trace", {}).get("runs", []):
    print({k: run.get(k) for k in ("system", "rate", "submitted", "completed", "refused_overloaded",
                                   "output_tokens_per_s", "steady_output_tokens_per_s", "ttft_p50_s",
                                   "tpot_p50_s", "peak_running",
                                   "prefix_hit_tokens", "preemptions")})
PY
      done
      ;;
    *)
      echo "kv-fp8-gpu.sh: unknown part '$part' (decode, engine)" >&2
      exit 2
      ;;
  esac
done
