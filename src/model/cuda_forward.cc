// One step of the CUDA model: checks the batch on the host, stages its arrays, and enqueues
// embedding -> layers -> final norm of each chunk's last token -> lm_head -> argmax on the
// model's stream, then copies the outputs back and waits.
//
// Attention per layer: K / V of every token are appended in one call (per-row slots and
// positions), consecutive single-token chunks share one decode call, and each longer chunk
// is one causal prefill call (it reads its own rows, appended just before).
#include <algorithm>
#include <string>

#include "kvvm/attention.h"
#include "kvvm/model_kernels.h"
#include "model/cublas_api.h"
#include "model/cuda_model.h"
#include "model/cuda_status.h"

namespace kvvm::model::detail {
namespace {

std::string str(std::uint64_t value) { return std::to_string(value); }

Status cublas_gemm_status(cublasStatus_t status) {
  if (status == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  const std::string name = cublas_status_name(status);
  return Status::DriverError("cublasGemmEx failed: " + name,
                             DriverFailure{"cublasGemmEx", name, static_cast<int>(status)});
}

}  // namespace

Status CudaModel::check_batch(const StepBatch& batch) const {
  const ModelConfig& c = config();
  if (batch.chunks.size() > limits().max_chunks) {
    return Status::InvalidArgument("CUDA model: " + str(batch.chunks.size()) +
                                   " chunks in one step, at most " + str(limits().max_chunks));
  }
  if (batch.token_ids.size() > limits().max_step_tokens) {
    return Status::InvalidArgument("CUDA model: " + str(batch.token_ids.size()) +
                                   " tokens in one step, at most " + str(limits().max_step_tokens));
  }
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < batch.chunks.size(); ++i) {
    const Chunk& chunk = batch.chunks[i];
    if (chunk.tokens == 0) {
      return Status::InvalidArgument("CUDA model: chunk " + str(i) + " has 0 tokens");
    }
    const std::uint64_t end = std::uint64_t{chunk.start} + chunk.tokens;
    if (end > c.max_position_embeddings) {
      return Status::InvalidArgument("CUDA model: chunk " + str(i) + " reaches position " +
                                     str(end - 1) + ", beyond max_position_embeddings " +
                                     str(c.max_position_embeddings));
    }
    sum += chunk.tokens;
  }
  if (sum != batch.token_ids.size()) {
    return Status::InvalidArgument("CUDA model: the chunks hold " + str(sum) +
                                   " tokens but token_ids has " + str(batch.token_ids.size()));
  }
  for (std::size_t i = 0; i < batch.token_ids.size(); ++i) {
    const std::int32_t id = batch.token_ids[i];
    if (id < 0 || static_cast<std::uint32_t>(id) >= c.vocab_size) {
      return Status::InvalidArgument("CUDA model: token id " + std::to_string(id) + " at index " +
                                     str(i) + " is outside the vocabulary [0, " +
                                     str(c.vocab_size) + ")");
    }
  }
  if (batch.chunks.empty()) return Status::Ok();
  const KvView& kv = batch.kv;
  if (kv.element != compute_) {
    return Status::InvalidArgument(
        "CUDA model: the KvView's element type " + std::string(to_string(kv.element)) +
        " is not the model's compute type " + std::string(to_string(compute_)));
  }
  if (kv.head_dim != c.head_dim || kv.element_bytes != element_bytes(compute_) || kv.base == 0) {
    return Status::InvalidArgument("CUDA model: the KvView (head dim " + str(kv.head_dim) + ", " +
                                   str(kv.element_bytes) + "-byte elements, base " + str(kv.base) +
                                   ") is not the model's geometry (head dim " + str(c.head_dim) +
                                   ")");
  }
  return Status::Ok();
}

void CudaModel::stage(const StepBatch& batch) {
  std::uint32_t* ids = staging_ + offsets_.ids;
  std::uint32_t* positions = staging_ + offsets_.positions;
  std::uint32_t* row_slots = staging_ + offsets_.row_slots;
  std::uint32_t* decode_slots = staging_ + offsets_.decode_slots;
  std::uint32_t* decode_lengths = staging_ + offsets_.decode_lengths;
  std::uint32_t* last_rows = staging_ + offsets_.last_rows;
  runs_.clear();
  chunk_rows_.clear();
  std::uint32_t row = 0, decodes = 0;
  for (std::size_t c = 0; c < batch.chunks.size(); ++c) {
    const Chunk& chunk = batch.chunks[c];
    chunk_rows_.push_back(row);
    for (std::uint32_t i = 0; i < chunk.tokens; ++i) {
      ids[row + i] = static_cast<std::uint32_t>(batch.token_ids[row + i]);
      positions[row + i] = chunk.start + i;
      row_slots[row + i] = chunk.slot;
    }
    last_rows[c] = row + chunk.tokens - 1;
    if (chunk.tokens == 1) {
      decode_slots[decodes] = chunk.slot;
      decode_lengths[decodes] = chunk.start + 1;
      if (!runs_.empty() && runs_.back().first_row + runs_.back().count == row) {
        ++runs_.back().count;  // the previous chunk was a decode too: rows are contiguous
      } else {
        runs_.push_back({row, decodes, 1, 0});
      }
      runs_.back().max_length = std::max(runs_.back().max_length, chunk.start + 1);
      ++decodes;
    }
    row += chunk.tokens;
  }
}

Status CudaModel::forward(const StepBatch& batch, const StepOutput& out) {
  KVVM_RETURN_IF_ERROR(check_batch(batch));
  if (batch.chunks.empty()) return Status::Ok();
  stage(batch);
  Status status = run_step(batch, out);
  // A failure may leave earlier work queued that still reads the staging buffer: let it end
  // before the next step rewrites it.
  if (!status.ok()) (void)cudaStreamSynchronize(stream_);
  return status;
}

Status CudaModel::run_step(const StepBatch& batch, const StepOutput& out) {
  const ModelConfig& c = config();
  const auto tokens = static_cast<std::uint32_t>(batch.token_ids.size());
  const auto chunks = static_cast<std::uint32_t>(batch.chunks.size());
  KVVM_RETURN_IF_ERROR(cuda_call("cudaSetDevice", cudaSetDevice(device_)));
  KVVM_RETURN_IF_ERROR(cuda_call(
      "cudaMemcpyAsync", cudaMemcpyAsync(arrays_, staging_, std::uint64_t{offsets_.words} * 4,
                                         cudaMemcpyHostToDevice, stream_)));
  EmbeddingParams embedding;
  embedding.element = compute_;
  embedding.tokens = tokens;
  embedding.hidden = c.hidden_size;
  embedding.vocab = c.vocab_size;
  embedding.ids = reinterpret_cast<const std::int32_t*>(arrays_ + offsets_.ids);
  embedding.table = weights_->embed;
  embedding.out = x_;
  KVVM_RETURN_IF_ERROR(embedding_cuda(embedding, stream_));
  for (std::uint32_t layer = 0; layer < c.layers; ++layer) {
    KVVM_RETURN_IF_ERROR(run_layer(layer, batch, tokens));
  }
  // The last layer's residual add, fused with the final norm of each chunk's last token.
  RmsNormParams norm;
  norm.element = compute_;
  norm.rows = chunks;
  norm.hidden = c.hidden_size;
  norm.eps = static_cast<float>(c.rms_norm_eps);
  norm.x = x_;
  norm.add = delta_;
  norm.row_index = arrays_ + offsets_.last_rows;
  norm.weight = weights_->final_norm;
  norm.out = final_;
  KVVM_RETURN_IF_ERROR(rmsnorm_cuda(norm, stream_));
  KVVM_RETURN_IF_ERROR(gemm(final_, weights_->lm_head, logits_, CUDA_R_32F, 0.0f, chunks,
                            c.hidden_size, c.vocab_size));
  ArgmaxParams argmax;
  argmax.rows = chunks;
  argmax.vocab = c.vocab_size;
  argmax.logits = logits_;
  argmax.out = argmax_;
  KVVM_RETURN_IF_ERROR(argmax_cuda(argmax, stream_));
  if (out.logits != nullptr) {
    KVVM_RETURN_IF_ERROR(cuda_call(
        "cudaMemcpyAsync",
        cudaMemcpyAsync(out.logits, logits_, std::uint64_t{chunks} * c.vocab_size * sizeof(float),
                        cudaMemcpyDeviceToHost, stream_)));
  }
  if (out.argmax != nullptr) {
    KVVM_RETURN_IF_ERROR(cuda_call(
        "cudaMemcpyAsync", cudaMemcpyAsync(out.argmax, argmax_, chunks * sizeof(std::int32_t),
                                           cudaMemcpyDeviceToHost, stream_)));
  }
  return cuda_call("cudaStreamSynchronize", cudaStreamSynchronize(stream_));
}

Status CudaModel::run_layer(std::uint32_t layer, const StepBatch& batch, std::uint32_t tokens) {
  const ModelConfig& c = config();
  const DeviceLayer& w = weights_->layers[layer];
  const std::uint32_t q_dim = c.heads * c.head_dim, kv_dim = c.kv_heads * c.head_dim;
  RmsNormParams norm;
  norm.element = compute_;
  norm.rows = tokens;
  norm.hidden = c.hidden_size;
  norm.eps = static_cast<float>(c.rms_norm_eps);
  norm.x = x_;
  norm.add = layer == 0 ? nullptr : delta_;  // the previous layer's MLP output
  norm.weight = w.input_norm;
  norm.out = normed_;
  KVVM_RETURN_IF_ERROR(rmsnorm_cuda(norm, stream_));
  KVVM_RETURN_IF_ERROR(linear(normed_, w.q, w.q_bias, q_, tokens, c.hidden_size, q_dim));
  KVVM_RETURN_IF_ERROR(linear(normed_, w.k, w.k_bias, k_, tokens, c.hidden_size, kv_dim));
  KVVM_RETURN_IF_ERROR(linear(normed_, w.v, w.v_bias, v_, tokens, c.hidden_size, kv_dim));
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
  AppendParams append;
  append.view = batch.kv;
  append.layer = layer;
  append.kv_heads = c.kv_heads;
  append.tokens = tokens;
  append.k = k_;
  append.v = v_;
  append.row_slots = arrays_ + offsets_.row_slots;
  append.row_positions = arrays_ + offsets_.positions;
  KVVM_RETURN_IF_ERROR(append_kv_cuda(append, stream_));
  KVVM_RETURN_IF_ERROR(attention(layer, batch));
  KVVM_RETURN_IF_ERROR(linear(attn_, w.o, w.o_bias, delta_, tokens, q_dim, c.hidden_size));
  norm.add = delta_;
  norm.weight = w.post_norm;
  KVVM_RETURN_IF_ERROR(rmsnorm_cuda(norm, stream_));
  KVVM_RETURN_IF_ERROR(linear(normed_, w.gate_up, nullptr, gate_up_, tokens, c.hidden_size,
                              2 * c.intermediate_size));
  SiluMulParams silu;
  silu.element = compute_;
  silu.rows = tokens;
  silu.inter = c.intermediate_size;
  silu.gate_up = gate_up_;
  silu.out = act_;
  KVVM_RETURN_IF_ERROR(silu_mul_cuda(silu, stream_));
  return linear(act_, w.down, nullptr, delta_, tokens, c.intermediate_size, c.hidden_size);
}

Status CudaModel::attention(std::uint32_t layer, const StepBatch& batch) {
  const ModelConfig& c = config();
  const std::uint64_t q_dim = std::uint64_t{c.heads} * c.head_dim;
  for (const DecodeRun& run : runs_) {
    DecodeParams decode;
    decode.view = batch.kv;
    decode.layer = layer;
    decode.qo_heads = c.heads;
    decode.kv_heads = c.kv_heads;
    decode.batch = run.count;
    decode.q = row_of(q_, run.first_row, q_dim);
    decode.slots = arrays_ + offsets_.decode_slots + run.first_decode;
    decode.lengths = arrays_ + offsets_.decode_lengths + run.first_decode;
    decode.max_length = run.max_length;
    decode.out = row_of(attn_, run.first_row, q_dim);
    KVVM_RETURN_IF_ERROR(
        decode_attention_cuda(decode, decode_workspace_, decode_workspace_bytes_, stream_));
  }
  for (std::size_t i = 0; i < batch.chunks.size(); ++i) {
    const Chunk& chunk = batch.chunks[i];
    if (chunk.tokens == 1) continue;
    PrefillParams prefill;
    prefill.view = batch.kv;
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

Status CudaModel::linear(const void* x, const void* weight, const void* bias, void* y,
                         std::uint32_t rows, std::uint32_t in, std::uint32_t out) {
  float beta = 0.0f;
  if (bias != nullptr) {
    BroadcastRowsParams under;
    under.element = compute_;
    under.rows = rows;
    under.cols = out;
    under.row = bias;
    under.out = y;
    KVVM_RETURN_IF_ERROR(broadcast_rows_cuda(under, stream_));
    beta = 1.0f;
  }
  return gemm(x, weight, y, data_type_, beta, rows, in, out);
}

// Row-major y[rows][out] = x[rows][in] . W^T with W [out][in] row-major is, in cuBLAS's
// column-major terms, C[out x rows] = op_T(W as [in x out]) . (x as [in x rows]).
Status CudaModel::gemm(const void* x, const void* weight, void* y, cudaDataType y_type, float beta,
                       std::uint32_t rows, std::uint32_t in, std::uint32_t out) {
  const float alpha = 1.0f;
  const CublasApi& api = cublas_library().api;
  return cublas_gemm_status(
      api.gemm_ex(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out), static_cast<int>(rows),
                  static_cast<int>(in), &alpha, weight, data_type_, static_cast<int>(in), x,
                  data_type_, static_cast<int>(in), &beta, y, y_type, static_cast<int>(out),
                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace kvvm::model::detail
