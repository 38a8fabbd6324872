#!/usr/bin/env bash
# Mixtures of experts on a GPU (`--load-format dummy`: a config only; dummy routers route almost
# uniformly, the experts' worst case for any cache):
#   1. bench/moe_gemm_bench: the grouped gate|up and down GEMMs beside cuBLAS dense GEMMs of the
#      same FLOPs, Qwen3-30B-A3B and Mixtral experts, 1 token and 64 to 8,192 routed rows.
#   2. `kvvm bench engine` decode on the Qwen3-30B-A3B shape, bf16 and FP8 block-scaled, at
#      batches 1, 64, 256 over 128-token prompts (the active-weight bound to compare batch 1
#      with: dense part plus 8 experts a layer, `kvvm plan --model qwen3-30b-a3b`).
#   3. The same on a Mixtral-8x7B shape in FP8 (43.8 GiB resident).
# Usage: OUT=dir CLI=build/gpu/tools/kvvm/kvvm MICRO=build/gpu/bench/moe_gemm_bench
#   bench/moe-gpu.sh. PARTS="micro qwen3 mixtral" (default all), BATCHES, DECODE_TOKENS.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/out/moe}"
CLI="${CLI:-$ROOT/build/gpu/tools/kvvm/kvvm}"
MICRO="${MICRO:-$ROOT/build/gpu/bench/moe_gemm_bench}"
WORK="${WORK:-/tmp/kvvm-bench-models}"
PARTS="${PARTS:-micro qwen3 mixtral}"
BATCHES="${BATCHES:-1,64,256}"
DECODE_TOKENS="${DECODE_TOKENS:-64}"
KV_BUDGET="${KV_BUDGET:-8GiB}"
mkdir -p "$OUT" "$WORK"

# A config.json of a published MoE shape, FP8 block-scaled when $3 is fp8.
write_config() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, os, sys
name, directory, quant = sys.argv[1:]
shapes = {
    "qwen3-30b-a3b": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                      "hidden_size": 2048, "intermediate_size": 6144,
                      "moe_intermediate_size": 768, "num_hidden_layers": 48,
                      "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                      "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True,
                      "vocab_size": 151936, "max_position_embeddings": 40960,
                      "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                      "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    "mixtral-8x7b": {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                     "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8,
                     "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
                     "max_position_embeddings": 32768, "rms_norm_eps": 1e-5,
                     "rope_theta": 1000000.0, "sliding_window": None,
                     "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
}
config = dict(shapes[name])
if quant == "fp8":
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                     "fmt": "e4m3", "weight_block_size": [128, 128]}
os.makedirs(directory, exist_ok=True)
with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f, indent=1)
PY
}

engine() {  # name quant
  local dir="$WORK/$1-$2"
  write_config "$1" "$dir" "$2"
  echo "== kvvm bench engine: $1 $2, batches $BATCHES" >&2
  "$CLI" bench engine --model "$dir" --load-format dummy --kv-budget "$KV_BUDGET" \
    --max-context 2048 --prompt-tokens 128 --decode-tokens "$DECODE_TOKENS" \
    --batches "$BATCHES" --no-trace | tee "$OUT/engine-$1-$2.txt"
}

for part in $PARTS; do
  case "$part" in
    micro) "$MICRO" 15 | tee "$OUT/moe_gemm_bench.txt" ;;
    qwen3) engine qwen3-30b-a3b bf16 && engine qwen3-30b-a3b fp8 ;;
    mixtral) engine mixtral-8x7b fp8 ;;
    *)
      echo "moe-gpu: unknown part '$part' (micro, qwen3, mixtral)" >&2
      exit 2
      ;;
  esac
done
