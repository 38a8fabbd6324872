// A layer's attention in the CUDA model (the step around it: cuda_forward.cc).
//
// Attention per layer: K / V of every token are appended in one call (per-row slots and
// positions; fused, with the RoPE in it, from one q|k|v projection), consecutive single-token
// chunks share one decode call, and each longer chunk is one causal prefill call (it reads its
// own rows, appended just before). The unfused path (CudaModelOptions::fused false) keeps one
// kernel per op and cuBLAS for every projection: the reference the fused one is measured against.
// Qwen3's q / k norms normalise the projected heads in place before either path's RoPE.
#include <cstddef>
#include <cstdint>

#include "kvvm/kernels/attention.h"
#include "kvvm/kernels/model_kernels.h"
#include "model/cuda/cuda_model.h"

namespace kvvm::model::detail {
namespace {

// Qwen3's q / k norms of a layer over `tokens` rows; the caller sets x, the heads and the stride.
HeadRmsNormParams head_norm_params(const ModelConfig& c, const DeviceLayer& w, DType element,
                                   std::uint32_t tokens) {
  HeadRmsNormParams norm;
  norm.element = element;
  norm.tokens = tokens;
  norm.head_dim = c.head_dim;
  norm.eps = static_cast<float>(c.rms_norm_eps);
  norm.q_weight = w.q_norm;
  norm.k_weight = w.k_norm;
  return norm;
}

}  // namespace

AppendParams CudaModel::append_params(std::uint32_t layer, const StepBatch& batch,
                                      std::uint32_t tokens) const {
  AppendParams append;
  append.view = batch.kv;
  append.activations = compute_;
  append.head_scales = head_scales(layer);
  append.layer = layer;
  append.kv_heads = config().kv_heads;
  append.tokens = tokens;
  append.row_slots = arrays_ + offsets_.row_slots;
  append.row_positions = arrays_ + offsets_.positions;
  return append;
}

Status CudaModel::attention_inputs(std::uint32_t layer, const StepBatch& batch,
                                   std::uint32_t tokens) {
  if (fused_) return attention_inputs_fused(layer, batch, tokens);
  const ModelConfig& c = config();
  const DeviceLayer& w = weights_->layers[layer];
  const std::uint32_t q_dim = c.heads * c.head_dim, kv_dim = c.kv_heads * c.head_dim;
  const bool quantized = quantized_input(tokens).out != nullptr;  // the input norm wrote xq_
  KVVM_RETURN_IF_ERROR(
      linear(normed_, w.q, w.q_scales, w.q_bias, q_, tokens, c.hidden_size, q_dim, quantized));
  KVVM_RETURN_IF_ERROR(
      linear(normed_, w.k, w.k_scales, w.k_bias, k_, tokens, c.hidden_size, kv_dim, quantized));
  KVVM_RETURN_IF_ERROR(
      linear(normed_, w.v, w.v_scales, w.v_bias, v_, tokens, c.hidden_size, kv_dim, quantized));
  if (c.qk_norm) {
    HeadRmsNormParams norm = head_norm_params(c, w, compute_, tokens);
    norm.x = q_;
    norm.q_heads = c.heads;
    norm.token_stride = q_dim;
    KVVM_RETURN_IF_ERROR(head_rmsnorm_cuda(norm, stream_));
    norm.x = k_;
    norm.q_heads = 0;
    norm.kv_heads = c.kv_heads;
    norm.token_stride = kv_dim;
    KVVM_RETURN_IF_ERROR(head_rmsnorm_cuda(norm, stream_));
  }
  RopeParams rope;
  rope.element = compute_;
  rope.tokens = tokens;
  rope.q_heads = c.heads;
  rope.k_heads = c.kv_heads;
  rope.head_dim = c.head_dim;
  rope.q = q_;
  rope.k = k_;
  rope.positions = arrays_ + offsets_.positions;
  rope.inv_freq = inv_freq_;
  KVVM_RETURN_IF_ERROR(rope_cuda(rope, stream_));
  if (calibrating_) KVVM_RETURN_IF_ERROR(calibrate_layer(layer, tokens));
  AppendParams append = append_params(layer, batch, tokens);
  append.k = k_;
  append.v = v_;
  return append_kv_cuda(append, stream_);
}

// The layout puts q, k and v (and their biases) back to back, so one projection writes a
// row [q | k | v] per token; the rope-append kernel then rotates q into q_ and k into the
// cache. A calibrating step first has the kernel write the rotated K and V to k_ and v_ only,
// measures them, and appends them with the scales just set.
Status CudaModel::attention_inputs_fused(std::uint32_t layer, const StepBatch& batch,
                                         std::uint32_t tokens) {
  const ModelConfig& c = config();
  const DeviceLayer& w = weights_->layers[layer];
  const std::uint32_t qkv_dim = (c.heads + 2 * c.kv_heads) * c.head_dim;
  const bool quantized = quantized_input(tokens).out != nullptr;  // the input norm wrote xq_
  KVVM_RETURN_IF_ERROR(
      linear(normed_, w.q, w.q_scales, w.q_bias, qkv_, tokens, c.hidden_size, qkv_dim, quantized));
  if (c.qk_norm) {
    // The q and k heads of each row [q | k | v] in one launch; v is left as projected.
    HeadRmsNormParams norm = head_norm_params(c, w, compute_, tokens);
    norm.x = qkv_;
    norm.q_heads = c.heads;
    norm.kv_heads = c.kv_heads;
    norm.token_stride = qkv_dim;
    KVVM_RETURN_IF_ERROR(head_rmsnorm_cuda(norm, stream_));
  }
  RopeAppendParams fused;
  fused.append = append_params(layer, batch, tokens);
  fused.qo_heads = c.heads;
  fused.qkv = qkv_;
  fused.q_out = q_;
  fused.inv_freq = inv_freq_;
  if (calibrating_) {
    fused.k_out = k_;
    fused.v_out = v_;
    fused.cache = false;
  }
  KVVM_RETURN_IF_ERROR(rope_append_kv_cuda(fused, stream_));
  if (!calibrating_) return Status::Ok();
  KVVM_RETURN_IF_ERROR(calibrate_layer(layer, tokens));
  AppendParams append = append_params(layer, batch, tokens);  // the table holds the new scales
  append.k = k_;
  append.v = v_;
  return append_kv_cuda(append, stream_);
}

Status CudaModel::attention(std::uint32_t layer, const StepBatch& batch,
                            std::uint32_t decode_max_length) {
  const ModelConfig& c = config();
  const std::uint64_t q_dim = std::uint64_t{c.heads} * c.head_dim;
  for (const DecodeRun& run : runs_) {
    DecodeParams decode;
    decode.view = batch.kv;
    decode.activations = compute_;
    decode.head_scales = head_scales(layer);
    decode.layer = layer;
    decode.qo_heads = c.heads;
    decode.kv_heads = c.kv_heads;
    decode.batch = run.count;
    decode.q = row_of(q_, run.first_row, q_dim);
    decode.slots = arrays_ + offsets_.decode_slots + run.first_decode;
    decode.lengths = arrays_ + offsets_.decode_lengths + run.first_decode;
    decode.max_length = decode_max_length != 0 ? decode_max_length : run.max_length;
    decode.out = row_of(attn_, run.first_row, q_dim);
    KVVM_RETURN_IF_ERROR(
        decode_attention_cuda(decode, decode_workspace_, decode_workspace_bytes_, stream_));
  }
  for (std::size_t i = 0; i < batch.chunks.size(); ++i) {
    const Chunk& chunk = batch.chunks[i];
    if (chunk.tokens == 1) continue;
    PrefillParams prefill;
    prefill.view = batch.kv;
    prefill.activations = compute_;
    prefill.head_scales = head_scales(layer);
    prefill.layer = layer;
    prefill.qo_heads = c.heads;
    prefill.kv_heads = c.kv_heads;
    prefill.slot = chunk.slot;
    prefill.start = chunk.start;
    prefill.tokens = chunk.tokens;
    prefill.q = row_of(q_, chunk_rows_[i], q_dim);
    prefill.out = row_of(attn_, chunk_rows_[i], q_dim);
    KVVM_RETURN_IF_ERROR(prefill_attention_cuda(prefill, stream_));
  }
  return Status::Ok();
}

void* CudaModel::row_of(void* base, std::uint64_t row, std::uint64_t width) const {
  return static_cast<unsigned char*>(base) + row * width * element_bytes(compute_);
}

}  // namespace kvvm::model::detail
