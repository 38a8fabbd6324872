// Host-side helpers of the attention launchers (launch_support.cuh), and the switch between
// overlapped and in-order launches (kvvm/kernels/model_kernels.h).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>

#include "kernels/common.cuh"
#include "kernels/launch_support.cuh"
#include "kvvm/kernels/attention.h"

namespace kvvm::kernels {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

bool aligned16(std::uint64_t value) { return value % 16 == 0; }
bool aligned16(const void* pointer) { return aligned16(reinterpret_cast<std::uintptr_t>(pointer)); }

}  // namespace

Status check_cuda_view(const KvView& view, const char* what) {
  if (view.element != DType::kFp16 && view.element != DType::kBf16 && view.element != DType::kFp8) {
    return Status::InvalidArgument(std::string(what) + ": element type " +
                                   str(static_cast<std::uint32_t>(view.element)) +
                                   " is not supported by the CUDA attention kernels (fp16, bf16, "
                                   "fp8)");
  }
  if (view.head_dim != 64 && view.head_dim != 128) {
    return Status::InvalidArgument(std::string(what) + ": head dim " + str(view.head_dim) +
                                   " is not supported by the CUDA attention kernels (compiled "
                                   "for 64 and 128)");
  }
  const std::uint64_t values[] = {view.base,      view.slot_stride, view.layer_stride,
                                  view.kv_stride, view.head_stride, view.token_stride};
  const char* names[] = {"base",       "slot stride", "layer stride",
                         "K/V stride", "head stride", "token stride"};
  for (int i = 0; i < 6; ++i) {
    if (!aligned16(values[i])) {
      return Status::InvalidArgument(std::string(what) + ": the KvView's " + names[i] + " (" +
                                     str(values[i]) +
                                     ") is not a multiple of 16 bytes; the kernels load 16 bytes "
                                     "at a time");
    }
  }
  return Status::Ok();
}

Status check_cuda_activations(const KvView& view, DType activations, const char* what) {
  const DType type = activations_of(view, activations);
  if (type != DType::kFp16 && type != DType::kBf16) {
    return Status::InvalidArgument(std::string(what) + ": activations in " +
                                   std::string(to_string(type)) +
                                   "; the CUDA attention kernels take fp16 or bf16");
  }
  return Status::Ok();
}

Status check_pointers(std::initializer_list<std::pair<const void*, const char*>> pointers,
                      const char* what) {
  for (const auto& [pointer, name] : pointers) {
    if (!aligned16(pointer)) {
      return Status::InvalidArgument(std::string(what) + ": " + name +
                                     " is not 16-byte aligned (address " +
                                     str(reinterpret_cast<std::uintptr_t>(pointer)) + ")");
    }
  }
  return Status::Ok();
}

Status last_launch(const char* kernel) { return cuda_status(kernel, cudaGetLastError()); }

float scale_log2(float sm_scale, std::uint32_t head_dim) {
  const float scale = sm_scale != 0 ? sm_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  return scale * kLog2e;
}

Result<Residency> prepare_kernel(const void* kernel, int threads, std::size_t shared) {
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, Residency> cache;
  int device = 0;
  KVVM_RETURN_IF_ERROR(cuda_status("cudaGetDevice", cudaGetDevice(&device)));
  std::lock_guard lock(mutex);
  auto found = cache.find({device, kernel});
  if (found != cache.end()) return found->second;
  // The kernels are sized for Hopper's 227 KiB per block; say so instead of the driver's
  // "invalid argument" on a device with less.
  int most = 0;
  KVVM_RETURN_IF_ERROR(
      cuda_status("cudaDeviceGetAttribute",
                  cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device)));
  if (shared > static_cast<std::size_t>(most)) {
    return Status::Unavailable("an attention kernel needs " + str(shared) +
                               " bytes of shared memory per block; device " + str(device) +
                               " allows " + str(most) + " (the kernels are sized for sm_90)");
  }
  KVVM_RETURN_IF_ERROR(
      cuda_status("cudaFuncSetAttribute",
                  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(shared))));
  Residency result;
  int blocks = 0;
  KVVM_RETURN_IF_ERROR(cuda_status(
      "cudaDeviceGetAttribute",
      cudaDeviceGetAttribute(&result.multiprocessors, cudaDevAttrMultiProcessorCount, device)));
  KVVM_RETURN_IF_ERROR(
      cuda_status("cudaOccupancyMaxActiveBlocksPerMultiprocessor",
                  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, shared)));
  result.blocks_per_multiprocessor = std::max(blocks, 1);
  cache[{device, kernel}] = result;
  return result;
}

}  // namespace kvvm::kernels

namespace kvvm {
namespace {

std::atomic<bool> overlapped{true};

}  // namespace

void set_overlapped_launches(bool on) { overlapped.store(on, std::memory_order_relaxed); }
bool overlapped_launches() { return overlapped.load(std::memory_order_relaxed); }

}  // namespace kvvm
