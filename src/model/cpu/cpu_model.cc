// The CPU backend's forward pass: float32 weights and activations, OpenBLAS sgemm for every
// projection over all the step's packed tokens, the host attention (append, decode, prefill)
// on the KvView it is handed.
//
// Why decode chunks go through one decode call: a step of many sequences decoding one token
// each would otherwise start a prefill call (and its threads) per sequence per layer.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvvm/kernels/attention.h"
#include "kvvm/model/model.h"
#include "model/cpu/cpu_moe.h"
#include "model/cpu/cpu_ops.h"
#include "model/cpu/cpu_weights.h"
#include "model/rope.h"
#include "model/step_checks.h"

namespace kvvm::model {
namespace {

// Allocates without zeroing: a scratch row is written before it is read, so a page of the
// buffers sized for max_step_tokens is first touched (and pays its first fault) only when a
// step uses its rows. Zeroed, they were 7 MiB of faults at every start of even the demo model,
// a fifth of `kvvm generate`'s start on a VM whose first touch of a page costs ~12 us.
template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  template <typename U>
  void construct(U* at) noexcept {
    ::new (static_cast<void*>(at)) U;
  }
  template <typename U, typename... Args>
  void construct(U* at, Args&&... args) {
    ::new (static_cast<void*>(at)) U(std::forward<Args>(args)...);
  }
};
template <typename T>
using Scratch = std::vector<T, UninitializedAllocator<T>>;

bool readable_element(DType element) {
  return element == DType::kFp32 || element == DType::kBf16 || element == DType::kFp16 ||
         element == DType::kFp8;
}

class CpuModel final : public Model {
 public:
  CpuModel(const ModelConfig& config, const ModelLimits& limits,
           std::unique_ptr<cpu::CpuWeights> weights, unsigned threads)
      : Model(config, limits),
        w_(std::move(weights)),
        inv_freq_(rope_inv_freq(config)),
        threads_(threads) {
    const std::size_t t = limits.max_step_tokens;
    const std::size_t q_width = std::size_t{config.heads} * config.head_dim;
    const std::size_t kv_width = std::size_t{config.kv_heads} * config.head_dim;
    x_.resize(t * config.hidden_size);
    xn_.resize(t * config.hidden_size);
    q_.resize(t * q_width);
    k_.resize(t * kv_width);
    v_.resize(t * kv_width);
    attn_.resize(t * q_width);
    gate_.resize(t * config.intermediate_size);
    up_.resize(t * config.intermediate_size);
    positions_.resize(t);
    row_slots_.resize(t);
    // A bf16 / fp16 view reads and writes its own element type: room for the widest (fp32
    // needs none of these, but the view's type is known only per step).
    q_elements_.resize(t * q_width * 2);
    k_elements_.resize(t * kv_width * 2);
    v_elements_.resize(t * kv_width * 2);
    out_elements_.resize(t * q_width * 2);
    const std::size_t c = limits.max_chunks;
    decode_q_.resize(c * q_width * sizeof(float));
    decode_out_.resize(c * q_width * sizeof(float));
    decode_slots_.resize(c);
    decode_lengths_.resize(c);
    decode_rows_.resize(c);
    last_.resize(c * config.hidden_size);
    logits_.resize(c * config.vocab_size);
    if (config.moe.enabled()) {
      moe_ = std::make_unique<cpu::CpuMoe>(this->config(), t);
      moe_out_.resize(t * config.hidden_size);
    }
  }

  Backend backend() const override { return Backend::kCpu; }
  WeightStats weight_stats() const override { return w_->stats(); }

  Status forward(const StepBatch& batch, const StepOutput& out) override {
    KVVM_RETURN_IF_ERROR(detail::check_step(batch, out, config(), limits(), "forward"));
    KVVM_RETURN_IF_ERROR(check_view(batch));
    if (batch.chunks.empty()) return Status::Ok();  // no token, no output, no view needed
    const ModelConfig& c = config();
    const std::size_t tokens = batch.token_ids.size();
    std::size_t row = 0;
    for (const Chunk& chunk : batch.chunks) {
      for (std::uint32_t i = 0; i < chunk.tokens; ++i, ++row) {
        positions_[row] = chunk.start + i;
        row_slots_[row] = chunk.slot;
      }
    }
    cpu::gather_rows(w_->embed, c.hidden_size, batch.token_ids, x_.data());
    calibrating_ = calibrates(batch);
    for (std::uint32_t layer = 0; layer < c.layers; ++layer) {
      KVVM_RETURN_IF_ERROR(w_->stream_in(layer));
      KVVM_RETURN_IF_ERROR(run_layer(batch, layer, tokens));
    }
    if (calibrating_) end_calibration();
    finish(batch, out);
    return Status::Ok();
  }

 private:
  // The view's checks; the rest of the batch is checked by detail::check_step.
  Status check_view(const StepBatch& batch) const {
    const ModelConfig& c = config();
    if (batch.chunks.empty()) return Status::Ok();
    const KvView& view = batch.kv;
    if (view.base == 0) return Status::InvalidArgument("forward: the KvView has no base address");
    if (!readable_element(view.element) || view.element_bytes != element_bytes(view.element)) {
      return Status::InvalidArgument(
          "forward: the KvView's element type " + std::string(to_string(view.element)) + " (" +
          std::to_string(view.element_bytes) +
          " bytes) is not one the CPU attention reads (fp32, bf16, fp16, fp8)");
    }
    if (view.head_dim != c.head_dim) {
      return Status::InvalidArgument("forward: the KvView's head_dim " +
                                     std::to_string(view.head_dim) + " is not the model's " +
                                     std::to_string(c.head_dim));
    }
    return check_view_geometry(view);
  }

  // The strides do not name the layer and head counts, but in every layout the four
  // dimensions nest densely: sorted by stride, each (layer, K/V, head, token) extent times
  // its stride fits under the next stride (and the slot). A view made for fewer layers or
  // heads than the model has fails that, as its rows would alias.
  Status check_view_geometry(const KvView& view) const {
    const ModelConfig& c = config();
    struct Dim {
      const char* name;
      std::uint64_t stride;
      std::uint64_t extent;
    };
    std::array<Dim, 4> dims = {
        Dim{"layer", view.layer_stride, c.layers}, Dim{"K/V", view.kv_stride, 2},
        Dim{"head", view.head_stride, c.kv_heads}, Dim{"token", view.token_stride, 1}};
    std::sort(dims.begin(), dims.end(), [](const Dim& a, const Dim& b) {
      return a.stride != b.stride ? a.stride < b.stride : a.extent > b.extent;
    });
    std::uint64_t need = std::uint64_t{view.head_dim} * view.element_bytes;  // one row
    const char* inner = "row";
    for (const Dim& dim : dims) {
      // A dimension of one (a single layer or KV head) may share a stride with any other;
      // the token's extent is unknown here but at least one.
      if (dim.extent == 1 && std::string_view(dim.name) != "token") continue;
      if (dim.stride < need) {
        return Status::InvalidArgument(
            "forward: the KvView's " + std::string(dim.name) + " stride of " +
            std::to_string(dim.stride) + " bytes is below the " + std::to_string(need) +
            " bytes of its " + inner + "s (the model has " + std::to_string(c.layers) +
            " layers of " + std::to_string(c.kv_heads) +
            " KV heads): its geometry is not the model's");
      }
      need = dim.stride * dim.extent;
      inner = dim.name;
    }
    if (view.slot_stride != 0 && view.slot_stride < need) {
      return Status::InvalidArgument(
          "forward: the KvView's slots of " + std::to_string(view.slot_stride) +
          " bytes are below the " + std::to_string(need) + " bytes of its " + inner +
          "s (the model has " + std::to_string(c.layers) + " layers of " +
          std::to_string(c.kv_heads) + " KV heads): its geometry is not the model's");
    }
    return Status::Ok();
  }

  Status run_layer(const StepBatch& batch, std::uint32_t layer, std::size_t tokens) {
    const ModelConfig& c = config();
    const cpu::CpuLayerWeights& w = w_->layers[layer];
    const std::size_t hidden = c.hidden_size;
    const std::size_t q_width = std::size_t{c.heads} * c.head_dim;
    const std::size_t kv_width = std::size_t{c.kv_heads} * c.head_dim;
    const auto eps = static_cast<float>(c.rms_norm_eps);

    cpu::rms_norm(x_.data(), w.input_norm, tokens, hidden, eps, xn_.data());
    cpu::linear(xn_.data(), tokens, hidden, w.q, q_width, q_.data());
    cpu::linear(xn_.data(), tokens, hidden, w.k, kv_width, k_.data());
    cpu::linear(xn_.data(), tokens, hidden, w.v, kv_width, v_.data());
    if (c.qkv_bias) {
      cpu::add_bias(q_.data(), w.q_bias, tokens, q_width);
      cpu::add_bias(k_.data(), w.k_bias, tokens, kv_width);
      cpu::add_bias(v_.data(), w.v_bias, tokens, kv_width);
    }
    if (c.qk_norm) {
      // Every head of every token is one row of head_dim; normalised in place.
      cpu::rms_norm(q_.data(), w.q_norm, tokens * c.heads, c.head_dim, eps, q_.data());
      cpu::rms_norm(k_.data(), w.k_norm, tokens * c.kv_heads, c.head_dim, eps, k_.data());
    }
    for (std::size_t t = 0; t < tokens; ++t) {
      for (std::uint32_t h = 0; h < c.heads; ++h) {
        apply_rope(&q_[t * q_width + std::size_t{h} * c.head_dim], c.head_dim, inv_freq_.data(),
                   positions_[t]);
      }
      for (std::uint32_t h = 0; h < c.kv_heads; ++h) {
        apply_rope(&k_[t * kv_width + std::size_t{h} * c.head_dim], c.head_dim, inv_freq_.data(),
                   positions_[t]);
      }
    }
    KVVM_RETURN_IF_ERROR(attend(batch, layer, tokens));

    cpu::linear(attn_.data(), tokens, q_width, w.o, hidden, xn_.data());
    if (c.o_bias) cpu::add_bias(xn_.data(), w.o_bias, tokens, hidden);
    cpu::add_into(x_.data(), xn_.data(), tokens * hidden);

    const std::size_t inter = c.intermediate_size;
    cpu::rms_norm(x_.data(), w.post_norm, tokens, hidden, eps, xn_.data());
    if (c.moe.sparse_layer(layer)) {
      KVVM_RETURN_IF_ERROR(moe_->run(*w_, layer, xn_.data(), tokens, moe_out_.data()));
      cpu::add_into(x_.data(), moe_out_.data(), tokens * hidden);
      return Status::Ok();
    }
    cpu::silu_mlp(xn_.data(), tokens, hidden, w.gate, w.up, w.down, inter, gate_.data(), up_.data(),
                  xn_.data());
    cpu::add_into(x_.data(), xn_.data(), tokens * hidden);
    return Status::Ok();
  }

  // Appends the step's K and V, then attends: single-token chunks in one decode call, longer
  // chunks by a prefill call each. Output: attn_ (float32).
  Status attend(const StepBatch& batch, std::uint32_t layer, std::size_t tokens) {
    const ModelConfig& c = config();
    const KvView& view = batch.kv;
    // An fp8 cache takes the float32 activations as they are (the append quantizes them);
    // a 16-bit one reads and writes its own type.
    const bool fp8 = view.element == DType::kFp8;
    const DType element = fp8 ? DType::kFp32 : view.element;
    const std::size_t q_width = std::size_t{c.heads} * c.head_dim;
    const std::size_t kv_width = std::size_t{c.kv_heads} * c.head_dim;
    const std::size_t bytes = element_bytes(element);
    const bool native = element == DType::kFp32;
    if (calibrating_) {
      const auto largest = [&](const Scratch<float>& values) {
        float most = 0.0f;
        for (std::size_t i = 0; i < tokens * kv_width; ++i) {
          const float magnitude = std::fabs(values[i]);
          if (!(magnitude <= most)) most = magnitude;  // a NaN is kept
        }
        return most;
      };
      KVVM_RETURN_IF_ERROR(set_calibrated_layer(layer, largest(k_), largest(v_)));
    }
    const float k_scale = kv_scales().k_of(layer);
    const float v_scale = kv_scales().v_of(layer);
    const KvHeadScales head_scales{kv_scales().k_heads(layer), kv_scales().v_heads(layer)};
    const void* q = q_.data();
    const void* k = k_.data();
    const void* v = v_.data();
    unsigned char* out = reinterpret_cast<unsigned char*>(attn_.data());
    if (!native) {
      to_elements(element, q_.data(), tokens * q_width, q_elements_.data());
      to_elements(element, k_.data(), tokens * kv_width, k_elements_.data());
      to_elements(element, v_.data(), tokens * kv_width, v_elements_.data());
      q = q_elements_.data();
      k = k_elements_.data();
      v = v_elements_.data();
      out = out_elements_.data();
    }
    AppendParams append;
    append.view = view;
    append.activations = element;
    append.k_scale = k_scale;
    append.v_scale = v_scale;
    append.head_scales = head_scales;
    append.layer = layer;
    append.kv_heads = c.kv_heads;
    append.tokens = static_cast<std::uint32_t>(tokens);
    append.k = k;
    append.v = v;
    append.row_slots = row_slots_.data();
    append.row_positions = positions_.data();
    KVVM_RETURN_IF_ERROR(append_kv_cpu(append));

    const std::size_t q_row = q_width * bytes;
    const auto* q_bytes = static_cast<const unsigned char*>(q);
    std::uint32_t decodes = 0;
    std::uint32_t max_length = 0;
    std::size_t row = 0;
    for (const Chunk& chunk : batch.chunks) {
      if (chunk.tokens == 1) {
        std::memcpy(&decode_q_[decodes * q_row], q_bytes + row * q_row, q_row);
        decode_slots_[decodes] = chunk.slot;
        decode_lengths_[decodes] = chunk.start + 1;
        decode_rows_[decodes] = static_cast<std::uint32_t>(row);
        max_length = std::max(max_length, chunk.start + 1);
        ++decodes;
      } else {
        PrefillParams prefill;
        prefill.view = view;
        prefill.activations = element;
        prefill.k_scale = k_scale;
        prefill.v_scale = v_scale;
        prefill.head_scales = head_scales;
        prefill.layer = layer;
        prefill.qo_heads = c.heads;
        prefill.kv_heads = c.kv_heads;
        prefill.slot = chunk.slot;
        prefill.start = chunk.start;
        prefill.tokens = chunk.tokens;
        prefill.q = q_bytes + row * q_row;
        prefill.out = out + row * q_row;
        KVVM_RETURN_IF_ERROR(prefill_attention_cpu(prefill, threads_));
      }
      row += chunk.tokens;
    }
    if (decodes > 0) {
      DecodeParams decode;
      decode.view = view;
      decode.activations = element;
      decode.k_scale = k_scale;
      decode.v_scale = v_scale;
      decode.head_scales = head_scales;
      decode.layer = layer;
      decode.qo_heads = c.heads;
      decode.kv_heads = c.kv_heads;
      decode.batch = decodes;
      decode.q = decode_q_.data();
      decode.slots = decode_slots_.data();
      decode.lengths = decode_lengths_.data();
      decode.max_length = max_length;
      decode.out = decode_out_.data();
      KVVM_RETURN_IF_ERROR(decode_attention_cpu(decode, threads_));
      for (std::uint32_t i = 0; i < decodes; ++i) {
        std::memcpy(out + std::size_t{decode_rows_[i]} * q_row, &decode_out_[i * q_row], q_row);
      }
    }
    if (!native) {
      for (std::size_t i = 0; i < tokens * q_width; ++i) {
        attn_[i] = element_to_float(element, out + i * bytes);
      }
    }
    return Status::Ok();
  }

  static void to_elements(DType element, const float* from, std::size_t n, unsigned char* to) {
    const std::uint32_t bytes = element_bytes(element);
    for (std::size_t i = 0; i < n; ++i) float_to_element(element, from[i], to + i * bytes);
  }

  // Final norm of each chunk's last token, lm_head over those rows only, then the outputs
  // (log-probabilities of a kAll chunk's earlier rows run the norm and lm_head over them too).
  void finish(const StepBatch& batch, const StepOutput& out) {
    if (out.logits == nullptr && out.argmax == nullptr && out.sampled == nullptr) return;
    const ModelConfig& c = config();
    const std::size_t hidden = c.hidden_size;
    const std::size_t chunks = batch.chunks.size();
    std::size_t row = 0;
    for (std::size_t i = 0; i < chunks; ++i) {
      row += batch.chunks[i].tokens;
      cpu::rms_norm(&x_[(row - 1) * hidden], w_->final_norm, 1, hidden,
                    static_cast<float>(c.rms_norm_eps), &last_[i * hidden]);
    }
    float* logits = out.logits != nullptr ? out.logits : logits_.data();
    cpu::linear(last_.data(), chunks, hidden, w_->lm_head, c.vocab_size, logits);
    const std::size_t mask_words = token_mask_words(c.vocab_size);
    for (std::size_t i = 0; i < batch.sampling.size() && i < chunks; ++i) {
      const ChunkSampling& s = batch.sampling[i];
      const std::span<float> chunk_logits(logits + i * c.vocab_size, c.vocab_size);
      if (s.adjust_count != 0) {
        adjust_logits(chunk_logits, s.params,
                      batch.adjustments.subspan(s.adjust_begin, s.adjust_count));
      }
      if (s.mask_row >= 0) {
        mask_logits(chunk_logits,
                    batch.token_masks.subspan(static_cast<std::size_t>(s.mask_row) * mask_words,
                                              mask_words));
      }
    }
    if (out.argmax != nullptr) {
      for (std::size_t i = 0; i < chunks; ++i) {
        out.argmax[i] = cpu::argmax(logits + i * c.vocab_size, c.vocab_size);
      }
    }
    if (out.sampled != nullptr) {
      for (std::size_t i = 0; i < chunks; ++i) {
        const ChunkSampling& s = batch.sampling[i];
        out.sampled[i] = sample_token(
            std::span<const float>(logits + i * c.vocab_size, c.vocab_size), s.params, s.counter);
      }
    }
    if (out.logprobs != nullptr) write_logprobs(batch, out, logits);
  }

  // The log-probability rows (StepOutput::logprobs). First every asking chunk's last row,
  // from the step's logits (which may live in logits_); then the earlier rows of the kAll
  // chunks, through the final norm and lm_head again, max_chunks rows at a time in last_ and
  // logits_, so a long prompt needs no buffer beyond the ones sized at creation.
  void write_logprobs(const StepBatch& batch, const StepOutput& out, const float* logits) {
    const ModelConfig& c = config();
    const std::size_t hidden = c.hidden_size, vocab = c.vocab_size;
    const std::size_t chunks = std::min(batch.chunks.size(), batch.sampling.size());
    std::size_t index = 0;  // of the chunk's first RowLogprobs
    for (std::size_t i = 0; i < chunks; ++i) {
      const ChunkSampling& s = batch.sampling[i];
      if (s.logprob_rows == LogprobRows::kNone) continue;
      const std::size_t earlier =
          s.logprob_rows == LogprobRows::kAll ? batch.chunks[i].tokens - 1 : 0;
      const std::int32_t target = s.last_target >= 0 ? s.last_target : out.sampled[i];
      fill_logprobs(std::span<const float>(logits + i * vocab, vocab), s, target,
                    &out.logprobs[index + earlier]);
      index += earlier + 1;
    }
    const std::size_t block = limits().max_chunks;
    std::size_t row = 0;  // the chunk's first row in the step
    index = 0;
    for (std::size_t i = 0; i < chunks; ++i) {
      const ChunkSampling& s = batch.sampling[i];
      const std::size_t tokens = batch.chunks[i].tokens;
      if (s.logprob_rows == LogprobRows::kAll) {
        for (std::size_t j = 0; j + 1 < tokens; j += block) {
          const std::size_t rows = std::min(block, tokens - 1 - j);
          cpu::rms_norm(&x_[(row + j) * hidden], w_->final_norm, rows, hidden,
                        static_cast<float>(c.rms_norm_eps), last_.data());
          cpu::linear(last_.data(), rows, hidden, w_->lm_head, vocab, logits_.data());
          for (std::size_t r = 0; r < rows; ++r) {
            fill_logprobs(std::span<const float>(&logits_[r * vocab], vocab), s,
                          batch.token_ids[row + j + r + 1], &out.logprobs[index + j + r]);
          }
        }
        index += tokens;
      } else if (s.logprob_rows == LogprobRows::kLast) {
        index += 1;
      }
      row += tokens;
    }
  }

  static void fill_logprobs(std::span<const float> logits, const ChunkSampling& s,
                            std::int32_t target, RowLogprobs* to) {
    RowLogprobs r;
    r.target = target;
    row_logprobs(logits, s.params.temperature, target, s.top_logprobs, &r.logprob, r.top_ids.data(),
                 r.top_logprobs.data());
    // Slots past the row's non-NaN ids hold -1.
    while (r.top < s.top_logprobs && r.top_ids[r.top] >= 0) ++r.top;
    *to = r;
  }

  std::unique_ptr<cpu::CpuWeights> w_;
  std::vector<float> inv_freq_;
  unsigned threads_;
  bool calibrating_ = false;  // this step measures the KV scales (Model::calibrate_kv_scales)
  // Activations, sized once from the limits.
  Scratch<float> x_, xn_, q_, k_, v_, attn_, gate_, up_, last_, logits_;
  std::unique_ptr<cpu::CpuMoe> moe_;  // a mixture of experts' feed-forward; null when dense
  Scratch<float> moe_out_;
  Scratch<std::uint32_t> positions_, row_slots_;
  Scratch<unsigned char> q_elements_, k_elements_, v_elements_, out_elements_;
  Scratch<unsigned char> decode_q_, decode_out_;
  Scratch<std::uint32_t> decode_slots_, decode_lengths_, decode_rows_;
};

Status check_config(const ModelConfig& c, const ModelLimits& limits) {
  const struct {
    const char* name;
    std::uint64_t value;
  } positive[] = {{"hidden_size", c.hidden_size},
                  {"intermediate_size", c.intermediate_size},
                  {"num_hidden_layers", c.layers},
                  {"num_attention_heads", c.heads},
                  {"num_key_value_heads", c.kv_heads},
                  {"head_dim", c.head_dim},
                  {"vocab_size", c.vocab_size},
                  {"max_position_embeddings", c.max_position_embeddings},
                  {"max_step_tokens", limits.max_step_tokens},
                  {"max_chunks", limits.max_chunks}};
  for (const auto& field : positive) {
    if (field.value == 0) {
      return Status::InvalidArgument(std::string("cpu model: ") + field.name + " is 0");
    }
  }
  if (c.heads % c.kv_heads != 0) {
    return Status::InvalidArgument("cpu model: " + std::to_string(c.heads) +
                                   " attention heads are not a multiple of " +
                                   std::to_string(c.kv_heads) + " KV heads");
  }
  if (c.head_dim % 2 != 0) {
    return Status::InvalidArgument("cpu model: head_dim " + std::to_string(c.head_dim) +
                                   " is odd; RoPE rotates pairs");
  }
  if (limits.max_logit_adjustments < c.vocab_size) {
    return Status::InvalidArgument("cpu model: max_logit_adjustments " +
                                   std::to_string(limits.max_logit_adjustments) +
                                   " is below the vocabulary of " + std::to_string(c.vocab_size) +
                                   " (one draw's transforms must always fit)");
  }
  // OpenBLAS takes 32-bit dimensions.
  const std::uint64_t widest =
      std::max({std::uint64_t{c.hidden_size}, std::uint64_t{c.intermediate_size},
                std::uint64_t{c.vocab_size}, std::uint64_t{c.heads} * c.head_dim});
  if (widest > std::numeric_limits<std::int32_t>::max()) {
    return Status::InvalidArgument("cpu model: a dimension of " + std::to_string(widest) +
                                   " exceeds OpenBLAS's 32-bit sizes");
  }
  if (!(c.rms_norm_eps > 0)) {
    return Status::InvalidArgument("cpu model: rms_norm_eps " + std::to_string(c.rms_norm_eps) +
                                   " is not positive");
  }
  if (c.rope.scaling != RopeScaling::kNone && !(c.rope.factor > 0)) {
    return Status::InvalidArgument("cpu model: rope_scaling factor " +
                                   std::to_string(c.rope.factor) + " is not positive");
  }
  if (c.rope.scaling == RopeScaling::kLlama3 &&
      (!(c.rope.high_freq_factor > c.rope.low_freq_factor) || !(c.rope.low_freq_factor > 0))) {
    return Status::InvalidArgument("cpu model: llama3 rope_scaling needs 0 < low_freq_factor (" +
                                   std::to_string(c.rope.low_freq_factor) +
                                   ") < high_freq_factor (" +
                                   std::to_string(c.rope.high_freq_factor) + ")");
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Model>> make_cpu_model(const ModelConfig& config,
                                              const ModelWeights& weights,
                                              const CpuModelOptions& options) {
  KVVM_RETURN_IF_ERROR(check_config(config, options.limits));
  KVVM_ASSIGN_OR_RETURN(std::unique_ptr<cpu::CpuWeights> converted,
                        cpu::CpuWeights::load(config, weights, options.weights));
  KVVM_ASSIGN_OR_RETURN(KvScales scales,
                        checkpoint_kv_scales(config, weights, options.weights.format));
  try {
    auto model = std::unique_ptr<Model>(
        new CpuModel(config, options.limits, std::move(converted), options.threads));
    KVVM_RETURN_IF_ERROR(model->set_kv_scales(std::move(scales)));
    return model;
  } catch (const std::bad_alloc&) {
    return Status::InvalidArgument("cpu model: the activations for max_step_tokens " +
                                   std::to_string(options.limits.max_step_tokens) +
                                   " and max_chunks " + std::to_string(options.limits.max_chunks) +
                                   " do not fit in memory");
  }
}

}  // namespace kvvm::model
