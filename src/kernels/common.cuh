// Pieces every kernel uses: conversion to and from float, 16-byte cp.async copies, and the
// dispatch macros that turn run-time sizes into compile-time constants.
//
// Why 16-byte copies: HOPPER.md's first habit for memory-bound code; one copy per lane moves
// 8 fp16 / bf16 elements, and a warp moves 512 contiguous bytes of head rows.
// Compiled as C++17 (CMake 3.25 has no CUDA 20 flag).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "kvvm/base/status.h"
#include "kvvm/kernels/model_kernels.h"

namespace kvvm::kernels {

constexpr float kNegInf = -__builtin_huge_valf();

template <typename T>
__device__ __forceinline__ T from_float(float value);
template <>
__device__ __forceinline__ __half from_float<__half>(float value) {
  return __float2half_rn(value);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float value) {
  return __float2bfloat16_rn(value);
}

template <typename T>
__device__ __forceinline__ float to_float(T value);
template <>
__device__ __forceinline__ float to_float<__half>(__half value) {
  return __half2float(value);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 value) {
  return __bfloat162float(value);
}

// Rounds to T and back: the value a torch tensor of type T holds after an op.
template <typename T>
__device__ __forceinline__ float rounded(float value) {
  return to_float<T>(from_float<T>(value));
}

// Programmatic dependent launch (sm_90). A kernel launched with programmatic stream
// serialization may start before the kernel ahead of it on the stream has finished; it must
// call wait_for_previous_kernel before it reads that kernel's output or writes what that kernel
// reads (a no-op in a kernel launched without the attribute). allow_next_kernel_to_start lets
// such a dependent be scheduled before this kernel's blocks exit (a no-op when none follows):
// a short kernel says so at its start, so the next one's blocks fill the idle SMs and start
// their independent reads (a GEMV's weights) meanwhile.
__device__ __forceinline__ void wait_for_previous_kernel() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ __forceinline__ void allow_next_kernel_to_start() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Reads bytes the previous kernel wrote, in a kernel launched overlapping it (below): a coherent
// load (ld.global.ca). __ldg's non-coherent path (ld.global.nc) is only for bytes no kernel
// writes while this one runs, which an overlapping launch breaks: its line may be stale, and
// ptxas may move the load above wait_for_previous_kernel. Weights, written before any step,
// keep __ldg / __ldcs.
template <typename V>
__device__ __forceinline__ V load_previous_output(const V* address) {
  return __ldca(address);
}

// Launches `kernel` on `stream` with programmatic stream serialization (above), unless
// set_overlapped_launches(false): its grid may start while the previous kernel's last blocks
// run. Such a kernel reads the previous kernel's output after wait_for_previous_kernel, through
// load_previous_output or a plain load, writes nothing before it, and calls it in every block
// (so its completion implies its predecessor's, and a chain of such kernels stays ordered).
template <typename... Params, typename... Args>
cudaError_t launch_overlapping(void (*kernel)(Params...), dim3 grid, unsigned threads,
                               std::size_t shared, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  cudaLaunchAttribute overlap[1];
  overlap[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = overlap;
  config.numAttrs = overlapped_launches() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// cp.async (sm_80+): a 16-byte global-to-shared copy that does not hold registers while in
// flight; `live` false copies nothing and zero-fills the destination.
// kL2Prefetch (0 or 128): with 128 the L2 fetches the whole 128-byte block around the copy
// from DRAM, so a stream of rows costs fewer, larger DRAM requests (256 measured slower:
// docs/PERFORMANCE.md, "Decode kernel: variants").
template <int kL2Prefetch = 0>
__device__ __forceinline__ void copy_async_16(void* shared, const void* global, bool live) {
  static_assert(kL2Prefetch == 0 || kL2Prefetch == 128, "prefetch hint: 0 or 128 bytes");
  const unsigned destination = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  const int source_bytes = live ? 16 : 0;
  if constexpr (kL2Prefetch == 128) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(destination),
                 "l"(global), "r"(source_bytes)
                 : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(destination), "l"(global),
                 "r"(source_bytes)
                 : "memory");
  }
}
__device__ __forceinline__ void copy_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

inline Status cuda_status(const char* call, cudaError_t error) {
  if (error == cudaSuccess) return Status::Ok();
  return Status::DriverError(std::string(call) + " failed: " + cudaGetErrorString(error),
                             DriverFailure{call, cudaGetErrorName(error), static_cast<int>(error)});
}

}  // namespace kvvm::kernels

// Runs the statements with HEAD_DIM a compile-time 64 or 128; any other head dim returns
// InvalidArgument from the enclosing function (a Status-returning host launcher).
#define KVVM_DISPATCH_HEAD_DIM(head_dim, HEAD_DIM, ...)                                         \
  switch (head_dim) {                                                                           \
    case 64: {                                                                                  \
      constexpr std::uint32_t HEAD_DIM = 64;                                                    \
      __VA_ARGS__                                                                               \
      break;                                                                                    \
    }                                                                                           \
    case 128: {                                                                                 \
      constexpr std::uint32_t HEAD_DIM = 128;                                                   \
      __VA_ARGS__                                                                               \
      break;                                                                                    \
    }                                                                                           \
    default:                                                                                    \
      return ::kvvm::Status::InvalidArgument(                                                   \
          "head dim " + std::to_string(head_dim) +                                              \
          " is not supported by the CUDA attention kernels (compiled for 64 and 128); use the " \
          "CPU path or add the size to KVVM_DISPATCH_HEAD_DIM");                                \
  }

// Element type of the view to the CUDA type T (fp16 -> __half, bf16 -> __nv_bfloat16).
#define KVVM_DISPATCH_ELEMENT(element, T, ...)                                    \
  switch (element) {                                                              \
    case ::kvvm::DType::kFp16: {                                                  \
      using T = __half;                                                           \
      __VA_ARGS__                                                                 \
      break;                                                                      \
    }                                                                             \
    case ::kvvm::DType::kBf16: {                                                  \
      using T = __nv_bfloat16;                                                    \
      __VA_ARGS__                                                                 \
      break;                                                                      \
    }                                                                             \
    default:                                                                      \
      return ::kvvm::Status::InvalidArgument(                                     \
          "element type " + std::to_string(static_cast<std::uint32_t>(element)) + \
          " is not supported by the CUDA attention kernels (fp16 and bf16)");     \
  }

// The view's element type and the activations' to a CUDA type T (the activations': fp16 ->
// __half, bf16 -> __nv_bfloat16) and a compile-time FP8 (the cache holds e4m3). An fp8 cache
// names its activations; a 16-bit one takes its own type (check_activations refused others).
#define KVVM_DISPATCH_ACCESS(element, activations, T, FP8, ...) \
  if ((element) == ::kvvm::DType::kFp8) {                       \
    constexpr bool FP8 = true;                                  \
    KVVM_DISPATCH_ELEMENT(activations, T, __VA_ARGS__)          \
  } else {                                                      \
    constexpr bool FP8 = false;                                 \
    KVVM_DISPATCH_ELEMENT(element, T, __VA_ARGS__)              \
  }
