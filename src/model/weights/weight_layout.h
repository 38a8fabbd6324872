// Where each weight tensor sits inside the store's two kinds of region: the base region (what
// is never streamed) and a layer block (one layer's projections, the unit a streamed step
// copies). One layout for both backends, so the split, `kvvm plan` and the stores agree on
// every byte.
#pragma once

#include <cstdint>
#include <vector>

#include "kvvm/base/dtype.h"
#include "kvvm/model/config.h"
#include "kvvm/model/weight_memory.h"

namespace kvvm::model::detail {

inline constexpr std::uint64_t kNoTensor = ~std::uint64_t{0};

// Byte offsets inside one layer block.
struct LayerBlockOffsets {
  std::uint64_t q = 0, k = 0, v = 0, o = 0;  // q, k, v contiguous: one [q + 2 kv][hidden]
  std::uint64_t gate_up = 0;                 // [2 * intermediate][hidden]: gate rows, then up rows
  std::uint64_t down = 0;
  // float32 scales of FP8 projections (kNoTensor unquantized): block-scaled, one per 128 x 128
  // block, [ceil(rows / 128)][device_scale_row(in)] row-major; per channel, one per row. q, k,
  // v's scales back to back as their rows are, gate's then up's likewise.
  std::uint64_t qkv_scale = kNoTensor, o_scale = kNoTensor, gate_up_scale = kNoTensor,
                down_scale = kNoTensor;
};

// Byte offsets inside one expert's stretch of a layer block: its gate|up and down (the dense
// MLP's layout), then their float32 scales when quantized.
struct ExpertOffsets {
  std::uint64_t gate_up = 0, down = 0;
  std::uint64_t gate_up_scale = kNoTensor, down_scale = kNoTensor;
};

// A sparse layer's part of the block (kNoTensor / 0 throughout for a dense model), after the
// dense part: the router [experts][hidden] and the shared expert's gate [1][hidden] in the
// element type (never quantized), the shared expert (Qwen2-MoE), then the experts, expert e at
// experts + e * expert_stride. A mixture with dense layers keeps both parts in every block (one
// block size for all layers): a dense layer leaves this part unused, a sparse one the dense MLP.
struct SparseOffsets {
  std::uint64_t router = kNoTensor;
  std::uint64_t shared_gate = kNoTensor;
  ExpertOffsets shared;  // absolute offsets in the block; unused without a shared expert
  std::uint64_t experts = kNoTensor;
  std::uint64_t expert_stride = 0;
  ExpertOffsets expert;  // from the start of an expert's stretch
};

// Byte offsets of one layer's small tensors inside the base region (kNoTensor: absent).
struct LayerBaseOffsets {
  std::uint64_t input_norm = 0, post_norm = 0;
  // q, k, v biases contiguous (one run of q_dim + 2 kv_dim) when present.
  std::uint64_t q_bias = kNoTensor, k_bias = kNoTensor, v_bias = kNoTensor, o_bias = kNoTensor;
  std::uint64_t q_norm = kNoTensor, k_norm = kNoTensor;  // [head_dim] each, with config.qk_norm
};

struct WeightLayout {
  DType element = DType::kUnset;
  DType projection = DType::kUnset;  // projection_element(config, element)
  std::uint64_t embed = 0;
  std::uint64_t lm_head = 0;  // == embed when tied
  std::uint64_t final_norm = 0;
  std::vector<LayerBaseOffsets> layers;
  LayerBlockOffsets block;
  SparseOffsets sparse;
  std::vector<bool> sparse_layer;  // per layer: its block holds experts (config.moe)
  // A mixture's pointer tables (in the base region, so the weights' tier counts them): per
  // sparse layer 4 x experts 8-byte addresses (gate|up, down, their scales), as the CUDA MoE
  // kernels read them; kNoTensor for a dense model.
  std::uint64_t expert_tables = kNoTensor;
  // The fewest slots an expert cache may have: top k (one token's experts of a layer) where a
  // layer's experts run in waves of the slots (the CPU backend); a backend acquiring a whole
  // layer's at once (CUDA) raises it to the experts per layer. 0 for a dense model.
  std::uint32_t least_expert_slots = 0;
  WeightSizes sizes;
};

WeightLayout weight_layout(const ModelConfig& config, DType element);

// The float32 scales of a quantized [rows][in] projection as the checkpoint stores them:
// ceil(rows / 128) * ceil(in / 128) block-scaled, rows per channel, 0 unquantized.
std::uint64_t weight_scale_count(WeightQuant quant, std::uint64_t rows, std::uint64_t in);
// Block-scaled scales as the CUDA store keeps them: [ceil(rows / 128)][device_scale_row(in)],
// each row of blocks padded to a multiple of 4 floats (cuBLASLt reads 128 x 128 block scales
// with 16-byte aligned rows); per channel as stored.
std::uint64_t device_scale_row(std::uint64_t in);
std::uint64_t device_scale_count(WeightQuant quant, std::uint64_t rows, std::uint64_t in);

}  // namespace kvvm::model::detail
