// Layouts and their arithmetic: the reference's worked numbers, refusals, and the property
// that proves the formulas: for random small geometries, the KvView addresses every byte of
// a slot exactly once, and the commit floor equals a brute-force count of the granule windows
// that n tokens' bytes touch (and the shareable prefix equals a count of the windows that
// hold prefix bytes only).
#include "kvvm/kv/layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kvvm/model/kv_config.h"
#include "support/text_match.h"

namespace kvvm::layout_test {
namespace {

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = 1024 * kKiB;
constexpr std::uint64_t kGiB = 1024 * kMiB;

Geometry model(const char* name, DType dtype = DType::kFp16) {
  Result<kvvm::model::ModelConfig> config = kvvm::model::builtin_model_config(name);
  if (!config.ok()) throw std::runtime_error(config.status().to_string());
  return kvvm::model::kv_geometry(*config, dtype);
}

LayoutPlan plan(const Geometry& geometry, Layout layout, std::uint64_t granule = 2 * kMiB,
                std::uint64_t max_context = 8192) {
  Result<LayoutPlan> planned = plan_layout(geometry, layout, granule, max_context);
  if (!planned.ok()) throw std::runtime_error(planned.status().to_string());
  return *planned;
}

using test::contains;

TEST(Layout, NamesParseAndRoundTrip) {
  EXPECT_EQ(all_layouts(),
            (std::vector<Layout>{Layout::kHeadMajor, Layout::kSeqMajor, Layout::kTokenMajor}));
  for (Layout layout : all_layouts()) EXPECT_EQ(*parse_layout(to_string(layout)), layout);
  EXPECT_EQ(*parse_layout("bnsh"), Layout::kHeadMajor);
  EXPECT_EQ(*parse_layout("BSNH"), Layout::kSeqMajor);
  EXPECT_EQ(*parse_layout("token"), Layout::kTokenMajor);
  Result<Layout> bad = parse_layout("paged");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(bad.status().message(), "'paged'"));
  EXPECT_TRUE(contains(bad.status().message(), "token-major"));
}

TEST(Layout, FragmentsAndContiguousBytesPerLayout) {
  const Geometry g = model("qwen2.5-14b");  // L 48, H 8, D 128, e 2
  const LayoutPlan head = plan(g, Layout::kHeadMajor);
  EXPECT_EQ(head.fragments, 48u * 2 * 8);
  EXPECT_EQ(head.contiguous_bytes_per_token, 128u * 2);
  const LayoutPlan seq = plan(g, Layout::kSeqMajor);
  EXPECT_EQ(seq.fragments, 48u * 2);
  EXPECT_EQ(seq.contiguous_bytes_per_token, 8u * 128 * 2);
  const LayoutPlan token = plan(g, Layout::kTokenMajor);
  EXPECT_EQ(token.fragments, 1u);
  EXPECT_EQ(token.contiguous_bytes_per_token, 196'608u);
  for (const LayoutPlan& p : {head, seq, token}) {
    EXPECT_EQ(p.bytes_per_token, 196'608u) << to_string(p.layout);
    EXPECT_EQ(p.fragment_stride % p.granule, 0u);
    EXPECT_EQ(p.slot_stride, p.fragments * p.fragment_stride);
    // 8192 tokens x 192 KiB is a whole number of 2 MiB granules in every layout.
    EXPECT_EQ(p.slot_stride, 8192u * 196'608u) << to_string(p.layout);
  }
  EXPECT_EQ(head.fragment_stride, 2 * kMiB);  // round_up(8192 x 256 B, 2 MiB)
  EXPECT_EQ(seq.fragment_stride, 16 * kMiB);  // 8192 x 2 KiB
  EXPECT_EQ(token.fragment_stride, 1536 * kMiB);

  // A fragment that is not a whole number of granules is rounded up.
  const LayoutPlan short_context = plan(g, Layout::kHeadMajor, 2 * kMiB, 100);
  EXPECT_EQ(short_context.fragment_stride, 2 * kMiB);
  EXPECT_EQ(short_context.slot_stride, 768 * 2 * kMiB);
}

TEST(Layout, HeadMajorQwenHalfBCommits96GranulesForOneToken) {
  const LayoutPlan head = plan(model("qwen2.5-0.5b"), Layout::kHeadMajor);
  EXPECT_EQ(head.fragments, 96u);
  EXPECT_EQ(head.windows_per_fragment(1), 1u);
  EXPECT_EQ(head.commit_floor(1), 96 * 2 * kMiB);
  EXPECT_EQ(head.commit_floor(1), 192 * kMiB);
  EXPECT_EQ(head.commit_floor(0), 0u);
  // Still one window per fragment up to the crossover (16384 tokens > this max context).
  EXPECT_EQ(head.commit_floor(8192), 192 * kMiB);
}

TEST(Layout, TokenMajorFloorIsOneGranule) {
  for (const std::string& name : kvvm::model::builtin_model_names()) {
    for (std::uint64_t granule : {2 * kMiB, 1 * kMiB, 512 * kKiB}) {
      const LayoutPlan token = plan(model(name.c_str()), Layout::kTokenMajor, granule);
      ASSERT_LE(token.contiguous_bytes_per_token, granule) << name;
      EXPECT_EQ(token.commit_floor(1), granule) << name << " at " << granule;
    }
  }
  // Per-layer layouts need L x 2 (seq-major) or L x 2 x H (head-major) granules first.
  const Geometry g = model("llama-3-8b");
  EXPECT_EQ(plan(g, Layout::kSeqMajor).commit_floor(1), 32u * 2 * 2 * kMiB);
  EXPECT_EQ(plan(g, Layout::kHeadMajor).commit_floor(1), 32u * 2 * 8 * 2 * kMiB);
}

TEST(Layout, HeadMajorCrossoverIsGranuleOverHeadDimTimesElementBytes) {
  for (const char* name : {"llama-3-8b", "qwen2.5-7b", "qwen2.5-14b", "llama-3-70b"}) {
    EXPECT_DOUBLE_EQ(plan(model(name), Layout::kHeadMajor).crossover_tokens(), 8192.0) << name;
  }
  EXPECT_DOUBLE_EQ(plan(model("qwen2.5-0.5b"), Layout::kHeadMajor).crossover_tokens(), 16384.0);
}

TEST(Layout, SeqMajorCrossoverDividesByKvHeadsAndFp8Doubles) {
  for (const std::string& name : kvvm::model::builtin_model_names()) {
    const Geometry fp16 = model(name.c_str());
    const Geometry fp8 = model(name.c_str(), DType::kFp8);
    const double head = plan(fp16, Layout::kHeadMajor).crossover_tokens();
    const double seq = plan(fp16, Layout::kSeqMajor).crossover_tokens();
    const double token = plan(fp16, Layout::kTokenMajor).crossover_tokens();
    EXPECT_DOUBLE_EQ(seq, head / fp16.kv_heads) << name;
    EXPECT_DOUBLE_EQ(token, seq / (2.0 * fp16.layers)) << name;
    for (Layout layout : all_layouts()) {
      EXPECT_DOUBLE_EQ(plan(fp8, layout).crossover_tokens(),
                       2 * plan(fp16, layout).crossover_tokens())
          << name << " " << to_string(layout);
    }
  }
  EXPECT_DOUBLE_EQ(plan(model("llama-3-8b"), Layout::kSeqMajor).crossover_tokens(), 1024.0);
  EXPECT_DOUBLE_EQ(plan(model("qwen2.5-0.5b", DType::kFp8), Layout::kHeadMajor).crossover_tokens(),
                   32768.0);
}

TEST(Layout, CrossoverSeparatesRoundingFromLiveBytes) {
  // Below the crossover every fragment's floor is one granule; past it the floor follows the
  // live bytes, within one granule per fragment.
  const LayoutPlan head = plan(model("llama-3-8b"), Layout::kHeadMajor, 2 * kMiB, 65536);
  EXPECT_EQ(head.commit_floor(8192), head.commit_floor(1));
  EXPECT_GT(head.commit_floor(8193), head.commit_floor(8192));
  for (std::uint64_t n : {8193u, 20000u, 65536u}) {
    const std::uint64_t live = n * head.bytes_per_token;
    EXPECT_GE(head.commit_floor(n), live);
    EXPECT_LT(head.commit_floor(n), live + head.fragments * head.granule);
  }
}

TEST(Layout, PrefixOf32TokensSharesAt4KiBButIsRefusedAt2MiB) {
  const Geometry g = model("qwen2.5-0.5b");  // head-major: 128 B per token per fragment
  const PrefixShareability small = prefix_shareability(plan(g, Layout::kHeadMajor, 4 * kKiB), 32);
  EXPECT_TRUE(small.shareable) << small.refusal_reason;
  EXPECT_EQ(small.prefix_tokens, 32u);
  EXPECT_EQ(small.fragment_bytes, 4096u);
  EXPECT_EQ(small.shareable_granules_per_fragment, 1u);
  EXPECT_EQ(small.mapping_operations, 96u);
  EXPECT_EQ(small.boundary_bytes_per_sharer, 0u);
  EXPECT_EQ(small.shared_bytes, 96 * 4 * kKiB);
  EXPECT_TRUE(small.refusal_reason.empty());

  const PrefixShareability large = prefix_shareability(plan(g, Layout::kHeadMajor), 32);
  EXPECT_FALSE(large.shareable);
  EXPECT_EQ(large.fragment_bytes, 4096u);
  EXPECT_EQ(large.shareable_granules_per_fragment, 0u);
  EXPECT_EQ(large.mapping_operations, 0u);
  EXPECT_EQ(large.shared_bytes, 0u);
  EXPECT_EQ(large.boundary_bytes_per_sharer, 96u * 4096) << "the whole prefix stays private";
  for (const char* part :
       {"not shareable", "head-major", "2 MiB", "4 KiB", "fragment_bytes < granule", "16384"}) {
    EXPECT_TRUE(contains(large.refusal_reason, part))
        << part << " not in: " << large.refusal_reason;
  }
}

TEST(Layout, A4KiBGranuleSharesEveryModelAndLayoutOnceFragmentBytesReachIt) {
  // "Any prefix" at 4 KiB means: as soon as P x contiguous >= 4 KiB, which for these models is
  // at most 32 tokens (head-major, head dim 64, fp16) and one token in token-major.
  for (const std::string& name : kvvm::model::builtin_model_names()) {
    for (Layout layout : all_layouts()) {
      const LayoutPlan p = plan(model(name.c_str()), layout, 4 * kKiB);
      const std::uint64_t needed =
          (4 * kKiB + p.contiguous_bytes_per_token - 1) / p.contiguous_bytes_per_token;
      EXPECT_LE(needed, 32u) << name << " " << to_string(layout);
      EXPECT_TRUE(prefix_shareability(p, needed).shareable) << name << " " << to_string(layout);
      if (needed > 1) {
        const PrefixShareability below = prefix_shareability(p, needed - 1);
        EXPECT_FALSE(below.shareable) << name << " " << to_string(layout);
        EXPECT_TRUE(contains(below.refusal_reason, std::to_string(needed))) << below.refusal_reason;
      }
      if (layout == Layout::kTokenMajor) {
        EXPECT_EQ(needed, 1u) << name;
      }
    }
  }
}

TEST(Layout, ShareabilityCountsGranulesOpsAndBoundaryBytes) {
  const Geometry g = model("qwen2.5-14b");
  // seq-major: 2048 x 2 KiB = 4 MiB per fragment: 2 granules x 96 fragments.
  const PrefixShareability seq = prefix_shareability(plan(g, Layout::kSeqMajor), 2048);
  EXPECT_TRUE(seq.shareable);
  EXPECT_EQ(seq.shareable_granules_per_fragment, 2u);
  EXPECT_EQ(seq.mapping_operations, 192u);
  EXPECT_EQ(seq.shared_bytes, 384 * kMiB);
  EXPECT_EQ(seq.boundary_bytes_per_sharer, 0u);
  // 2100 tokens x 2 KiB: 2 whole granules (2048 tokens), 52 tokens x 2 KiB left per fragment.
  const PrefixShareability ragged = prefix_shareability(plan(g, Layout::kSeqMajor), 2100);
  EXPECT_EQ(ragged.shareable_granules_per_fragment, 2u);
  EXPECT_EQ(ragged.boundary_bytes_per_sharer, 96u * 52 * 2048);
  // token-major: 2048 x 192 KiB = 384 MiB in one fragment.
  const PrefixShareability token = prefix_shareability(plan(g, Layout::kTokenMajor), 2048);
  EXPECT_EQ(token.shareable_granules_per_fragment, 192u);
  EXPECT_EQ(token.mapping_operations, 192u);
  EXPECT_EQ(token.shared_bytes, 384 * kMiB);
}

TEST(Layout, GranuleZeroIsRefusedNeverDividedBy) {
  const Geometry g = model("llama-3-8b");
  for (Layout layout : all_layouts()) {
    Result<LayoutPlan> planned = plan_layout(g, layout, 0, 8192);
    ASSERT_FALSE(planned.ok());
    EXPECT_EQ(planned.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(contains(planned.status().message(), "granule")) << planned.status().message();
    EXPECT_TRUE(contains(planned.status().message(), "got 0")) << planned.status().message();
  }
  // A hand-made plan with granule 0 reaches prefix_shareability as a refusal, not a fault.
  LayoutPlan hand_made = plan(g, Layout::kSeqMajor);
  hand_made.granule = 0;
  const PrefixShareability refused = prefix_shareability(hand_made, 2048);
  EXPECT_FALSE(refused.shareable);
  EXPECT_TRUE(contains(refused.refusal_reason, "granule is 0")) << refused.refusal_reason;
  EXPECT_DEATH((void)hand_made.commit_floor(1), "the LayoutPlan has a zero granule");
  EXPECT_DEATH((void)hand_made.crossover_tokens(), "crossover_tokens: the LayoutPlan");
  EXPECT_DEATH((void)admissible_concurrency(hand_made, 8192, 0, kGiB),
               "admissible_concurrency: the LayoutPlan");
  EXPECT_DEATH((void)LayoutPlan{}.windows_per_fragment(1), "make it with plan_layout");
}

TEST(Layout, ZeroSizesAndOverflowAreRefusedNamingTheValue) {
  Geometry g = model("llama-3-8b");
  Result<LayoutPlan> no_context = plan_layout(g, Layout::kTokenMajor, 2 * kMiB, 0);
  ASSERT_FALSE(no_context.ok());
  EXPECT_TRUE(contains(no_context.status().message(), "max context"))
      << no_context.status().message();

  for (std::uint32_t Geometry::*field :
       {&Geometry::layers, &Geometry::kv_heads, &Geometry::head_dim}) {
    Geometry zero = g;
    zero.*field = 0;
    Result<LayoutPlan> planned = plan_layout(zero, Layout::kHeadMajor, 2 * kMiB, 8192);
    ASSERT_FALSE(planned.ok());
    EXPECT_EQ(planned.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(contains(planned.status().message(), "at least 1")) << planned.status().message();
  }

  const std::uint64_t huge = std::numeric_limits<std::uint64_t>::max() / 1000;
  Result<LayoutPlan> overflow = plan_layout(g, Layout::kTokenMajor, 2 * kMiB, huge);
  ASSERT_FALSE(overflow.ok());
  EXPECT_TRUE(contains(overflow.status().message(), "64 bits")) << overflow.status().message();
  EXPECT_TRUE(contains(overflow.status().message(), std::to_string(huge)));

  Geometry wide = g;
  wide.layers = wide.kv_heads = wide.head_dim = std::numeric_limits<std::uint32_t>::max();
  EXPECT_FALSE(plan_layout(wide, Layout::kTokenMajor, 2 * kMiB, 1).ok());
}

TEST(Layout, QueriesPastTheSlotAreProgrammingErrors) {
  const LayoutPlan p = plan(model("llama-3-8b"), Layout::kTokenMajor, 2 * kMiB, 1024);
  (void)p.commit_floor(1024);
  EXPECT_DEATH((void)p.commit_floor(1025), "1025 tokens\\): the slot holds at most 1024 tokens");
  const PrefixShareability too_long = prefix_shareability(p, 1025);
  EXPECT_FALSE(too_long.shareable);
  EXPECT_TRUE(contains(too_long.refusal_reason, "max context")) << too_long.refusal_reason;
  EXPECT_FALSE(prefix_shareability(p, 0).shareable);
  EXPECT_TRUE(contains(prefix_shareability(p, 0).refusal_reason, "no prefix"));
}

TEST(Layout, KvViewStridesMatchEachLayout) {
  const Geometry g = model("qwen2.5-14b");  // L 48, H 8, D 128, e 2
  const std::uint64_t base = 0x7f0000000000;
  const LayoutPlan head = plan(g, Layout::kHeadMajor);
  const KvView hv = head.view(base);
  EXPECT_EQ(hv.base, base);
  EXPECT_EQ(hv.slot_stride, head.slot_stride);
  EXPECT_EQ(hv.layer_stride, 2 * 8 * head.fragment_stride);
  EXPECT_EQ(hv.kv_stride, 8 * head.fragment_stride);
  EXPECT_EQ(hv.head_stride, head.fragment_stride);
  EXPECT_EQ(hv.token_stride, 256u);
  EXPECT_EQ(hv.element_bytes, 2u);
  EXPECT_EQ(hv.head_dim, 128u);

  const LayoutPlan seq = plan(g, Layout::kSeqMajor);
  const KvView sv = seq.view(base);
  EXPECT_EQ(sv.layer_stride, 2 * seq.fragment_stride);
  EXPECT_EQ(sv.kv_stride, seq.fragment_stride);
  EXPECT_EQ(sv.head_stride, 256u);
  EXPECT_EQ(sv.token_stride, 2048u);

  const LayoutPlan token = plan(g, Layout::kTokenMajor);
  const KvView tv = token.view(base);
  EXPECT_EQ(tv.slot_stride, token.slot_stride);
  EXPECT_EQ(tv.layer_stride, 2u * 8 * 256);
  EXPECT_EQ(tv.kv_stride, 8u * 256);
  EXPECT_EQ(tv.head_stride, 256u);
  EXPECT_EQ(tv.token_stride, 196'608u);
  EXPECT_EQ(tv.address(1, 0, 0, 0, 0), base + token.slot_stride);
}

// The property: brute force over every byte of a slot of a random small geometry.
TEST(Layout, RandomGeometriesViewIsABijectionAndFloorsCountTouchedWindows) {
  std::mt19937_64 random(20240601);
  const auto pick = [&random](std::uint64_t low, std::uint64_t high) {
    return std::uniform_int_distribution<std::uint64_t>(low, high)(random);
  };
  const DType dtypes[] = {DType::kFp16, DType::kBf16, DType::kFp8, DType::kFp32};
  const std::uint64_t granules[] = {1, 2, 3, 7, 8, 16, 48, 64, 100, 256, 4096};
  for (int trial = 0; trial < 300; ++trial) {
    Geometry g;
    g.name = "random";
    g.layers = static_cast<std::uint32_t>(pick(1, 3));
    g.kv_heads = static_cast<std::uint32_t>(pick(1, 3));
    g.head_dim = static_cast<std::uint32_t>(pick(1, 6));
    g.dtype = dtypes[pick(0, 3)];
    const std::uint64_t granule = granules[pick(0, std::size(granules) - 1)];
    const std::uint64_t max_context = pick(1, 10);
    const std::uint64_t e = g.element_bytes();
    for (Layout layout : all_layouts()) {
      const LayoutPlan p = plan(g, layout, granule, max_context);
      SCOPED_TRACE(std::string(to_string(layout)) + " L" + std::to_string(g.layers) + " H" +
                   std::to_string(g.kv_heads) + " D" + std::to_string(g.head_dim) + " e" +
                   std::to_string(e) + " G" + std::to_string(granule) + " ctx" +
                   std::to_string(max_context));
      ASSERT_EQ(p.slot_stride % granule, 0u);
      const KvView view = p.view(0);
      ASSERT_EQ(view.element_bytes, e);
      ASSERT_EQ(view.head_dim, g.head_dim);

      // Every byte of (layer, kv, head, token, dim) in its own place inside the slot.
      std::set<std::uint64_t> offsets;
      std::vector<std::set<std::uint64_t>> windows_by_tokens(max_context + 1);
      std::vector<std::vector<std::uint64_t>> bytes_of_token(max_context);
      for (std::uint64_t layer = 0; layer < g.layers; ++layer) {
        for (std::uint64_t kv = 0; kv < 2; ++kv) {
          for (std::uint64_t head = 0; head < g.kv_heads; ++head) {
            for (std::uint64_t token = 0; token < max_context; ++token) {
              for (std::uint64_t byte = 0; byte < g.head_dim * e; ++byte) {
                const std::uint64_t offset = view.offset(0, layer, kv, head, token) + byte;
                ASSERT_LT(offset, p.slot_stride);
                ASSERT_TRUE(offsets.insert(offset).second) << "offset " << offset << " twice";
                bytes_of_token[token].push_back(offset);
              }
            }
          }
        }
      }
      ASSERT_EQ(offsets.size(), max_context * p.bytes_per_token);

      // Tokens [0, n) touch exactly commit_floor(n) / granule windows.
      std::set<std::uint64_t> touched;
      ASSERT_EQ(p.commit_floor(0), 0u);
      for (std::uint64_t n = 1; n <= max_context; ++n) {
        for (std::uint64_t offset : bytes_of_token[n - 1]) touched.insert(offset / granule);
        ASSERT_EQ(p.commit_floor(n), touched.size() * granule) << "n = " << n;
        ASSERT_EQ(p.commit_floor(n), p.fragments * p.windows_per_fragment(n) * granule);
      }

      // Prefix of P tokens: the windows holding prefix bytes and nothing else (neither later
      // tokens nor padding) are the shareable ones; the other prefix bytes are boundary bytes.
      // A window is all prefix iff the latest token owning any of its bytes is < P, with
      // padding owned by "token max_context".
      std::vector<std::uint64_t> latest_token(p.slot_stride / granule, 0);
      std::vector<std::uint64_t> owned(p.slot_stride / granule, 0);
      for (std::uint64_t token = 0; token < max_context; ++token) {
        for (std::uint64_t offset : bytes_of_token[token]) {
          latest_token[offset / granule] = std::max(latest_token[offset / granule], token);
          ++owned[offset / granule];
        }
      }
      for (std::uint64_t w = 0; w < latest_token.size(); ++w) {
        if (owned[w] < granule) latest_token[w] = max_context;  // holds padding
      }
      for (std::uint64_t prefix = 1; prefix <= max_context; ++prefix) {
        std::uint64_t whole_windows = 0;
        for (std::uint64_t latest : latest_token) whole_windows += latest < prefix ? 1 : 0;
        const std::uint64_t prefix_bytes = prefix * p.bytes_per_token;
        const PrefixShareability s = prefix_shareability(p, prefix);
        ASSERT_EQ(s.mapping_operations, whole_windows) << "P = " << prefix;
        ASSERT_EQ(s.shared_bytes, whole_windows * granule);
        ASSERT_EQ(s.shareable, whole_windows > 0);
        ASSERT_EQ(s.boundary_bytes_per_sharer, prefix_bytes - whole_windows * granule);
        ASSERT_EQ(s.refusal_reason.empty(), s.shareable);
      }
    }
  }
}

TEST(Layout, ConcurrencyWithAndWithoutSharing) {
  const LayoutPlan seq = plan(model("qwen2.5-14b"), Layout::kSeqMajor);
  const Concurrency c = admissible_concurrency(seq, 8192, 2048, 40 * kGiB);
  EXPECT_EQ(c.per_sequence_bytes, 1536 * kMiB);
  EXPECT_EQ(c.prefix_bytes, 384 * kMiB);
  EXPECT_EQ(c.private_bytes, 1152 * kMiB);
  EXPECT_EQ(c.without_sharing, 26u);  // floor(40 GiB / 1.5 GiB)
  EXPECT_EQ(c.with_sharing, 35u);     // 384 MiB + 35 x 1152 MiB = 40704 MiB <= 40960 MiB
  // The shorter 1 + floor((B - prefix) / private) would say 36, which does not fit:
  EXPECT_GT(c.prefix_bytes + 36 * c.private_bytes, 40 * kGiB);

  // An unshareable prefix changes nothing.
  const LayoutPlan head = plan(model("qwen2.5-14b"), Layout::kHeadMajor);
  const Concurrency h = admissible_concurrency(head, 8192, 2048, 40 * kGiB);
  EXPECT_EQ(h.prefix_bytes, 0u);
  EXPECT_EQ(h.private_bytes, h.per_sequence_bytes);
  EXPECT_EQ(h.with_sharing, h.without_sharing);

  // Exactly one sequence's worth admits one, with or without sharing; less admits none.
  const Concurrency one = admissible_concurrency(seq, 8192, 2048, 1536 * kMiB);
  EXPECT_EQ(one.without_sharing, 1u);
  EXPECT_EQ(one.with_sharing, 1u);
  const Concurrency none = admissible_concurrency(seq, 8192, 2048, 1536 * kMiB - 1);
  EXPECT_EQ(none.without_sharing, 0u);
  EXPECT_EQ(none.with_sharing, 0u);

  // Memory for N sequences.
  EXPECT_EQ(c.bytes_without_sharing(30), 30 * 1536 * kMiB);
  EXPECT_EQ(c.bytes_with_sharing(30), 384 * kMiB + 30 * 1152 * kMiB);
  EXPECT_EQ(c.bytes_with_sharing(0), 0u);
  EXPECT_EQ(c.bytes_without_sharing(std::numeric_limits<std::uint64_t>::max()), std::nullopt);
  EXPECT_EQ(c.bytes_with_sharing(std::numeric_limits<std::uint64_t>::max()), std::nullopt);
}

TEST(Layout, ConcurrencyMatchesABruteForceFit) {
  std::mt19937_64 random(7);
  const auto pick = [&random](std::uint64_t low, std::uint64_t high) {
    return std::uniform_int_distribution<std::uint64_t>(low, high)(random);
  };
  const Geometry g = model("qwen2.5-0.5b");
  for (int trial = 0; trial < 400; ++trial) {
    const Layout layout = all_layouts()[pick(0, 2)];
    const std::uint64_t granule = std::uint64_t{4096} << pick(0, 9);
    const std::uint64_t context = pick(1, 4096);
    const std::uint64_t prefix = pick(0, context - 1);
    const LayoutPlan p = plan(g, layout, granule, context);
    const std::uint64_t budget = pick(0, 64 * p.commit_floor(context));
    const Concurrency c = admissible_concurrency(p, context, prefix, budget);
    SCOPED_TRACE(std::string(to_string(layout)) + " G" + std::to_string(granule) + " ctx" +
                 std::to_string(context) + " P" + std::to_string(prefix) + " B" +
                 std::to_string(budget));
    ASSERT_EQ(c.per_sequence_bytes, c.prefix_bytes + c.private_bytes);
    ASSERT_GT(c.private_bytes, 0u);
    // The largest n whose memory fits, found by counting up.
    const auto largest_fit = [budget](auto bytes_for) {
      std::uint64_t n = 0;
      while (*bytes_for(n + 1) <= budget) ++n;
      return n;
    };
    ASSERT_EQ(c.without_sharing,
              largest_fit([&c](std::uint64_t n) { return c.bytes_without_sharing(n); }));
    ASSERT_EQ(c.with_sharing,
              largest_fit([&c](std::uint64_t n) { return c.bytes_with_sharing(n); }));
    ASSERT_GE(c.with_sharing, c.without_sharing) << "sharing never admits fewer";
  }
}

TEST(Layout, ConcurrencyPreconditionsFailLoudly) {
  const LayoutPlan p = plan(model("llama-3-8b"), Layout::kTokenMajor, 2 * kMiB, 1024);
  EXPECT_DEATH((void)admissible_concurrency(p, 0, 0, kGiB), "context of 0 tokens, need 1 to 1024");
  EXPECT_DEATH((void)admissible_concurrency(p, 1025, 0, kGiB), "context of 1025 tokens");
  EXPECT_DEATH((void)admissible_concurrency(p, 512, 512, kGiB), "prefix of 512 tokens");
  (void)admissible_concurrency(p, 1024, 1023, 0);
}

}  // namespace
}  // namespace kvvm::layout_test
