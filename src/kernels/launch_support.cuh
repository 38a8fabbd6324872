// What every host launcher of the attention kernels shares: checks that name the bad value,
// the launch's error as a Status, the softmax scale, and a kernel's residency on the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "base/format.h"
#include "kvvm/base/status.h"
#include "kvvm/kv/kv_view.h"

namespace kvvm::kernels {

// InvalidArgument unless the view is fp16 / bf16 / fp8, head dim 64 / 128, and every stride
// and the base are multiples of 16 bytes (the kernels load 16 bytes at a time).
Status check_cuda_view(const KvView& view, const char* what);
// InvalidArgument unless the call's activations (activations_of) are fp16 or bf16.
Status check_cuda_activations(const KvView& view, DType activations, const char* what);
// InvalidArgument naming the first pointer that is not 16-byte aligned.
Status check_pointers(std::initializer_list<std::pair<const void*, const char*>> pointers,
                      const char* what);
// The last launch's error (cudaGetLastError) as a Status naming the kernel.
Status last_launch(const char* kernel);
// sm_scale (0: 1 / sqrt(head_dim)) times log2(e): the kernels' softmax runs on exp2.
float scale_log2(float sm_scale, std::uint32_t head_dim);

// A kernel as launched on the current device: its dynamic shared-memory limit raised to
// `shared` bytes (once per device and kernel), the device's multiprocessors and how many
// blocks of `threads` threads and `shared` bytes stay resident on one. Cached: the decode
// planner runs on every call.
struct Residency {
  int multiprocessors = 0;
  int blocks_per_multiprocessor = 0;
};
Result<Residency> prepare_kernel(const void* kernel, int threads, std::size_t shared);

}  // namespace kvvm::kernels
