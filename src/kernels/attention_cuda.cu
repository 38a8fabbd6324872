// Host launchers of the CUDA attention kernels: check, plan, dispatch run-time sizes to the
// compiled templates, launch, and report the launch's error as a Status.
//
// Why the decode split is planned from max_length and the device, not from the lengths: the
// lengths live in device memory and change between replays of a captured graph, whose grid is
// fixed at capture. Chunks past a sequence's length are empty and weigh nothing in the merge.
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "kernels/append.cuh"
#include "kernels/common.cuh"
#include "kernels/decode.cuh"
#include "kernels/prefill.cuh"
#include "kvvm/attention.h"

namespace kvvm {
namespace {

using kernels::cuda_status;

constexpr std::uint32_t kMinChunkTokens = 256;  // below this a block's fixed costs dominate
constexpr std::uint32_t kMaxChunks = 1024;
constexpr float kLog2e = 1.4426950408889634f;

std::string str(std::uint64_t value) { return std::to_string(value); }

bool aligned16(std::uint64_t value) { return value % 16 == 0; }
bool aligned16(const void* pointer) { return aligned16(reinterpret_cast<std::uintptr_t>(pointer)); }

Status check_cuda_view(const KvView& view, const char* what) {
  if (view.element != DType::kFp16 && view.element != DType::kBf16) {
    return Status::InvalidArgument(std::string(what) + ": element type " +
                                   str(static_cast<std::uint32_t>(view.element)) +
                                   " is not supported by the CUDA attention kernels (fp16, bf16)");
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

// Resident blocks of a kernel on the current device, and its multiprocessors; cached (the
// planner runs on every decode call).
Result<std::pair<int, int>> residency(const void* kernel, int threads, std::size_t shared) {
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, std::pair<int, int>> cache;
  int device = 0;
  KVVM_RETURN_IF_ERROR(cuda_status("cudaGetDevice", cudaGetDevice(&device)));
  std::lock_guard lock(mutex);
  auto found = cache.find({device, kernel});
  if (found != cache.end()) return found->second;
  int sms = 0, blocks = 0;
  KVVM_RETURN_IF_ERROR(
      cuda_status("cudaDeviceGetAttribute",
                  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)));
  KVVM_RETURN_IF_ERROR(
      cuda_status("cudaOccupancyMaxActiveBlocksPerMultiprocessor",
                  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, shared)));
  const std::pair<int, int> result{sms, std::max(blocks, 1)};
  cache[{device, kernel}] = result;
  return result;
}

// Picks the chunk count whose estimated time, waves x (chunk + block overhead), is least:
// one wave of long chunks beats two of half-length ones only when it fills the device.
DecodePlan choose_split(const DecodeParams& p, std::uint32_t units, std::uint32_t step,
                        std::uint64_t slots) {
  DecodePlan plan;
  const std::uint32_t max_length = p.max_length;
  auto chunks_for = [&](std::uint32_t chunk) { return (max_length + chunk - 1) / chunk; };
  if (p.chunk_tokens != 0) {
    plan.chunk_tokens = p.chunk_tokens;
  } else {
    const std::uint32_t most =
        std::clamp<std::uint32_t>(max_length / kMinChunkTokens, 1, kMaxChunks);
    double best = 0;
    for (std::uint32_t c = 1; c <= most; ++c) {
      std::uint32_t chunk = (max_length + c - 1) / c;
      chunk = (chunk + step - 1) / step * step;
      const std::uint64_t blocks = std::uint64_t{units} * chunks_for(chunk);
      const std::uint64_t waves = (blocks + slots - 1) / slots;
      const double cost = static_cast<double>(waves) * (chunk + 2.0 * step) +
                          (chunks_for(chunk) > 1 ? 4.0 * step : 0.0);
      if (plan.chunk_tokens == 0 || cost < best) {
        best = cost;
        plan.chunk_tokens = chunk;
      }
    }
  }
  plan.chunks = chunks_for(plan.chunk_tokens);  // <= kMaxChunks: checked by the caller
  if (plan.chunks > 1) {
    const std::uint64_t rows = std::uint64_t{p.batch} * p.qo_heads * plan.chunks;
    const std::uint64_t out_bytes = rows * p.view.head_dim * sizeof(float);
    plan.workspace_bytes = (out_bytes + 15) / 16 * 16 + rows * sizeof(float);
  }
  return plan;
}

}  // namespace

bool attention_kernels_built() { return true; }

Status append_kv_cuda(const AppendParams& p, void* stream) {
  KVVM_RETURN_IF_ERROR(check_append(p));
  KVVM_RETURN_IF_ERROR(check_cuda_view(p.view, "append"));
  KVVM_RETURN_IF_ERROR(check_pointers({{p.k, "k"}, {p.v, "v"}}, "append"));
  if (p.tokens == 0) return Status::Ok();
  kernels::AppendKernelParams kp(p);
  kp.vectors_per_row = p.view.head_dim * p.view.element_bytes / 16;
  const std::uint64_t vectors = std::uint64_t{p.tokens} * p.kv_heads * 2 * kp.vectors_per_row;
  const std::uint64_t blocks = (vectors + kernels::kAppendThreads - 1) / kernels::kAppendThreads;
  if (blocks > 0x7fffffffu) {
    return Status::InvalidArgument("append: " + str(p.tokens) + " rows need " + str(blocks) +
                                   " blocks, more than one launch takes");
  }
  kernels::append_kernel<<<static_cast<unsigned>(blocks), kernels::kAppendThreads, 0,
                           static_cast<cudaStream_t>(stream)>>>(kp);
  return last_launch("append_kernel<<<>>>");
}

Result<DecodePlan> plan_decode_cuda(const DecodeParams& p) {
  KVVM_RETURN_IF_ERROR(check_decode(p));
  KVVM_RETURN_IF_ERROR(check_cuda_view(p.view, "decode"));
  const std::uint32_t group = p.qo_heads / p.kv_heads;
  DecodePlan planned;
  KVVM_DISPATCH_ELEMENT(
      p.view.element, T,
      {KVVM_DISPATCH_HEAD_DIM(
          p.view.head_dim, D, {KVVM_DISPATCH_GROUP_TILE(group, G, {
            auto* kernel = &kernels::decode_kernel<T, D, G>;
            constexpr std::uint32_t kShared = kernels::DecodeShape<D, G>::kSharedBytes;
            KVVM_RETURN_IF_ERROR(
                cuda_status("cudaFuncSetAttribute",
                            cudaFuncSetAttribute(
                                kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kShared)));
            Result<std::pair<int, int>> resident =
                residency(reinterpret_cast<const void*>(kernel), kernels::kDecodeThreads, kShared);
            if (!resident.ok()) return resident.status();
            const std::uint32_t tiles = (group + G - 1) / G;
            planned =
                choose_split(p, p.batch * p.kv_heads * tiles, kernels::DecodeShape<D, G>::kStep,
                             std::uint64_t(resident->first) * resident->second);
          })})})
  if (planned.chunks > kMaxChunks) {
    return Status::InvalidArgument("decode: chunks of " + str(planned.chunk_tokens) +
                                   " tokens split max_length " + str(p.max_length) + " into " +
                                   str(planned.chunks) + " chunks, at most " + str(kMaxChunks));
  }
  return planned;
}

Status decode_attention_cuda(const DecodeParams& p, void* workspace, std::size_t workspace_bytes,
                             void* stream) {
  Result<DecodePlan> plan = plan_decode_cuda(p);
  if (!plan.ok()) return plan.status();
  KVVM_RETURN_IF_ERROR(check_pointers({{p.q, "q"}, {p.out, "out"}}, "decode"));
  if (p.batch == 0) return Status::Ok();
  if (p.batch > 65535) {
    return Status::InvalidArgument("decode: batch of " + str(p.batch) +
                                   " sequences, at most 65535 per launch");
  }
  if (plan->workspace_bytes > workspace_bytes || (plan->chunks > 1 && workspace == nullptr)) {
    return Status::InvalidArgument("decode: the split into " + str(plan->chunks) + " chunks of " +
                                   str(plan->chunk_tokens) + " tokens needs " +
                                   str(plan->workspace_bytes) + " bytes of workspace, got " +
                                   str(workspace_bytes));
  }
  const std::uint32_t group = p.qo_heads / p.kv_heads;
  kernels::DecodeKernelParams kp(p);
  kp.group = group;
  kp.scale_log2 = scale_log2(p.sm_scale, p.view.head_dim);
  kp.chunk_tokens = plan->chunk_tokens;
  kp.chunks = plan->chunks;
  if (plan->chunks > 1) {
    const std::uint64_t rows = std::uint64_t{p.batch} * p.qo_heads * plan->chunks;
    const std::uint64_t out_bytes = (rows * p.view.head_dim * sizeof(float) + 15) / 16 * 16;
    kp.partial_out = static_cast<float*>(workspace);
    kp.partial_lse = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + out_bytes);
  }
  auto* cuda_stream = static_cast<cudaStream_t>(stream);
  KVVM_DISPATCH_ELEMENT(
      p.view.element, T,
      {KVVM_DISPATCH_HEAD_DIM(
          p.view.head_dim, D, {KVVM_DISPATCH_GROUP_TILE(group, G, {
            kp.group_tiles = (group + G - 1) / G;
            const dim3 grid(plan->chunks, p.kv_heads * kp.group_tiles, p.batch);
            kernels::decode_kernel<T, D, G>
                <<<grid, kernels::kDecodeThreads, kernels::DecodeShape<D, G>::kSharedBytes,
                   cuda_stream>>>(kp);
            KVVM_RETURN_IF_ERROR(last_launch("decode_kernel<<<>>>"));
            if (plan->chunks > 1) {
              kernels::decode_merge_kernel<T, D>
                  <<<dim3(p.qo_heads, p.batch), D, plan->chunks * sizeof(float), cuda_stream>>>(kp);
              KVVM_RETURN_IF_ERROR(last_launch("decode_merge_kernel<<<>>>"));
            }
          })})})
  return Status::Ok();
}

Status prefill_attention_cuda(const PrefillParams& p, void* stream) {
  KVVM_RETURN_IF_ERROR(check_prefill(p));
  KVVM_RETURN_IF_ERROR(check_cuda_view(p.view, "prefill"));
  KVVM_RETURN_IF_ERROR(check_pointers({{p.q, "q"}, {p.out, "out"}}, "prefill"));
  if (p.tokens == 0) return Status::Ok();
  const std::uint32_t group = p.qo_heads / p.kv_heads;
  kernels::PrefillKernelParams kp(p);
  kp.group = group;
  kp.scale_log2 = scale_log2(p.sm_scale, p.view.head_dim);
  auto* cuda_stream = static_cast<cudaStream_t>(stream);
  KVVM_DISPATCH_ELEMENT(
      p.view.element, T,
      {KVVM_DISPATCH_HEAD_DIM(
          p.view.head_dim, D, {KVVM_DISPATCH_GROUP_TILE(group, G, {
            kp.group_tiles = (group + G - 1) / G;
            constexpr std::uint32_t kQ = kernels::kPrefillRows / G;
            constexpr std::uint32_t kBytes = kernels::prefill_shared_bytes<D>();
            auto* kernel = &kernels::prefill_kernel<T, D, G>;
            KVVM_RETURN_IF_ERROR(cuda_status(
                "cudaFuncSetAttribute",
                cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes)));
            const dim3 grid((p.tokens + kQ - 1) / kQ, p.kv_heads * kp.group_tiles);
            kernel<<<grid, kernels::kPrefillThreads, kBytes, cuda_stream>>>(kp);
            KVVM_RETURN_IF_ERROR(last_launch("prefill_kernel<<<>>>"));
          })})})
  return Status::Ok();
}

}  // namespace kvvm
