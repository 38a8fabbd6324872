// The CUDA attention kernels against the float64 reference, on fresh random data each run:
// every layout x fp16 / bf16 x head dim 64 / 128 x group sizes 1, 4, 7, 8, decode over
// lengths 1, 2, granule boundary +- 1, 4097 and 32768 in one batch (split planned, forced
// small, and off), causal prefill in two chunks (also at groups 12 and 16), a 70-token chunk
// after long cached prefixes (granule boundary +- 1, 4097) and first chunks of 1 and 2 tokens,
// append checked byte for byte, and a slot whose tail holds NaN from an earlier occupant. Outputs
// are poisoned (NaN) before each run, so an unwritten element fails like a wrong one. The KV lives
// in a CUDA-driver arena with only the live windows committed: a read past a length faults. Skipped
// (and reported skipped) without the CUDA compiler or a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kvvm/kernels/attention.h"
#include "kvvm/vmm/cuda_driver.h"
#include "support/attention_fixture.h"
#include "support/attention_support.h"
#include "support/pattern.h"
#if defined(KVVM_HAS_CUDA_KERNELS)
#include "support/decode_workspace.h"
#include "support/device_buffer.h"
#endif

namespace kvvm {
namespace {

using testing::KvArena;
using testing::Mirror;
using Config = testing::AttentionConfig;
using testing::kAttentionKvHeads;
using testing::kAttentionLayer;  // not 0: the layer stride is exercised

TEST(AttentionCudaChecks, UnsupportedShapesAreRefusedWithTheValue) {
#if !defined(KVVM_HAS_CUDA_KERNELS)
  EXPECT_FALSE(attention_kernels_built());
  DecodeParams params;
  EXPECT_EQ(decode_attention_cuda(params, nullptr, 0, nullptr).code(), StatusCode::kUnavailable);
#else
  EXPECT_TRUE(attention_kernels_built());
  auto plan = plan_layout(Geometry{"odd", 1, 2, 96, DType::kFp16}, Layout::kTokenMajor, 4096, 64);
  ASSERT_TRUE(plan.ok());
  std::uint32_t slot = 0, length = 1;
  DecodeParams params;
  params.view = plan->view(4096);
  params.qo_heads = 4;
  params.kv_heads = 2;
  params.batch = 1;
  params.q = params.out = &slot;
  params.slots = &slot;
  params.lengths = &length;
  params.max_length = 64;
  // All refused before any CUDA call, so this runs without a GPU too.
  Status refused = decode_attention_cuda(params, nullptr, 0, nullptr);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("head dim 96"), std::string::npos) << refused.to_string();
  PrefillParams prefill;
  prefill.view = params.view;
  prefill.qo_heads = 4;
  prefill.kv_heads = 2;
  EXPECT_EQ(prefill_attention_cuda(prefill, nullptr).code(), StatusCode::kInvalidArgument);
  params.view.head_dim = 128;
  params.view.element = DType::kFp32;
  params.view.element_bytes = 4;
  refused = decode_attention_cuda(params, nullptr, 0, nullptr);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("element type 4"), std::string::npos) << refused.to_string();
  params.view = plan->view(4096 + 8);  // base not 16-byte aligned
  params.view.head_dim = 64;
  EXPECT_EQ(decode_attention_cuda(params, nullptr, 0, nullptr).code(),
            StatusCode::kInvalidArgument);
#endif
}

#if defined(KVVM_HAS_CUDA_KERNELS)

using testing::DeviceBuffer;

class AttentionCudaTest : public testing::AttentionFixture {
 protected:
  void SetUp() override {
    auto made = make_cuda_driver();
    if (!made.ok()) GTEST_SKIP() << "no CUDA device: " << made.status().to_string();
    driver_ = std::move(made).value();
    seed_random();
    RecordProperty("seed", std::to_string(seed_));
  }

  // Random K and V for tokens [from, to) of the sequence, appended to the mirror (CPU) and
  // the device (CUDA) alike.
  void fill(const Mirror& mirror, std::uint32_t mirror_slot, const KvView& device_view,
            std::uint32_t device_slot, std::uint32_t from, std::uint32_t to) {
    const testing::KvRows rows = random_rows(to - from);
    AppendParams append = testing::append_rows(mirror.view, kAttentionLayer, kAttentionKvHeads,
                                               to - from, rows.k.data(), rows.v.data());
    append.slot = mirror_slot;
    append.start = from;
    set_access(append);
    ASSERT_TRUE(append_kv_cpu(append).ok());
    DeviceBuffer dk(rows.k), dv(rows.v);
    append.view = device_view;
    append.k = dk.get();
    append.v = dv.get();
    append.slot = device_slot;
    Status appended = append_kv_cuda(append, nullptr);
    ASSERT_TRUE(appended.ok()) << appended.to_string();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }

  // Rows of the device cache equal the mirror's byte for byte (first, last and sampled tokens).
  void expect_rows_equal(const Mirror& mirror, std::uint32_t mirror_slot, const KvView& device_view,
                         std::uint32_t device_slot, std::uint32_t length) {
    const std::size_t row_bytes = cache_row_bytes();
    std::vector<std::uint32_t> tokens = {0, length - 1, length / 2};
    for (int i = 0; i < 16; ++i) tokens.push_back(static_cast<std::uint32_t>(random_() % length));
    std::vector<std::uint8_t> got(row_bytes);
    for (std::uint32_t t : tokens) {
      for (std::uint32_t kv = 0; kv < 2; ++kv) {
        for (std::uint32_t h = 0; h < kAttentionKvHeads; ++h) {
          ASSERT_EQ(cudaMemcpy(got.data(),
                               reinterpret_cast<const void*>(
                                   device_view.address(device_slot, kAttentionLayer, kv, h, t)),
                               row_bytes, cudaMemcpyDeviceToHost),
                    cudaSuccess);
          const auto* want = reinterpret_cast<const std::uint8_t*>(
              mirror.view.address(mirror_slot, kAttentionLayer, kv, h, t));
          ASSERT_EQ(std::memcmp(got.data(), want, row_bytes), 0)
              << "token " << t << " kv " << kv << " head " << h;
        }
      }
    }
  }

  // Causal prefill of query rows [start, start + tokens) of a sequence whose tokens
  // [0, start + tokens) are already in the mirror and the device slot: the CUDA output has no
  // NaN and matches the float64 reference on fresh random queries.
  void expect_prefill_matches(const Mirror& mirror, std::uint32_t mirror_slot,
                              const KvView& device_view, std::uint32_t device_slot,
                              std::uint32_t start, std::uint32_t tokens) {
    const Config& c = GetParam();
    const std::uint32_t qo_heads = kAttentionKvHeads * c.group;
    const std::size_t elements = std::size_t{tokens} * qo_heads * c.head_dim;
    auto q = testing::random_elements(c.element, elements, random_, 2.0f);
    PrefillParams params;
    params.view = mirror.view;
    params.layer = kAttentionLayer;
    params.qo_heads = qo_heads;
    params.kv_heads = kAttentionKvHeads;
    params.slot = mirror_slot;
    params.start = start;
    params.tokens = tokens;
    params.q = q.data();
    set_access(params);
    std::vector<double> reference(elements);
    {
      Status referenced = prefill_attention_reference(params, reference.data());
      ASSERT_TRUE(referenced.ok()) << referenced.to_string();
    }
    DeviceBuffer dq(q), dout(elements * 2);
    dout.poison();
    params.view = device_view;
    params.slot = device_slot;
    params.q = dq.get();
    params.out = dout.get();
    Status done = prefill_attention_cuda(params, nullptr);
    ASSERT_TRUE(done.ok()) << done.to_string();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "the kernel faulted";
    const auto out = dout.download();
    EXPECT_EQ(testing::count_nan(c.element, out), 0u)
        << "chunk [" << start << ", " << start + tokens << ")";
    EXPECT_LT(testing::relative_error(c.element, out, reference), testing::tolerance(c.element))
        << "chunk [" << start << ", " << start + tokens << "), seed " << seed_;
  }

  // Two chunks of a 300-token prompt (129, then 171: neither a multiple of a tile).
  void prefill_in_two_chunks() {
    const Config& c = GetParam();
    const Geometry geometry = this->geometry();
    constexpr std::uint32_t kFirst = 129, kTotal = 300;
    auto kv = KvArena::make(*driver_, geometry, c.layout, 1024, 1);
    ASSERT_TRUE(kv);
    auto slot = kv->arena->admit(kTotal);
    ASSERT_TRUE(slot.ok()) << slot.status().to_string();
    Mirror mirror(geometry, c.layout, 1024, 1);
    for (auto [start, end] : {std::pair{0u, kFirst}, std::pair{kFirst, kTotal}}) {
      fill(mirror, 0, kv->arena->view(), *slot, start, end);
      if (HasFatalFailure()) return;
      expect_prefill_matches(mirror, 0, kv->arena->view(), *slot, start, end - start);
      if (HasFatalFailure()) return;
    }
  }
};

TEST_P(AttentionCudaTest, DecodeMatchesTheFloat64ReferenceAtEveryLength) {
  const Config& c = GetParam();
  const Geometry geometry = this->geometry();
  constexpr std::uint32_t kMaxContext = 32768;
  auto kv = KvArena::make(*driver_, geometry, c.layout, kMaxContext, 6);
  ASSERT_TRUE(kv);
  const std::uint64_t boundary =
      std::max<std::uint64_t>(2, driver_->granule() / kv->arena->plan().contiguous_bytes_per_token);
  // An fp8 head-major d64 token is 64 contiguous bytes: its first boundary is the context's
  // end, where the last length already sits.
  const std::vector<std::uint32_t> lengths = {
      1,
      2,
      static_cast<std::uint32_t>(boundary - 1),
      static_cast<std::uint32_t>(std::min<std::uint64_t>(boundary + 1, kMaxContext)),
      4097,
      kMaxContext};
  const std::uint32_t batch = static_cast<std::uint32_t>(lengths.size());
  Mirror mirror(geometry, c.layout, kMaxContext, batch);
  const KvView view = kv->arena->view();
  std::vector<std::uint32_t> slots, mirror_slots;
  for (std::uint32_t b = 0; b < batch; ++b) {
    auto slot = kv->arena->admit(lengths[b]);  // commits exactly the live windows
    ASSERT_TRUE(slot.ok()) << slot.status().to_string();
    slots.push_back(*slot);
    mirror_slots.push_back(b);
    fill(mirror, b, view, *slot, 0, lengths[b]);
    if (HasFatalFailure()) return;
    expect_rows_equal(mirror, b, view, *slot, lengths[b]);
    if (HasFatalFailure()) return;
  }
  const std::uint32_t qo_heads = kAttentionKvHeads * c.group;
  const std::size_t out_elements = std::size_t{batch} * qo_heads * c.head_dim;
  auto q = testing::random_elements(c.element, out_elements, random_, 2.0f);

  DecodeParams params;
  params.view = mirror.view;
  params.layer = kAttentionLayer;
  params.qo_heads = qo_heads;
  params.kv_heads = kAttentionKvHeads;
  params.batch = batch;
  params.q = q.data();
  params.slots = mirror_slots.data();
  params.lengths = lengths.data();
  params.max_length = kMaxContext;
  set_access(params);
  std::vector<double> reference(out_elements);
  {
    Status referenced = decode_attention_reference(params, reference.data());
    ASSERT_TRUE(referenced.ok()) << referenced.to_string();
  }

  DeviceBuffer dq(q), dslots(slots), dlengths(lengths), dout(out_elements * 2);
  params.view = view;
  params.q = dq.get();
  params.slots = static_cast<const std::uint32_t*>(dslots.get());
  params.lengths = static_cast<const std::uint32_t*>(dlengths.get());
  params.out = dout.get();
  // Planned split, a forced split into many small chunks (most empty for short sequences),
  // and no split at all.
  for (std::uint32_t chunk : {0u, 256u, kMaxContext}) {
    params.chunk_tokens = chunk;
    auto plan = plan_decode_cuda(params);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    DeviceBuffer workspace(testing::decode_workspace_bytes(*plan));
    testing::prepare_decode_workspace(workspace, *plan);
    // Twice on one workspace: the second call finds the counters the first one left, and
    // must give the same bits.
    std::vector<std::uint8_t> first;
    for (int call = 0; call < 2; ++call) {
      dout.poison();
      Status decoded = decode_attention_cuda(params, workspace.get(), workspace.bytes(), nullptr);
      ASSERT_TRUE(decoded.ok()) << decoded.to_string();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "the kernel faulted";
      EXPECT_EQ(testing::nonzero_counters(workspace, *plan), 0u) << "chunk " << chunk;
      const auto out = dout.download();
      if (call == 1) {
        EXPECT_EQ(out, first) << "a second call on the same workspace differs (chunk " << chunk
                              << ")";
        break;
      }
      first = out;
      EXPECT_EQ(testing::count_nan(c.element, out), 0u) << "chunk " << chunk;
      const double error = testing::relative_error(c.element, out, reference);
      EXPECT_LT(error, testing::tolerance(c.element))
          << "chunk " << chunk << " (plan: " << plan->chunks << " x " << plan->chunk_tokens
          << "), seed " << seed_;
    }
  }
}

TEST_P(AttentionCudaTest, CausalPrefillInTwoChunksMatchesTheReference) { prefill_in_two_chunks(); }

INSTANTIATE_TEST_SUITE_P(Kernels, AttentionCudaTest,
                         ::testing::ValuesIn(testing::all_attention_configs()),
                         testing::attention_config_name);
// An e4m3 cache, every layout x head dim 64 (fp16 activations) / 128 (bf16) x groups 1, 4, 7,
// 8: append quantizes byte for byte as the CPU does, decode and prefill read it against the
// float64 reference over the dequantized cache. (The activations' type only changes how Q is
// read; half the matrix keeps the float64 reference's cost at 32K tokens in bounds.)
std::vector<Config> fp8_configs() {
  std::vector<Config> configs;
  for (const Config& c : testing::with_fp8_cache(testing::all_attention_configs())) {
    if ((c.head_dim == 64) == (c.element == DType::kFp16)) configs.push_back(c);
  }
  return configs;
}
INSTANTIATE_TEST_SUITE_P(Fp8, AttentionCudaTest, ::testing::ValuesIn(fp8_configs()),
                         testing::attention_config_name);

// Groups wider than one tile of query heads (8): 12 takes a full and a partial tile, 16 two
// full ones, each reading the same KV head.
std::vector<testing::AttentionConfig> wide_group_configs() {
  std::vector<testing::AttentionConfig> configs;
  for (DType element : {DType::kFp16, DType::kBf16}) {
    for (std::uint32_t dim : {64u, 128u}) {
      for (std::uint32_t group : {12u, 16u}) {
        configs.push_back({Layout::kTokenMajor, element, dim, group});
      }
    }
  }
  return configs;
}
INSTANTIATE_TEST_SUITE_P(WideGroups, AttentionCudaTest, ::testing::ValuesIn(wide_group_configs()),
                         testing::attention_config_name);

// Chunked prefill over a long cached prefix: a chunk of 70 tokens (not a multiple of any tile)
// after prefixes that end just before and just after the first granule boundary and at 4097,
// and first chunks of 1 and 2 tokens. Each sequence has its own slot with exactly its live
// windows committed, so a key read past the chunk faults. Few configurations: the float64
// reference costs tokens x keys x heads x head dim.
class AttentionCudaChunkedPrefillTest : public AttentionCudaTest {};

TEST_P(AttentionCudaChunkedPrefillTest, ChunkAfterALongCachedPrefixMatchesTheReference) {
  const Config& c = GetParam();
  const Geometry geometry = this->geometry();
  constexpr std::uint32_t kMaxContext = 32768;
  constexpr std::uint32_t kChunk = 70;
  auto kv = KvArena::make(*driver_, geometry, c.layout, kMaxContext, 5);
  ASSERT_TRUE(kv);
  const std::uint64_t boundary =
      std::max<std::uint64_t>(2, driver_->granule() / kv->arena->plan().contiguous_bytes_per_token);
  // (start, tokens) of each sequence's last chunk; the prefix [0, start) is cached. A boundary
  // at the context's end (an fp8 head-major d64 token is 64 contiguous bytes) moves the chunks
  // that straddle it to the last ones that fit.
  const auto start_near = [&](std::uint64_t position) {
    return static_cast<std::uint32_t>(std::min<std::uint64_t>(position, kMaxContext - kChunk));
  };
  const std::vector<std::pair<std::uint32_t, std::uint32_t>> chunks = {
      {0, 1},
      {0, 2},
      {start_near(boundary - 1), kChunk},
      {start_near(boundary + 1), kChunk},
      {4097, kChunk}};
  Mirror mirror(geometry, c.layout, kMaxContext, static_cast<std::uint32_t>(chunks.size()));
  const KvView view = kv->arena->view();
  for (std::uint32_t b = 0; b < chunks.size(); ++b) {
    const auto [start, tokens] = chunks[b];
    auto slot = kv->arena->admit(start + tokens);  // commits exactly the live windows
    ASSERT_TRUE(slot.ok()) << slot.status().to_string();
    fill(mirror, b, view, *slot, 0, start + tokens);
    if (HasFatalFailure()) return;
    expect_prefill_matches(mirror, b, view, *slot, start, tokens);
    if (HasFatalFailure()) return;
  }
}

// Every layout, at group sizes 1 and 4 (one block holds 128 positions / 32 positions).
std::vector<Config> chunked_prefill_configs() {
  std::vector<Config> configs;
  for (Layout layout : all_layouts()) {
    configs.push_back({layout, DType::kFp16, 128, 1});
    configs.push_back({layout, DType::kBf16, 64, 4});
  }
  return configs;
}

INSTANTIATE_TEST_SUITE_P(Kernels, AttentionCudaChunkedPrefillTest,
                         ::testing::ValuesIn(chunked_prefill_configs()),
                         testing::attention_config_name);
// The fp8 chunk on the token-major layout (every layout's fp8 prefill is in the Fp8 suite
// above): a one-byte token moves the other layouts' first boundary to 16K-32K tokens, where the
// float64 reference of a 70-token chunk takes half a minute.
std::vector<Config> fp8_chunked_prefill_configs() {
  std::vector<Config> configs;
  for (const Config& c : testing::with_fp8_cache(chunked_prefill_configs())) {
    if (c.layout == Layout::kTokenMajor) configs.push_back(c);
  }
  return configs;
}
INSTANTIATE_TEST_SUITE_P(Fp8, AttentionCudaChunkedPrefillTest,
                         ::testing::ValuesIn(fp8_chunked_prefill_configs()),
                         testing::attention_config_name);

// A slot whose tail holds NaN from an earlier occupant gives the same bits as a clean slot.
class AttentionCudaMaskingTest : public AttentionCudaTest {};

TEST_P(AttentionCudaMaskingTest, StaleTailOfAReusedSlotIsNeverRead) {
  const Config& c = GetParam();
  const Geometry geometry = this->geometry();
  constexpr std::uint32_t kOld = 5000, kNew = 1000;
  auto kv = KvArena::make(*driver_, geometry, c.layout, 8192, 2);
  ASSERT_TRUE(kv);
  Arena& arena = *kv->arena;
  const KvView view = arena.view();
  auto old_slot = arena.admit(kOld);
  ASSERT_TRUE(old_slot.ok()) << old_slot.status().to_string();
  {  // The earlier occupant leaves NaN (0xff bytes) in every row it wrote.
    std::vector<std::uint8_t> nan_rows(std::size_t{kOld} * kAttentionKvHeads * c.head_dim * 2,
                                       0xff);
    DeviceBuffer dnan(nan_rows);
    AppendParams append = testing::append_rows(view, kAttentionLayer, kAttentionKvHeads, kOld,
                                               dnan.get(), dnan.get());
    append.slot = *old_slot;
    set_access(append);
    ASSERT_TRUE(append_kv_cuda(append, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  ASSERT_TRUE(arena.finish(*old_slot).ok());
  const auto reused_before = arena.stats().reused_admissions;
  auto dirty = arena.admit(kNew);  // lands in the finished slot, its windows still mapped
  ASSERT_TRUE(dirty.ok()) << dirty.status().to_string();
  ASSERT_EQ(*dirty, *old_slot);
  ASSERT_EQ(arena.stats().reused_admissions, reused_before + 1);
  auto clean = arena.admit(kNew);
  ASSERT_TRUE(clean.ok()) << clean.status().to_string();

  Mirror mirror(geometry, c.layout, 8192, 1);
  fill(mirror, 0, view, *dirty, 0, kNew);
  if (HasFatalFailure()) return;
  {  // The clean slot gets the same bytes.
    const std::size_t row_bytes = cache_row_bytes();
    for (std::uint32_t t = 0; t < kNew; ++t) {
      for (std::uint32_t kvi = 0; kvi < 2; ++kvi) {
        for (std::uint32_t h = 0; h < kAttentionKvHeads; ++h) {
          ASSERT_EQ(
              cudaMemcpy(
                  reinterpret_cast<void*>(view.address(*clean, kAttentionLayer, kvi, h, t)),
                  reinterpret_cast<const void*>(view.address(*dirty, kAttentionLayer, kvi, h, t)),
                  row_bytes, cudaMemcpyDeviceToDevice),
              cudaSuccess);
        }
      }
    }
  }
  const std::uint32_t qo_heads = kAttentionKvHeads * c.group;
  const std::size_t per_sequence = std::size_t{qo_heads} * c.head_dim;
  auto q = testing::random_elements(c.element, per_sequence, random_, 2.0f);
  std::vector<std::uint8_t> q2 = q;
  q2.insert(q2.end(), q.begin(), q.end());  // the same query for both sequences
  std::vector<std::uint32_t> slots = {*dirty, *clean}, lengths = {kNew, kNew};
  DeviceBuffer dq(q2), dslots(slots), dlengths(lengths), dout(2 * per_sequence * 2);
  DecodeParams params;
  params.view = view;
  params.layer = kAttentionLayer;
  params.qo_heads = qo_heads;
  params.kv_heads = kAttentionKvHeads;
  params.batch = 2;
  params.q = dq.get();
  params.slots = static_cast<const std::uint32_t*>(dslots.get());
  params.lengths = static_cast<const std::uint32_t*>(dlengths.get());
  params.max_length = 8192;  // chunks past 1000 exist and must read nothing
  params.out = dout.get();
  set_access(params);
  for (std::uint32_t chunk : {0u, 256u, 8192u}) {
    params.chunk_tokens = chunk;
    auto plan = plan_decode_cuda(params);
    ASSERT_TRUE(plan.ok());
    DeviceBuffer workspace(testing::decode_workspace_bytes(*plan));
    testing::prepare_decode_workspace(workspace, *plan);
    dout.poison();
    ASSERT_TRUE(decode_attention_cuda(params, workspace.get(), workspace.bytes(), nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto out = dout.download();
    EXPECT_EQ(testing::count_nan(c.element, out), 0u) << "chunk " << chunk;
    const auto clean_end = out.begin() + static_cast<std::ptrdiff_t>(per_sequence * 2);
    EXPECT_TRUE(std::equal(out.begin(), clean_end, clean_end))
        << "the dirty slot's output differs from the clean slot's (chunk " << chunk << ")";
    DecodeParams host = params;
    std::vector<std::uint32_t> mirror_slot = {0};
    host.view = mirror.view;
    host.batch = 1;
    host.q = q.data();
    host.slots = mirror_slot.data();
    host.lengths = lengths.data();
    std::vector<double> reference(per_sequence);
    ASSERT_TRUE(decode_attention_reference(host, reference.data()).ok());
    EXPECT_LT(testing::relative_error(
                  c.element, std::vector<std::uint8_t>(out.begin(), out.begin() + per_sequence * 2),
                  reference),
              testing::tolerance(c.element));
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, AttentionCudaMaskingTest,
                         ::testing::Values(Config{Layout::kTokenMajor, DType::kFp16, 128, 4},
                                           Config{Layout::kHeadMajor, DType::kBf16, 64, 7},
                                           Config{Layout::kSeqMajor, DType::kFp16, 128, 1},
                                           Config{Layout::kTokenMajor, DType::kBf16, 128, 8, true},
                                           Config{Layout::kHeadMajor, DType::kFp16, 64, 1, true}),
                         testing::attention_config_name);

#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace
}  // namespace kvvm
