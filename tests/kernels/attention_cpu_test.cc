// The host attention paths (float32, multithreaded) against the float64 reference, on fresh
// random data each run, over arenas of the host driver (only the live windows committed: a
// read past a length faults); append checked byte for byte against offsets computed here from
// the layout definitions (not through KvView); element conversions pinned to known bits; and
// malformed calls refused with their numbers. Runs everywhere (CI has no GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvvm/kernels/attention.h"
#include "kvvm/vmm/host_driver.h"
#include "support/attention_fixture.h"
#include "support/attention_support.h"
#include "support/pattern.h"

namespace kvvm {
namespace {

using testing::KvArena;
using Config = testing::AttentionConfig;
using testing::kAttentionKvHeads;
using testing::kAttentionLayer;  // not 0: the layer stride is exercised

class AttentionCpuTest : public testing::AttentionFixture {
 protected:
  void SetUp() override {
    auto made = make_host_driver();
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    driver_ = std::move(made).value();
    seed_random();
  }
  // Appends random K and V for tokens [from, to) of `slot` with append_kv_cpu.
  void fill(const KvView& view, std::uint32_t slot, std::uint32_t from, std::uint32_t to) {
    const testing::KvRows rows = random_rows(to - from);
    AppendParams append = testing::append_rows(view, kAttentionLayer, kAttentionKvHeads, to - from,
                                               rows.k.data(), rows.v.data());
    append.slot = slot;
    append.start = from;
    set_access(append);
    ASSERT_TRUE(append_kv_cpu(append).ok());
  }
};

TEST_P(AttentionCpuTest, DecodeMatchesTheFloat64Reference) {
  const Config& c = GetParam();
  // Granule boundary +- 1 with the page-sized granule; 4097 only where the run stays short
  // under the sanitizers (the CUDA suite covers it everywhere, and 32768).
  auto kv = KvArena::make(*driver_, geometry(), c.layout, 4200, 5);
  ASSERT_TRUE(kv);
  const std::uint64_t boundary =
      std::max<std::uint64_t>(2, driver_->granule() / kv->arena->plan().contiguous_bytes_per_token);
  std::vector<std::uint32_t> lengths = {1, 2, static_cast<std::uint32_t>(boundary - 1),
                                        static_cast<std::uint32_t>(boundary + 1)};
  lengths.push_back(c.group == 7 ? 4097 : 300);
  const auto batch = static_cast<std::uint32_t>(lengths.size());
  std::vector<std::uint32_t> slots;
  for (std::uint32_t length : lengths) {
    auto slot = kv->arena->admit(length);
    ASSERT_TRUE(slot.ok()) << slot.status().to_string();
    slots.push_back(*slot);
    fill(kv->arena->view(), *slot, 0, length);
    if (HasFatalFailure()) return;
  }
  const std::uint32_t qo_heads = kAttentionKvHeads * c.group;
  const std::size_t elements = std::size_t{batch} * qo_heads * c.head_dim;
  auto q = testing::random_elements(c.element, elements, random_, 2.0f);
  std::vector<std::uint8_t> out(elements * 2, 0xff);  // poisoned: NaN
  DecodeParams params;
  params.view = kv->arena->view();
  params.layer = kAttentionLayer;
  params.qo_heads = qo_heads;
  params.kv_heads = kAttentionKvHeads;
  params.batch = batch;
  params.q = q.data();
  params.slots = slots.data();
  params.lengths = lengths.data();
  params.max_length = 4200;
  params.out = out.data();
  set_access(params);
  std::vector<double> reference(elements);
  {
    Status referenced = decode_attention_reference(params, reference.data());
    ASSERT_TRUE(referenced.ok()) << referenced.to_string();
  }
  ASSERT_TRUE(decode_attention_cpu(params, 4).ok());
  EXPECT_EQ(testing::count_nan(c.element, out), 0u);
  EXPECT_LT(testing::relative_error(c.element, out, reference), testing::tolerance(c.element))
      << "seed " << seed_;
}

// Groups 4 and 7 on the CPU (the CUDA suite covers all four).
class AttentionCpuPrefillTest : public AttentionCpuTest {};

TEST_P(AttentionCpuPrefillTest, CausalPrefillInTwoChunksMatchesTheReference) {
  const Config& c = GetParam();
  constexpr std::uint32_t kFirst = 37, kTotal = 100;
  auto kv = KvArena::make(*driver_, geometry(), c.layout, 128, 1);
  ASSERT_TRUE(kv);
  auto slot = kv->arena->admit(kTotal);
  ASSERT_TRUE(slot.ok());
  const std::uint32_t qo_heads = kAttentionKvHeads * c.group;
  for (auto [start, end] : {std::pair{0u, kFirst}, std::pair{kFirst, kTotal}}) {
    fill(kv->arena->view(), *slot, start, end);
    if (HasFatalFailure()) return;
    const std::size_t elements = std::size_t{end - start} * qo_heads * c.head_dim;
    auto q = testing::random_elements(c.element, elements, random_, 2.0f);
    std::vector<std::uint8_t> out(elements * 2, 0xff);
    PrefillParams params;
    params.view = kv->arena->view();
    params.layer = kAttentionLayer;
    params.qo_heads = qo_heads;
    params.kv_heads = kAttentionKvHeads;
    params.slot = *slot;
    params.start = start;
    params.tokens = end - start;
    params.q = q.data();
    params.out = out.data();
    set_access(params);
    std::vector<double> reference(elements);
    {
      Status referenced = prefill_attention_reference(params, reference.data());
      ASSERT_TRUE(referenced.ok()) << referenced.to_string();
    }
    ASSERT_TRUE(prefill_attention_cpu(params, 3).ok());
    EXPECT_EQ(testing::count_nan(c.element, out), 0u);
    EXPECT_LT(testing::relative_error(c.element, out, reference), testing::tolerance(c.element))
        << "chunk [" << start << ", " << end << "), seed " << seed_;
  }
}

// Byte offset of (layer, kv, head, token) from the slot's base, written out from the layout
// definitions (docs/ARCHITECTURE.md "Layouts and their arithmetic"; not through KvView), with
// fragments granule-aligned.
std::uint64_t expected_offset(const LayoutPlan& plan, std::uint32_t layer, std::uint32_t kv,
                              std::uint32_t head, std::uint64_t token) {
  const Geometry& g = plan.geometry;
  const std::uint64_t row = std::uint64_t{g.head_dim} * g.element_bytes();
  switch (plan.layout) {
    case Layout::kHeadMajor:
      return ((std::uint64_t{layer} * 2 + kv) * g.kv_heads + head) * plan.fragment_stride +
             token * row;
    case Layout::kSeqMajor:
      return (std::uint64_t{layer} * 2 + kv) * plan.fragment_stride +
             (token * g.kv_heads + head) * row;
    case Layout::kTokenMajor:
      return (((token * g.layers + layer) * 2 + kv) * g.kv_heads + head) * row;
  }
  return 0;
}

// Append does not depend on the group: group 1 only.
class AttentionCpuAppendTest : public AttentionCpuTest {};

TEST_P(AttentionCpuAppendTest, AppendWritesEveryRowWhereTheLayoutSays) {
  const Config& c = GetParam();
  auto kv = KvArena::make(*driver_, geometry(), c.layout, 64, 3);
  ASSERT_TRUE(kv);
  std::vector<std::uint32_t> slots;
  for (int i = 0; i < 3; ++i) {
    auto slot = kv->arena->admit(64);
    ASSERT_TRUE(slot.ok());
    slots.push_back(*slot);
  }
  const std::size_t row_bytes = std::size_t{c.head_dim} * 2;
  // A prefill chunk into slot 1 at [5, 45), then a decode step of one token per sequence.
  const std::uint32_t chunk = 40;
  auto k = testing::random_elements(c.element, std::size_t{chunk} * kAttentionKvHeads * c.head_dim,
                                    random_);
  auto v = testing::random_elements(c.element, k.size() / 2, random_);
  AppendParams append = testing::append_rows(kv->arena->view(), kAttentionLayer, kAttentionKvHeads,
                                             chunk, k.data(), v.data());
  append.slot = slots[1];
  append.start = 5;
  ASSERT_TRUE(append_kv_cpu(append).ok());
  auto check = [&](std::uint32_t slot, std::uint64_t position, const std::uint8_t* k_row,
                   const std::uint8_t* v_row, std::uint32_t head) {
    const Address base = kv->arena->slot_base(slot);
    const auto* at = reinterpret_cast<const std::uint8_t*>(
        base + expected_offset(kv->arena->plan(), kAttentionLayer, 0, head, position));
    EXPECT_EQ(std::memcmp(at, k_row, row_bytes), 0) << "K slot " << slot << " at " << position;
    at = reinterpret_cast<const std::uint8_t*>(
        base + expected_offset(kv->arena->plan(), kAttentionLayer, 1, head, position));
    EXPECT_EQ(std::memcmp(at, v_row, row_bytes), 0) << "V slot " << slot << " at " << position;
  };
  for (std::uint32_t i = 0; i < chunk; ++i) {
    for (std::uint32_t h = 0; h < kAttentionKvHeads; ++h) {
      const std::size_t from = (std::size_t{i} * kAttentionKvHeads + h) * row_bytes;
      check(slots[1], 5 + i, &k[from], &v[from], h);
    }
  }
  std::vector<std::uint32_t> positions = {63, 45, 0};
  k = testing::random_elements(c.element, 3 * kAttentionKvHeads * c.head_dim, random_);
  v = testing::random_elements(c.element, k.size() / 2, random_);
  append.tokens = 3;
  append.k = k.data();
  append.v = v.data();
  append.row_slots = slots.data();
  append.row_positions = positions.data();
  ASSERT_TRUE(append_kv_cpu(append).ok());
  for (std::uint32_t b = 0; b < 3; ++b) {
    for (std::uint32_t h = 0; h < kAttentionKvHeads; ++h) {
      const std::size_t from = (std::size_t{b} * kAttentionKvHeads + h) * row_bytes;
      check(slots[b], positions[b], &k[from], &v[from], h);
    }
  }
}

// Under ThreadSanitizer one configuration per layout (support/sanitizer.h says why).
INSTANTIATE_TEST_SUITE_P(
    Paths, AttentionCpuTest,
    ::testing::ValuesIn(testing::sampled_under_thread_sanitizer(testing::all_attention_configs())),
    testing::attention_config_name);
INSTANTIATE_TEST_SUITE_P(Paths, AttentionCpuPrefillTest,
                         ::testing::ValuesIn(testing::sampled_under_thread_sanitizer(
                             testing::attention_configs_with_groups({4, 7}))),
                         testing::attention_config_name);
// The same with an e4m3 cache: the kernels against the float64 reference over the
// dequantized cache, so the only differences are the activations' rounding.
INSTANTIATE_TEST_SUITE_P(Fp8, AttentionCpuTest,
                         ::testing::ValuesIn(testing::sampled_under_thread_sanitizer(
                             testing::with_fp8_cache(testing::all_attention_configs()))),
                         testing::attention_config_name);
INSTANTIATE_TEST_SUITE_P(
    Fp8, AttentionCpuPrefillTest,
    ::testing::ValuesIn(testing::sampled_under_thread_sanitizer(
        testing::with_fp8_cache(testing::attention_configs_with_groups({4, 7})))),
    testing::attention_config_name);
INSTANTIATE_TEST_SUITE_P(Paths, AttentionCpuAppendTest,
                         ::testing::ValuesIn(testing::attention_configs_with_groups({1})),
                         testing::attention_config_name);

TEST(AttentionCpuMaskingTest, NanTailOfAReusedSlotIsNeverRead) {
  auto made = make_host_driver();
  ASSERT_TRUE(made.ok());
  std::unique_ptr<Driver> driver = std::move(made).value();
  const Geometry geometry{"mask", 2, 2, 64, DType::kBf16};
  auto kv = KvArena::make(*driver, geometry, Layout::kSeqMajor, 512, 2);
  ASSERT_TRUE(kv);
  Arena& arena = *kv->arena;
  auto old_slot = arena.admit(500);
  ASSERT_TRUE(old_slot.ok());
  std::vector<std::uint8_t> nan_rows(500 * 2 * 64 * 2, 0xff);
  AppendParams append =
      testing::append_rows(arena.view(), kAttentionLayer, 2, 500, nan_rows.data(), nan_rows.data());
  append.slot = *old_slot;
  ASSERT_TRUE(append_kv_cpu(append).ok());
  ASSERT_TRUE(arena.finish(*old_slot).ok());
  auto dirty = arena.admit(100);
  ASSERT_TRUE(dirty.ok());
  ASSERT_EQ(*dirty, *old_slot) << "the finished slot's windows should be reused";
  auto clean = arena.admit(100);
  ASSERT_TRUE(clean.ok());
  std::mt19937_64 random(testing::fresh_seed());
  auto k = testing::random_elements(DType::kBf16, 100 * 2 * 64, random);
  auto v = testing::random_elements(DType::kBf16, 100 * 2 * 64, random);
  append.tokens = 100;
  append.k = k.data();
  append.v = v.data();
  for (std::uint32_t slot : {*dirty, *clean}) {
    append.slot = slot;
    ASSERT_TRUE(append_kv_cpu(append).ok());
  }
  auto q = testing::random_elements(DType::kBf16, 8 * 64, random, 2.0f);
  std::vector<std::uint8_t> q2 = q;
  q2.insert(q2.end(), q.begin(), q.end());
  std::vector<std::uint32_t> slots = {*dirty, *clean}, lengths = {100, 100};
  std::vector<std::uint8_t> out(2 * 8 * 64 * 2, 0xff);
  DecodeParams params;
  params.view = arena.view();
  params.layer = kAttentionLayer;
  params.qo_heads = 8;
  params.kv_heads = 2;
  params.batch = 2;
  params.q = q2.data();
  params.slots = slots.data();
  params.lengths = lengths.data();
  params.max_length = 512;
  params.out = out.data();
  ASSERT_TRUE(decode_attention_cpu(params, 2).ok());
  EXPECT_EQ(testing::count_nan(DType::kBf16, out), 0u);
  EXPECT_EQ(std::memcmp(out.data(), out.data() + out.size() / 2, out.size() / 2), 0);
  std::vector<double> reference(2 * 8 * 64);
  {
    Status referenced = decode_attention_reference(params, reference.data());
    ASSERT_TRUE(referenced.ok()) << referenced.to_string();
  }
  EXPECT_LT(testing::relative_error(DType::kBf16, out, reference), 1e-2);
}

TEST(AttentionElementTest, ConversionsRoundToNearestEven) {
  std::uint16_t bits = 0;
  auto half = [&](float value) {
    float_to_element(DType::kFp16, value, &bits);
    return bits;
  };
  auto bf16 = [&](float value) {
    float_to_element(DType::kBf16, value, &bits);
    return bits;
  };
  EXPECT_EQ(half(1.0f), 0x3c00);
  EXPECT_EQ(half(-2.0f), 0xc000);
  EXPECT_EQ(half(65504.0f), 0x7bff);
  EXPECT_EQ(half(65520.0f), 0x7c00);            // rounds to infinity
  EXPECT_EQ(half(5.9604645e-08f), 0x0001);      // the smallest subnormal
  EXPECT_EQ(half(1.0f + 1.0f / 2048), 0x3c00);  // halfway: to even
  EXPECT_EQ(half(1.0f + 3.0f / 2048), 0x3c02);  // halfway: to even (up)
  EXPECT_EQ(half(6.097555e-05f), 0x03ff);       // the largest subnormal
  EXPECT_EQ(bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16(1.0f + 1.0f / 256), 0x3f80);  // halfway: to even
  EXPECT_EQ(bf16(1.0f + 3.0f / 256), 0x3f82);
  for (std::uint32_t h = 0; h < 0x7c00; h += 7) {  // every finite positive half round-trips
    const auto raw = static_cast<std::uint16_t>(h);
    EXPECT_EQ(half(element_to_float(DType::kFp16, &raw)), raw);
  }
}

TEST(AttentionChecksTest, MalformedCallsAreRefusedWithTheirNumbers) {
  auto plan = plan_layout(Geometry{"c", 1, 2, 64, DType::kFp16}, Layout::kTokenMajor, 4096, 16);
  ASSERT_TRUE(plan.ok());
  std::uint32_t word = 0;
  DecodeParams params;
  params.view = plan->view(4096);
  params.qo_heads = 6;
  params.kv_heads = 4;
  params.batch = 1;
  params.q = params.out = &word;
  params.slots = params.lengths = &word;
  params.max_length = 16;
  Status refused = decode_attention_cpu(params);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("6 query heads are not a positive multiple of 4"),
            std::string::npos)
      << refused.to_string();
  params.qo_heads = 4;
  params.max_length = 0;
  EXPECT_EQ(decode_attention_cpu(params).code(), StatusCode::kInvalidArgument);
  params.view.element = DType::kUnset;
  params.max_length = 16;
  EXPECT_EQ(decode_attention_reference(params, nullptr).code(), StatusCode::kInvalidArgument);
  AppendParams append;
  append.view = plan->view(4096);
  append.kv_heads = 2;
  append.row_slots = &word;  // without row_positions
  EXPECT_EQ(append_kv_cpu(append).code(), StatusCode::kInvalidArgument);
  std::uint32_t too_long = 17;
  params.view = plan->view(4096);
  params.lengths = &too_long;
  refused = decode_attention_cpu(params);
  EXPECT_NE(refused.message().find("17 tokens, above max_length 16"), std::string::npos)
      << refused.to_string();
}

}  // namespace
}  // namespace kvvm
