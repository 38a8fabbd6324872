// DeviceExpertResidency: the state's allocation, the preload and the kernels' parameters.
#include "model/cuda/cuda_expert_residency.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <string>

#include "model/cuda/cuda_status.h"

namespace kvvm::model::detail {
namespace {

constexpr std::uint64_t kAlignment = 256;

std::uint64_t aligned(std::uint64_t bytes) {
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

// A counter the kernels write into mapped host memory while the host reads it.
std::uint64_t read_mirrored(const std::uint64_t& counter) {
  return std::atomic_ref<const std::uint64_t>(counter).load(std::memory_order_relaxed);
}

}  // namespace

Result<std::unique_ptr<DeviceExpertResidency>> DeviceExpertResidency::create(
    const ExpertCacheShape& shape, void* first_slot, const unsigned char* staging,
    const ExpertOffsets& offsets, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  std::unique_ptr<DeviceExpertResidency> out(new DeviceExpertResidency());
  out->shape_ = shape;
  out->offsets_ = offsets;
  out->first_slot_ = first_slot;
  void* mapped = nullptr;
  KVVM_RETURN_IF_ERROR(
      cuda_call("cudaHostGetDevicePointer",
                cudaHostGetDevicePointer(&mapped, const_cast<unsigned char*>(staging), 0))
          .with_context("expert residency: the experts' pinned staging"));
  out->staging_ = mapped;

  const std::uint64_t all = std::uint64_t{shape.sparse_layers} * shape.experts;
  const std::uint64_t slot_of = aligned(all * 4), count = aligned(all * 8),
                      holder = aligned(std::uint64_t{shape.slots} * 4),
                      copies = aligned(std::uint64_t{shape.experts} * 8),
                      counters = aligned(sizeof(MoeResidencyCounters));
  out->bytes_ = slot_of + 2 * count + holder + copies + counters;
  KVVM_RETURN_IF_ERROR(
      cuda_call("cudaMalloc", cudaMalloc(&out->state_, out->bytes_))
          .with_context("expert residency: " + std::to_string(out->bytes_) + " bytes of state"));
  auto* at = static_cast<unsigned char*>(out->state_);
  out->slot_of_ = reinterpret_cast<std::uint32_t*>(at);
  out->count_ = reinterpret_cast<std::uint64_t*>(at += slot_of);
  out->last_use_ = reinterpret_cast<std::uint64_t*>(at += count);
  out->holder_ = reinterpret_cast<std::uint32_t*>(at += count);
  out->copy_list_ = reinterpret_cast<std::uint32_t*>(at += holder);
  out->counters_ = reinterpret_cast<MoeResidencyCounters*>(at += copies);
  KVVM_RETURN_IF_ERROR(
      cuda_call("cudaHostAlloc", cudaHostAlloc(reinterpret_cast<void**>(&out->mirror_),
                                               sizeof(MoeResidencyCounters), cudaHostAllocMapped)));
  *out->mirror_ = MoeResidencyCounters{};
  void* mirror = nullptr;
  KVVM_RETURN_IF_ERROR(
      cuda_call("cudaHostGetDevicePointer", cudaHostGetDevicePointer(&mirror, out->mirror_, 0)));
  out->mirror_device_ = static_cast<MoeResidencyCounters*>(mirror);

  out->preloaded_.assign(all, kMoeNoSlot);
  std::vector<std::uint32_t> holders(shape.slots);
  for (std::uint32_t slot = 0; slot < shape.slots; ++slot) {
    const std::uint32_t index = preloaded_expert(shape, slot);
    holders[slot] = index;
    out->preloaded_[index] = slot;
    KVVM_RETURN_IF_ERROR(
        cuda_call("cudaMemcpyAsync",
                  cudaMemcpyAsync(reinterpret_cast<void*>(out->slot_address(slot)),
                                  staging + std::uint64_t{index} * shape.expert_bytes,
                                  shape.expert_bytes, cudaMemcpyHostToDevice, s))
            .with_context("expert residency: loading expert " +
                          std::to_string(index % shape.experts) + " of sparse layer " +
                          std::to_string(index / shape.experts) + " into slot " +
                          std::to_string(slot)));
  }
  const MoeResidencyCounters zero{};
  KVVM_RETURN_IF_ERROR(cuda_call("cudaMemsetAsync", cudaMemsetAsync(out->count_, 0, 2 * count, s)));
  KVVM_RETURN_IF_ERROR(cuda_call(
      "cudaMemcpyAsync",
      cudaMemcpyAsync(out->slot_of_, out->preloaded_.data(), all * 4, cudaMemcpyHostToDevice, s)));
  KVVM_RETURN_IF_ERROR(
      cuda_call("cudaMemcpyAsync", cudaMemcpyAsync(out->holder_, holders.data(), holders.size() * 4,
                                                   cudaMemcpyHostToDevice, s)));
  KVVM_RETURN_IF_ERROR(
      cuda_call("cudaMemcpyAsync",
                cudaMemcpyAsync(out->counters_, &zero, sizeof(zero), cudaMemcpyHostToDevice, s)));
  // The host vectors and `zero` are read by the copies above.
  KVVM_RETURN_IF_ERROR(cuda_call("cudaStreamSynchronize", cudaStreamSynchronize(s)));
  return out;
}

DeviceExpertResidency::~DeviceExpertResidency() {
  if (state_ != nullptr) (void)cudaFree(state_);
  if (mirror_ != nullptr) (void)cudaFreeHost(mirror_);
}

Address DeviceExpertResidency::slot_address(std::uint32_t slot) const {
  return reinterpret_cast<Address>(first_slot_) + std::uint64_t{slot} * shape_.expert_bytes;
}

std::optional<std::uint32_t> DeviceExpertResidency::preloaded_slot(std::uint32_t layer,
                                                                   std::uint32_t expert) const {
  const std::uint32_t slot = preloaded_[std::uint64_t{layer} * shape_.experts + expert];
  if (slot == kMoeNoSlot) return std::nullopt;
  return slot;
}

Status DeviceExpertResidency::acquire(std::uint32_t layer, std::uint32_t tokens,
                                      std::uint32_t top_k, const std::int32_t* ids,
                                      std::uint64_t* tables, void* stream) const {
  MoeResidencyParams p;
  p.tokens = tokens;
  p.top_k = top_k;
  p.experts = shape_.experts;
  p.sparse_layers = shape_.sparse_layers;
  p.layer = layer;
  p.slots = shape_.slots;
  p.expert_bytes = shape_.expert_bytes;
  p.decay_every = kDecayAcquires;
  p.ids = ids;
  p.slot_of = slot_of_;
  p.count = count_;
  p.last_use = last_use_;
  p.holder = holder_;
  p.copy_list = copy_list_;
  p.counters = counters_;
  p.mirror = mirror_device_;
  p.first_slot = first_slot_;
  p.staging = staging_;
  p.tables = tables;
  p.gate_up_offset = offsets_.gate_up;
  p.down_offset = offsets_.down;
  p.gate_up_scale_offset =
      offsets_.gate_up_scale == kNoTensor ? kMoeNoOffset : offsets_.gate_up_scale;
  p.down_scale_offset = offsets_.down_scale == kNoTensor ? kMoeNoOffset : offsets_.down_scale;
  return moe_residency_cuda(p, stream).with_context("expert residency of sparse layer " +
                                                    std::to_string(layer));
}

ExpertCacheStats DeviceExpertResidency::stats() const {
  ExpertCacheStats out;
  out.slots = shape_.slots;
  out.experts = std::uint64_t{shape_.sparse_layers} * shape_.experts;
  out.lookups = read_mirrored(mirror_->lookups);
  out.hits = read_mirrored(mirror_->hits);
  out.misses = read_mirrored(mirror_->misses);
  out.bytes_copied = read_mirrored(mirror_->bytes_copied);
  out.copy_seconds = static_cast<double>(read_mirrored(mirror_->copy_ns)) * 1e-9;
  return out;
}

}  // namespace kvvm::model::detail
