// Converts a checkpoint's tensors (or draws dummy ones) to float32 into the CPU backend's
// WeightStore (an FP8 projection dequantized with its scales), and writes streamed layers into
// their ring slots step by step.
#include "model/cpu/cpu_weights.h"

#include <array>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/dummy_value.h"
#include "kernels/element.h"
#include "kvvm/kernels/attention.h"
#include "kvvm/vmm/host_driver.h"
#include "model/weights/load_tracker.h"
#include "model/weights/weight_tensors.h"

namespace kvvm::model::cpu {
namespace {

DType element_of(TensorDType dtype) {
  switch (dtype) {
    case TensorDType::kBf16:
      return DType::kBf16;
    case TensorDType::kF16:
      return DType::kFp16;
    case TensorDType::kF8E4M3:
      return DType::kFp8;
    default:
      return DType::kFp32;
  }
}

// A quantized projection's dequantized values: each e4m3 weight times the scale of its
// 128 x 128 block (fp8-block128) or of its row (fp8-channel), in float32. The product of an
// e4m3 value (4 significant bits) and a float32 scale rounds once, as torch's fp8.float() *
// scale does.
void dequantize(const detail::WeightTensor& t, float* out) {
  const std::uint64_t rows = t.shape[0], in = t.shape[1];
  const DType scale_element = element_of(t.scale_source->dtype);
  const std::uint32_t scale_size = element_bytes(scale_element);
  const auto* scales = reinterpret_cast<const unsigned char*>(t.scale_source->data);
  const auto* weights = reinterpret_cast<const std::uint8_t*>(t.source->data);
  const std::uint64_t block = kFp8WeightBlock;
  const std::uint64_t blocks_per_row = (in + block - 1) / block;
  // Every e4m3 code's value, looked up rather than decoded per weight.
  std::array<float, 256> values;
  for (int code = 0; code < 256; ++code) {
    values[code] = kernels::e4m3_to_float(static_cast<std::uint8_t>(code));
  }
  std::vector<float> row_scales(blocks_per_row);
  for (std::uint64_t r = 0; r < rows; ++r) {
    // The scales this row's weights take: one per block of columns, or the row's own.
    for (std::uint64_t b = 0; b < blocks_per_row; ++b) {
      const std::uint64_t index =
          t.quant == WeightQuant::kFp8Block ? (r / block) * blocks_per_row + b : r;
      row_scales[b] = kernels::load_element(scale_element, scales + index * scale_size);
    }
    for (std::uint64_t i = 0; i < in; ++i) {
      out[r * in + i] = values[weights[r * in + i]] * row_scales[i / block];
    }
  }
}

// Fills `out` with the tensor's values in float32 (checked by weight_tensors).
void fill(const detail::WeightTensor& t, std::uint64_t seed, float* out) {
  if (t.source == nullptr) {
    if (t.quant != WeightQuant::kNone) {
      // What the CUDA backend draws for a dummy quantized projection, dequantized: e4m3 values
      // over its whole range, each scale the draw's half-width over 448.
      const float scale = t.scale / 448.0f;
      for (std::uint64_t i = 0; i < t.elements; ++i) {
        const float drawn = kernels::dummy_value(seed, t.dummy_id, i, 448.0f);
        out[i] = kernels::e4m3_to_float(kernels::float_to_e4m3(drawn)) * scale;
      }
      return;
    }
    for (std::uint64_t i = 0; i < t.elements; ++i) {
      out[i] = t.scale == 0.0f ? t.constant : kernels::dummy_value(seed, t.dummy_id, i, t.scale);
    }
    return;
  }
  if (t.quant != WeightQuant::kNone) {
    dequantize(t, out);
    return;
  }
  const DType element = element_of(t.source->dtype);
  if (element == DType::kFp32) {
    std::memcpy(out, t.source->data, t.elements * 4);  // the mapping's alignment is the file's
    return;
  }
  // One loop per type with the conversion inlined (it vectorizes): a call and a switch per
  // element took 8x as long (4.9 ms against 0.6 ms for models/kvvm-adder's 4.1M weights).
  const auto* from = reinterpret_cast<const unsigned char*>(t.source->data);
  if (element == DType::kBf16) {
    for (std::uint64_t i = 0; i < t.elements; ++i) {
      std::uint16_t bits;
      std::memcpy(&bits, from + 2 * i, 2);
      out[i] = kernels::bf16_to_float(bits);
    }
    return;
  }
  for (std::uint64_t i = 0; i < t.elements; ++i) {  // fp16
    std::uint16_t bits;
    std::memcpy(&bits, from + 2 * i, 2);
    out[i] = kernels::half_to_float(bits);
  }
}

}  // namespace

Result<std::unique_ptr<CpuWeights>> CpuWeights::load(const ModelConfig& config,
                                                     const ModelWeights& weights,
                                                     const WeightOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  const detail::WeightLayout layout = detail::weight_layout(config, DType::kFp32);
  const bool dummy = options.format == LoadFormat::kDummy;
  KVVM_ASSIGN_OR_RETURN(std::vector<detail::WeightTensor> tensors,
                        detail::weight_tensors(config, layout, dummy ? nullptr : &weights));

  std::unique_ptr<Driver> owned;
  if (options.driver == nullptr) {
    Result<std::unique_ptr<Driver>> driver = make_host_driver();
    if (!driver.ok()) return driver.status().with_context("CPU model weights");
    owned = std::move(driver).value();
  } else if (options.driver->info().backend != "host") {
    return Status::InvalidArgument("CPU model weights: a " + options.driver->info().backend +
                                   " driver was lent; the CPU model reads host memory");
  }
  Result<std::unique_ptr<detail::WeightStore>> store =
      detail::WeightStore::create(options.driver, std::move(owned), layout, options, false);
  if (!store.ok()) return store.status().with_context("CPU model weights");

  std::unique_ptr<CpuWeights> out(new CpuWeights());
  out->store_ = std::move(store).value();
  detail::WeightStore& s = *out->store_;
  const WeightSplit& split = s.split();
  out->staging_.resize(split.host_staging_bytes / sizeof(float));
  // Where a tensor's float32 values go: the base region, a resident layer's block, or a
  // streamed layer's part of the staging.
  auto staged = [&](std::uint64_t at) {
    return reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(out->staging_.data()) + at);
  };
  auto place = [&](std::uint32_t region, std::uint64_t offset) -> float* {
    if (region == detail::kBaseRegion) return reinterpret_cast<float*>(s.at(offset));
    if (split.expert_cache() && layout.sparse_layer[region] && offset >= layout.sparse.experts) {
      // Expert e of the i-th sparse layer at (i * experts + e) * expert_bytes: the stride of
      // the experts in a block is an expert's bytes.
      return staged(std::uint64_t{s.sparse_index(region)} * config.moe.experts *
                        split.sizes.expert_bytes +
                    (offset - layout.sparse.experts));
    }
    if (!s.streamed(region)) return reinterpret_cast<float*>(s.layer(region) + offset);
    return staged(std::uint64_t{s.streamed_index(region)} * split.sizes.layer_bytes + offset);
  };
  detail::LoadTracker tracker(tensors, options.on_progress, started);
  for (const detail::WeightTensor& t : tensors) {
    fill(t, options.dummy_seed, place(t.region, t.offset));
    out->load_bytes_ += t.elements * sizeof(float);
    tracker.read(t);
  }

  // Every pointer is the tensor's stable address, streamed or not.
  const detail::WeightAddresses at = s.addresses();
  auto f = [](Address address) { return reinterpret_cast<const float*>(address); };
  out->embed = f(at.embed);
  out->lm_head = f(at.lm_head);
  out->final_norm = f(at.final_norm);
  const std::uint64_t gate_bytes =
      std::uint64_t{config.intermediate_size} * config.hidden_size * sizeof(float);
  const detail::SparseOffsets& sparse = layout.sparse;
  const MoeConfig& moe = config.moe;
  for (const detail::LayerAddresses& a : at.layers) {
    out->layers.push_back(CpuLayerWeights{.input_norm = f(a.input_norm),
                                          .q = f(a.q),
                                          .k = f(a.k),
                                          .v = f(a.v),
                                          .q_bias = f(a.q_bias),
                                          .k_bias = f(a.k_bias),
                                          .v_bias = f(a.v_bias),
                                          .o = f(a.o),
                                          .o_bias = f(a.o_bias),
                                          .q_norm = f(a.q_norm),
                                          .k_norm = f(a.k_norm),
                                          .post_norm = f(a.post_norm),
                                          .gate = f(a.gate_up),
                                          .up = f(a.gate_up + gate_bytes),
                                          .down = f(a.down),
                                          .router = nullptr,
                                          .experts = {},
                                          .shared = {},
                                          .shared_gate = nullptr});
    if (a.router == 0) continue;
    CpuLayerWeights& layer = out->layers.back();
    layer.gate = layer.up = layer.down = nullptr;
    layer.router = f(a.router);
    // up follows gate in each gate|up run, as in the dense MLP.
    auto expert = [&](Address gate_up, Address down, std::uint64_t inter) {
      return CpuExpert{.gate = f(gate_up),
                       .up = f(gate_up + inter * config.hidden_size * sizeof(float)),
                       .down = f(down)};
    };
    for (std::uint32_t e = 0; a.experts != 0 && e < moe.experts; ++e) {
      const Address base = a.experts + std::uint64_t{e} * sparse.expert_stride;
      layer.experts.push_back(
          expert(base + sparse.expert.gate_up, base + sparse.expert.down, moe.expert_intermediate));
    }
    if (a.shared_gate != 0) {
      layer.shared_gate = f(a.shared_gate);
      layer.shared = expert(a.shared_gate_up, a.shared_down, moe.shared_intermediate);
    }
  }
  out->hidden_ = config.hidden_size;
  out->expert_inter_ = moe.expert_intermediate;
  out->experts_ = moe.experts;
  out->expert_offsets_ = sparse.expert;
  if (split.expert_cache()) {
    Driver& driver = s.driver();
    out->expert_cache_ = std::make_unique<detail::ExpertCache>(
        detail::ExpertCacheShape{.sparse_layers = split.sizes.sparse_layers,
                                 .experts = moe.experts,
                                 .slots = split.expert_slots,
                                 .expert_bytes = split.sizes.expert_bytes},
        s.expert_slot(0), reinterpret_cast<const unsigned char*>(out->staging_.data()),
        [&driver](Address to, const unsigned char* from, std::uint64_t bytes) {
          return driver.write(to, from, bytes);
        });
    KVVM_RETURN_IF_ERROR(out->expert_cache_->preload().with_context("CPU model weights"));
    out->load_bytes_ += std::uint64_t{split.expert_slots} * split.sizes.expert_bytes;
  }
  out->load_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return out;
}

std::uint32_t CpuWeights::expert_capacity() const {
  return expert_cache_ != nullptr ? expert_cache_->slots() : experts_;
}

Status CpuWeights::experts_for(std::uint32_t layer, std::span<const std::uint32_t> ids,
                               std::span<const std::uint32_t> rows, std::span<CpuExpert> out) {
  if (expert_cache_ == nullptr) {
    for (std::size_t i = 0; i < ids.size(); ++i) out[i] = layers[layer].experts[ids[i]];
    return Status::Ok();
  }
  expert_at_.resize(ids.size());
  KVVM_RETURN_IF_ERROR(expert_cache_->acquire(store_->sparse_index(layer), ids, rows,
                                              std::span<Address>(expert_at_)));
  auto f = [](Address address) { return reinterpret_cast<const float*>(address); };
  const std::uint64_t up = std::uint64_t{expert_inter_} * hidden_ * sizeof(float);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const Address at = expert_at_[i];
    out[i] = CpuExpert{.gate = f(at + expert_offsets_.gate_up),
                       .up = f(at + expert_offsets_.gate_up + up),
                       .down = f(at + expert_offsets_.down)};
  }
  return Status::Ok();
}

Status CpuWeights::stream_in(std::uint32_t layer) {
  if (!store_->streamed(layer)) return Status::Ok();
  const std::uint64_t bytes = store_->split().sizes.layer_bytes;
  const unsigned char* from = reinterpret_cast<const unsigned char*>(staging_.data()) +
                              std::uint64_t{store_->streamed_index(layer)} * bytes;
  ++layer_copies_;
  return store_->driver().write(store_->layer(layer), from, bytes);
}

WeightStats CpuWeights::stats() const {
  WeightStats stats;
  stats.split = store_->split();
  stats.physical_bytes = store_->physical_bytes();
  stats.handles = store_->handles();
  stats.layer_copies = layer_copies_.load(std::memory_order_relaxed);
  stats.load_bytes = load_bytes_;
  stats.load_seconds = load_seconds_;
  if (expert_cache_ != nullptr) stats.experts = expert_cache_->stats();
  return stats;
}

}  // namespace kvvm::model::cpu
