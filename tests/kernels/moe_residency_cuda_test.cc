// moe_residency_cuda (include/kvvm/kernels/moe_kernels.h) against the host's ExpertCache
// (src/model/weights/expert_cache.h), the policy it implements: the same routings given to both,
// after every acquisition each expert sits in the same slot, the counters agree, the layer's
// pointer tables point at its wanted experts' slots and every slot holds its expert's bytes read
// from mapped pinned memory. Past kDecayAcquires acquisitions (the counts halved), with more
// slots than the plan's block has threads, and captured in a CUDA graph. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "moe_fixture.h"

#if defined(KVVM_HAS_CUDA_KERNELS)
#include "model/weights/expert_cache.h"
#endif

namespace kvvm::moe_kernels_test {
namespace {

#if defined(KVVM_HAS_CUDA_KERNELS)

using model::detail::ExpertCache;
using model::detail::ExpertCacheShape;
using model::detail::kDecayAcquires;
using model::detail::preloaded_expert;

// The byte at `offset` of expert `index`'s staged copy: different for every expert and offset.
std::uint8_t staged_byte(std::uint32_t index, std::uint64_t offset) {
  return static_cast<std::uint8_t>((index * 131u + offset * 7u + (offset >> 8)) ^ (index >> 3));
}

void cuda_ok(cudaError_t error, const char* call) {
  ASSERT_EQ(error, cudaSuccess) << call << ": " << cudaGetErrorString(error);
}

// Both caches of one shape, preloaded alike, fed the same routings.
class Caches {
 public:
  explicit Caches(const ExpertCacheShape& shape) : shape_(shape) {
    const std::uint64_t all = std::uint64_t{shape.sparse_layers} * shape.experts;
    const std::uint64_t offsets = 4;  // gate|up at 0, down at 16, scales at 32 and 48
    EXPECT_GE(shape.expert_bytes, offsets * 16);
    cuda_ok(cudaHostAlloc(reinterpret_cast<void**>(&staging_), all * shape.expert_bytes,
                          cudaHostAllocMapped),
            "cudaHostAlloc");
    for (std::uint64_t i = 0; i < all; ++i) {
      for (std::uint64_t b = 0; b < shape.expert_bytes; ++b) {
        staging_[i * shape.expert_bytes + b] = staged_byte(static_cast<std::uint32_t>(i), b);
      }
    }
    host_slots_.assign(std::uint64_t{shape.slots} * shape.expert_bytes, 0);
    host_ = std::make_unique<ExpertCache>(
        shape, reinterpret_cast<Address>(host_slots_.data()), staging_,
        [](Address to, const unsigned char* from, std::uint64_t bytes) {
          std::memcpy(reinterpret_cast<void*>(to), from, bytes);
          return Status::Ok();
        });
    EXPECT_TRUE(host_->preload().ok());

    slots_ = std::make_unique<testing::DeviceBuffer>(shape.slots * shape.expert_bytes);
    slot_of_ = std::make_unique<testing::DeviceBuffer>(all * 4);
    count_ = std::make_unique<testing::DeviceBuffer>(all * 8);
    last_use_ = std::make_unique<testing::DeviceBuffer>(all * 8);
    holder_ = std::make_unique<testing::DeviceBuffer>(std::uint64_t{shape.slots} * 4);
    copy_list_ = std::make_unique<testing::DeviceBuffer>(std::uint64_t{shape.experts} * 8);
    counters_ = std::make_unique<testing::DeviceBuffer>(sizeof(MoeResidencyCounters));
    tables_ = std::make_unique<testing::DeviceBuffer>(std::uint64_t{shape.sparse_layers} * 4 *
                                                      shape.experts * 8);
    ids_ = std::make_unique<testing::DeviceBuffer>(std::uint64_t{256} * kMoeMaxTopK * 4);
    cuda_ok(cudaHostAlloc(reinterpret_cast<void**>(&mirror_), sizeof(MoeResidencyCounters),
                          cudaHostAllocMapped),
            "cudaHostAlloc");
    *mirror_ = MoeResidencyCounters{};
    std::vector<std::uint32_t> slot_of(all, kMoeNoSlot), holder(shape.slots);
    std::vector<std::uint8_t> preloaded(std::uint64_t{shape.slots} * shape.expert_bytes);
    for (std::uint32_t s = 0; s < shape.slots; ++s) {
      holder[s] = preloaded_expert(shape, s);
      slot_of[holder[s]] = s;
      std::memcpy(&preloaded[std::uint64_t{s} * shape.expert_bytes],
                  staging_ + std::uint64_t{holder[s]} * shape.expert_bytes, shape.expert_bytes);
    }
    slot_of_->upload(slot_of);
    holder_->upload(holder);
    slots_->upload(preloaded);
    cuda_ok(cudaMemset(count_->get(), 0, all * 8), "cudaMemset");
    cuda_ok(cudaMemset(last_use_->get(), 0, all * 8), "cudaMemset");
    cuda_ok(cudaMemset(counters_->get(), 0, sizeof(MoeResidencyCounters)), "cudaMemset");
    tables_->poison();
  }
  ~Caches() {
    (void)cudaFreeHost(staging_);
    (void)cudaFreeHost(mirror_);
  }

  MoeResidencyParams params(std::uint32_t layer, std::uint32_t tokens, std::uint32_t top_k) {
    MoeResidencyParams p;
    p.tokens = tokens;
    p.top_k = top_k;
    p.experts = shape_.experts;
    p.sparse_layers = shape_.sparse_layers;
    p.layer = layer;
    p.slots = shape_.slots;
    p.expert_bytes = shape_.expert_bytes;
    p.decay_every = kDecayAcquires;
    p.ids = static_cast<const std::int32_t*>(ids_->get());
    p.slot_of = static_cast<std::uint32_t*>(slot_of_->get());
    p.count = static_cast<std::uint64_t*>(count_->get());
    p.last_use = static_cast<std::uint64_t*>(last_use_->get());
    p.holder = static_cast<std::uint32_t*>(holder_->get());
    p.copy_list = static_cast<std::uint32_t*>(copy_list_->get());
    p.counters = static_cast<MoeResidencyCounters*>(counters_->get());
    p.mirror = mirror_;  // UVA: the pinned pointer is the device's
    p.first_slot = slots_->get();
    p.staging = staging_;
    p.tables = static_cast<std::uint64_t*>(tables_->get()) + std::uint64_t{layer} * 4 * p.experts;
    p.gate_up_offset = 0;
    p.down_offset = 16;
    p.gate_up_scale_offset = 32;
    p.down_scale_offset = 48;
    return p;
  }

  // The host cache's acquisition of the routing `ids`, as a backend asks for it.
  void acquire_on_host(std::uint32_t layer, const std::vector<std::int32_t>& ids) {
    std::vector<std::uint32_t> wanted, rows;
    ASSERT_TRUE(model::detail::wanted_experts(ids, shape_.experts, wanted, rows).ok());
    std::vector<Address> at(wanted.size());
    ASSERT_TRUE(host_->acquire(layer, wanted, rows, at).ok());
    last_wanted_ = wanted;
  }
  void upload_ids(const std::vector<std::int32_t>& ids) { ids_->upload(ids); }

  // Every expert's slot, the counters, the wanted experts' table entries of `layer` and every
  // slot's bytes, device against host.
  void expect_same(std::uint32_t layer, const std::string& where) {
    const std::uint64_t all = std::uint64_t{shape_.sparse_layers} * shape_.experts;
    const std::vector<std::uint8_t> slot_bytes = slot_of_->download();
    const auto* slot_of = reinterpret_cast<const std::uint32_t*>(slot_bytes.data());
    for (std::uint64_t i = 0; i < all; ++i) {
      const auto got = host_->slot_of(static_cast<std::uint32_t>(i / shape_.experts),
                                      static_cast<std::uint32_t>(i % shape_.experts));
      ASSERT_EQ(slot_of[i], got ? *got : kMoeNoSlot) << where << ": expert index " << i;
    }
    const model::ExpertCacheStats want = host_->stats();
    EXPECT_EQ(mirror_->lookups, want.lookups) << where;
    EXPECT_EQ(mirror_->hits, want.hits) << where;
    EXPECT_EQ(mirror_->misses, want.misses) << where;
    EXPECT_EQ(mirror_->bytes_copied, want.bytes_copied) << where;
    if (want.misses > 0) {
      EXPECT_GT(mirror_->copy_ns, 0u) << where;
    }

    const std::vector<std::uint8_t> table_bytes = tables_->download();
    const auto* tables = reinterpret_cast<const std::uint64_t*>(table_bytes.data()) +
                         std::uint64_t{layer} * 4 * shape_.experts;
    const auto first = reinterpret_cast<std::uint64_t>(slots_->get());
    for (const std::uint32_t e : last_wanted_) {
      const std::uint64_t at =
          first + std::uint64_t{slot_of[layer * shape_.experts + e]} * shape_.expert_bytes;
      EXPECT_EQ(tables[e], at) << where << ": gate|up of expert " << e;
      EXPECT_EQ(tables[shape_.experts + e], at + 16) << where;
      EXPECT_EQ(tables[2 * shape_.experts + e], at + 32) << where;
      EXPECT_EQ(tables[3 * shape_.experts + e], at + 48) << where;
    }
    EXPECT_EQ(slots_->download(), host_slots_) << where << ": the slots' bytes";
  }

 private:
  ExpertCacheShape shape_;
  unsigned char* staging_ = nullptr;
  MoeResidencyCounters* mirror_ = nullptr;
  std::vector<std::uint8_t> host_slots_;
  std::unique_ptr<ExpertCache> host_;
  std::unique_ptr<testing::DeviceBuffer> slots_, slot_of_, count_, last_use_, holder_, copy_list_,
      counters_, tables_, ids_;
  std::vector<std::uint32_t> last_wanted_;
};

struct ResidencyCase {
  ExpertCacheShape shape;
  std::uint32_t top_k, most_tokens, acquisitions;
  Routing routing;
};

TEST(MoeResidencyCuda, DecidesAsTheHostCacheAndCopiesEachMissFromMappedMemory) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  const ResidencyCase cases[] = {
      // Few slots for three layers of 8: misses most acquisitions; past a decay.
      {{.sparse_layers = 3, .experts = 8, .slots = 11, .expert_bytes = 256},
       2,
       6,
       static_cast<std::uint32_t>(kDecayAcquires) + 40,
       Routing::kSkewed},
      // More slots than the plan's threads, a layer of 300 experts, big batches.
      {{.sparse_layers = 6, .experts = 300, .slots = 1500, .expert_bytes = 64},
       8,
       64,
       60,
       Routing::kSkewed},
      // Exactly a layer's experts, uniform routing.
      {{.sparse_layers = 4, .experts = 16, .slots = 16, .expert_bytes = 4096},
       4,
       9,
       200,
       Routing::kUniform},
  };
  std::mt19937 rng(7);
  for (const ResidencyCase& c : cases) {
    Caches caches(c.shape);
    for (std::uint32_t a = 0; a < c.acquisitions; ++a) {
      const std::uint32_t layer = a % c.shape.sparse_layers;
      const std::uint32_t tokens = 1 + rng() % c.most_tokens;
      const std::vector<std::int32_t> ids =
          make_ids(tokens, c.top_k, c.shape.experts, c.routing, rng);
      caches.upload_ids(ids);
      ASSERT_TRUE(moe_residency_cuda(caches.params(layer, tokens, c.top_k), nullptr).ok());
      cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      caches.acquire_on_host(layer, ids);
      const std::string where = std::to_string(c.shape.experts) + " experts, " +
                                std::to_string(c.shape.slots) + " slots, acquisition " +
                                std::to_string(a + 1);
      caches.expect_same(layer, where);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(MoeResidencyCuda, ReplayedInAGraphDecidesFromEachReplaysIds) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  const ExpertCacheShape shape{.sparse_layers = 2, .experts = 8, .slots = 9, .expert_bytes = 512};
  Caches caches(shape);
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  constexpr std::uint32_t kTokens = 3, kTopK = 2;
  // One graph per layer, captured once; the ids change between replays.
  cudaGraphExec_t execs[2] = {};
  for (std::uint32_t layer = 0; layer < 2; ++layer) {
    cudaGraph_t graph = nullptr;
    cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
    ASSERT_TRUE(moe_residency_cuda(caches.params(layer, kTokens, kTopK), stream).ok());
    cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture");
    cuda_ok(cudaGraphInstantiate(&execs[layer], graph, 0), "instantiate");
    cuda_ok(cudaGraphDestroy(graph), "destroy graph");
  }
  std::mt19937 rng(11);
  for (std::uint32_t a = 0; a < 64; ++a) {
    const std::uint32_t layer = a % 2;
    const std::vector<std::int32_t> ids = make_ids(kTokens, kTopK, 8, Routing::kUniform, rng);
    caches.upload_ids(ids);
    cuda_ok(cudaGraphLaunch(execs[layer], stream), "cudaGraphLaunch");
    cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    caches.acquire_on_host(layer, ids);
    caches.expect_same(layer, "replay " + std::to_string(a + 1));
    if (::testing::Test::HasFailure()) break;
  }
  for (cudaGraphExec_t exec : execs) (void)cudaGraphExecDestroy(exec);
  (void)cudaStreamDestroy(stream);
}

#endif

}  // namespace
}  // namespace kvvm::moe_kernels_test
