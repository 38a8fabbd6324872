// The append kernels' host launchers (plain, and with RoPE fused), and whether this build has the
// CUDA kernels.
#include <string>

#include "kernels/attention/append.cuh"
#include "kernels/common.cuh"
#include "kernels/launch_support.cuh"
#include "kernels/model/rope_append.cuh"
#include "kvvm/kernels/attention.h"

namespace kvvm {

using kernels::check_cuda_activations;
using kernels::check_cuda_view;
using kernels::check_pointers;
using kernels::last_launch;

bool attention_kernels_built() { return true; }

Status append_kv_cuda(const AppendParams& p, void* stream) {
  KVVM_RETURN_IF_ERROR(check_append(p));
  KVVM_RETURN_IF_ERROR(check_cuda_view(p.view, "append"));
  KVVM_RETURN_IF_ERROR(check_cuda_activations(p.view, p.activations, "append"));
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
  KVVM_DISPATCH_ACCESS(p.view.element, p.activations, T, FP8, {
    kernels::append_kernel<T, FP8><<<static_cast<unsigned>(blocks), kernels::kAppendThreads, 0,
                                     static_cast<cudaStream_t>(stream)>>>(kp);
  })
  return last_launch("append_kernel<<<>>>");
}

Status rope_append_kv_cuda(const RopeAppendParams& p, void* stream) {
  const AppendParams& a = p.append;
  if (a.k != nullptr || a.v != nullptr) {
    return Status::InvalidArgument(
        "rope_append: k and v come from qkv; append.k / .v must be null");
  }
  AppendParams checked = a;  // check_append asks for the sources this call reads from qkv
  checked.k = checked.v = p.qkv;
  KVVM_RETURN_IF_ERROR(check_append(checked));
  KVVM_RETURN_IF_ERROR(check_cuda_view(a.view, "rope_append"));
  KVVM_RETURN_IF_ERROR(check_cuda_activations(a.view, a.activations, "rope_append"));
  KVVM_RETURN_IF_ERROR(check_heads(p.qo_heads, a.kv_heads, "rope_append"));
  KVVM_RETURN_IF_ERROR(check_pointers(
      {{p.qkv, "qkv"}, {p.q_out, "q_out"}, {p.inv_freq, "inv_freq"}}, "rope_append"));
  if ((p.k_out == nullptr) != (p.v_out == nullptr)) {
    return Status::InvalidArgument("rope_append: give both k_out and v_out or neither");
  }
  if (a.tokens == 0) return Status::Ok();
  const std::uint32_t pairs = (p.qo_heads + 2 * a.kv_heads) * (a.view.head_dim / 2);
  const std::uint32_t blocks_per_token =
      (pairs + kernels::kRopeAppendThreads - 1) / kernels::kRopeAppendThreads;
  cudaError_t launched = cudaSuccess;
  KVVM_DISPATCH_ACCESS(a.view.element, a.activations, T, FP8, {
    launched = kernels::launch_overlapping(
        kernels::rope_append_kernel<T, FP8>, dim3(a.tokens, blocks_per_token),
        kernels::kRopeAppendThreads, 0, static_cast<cudaStream_t>(stream), p);
  })
  return kernels::cuda_status("cudaLaunchKernelEx(rope_append_kernel)", launched);
}

}  // namespace kvvm
