// Log-probabilities on the device. The kernel (logprobs_cuda, include/kvvm/kernels/model_kernels.h)
// against a float64 log-softmax of the same logits: vocabularies of 152064, 1000 and 7; random
// rows at several temperatures and alternative counts; ties across warps and at the cut; a row
// ascending by id (every logit beats the last); NaN and -inf; a row of NaN; targets given and
// read from the sampled array; an inactive row left as it was (its cost is measured by
// `kvvm bench engine --logprobs`, not here). Then the CUDA model: a prefill step's kAll rows
// against the last-row logits of the same prompts' prefixes, and decode steps whose kLast rows,
// replayed through a captured graph with different rows asking each time (no capture in between),
// agree with the eager step and with the CPU log-softmax of their own logits. Skipped without a
// GPU; the refusals are checked everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kvvm/kernels/model_kernels.h"
#include "kvvm/model/model.h"
#include "kvvm/model/sampling.h"
#include "support/logprob_reference.h"
#if defined(KVVM_HAS_CUDA_KERNELS)
#include <cuda_runtime.h>

#include "kvvm/vmm/cuda_driver.h"
#include "support/attention_support.h"
#include "support/cuda_device.h"
#include "support/device_buffer.h"
#include "support/tiny_model.h"
#endif

namespace kvvm {
namespace {

using model::RowLogprobs;
using testing::expect_logprobs;

TEST(ModelKernelsLogprobsChecks, MalformedCallsAreRefused) {
#if !defined(KVVM_HAS_CUDA_KERNELS)
  EXPECT_EQ(logprobs_cuda(LogprobsParams{}, nullptr).code(), StatusCode::kUnavailable);
#else
  EXPECT_TRUE(logprobs_cuda(LogprobsParams{}, nullptr).ok());  // zero rows: nothing to launch
  float logits[4] = {};
  LogprobRow row;
  LogprobResult out{};
  LogprobsParams p{.rows = 1, .vocab = 0, .logits = logits, .rows_params = &row, .out = &out};
  Status refused = logprobs_cuda(p, nullptr);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("vocab is 0"), std::string::npos) << refused.to_string();
  p.vocab = 4;
  p.out = nullptr;
  refused = logprobs_cuda(p, nullptr);
  EXPECT_NE(refused.message().find("out is null"), std::string::npos) << refused.to_string();
#endif
}

#if defined(KVVM_HAS_CUDA_KERNELS)

bool have_device() { return testing::have_cuda_device(); }

RowLogprobs from_result(const LogprobResult& r) {
  RowLogprobs row;
  row.logprob = r.logprob;
  row.target = r.target;
  row.top = r.top;
  for (std::uint32_t j = 0; j < std::min(r.top, model::kMaxTopLogprobs); ++j) {
    row.top_ids[j] = r.top_ids[j];
    row.top_logprobs[j] = r.top_logprobs[j];
  }
  return row;
}

struct KernelRow {
  std::vector<float> logits;
  LogprobRow params;
  std::int32_t sampled = -1;  // what the sampled array holds for the row
  std::string kind;
};

// Runs the rows (one vocabulary) in one launch; returns the results, poisoned before.
std::vector<LogprobResult> launch(const std::vector<KernelRow>& rows, std::uint32_t vocab) {
  std::vector<float> logits;
  std::vector<LogprobRow> params;
  std::vector<std::int32_t> sampled;
  for (const KernelRow& r : rows) {
    logits.insert(logits.end(), r.logits.begin(), r.logits.end());
    params.push_back(r.params);
    sampled.push_back(r.sampled);
  }
  testing::DeviceBuffer d_logits(logits), d_params(params), d_sampled(sampled);
  testing::DeviceBuffer d_out(rows.size() * sizeof(LogprobResult));
  d_out.poison();
  LogprobsParams p;
  p.rows = static_cast<std::uint32_t>(rows.size());
  p.vocab = vocab;
  p.logits = static_cast<const float*>(d_logits.get());
  p.rows_params = static_cast<const LogprobRow*>(d_params.get());
  p.sampled = static_cast<const std::int32_t*>(d_sampled.get());
  p.out = static_cast<LogprobResult*>(d_out.get());
  const Status launched = logprobs_cuda(p, nullptr);
  EXPECT_TRUE(launched.ok()) << launched.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<std::uint8_t> bytes = d_out.download();
  std::vector<LogprobResult> out(rows.size());
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

LogprobRow asks(float temperature, std::int32_t target, std::uint32_t top) {
  return {.active = 1, .temperature = temperature, .target = target, .top = top};
}

class ModelKernelsLogprobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(ModelKernelsLogprobsTest, MatchesAFloat64LogSoftmax) {
  std::mt19937_64 random(23);
  for (const std::uint32_t vocab : {152064u, 1000u, 7u}) {
    std::normal_distribution<float> normal(0.0f, 3.0f);
    auto random_row = [&] {
      std::vector<float> row(vocab);
      for (float& l : row) l = normal(random);
      return row;
    };
    auto id = [&](std::uint32_t i) { return static_cast<std::int32_t>(i % vocab); };
    std::vector<KernelRow> rows;
    for (const float t : {0.0f, 0.5f, 1.0f, 1.9f}) {
      for (const std::uint32_t top : {0u, 1u, 5u, 20u}) {
        rows.push_back({random_row(), asks(t, id(static_cast<std::uint32_t>(random())), top), -1,
                        "random T " + std::to_string(t) + " top " + std::to_string(top)});
      }
    }
    // Equal maxima spread over the row (so over warps), and a second tier crossing the cut.
    std::vector<float> ties(vocab, -1.0f);
    for (const std::uint32_t i : {150000u, 5u, 70000u, 77u}) ties[i % vocab] = 9.0f;
    for (const std::uint32_t i : {3u, 100000u, 99999u, 64000u, 12u}) ties[i % vocab] = 8.0f;
    rows.push_back({ties, asks(0.0f, id(3), 6), -1, "ties"});
    rows.push_back({std::vector<float>(vocab, 0.25f), asks(0.7f, id(vocab - 1), 20), -1, "flat"});
    std::vector<float> ascending(vocab);
    for (std::uint32_t i = 0; i < vocab; ++i) ascending[i] = static_cast<float>(i) * 1e-3f;
    rows.push_back({ascending, asks(1.0f, id(0), 20), -1, "ascending"});
    std::vector<float> holes = random_row();
    for (std::uint32_t i = 0; i < vocab; i += 3) holes[i] = i % 2 == 0 ? NAN : -INFINITY;
    holes[vocab / 2] = 40.0f;
    rows.push_back({holes, asks(0.0f, id(3), 10), -1, "NaN and -inf"});
    rows.push_back({std::vector<float>(vocab, NAN), asks(1.0f, id(1), 4), -1, "all NaN"});
    rows.push_back({random_row(), asks(0.8f, kLogprobSampled, 5), id(4321), "sampled target"});
    rows.push_back(
        {random_row(), asks(0.0f, static_cast<std::int32_t>(vocab), 2), -1, "target outside"});
    KernelRow inactive{random_row(), LogprobRow{}, -1, "inactive"};
    rows.push_back(inactive);
    const std::vector<LogprobResult> out = launch(rows, vocab);
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const KernelRow& row = rows[r];
      const std::string where = "vocab " + std::to_string(vocab) + ", " + row.kind;
      if (row.params.active == 0) {
        EXPECT_EQ(out[r].top, 0xffffffffu) << where << ": an inactive row was written";
        continue;
      }
      const std::int32_t target =
          row.params.target == kLogprobSampled ? row.sampled : row.params.target;
      expect_logprobs(from_result(out[r]), row.logits, row.params.temperature, target,
                      row.params.top, 1e-4, where);
    }
    if (vocab == 152064u) {  // the tie orders written out, lowest id first
      const LogprobResult& t = out[16];
      const std::int32_t want[] = {5, 77, 70000, 150000, 3, 12};
      for (int j = 0; j < 6; ++j) EXPECT_EQ(t.top_ids[j], want[j]) << "tie rank " << j;
      const LogprobResult& flat = out[17];
      for (int j = 0; j < 20; ++j) EXPECT_EQ(flat.top_ids[j], j) << "flat rank " << j;
    }
  }
}

// The CUDA model: a tiny Qwen2-like model (head dim 64, bf16) on a token-major arena.
model::ModelConfig cuda_config() { return testing::tiny_cuda_config(256); }

constexpr std::uint32_t kSlots = 12;

class ModelCudaLogprobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto driver = make_cuda_driver();
    if (!driver.ok()) GTEST_SKIP() << "no CUDA device: " << driver.status().to_string();
    driver_ = std::move(driver).value();
    tiny_ = std::make_unique<testing::TinyModel>(cuda_config(), model::TensorDType::kBf16, 13);
    model::CudaModelOptions options;
    options.limits = {.max_step_tokens = 256, .max_chunks = 4};  // prompts run in blocks of 4
    auto made = model::make_cuda_model(tiny_->config(), tiny_->weights(), options);
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    model_ = std::move(made).value();
    kv_ = testing::KvArena::make(*driver_, tiny_->config().kv_geometry(DType::kBf16),
                                 Layout::kTokenMajor, 256, kSlots);
    ASSERT_TRUE(kv_);
    for (std::uint32_t s = 0; s < kSlots; ++s) {
      auto slot = kv_->arena->admit(256);
      ASSERT_TRUE(slot.ok()) << slot.status().to_string();
      slots_.push_back(*slot);
    }
  }

  struct Out {
    std::vector<float> logits;
    std::vector<std::int32_t> sampled;
    std::vector<RowLogprobs> logprobs;
  };

  Out step(const std::vector<model::Chunk>& chunks, const std::vector<std::int32_t>& ids,
           const std::vector<model::ChunkSampling>& sampling) {
    const model::StepBatch batch{ids, chunks, kv_->arena->view(), sampling};
    const std::uint32_t vocab = tiny_->config().vocab_size;
    Out out;
    out.logits.assign(chunks.size() * vocab, NAN);
    out.sampled.assign(chunks.size(), -1);
    out.logprobs.assign(model::logprob_row_count(batch), RowLogprobs{});
    const Status done = model_->forward(
        batch, {out.logits.data(), nullptr, out.sampled.data(), out.logprobs.data()});
    EXPECT_TRUE(done.ok()) << done.to_string();
    return out;
  }

  std::span<const float> row(const Out& out, std::size_t c) const {
    const std::uint32_t vocab = tiny_->config().vocab_size;
    return {&out.logits[c * vocab], vocab};
  }

  std::unique_ptr<Driver> driver_;
  std::unique_ptr<testing::TinyModel> tiny_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<testing::KvArena> kv_;
  std::vector<SlotId> slots_;
};

model::ChunkSampling asking(model::LogprobRows rows, std::uint32_t top, float temperature,
                            std::uint64_t seed) {
  model::ChunkSampling s;
  s.params.temperature = temperature;
  s.params.seed = seed;
  s.counter = seed;
  s.logprob_rows = rows;
  s.top_logprobs = top;
  return s;
}

std::vector<std::int32_t> prompt_of(std::uint32_t length, std::uint32_t salt) {
  std::vector<std::int32_t> ids;
  for (std::uint32_t i = 0; i < length; ++i) {
    ids.push_back(static_cast<std::int32_t>((salt * 37 + i * 11 + i * i) % 300));
  }
  return ids;
}

TEST_F(ModelCudaLogprobsTest, AllRowsEqualTheLogSoftmaxOfThePrefixesLogits) {
  using model::LogprobRows;
  // Prompts of 13 and 22 tokens asking for every row, between one asking for its last row and
  // one asking for none.
  const std::uint32_t lengths[] = {6, 13, 9, 22};
  const std::vector<model::ChunkSampling> sampling = {
      asking(LogprobRows::kLast, 3, 0.0f, 1), asking(LogprobRows::kAll, 4, 3.0f, 2),
      asking(LogprobRows::kNone, 0, 1.0f, 3), asking(LogprobRows::kAll, 20, 6.0f, 4)};
  std::vector<model::Chunk> chunks;
  std::vector<std::int32_t> ids;
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::uint32_t c = 0; c < 4; ++c) {
    prompts.push_back(prompt_of(lengths[c], c));
    chunks.push_back({slots_[c], 0, lengths[c]});
    ids.insert(ids.end(), prompts[c].begin(), prompts[c].end());
  }
  const Out all = step(chunks, ids, sampling);
  ASSERT_EQ(all.logprobs.size(), 1u + 13u + 22u);
  // The last rows against the step's own logits: the same kernel, tight.
  expect_logprobs(all.logprobs[0], row(all, 0), 0.0f, all.sampled[0], 3, 1e-4, "chunk 0");
  expect_logprobs(all.logprobs[13], row(all, 1), 3.0f, all.sampled[1], 4, 1e-4, "chunk 1");
  expect_logprobs(all.logprobs[35], row(all, 3), 6.0f, all.sampled[3], 20, 1e-4, "chunk 3");
  // Each earlier row against a prefill of the prompt's first j + 1 tokens on a spare slot. The
  // two runs' GEMMs have other row counts, so bf16 roundings may differ: as the graph tests
  // allow, logits within 1e-3 of the row's largest, so log-probs within twice that over T (and
  // 1e-4 more). This random model's logits spread widely (a standard deviation near 10), so a
  // row scoring the wrong token or position is off by far more; the temperatures above keep
  // the bound tight.
  std::size_t index = 1;
  for (const std::uint32_t c : {1u, 3u}) {
    for (std::uint32_t j = 0; j + 1 < lengths[c]; ++j, ++index) {
      const std::vector<std::int32_t> prefix(prompts[c].begin(), prompts[c].begin() + j + 1);
      const Out alone =
          step({{slots_[4 + c], 0, j + 1}}, prefix, {asking(LogprobRows::kNone, 0, 0.0f, 0)});
      const std::span<const float> logits = row(alone, 0);
      double largest = 0;
      for (const float l : logits) largest = std::max(largest, std::fabs(static_cast<double>(l)));
      const double bound = 2 * 3e-3 * largest / sampling[c].params.temperature + 1e-4;
      expect_logprobs(all.logprobs[index], logits, sampling[c].params.temperature,
                      prompts[c][j + 1], sampling[c].top_logprobs, bound,
                      "chunk " + std::to_string(c) + ", row " + std::to_string(j), true);
    }
    ++index;  // the last row, checked above
  }
}

TEST_F(ModelCudaLogprobsTest, GraphReplaysReadEachRowsRequest) {
  using model::LogprobRows;
  // Three sequences prefilled, then one decode step run eagerly and, after capture, replayed
  // at the same positions with the same tokens (so it rewrites the same K / V) three times,
  // each with other rows asking.
  const std::uint32_t lengths[] = {7, 15, 30};
  std::vector<model::Chunk> chunks;
  std::vector<std::int32_t> ids;
  for (std::uint32_t c = 0; c < 3; ++c) {
    const std::vector<std::int32_t> p = prompt_of(lengths[c], 10 + c);
    chunks.push_back({slots_[c], 0, lengths[c]});
    ids.insert(ids.end(), p.begin(), p.end());
  }
  (void)step(chunks, ids, std::vector<model::ChunkSampling>(3));
  std::vector<model::Chunk> decode;
  for (std::uint32_t c = 0; c < 3; ++c) decode.push_back({slots_[c], lengths[c], 1});
  const std::vector<std::int32_t> next = {17, 42, 299};
  const std::vector<std::vector<model::ChunkSampling>> requests = {
      {asking(LogprobRows::kLast, 5, 0.7f, 1), asking(LogprobRows::kNone, 0, 1.0f, 2),
       asking(LogprobRows::kLast, 0, 0.0f, 3)},
      {asking(LogprobRows::kNone, 9, 0.0f, 4), asking(LogprobRows::kAll, 20, 1.3f, 5),
       asking(LogprobRows::kLast, 1, 0.0f, 6)},
      {asking(LogprobRows::kNone, 0, 0.0f, 7), asking(LogprobRows::kNone, 0, 0.5f, 8),
       asking(LogprobRows::kNone, 0, 1.0f, 9)}};
  std::vector<Out> eager;
  for (const auto& sampling : requests) eager.push_back(step(decode, next, sampling));
  model::DecodeGraphOptions options;
  options.batch_sizes = {1, 4};
  options.kv = kv_->arena->view();
  options.pad_slot = slots_[kSlots - 1];
  options.max_length = 128;
  const Status captured = model_->capture_decode_graphs(options);
  ASSERT_TRUE(captured.ok()) << captured.to_string();
  for (std::size_t k = 0; k < requests.size(); ++k) {
    const std::uint64_t replays = model_->graph_stats().replays;
    const Out graph = step(decode, next, requests[k]);
    EXPECT_EQ(model_->graph_stats().replays, replays + 1) << "request " << k;
    ASSERT_EQ(graph.logprobs.size(), eager[k].logprobs.size());
    std::size_t index = 0;
    for (std::size_t c = 0; c < decode.size(); ++c) {
      const model::ChunkSampling& s = requests[k][c];
      if (s.logprob_rows == LogprobRows::kNone) continue;
      const std::string where = "request " + std::to_string(k) + ", chunk " + std::to_string(c);
      const RowLogprobs& g = graph.logprobs[index];
      const RowLogprobs& e = eager[k].logprobs[index];
      ++index;
      expect_logprobs(g, row(graph, c), s.params.temperature, graph.sampled[c], s.top_logprobs,
                      1e-4, where + " (graph)");
      expect_logprobs(e, row(eager[k], c), s.params.temperature, eager[k].sampled[c],
                      s.top_logprobs, 1e-4, where + " (eager)");
      // Across the two: a log-prob moves at most twice the logits' largest change over T.
      double moved = 0;
      for (std::size_t i = 0; i < row(graph, c).size(); ++i) {
        moved = std::max(moved, std::fabs(static_cast<double>(row(graph, c)[i]) -
                                          static_cast<double>(row(eager[k], c)[i])));
      }
      const double scale = s.params.temperature > 0 ? 1.0 / s.params.temperature : 1.0;
      if (g.target == e.target) {
        EXPECT_NEAR(g.logprob, e.logprob, 2 * moved * scale + 1e-4) << where;
      }
    }
  }
  model_->release_decode_graphs();
}

#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace
}  // namespace kvvm
