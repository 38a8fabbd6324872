// The MoE layer's grouped GEMMs beside cuBLAS, one process, one GPU: for Qwen3-30B-A3B's
// experts (128, top 8, hidden 2048, inter 768) and Mixtral's (8, top 2, hidden 4096, inter 14336)
// at 1 token and 64 .. 8192 routed rows, uniform routing (token t's choice j on expert
// (t * top_k + j) % experts), the time of
//   moe-bf16     moe_expert_gate_up_cuda + moe_expert_down_cuda (its combine included), the
//                permutation made before the clock starts
//   moe-fp8      the same over FP8 block-scaled experts
//   cublas-bf16  cuBLAS GemmEx of the same FLOPs: [rows x hidden] . [hidden x 2 inter] and
//                [rows x inter] . [inter x hidden] on one dense weight set
// with TFLOP/s, the ratio cublas / moe (1 is cuBLAS's speed), and the rate of the expert
// weights the layer reads (every chosen expert's bytes over the time: at one token what bounds
// it). At one token each call routes to the next experts in turn, so no figure is the L2's.
// Also the router and the permutation alone. Usage: moe_gemm_bench [ms per figure, default 30]
// [largest routed rows, default 8192].
#include <cublas_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_timing.h"
#include "kvvm/kernels/model_kernels.h"
#include "kvvm/kernels/moe_kernels.h"
#include "model/cuda/cublas_api.h"

namespace {

using kvvm::DType;
using kvvm::MoeWeightFormat;
using kvvm::bench::check;
using kvvm::bench::device;
using kvvm::bench::time_us;

[[noreturn]] void die(const std::string& what) { kvvm::bench::die("moe_gemm_bench", what); }

struct Model {
  const char* name;
  std::uint32_t experts, top_k, hidden, inter;
};

void fill(DType element, std::uint64_t count, std::uint32_t tensor, float scale, void* out,
          cudaStream_t stream) {
  kvvm::DummyFillParams p;
  p.element = element;
  p.count = count;
  p.seed = 7;
  p.tensor = tensor;
  p.scale = scale;
  p.out = out;
  check(kvvm::dummy_fill_cuda(p, stream), "dummy_fill_cuda");
}

// Every expert's gate|up and down in one allocation, in `format`, and the device tables of
// their addresses (and scales).
struct ExpertSet {
  void* weights = nullptr;
  float* scales = nullptr;
  void* gate_up_table = nullptr;
  void* down_table = nullptr;
  void* gate_up_scales = nullptr;
  void* down_scales = nullptr;
  ExpertSet(const Model& m, MoeWeightFormat format, cudaStream_t stream) {
    const bool fp8 = format == MoeWeightFormat::kFp8Block128;
    const std::uint64_t element = fp8 ? 1 : 2;
    const std::uint64_t gate_up = std::uint64_t{2} * m.inter * m.hidden;
    const std::uint64_t down = std::uint64_t{m.hidden} * m.inter;
    weights = device((gate_up + down) * element * m.experts);
    fill(fp8 ? DType::kFp8 : DType::kBf16, (gate_up + down) * m.experts, 1, fp8 ? 200.0f : 0.02f,
         weights, stream);
    // Block scales: [rows / 128][padded in / 128] per projection.
    const std::uint64_t gu_scales =
        std::uint64_t{2 * m.inter / 128} * ((m.hidden / 128 + 3) / 4 * 4);
    const std::uint64_t d_scales = std::uint64_t{m.hidden / 128} * ((m.inter / 128 + 3) / 4 * 4);
    std::vector<const void*> gu(m.experts), d(m.experts);
    std::vector<const float*> gus(m.experts), ds(m.experts);
    if (fp8) {
      const std::vector<float> host((gu_scales + d_scales) * m.experts, 1.0f / 4096);
      scales = static_cast<float*>(device(host.size() * 4));
      check(cudaMemcpy(scales, host.data(), host.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    for (std::uint32_t e = 0; e < m.experts; ++e) {
      const auto* base =
          static_cast<const unsigned char*>(weights) + (gate_up + down) * element * e;
      gu[e] = base;
      d[e] = base + gate_up * element;
      if (fp8) {
        gus[e] = scales + (gu_scales + d_scales) * e;
        ds[e] = gus[e] + gu_scales;
      }
    }
    gate_up_table = upload(gu);
    down_table = upload(d);
    if (fp8) {
      gate_up_scales = upload(gus);
      down_scales = upload(ds);
    }
  }
  template <typename T>
  static void* upload(const std::vector<T>& host) {
    void* p = device(host.size() * sizeof(T));
    check(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
          "cudaMemcpy");
    return p;
  }
  ExpertSet(const ExpertSet&) = delete;
  ExpertSet& operator=(const ExpertSet&) = delete;
  ~ExpertSet() {
    for (void* p : {weights, static_cast<void*>(scales), gate_up_table, down_table, gate_up_scales,
                    down_scales}) {
      (void)cudaFree(p);
    }
  }
};

// One routing's permutation, made once.
struct Routed {
  void* ids = nullptr;
  void* offsets = nullptr;
  void* rows = nullptr;
  void* slot_of_pair = nullptr;
  void* active = nullptr;
  Routed(const Model& m, std::uint32_t tokens, std::uint32_t shift, cudaStream_t stream) {
    std::vector<std::int32_t> host(std::size_t{tokens} * m.top_k);
    for (std::size_t i = 0; i < host.size(); ++i) {
      host[i] = static_cast<std::int32_t>((i + std::size_t{shift} * m.top_k) % m.experts);
    }
    ids = ExpertSet::upload(host);
    offsets = device((m.experts + 1) * 4);
    rows = device(kvvm::moe_permuted_rows(tokens, m.top_k, m.experts, kvvm::kMoeRowTile) * 4);
    slot_of_pair = device(host.size() * 4);
    active = device((m.experts + 1) * 4);
    check(kvvm::moe_permute_cuda(params(m, tokens), stream), "moe_permute_cuda");
  }
  kvvm::MoePermuteParams params(const Model& m, std::uint32_t tokens) const {
    kvvm::MoePermuteParams p;
    p.tokens = tokens;
    p.top_k = m.top_k;
    p.experts = m.experts;
    p.tile = kvvm::kMoeRowTile;
    p.ids = static_cast<const std::int32_t*>(ids);
    p.offsets = static_cast<std::uint32_t*>(offsets);
    p.rows = static_cast<std::uint32_t*>(rows);
    p.slot_of_pair = static_cast<std::uint32_t*>(slot_of_pair);
    p.active = static_cast<std::uint32_t*>(active);
    return p;
  }
  Routed(const Routed&) = delete;
  Routed& operator=(const Routed&) = delete;
  ~Routed() {
    for (void* p : {ids, offsets, rows, slot_of_pair, active}) (void)cudaFree(p);
  }
};

}  // namespace

int main(int argc, char** argv) {
  const double budget_ms = argc > 1 ? std::atof(argv[1]) : 30.0;
  const std::uint32_t most_rows = argc > 2 ? static_cast<std::uint32_t>(std::atoi(argv[2])) : 8192;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) die("no CUDA device");
  cudaDeviceProp props{};
  check(cudaGetDeviceProperties(&props, 0), "cudaGetDeviceProperties");
  std::printf("moe_gemm_bench on %s (L2 %d MiB), %.0f ms per figure\n", props.name,
              props.l2CacheSize >> 20, budget_ms);
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  constexpr std::uint64_t kWorkspace = std::uint64_t{32} << 20;
  void* workspace = device(kWorkspace);
  const auto& cublas = kvvm::model::detail::cublas_library();
  if (!cublas.usable()) die(cublas.error);
  cublasHandle_t handle = nullptr;
  if (cublas.api.create(&handle) != CUBLAS_STATUS_SUCCESS ||
      cublas.api.set_stream(handle, stream) != CUBLAS_STATUS_SUCCESS ||
      cublas.api.set_workspace(handle, workspace, kWorkspace) != CUBLAS_STATUS_SUCCESS) {
    die("cuBLAS setup failed");
  }

  const Model models[] = {{"qwen3-30b-a3b", 128, 8, 2048, 768},
                          {"mixtral-8x7b", 8, 2, 4096, 14336}};
  const std::uint32_t row_counts[] = {1, 64, 256, 1024, 4096, 8192};
  std::printf("%-14s %6s %6s  %-12s %10s %8s %8s %9s\n", "model", "tokens", "rows", "method", "us",
              "TFLOP/s", "TB/s", "cublas/x");
  for (const Model& m : models) {
    const std::uint32_t most_tokens = std::max(1u, most_rows / m.top_k);
    void* x = device(std::uint64_t{most_tokens} * m.hidden * 2);
    fill(DType::kBf16, std::uint64_t{most_tokens} * m.hidden, 2, 1.0f, x, stream);
    void* logits = device(std::uint64_t{most_tokens} * m.experts * 2);
    fill(DType::kBf16, std::uint64_t{most_tokens} * m.experts, 3, 4.0f, logits, stream);
    const std::uint64_t capacity =
        kvvm::moe_permuted_rows(most_tokens, m.top_k, m.experts, kvvm::kMoeRowTile);
    void* act = device(capacity * m.inter * 2);
    void* pairs = device(std::uint64_t{most_tokens} * m.top_k * m.hidden * 2);
    void* out = device(std::uint64_t{most_tokens} * m.hidden * 2);
    void* route_ids = device(std::uint64_t{most_tokens} * m.top_k * 4);
    void* weights = device(std::uint64_t{most_tokens} * m.top_k * 4);
    fill(DType::kFp32, std::uint64_t{most_tokens} * m.top_k, 4, 0.5f, weights, stream);
    // cuBLAS's dense weights: one expert's shapes.
    void* dense = device(std::uint64_t{3} * m.inter * m.hidden * 2);
    fill(DType::kBf16, std::uint64_t{3} * m.inter * m.hidden, 5, 0.02f, dense, stream);
    void* dense_out = device(std::uint64_t{most_tokens} * m.top_k * 2 * m.inter * 2);
    // Its input and output rows: as many as the routed pairs (x and out hold one per token).
    const std::uint64_t pair_rows = std::uint64_t{most_tokens} * m.top_k;
    void* dense_in = device(pair_rows * m.hidden * 2);
    fill(DType::kBf16, pair_rows * m.hidden, 6, 1.0f, dense_in, stream);
    void* dense_y = device(pair_rows * m.hidden * 2);
    const ExpertSet bf16(m, MoeWeightFormat::kNone, stream);
    const ExpertSet fp8(m, MoeWeightFormat::kFp8Block128, stream);
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");

    for (const std::uint32_t wanted : row_counts) {
      if (wanted > most_rows) continue;
      const std::uint32_t tokens = std::max(1u, wanted / m.top_k);
      const std::uint32_t rows = tokens * m.top_k;
      // At one token, each call takes the next experts (every expert in turn); else one routing.
      const std::uint32_t variants = tokens == 1 ? m.experts / m.top_k : 1;
      std::vector<Routed*> routed;
      for (std::uint32_t v = 0; v < variants; ++v)
        routed.push_back(new Routed(m, tokens, v, stream));
      const double flops = 6.0 * rows * m.hidden * m.inter;
      // The chosen experts' weight bytes (all experts once rows reach them).
      const std::uint32_t touched = std::min(m.experts, rows);
      const double expert_bytes = 3.0 * m.hidden * m.inter * touched;
      std::size_t next = 0;
      const auto report = [&](const char* method, double us, double bytes, double baseline) {
        std::printf("%-14s %6u %6u  %-12s %10.2f %8.1f %8.2f %9.3f\n", m.name, tokens, rows, method,
                    us, flops / (us * 1e6), bytes / (us * 1e6), baseline > 0 ? baseline / us : 0.0);
      };
      const float alpha = 1.0f, beta = 0.0f;
      const double cublas_us = time_us(
          [&] {
            const int n = static_cast<int>(rows);
            if (cublas.api.gemm_ex(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(2 * m.inter),
                                   n, static_cast<int>(m.hidden), &alpha, dense, CUDA_R_16BF,
                                   static_cast<int>(m.hidden), dense_in, CUDA_R_16BF,
                                   static_cast<int>(m.hidden), &beta, dense_out, CUDA_R_16BF,
                                   static_cast<int>(2 * m.inter), CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS ||
                cublas.api.gemm_ex(
                    handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m.hidden), n,
                    static_cast<int>(m.inter), &alpha,
                    static_cast<unsigned char*>(dense) + std::uint64_t{2} * m.inter * m.hidden * 2,
                    CUDA_R_16BF, static_cast<int>(m.inter), act, CUDA_R_16BF,
                    static_cast<int>(m.inter), &beta, dense_y, CUDA_R_16BF,
                    static_cast<int>(m.hidden), CUBLAS_COMPUTE_32F,
                    CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
              die("cublasGemmEx failed");
            }
          },
          stream, budget_ms);
      report("cublas-bf16", cublas_us, 6.0 * m.hidden * m.inter, cublas_us);
      for (const ExpertSet* set : {&bf16, &fp8}) {
        const bool is_fp8 = set == &fp8;
        const double us = time_us(
            [&] {
              const Routed& r = *routed[next];
              next = (next + 1) % routed.size();
              const kvvm::MoePermuteParams perm = r.params(m, tokens);
              kvvm::MoeGateUpParams g;
              g.element = DType::kBf16;
              g.format = is_fp8 ? MoeWeightFormat::kFp8Block128 : MoeWeightFormat::kNone;
              g.tokens = tokens;
              g.top_k = m.top_k;
              g.experts = m.experts;
              g.hidden = m.hidden;
              g.inter = m.inter;
              g.x = x;
              g.gate_up = static_cast<const void* const*>(set->gate_up_table);
              g.gate_up_scales = static_cast<const float* const*>(set->gate_up_scales);
              g.offsets = perm.offsets;
              g.rows = perm.rows;
              g.active = perm.active;
              g.act = act;
              check(kvvm::moe_expert_gate_up_cuda(g, stream), "moe_expert_gate_up_cuda");
              kvvm::MoeDownParams d;
              d.element = DType::kBf16;
              d.format = g.format;
              d.tokens = tokens;
              d.top_k = m.top_k;
              d.experts = m.experts;
              d.hidden = m.hidden;
              d.inter = m.inter;
              d.act = act;
              d.down = static_cast<const void* const*>(set->down_table);
              d.down_scales = static_cast<const float* const*>(set->down_scales);
              d.offsets = perm.offsets;
              d.rows = perm.rows;
              d.active = perm.active;
              d.slot_of_pair = perm.slot_of_pair;
              d.weights = static_cast<const float*>(weights);
              d.pairs = pairs;
              d.out = out;
              check(kvvm::moe_expert_down_cuda(d, stream), "moe_expert_down_cuda");
            },
            stream, budget_ms);
        report(is_fp8 ? "moe-fp8" : "moe-bf16", us, expert_bytes * (is_fp8 ? 1 : 2), cublas_us);
      }
      const double permute_us = time_us(
          [&] {
            check(kvvm::moe_permute_cuda(routed[0]->params(m, tokens), stream), "moe_permute_cuda");
          },
          stream, budget_ms);
      report("permute", permute_us, 0, 0);
      const double route_us = time_us(
          [&] {
            kvvm::MoeRouteParams p;
            p.element = DType::kBf16;
            p.tokens = tokens;
            p.experts = m.experts;
            p.top_k = m.top_k;
            p.renormalize = true;
            p.logits = logits;
            p.ids = static_cast<std::int32_t*>(route_ids);
            p.weights = static_cast<float*>(weights);
            check(kvvm::moe_route_cuda(p, stream), "moe_route_cuda");
          },
          stream, budget_ms);
      report("route", route_us, 0, 0);
      for (Routed* r : routed) delete r;
    }
    for (void* p :
         {x, logits, act, pairs, out, route_ids, weights, dense, dense_out, dense_in, dense_y}) {
      (void)cudaFree(p);
    }
  }
  (void)cublas.api.destroy(handle);
  (void)cudaFree(workspace);
  return 0;
}
