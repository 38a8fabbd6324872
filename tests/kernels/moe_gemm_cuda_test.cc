// The grouped GEMMs (moe_expert_gate_up_cuda, moe_expert_down_cuda with its combine) against
// float64 references computed on the host from the same bf16 / fp16 / e4m3 inputs: 1 to 8192
// routed rows, uneven and empty experts (every token on the same experts, skewed routings),
// K and N that end inside a tile, FP8 block scales that differ block by block, a shared expert.
//
// Tolerances, from the documented rounding points: gate and up are float32 sums (slack: terms x
// 2^-24 x their magnitudes, twice) each rounded to the element type (one ulp), so act may move by
// silu'(gate) x up x that + silu x the up's, plus one ulp for the silu's rounding and one for the
// product's; each pair's y is checked from the act the device wrote (down's sum: one ulp and the
// slack, times the routing weight, plus one ulp for the product); out from the y it wrote: the
// combine's float32 sum in choice order is the host's bit for bit (one ulp with a shared expert,
// whose sigmoid is the device's expf). Every forced row tile gives the same bits; a token's rows
// are the same bits alone or in a batch; the launches capture into a CUDA graph whose replays
// with new ids match eager runs. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "moe_layer.h"

namespace kvvm::moe_kernels_test {
namespace {

#if defined(KVVM_HAS_CUDA_KERNELS)

std::string describe(const LayerShape& s, std::uint32_t tokens) {
  return std::string(s.type == DType::kBf16 ? "bf16" : "fp16") +
         (s.format == MoeWeightFormat::kFp8Block128 ? " fp8-block" : "") + " experts " +
         std::to_string(s.experts) + " top_k " + std::to_string(s.top_k) + " hidden " +
         std::to_string(s.hidden) + " inter " + std::to_string(s.inter) + " tokens " +
         std::to_string(tokens);
}

// Up to 384 pairs of the batch, all when it has fewer.
std::vector<std::uint32_t> sample_pairs(std::size_t pairs, std::mt19937& rng) {
  std::vector<std::uint32_t> out;
  if (pairs <= 384) {
    for (std::uint32_t p = 0; p < pairs; ++p) out.push_back(p);
    return out;
  }
  std::uniform_int_distribution<std::uint32_t> pick(0, static_cast<std::uint32_t>(pairs - 1));
  for (int i = 0; i < 384; ++i) out.push_back(pick(rng));
  out.push_back(static_cast<std::uint32_t>(pairs - 1));
  return out;
}

void check_act(const Batch& b, const Permutation& perm, const std::vector<std::uint16_t>& act,
               const std::vector<std::uint32_t>& sample, const std::string& where) {
  const LayerShape& s = b.experts.shape;
  const DType type = s.type;
  int failures = 0;
  for (const std::uint32_t p : sample) {
    const std::uint32_t t = p / s.top_k, e = static_cast<std::uint32_t>(b.ids[p]);
    const std::uint32_t r = perm.slot_of_pair[p];
    const ExpertWeights& w = b.experts.gate_up[e];
    for (std::uint32_t n = 0; n < s.inter && failures < 10; ++n) {
      double g = 0, gm = 0, u = 0, um = 0;
      for (std::uint32_t k = 0; k < s.hidden; ++k) {
        const double xv = from_bits(type, b.x[std::size_t{t} * s.hidden + k]);
        g += xv * w.at(n, k);
        gm += std::fabs(xv * w.at(n, k));
        u += xv * w.at(s.inter + n, k);
        um += std::fabs(xv * w.at(s.inter + n, k));
      }
      const double gr = round_to(type, g), ur = round_to(type, u);
      const double silu = round_to(type, gr / (1.0 + std::exp(-gr)));
      const double want = round_to(type, silu * ur);
      const double dg = ulp(type, g) + sum_slack(s.hidden, gm);
      const double du = ulp(type, u) + sum_slack(s.hidden, um);
      const double tol = 1.1 * (std::fabs(ur) + du) * dg +
                         (std::fabs(silu) + ulp(type, silu)) * du +
                         ulp(type, silu) * (std::fabs(ur) + du) + ulp(type, want);
      const double got = from_bits(type, act[std::size_t{r} * s.inter + n]);
      if (!(std::fabs(got - want) <= tol)) {
        ++failures;
        ADD_FAILURE() << where << ": act of pair " << p << " (row " << r << ", expert " << e
                      << ") column " << n << ": " << got << ", want " << want << " +- " << tol;
      }
    }
  }
  // Padding rows are zeros.
  for (std::size_t r = 0; r < perm.rows.size(); ++r) {
    if (perm.rows[r] != kMoePadRow) continue;
    for (std::uint32_t n = 0; n < s.inter; ++n) {
      ASSERT_EQ(from_bits(type, act[r * s.inter + n]), 0.0) << where << ": padding row " << r;
    }
  }
}

void check_pairs(const Batch& b, const Permutation& perm, const std::vector<std::uint16_t>& act,
                 const std::vector<std::uint16_t>& pairs, const std::vector<std::uint32_t>& sample,
                 const std::string& where) {
  const LayerShape& s = b.experts.shape;
  const DType type = s.type;
  int failures = 0;
  for (const std::uint32_t p : sample) {
    const std::uint32_t e = static_cast<std::uint32_t>(b.ids[p]);
    const std::uint32_t r = perm.slot_of_pair[p];
    const ExpertWeights& w = b.experts.down[e];
    const double weight = round_to(type, b.weights[p]);
    for (std::uint32_t h = 0; h < s.hidden && failures < 10; ++h) {
      double d = 0, dm = 0;
      for (std::uint32_t n = 0; n < s.inter; ++n) {
        const double term = from_bits(type, act[std::size_t{r} * s.inter + n]) * w.at(h, n);
        d += term;
        dm += std::fabs(term);
      }
      const double want = round_to(type, round_to(type, d) * weight);
      const double tol =
          std::fabs(weight) * (ulp(type, d) + sum_slack(s.inter, dm)) + ulp(type, want);
      const double got = from_bits(type, pairs[std::size_t{p} * s.hidden + h]);
      if (!(std::fabs(got - want) <= tol)) {
        ++failures;
        ADD_FAILURE() << where << ": y of pair " << p << " (expert " << e << ") output " << h
                      << ": " << got << ", want " << want << " +- " << tol;
      }
    }
  }
}

void check_out(const Batch& b, const std::vector<std::uint16_t>& pairs,
               const std::vector<std::uint16_t>& out, const std::string& where) {
  const LayerShape& s = b.experts.shape;
  const DType type = s.type;
  int failures = 0;
  for (std::uint32_t t = 0; t < b.tokens && failures < 10; ++t) {
    for (std::uint32_t h = 0; h < s.hidden; ++h) {
      float sum = 0.0f;
      for (std::uint32_t j = 0; j < s.top_k; ++j) {
        sum += static_cast<float>(
            from_bits(type, pairs[(std::size_t{t} * s.top_k + j) * s.hidden + h]));
      }
      const std::uint16_t got = out[std::size_t{t} * s.hidden + h];
      if (!s.shared) {
        if (got != to_bits(type, sum)) {
          ++failures;
          ADD_FAILURE() << where << ": out of token " << t << " output " << h << ": "
                        << from_bits(type, got) << ", want " << round_to(type, sum);
        }
        continue;
      }
      const double g = from_bits(type, b.shared_gate[t]);
      const double gate = round_to(type, 1.0 / (1.0 + std::exp(-g)));
      const double want = round_to(
          type,
          round_to(type, sum) +
              round_to(type, gate * from_bits(type, b.shared[std::size_t{t} * s.hidden + h])));
      if (!(std::fabs(from_bits(type, got) - want) <= ulp(type, want))) {
        ++failures;
        ADD_FAILURE() << where << ": out of token " << t << " output " << h
                      << " (shared): " << from_bits(type, got) << ", want " << want;
      }
    }
  }
}

struct GemmCase {
  LayerShape shape;
  std::vector<std::uint32_t> tokens;
};

std::vector<GemmCase> gemm_cases() {
  const auto shape = [](DType type, MoeWeightFormat format, std::uint32_t experts,
                        std::uint32_t top_k, std::uint32_t hidden, std::uint32_t inter,
                        bool shared) {
    LayerShape s;
    s.type = type;
    s.format = format;
    s.experts = experts;
    s.top_k = top_k;
    s.hidden = hidden;
    s.inter = inter;
    s.shared = shared;
    return s;
  };
  const MoeWeightFormat none = MoeWeightFormat::kNone, fp8 = MoeWeightFormat::kFp8Block128;
  return {
      // K and N ending inside a tile (208 = 3 x 64 + 16, 80 = 64 + 16).
      {shape(DType::kBf16, none, 16, 4, 208, 80, false), {1, 3, 100, 2048}},
      {shape(DType::kFp16, none, 16, 4, 208, 80, true), {1, 3, 100, 2048}},
      // One routed row, and one expert per token.
      {shape(DType::kBf16, none, 4, 1, 64, 32, false), {1, 7, 3000}},
      // Qwen3-MoE's routing (128 experts, top 8) up to 8192 rows.
      {shape(DType::kBf16, none, 128, 8, 256, 128, false), {1, 16, 1024}},
      // FP8 block-scaled: several scale blocks along both K and N.
      {shape(DType::kBf16, fp8, 8, 2, 384, 256, true), {1, 5, 300, 4096}},
      {shape(DType::kFp16, fp8, 8, 2, 256, 128, false), {1, 64, 1000}},
  };
}

TEST(MoeGemmCuda, MatchesFloat64ReferencesAndEveryRowTileGivesTheSameBits) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(17);
  for (const GemmCase& c : gemm_cases()) {
    const Experts experts(c.shape, rng);
    for (const std::uint32_t tokens : c.tokens) {
      for (const Routing routing : {Routing::kUniform, Routing::kSameExperts, Routing::kSkewed}) {
        if (routing != Routing::kUniform && (tokens == 1 || tokens > 1024)) continue;
        Batch b(experts, tokens, make_ids(tokens, c.shape.top_k, c.shape.experts, routing, rng),
                rng);
        const std::string where =
            describe(c.shape, tokens) + " routing " + std::to_string(static_cast<int>(routing));
        b.poison();
        const Status ran = b.run(0, nullptr);
        ASSERT_TRUE(ran.ok()) << where << ": " << ran.to_string();
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << where;
        const Permutation perm = b.permutation.read();
        ASSERT_EQ(perm.slot_of_pair,
                  permute_on_host(b.ids, c.shape.experts, kMoeRowTile).slot_of_pair);
        const std::vector<std::uint16_t> act = b.act(), pairs = b.pairs(), out = b.out();
        const std::vector<std::uint32_t> sample = sample_pairs(b.ids.size(), rng);
        check_act(b, perm, act, sample, where);
        check_pairs(b, perm, act, pairs, sample, where);
        check_out(b, pairs, out, where);
        const std::size_t used = std::size_t{perm.offsets[c.shape.experts]} * c.shape.inter;
        for (const std::uint32_t block_rows : {16u, 64u, 128u}) {
          b.poison();
          ASSERT_TRUE(b.run(block_rows, nullptr).ok());
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const std::vector<std::uint16_t> act2 = b.act();
          EXPECT_TRUE(std::equal(act.begin(), act.begin() + used, act2.begin()))
              << where << ": act differs with block_rows " << block_rows;
          EXPECT_EQ(b.pairs(), pairs) << where << ": y differs with block_rows " << block_rows;
          EXPECT_EQ(b.out(), out) << where << ": out differs with block_rows " << block_rows;
        }
      }
    }
  }
}

TEST(MoeGemmCuda, ATokensRowsAreTheSameBitsAloneOrInABatch) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(23);
  for (const GemmCase& c : gemm_cases()) {
    const LayerShape& s = c.shape;
    const Experts experts(s, rng);
    const std::uint32_t tokens = 300;
    Batch batch(experts, tokens, make_ids(tokens, s.top_k, s.experts, Routing::kUniform, rng), rng);
    ASSERT_TRUE(batch.run(0, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<std::uint16_t> all = batch.out();
    for (const std::uint32_t t : {0u, 151u, tokens - 1}) {
      const std::vector<std::int32_t> ids(batch.ids.begin() + std::size_t{t} * s.top_k,
                                          batch.ids.begin() + std::size_t{t + 1} * s.top_k);
      Batch alone(experts, 1, ids, rng);
      alone.weights.assign(batch.weights.begin() + std::size_t{t} * s.top_k,
                           batch.weights.begin() + std::size_t{t + 1} * s.top_k);
      alone.x.assign(batch.x.begin() + std::size_t{t} * s.hidden,
                     batch.x.begin() + std::size_t{t + 1} * s.hidden);
      alone.shared.assign(batch.shared.begin() + std::size_t{t} * s.hidden,
                          batch.shared.begin() + std::size_t{t + 1} * s.hidden);
      alone.shared_gate.assign(1, batch.shared_gate[t]);
      alone.upload();
      alone.poison();
      ASSERT_TRUE(alone.run(0, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<std::uint16_t> one = alone.out();
      EXPECT_TRUE(std::equal(one.begin(), one.end(), all.begin() + std::size_t{t} * s.hidden))
          << describe(s, tokens) << ": token " << t << " alone differs from the batch";
    }
  }
}

TEST(MoeGemmCuda, TheLaunchesCaptureIntoAGraphThatReplaysWithNewIds) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(29);
  for (const GemmCase& c : gemm_cases()) {
    const LayerShape& s = c.shape;
    const Experts experts(s, rng);
    const std::uint32_t tokens = 64;
    Batch b(experts, tokens, make_ids(tokens, s.top_k, s.experts, Routing::kSkewed, rng), rng);
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_TRUE(b.run(0, stream).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<std::uint16_t> eager = b.out();

    cudaGraph_t graph;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    const Status captured = b.run(0, stream);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_TRUE(captured.ok()) << captured.to_string();
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    b.poison();
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(b.out(), eager) << describe(s, tokens) << ": the replay differs from eager";

    // New routing and activations in the same buffers: the replay follows them.
    b.ids = make_ids(tokens, s.top_k, s.experts, Routing::kUniform, rng);
    std::normal_distribution<double> normal(0.0, 1.0);
    for (std::uint16_t& v : b.x) v = to_bits(s.type, normal(rng));
    b.upload();
    b.poison();
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<std::uint16_t> replayed = b.out();
    b.poison();
    ASSERT_TRUE(b.run(0, stream).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(replayed, b.out()) << describe(s, tokens) << ": the replay with new ids differs";
    EXPECT_NE(replayed, eager);
    ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  }
}

TEST(MoeGemmCuda, NoTokensLaunchNothing) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  MoeGateUpParams gate_up;
  gate_up.element = DType::kBf16;
  gate_up.experts = 8;
  gate_up.top_k = 2;
  gate_up.hidden = 64;
  gate_up.inter = 32;
  EXPECT_TRUE(moe_expert_gate_up_cuda(gate_up, nullptr).ok());
  MoeDownParams down;
  down.element = DType::kFp16;
  down.experts = 8;
  down.top_k = 2;
  down.hidden = 64;
  down.inter = 32;
  EXPECT_TRUE(moe_expert_down_cuda(down, nullptr).ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace
}  // namespace kvvm::moe_kernels_test
