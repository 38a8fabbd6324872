#!/usr/bin/env bash
# FP8 weights on a GPU, each figure beside bf16 in the same run (`--load-format dummy`: a
# config only, its quantization_config saying the format):
#   1. `kvvm bench engine` decode on the Llama-3-8B shape at batches 1, 16, 256 over 128-token
#      prompts, in bf16, FP8 block-scaled (Hugging Face's "fp8") and FP8 per-channel
#      (compressed-tensors FP8-dynamic): ms/step and tokens/s, and each FP8 run over bf16.
#   2. A Llama-3-70B shape in FP8 (block-scaled; per channel too with QUANTS_70B) on the one
#      GPU: load, batch-1 and batch-16 decode, then `kvvm serve` under `kvvm bench serve` at
#      one rate (bench/serve-gpu.sh).
# The GEMMs alone (prefill TFLOP/s at 4K tokens, FP8 against bf16) are bench/fp8_gemm_bench's.
# Usage: OUT=dir CLI=build/gpu/tools/kvvm/kvvm bench/fp8-gpu.sh. Needs python3 for the configs.
#   PARTS="engine 70b" (default both), BATCHES, DECODE_TOKENS, RATE; BATCHES_70B (default
#   1,16); QUANTS_70B (default block; "block channel" adds the per-channel format, which the
#   common Llama-3.x FP8 releases use); SERVE=0 leaves out the 70B serve run, SERVE_QUANT_70B
#   (block or channel, default block) picks the format it serves.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/out/fp8}"
CLI="${CLI:-$ROOT/build/gpu/tools/kvvm/kvvm}"
WORK="${WORK:-/tmp/kvvm-bench-models}"
PARTS="${PARTS:-engine 70b}"
BATCHES="${BATCHES:-1,16,256}"
DECODE_TOKENS="${DECODE_TOKENS:-64}"
KV_BUDGET="${KV_BUDGET:-40GiB}"
RATE="${RATE:-4}"
# The 70B formats, checked before any run: an unknown one would make a bf16 config (140 GB).
quants_70b="${QUANTS_70B:-block}"
serve_quant="${SERVE_QUANT_70B:-block}"
for quant in $quants_70b "$serve_quant"; do
  case "$quant" in
    block | channel) ;;
    *)
      echo "fp8-gpu: 70B format '$quant' (QUANTS_70B, SERVE_QUANT_70B): not block or channel" >&2
      exit 2
      ;;
  esac
done
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$ROOT/bench${PYTHONPATH:+:$PYTHONPATH}"

# config DIR SHAPE QUANT: DIR/config.json (and tokenizer.json) of SHAPE with QUANT's
# quantization_config (none: as made).
config() {
  local dir="$1" shape="$2" quant="$3"
  [[ -f "$dir/config.json" ]] && return 0
  python3 "$ROOT/bench/weights_hf.py" --model "$dir" --config-only "$shape" >/dev/null
  python3 - "$dir/config.json" "$quant" <<'PY'
import json, sys
path, quant = sys.argv[1:3]
config = json.load(open(path))
if quant == "block":
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128]}
elif quant == "channel":
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"group_0": {
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                        "symmetric": True, "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                  "dynamic": True},
            "targets": ["Linear"]}},
        "ignore": ["lm_head"]}
json.dump(config, open(path, "w"), indent=2)
PY
}

if [[ " $PARTS " == *" engine "* ]]; then
  for quant in none block channel; do
    dir="$WORK/llama-3-8b-$quant"
    config "$dir" llama-3-8b "$quant"
    echo "== kvvm bench engine, llama-3-8b (dummy), weights: $quant"
    "$CLI" bench engine --model "$dir" --backend cuda --load-format dummy --kv-budget "$KV_BUDGET" \
      --max-context 8192 --batches "$BATCHES" --prompt-tokens 128 \
      --decode-tokens "$DECODE_TOKENS" --no-trace --json >"$OUT/engine-8b-$quant.json"
  done
  python3 - "$OUT" <<'PY' | tee "$OUT/summary-8b.txt"
import json, sys
runs = {q: json.load(open(f"{sys.argv[1]}/engine-8b-{q}.json"))["decode"]["runs"]
        for q in ("none", "block", "channel")}
base = {(r["mode"], r["batch"]): r for r in runs["none"]}
print("llama-3-8b: mode batch | bf16 ms/step (tok/s) | fp8 block | fp8 channel | tok/s over bf16")
for r in runs["block"]:
    key = (r["mode"], r["batch"])
    b = base.get(key)
    c = next((x for x in runs["channel"] if (x["mode"], x["batch"]) == key), None)
    if not b or not c or not r.get("ms_per_step"):
        continue
    print(f'{r["mode"]:>12} {r["batch"]:>4} | {b["ms_per_step"]:.3f} ({b["decode_tokens_per_s"]:.0f}) | '
          f'{r["ms_per_step"]:.3f} ({r["decode_tokens_per_s"]:.0f}) | '
          f'{c["ms_per_step"]:.3f} ({c["decode_tokens_per_s"]:.0f}) | '
          f'{r["decode_tokens_per_s"] / b["decode_tokens_per_s"]:.2f}x / '
          f'{c["decode_tokens_per_s"] / b["decode_tokens_per_s"]:.2f}x')
PY
fi

if [[ " $PARTS " == *" 70b "* ]]; then
  : >"$OUT/summary-70b.txt"
  for quant in $quants_70b; do
    dir="$WORK/llama-3-70b-$quant"
    config "$dir" llama-3-70b "$quant"
    echo "== kvvm bench engine, llama-3-70b (dummy), FP8 $quant"
    "$CLI" bench engine --model "$dir" --backend cuda --load-format dummy --kv-budget 24GiB \
      --max-context 8192 --batches "${BATCHES_70B:-1,16}" --prompt-tokens 128 --decode-tokens 32 \
      --no-trace --json >"$OUT/engine-70b-$quant.json" 2>"$OUT/engine-70b-$quant.log"
    grep -E "weights:" "$OUT/engine-70b-$quant.log" | head -2 || true
    python3 - "$OUT/engine-70b-$quant.json" "$quant" <<'PY' | tee -a "$OUT/summary-70b.txt"
import json, sys
for r in json.load(open(sys.argv[1]))["decode"]["runs"]:
    if r.get("ms_per_step"):
        print(f'llama-3-70b fp8 {sys.argv[2]}: {r["mode"]:>12} batch {r["batch"]:>3}: '
              f'{r["ms_per_step"]:.3f} ms/step ({r["decode_tokens_per_s"]:.0f} tok/s)')
PY
  done
  [[ "${SERVE:-1}" == 0 ]] && exit 0
  dir="$WORK/llama-3-70b-$serve_quant"
  config "$dir" llama-3-70b "$serve_quant"
  echo "== kvvm serve, llama-3-70b (dummy), FP8 $serve_quant, kvvm bench serve at $RATE req/s"
  MODEL="$dir" HF=0 OUT="$OUT/serve-70b" RATES="$RATE" REQUESTS="${REQUESTS:-64}" DURATION=30 \
    SERVE_ARGS="--load-format dummy ${SERVE_ARGS:-}" CLI="$CLI" "$ROOT/bench/serve-gpu.sh" ||
    echo "fp8-gpu: the 70B serve run failed (see $OUT/serve-70b)"
  grep -E "weights:|KV" "$OUT/serve-70b/serve.log" | head -4 || true
fi
