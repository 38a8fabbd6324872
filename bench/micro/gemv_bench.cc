// The decode step's GEMVs against the memory's rate, one process, one GPU: for the projections
// of Qwen2.5-0.5B, Llama-3-8B and Llama-3-70B (q|k|v, o, gate|up, down; lm_head in bf16), at
// one and two rows,
//   copy        cudaMemcpyAsync of the weights' bytes, device to device: the rate (bytes read
//               plus bytes written over the time) a pure stream reaches on this GPU
//   gemv-bf16   gemv_cuda on bf16 weights
//   fp8-blk     fp8_gemv_cuda, 128x128 block scales;  fp8-chn: per-channel scales
//   mma-blk     fp8_gemv_cuda's tensor-core form (quantized activations), block scales, at one,
//               two and eight rows;  mma-chn: per-channel scales
// each with the split (warps per output) and unroll (vectors in flight per lane) the kernel
// chooses, and with every split x unroll forced: the table says which is fastest and what the
// choice gives, as the weights' bytes over the time and as a share of the copy's rate. Each
// call reads a different copy of the weights (together over twice the L2).
// Usage: gemv_bench [milliseconds per figure, default 20] [every: also print every variant].
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_timing.h"
#include "kernels/element.h"
#include "kvvm/kernels/fp8_kernels.h"
#include "kvvm/kernels/model_kernels.h"

namespace {

using kvvm::DType;
using kvvm::Fp8Scales;
using kvvm::bench::check;
using kvvm::bench::Copies;
using kvvm::bench::device;
using kvvm::bench::time_us;

struct Shape {
  const char* model;
  const char* name;
  std::uint32_t in, out;
  bool fp8;  // quantized in an FP8 checkpoint (lm_head stays bf16)
};

// A matrix of `bytes`, no zeros: a random 1 MiB pattern repeated.
std::vector<std::uint8_t> pattern(std::uint64_t bytes, bool fp8) {
  std::vector<std::uint8_t> tile(std::uint64_t{1} << 20);
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  for (std::uint64_t i = 0; i < tile.size(); i += 2) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const float value = static_cast<float>((state >> 40) % 2001) / 1000.0f - 1.0f;
    if (fp8) {
      tile[i] = kvvm::kernels::float_to_e4m3(value * 400.0f);
      tile[i + 1] = kvvm::kernels::float_to_e4m3(-value * 300.0f);
    } else {
      kvvm::kernels::store_element(DType::kBf16, value * 0.02f, &tile[i]);
    }
  }
  std::vector<std::uint8_t> out(bytes);
  for (std::uint64_t at = 0; at < bytes; at += tile.size()) {
    std::memcpy(&out[at], tile.data(), std::min<std::uint64_t>(tile.size(), bytes - at));
  }
  return out;
}

struct Variant {
  std::uint32_t split, unroll;  // 0: the kernel's choice
};

}  // namespace

int main(int argc, char** argv) {
  const double budget_ms = argc > 1 ? std::atof(argv[1]) : 20.0;
  const bool every = argc > 2 && std::string(argv[2]) == "every";
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    kvvm::bench::die("gemv_bench", "no CUDA device");
  }
  cudaDeviceProp props{};
  check(cudaGetDeviceProperties(&props, 0), "cudaGetDeviceProperties");
  std::printf("gemv_bench on %s (%d SMs, L2 %d MiB), %.0f ms per figure\n", props.name,
              props.multiProcessorCount, props.l2CacheSize >> 20, budget_ms);
  const std::uint64_t l2 = static_cast<std::uint64_t>(props.l2CacheSize);
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  const Shape shapes[] = {
      {"0.5b", "qkv", 896, 1152, true},        {"0.5b", "o", 896, 896, true},
      {"0.5b", "gate_up", 896, 9728, true},    {"0.5b", "down", 4864, 896, true},
      {"0.5b", "lm_head", 896, 151936, false}, {"8b", "qkv", 4096, 6144, true},
      {"8b", "o", 4096, 4096, true},           {"8b", "gate_up", 4096, 28672, true},
      {"8b", "down", 14336, 4096, true},       {"8b", "lm_head", 4096, 128256, false},
      {"70b", "qkv", 8192, 10240, true},       {"70b", "o", 8192, 8192, true},
      {"70b", "gate_up", 8192, 57344, true},   {"70b", "down", 28672, 8192, true},
      {"70b", "lm_head", 8192, 128256, false},
  };
  std::vector<Variant> variants = {{0, 0}};
  for (const std::uint32_t split : {1u, 2u, 4u, 8u}) {
    for (const std::uint32_t unroll : {4u, 8u}) variants.push_back({split, unroll});
  }

  // x for two rows of the deepest input (and 8 rows quantized), y for 8 rows of the widest
  // output, float scales.
  const std::uint32_t deepest = 28672, widest = 151936, quantized_rows = kvvm::kFp8MmaGemvRows;
  std::vector<std::uint8_t> x_host(std::uint64_t{2} * deepest * 2);
  for (std::uint64_t i = 0; i < x_host.size() / 2; ++i) {
    kvvm::kernels::store_element(DType::kBf16,
                                 static_cast<float>((i * 2654435761u) % 2001) / 1000.0f - 1.0f,
                                 &x_host[i * 2]);
  }
  void* x = device(x_host.size());
  check(cudaMemcpy(x, x_host.data(), x_host.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  std::vector<std::uint8_t> xq_host(std::uint64_t{quantized_rows} * deepest);
  for (std::uint64_t i = 0; i < xq_host.size(); ++i) {
    xq_host[i] = kvvm::kernels::float_to_e4m3(static_cast<float>((i * 2654435761u) % 801) - 400.0f);
  }
  void* xq = device(xq_host.size());
  check(cudaMemcpy(xq, xq_host.data(), xq_host.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  const std::vector<float> xs_host(std::uint64_t{deepest / 128} * quantized_rows, 1.0f / 448.0f);
  auto* x_scales = static_cast<float*>(device(xs_host.size() * 4));
  check(cudaMemcpy(x_scales, xs_host.data(), xs_host.size() * 4, cudaMemcpyHostToDevice),
        "cudaMemcpy");
  void* y = device(std::uint64_t{quantized_rows} * widest * 4);
  void* copy_target = nullptr;

  std::printf("%-5s %-8s %6s %6s %-10s %4s | %9s %7s %6s | %-11s %9s %7s\n", "model", "matrix",
              "out", "in", "kernel", "rows", "chosen us", "TB/s", "%copy", "best (s,u)", "us",
              "%copy");
  for (const Shape& s : shapes) {
    const std::uint64_t elements = std::uint64_t{s.in} * s.out;
    for (const bool fp8 : {false, true}) {
      if (fp8 && !s.fp8) continue;
      const std::uint64_t bytes = elements * (fp8 ? 1 : 2);
      Copies weights(pattern(bytes, fp8), l2);
      // The copy: the same bytes read and written once, on this GPU, now.
      (void)cudaFree(copy_target);
      copy_target = device(bytes);
      const double copy_us = time_us(
          [&] {
            check(cudaMemcpyAsync(copy_target, weights.take(), bytes, cudaMemcpyDeviceToDevice,
                                  stream),
                  "cudaMemcpyAsync");
          },
          stream, budget_ms);
      const double copy_rate = 2.0 * bytes / (copy_us * 1e6);  // TB/s, read + write
      std::vector<float> scale_host(
          std::max<std::uint64_t>(std::uint64_t{(s.out + 127) / 128} * ((s.in / 128 + 3) / 4 * 4),
                                  s.out),
          1.0f / 16384.0f);
      float* scales = nullptr;
      if (fp8) {
        scales = static_cast<float*>(device(scale_host.size() * 4));
        check(cudaMemcpy(scales, scale_host.data(), scale_host.size() * 4, cudaMemcpyHostToDevice),
              "cudaMemcpy");
      }
      struct Form {
        const char* kernel;
        Fp8Scales kind;
        bool mma;
      };
      const std::vector<Form> forms =
          fp8 ? std::vector<Form>{{"fp8-blk", Fp8Scales::kBlock128, false},
                                  {"fp8-chn", Fp8Scales::kChannel, false},
                                  {"mma-blk", Fp8Scales::kBlock128, true},
                                  {"mma-chn", Fp8Scales::kChannel, true}}
              : std::vector<Form>{{"gemv-bf16", Fp8Scales::kBlock128, false}};
      for (const Form& form : forms) {
        const char* kernel = form.kernel;
        const Fp8Scales kind = form.kind;
        for (const std::uint32_t rows : {1u, 2u, quantized_rows}) {
          if (rows > 2 && !form.mma) continue;
          double chosen = 0, best = 1e30;
          Variant best_variant{};
          for (const Variant& v : variants) {
            const double us = time_us(
                [&] {
                  if (fp8) {
                    kvvm::Fp8GemvArgs p;
                    p.element = DType::kBf16;
                    p.scales_kind = kind;
                    p.rows = rows;
                    p.in = s.in;
                    p.out = s.out;
                    if (form.mma) {
                      p.xq = xq;
                      p.x_scales = x_scales;
                      p.x_stride = quantized_rows;
                    } else {
                      p.x = x;
                    }
                    p.weight = weights.take();
                    p.scales = scales;
                    p.y = y;
                    p.split = v.split;
                    p.unroll = v.unroll;
                    check(kvvm::fp8_gemv_cuda(p, stream), "fp8_gemv_cuda");
                  } else {
                    kvvm::GemvParams p;
                    p.element = DType::kBf16;
                    p.rows = rows;
                    p.in = s.in;
                    p.out = s.out;
                    p.x = x;
                    p.weight = weights.take();
                    p.y = y;
                    p.split = v.split;
                    p.unroll = v.unroll;
                    check(kvvm::gemv_cuda(p, stream), "gemv_cuda");
                  }
                },
                stream, budget_ms);
            if (every) {
              std::printf("  %s %s %s rows %u split %u unroll %u: %.2f us, %.2f TB/s\n", s.model,
                          s.name, kernel, rows, v.split, v.unroll, us, bytes / (us * 1e6));
            }
            if (v.split == 0) {
              chosen = us;
            } else if (us < best) {
              best = us;
              best_variant = v;
            }
          }
          const double rate = bytes / (chosen * 1e6);
          std::printf(
              "%-5s %-8s %6u %6u %-10s %4u | %9.2f %7.2f %5.0f%% | (%u, %u)%*s %9.2f %6.0f%%\n",
              s.model, s.name, s.out, s.in, kernel, rows, chosen, rate, 100.0 * rate / copy_rate,
              best_variant.split, best_variant.unroll, 5, "", best,
              100.0 * bytes / (best * 1e6) / copy_rate);
        }
      }
      std::printf("%-5s %-8s %6u %6u %-10s      | copy %.2f us: %.2f TB/s read + written\n",
                  s.model, s.name, s.out, s.in, fp8 ? "(e4m3)" : "(bf16)", copy_us, copy_rate);
      if (scales != nullptr) (void)cudaFree(scales);
    }
  }
  (void)cudaFree(copy_target);
  (void)cudaFree(x);
  (void)cudaFree(xq);
  (void)cudaFree(x_scales);
  (void)cudaFree(y);
  (void)cudaStreamDestroy(stream);
  return 0;
}
