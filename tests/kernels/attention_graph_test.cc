// Invariants 4 and 7 seen from the kernels: a decode step (append one token for each
// sequence + decode attention) captured into a CUDA graph once keeps giving the reference's
// answer while every sequence grows across several granule boundaries, with no recapture:
// growth maps more windows under the same addresses (commits outside capture, commit-ahead
// on), and lengths and positions are read from device memory at replay. A commit attempted
// during the capture is refused by the arena's capture guard and the capture still succeeds.
// Skipped (and reported skipped) without the CUDA compiler or a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
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

class AttentionGraphTest : public ::testing::TestWithParam<Layout> {};

TEST_P(AttentionGraphTest, CapturedDecodeStepSurvivesGrowthAcrossGranules) {
#if !defined(KVVM_HAS_CUDA_KERNELS)
  GTEST_SKIP() << "built without the CUDA compiler: no kernels to capture";
#else
  auto made = make_cuda_driver();
  if (!made.ok()) GTEST_SKIP() << "no CUDA device: " << made.status().to_string();
  std::unique_ptr<Driver> driver = std::move(made).value();
  using testing::DeviceBuffer;
  const Layout layout = GetParam();
  constexpr DType kElement = DType::kFp16;
  constexpr std::uint32_t kDim = 128, kKvHeads = 2, kGroup = 4, kQoHeads = kKvHeads * kGroup;
  constexpr std::uint32_t kBatch = 4, kMaxContext = 32768, kLayer = 1, kSteps = 10;
  const Geometry geometry{"graph-test", 2, kKvHeads, kDim, DType::kFp16};
  auto kv = testing::KvArena::make(*driver, geometry, layout, kMaxContext, kBatch, /*ahead=*/2);
  ASSERT_TRUE(kv);
  Arena& arena = *kv->arena;
  const KvView view = arena.view();
  testing::Mirror mirror(geometry, layout, kMaxContext, kBatch);
  const std::uint64_t window_tokens = driver->granule() / arena.plan().contiguous_bytes_per_token;
  // Each step grows every sequence by `growth` tokens: all steps together cross at least
  // three window boundaries of every fragment.
  const std::uint32_t growth = static_cast<std::uint32_t>(
      std::min<std::uint64_t>(3 * window_tokens / (kSteps - 2) + 1, (kMaxContext - 2000) / kSteps));
  const std::uint64_t seed = testing::fresh_seed();
  std::mt19937_64 random(seed);
  RecordProperty("seed", std::to_string(seed));
  const std::size_t row_elements = std::size_t{kKvHeads} * kDim;

  auto stream_made = cudaStream_t{};
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream_made, cudaStreamNonBlocking), cudaSuccess);
  cudaStream_t stream = stream_made;

  // Appends tokens [from, to) of sequence b to the mirror and, outside any graph, the device.
  std::vector<std::uint32_t> slots(kBatch), lengths(kBatch), positions(kBatch);
  std::vector<Address> bases(kBatch);
  auto grow = [&](std::uint32_t b, std::uint32_t from, std::uint32_t to) {
    const std::size_t count = std::size_t{to - from} * row_elements;
    const testing::KvRows rows = testing::random_kv_rows(kElement, count, random);
    AppendParams append = testing::append_rows(mirror.view, kLayer, kKvHeads, to - from,
                                               rows.k.data(), rows.v.data());
    append.slot = b;
    append.start = from;
    ASSERT_TRUE(append_kv_cpu(append).ok());
    DeviceBuffer dk(rows.k), dv(rows.v);
    // A copy from pageable memory may return before its DMA lands, and `stream` does not wait
    // for the legacy stream.
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    append.view = view;
    append.k = dk.get();
    append.v = dv.get();
    append.slot = slots[b];
    ASSERT_TRUE(append_kv_cuda(append, stream).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  };
  for (std::uint32_t b = 0; b < kBatch; ++b) {
    lengths[b] = 100 + 37 * b;  // before the captured step's token
    auto slot = arena.admit(lengths[b]);
    ASSERT_TRUE(slot.ok()) << slot.status().to_string();
    slots[b] = *slot;
    bases[b] = arena.slot_base(*slot);
    grow(b, 0, lengths[b]);
    if (HasFatalFailure()) return;
  }

  // Inputs of the captured step, rewritten in place before every replay.
  DeviceBuffer dq(std::size_t{kBatch} * kQoHeads * kDim * 2), dk(kBatch * row_elements * 2),
      dv(kBatch * row_elements * 2), dslots(slots), dpositions(kBatch * 4), dlengths(kBatch * 4),
      dout(std::size_t{kBatch} * kQoHeads * kDim * 2);
  AppendParams step_append =
      testing::append_rows(view, kLayer, kKvHeads, kBatch, dk.get(), dv.get());
  step_append.row_slots = static_cast<const std::uint32_t*>(dslots.get());
  step_append.row_positions = static_cast<const std::uint32_t*>(dpositions.get());
  DecodeParams decode;
  decode.view = view;
  decode.layer = kLayer;
  decode.qo_heads = kQoHeads;
  decode.kv_heads = kKvHeads;
  decode.batch = kBatch;
  decode.q = dq.get();
  decode.slots = static_cast<const std::uint32_t*>(dslots.get());
  decode.lengths = static_cast<const std::uint32_t*>(dlengths.get());
  decode.max_length = kMaxContext;  // the grid covers every length the graph will see
  decode.out = dout.get();
  auto plan = plan_decode_cuda(decode);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_GT(plan->chunks, 1u) << "the split-K merge should be inside the graph too";
  DeviceBuffer workspace(testing::decode_workspace_bytes(*plan));
  testing::prepare_decode_workspace(workspace, *plan);

  cudaGraph_t graph = nullptr;
  {
    Arena::CaptureGuard guard = arena.begin_capture();
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    Status appended = append_kv_cuda(step_append, stream);
    Status decoded = decode_attention_cuda(decode, workspace.get(), workspace.bytes(), stream);
    // Growth during capture would map memory inside the capture: refused, nothing mapped.
    const auto maps = driver->counts().of(DriverOp::kMap);
    Status refused = arena.ensure(slots[0], kMaxContext);
    EXPECT_EQ(refused.code(), StatusCode::kUnavailable) << refused.to_string();
    EXPECT_EQ(driver->counts().of(DriverOp::kMap), maps);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << "the capture was invalidated";
    ASSERT_TRUE(appended.ok()) << appended.to_string();
    ASSERT_TRUE(decoded.ok()) << decoded.to_string();
  }
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  const auto committed_before = arena.stats().committed_bytes;
  for (std::uint32_t step = 0; step < kSteps; ++step) {
    // Grow every sequence (commits happen here, outside capture), then one more token that
    // the graph itself appends.
    for (std::uint32_t b = 0; b < kBatch; ++b) {
      const std::uint32_t target = lengths[b] + (step == 0 ? 0 : growth);
      ASSERT_TRUE(arena.ensure(slots[b], target + 1).ok());
      if (target > lengths[b]) grow(b, lengths[b], target);
      if (HasFatalFailure()) return;
      positions[b] = target;
      lengths[b] = target + 1;
    }
    auto q =
        testing::random_elements(kElement, std::size_t{kBatch} * kQoHeads * kDim, random, 2.0f);
    auto k = testing::random_elements(kElement, kBatch * row_elements, random);
    auto v = testing::random_elements(kElement, kBatch * row_elements, random);
    dq.upload(q);
    dk.upload(k);
    dv.upload(v);
    dpositions.upload(positions);
    dlengths.upload(lengths);
    dout.poison();
    // The uploads and the poison went to the legacy stream, which a non-blocking stream does
    // not wait for (a copy from pageable memory may return before its DMA lands).
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << "replay " << step << " faulted";
    EXPECT_EQ(testing::nonzero_counters(workspace, *plan), 0u)
        << "replay " << step << " left the split's counters non-zero";

    // The reference: the same token appended on the host, then float64 decode.
    std::vector<std::uint32_t> mirror_slots(kBatch);
    for (std::uint32_t b = 0; b < kBatch; ++b) mirror_slots[b] = b;
    AppendParams host_append =
        testing::append_rows(mirror.view, kLayer, kKvHeads, kBatch, k.data(), v.data());
    host_append.row_slots = mirror_slots.data();
    host_append.row_positions = positions.data();
    ASSERT_TRUE(append_kv_cpu(host_append).ok());
    DecodeParams host = decode;
    host.view = mirror.view;
    host.q = q.data();
    host.slots = mirror_slots.data();
    host.lengths = lengths.data();
    std::vector<double> reference(q.size() / 2);
    ASSERT_TRUE(decode_attention_reference(host, reference.data()).ok());
    const auto out = dout.download();
    EXPECT_EQ(testing::count_nan(kElement, out), 0u) << "replay " << step;
    EXPECT_LT(testing::relative_error(kElement, out, reference), testing::tolerance(kElement))
        << "replay " << step << " at lengths " << lengths[0] << ".." << lengths[kBatch - 1]
        << ", seed " << seed;
  }
  for (std::uint32_t b = 0; b < kBatch; ++b) {
    EXPECT_EQ(arena.slot_base(slots[b]), bases[b]) << "invariant 4: the base never moves";
    EXPECT_GE(lengths[b] / window_tokens, 3u) << "sequence " << b << " crossed too few windows";
  }
  EXPECT_GT(arena.stats().committed_bytes, committed_before);
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(stream);
#endif
}

std::string layout_name(const ::testing::TestParamInfo<Layout>& param) {
  return testing::layout_test_name(param.param);
}

INSTANTIATE_TEST_SUITE_P(Kernels, AttentionGraphTest, ::testing::ValuesIn(all_layouts()),
                         layout_name);

}  // namespace
}  // namespace kvvm
