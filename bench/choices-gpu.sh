#!/usr/bin/env bash
# choices-gpu.sh: what n > 1 by fork and log-probabilities cost, on the GPU machine, on a random
# bf16 checkpoint of the Llama-3-8B shape (bench/generate_hf.py makes it):
#   choices.json / .txt   kvvm bench engine --backend cuda:
#                         (a) decode at batch 32: graphs, graphs with logprobs (top 5), eager,
#                             preallocated, side by side in one process;
#                         (c) one 2,048-token prompt answered 8 times with 256 tokens each, as
#                             one request of n = 8 (forked KV) and as 8 requests at once with the
#                             prefix cache on: peak KV bytes and time to the last token.
# Everything lands in $OUT (default ./out/choices).
#
# Usage: CLI=build/gpu/tools/kvvm/kvvm bench/choices-gpu.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/out/choices}"
CLI="${CLI:-$ROOT/build/gpu/tools/kvvm/kvvm}"
WORK="${WORK:-/tmp/kvvm-bench-models}"
SHAPE="${SHAPE:-llama-3-8b}"
N="${N:-8}"
PROMPT="${PROMPT:-2048}"
TOKENS="${TOKENS:-256}"
BATCH="${BATCH:-32}"
KV_BUDGET="${KV_BUDGET:-40GiB}"
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$ROOT/bench${PYTHONPATH:+:$PYTHONPATH}"

dir="$WORK/$SHAPE"
if [[ ! -f "$dir/config.json" ]]; then
  echo "== making the $SHAPE checkpoint in $dir"
  python3 -c "import generate_hf as b; b.make_checkpoint('$SHAPE', '$dir')"
fi
echo "== kvvm bench engine on $SHAPE: decode at batch $BATCH with and without logprobs, n = $N"
"$CLI" bench engine --model "$dir" --backend cuda --kv-budget "$KV_BUDGET" --max-context 4096 \
  --batches "$BATCH" --prompt-tokens 128 --decode-tokens 128 --logprobs 5 --no-trace \
  --choices "$N" --choices-prompt-tokens "$PROMPT" --choices-tokens "$TOKENS" --json \
  >"$OUT/choices.json"
python3 - "$OUT/choices.json" <<'PY' | tee "$OUT/choices.txt"
import json, sys
r = json.load(open(sys.argv[1]))
runs = {row["mode"]: row for row in r["decode"]["runs"]}
for row in r["decode"]["runs"]:
    print({k: row.get(k) for k in ("mode", "batch", "decode_tokens_per_s", "ms_per_step", "graph_replays", "eager_steps", "skipped")})
graphs, logprobs = runs.get("graphs"), runs.get("logprobs 5")
if graphs and logprobs and graphs.get("decode_tokens_per_s"):
    print(f"logprobs 5 / graphs: {logprobs['decode_tokens_per_s'] / graphs['decode_tokens_per_s']:.3f}x decode tokens/s")
choices = r["choices"]["runs"]
for run in choices:
    print(run)
fork, requests = choices
print(f"fork / requests: peak KV {fork['peak_kv_bytes'] / requests['peak_kv_bytes']:.3f}x, "
      f"time to last token {fork['seconds'] / requests['seconds']:.3f}x")
PY
