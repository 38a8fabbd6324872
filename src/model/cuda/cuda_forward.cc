// One step of the CUDA model: checks the batch on the host, stages its arrays, and enqueues
// embedding -> layers -> final norm of each chunk's last token -> lm_head (-> logit transforms)
// -> argmax (-> sampling -> log-probabilities) on the model's stream, then copies the outputs
// back and waits. A decode step that fits a captured graph replays it instead (cuda_graphs.cc).
//
// Logit transforms (penalties, logit_bias, bans: ChunkSampling::adjust_begin / adjust_count)
// act on the last rows' logits in place right after lm_head, so argmax, sampling, the
// log-probabilities and the logits returned all read the transformed rows, as on the CPU. A
// chunk's penalties ride in its LogitAdjustRow with the step's other arrays; the entries are
// copied only by a step that has some.
//
// Log-probabilities of a kAll chunk's earlier rows (prompt log-probabilities) run after the
// step's outputs are copied: final norm, lm_head and the log-probability kernel over blocks of
// max_chunks rows, reusing the last rows' buffers, so a step that asks for none costs nothing
// more.
//
// The layer's attention is cuda_attention.cc; its projections (GEMV, cuBLAS, FP8) are
// cuda_projections.cc.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

#include "kvvm/kernels/attention.h"
#include "kvvm/kernels/model_kernels.h"
#include "kvvm/kernels/moe_kernels.h"
#include "model/cuda/cuda_model.h"
#include "model/cuda/cuda_status.h"
#include "model/step_checks.h"

namespace kvvm::model::detail {
namespace {

static_assert(kMaxLogprobTop == kMaxTopLogprobs, "the kernel lists what a RowLogprobs holds");
// A step's LogitAdjustments are staged byte for byte as the kernel's entries.
static_assert(sizeof(LogitAdjustEntry) == sizeof(LogitAdjustment) &&
                  offsetof(LogitAdjustEntry, id) == offsetof(LogitAdjustment, id) &&
                  offsetof(LogitAdjustEntry, count) == offsetof(LogitAdjustment, count) &&
                  offsetof(LogitAdjustEntry, in_prompt) == offsetof(LogitAdjustment, in_prompt) &&
                  offsetof(LogitAdjustEntry, bias) == offsetof(LogitAdjustment, bias),
              "LogitAdjustEntry is laid out as LogitAdjustment");

}  // namespace

Status CudaModel::check_batch(const StepBatch& batch, const StepOutput& out) const {
  KVVM_RETURN_IF_ERROR(check_step(batch, out, config(), limits(), "CUDA model"));
  if (batch.chunks.empty()) return Status::Ok();
  return check_view(batch.kv, "CUDA model: the KvView");
}

Status CudaModel::check_view(const KvView& kv, const char* who) const {
  const ModelConfig& c = config();
  // The cache holds the compute type, or e4m3 written and read with the model's KV scales.
  if (kv.element != compute_ && kv.element != DType::kFp8) {
    return Status::InvalidArgument(
        std::string(who) + "'s element type " + std::string(to_string(kv.element)) +
        " is neither the model's compute type " + std::string(to_string(compute_)) + " nor fp8");
  }
  if (kv.head_dim != c.head_dim || kv.element_bytes != element_bytes(kv.element) || kv.base == 0) {
    return Status::InvalidArgument(
        std::string(who) + " (head dim " + std::to_string(kv.head_dim) + ", " +
        std::to_string(kv.element_bytes) + "-byte elements, base " + std::to_string(kv.base) +
        ") is not the model's geometry (head dim " + std::to_string(c.head_dim) + ")");
  }
  return Status::Ok();
}

void CudaModel::stage(const StepBatch& batch, bool sample) {
  std::uint32_t* ids = staging_ + offsets_.ids;
  std::uint32_t* positions = staging_ + offsets_.positions;
  std::uint32_t* row_slots = staging_ + offsets_.row_slots;
  std::uint32_t* decode_slots = staging_ + offsets_.decode_slots;
  std::uint32_t* decode_lengths = staging_ + offsets_.decode_lengths;
  std::uint32_t* last_rows = staging_ + offsets_.last_rows;
  auto* sampling = reinterpret_cast<SamplingRow*>(staging_ + offsets_.sampling);
  auto* logprob_rows = reinterpret_cast<LogprobRow*>(staging_ + offsets_.logprob_rows);
  auto* adjust_rows = reinterpret_cast<LogitAdjustRow*>(staging_ + offsets_.adjust_rows);
  const std::uint32_t most_tokens = limits().max_step_tokens;
  std::uint32_t* prompt_index = prompt_staging_;
  auto* prompt_rows = reinterpret_cast<LogprobRow*>(prompt_staging_ + most_tokens);
  runs_.clear();
  chunk_rows_.clear();
  logprob_chunks_ = false;
  prompt_rows_ = 0;
  adjust_entries_ = 0;
  masked_ = false;
  batch_masks_ = batch.token_masks;
  auto* mask_rows = reinterpret_cast<std::int32_t*>(staging_ + offsets_.mask_rows);
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
    SamplingRow row_sampling;  // greedy unless the step draws (its parameters were checked)
    if (sample && c < batch.sampling.size()) {
      const ChunkSampling& from = batch.sampling[c];
      row_sampling.temperature = from.params.temperature;
      row_sampling.top_k = from.params.top_k;
      row_sampling.top_p = from.params.top_p;
      row_sampling.min_p = from.params.min_p;
      row_sampling.seed_low = static_cast<std::uint32_t>(from.params.seed);
      row_sampling.seed_high = static_cast<std::uint32_t>(from.params.seed >> 32);
      row_sampling.counter_low = static_cast<std::uint32_t>(from.counter);
      row_sampling.counter_high = static_cast<std::uint32_t>(from.counter >> 32);
    }
    sampling[c] = row_sampling;
    LogprobRow scored;  // inactive unless the chunk asks
    if (sample && c < batch.sampling.size() &&
        batch.sampling[c].logprob_rows != LogprobRows::kNone) {
      const ChunkSampling& from = batch.sampling[c];
      scored = {.active = 1,
                .temperature = from.params.temperature,
                .target = from.last_target >= 0 ? from.last_target : kLogprobSampled,
                .top = from.top_logprobs};
      logprob_chunks_ = true;
      if (from.logprob_rows == LogprobRows::kAll) {
        // Row i scores the chunk's next token.
        for (std::uint32_t i = 0; i + 1 < chunk.tokens; ++i, ++prompt_rows_) {
          prompt_index[prompt_rows_] = row + i;
          prompt_rows[prompt_rows_] = scored;
          prompt_rows[prompt_rows_].target = batch.token_ids[row + i + 1];
        }
      }
    }
    logprob_rows[c] = scored;
    LogitAdjustRow adjusted;  // count 0: no transforms
    if (c < batch.sampling.size() && batch.sampling[c].adjust_count > 0) {
      const ChunkSampling& from = batch.sampling[c];
      adjusted = {.presence_penalty = from.params.presence_penalty,
                  .frequency_penalty = from.params.frequency_penalty,
                  .repetition_penalty = from.params.repetition_penalty,
                  .begin = from.adjust_begin,
                  .count = from.adjust_count};
      adjust_entries_ = static_cast<std::uint32_t>(batch.adjustments.size());
    }
    adjust_rows[c] = adjusted;
    mask_rows[c] = c < batch.sampling.size() ? batch.sampling[c].mask_row : -1;
    masked_ = masked_ || mask_rows[c] >= 0;
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
  // check_adjustments bounds the count by max_logit_adjustments, the staging's size.
  if (adjust_entries_ > 0) {
    std::memcpy(adjust_staging_, batch.adjustments.data(),
                std::size_t{adjust_entries_} * sizeof(LogitAdjustEntry));
  }
}

Status CudaModel::forward(const StepBatch& batch, const StepOutput& out) {
  KVVM_RETURN_IF_ERROR(check_batch(batch, out));
  if (batch.chunks.empty()) return Status::Ok();
  stage(batch, out.sampled != nullptr);
  // A calibrating step reads its maxima back between layers: eager.
  const DecodeGraph* graph = calibrates(batch) ? nullptr : graph_for(batch);
  Status status = graph != nullptr ? replay(*graph, batch, out) : run_step(batch, out);
  // A failure may leave earlier work queued that still reads the staging buffer: let it end
  // before the next step rewrites it.
  if (!status.ok()) (void)cudaStreamSynchronize(stream_);
  return status;
}

Status CudaModel::copy_arrays() {
  KVVM_RETURN_IF_ERROR(cuda_call("cudaSetDevice", cudaSetDevice(device_)));
  KVVM_RETURN_IF_ERROR(cuda_call(
      "cudaMemcpyAsync", cudaMemcpyAsync(arrays_, staging_, std::uint64_t{offsets_.words} * 4,
                                         cudaMemcpyHostToDevice, stream_)));
  if (masked_) {
    KVVM_RETURN_IF_ERROR(
        cuda_call("cudaMemcpyAsync",
                  cudaMemcpyAsync(token_masks_, batch_masks_.data(), batch_masks_.size_bytes(),
                                  cudaMemcpyHostToDevice, stream_)));
  }
  if (adjust_entries_ == 0) return Status::Ok();
  return cuda_call("cudaMemcpyAsync",
                   cudaMemcpyAsync(adjustments_, adjust_staging_,
                                   std::uint64_t{adjust_entries_} * sizeof(LogitAdjustEntry),
                                   cudaMemcpyHostToDevice, stream_));
}

Status CudaModel::run_step(const StepBatch& batch, const StepOutput& out) {
  ++eager_steps_;
  calibrating_ = calibrates(batch);
  KVVM_RETURN_IF_ERROR(copy_arrays());
  if (prompt_rows_ > 0) {
    // Indices, then LogprobRows: two ranges of one block.
    const std::uint64_t most_tokens = limits().max_step_tokens;
    const std::pair<std::uint64_t, std::uint64_t> ranges[] = {
        {0, std::uint64_t{prompt_rows_} * 4},
        {most_tokens * 4, std::uint64_t{prompt_rows_} * sizeof(LogprobRow)}};
    for (const auto& [offset, bytes] : ranges) {
      KVVM_RETURN_IF_ERROR(cuda_call(
          "cudaMemcpyAsync",
          cudaMemcpyAsync(reinterpret_cast<unsigned char*>(prompt_arrays_) + offset,
                          reinterpret_cast<const unsigned char*>(prompt_staging_) + offset, bytes,
                          cudaMemcpyHostToDevice, stream_)));
    }
  }
  const Status enqueued =
      enqueue_step(batch, out.sampled != nullptr, 0, adjust_entries_ > 0, logprob_chunks_, masked_);
  // A failed calibrating step leaves the calibration pending: the next one measures again.
  if (calibrating_ && enqueued.ok()) end_calibration();
  calibrating_ = false;
  KVVM_RETURN_IF_ERROR(enqueued);
  return finish_step(batch, out, static_cast<std::uint32_t>(batch.chunks.size()));
}

Status CudaModel::calibrate_layer(std::uint32_t layer, std::uint32_t tokens) {
  const std::uint64_t count = std::uint64_t{tokens} * config().kv_heads * config().head_dim;
  KVVM_RETURN_IF_ERROR(cuda_call("cudaMemsetAsync",
                                 cudaMemsetAsync(calibration_max_, 0, 2 * sizeof(float), stream_)));
  AbsMaxParams largest;
  largest.element = compute_;
  largest.count = count;
  for (std::uint32_t kv = 0; kv < 2; ++kv) {
    largest.x = kv == 0 ? k_ : v_;
    largest.out = calibration_max_ + kv;
    KVVM_RETURN_IF_ERROR(absmax_cuda(largest, stream_));
  }
  float most[2] = {0.0f, 0.0f};
  KVVM_RETURN_IF_ERROR(cuda_call(
      "cudaMemcpyAsync",
      cudaMemcpyAsync(most, calibration_max_, sizeof(most), cudaMemcpyDeviceToHost, stream_)));
  KVVM_RETURN_IF_ERROR(cuda_call("cudaStreamSynchronize", cudaStreamSynchronize(stream_)));
  return set_calibrated_layer(layer, most[0], most[1]);
}

Status CudaModel::enqueue_step(const StepBatch& batch, bool sample, std::uint32_t decode_max_length,
                               bool adjust, bool logprobs, bool mask) {
  const ModelConfig& c = config();
  const auto tokens = static_cast<std::uint32_t>(batch.token_ids.size());
  const auto chunks = static_cast<std::uint32_t>(batch.chunks.size());
  EmbeddingParams embedding;
  embedding.element = compute_;
  embedding.tokens = tokens;
  embedding.hidden = c.hidden_size;
  embedding.vocab = c.vocab_size;
  embedding.ids = reinterpret_cast<const std::int32_t*>(arrays_ + offsets_.ids);
  embedding.table = weights_->embed;
  embedding.out = x_;
  if (ring_ != nullptr) KVVM_RETURN_IF_ERROR(ring_->begin(stream_));
  KVVM_RETURN_IF_ERROR(embedding_cuda(embedding, stream_));
  for (std::uint32_t layer = 0; layer < c.layers; ++layer) {
    if (ring_ != nullptr) KVVM_RETURN_IF_ERROR(ring_->before_layer(layer, stream_));
    KVVM_RETURN_IF_ERROR(run_layer(layer, batch, tokens, decode_max_length));
    if (ring_ != nullptr) KVVM_RETURN_IF_ERROR(ring_->after_layer(layer, stream_));
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
  if (adjust) {
    LogitAdjustParams adjusting;
    adjusting.rows = chunks;
    adjusting.vocab = c.vocab_size;
    adjusting.logits = logits_;
    adjusting.rows_params = reinterpret_cast<const LogitAdjustRow*>(arrays_ + offsets_.adjust_rows);
    adjusting.entries = adjustments_;
    KVVM_RETURN_IF_ERROR(logit_adjust_cuda(adjusting, stream_));
  }
  if (mask) {
    TokenMaskParams masking;
    masking.rows = chunks;
    masking.vocab = c.vocab_size;
    masking.words = static_cast<std::uint32_t>(token_mask_words(c.vocab_size));
    masking.logits = logits_;
    masking.mask_rows = reinterpret_cast<const std::int32_t*>(arrays_ + offsets_.mask_rows);
    masking.masks = token_masks_;
    KVVM_RETURN_IF_ERROR(token_mask_cuda(masking, stream_));
  }
  ArgmaxParams argmax;
  argmax.rows = chunks;
  argmax.vocab = c.vocab_size;
  argmax.logits = logits_;
  argmax.out = argmax_;
  argmax.workspace = argmax_partials_;
  KVVM_RETURN_IF_ERROR(argmax_cuda(argmax, stream_));
  if (!sample) return Status::Ok();
  SampleParams sampling;
  sampling.rows = chunks;
  sampling.vocab = c.vocab_size;
  sampling.logits = logits_;
  sampling.rows_params = reinterpret_cast<const SamplingRow*>(arrays_ + offsets_.sampling);
  if (fused_) sampling.argmax = argmax_;  // greedy rows need no second scan of their logits
  sampling.out = sampled_;
  KVVM_RETURN_IF_ERROR(sample_cuda(sampling, stream_));
  if (!logprobs) return Status::Ok();
  LogprobsParams scoring;
  scoring.rows = chunks;
  scoring.vocab = c.vocab_size;
  scoring.logits = logits_;
  scoring.rows_params = reinterpret_cast<const LogprobRow*>(arrays_ + offsets_.logprob_rows);
  scoring.sampled = sampled_;
  scoring.out = logprob_results_;
  return logprobs_cuda(scoring, stream_);
}

Status CudaModel::enqueue_prompt_logprobs() {
  const ModelConfig& c = config();
  const std::uint32_t block = limits().max_chunks;
  const auto* rows_params =
      reinterpret_cast<const LogprobRow*>(prompt_arrays_ + limits().max_step_tokens);
  for (std::uint32_t first = 0; first < prompt_rows_; first += block) {
    const std::uint32_t rows = std::min(block, prompt_rows_ - first);
    // These rows still lack the last layer's MLP output: the norm adds it, as for the last rows.
    RmsNormParams norm;
    norm.element = compute_;
    norm.rows = rows;
    norm.hidden = c.hidden_size;
    norm.eps = static_cast<float>(c.rms_norm_eps);
    norm.x = x_;
    norm.add = delta_;
    norm.row_index = prompt_arrays_ + first;
    norm.weight = weights_->final_norm;
    norm.out = final_;
    KVVM_RETURN_IF_ERROR(rmsnorm_cuda(norm, stream_));
    KVVM_RETURN_IF_ERROR(gemm(final_, weights_->lm_head, logits_, CUDA_R_32F, 0.0f, rows,
                              c.hidden_size, c.vocab_size));
    LogprobsParams scoring;
    scoring.rows = rows;
    scoring.vocab = c.vocab_size;
    scoring.logits = logits_;
    scoring.rows_params = rows_params + first;
    scoring.out = logprob_results_ + limits().max_chunks + first;
    KVVM_RETURN_IF_ERROR(logprobs_cuda(scoring, stream_));
  }
  return Status::Ok();
}

void CudaModel::write_logprobs(const StepBatch& batch, const StepOutput& out) const {
  const std::size_t chunks = std::min(batch.chunks.size(), batch.sampling.size());
  const LogprobResult* prompt = logprob_host_ + limits().max_chunks;
  RowLogprobs* to = out.logprobs;
  auto copy = [&to](const LogprobResult& from) {
    RowLogprobs row;
    row.logprob = from.logprob;
    row.target = from.target;
    row.top = std::min(from.top, kMaxTopLogprobs);
    std::copy_n(from.top_ids, row.top, row.top_ids.begin());
    std::copy_n(from.top_logprobs, row.top, row.top_logprobs.begin());
    *to++ = row;
  };
  for (std::size_t c = 0; c < chunks; ++c) {
    const LogprobRows asked = batch.sampling[c].logprob_rows;
    if (asked == LogprobRows::kNone) continue;
    if (asked == LogprobRows::kAll) {
      for (std::uint32_t i = 0; i + 1 < batch.chunks[c].tokens; ++i) copy(*prompt++);
    }
    copy(logprob_host_[c]);
  }
}

Status CudaModel::wait_for_step() {
  const auto began = std::chrono::steady_clock::now();
  const Status done = cuda_call("cudaStreamSynchronize", cudaStreamSynchronize(stream_));
  ++waits_.steps;
  waits_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  return done;
}

Status CudaModel::finish_step(const StepBatch& batch, const StepOutput& out, std::uint32_t rows) {
  const std::uint64_t vocab = config().vocab_size;
  if (out.logits != nullptr) {
    KVVM_RETURN_IF_ERROR(cuda_call(
        "cudaMemcpyAsync", cudaMemcpyAsync(out.logits, logits_, rows * vocab * sizeof(float),
                                           cudaMemcpyDeviceToHost, stream_)));
  }
  const std::pair<std::int32_t*, const std::int32_t*> copies[] = {{out.argmax, argmax_},
                                                                  {out.sampled, sampled_}};
  for (const auto& [to, from] : copies) {
    if (to == nullptr) continue;
    KVVM_RETURN_IF_ERROR(cuda_call(
        "cudaMemcpyAsync",
        cudaMemcpyAsync(to, from, rows * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream_)));
  }
  if (!logprob_chunks_) return wait_for_step();
  // Ordered after the copies above: the prompt rows reuse final_ and logits_.
  KVVM_RETURN_IF_ERROR(enqueue_prompt_logprobs());
  const std::pair<std::uint64_t, std::uint64_t> results[] = {{0, rows},
                                                             {limits().max_chunks, prompt_rows_}};
  for (const auto& [first, count] : results) {
    if (count == 0) continue;
    KVVM_RETURN_IF_ERROR(
        cuda_call("cudaMemcpyAsync",
                  cudaMemcpyAsync(logprob_host_ + first, logprob_results_ + first,
                                  count * sizeof(LogprobResult), cudaMemcpyDeviceToHost, stream_)));
  }
  KVVM_RETURN_IF_ERROR(wait_for_step());
  write_logprobs(batch, out);
  return Status::Ok();
}

Status CudaModel::run_layer(std::uint32_t layer, const StepBatch& batch, std::uint32_t tokens,
                            std::uint32_t decode_max_length) {
  const ModelConfig& c = config();
  const DeviceLayer& w = weights_->layers[layer];
  const std::uint32_t q_dim = c.heads * c.head_dim;
  RmsNormParams norm;
  norm.element = compute_;
  norm.rows = tokens;
  norm.hidden = c.hidden_size;
  norm.eps = static_cast<float>(c.rms_norm_eps);
  norm.x = x_;
  norm.add = layer == 0 ? nullptr : delta_;  // the previous layer's MLP output
  norm.weight = w.input_norm;
  norm.out = normed_;
  norm.quantized = quantized_input(tokens);  // the q|k|v projection's input
  KVVM_RETURN_IF_ERROR(rmsnorm_cuda(norm, stream_));
  KVVM_RETURN_IF_ERROR(attention_inputs(layer, batch, tokens));
  KVVM_RETURN_IF_ERROR(attention(layer, batch, decode_max_length));
  KVVM_RETURN_IF_ERROR(
      linear(attn_, w.o, w.o_scales, w.o_bias, delta_, tokens, q_dim, c.hidden_size));
  const bool quantized = norm.quantized.out != nullptr;
  norm.add = delta_;
  norm.weight = w.post_norm;
  if (w.router != nullptr) {
    // The router reads the rows unquantized, and so do the expert kernels.
    norm.quantized = {};
    KVVM_RETURN_IF_ERROR(rmsnorm_cuda(norm, stream_));
    return sparse_mlp(layer, tokens);
  }
  KVVM_RETURN_IF_ERROR(rmsnorm_cuda(norm, stream_));  // and the gate|up projection's input
  return mlp(w.gate_up, w.gate_up_scales, w.down, w.down_scales, c.intermediate_size, delta_,
             tokens, quantized);
}

Status CudaModel::mlp(const void* gate_up, const float* gate_up_scales, const void* down,
                      const float* down_scales, std::uint32_t inter, void* out,
                      std::uint32_t tokens, bool input_quantized) {
  const std::uint32_t hidden = config().hidden_size;
  KVVM_RETURN_IF_ERROR(linear(normed_, gate_up, gate_up_scales, nullptr, gate_up_, tokens, hidden,
                              2 * inter, input_quantized));
  SiluMulParams silu;
  silu.element = compute_;
  silu.rows = tokens;
  silu.inter = inter;
  silu.gate_up = gate_up_;
  silu.out = act_;
  silu.quantized = quantized_input(tokens);  // the down projection's input, for FP8 weights
  KVVM_RETURN_IF_ERROR(silu_mul_cuda(silu, stream_));
  return linear(act_, down, down_scales, nullptr, out, tokens, inter, hidden,
                silu.quantized.out != nullptr);
}

Status CudaModel::sparse_mlp(std::uint32_t layer, std::uint32_t tokens) {
  const ModelConfig& c = config();
  const MoeConfig& moe = c.moe;
  const DeviceLayer& w = weights_->layers[layer];
  const MoeWeightFormat format = c.weight_quant == WeightQuant::kFp8Block
                                     ? MoeWeightFormat::kFp8Block128
                                     : MoeWeightFormat::kNone;
  KVVM_RETURN_IF_ERROR(linear(normed_, w.router, nullptr, nullptr, router_logits_, tokens,
                              c.hidden_size, moe.experts));
  MoeRouteParams route;
  route.element = compute_;
  route.tokens = tokens;
  route.experts = moe.experts;
  route.top_k = moe.top_k;
  route.renormalize = moe.renormalize;
  route.logits = router_logits_;
  route.ids = moe_ids_;
  route.weights = moe_weights_;
  KVVM_RETURN_IF_ERROR(moe_route_cuda(route, stream_));
  if (weights_->expert_cache()) {
    KVVM_RETURN_IF_ERROR(weights_->acquire_experts(layer, tokens, moe.top_k, moe_ids_));
  }
  MoePermuteParams permute;
  permute.tokens = tokens;
  permute.top_k = moe.top_k;
  permute.experts = moe.experts;
  permute.tile = kMoeRowTile;
  permute.ids = moe_ids_;
  permute.offsets = moe_offsets_;
  permute.rows = moe_rows_;
  permute.slot_of_pair = moe_slot_of_pair_;
  permute.active = moe_active_;
  KVVM_RETURN_IF_ERROR(moe_permute_cuda(permute, stream_));
  MoeGateUpParams gate_up;
  gate_up.element = compute_;
  gate_up.format = format;
  gate_up.tokens = tokens;
  gate_up.top_k = moe.top_k;
  gate_up.experts = moe.experts;
  gate_up.hidden = c.hidden_size;
  gate_up.inter = moe.expert_intermediate;
  gate_up.x = normed_;
  gate_up.gate_up = w.expert_gate_up;
  gate_up.gate_up_scales = w.expert_gate_up_scales;
  gate_up.offsets = moe_offsets_;
  gate_up.rows = moe_rows_;
  gate_up.active = moe_active_;
  gate_up.act = moe_act_;
  KVVM_RETURN_IF_ERROR(moe_expert_gate_up_cuda(gate_up, stream_));
  MoeDownParams down;
  if (w.shared_gate != nullptr) {
    // Qwen2-MoE's shared expert: the dense MLP's path on its own weights (its input rows
    // unquantized, as the router reads them), and its gate's logit.
    KVVM_RETURN_IF_ERROR(mlp(w.shared_gate_up, w.shared_gate_up_scales, w.shared_down,
                             w.shared_down_scales, moe.shared_intermediate, shared_out_, tokens,
                             false));
    KVVM_RETURN_IF_ERROR(
        linear(normed_, w.shared_gate, nullptr, nullptr, shared_logit_, tokens, c.hidden_size, 1));
    down.shared = shared_out_;
    down.shared_gate = shared_logit_;
  }
  down.element = compute_;
  down.format = format;
  down.tokens = tokens;
  down.top_k = moe.top_k;
  down.experts = moe.experts;
  down.hidden = c.hidden_size;
  down.inter = moe.expert_intermediate;
  down.act = moe_act_;
  down.down = w.expert_down;
  down.down_scales = w.expert_down_scales;
  down.offsets = moe_offsets_;
  down.rows = moe_rows_;
  down.active = moe_active_;
  down.slot_of_pair = moe_slot_of_pair_;
  down.weights = moe_weights_;
  down.pairs = moe_pairs_;
  down.out = delta_;
  return moe_expert_down_cuda(down, stream_);
}

}  // namespace kvvm::model::detail
