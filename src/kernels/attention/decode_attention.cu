// The decode kernel's host launcher: check, plan the split, dispatch run-time sizes to the
// compiled templates, launch, and report the launch's error as a Status.
//
// Why the decode split is planned from max_length and the device, not from the lengths: the
// lengths live in device memory and change between replays of a captured graph, whose grid is
// fixed at capture. Chunks past a sequence's length are empty and weigh nothing in the merge.
#include <algorithm>
#include <string>

#include "kernels/attention/decode.cuh"
#include "kernels/common.cuh"
#include "kernels/launch_support.cuh"
#include "kvvm/kernels/attention.h"

namespace kvvm {
namespace {

using kernels::check_cuda_activations;
using kernels::check_cuda_view;
using kernels::check_pointers;
using kernels::scale_log2;

constexpr std::uint32_t kMinChunkTokens = 256;  // below this a block's fixed costs dominate
constexpr std::uint32_t kMaxChunks = 1024;

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
  return plan;
}

// The split for one compiled kernel: units of work over the device's resident blocks.
template <typename T, std::uint32_t D, bool kFp8>
Result<DecodePlan> plan_for(const DecodeParams& p, std::uint32_t units) {
  using Shape = kernels::DecodeShape<D, kFp8 ? 1 : 2>;
  KVVM_ASSIGN_OR_RETURN(
      kernels::Residency resident,
      kernels::prepare_kernel(reinterpret_cast<const void*>(&kernels::decode_kernel<T, Shape>),
                              Shape::kThreads, Shape::kSharedBytes));
  return choose_split(p, units, Shape::kStep,
                      std::uint64_t(resident.multiprocessors) * resident.blocks_per_multiprocessor);
}

template <typename T, std::uint32_t D, bool kFp8>
Status launch_for(const kernels::DecodeKernelParams& kp, cudaStream_t stream) {
  using Shape = kernels::DecodeShape<D, kFp8 ? 1 : 2>;
  const dim3 grid(kp.chunks, kp.kv_heads * kp.group_tiles, kp.batch);
  return kernels::cuda_status(
      "cudaLaunchKernelEx(decode_kernel)",
      kernels::launch_overlapping(kernels::decode_kernel<T, Shape>, grid, Shape::kThreads,
                                  Shape::kSharedBytes, stream, kp));
}

}  // namespace

Result<DecodePlan> plan_decode_cuda(const DecodeParams& p) {
  KVVM_RETURN_IF_ERROR(check_decode(p));
  KVVM_RETURN_IF_ERROR(check_cuda_view(p.view, "decode"));
  KVVM_RETURN_IF_ERROR(check_cuda_activations(p.view, p.activations, "decode"));
  const std::uint32_t group = p.qo_heads / p.kv_heads;
  const std::uint32_t tiles = (group + kernels::kDecodeHeads - 1) / kernels::kDecodeHeads;
  const std::uint32_t units = p.batch * p.kv_heads * tiles;
  DecodePlan planned;
  KVVM_DISPATCH_ACCESS(p.view.element, p.activations, T, FP8,
                       {KVVM_DISPATCH_HEAD_DIM(p.view.head_dim, D, {
                         KVVM_ASSIGN_OR_RETURN(DecodePlan made, (plan_for<T, D, FP8>(p, units)));
                         planned = made;
                       })})
  if (planned.chunks > kMaxChunks) {
    return Status::InvalidArgument("decode: chunks of " + str(planned.chunk_tokens) +
                                   " tokens split max_length " + str(p.max_length) + " into " +
                                   str(planned.chunks) + " chunks, at most " + str(kMaxChunks));
  }
  if (planned.chunks > 1) {
    const std::uint64_t rows = std::uint64_t{p.batch} * p.qo_heads * planned.chunks;
    const std::uint64_t out_bytes = (rows * p.view.head_dim * sizeof(float) + 15) / 16 * 16;
    const std::uint64_t lse_bytes = (rows * sizeof(float) + 15) / 16 * 16;
    planned.counter_bytes = (std::uint64_t{units} * 4 + 15) / 16 * 16;
    planned.workspace_bytes = out_bytes + lse_bytes + planned.counter_bytes;
  }
  return planned;
}

Status decode_attention_cuda(const DecodeParams& p, void* workspace, std::size_t workspace_bytes,
                             void* stream) {
  KVVM_ASSIGN_OR_RETURN(DecodePlan plan, plan_decode_cuda(p));
  KVVM_RETURN_IF_ERROR(check_pointers({{p.q, "q"}, {p.out, "out"}}, "decode"));
  if (p.batch == 0) return Status::Ok();
  if (p.batch > 65535) {
    return Status::InvalidArgument("decode: batch of " + str(p.batch) +
                                   " sequences, at most 65535 per launch");
  }
  if (plan.workspace_bytes > workspace_bytes || (plan.chunks > 1 && workspace == nullptr)) {
    return Status::InvalidArgument("decode: the split into " + str(plan.chunks) + " chunks of " +
                                   str(plan.chunk_tokens) + " tokens needs " +
                                   str(plan.workspace_bytes) + " bytes of workspace, got " +
                                   str(workspace_bytes));
  }
  if (plan.chunks > 1) KVVM_RETURN_IF_ERROR(check_pointers({{workspace, "workspace"}}, "decode"));
  const std::uint32_t group = p.qo_heads / p.kv_heads;
  kernels::DecodeKernelParams kp(p);
  kp.group = group;
  kp.group_tiles = (group + kernels::kDecodeHeads - 1) / kernels::kDecodeHeads;
  // An e4m3 cache's K scale multiplies every score (the stored K is read as it is); per-head
  // scales are multiplied in by the kernel.
  const bool layer_scale = p.view.element == DType::kFp8 && p.head_scales.k == nullptr;
  kp.scale_log2 = scale_log2(p.sm_scale, p.view.head_dim) * (layer_scale ? p.k_scale : 1.0f);
  kp.chunk_tokens = plan.chunk_tokens;
  kp.chunks = plan.chunks;
  if (plan.chunks > 1) {
    const std::uint64_t rows = std::uint64_t{p.batch} * p.qo_heads * plan.chunks;
    const std::uint64_t out_bytes = (rows * p.view.head_dim * sizeof(float) + 15) / 16 * 16;
    auto* bytes = static_cast<unsigned char*>(workspace);
    kp.partial_out = reinterpret_cast<float*>(bytes);
    kp.partial_lse = reinterpret_cast<float*>(bytes + out_bytes);
    // The counters sit at the end of the buffer as given, so every plan that fits in it uses
    // the same counter addresses, which no plan's partials reach.
    kp.counters = reinterpret_cast<std::uint32_t*>(bytes + workspace_bytes / 4 * 4);
  }
  auto* cuda_stream = static_cast<cudaStream_t>(stream);
  KVVM_DISPATCH_ACCESS(p.view.element, p.activations, T, FP8,
                       {KVVM_DISPATCH_HEAD_DIM(p.view.head_dim, D, {
                         KVVM_RETURN_IF_ERROR((launch_for<T, D, FP8>(kp, cuda_stream)));
                       })})
  return Status::Ok();
}

}  // namespace kvvm
