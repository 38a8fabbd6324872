// Weights streamed through the ring on CUDA: a tiny Qwen2-like model of 16 layers with 25 %,
// 50 % and 90 % of its layers streamed through 2 and 3 slots gives, eagerly and replaying one
// captured decode graph for 100 steps (never captured again while the ring rotates), the
// all-resident model's logits bit for bit; the store's bytes are its handles; a model larger
// than the device's free memory is refused naming the bytes; the dummy load format draws the
// same weights as the CPU's (to bf16 rounding). Skipped without a GPU; compiled only with the
// CUDA kernels (the sanitizer builds are CPU only).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#if defined(KVVM_HAS_CUDA_KERNELS)
#include "kvvm/model/model.h"
#include "kvvm/model/weight_memory.h"
#include "kvvm/vmm/cuda_driver.h"
#include "kvvm/vmm/host_driver.h"
#include "support/attention_support.h"
#include "support/cuda_device.h"
#include "support/tiny_model.h"
#endif

#if defined(KVVM_HAS_CUDA_KERNELS)
namespace kvvm::model::weight_stream_cuda_test {
namespace {

constexpr std::uint32_t kContext = 256;
constexpr std::uint32_t kDecodeSteps = 100;
constexpr std::uint32_t kSequences = 2;
constexpr std::uint64_t kGranule = std::uint64_t{2} << 20;

ModelConfig deep_cuda_config() {
  ModelConfig c = testing::tiny_cuda_config(kContext);
  c.layers = 16;
  return c;
}

struct RunResult {
  std::vector<float> logits;
  std::vector<std::int32_t> tokens;
  GraphStats graphs;
  WeightStats weights;
};

// Two sequences prefilled (9 and 14 tokens), then kDecodeSteps greedy steps of both, eager or
// replaying one captured graph of batch 2.
RunResult run_steps(Model& model, Driver& driver, bool graphs) {
  const ModelConfig& c = model.config();
  RunResult result;
  auto kv = testing::KvArena::make(driver, c.kv_geometry(DType::kBf16), Layout::kTokenMajor,
                                   kContext, kSequences + 1);
  EXPECT_NE(kv, nullptr);
  if (kv == nullptr) return result;
  auto pad = kv->arena->admit(1);
  EXPECT_TRUE(pad.ok());
  std::vector<std::uint32_t> slots;
  for (std::uint32_t s = 0; s < kSequences; ++s) {
    auto slot = kv->arena->admit(kContext);
    EXPECT_TRUE(slot.ok());
    slots.push_back(slot.ok() ? *slot : 0);
  }
  std::vector<std::int32_t> ids;
  for (int i = 0; i < 23; ++i) ids.push_back((i * 41 + 5) % static_cast<int>(c.vocab_size));
  std::vector<Chunk> chunks = {{slots[0], 0, 9}, {slots[1], 0, 14}};
  std::vector<std::uint32_t> lengths = {9, 14};
  for (std::uint32_t step = 0; step <= kDecodeSteps; ++step) {
    if (step == 1 && graphs) {
      DecodeGraphOptions options;
      options.batch_sizes = {kSequences};
      options.kv = kv->arena->view();
      options.pad_slot = pad.ok() ? *pad : 0;
      options.max_length = kContext;
      const Status captured = model.capture_decode_graphs(options);
      EXPECT_TRUE(captured.ok()) << captured.to_string();
    }
    std::vector<float> logits(chunks.size() * c.vocab_size);
    std::vector<std::int32_t> argmax(chunks.size());
    const Status status =
        model.forward({ids, chunks, kv->arena->view(), {}}, {logits.data(), argmax.data()});
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
  result.graphs = model.graph_stats();
  result.weights = model.weight_stats();
  model.release_decode_graphs();
  return result;
}

std::unique_ptr<Model> cuda_model(const testing::TinyModel& tiny, const WeightOptions& weights) {
  CudaModelOptions options;
  options.limits = {.max_step_tokens = 64, .max_chunks = kSequences};
  options.weights = weights;
  auto made = make_cuda_model(tiny.config(), tiny.weights(), options);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  return made.ok() ? std::move(made).value() : nullptr;
}

class WeightStreamCuda
    : public ::testing::TestWithParam<std::tuple<std::uint32_t, std::uint32_t, bool>> {
 protected:
  static void SetUpTestSuite() {
    if (!testing::have_cuda_device()) return;
    auto driver = make_cuda_driver();
    ASSERT_TRUE(driver.ok()) << driver.status().to_string();
    driver_ = driver->release();
    tiny_ = new testing::TinyModel(deep_cuda_config(), TensorDType::kBf16, 17);
    auto resident = cuda_model(*tiny_, {});
    ASSERT_NE(resident, nullptr);
    for (bool graphs : {false, true})
      resident_[graphs] = new RunResult(run_steps(*resident, *driver_, graphs));
  }
  static void TearDownTestSuite() {
    for (RunResult*& r : resident_) {
      delete r;
      r = nullptr;
    }
    delete tiny_;
    delete driver_;
  }
  void SetUp() override {
    if (!testing::have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  }
  static Driver* driver_;
  static testing::TinyModel* tiny_;
  static RunResult* resident_[2];
};
Driver* WeightStreamCuda::driver_ = nullptr;
testing::TinyModel* WeightStreamCuda::tiny_ = nullptr;
RunResult* WeightStreamCuda::resident_[2] = {nullptr, nullptr};

TEST_P(WeightStreamCuda, StreamedLayersGiveTheResidentLogitsBitForBit) {
  const auto [streamed, ring, graphs] = GetParam();
  ASSERT_NE(resident_[graphs], nullptr);
  WeightOptions options;
  options.budget_bytes =
      weight_budget_for(weight_sizes(deep_cuda_config(), DType::kBf16), kGranule, streamed, ring);
  options.ring_slots = ring;
  auto model = cuda_model(*tiny_, options);
  ASSERT_NE(model, nullptr);
  const WeightStats placed = model->weight_stats();
  ASSERT_EQ(placed.split.streamed_layers, streamed);
  ASSERT_EQ(placed.split.ring_slots, ring);
  EXPECT_EQ(placed.physical_bytes, placed.split.device_bytes);
  EXPECT_LE(placed.physical_bytes, options.budget_bytes);
  const RunResult got = run_steps(*model, *driver_, graphs);
  const RunResult& want = *resident_[graphs];
  ASSERT_EQ(got.logits.size(), want.logits.size());
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(std::memcmp(got.logits.data(), want.logits.data(), got.logits.size() * sizeof(float)),
            0);
  if (graphs) {
    // One capture, replayed at every decode step while the ring rotated under it.
    EXPECT_EQ(got.graphs.graphs, 1u);
    EXPECT_EQ(got.graphs.replays, kDecodeSteps);
    // The host enqueued copies for the eager steps only (the prefill and the capture's
    // warm-up); the replays copied without it.
    EXPECT_LE(got.weights.layer_copies, 3u * streamed);
  } else {
    EXPECT_EQ(got.graphs.replays, 0u);
    EXPECT_EQ(got.weights.layer_copies, (kDecodeSteps + 1) * streamed);
  }
}

// 4, 8 and 14 of 16 layers (25 %, 50 %, 90 %: the first and last stay resident).
INSTANTIATE_TEST_SUITE_P(Fractions, WeightStreamCuda,
                         ::testing::Combine(::testing::Values(4u, 8u, 14u),
                                            ::testing::Values(2u, 3u), ::testing::Bool()));

TEST(WeightMemoryCuda, AModelLargerThanTheDeviceIsRefusedNamingTheBytes) {
  if (!testing::have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  // A config whose weights exceed any GPU: refused before a byte is read (dummy weights, so
  // nothing is drawn either).
  ModelConfig huge = deep_cuda_config();
  huge.hidden_size = 16384;
  huge.intermediate_size = 65536;
  huge.heads = 128;
  huge.kv_heads = 8;
  huge.head_dim = 128;
  huge.layers = 200;
  CudaModelOptions options;
  options.weights.format = LoadFormat::kDummy;
  auto made = make_cuda_model(huge, ModelWeights{}, options);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kResourceExhausted) << made.status().to_string();
  EXPECT_NE(made.status().message().find("--weight-budget"), std::string::npos)
      << made.status().to_string();
}

TEST(WeightMemoryCuda, DummyWeightsAreTheCpusRoundedToBf16) {
  if (!testing::have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  const ModelConfig config = deep_cuda_config();
  WeightOptions dummy;
  dummy.format = LoadFormat::kDummy;
  dummy.dummy_seed = 21;
  CudaModelOptions cuda_options;
  cuda_options.limits = {.max_step_tokens = 64, .max_chunks = kSequences};
  cuda_options.weights = dummy;
  auto cuda = make_cuda_model(config, ModelWeights{}, cuda_options);
  ASSERT_TRUE(cuda.ok()) << cuda.status().to_string();
  CpuModelOptions cpu_options;
  cpu_options.limits = cuda_options.limits;
  cpu_options.threads = 1;
  cpu_options.weights = dummy;
  auto cpu = make_cpu_model(config, ModelWeights{}, cpu_options);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  auto driver = make_cuda_driver();
  ASSERT_TRUE(driver.ok());
  const RunResult on_gpu = run_steps(**cuda, **driver, false);
  // The CPU model on its own host arena: the first step's logits, prefill of both sequences.
  auto host = make_host_driver();
  ASSERT_TRUE(host.ok());
  auto kv = testing::KvArena::make(**host, config.kv_geometry(DType::kFp32), Layout::kTokenMajor,
                                   kContext, 2);
  ASSERT_NE(kv, nullptr);
  std::vector<std::uint32_t> slots;
  for (int s = 0; s < 2; ++s) slots.push_back(*kv->arena->admit(kContext));
  std::vector<std::int32_t> ids;
  for (int i = 0; i < 23; ++i) ids.push_back((i * 41 + 5) % static_cast<int>(config.vocab_size));
  const std::vector<Chunk> chunks = {{slots[0], 0, 9}, {slots[1], 0, 14}};
  std::vector<float> logits(2 * config.vocab_size);
  ASSERT_TRUE((*cpu)->forward({ids, chunks, kv->arena->view(), {}}, {logits.data()}).ok());
  // bf16 weights and activations against float32: close, not equal.
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    worst = std::max(worst, std::abs(double(logits[i]) - on_gpu.logits[i]));
    scale = std::max(scale, std::abs(double(logits[i])));
  }
  ASSERT_GT(scale, 0);
  EXPECT_LT(worst / scale, 0.05) << "worst " << worst << " of " << scale;
}

}  // namespace
}  // namespace kvvm::model::weight_stream_cuda_test
#endif  // KVVM_HAS_CUDA_KERNELS
