#!/usr/bin/env bash
# engine-gpu.sh: `kvvm bench engine` beside Hugging Face transformers on the GPU machine,
# on random bf16 checkpoints of the Qwen2.5-0.5B and Llama-3-8B shapes (the same weights for
# both sides; bench/generate_hf.py makes them). For each shape:
#   engine-SHAPE.json / .txt   kvvm bench engine --backend cuda: decode at batch 1 and 32
#                              (graphs, eager, preallocated), then the trace replay at RATES
#                              through the arena and the preallocated engine at KV_BUDGET
#   engine-SHAPE.svg           output tokens/s against rate (arena vs preallocated)
#   hf-SHAPE.json              bench/engine_hf.py: HF generate, eager and static cache
#                              + torch.compile, batch 1 and 32, decode apart from prefill
# and copy.json: the device-to-device copy rate the weight-read bound divides by.
# Everything lands in $OUT (default ./out/engine), packed into $OUT/engine.tgz as well.
#
# Usage: CLI=build/gpu/tools/kvvm/kvvm bench/engine-gpu.sh
#   SHAPES="qwen2.5-0.5b" HF=0 RATES=2,8,32 KV_BUDGET=40GiB bench/engine-gpu.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/out/engine}"
CLI="${CLI:-$ROOT/build/gpu/tools/kvvm/kvvm}"
WORK="${WORK:-/tmp/kvvm-bench-models}"
SHAPES="${SHAPES:-qwen2.5-0.5b llama-3-8b}"
RATES="${RATES:-4,16,64}"
REQUESTS="${REQUESTS:-300}"
DURATION="${DURATION:-20}"
KV_BUDGET="${KV_BUDGET:-40GiB}"
MAX_RUNNING="${MAX_RUNNING:-256}"
HF="${HF:-1}"
HF_TIMEOUT="${HF_TIMEOUT:-300}"
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$ROOT/bench${PYTHONPATH:+:$PYTHONPATH}"

python3 -c 'import json, generate_hf as b; print(json.dumps({"copy_bytes_per_s": b.copy_bandwidth()}))' \
  | tee "$OUT/copy.json"
status=0
for shape in $SHAPES; do
  dir="$WORK/$shape"
  if [[ ! -f "$dir/config.json" ]]; then
    echo "== making the $shape checkpoint in $dir"
    python3 -c "import generate_hf as b; b.make_checkpoint('$shape', '$dir')"
  fi
  echo "== kvvm bench engine on $shape"
  if ! "$CLI" bench engine --model "$dir" --backend cuda --kv-budget "$KV_BUDGET" \
    --max-context 8192 --max-running "$MAX_RUNNING" --rates "$RATES" --requests "$REQUESTS" \
    --duration-limit "$DURATION" --json --plot "$OUT/engine-$shape.svg" >"$OUT/engine-$shape.json"; then
    echo "kvvm bench engine failed on $shape"
    status=1
  fi
  python3 - "$OUT/engine-$shape.json" <<'EOF' | tee "$OUT/engine-$shape.txt" || true
import json, sys
r = json.load(open(sys.argv[1]))
print({k: r.get(k) for k in ("model", "kv_budget", "kv_bytes_per_token", "preallocated_capacity", "max_running")})
for row in r.get("decode", {}).get("runs", []):
    print({k: row.get(k) for k in ("mode", "batch", "decode_tokens_per_s", "ms_per_step", "prefill_seconds", "graph_replays", "eager_steps", "skipped")})
for run in r.get("trace", {}).get("runs", []):
    print({k: run.get(k) for k in ("system", "rate", "submitted", "completed", "refused_overloaded", "refused_at_arrival", "output_tokens_per_s", "steady_output_tokens_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "peak_running", "prefix_hit_tokens", "preemptions")})
EOF
  if [[ "$HF" != 0 ]]; then
    echo "== HF transformers generate on $shape"
    timeout "$HF_TIMEOUT" python3 "$ROOT/bench/engine_hf.py" --model "$dir" \
      --out "$OUT/hf-$shape.json" >/dev/null || echo "HF on $shape: exit $? (partial or none)"
    cat "$OUT/hf-$shape.json" 2>/dev/null || true
  fi
done
tar czf "$OUT/engine.tgz" -C "$OUT" --exclude engine.tgz .
exit $status
