// The MoE kernels' argument checks (include/kvvm/kernels/moe_kernels.h): each malformed call
// refused with InvalidArgument naming the value, in every build (no CUDA call); the sizes the
// caller allocates by; and, without nvcc, every launcher answering Unavailable after its checks.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>

#include "kvvm/kernels/moe_kernels.h"

namespace kvvm::moe_kernels_test {
namespace {

alignas(16) std::uint8_t g_host[256] = {};
const void* const g_table[1] = {g_host};
const float* const g_scale_table[1] = {reinterpret_cast<const float*>(g_host)};

template <typename Params>
void expect_refusals(
    const Params& good, Status (*check)(const Params&),
    std::initializer_list<std::pair<std::function<void(Params&)>, std::string>> bad) {
  ASSERT_TRUE(check(good).ok()) << check(good).message();
  for (const auto& [change, words] : bad) {
    Params p = good;
    change(p);
    const Status status = check(p);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << words;
    EXPECT_NE(status.message().find(words), std::string::npos)
        << "message: " << status.message() << "\nexpected: " << words;
  }
}

TEST(MoeKernelChecks, RouteRefusesNamingTheValue) {
  MoeRouteParams p;
  p.element = DType::kBf16;
  p.tokens = 3;
  p.experts = 128;
  p.top_k = 8;
  p.logits = g_host;
  p.ids = reinterpret_cast<std::int32_t*>(g_host);
  p.weights = reinterpret_cast<float*>(g_host);
  expect_refusals<MoeRouteParams>(
      p, check_moe_route,
      {{[](MoeRouteParams& q) { q.element = DType::kFp8; }, "element type fp8"},
       {[](MoeRouteParams& q) { q.experts = 0; }, "experts 0 is not in 1 .. 512"},
       {[](MoeRouteParams& q) { q.experts = 513; }, "experts 513"},
       {[](MoeRouteParams& q) { q.top_k = 0; }, "top_k 0 is not in 1 .. 16"},
       {[](MoeRouteParams& q) { q.top_k = 17; }, "top_k 17"},
       {[](MoeRouteParams& q) {
          q.experts = 4;
          q.top_k = 5;
        },
        "top_k 5 is not in 1 .. 4"},
       {[](MoeRouteParams& q) { q.tokens = 1u << 30; }, "tokens 1073741824 x top_k 8"},
       {[](MoeRouteParams& q) { q.logits = nullptr; }, "logits is null"},
       {[](MoeRouteParams& q) { q.ids = nullptr; }, "ids is null"},
       {[](MoeRouteParams& q) { q.weights = nullptr; }, "weights is null"}});
  p.tokens = 0;
  p.logits = nullptr;
  EXPECT_TRUE(check_moe_route(p).ok()) << "no tokens: no pointers needed";
}

TEST(MoeKernelChecks, PermuteRefusesNamingTheValue) {
  MoePermuteParams p;
  p.tokens = 5;
  p.top_k = 2;
  p.experts = 8;
  p.tile = kMoeRowTile;
  p.ids = reinterpret_cast<const std::int32_t*>(g_host);
  p.offsets = reinterpret_cast<std::uint32_t*>(g_host);
  p.rows = reinterpret_cast<std::uint32_t*>(g_host);
  p.slot_of_pair = reinterpret_cast<std::uint32_t*>(g_host);
  p.active = reinterpret_cast<std::uint32_t*>(g_host);
  expect_refusals<MoePermuteParams>(
      p, check_moe_permute,
      {{[](MoePermuteParams& q) { q.tile = 12; }, "tile 12 is not a power of two"},
       {[](MoePermuteParams& q) { q.tile = 0; }, "tile 0"},
       {[](MoePermuteParams& q) { q.experts = 600; }, "experts 600"},
       {[](MoePermuteParams& q) { q.top_k = 9; }, "top_k 9 is not in 1 .. 8"},
       {[](MoePermuteParams& q) { q.ids = nullptr; }, "ids is null"},
       {[](MoePermuteParams& q) { q.offsets = nullptr; }, "offsets is null"},
       {[](MoePermuteParams& q) { q.rows = nullptr; }, "rows is null"},
       {[](MoePermuteParams& q) { q.slot_of_pair = nullptr; }, "slot_of_pair is null"},
       {[](MoePermuteParams& q) { q.active = nullptr; }, "active is null"}});
}

MoeGateUpParams good_gate_up() {
  MoeGateUpParams p;
  p.element = DType::kBf16;
  p.tokens = 4;
  p.top_k = 2;
  p.experts = 8;
  p.hidden = 256;
  p.inter = 128;
  p.x = g_host;
  p.gate_up = g_table;
  p.offsets = reinterpret_cast<const std::uint32_t*>(g_host);
  p.rows = reinterpret_cast<const std::uint32_t*>(g_host);
  p.active = reinterpret_cast<const std::uint32_t*>(g_host);
  p.act = g_host;
  return p;
}

TEST(MoeKernelChecks, GateUpRefusesNamingTheValue) {
  expect_refusals<MoeGateUpParams>(
      good_gate_up(), check_moe_gate_up,
      {{[](MoeGateUpParams& q) { q.element = DType::kFp32; }, "element type fp32"},
       {[](MoeGateUpParams& q) { q.hidden = 40; }, "hidden 40 is not a positive multiple of 16"},
       {[](MoeGateUpParams& q) { q.inter = 0; }, "inter 0"},
       {[](MoeGateUpParams& q) {
          q.format = MoeWeightFormat::kFp8Block128;
          q.gate_up_scales = g_scale_table;
          q.inter = 144;
        },
        "inter 144 is not a positive multiple of 128 (FP8 block-scaled)"},
       {[](MoeGateUpParams& q) { q.format = MoeWeightFormat::kFp8Block128; },
        "gate_up_scales is null"},
       {[](MoeGateUpParams& q) { q.format = static_cast<MoeWeightFormat>(7); }, "weight format 7"},
       {[](MoeGateUpParams& q) { q.block_rows = 32; }, "block_rows 32"},
       {[](MoeGateUpParams& q) { q.x = g_host + 2; }, "x is not 16-byte aligned"},
       {[](MoeGateUpParams& q) { q.gate_up = nullptr; }, "gate_up is null"},
       {[](MoeGateUpParams& q) { q.offsets = nullptr; }, "offsets is null"},
       {[](MoeGateUpParams& q) { q.rows = nullptr; }, "rows is null"},
       {[](MoeGateUpParams& q) { q.active = nullptr; }, "active is null"},
       {[](MoeGateUpParams& q) { q.act = g_host + 8; }, "act is not 16-byte aligned"},
       {[](MoeGateUpParams& q) { q.top_k = 0; }, "top_k 0"}});
}

MoeDownParams good_down() {
  MoeDownParams p;
  p.element = DType::kFp16;
  p.tokens = 4;
  p.top_k = 2;
  p.experts = 8;
  p.hidden = 256;
  p.inter = 128;
  p.act = g_host;
  p.down = g_table;
  p.offsets = reinterpret_cast<const std::uint32_t*>(g_host);
  p.rows = reinterpret_cast<const std::uint32_t*>(g_host);
  p.active = reinterpret_cast<const std::uint32_t*>(g_host);
  p.slot_of_pair = reinterpret_cast<const std::uint32_t*>(g_host);
  p.weights = reinterpret_cast<const float*>(g_host);
  p.pairs = g_host;
  p.out = g_host;
  return p;
}

TEST(MoeKernelChecks, DownRefusesNamingTheValue) {
  expect_refusals<MoeDownParams>(
      good_down(), check_moe_down,
      {{[](MoeDownParams& q) { q.element = DType::kUnset; }, "is not fp16 or bf16"},
       {[](MoeDownParams& q) { q.hidden = 8; }, "hidden 8"},
       {[](MoeDownParams& q) { q.format = MoeWeightFormat::kFp8Block128; }, "down_scales is null"},
       {[](MoeDownParams& q) { q.shared = g_host; }, "shared given without shared_gate"},
       {[](MoeDownParams& q) { q.shared_gate = g_host; }, "shared_gate given without shared"},
       {[](MoeDownParams& q) {
          q.shared = g_host + 4;
          q.shared_gate = g_host;
        },
        "shared is not 16-byte aligned"},
       {[](MoeDownParams& q) { q.act = nullptr; }, "act is null"},
       {[](MoeDownParams& q) { q.down = nullptr; }, "down is null"},
       {[](MoeDownParams& q) { q.slot_of_pair = nullptr; }, "slot_of_pair is null"},
       {[](MoeDownParams& q) { q.weights = nullptr; }, "weights is null"},
       {[](MoeDownParams& q) { q.pairs = g_host + 2; }, "pairs is not 16-byte aligned"},
       {[](MoeDownParams& q) { q.out = nullptr; }, "out is null"},
       {[](MoeDownParams& q) { q.block_rows = 256; }, "block_rows 256"}});
}

MoeResidencyParams good_residency() {
  MoeResidencyParams p;
  p.tokens = 2;
  p.top_k = 2;
  p.experts = 8;
  p.sparse_layers = 3;
  p.layer = 2;
  p.slots = 10;
  p.expert_bytes = 256;
  p.decay_every = 4096;
  p.ids = reinterpret_cast<const std::int32_t*>(g_host);
  p.slot_of = reinterpret_cast<std::uint32_t*>(g_host);
  p.count = reinterpret_cast<std::uint64_t*>(g_host);
  p.last_use = reinterpret_cast<std::uint64_t*>(g_host);
  p.holder = reinterpret_cast<std::uint32_t*>(g_host);
  p.copy_list = reinterpret_cast<std::uint32_t*>(g_host);
  p.counters = reinterpret_cast<MoeResidencyCounters*>(g_host);
  p.first_slot = g_host;
  p.staging = g_host;
  p.tables = reinterpret_cast<std::uint64_t*>(g_host);
  p.down_offset = 128;
  return p;
}

TEST(MoeKernelChecks, ResidencyRefusesNamingTheValue) {
  expect_refusals<MoeResidencyParams>(
      good_residency(), check_moe_residency,
      {{[](MoeResidencyParams& q) { q.experts = 0; }, "experts 0 is not in 1 .. 512"},
       {[](MoeResidencyParams& q) { q.layer = 3; }, "layer 3 is not below sparse_layers 3"},
       {[](MoeResidencyParams& q) { q.slots = 7; }, "slots 7 is not in experts 8 .. "},
       {[](MoeResidencyParams& q) { q.slots = 25; }, "sparse_layers x experts 24"},
       {[](MoeResidencyParams& q) { q.expert_bytes = 100; }, "expert_bytes 100"},
       {[](MoeResidencyParams& q) { q.decay_every = 0; }, "decay_every is 0"},
       {[](MoeResidencyParams& q) { q.down_offset = 256; }, "down_offset 256 is past"},
       {[](MoeResidencyParams& q) { q.gate_up_offset = kMoeNoOffset; }, "without gate_up_offset"},
       {[](MoeResidencyParams& q) { q.down_scale_offset = 300; }, "down_scale_offset 300"},
       {[](MoeResidencyParams& q) { q.ids = nullptr; }, "ids is null"},
       {[](MoeResidencyParams& q) { q.holder = nullptr; }, "holder is null"},
       {[](MoeResidencyParams& q) { q.counters = nullptr; }, "counters is null"},
       {[](MoeResidencyParams& q) { q.first_slot = g_host + 4; }, "first_slot is not 16-byte"},
       {[](MoeResidencyParams& q) { q.staging = g_host + 8; }, "staging is not 16-byte"},
       {[](MoeResidencyParams& q) { q.tables = nullptr; }, "tables is null"}});
}

TEST(MoeKernelChecks, PermutedRowsBoundEveryRoutingsPaddedRuns) {
  EXPECT_EQ(moe_permuted_rows(0, 8, 128, 16), 0u);
  // One token, 8 experts of 128: 8 runs of one pair, each padded to 16.
  EXPECT_EQ(moe_permuted_rows(1, 8, 128, 16), 8u * 16);
  // Many tokens: every expert may end in a partial tile.
  EXPECT_EQ(moe_permuted_rows(1000, 2, 8, 16), 2000u + 8 * 15);
  EXPECT_EQ(moe_permuted_rows(3, 2, 8, 1), 6u);
  EXPECT_EQ(moe_permute_scratch_bytes(512), 0u);
}

TEST(MoeKernelChecks, WithoutTheKernelsEachLauncherIsUnavailableAfterItsChecks) {
  if (moe_kernels_built()) GTEST_SKIP() << "the MoE kernels are built";
  MoeGateUpParams gate_up = good_gate_up();
  EXPECT_EQ(moe_expert_gate_up_cuda(gate_up, nullptr).code(), StatusCode::kUnavailable);
  gate_up.hidden = 8;
  EXPECT_EQ(moe_expert_gate_up_cuda(gate_up, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(moe_expert_down_cuda(good_down(), nullptr).code(), StatusCode::kUnavailable);
  MoeRouteParams route;
  route.element = DType::kFp32;
  route.experts = 8;
  route.top_k = 2;
  EXPECT_EQ(moe_route_cuda(route, nullptr).code(), StatusCode::kUnavailable);
  MoePermuteParams permute;
  permute.experts = 8;
  permute.top_k = 2;
  permute.tile = 16;
  EXPECT_EQ(moe_permute_cuda(permute, nullptr).code(), StatusCode::kUnavailable);
  EXPECT_EQ(moe_residency_cuda(good_residency(), nullptr).code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kvvm::moe_kernels_test
