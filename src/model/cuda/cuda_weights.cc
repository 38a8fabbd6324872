// Loads a checkpoint's tensors (or draws dummy ones) into the CUDA model's WeightStore: the
// resident ones through a pipeline of pinned buffers, the streamed ones into pinned staging.
// A tensor already in the compute type is copied as it is; another (F32, or the other 16-bit
// type) is converted on the host (round to nearest even, as torch's .to() does).
#include "model/cuda/cuda_weights.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/element.h"
#include "kvvm/base/bytes.h"
#include "kvvm/kernels/model_kernels.h"
#include "kvvm/vmm/cuda_driver.h"
#include "model/cuda/cuda_status.h"
#include "model/weights/load_tracker.h"
#include "model/weights/weight_tensors.h"

namespace kvvm::model::detail {
namespace {

constexpr std::uint64_t kChunkBytes = std::uint64_t{64} << 20;  // one pinned buffer
constexpr std::size_t kBuffers = 4;
// Below this a copy is not worth splitting across threads.
constexpr std::uint64_t kSplitBytes = std::uint64_t{4} << 20;

DType element_of(TensorDType dtype) {
  switch (dtype) {
    case TensorDType::kF16:
      return DType::kFp16;
    case TensorDType::kBf16:
      return DType::kBf16;
    case TensorDType::kF8E4M3:
      return DType::kFp8;
    default:
      return DType::kFp32;
  }
}

// The type a tensor is stored in on the device: the projections' (fp8 for a quantized
// checkpoint) for a layer block's tensors, the compute type for the rest.
DType stored_type(const WeightTensor& t, const WeightLayout& layout) {
  return t.region == kBaseRegion ? layout.element : layout.projection;
}

// A projection's scales as float32 in the store's layout (checked by weight_tensors: F32, BF16
// or F16): block-scaled rows of blocks padded to device_scale_row (the padding 0, never read).
std::vector<float> scales_of(const WeightTensor& t, WeightQuant quant) {
  const std::uint64_t rows = t.shape[0], in = t.shape[1];
  std::vector<float> out(device_scale_count(quant, rows, in), 0.0f);
  const DType from = element_of(t.scale_source->dtype);
  const std::uint32_t size = element_bytes(from);
  const auto* at = reinterpret_cast<const unsigned char*>(t.scale_source->data);
  const std::uint64_t width =
      quant == WeightQuant::kFp8Block ? (in + kFp8WeightBlock - 1) / kFp8WeightBlock : 1;
  const std::uint64_t row = quant == WeightQuant::kFp8Block ? device_scale_row(in) : 1;
  for (std::uint64_t i = 0; i < t.scale_count; ++i) {
    out[i / width * row + i % width] = kernels::load_element(from, at + i * size);
  }
  return out;
}

// memcpy split across threads: one thread reads page cache at a few GB/s, several near the
// memory's rate.
void parallel_copy(unsigned char* to, const unsigned char* from, std::uint64_t bytes) {
  const unsigned threads = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  if (bytes < kSplitBytes || threads == 1) {
    std::memcpy(to, from, bytes);
    return;
  }
  const std::uint64_t share = (bytes + threads - 1) / threads;
  std::vector<std::thread> team;
  for (unsigned t = 1; t < threads; ++t) {
    const std::uint64_t begin = std::min(bytes, t * share), end = std::min(bytes, begin + share);
    if (begin < end) team.emplace_back([=] { std::memcpy(to + begin, from + begin, end - begin); });
  }
  std::memcpy(to, from, std::min(bytes, share));
  for (std::thread& thread : team) thread.join();
}

// Writes `count` elements of the tensor from element `first` into `to` in `compute`.
void produce(const WeightTensor& t, DType compute, std::uint64_t first, std::uint64_t count,
             unsigned char* to) {
  const DType source = element_of(t.source->dtype);
  const std::uint32_t from_size = element_bytes(source), to_size = element_bytes(compute);
  const auto* from = reinterpret_cast<const unsigned char*>(t.source->data) + first * from_size;
  if (source == compute) {
    parallel_copy(to, from, count * to_size);
    return;
  }
  for (std::uint64_t i = 0; i < count; ++i) {
    kernels::store_element(compute, kernels::load_element(source, from + i * from_size),
                           to + i * to_size);
  }
}

// Pinned buffers the host fills while the device copies the previous one.
class Pipeline {
 public:
  explicit Pipeline(cudaStream_t stream) : stream_(stream) {}
  ~Pipeline() {
    (void)cudaStreamSynchronize(stream_);
    for (std::size_t i = 0; i < kBuffers; ++i) {
      if (events_[i] != nullptr) (void)cudaEventDestroy(events_[i]);
      if (buffers_[i] != nullptr) (void)cudaFreeHost(buffers_[i]);
    }
  }
  Status init() {
    for (std::size_t i = 0; i < kBuffers; ++i) {
      KVVM_RETURN_IF_ERROR(
          cuda_call("cudaHostAlloc", cudaHostAlloc(reinterpret_cast<void**>(&buffers_[i]),
                                                   kChunkBytes, cudaHostAllocDefault)));
      KVVM_RETURN_IF_ERROR(
          cuda_call("cudaEventCreateWithFlags",
                    cudaEventCreateWithFlags(&events_[i], cudaEventDisableTiming)));
    }
    return Status::Ok();
  }
  // The tensor, converted to `compute`, copied to `device`.
  Status upload(const WeightTensor& t, DType compute, unsigned char* device) {
    const std::uint32_t size = element_bytes(compute);
    const std::uint64_t per_chunk = kChunkBytes / size;
    for (std::uint64_t first = 0; first < t.elements; first += per_chunk) {
      const std::uint64_t count = std::min(per_chunk, t.elements - first);
      const std::size_t i = next_++ % kBuffers;
      // The buffer's previous copy must be done before it is refilled.
      KVVM_RETURN_IF_ERROR(cuda_call("cudaEventSynchronize", cudaEventSynchronize(events_[i])));
      produce(t, compute, first, count, buffers_[i]);
      KVVM_RETURN_IF_ERROR(cuda_call(
          "cudaMemcpyAsync", cudaMemcpyAsync(device + first * size, buffers_[i], count * size,
                                             cudaMemcpyHostToDevice, stream_)));
      KVVM_RETURN_IF_ERROR(cuda_call("cudaEventRecord", cudaEventRecord(events_[i], stream_)));
    }
    return Status::Ok();
  }

 private:
  cudaStream_t stream_;
  std::array<unsigned char*, kBuffers> buffers_{};
  std::array<cudaEvent_t, kBuffers> events_{};
  std::size_t next_ = 0;
};

Status dummy_fill(const WeightTensor& t, DType compute, std::uint64_t seed, void* device,
                  cudaStream_t stream) {
  DummyFillParams fill;
  fill.element = compute;
  fill.count = t.elements;
  fill.seed = seed;
  fill.tensor = t.dummy_id;
  fill.scale = t.scale;
  fill.constant = t.constant;
  fill.out = device;
  return dummy_fill_cuda(fill, stream);
}

}  // namespace

DeviceWeights::~DeviceWeights() {
  store_.reset();  // synchronizes before it unmaps
  residency_.reset();
  if (staging_ != nullptr) (void)cudaFreeHost(staging_);
}

const void* DeviceWeights::staged(std::uint32_t layer) const {
  return staging_ +
         std::uint64_t{store_->streamed_index(layer)} * store_->split().sizes.layer_bytes;
}

WeightStats DeviceWeights::stats(std::uint64_t layer_copies) const {
  WeightStats stats;
  stats.split = store_->split();
  stats.physical_bytes = store_->physical_bytes();
  stats.handles = store_->handles();
  stats.layer_copies = layer_copies;
  stats.load_bytes = load_bytes_;
  stats.load_seconds = load_seconds_;
  if (residency_ != nullptr) stats.experts = residency_->stats();
  return stats;
}

Status DeviceWeights::acquire_experts(std::uint32_t layer, std::uint32_t tokens,
                                      std::uint32_t top_k, const std::int32_t* ids) const {
  const std::uint32_t sparse = store_->sparse_index(layer);
  auto* tables = reinterpret_cast<std::uint64_t*>(store_->at(store_->layout().expert_tables)) +
                 4ull * experts_ * sparse;
  return residency_->acquire(sparse, tokens, top_k, ids, tables, stream_);
}

namespace {

// What the MoE kernels take, checked before a byte is loaded: experts of whole 16-element
// vectors (128-wide scale blocks in FP8), bf16 / fp16 or block-scaled FP8.
Status check_experts(const ModelConfig& config) {
  const MoeConfig& moe = config.moe;
  if (!moe.enabled()) return Status::Ok();
  // The grouped GEMMs' tiles: whole 16-element vectors (128-wide scale blocks in FP8).
  const std::uint32_t multiple = config.weight_quant == WeightQuant::kFp8Block ? 128 : 16;
  if (config.hidden_size % multiple != 0 || moe.expert_intermediate % multiple != 0) {
    return Status::InvalidArgument(
        "CUDA model: the MoE kernels take a hidden size and an expert intermediate size that "
        "are multiples of " +
        std::to_string(multiple) + "; this model has " + std::to_string(config.hidden_size) +
        " and " + std::to_string(moe.expert_intermediate));
  }
  if (config.weight_quant == WeightQuant::kFp8Channel) {
    return Status::InvalidArgument(
        "CUDA model: per-channel FP8 experts (compressed-tensors) are not implemented by the "
        "MoE kernels, which read bf16 / fp16 or 128 x 128 block-scaled FP8 experts");
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<DeviceWeights>> DeviceWeights::upload(const ModelConfig& config,
                                                             const ModelWeights& weights,
                                                             DType compute,
                                                             const WeightOptions& options,
                                                             void* stream_handle) {
  KVVM_RETURN_IF_ERROR(check_experts(config));
  const auto started = std::chrono::steady_clock::now();
  auto* stream = static_cast<cudaStream_t>(stream_handle);
  WeightLayout layout = weight_layout(config, compute);
  // A layer's experts are acquired at once (the grouped GEMMs take one list of a layer's
  // experts), so a cache holds at least one layer's.
  if (config.moe.enabled()) layout.least_expert_slots = config.moe.experts;
  const bool dummy = options.format == LoadFormat::kDummy;
  Result<std::vector<WeightTensor>> tensors =
      weight_tensors(config, layout, dummy ? nullptr : &weights);
  if (!tensors.ok()) return tensors.status().with_context("CUDA model");

  int device = 0;
  KVVM_RETURN_IF_ERROR(cuda_call("cudaGetDevice", cudaGetDevice(&device)));
  std::unique_ptr<Driver> owned;
  if (options.driver == nullptr) {
    Result<std::unique_ptr<Driver>> driver = make_cuda_driver(CudaDriverOptions{.device = device});
    if (!driver.ok()) return driver.status().with_context("CUDA model weights");
    owned = std::move(driver).value();
  } else if (options.driver->info().backend != "cuda" ||
             options.driver->info().device_ordinal != device) {
    return Status::InvalidArgument("CUDA model weights: the lent " +
                                   options.driver->info().backend + " driver (device " +
                                   std::to_string(options.driver->info().device_ordinal) +
                                   ") is not the CUDA driver of device " + std::to_string(device));
  }
  Result<std::unique_ptr<WeightStore>> store =
      WeightStore::create(options.driver, std::move(owned), layout, options, true);
  if (!store.ok()) return store.status().with_context("CUDA model weights");

  std::unique_ptr<DeviceWeights> out(new DeviceWeights());
  out->store_ = std::move(store).value();
  WeightStore& s = *out->store_;
  const WeightSplit& split = s.split();
  if (split.host_staging_bytes > 0) {
    KVVM_RETURN_IF_ERROR(
        // Mapped: the expert residency's copies read it from the device.
        cuda_call("cudaHostAlloc", cudaHostAlloc(reinterpret_cast<void**>(&out->staging_),
                                                 split.host_staging_bytes, cudaHostAllocMapped))
            .with_context("CUDA model: " + format_bytes(split.host_staging_bytes) +
                          " of pinned host memory for the " +
                          (split.expert_cache() ? "experts" : "streamed layers")));
  }
  const bool cached = split.expert_cache();
  const SparseOffsets& sparse = layout.sparse;
  // With an expert cache an expert's tensors live in host staging only (its block offset less
  // the experts' start, after the sparse layers before it), and a dummy one is drawn in slot 0
  // (at its offset inside its expert's stretch) before its copy there.
  auto cached_expert = [&](const WeightTensor& t) {
    return cached && t.region != kBaseRegion && layout.sparse_layer[t.region] &&
           t.offset >= sparse.experts;
  };
  auto device_at = [&](const WeightTensor& t) {
    if (cached_expert(t)) {
      return reinterpret_cast<unsigned char*>(s.expert_slot(0) +
                                              (t.offset - sparse.experts) % sparse.expert_stride);
    }
    const Address base = t.region == kBaseRegion ? s.base() : s.layer(t.region);
    return reinterpret_cast<unsigned char*>(base + t.offset);
  };
  auto host_at = [&](const WeightTensor& t) -> unsigned char* {
    if (cached_expert(t)) {
      return out->staging_ +
             std::uint64_t{s.sparse_index(t.region)} * config.moe.experts *
                 split.sizes.expert_bytes +
             (t.offset - sparse.experts);
    }
    if (t.region == kBaseRegion || !s.streamed(t.region)) return nullptr;
    return const_cast<unsigned char*>(static_cast<const unsigned char*>(out->staged(t.region))) +
           t.offset;
  };
  {
    Pipeline pipeline(stream);
    KVVM_RETURN_IF_ERROR(pipeline.init());
    // Told as each tensor's bytes are read from the checkpoint (its copy to the device may
    // still run): what a load's time goes to.
    LoadTracker tracker(*tensors, options.on_progress, started);
    for (const WeightTensor& t : *tensors) {
      unsigned char* host = host_at(t);
      const bool staged = host != nullptr;
      const DType type = stored_type(t, layout);
      const std::uint64_t bytes = t.elements * element_bytes(type);
      out->load_bytes_ += bytes;
      const bool quantized = type == DType::kFp8 && t.scale_offset != kNoTensor;
      if (dummy) {
        // Drawn where the compute reads it; a streamed layer's is drawn into its ring slot and
        // copied back to its staging. FP8: e4m3 values over its whole range, each scale the
        // draw's half-width over 448, so the dequantized weights have the 16-bit draw's spread.
        WeightTensor drawn = t;
        if (quantized) drawn.scale = 448.0f;
        KVVM_RETURN_IF_ERROR(dummy_fill(drawn, type, options.dummy_seed, device_at(t), stream));
        WeightTensor scales;  // a constant: the draw's half-width over 448
        scales.elements =
            quantized ? device_scale_count(config.weight_quant, t.shape[0], t.shape[1]) : 0;
        scales.constant = t.scale / 448.0f;
        if (quantized) {
          unsigned char* at = device_at(t) - t.offset + t.scale_offset;
          KVVM_RETURN_IF_ERROR(dummy_fill(scales, DType::kFp32, 0, at, stream));
        }
        if (staged) {
          // The block's scales follow its projections: copy the whole span once, at the last.
          KVVM_RETURN_IF_ERROR(cuda_call(
              "cudaMemcpyAsync",
              cudaMemcpyAsync(host, device_at(t), bytes, cudaMemcpyDeviceToHost, stream)));
          if (quantized) {
            KVVM_RETURN_IF_ERROR(
                cuda_call("cudaMemcpyAsync",
                          cudaMemcpyAsync(host - t.offset + t.scale_offset,
                                          device_at(t) - t.offset + t.scale_offset,
                                          scales.elements * 4, cudaMemcpyDeviceToHost, stream)));
          }
        }
        continue;
      }
      if (staged) {
        produce(t, type, 0, t.elements, host);
      } else {
        KVVM_RETURN_IF_ERROR(pipeline.upload(t, type, device_at(t)));
      }
      if (quantized) {
        // A few floats per 16,384 weights: converted here, copied at once.
        const std::vector<float> scales = scales_of(t, config.weight_quant);
        out->load_bytes_ += scales.size() * 4;
        if (staged) {
          std::memcpy(host - t.offset + t.scale_offset, scales.data(), scales.size() * 4);
        } else {
          // On the upload's stream, which the load synchronizes: a cudaMemcpy from pageable
          // memory returns once the bytes are staged, its DMA on the legacy stream ordered
          // with nothing the model's non-blocking stream runs (the first forward could read
          // the scales half written). The vector may go at once: the bytes are staged.
          KVVM_RETURN_IF_ERROR(
              cuda_call("cudaMemcpyAsync",
                        cudaMemcpyAsync(device_at(t) - t.offset + t.scale_offset, scales.data(),
                                        scales.size() * 4, cudaMemcpyHostToDevice, stream)));
        }
      }
      tracker.read(t);
    }
  }
  KVVM_RETURN_IF_ERROR(cuda_call("cudaStreamSynchronize", cudaStreamSynchronize(stream)));
  out->load_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  const WeightAddresses at = s.addresses();
  auto p = [](Address address) { return reinterpret_cast<void*>(address); };
  out->embed = p(at.embed);
  out->lm_head = p(at.lm_head);
  out->final_norm = p(at.final_norm);
  const auto fp8 = [&](std::uint32_t layer, std::uint64_t offset) -> const float* {
    if (offset == kNoTensor) return nullptr;
    return reinterpret_cast<const float*>(s.layer(layer) + offset);
  };
  const WeightQuant quant = config.weight_quant;
  const std::uint64_t hidden = config.hidden_size;
  const std::uint64_t q_scales =
      device_scale_count(quant, std::uint64_t{config.heads} * config.head_dim, hidden);
  const std::uint64_t kv_scales =
      device_scale_count(quant, std::uint64_t{config.kv_heads} * config.head_dim, hidden);
  const LayerBlockOffsets& block = layout.block;
  for (const LayerAddresses& a : at.layers) {
    const auto layer = static_cast<std::uint32_t>(out->layers.size());
    const float* qkv = fp8(layer, block.qkv_scale);
    out->layers.push_back(
        DeviceLayer{.input_norm = p(a.input_norm),
                    .q = p(a.q),
                    .k = p(a.k),
                    .v = p(a.v),
                    .q_bias = p(a.q_bias),
                    .k_bias = p(a.k_bias),
                    .v_bias = p(a.v_bias),
                    .o = p(a.o),
                    .o_bias = p(a.o_bias),
                    .q_norm = p(a.q_norm),
                    .k_norm = p(a.k_norm),
                    .post_norm = p(a.post_norm),
                    .gate_up = p(a.gate_up),
                    .down = p(a.down),
                    .q_scales = qkv,
                    .k_scales = qkv == nullptr ? nullptr : qkv + q_scales,
                    .v_scales = qkv == nullptr ? nullptr : qkv + q_scales + kv_scales,
                    .o_scales = fp8(layer, block.o_scale),
                    .gate_up_scales = fp8(layer, block.gate_up_scale),
                    .down_scales = fp8(layer, block.down_scale)});
  }
  if (cached) {
    out->stream_ = stream;
    out->experts_ = config.moe.experts;
    auto residency = DeviceExpertResidency::create(
        ExpertCacheShape{.sparse_layers = split.sizes.sparse_layers,
                         .experts = config.moe.experts,
                         .slots = split.expert_slots,
                         .expert_bytes = split.sizes.expert_bytes},
        reinterpret_cast<void*>(s.expert_slot(0)), out->staging_, sparse.expert, stream);
    if (!residency.ok()) return residency.status().with_context("CUDA model weights");
    out->residency_ = std::move(residency).value();
    out->load_bytes_ += std::uint64_t{split.expert_slots} * split.sizes.expert_bytes;
  }
  KVVM_RETURN_IF_ERROR(out->bind_experts(config, stream));
  return out;
}

// Each sparse layer's experts as the MoE kernels take them: four tables of `experts` device
// pointers (gate|up, down, and their scales), written once; the kernels read them at run time,
// so a table rewritten on the device (an expert moved) needs no new graph.
Status DeviceWeights::bind_experts(const ModelConfig& config, void* stream) {
  const MoeConfig& moe = config.moe;
  const std::uint32_t sparse_layers = moe.sparse_layers();
  if (sparse_layers == 0) return Status::Ok();
  const WeightLayout& layout = store_->layout();
  const SparseOffsets& sparse = layout.sparse;
  const WeightAddresses at = store_->addresses();
  const std::uint64_t per_layer = 4ull * moe.experts;
  const std::uint64_t bytes = per_layer * sparse_layers * sizeof(std::uint64_t);
  // Pageable: copied once, then rewritten on the device by an expert cache.
  std::vector<std::uint64_t> tables(per_layer * sparse_layers, 0);
  auto* device = reinterpret_cast<std::uint64_t*>(store_->at(layout.expert_tables));
  std::uint32_t index = 0;
  for (std::uint32_t l = 0; l < layers.size(); ++l) {
    if (!moe.sparse_layer(l)) continue;
    const LayerAddresses& a = at.layers[l];
    DeviceLayer& layer = layers[l];
    std::uint64_t* table = &tables[per_layer * index];
    for (std::uint32_t e = 0; e < moe.experts; ++e) {
      // Cached: a resident expert's slot; the others stay 0 until a step routes to them.
      std::optional<std::uint32_t> slot;
      if (residency_ != nullptr) {
        slot = residency_->preloaded_slot(index, e);
        if (!slot) continue;
      }
      const Address expert =
          slot ? store_->expert_slot(*slot) : a.experts + std::uint64_t{e} * sparse.expert_stride;
      table[e] = expert + sparse.expert.gate_up;
      table[moe.experts + e] = expert + sparse.expert.down;
      if (sparse.expert.gate_up_scale != kNoTensor) {
        table[2 * moe.experts + e] = expert + sparse.expert.gate_up_scale;
        table[3 * moe.experts + e] = expert + sparse.expert.down_scale;
      }
    }
    const std::uint64_t* on_device = device + per_layer * index;
    layer.expert_gate_up = reinterpret_cast<const void* const*>(on_device);
    layer.expert_down = reinterpret_cast<const void* const*>(on_device + moe.experts);
    if (sparse.expert.gate_up_scale != kNoTensor) {
      layer.expert_gate_up_scales =
          reinterpret_cast<const float* const*>(on_device + 2 * moe.experts);
      layer.expert_down_scales = reinterpret_cast<const float* const*>(on_device + 3 * moe.experts);
    }
    layer.router = reinterpret_cast<void*>(a.router);
    layer.gate_up = layer.down = nullptr;
    layer.gate_up_scales = layer.down_scales = nullptr;
    if (a.shared_gate != 0) {
      layer.shared_gate = reinterpret_cast<void*>(a.shared_gate);
      layer.shared_gate_up = reinterpret_cast<void*>(a.shared_gate_up);
      layer.shared_down = reinterpret_cast<void*>(a.shared_down);
      if (sparse.shared.gate_up_scale != kNoTensor) {
        layer.shared_gate_up_scales =
            reinterpret_cast<const float*>(store_->layer(l) + sparse.shared.gate_up_scale);
        layer.shared_down_scales =
            reinterpret_cast<const float*>(store_->layer(l) + sparse.shared.down_scale);
      }
    }
    ++index;
  }
  KVVM_RETURN_IF_ERROR(cuda_call(
      "cudaMemcpyAsync", cudaMemcpyAsync(device, tables.data(), bytes, cudaMemcpyHostToDevice,
                                         static_cast<cudaStream_t>(stream))));
  return cuda_call("cudaStreamSynchronize",
                   cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

}  // namespace kvvm::model::detail
