// Weights at a stable address on the host backend: the split a budget gives, the store's ring
// (streamed layers aliasing R physical slots, physical bytes from handles), the CPU model with
// 25 %, 50 % and 90 % of its layers streamed through 2 and 3 slots giving the all-resident
// model's logits bit for bit, weights and KV under one budget, every failed driver call while
// the store is built leaving nothing behind, and the dummy load format.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvvm/engine/kv_space.h"
#include "kvvm/model/model.h"
#include "kvvm/model/weight_memory.h"
#include "kvvm/vmm/fault_driver.h"
#include "kvvm/vmm/host_driver.h"
#include "model/weights/weight_layout.h"
#include "model/weights/weight_store.h"
#include "support/tiny_model.h"

namespace kvvm::model::weight_stream_test {
namespace {

using testing::ModelKv;
using testing::TinyModel;

constexpr std::uint64_t kPage = 4096;  // the host driver's default granule

// Twenty layers, every bias: enough layers that 90 % can stream with the first and last
// resident, and every kind of tensor placed.
ModelConfig deep_config() {
  ModelConfig c = testing::tiny_config();
  c.layers = 20;
  c.qkv_bias = true;
  c.o_bias = true;
  return c;
}

// What a run of the model gave: every step's logits and the greedy tokens.
struct RunResult {
  std::vector<float> logits;
  std::vector<std::int32_t> tokens;
};

// Two sequences prefilled together (12 and 7 tokens), then 8 greedy decode steps of both.
RunResult run_steps(Model& model) {
  const ModelConfig& c = model.config();
  auto kv = ModelKv::make(c, Layout::kTokenMajor, DType::kFp32, 64, 2);
  EXPECT_NE(kv, nullptr);
  RunResult result;
  if (kv == nullptr) return result;
  std::vector<std::uint32_t> slots;
  for (int i = 0; i < 2; ++i) {
    auto slot = kv->arena().admit(32);
    EXPECT_TRUE(slot.ok()) << slot.status().to_string();
    slots.push_back(slot.ok() ? *slot : 0);
  }
  std::vector<std::int32_t> ids;
  for (int i = 0; i < 19; ++i) ids.push_back((i * 37 + 11) % static_cast<int>(c.vocab_size));
  std::vector<Chunk> chunks = {{slots[0], 0, 12}, {slots[1], 0, 7}};
  std::vector<std::uint32_t> lengths = {12, 7};
  for (int step = 0; step < 9; ++step) {
    std::vector<float> logits(chunks.size() * c.vocab_size);
    std::vector<std::int32_t> argmax(chunks.size());
    const Status status =
        model.forward({ids, chunks, kv->arena().view(), {}}, {logits.data(), argmax.data()});
    EXPECT_TRUE(status.ok()) << status.to_string();
    if (!status.ok()) return result;
    result.logits.insert(result.logits.end(), logits.begin(), logits.end());
    result.tokens.insert(result.tokens.end(), argmax.begin(), argmax.end());
    ids = argmax;
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      chunks[i] = {slots[i], lengths[i], 1};
      ++lengths[i];
    }
  }
  return result;
}

std::unique_ptr<Model> cpu_model(const TinyModel& tiny, const WeightOptions& weights) {
  CpuModelOptions options;
  options.threads = 1;
  options.weights = weights;
  auto made = make_cpu_model(tiny.config(), tiny.weights(), options);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  return made.ok() ? std::move(made).value() : nullptr;
}

// The CUDA model's fused projection reads q, k and v as one [q + 2 kv][hidden] matrix and adds
// their biases as one row: the layout must place each run back to back, whatever the widths
// (these are not multiples of the 256-byte alignment).
TEST(WeightLayout, QKVAndTheirBiasesAreOneContiguousRun) {
  ModelConfig c = deep_config();
  c.hidden_size = 24;
  c.heads = 3;
  c.kv_heads = 1;
  c.head_dim = 6;
  for (const DType element : {DType::kBf16, DType::kFp32}) {
    const std::uint64_t size = element_bytes(element);
    const detail::WeightLayout layout = detail::weight_layout(c, element);
    const std::uint64_t q_dim = 18, kv_dim = 6, hidden = 24;
    EXPECT_EQ(layout.block.k, layout.block.q + q_dim * hidden * size);
    EXPECT_EQ(layout.block.v, layout.block.k + kv_dim * hidden * size);
    EXPECT_GE(layout.block.o, layout.block.v + kv_dim * hidden * size);
    for (const detail::LayerBaseOffsets& layer : layout.layers) {
      EXPECT_EQ(layer.k_bias, layer.q_bias + q_dim * size);
      EXPECT_EQ(layer.v_bias, layer.k_bias + kv_dim * size);
    }
  }
}

TEST(WeightSplit, NoBudgetOrEnoughKeepsEveryLayerResident) {
  const WeightSizes sizes = weight_sizes(deep_config(), DType::kFp32);
  for (std::uint64_t budget : {std::uint64_t{0}, std::uint64_t{1} << 40}) {
    auto split = plan_weight_split(sizes, kPage, budget);
    ASSERT_TRUE(split.ok()) << split.status().to_string();
    EXPECT_EQ(split->streamed_layers, 0u);
    EXPECT_EQ(split->ring_slots, 0u);
    EXPECT_EQ(split->streamed_bytes_per_step, 0u);
    EXPECT_EQ(split->device_bytes, split->base_region + 20 * split->layer_block);
    EXPECT_GE(split->device_bytes, sizes.total());
    EXPECT_NE(split->describe().find("all 20 layers resident"), std::string::npos);
  }
}

TEST(WeightSplit, ABudgetStreamsTheMiddleLayersEvenlyAndFitsInIt) {
  const WeightSizes sizes = weight_sizes(deep_config(), DType::kFp32);
  for (std::uint32_t ring : {2u, 3u}) {
    for (std::uint32_t streamed = ring + 1; streamed <= 18; ++streamed) {
      const std::uint64_t budget = weight_budget_for(sizes, kPage, streamed, ring);
      auto split = plan_weight_split(sizes, kPage, budget, ring);
      ASSERT_TRUE(split.ok()) << split.status().to_string();
      EXPECT_EQ(split->streamed_layers, streamed);
      EXPECT_EQ(split->ring_slots, ring);
      EXPECT_LE(split->device_bytes, budget);
      EXPECT_FALSE(split->streamed.front());
      EXPECT_FALSE(split->streamed.back());
      EXPECT_EQ(std::count(split->streamed.begin(), split->streamed.end(), true), streamed);
      EXPECT_EQ(split->streamed_bytes_per_step, streamed * sizes.layer_bytes);
      EXPECT_EQ(split->ring_bytes, ring * split->layer_block);
      // Evenly: no run of resident layers between two streamed ones is longer than the
      // spacing rounded up.
      const std::uint32_t resident = 20 - streamed;
      std::uint32_t run = 0, longest = 0;
      for (std::uint32_t l = 1; l + 1 < 20; ++l) {
        run = split->streamed[l] ? 0 : run + 1;
        longest = std::max(longest, run);
      }
      EXPECT_LE(longest, (resident + streamed - 1) / streamed + 1) << streamed;
      // One byte less streams one more layer (or is refused at the least).
      auto tighter = plan_weight_split(sizes, kPage, budget - 1, ring);
      if (streamed < 18) {
        ASSERT_TRUE(tighter.ok());
        EXPECT_EQ(tighter->streamed_layers, streamed + 1);
      } else {
        EXPECT_FALSE(tighter.ok());
      }
    }
  }
}

TEST(WeightSplit, ABudgetTooSmallIsRefusedNamingTheLeast) {
  const WeightSizes sizes = weight_sizes(deep_config(), DType::kFp32);
  auto split = plan_weight_split(sizes, kPage, 100 * kPage);
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(split.status().message().find("streaming needs at least"), std::string::npos)
      << split.status().to_string();
  EXPECT_NE(split.status().message().find("weight budget 400 KiB"), std::string::npos)
      << split.status().to_string();
  auto one_slot = plan_weight_split(sizes, kPage, sizes.total() / 2, 1);
  ASSERT_FALSE(one_slot.ok());
  EXPECT_NE(one_slot.status().message().find("at least 2"), std::string::npos);
  auto no_granule = plan_weight_split(sizes, 0, sizes.total() / 2);
  EXPECT_FALSE(no_granule.ok());
  ModelConfig shallow = deep_config();
  shallow.layers = 4;  // the first and last resident leave 2 layers: not more than 2 slots
  const WeightSizes few = weight_sizes(shallow, DType::kFp32);
  auto too_few = plan_weight_split(few, kPage, few.total() / 2);
  ASSERT_FALSE(too_few.ok());
  EXPECT_NE(too_few.status().message().find("too few to stream"), std::string::npos)
      << too_few.status().to_string();
}

// The store itself: streamed layers alias their slots, physical bytes are handles.
TEST(WeightStore, StreamedLayersAliasTheirRingSlotAndBytesAreHandles) {
  auto driver = make_host_driver();
  ASSERT_TRUE(driver.ok());
  Governor governor;
  const ModelConfig config = deep_config();
  const detail::WeightLayout layout = detail::weight_layout(config, DType::kFp32);
  WeightOptions options;
  options.driver = driver->get();
  options.governor = &governor;
  options.budget_bytes = weight_budget_for(layout.sizes, kPage, 10, 3);
  options.ring_slots = 3;
  auto store = detail::WeightStore::create(driver->get(), nullptr, layout, options, false);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  detail::WeightStore& s = **store;
  const WeightSplit& split = s.split();
  ASSERT_EQ(split.streamed_layers, 10u);
  ASSERT_EQ(s.streamed_layers().size(), 10u);
  EXPECT_EQ(s.physical_bytes(), split.device_bytes);
  EXPECT_EQ(governor.stats(s.tier()).used, split.device_bytes);
  EXPECT_EQ(governor.stats(s.tier()).limit, split.device_bytes);
  const HostDriverTables tables = host_driver_tables(**driver);
  EXPECT_EQ(tables.handle_bytes, split.device_bytes);
  EXPECT_EQ(tables.handles, s.handles());

  // A pattern written at streamed layer j is read at every streamed layer of the same slot,
  // and at no other.
  const std::vector<std::uint32_t>& order = s.streamed_layers();
  for (std::uint32_t j = 0; j < 3; ++j) {
    std::vector<std::uint8_t> pattern(split.sizes.layer_bytes, static_cast<std::uint8_t>(j + 1));
    ASSERT_TRUE((*driver)->write(s.layer(order[j]), pattern.data(), pattern.size()).ok());
  }
  for (std::uint32_t i = 0; i < order.size(); ++i) {
    std::uint8_t first = 0, last = 0;
    ASSERT_TRUE((*driver)->read(&first, s.layer(order[i]), 1).ok());
    ASSERT_TRUE((*driver)->read(&last, s.layer(order[i]) + split.sizes.layer_bytes - 1, 1).ok());
    EXPECT_EQ(first, i % 3 + 1) << "streamed layer " << i;
    EXPECT_EQ(last, i % 3 + 1) << "streamed layer " << i;
  }
  store->reset();
  EXPECT_EQ(governor.stats(0).used, 0u);
  const HostDriverTables after = host_driver_tables(**driver);
  EXPECT_EQ(after.handles, 0u);
  EXPECT_EQ(after.mappings, 0u);
  EXPECT_EQ(after.reservations, 0u);
}

// One run of the all-resident model, shared by the streamed ones it is compared with.
class WeightStreamCpu : public ::testing::TestWithParam<std::tuple<std::uint32_t, std::uint32_t>> {
 protected:
  static void SetUpTestSuite() {
    tiny_ = new TinyModel(deep_config(), TensorDType::kF32, 3);
    auto resident = cpu_model(*tiny_, {});
    ASSERT_NE(resident, nullptr);
    EXPECT_EQ(resident->weight_stats().split.streamed_layers, 0u);
    resident_ = new RunResult(run_steps(*resident));
  }
  static void TearDownTestSuite() {
    delete resident_;
    delete tiny_;
  }
  static TinyModel* tiny_;
  static RunResult* resident_;
};
TinyModel* WeightStreamCpu::tiny_ = nullptr;
RunResult* WeightStreamCpu::resident_ = nullptr;

TEST_P(WeightStreamCpu, StreamedLayersGiveTheResidentLogitsBitForBit) {
  const auto [streamed, ring] = GetParam();
  WeightOptions options;
  options.budget_bytes =
      weight_budget_for(weight_sizes(deep_config(), DType::kFp32), kPage, streamed, ring);
  options.ring_slots = ring;
  auto model = cpu_model(*tiny_, options);
  ASSERT_NE(model, nullptr);
  const WeightStats before = model->weight_stats();
  ASSERT_EQ(before.split.streamed_layers, streamed);
  ASSERT_EQ(before.split.ring_slots, ring);
  EXPECT_EQ(before.physical_bytes, before.split.device_bytes);
  EXPECT_LE(before.physical_bytes, options.budget_bytes);
  EXPECT_EQ(before.layer_copies, 0u);
  const RunResult got = run_steps(*model);
  ASSERT_EQ(got.logits.size(), resident_->logits.size());
  EXPECT_EQ(got.tokens, resident_->tokens);
  EXPECT_EQ(
      std::memcmp(got.logits.data(), resident_->logits.data(), got.logits.size() * sizeof(float)),
      0);
  EXPECT_EQ(model->weight_stats().layer_copies, 9u * streamed);  // every step, every layer
}

// 25 %, 50 % and 90 % of the 20 layers, through 2 and 3 slots.
INSTANTIATE_TEST_SUITE_P(Fractions, WeightStreamCpu,
                         ::testing::Combine(::testing::Values(5u, 10u, 18u),
                                            ::testing::Values(2u, 3u)));

TEST(WeightBudget, WeightsAndKvShareOneBudgetAndTheKvGetsWhatIsLeft) {
  const ModelConfig config = deep_config();
  TinyModel tiny(config, TensorDType::kF32, 5);
  const WeightSizes sizes = weight_sizes(config, DType::kFp32);
  const std::uint64_t device = sizes.total() + (std::uint64_t{4} << 20);
  std::uint64_t last_kv = 0;
  for (std::uint32_t streamed : {18u, 10u, 0u}) {  // a growing weight budget
    auto driver = make_host_driver();
    ASSERT_TRUE(driver.ok());
    Governor governor;
    WeightOptions options;
    options.driver = driver->get();
    options.governor = &governor;
    options.budget_bytes = streamed == 0 ? 0 : weight_budget_for(sizes, kPage, streamed, 2);
    auto model = cpu_model(tiny, options);
    ASSERT_NE(model, nullptr);
    const std::uint64_t weights = model->weight_stats().physical_bytes;
    engine::KvSpaceOptions kv_options;
    kv_options.backend = Backend::kCpu;
    kv_options.driver = driver->get();
    kv_options.governor = &governor;
    kv_options.device_budget_bytes = device;
    kv_options.max_context = 64;
    auto kv = engine::KvSpace::create(config, kv_options);
    ASSERT_TRUE(kv.ok()) << kv.status().to_string();
    const TierStats kv_tier = governor.stats((*kv)->arena().tier());
    EXPECT_EQ(kv_tier.limit, device - weights) << streamed;
    std::uint64_t limits = 0;
    for (TierId t = 0; t < governor.tier_count(); ++t) limits += governor.stats(t).limit;
    EXPECT_LE(limits, device);
    if (last_kv != 0) {
      EXPECT_LT(kv_tier.limit, last_kv) << streamed;
    }
    last_kv = kv_tier.limit;
  }
  // Weights that leave nothing are refused by name.
  auto driver = make_host_driver();
  ASSERT_TRUE(driver.ok());
  Governor governor;
  WeightOptions options;
  options.driver = driver->get();
  options.governor = &governor;
  auto model = cpu_model(tiny, options);
  ASSERT_NE(model, nullptr);
  engine::KvSpaceOptions kv_options;
  kv_options.driver = driver->get();
  kv_options.governor = &governor;
  kv_options.device_budget_bytes = sizes.total() / 2;
  kv_options.max_context = 64;
  auto kv = engine::KvSpace::create(config, kv_options);
  ASSERT_FALSE(kv.ok());
  EXPECT_NE(kv.status().message().find("leaving nothing for the KV cache"), std::string::npos);
}

// Every driver call while the store is built and the model loads, failed in turn: a clear
// error, and every handle, mapping, reservation and governed byte back.
TEST(WeightStoreFaults, EveryFailedDriverCallLeavesNothingBehind) {
  const ModelConfig config = deep_config();
  TinyModel tiny(config, TensorDType::kF32, 9);
  auto host = make_host_driver();
  ASSERT_TRUE(host.ok());
  const std::uint64_t budget = weight_budget_for(weight_sizes(config, DType::kFp32), kPage, 10, 2);
  std::uint64_t failed = 0;
  for (std::uint64_t k = 1;; ++k) {
    ASSERT_LT(k, 10000u) << "the load never succeeded";
    FaultDriver faults(**host);
    Governor governor;
    faults.fail_nth_call(k);
    WeightOptions options;
    options.driver = &faults;
    options.governor = &governor;
    options.budget_bytes = budget;
    CpuModelOptions model_options;
    model_options.threads = 1;
    model_options.weights = options;
    {
      auto made = make_cpu_model(config, tiny.weights(), model_options);
      if (faults.injected() == 0) {
        ASSERT_TRUE(made.ok()) << made.status().to_string();
        EXPECT_GT((*made)->weight_stats().split.streamed_layers, 0u);
        break;
      }
      ++failed;
      // A failure is an error, never a model with a hole in it.
      ASSERT_FALSE(made.ok()) << "call " << k;
      EXPECT_NE(made.status().message().find("weights"), std::string::npos)
          << made.status().to_string();
    }
    const HostDriverTables tables = host_driver_tables(**host);
    EXPECT_EQ(tables.handles, 0u) << "call " << k;
    EXPECT_EQ(tables.mappings, 0u) << "call " << k;
    EXPECT_EQ(tables.reservations, 0u) << "call " << k;
    for (TierId t = 0; t < governor.tier_count(); ++t) {
      EXPECT_EQ(governor.stats(t).used, 0u) << "call " << k;
      EXPECT_EQ(governor.stats(t).reserved, 0u) << "call " << k;
    }
  }
  // Reserve, creates, maps and access changes: more than a handful of calls were failed.
  EXPECT_GT(failed, 10u);
}

TEST(WeightStore, StreamedLayersBeyondTheHostLimitAreRefusedBeforeAnythingIsReserved) {
  auto driver = make_host_driver();
  ASSERT_TRUE(driver.ok());
  Governor governor;
  const detail::WeightLayout layout = detail::weight_layout(deep_config(), DType::kFp32);
  WeightOptions options;
  options.driver = driver->get();
  options.governor = &governor;
  options.budget_bytes = weight_budget_for(layout.sizes, kPage, 10, 2);
  options.host_limit_bytes = 4 * layout.sizes.layer_bytes;  // ten layers need 10
  auto store = detail::WeightStore::create(driver->get(), nullptr, layout, options, false);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(store.status().message().find("of host memory"), std::string::npos)
      << store.status().to_string();
  EXPECT_EQ(host_driver_tables(**driver).reservations, 0u);
  EXPECT_EQ(governor.tier_count(), 0u);
  options.host_limit_bytes = 10 * layout.sizes.layer_bytes;
  EXPECT_TRUE(detail::WeightStore::create(driver->get(), nullptr, layout, options, false).ok());
}

TEST(WeightDummy, ASeedDrawsTheSameModelEveryTimeAndAnotherSeedAnother) {
  const ModelConfig config = deep_config();
  TinyModel unused(config, TensorDType::kF32, 1);  // dummy weights read no tensor
  auto dummy = [&](std::uint64_t seed, std::uint64_t budget) {
    WeightOptions options;
    options.format = LoadFormat::kDummy;
    options.dummy_seed = seed;
    options.budget_bytes = budget;
    CpuModelOptions model_options;
    model_options.threads = 1;
    model_options.weights = options;
    auto made = make_cpu_model(config, ModelWeights{}, model_options);
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    return made.ok() ? run_steps(**made) : RunResult{};
  };
  const RunResult a = dummy(5, 0);
  const RunResult b = dummy(5, 0);
  const RunResult streamed =
      dummy(5, weight_budget_for(weight_sizes(config, DType::kFp32), kPage, 10, 2));
  const RunResult other = dummy(6, 0);
  ASSERT_FALSE(a.logits.empty());
  EXPECT_EQ(a.logits, b.logits);
  EXPECT_EQ(a.logits, streamed.logits);
  EXPECT_NE(a.logits, other.logits);
  for (float logit : a.logits) ASSERT_TRUE(std::isfinite(logit));
  // Not all alike: a dummy model still tells tokens apart.
  const auto [low, high] = std::minmax_element(a.logits.begin(), a.logits.end());
  EXPECT_GT(*high - *low, 1e-3f);
}

}  // namespace
}  // namespace kvvm::model::weight_stream_test
