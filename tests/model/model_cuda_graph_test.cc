// CUDA graphs of decode steps (Model::capture_decode_graphs): a tiny random Qwen2-like model
// captured with buckets 1, 2, 4, 8 decodes eight sequences step by step, in batches of 3, 5,
// 8, 1, 2 and 7 (padded up to their bucket), while a second model with the same weights on a
// second arena runs the same steps eagerly. Checked per chunk: logits within 1e-3 relative,
// the argmax equal wherever the top-2 margin exceeds what that tolerance allows (the graph's
// decode split is planned for max_length, the eager one for the step's longest sequence, so
// sums may round differently), the sampled token equal to what sample_token draws from the
// same logits (so each replayed row read its own sampling parameters); GraphStats counting
// replays and eager steps (a prefill step, a step past max_length, after release); bad options
// refused naming the value. Skipped without a GPU; the CPU model's refusal runs everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvvm/model/model.h"
#include "kvvm/model/sampling.h"
#include "kvvm/vmm/cuda_driver.h"
#include "support/attention_support.h"
#include "support/tiny_model.h"

namespace kvvm::model {
namespace {

constexpr double kReplayTolerance = 1e-3;
constexpr std::uint32_t kGraphContext = 256;
constexpr std::uint32_t kSequences = 8;

ModelConfig graph_config() { return testing::tiny_cuda_config(kGraphContext); }

TEST(ModelGraphsCpu, TheCpuModelHasNoDecodeGraphs) {
  const testing::TinyModel tiny(testing::tiny_config(), TensorDType::kF32, 3);
  auto made = make_cpu_model(tiny.config(), tiny.weights(),
                             CpuModelOptions{.limits = {}, .threads = 1, .weights = {}});
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  DecodeGraphOptions options;
  options.batch_sizes = {1, 2};
  options.max_length = 16;
  const Status status = (*made)->capture_decode_graphs(options);
  EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status.to_string();
  EXPECT_EQ((*made)->graph_stats().graphs, 0u);
}

// One model and its arena; the pad slot and eight sequences admitted through kGraphContext.
struct Side {
  std::unique_ptr<Model> model;
  std::unique_ptr<testing::KvArena> kv;
  SlotId pad = 0;
  std::vector<SlotId> slots;
};

struct Row {
  std::uint32_t sequence;
  ChunkSampling sampling;
};

class ModelCudaGraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto driver = make_cuda_driver();
    if (!driver.ok()) GTEST_SKIP() << "no CUDA device: " << driver.status().to_string();
    driver_ = std::move(driver).value();
    tiny_ = std::make_unique<testing::TinyModel>(graph_config(), TensorDType::kBf16, 11);
    for (Side* side : {&graphed_, &eager_}) {
      CudaModelOptions options;
      options.limits = {.max_step_tokens = 256, .max_chunks = kSequences};
      auto made = make_cuda_model(tiny_->config(), tiny_->weights(), options);
      ASSERT_TRUE(made.ok()) << made.status().to_string();
      side->model = std::move(made).value();
      side->kv = testing::KvArena::make(*driver_, tiny_->config().kv_geometry(DType::kBf16),
                                        Layout::kTokenMajor, kGraphContext, kSequences + 1);
      ASSERT_TRUE(side->kv);
      auto pad = side->kv->arena->admit(1);
      ASSERT_TRUE(pad.ok()) << pad.status().to_string();
      side->pad = *pad;
      for (std::uint32_t s = 0; s < kSequences; ++s) {
        auto slot = side->kv->arena->admit(kGraphContext);
        ASSERT_TRUE(slot.ok()) << slot.status().to_string();
        side->slots.push_back(*slot);
      }
    }
    // Prompts of 5, 12, ..., 54 tokens, prefilled in one step on each side.
    std::vector<std::int32_t> ids;
    std::vector<Row> rows;
    std::vector<std::uint32_t> tokens;
    for (std::uint32_t s = 0; s < kSequences; ++s) {
      const std::uint32_t length = 5 + 7 * s;
      for (std::uint32_t i = 0; i < length; ++i) {
        ids.push_back(static_cast<std::int32_t>((s * 31 + i * 7) % 300));
      }
      rows.push_back({s, {}});
      tokens.push_back(length);
    }
    step(rows, ids, tokens, "prefill");
  }

  DecodeGraphOptions options(std::uint32_t max_length) const {
    DecodeGraphOptions o;
    o.batch_sizes = {1, 2, 4, 8};
    o.kv = graphed_.kv->arena->view();
    o.pad_slot = graphed_.pad;
    o.max_length = max_length;
    return o;
  }

  // One step on both sides: rows[c] feeds ids (tokens[c] of them) to its sequence; checks
  // every chunk and records each sequence's next token (the eager side's argmax).
  void step(const std::vector<Row>& rows, const std::vector<std::int32_t>& ids,
            const std::vector<std::uint32_t>& tokens, const std::string& what) {
    const std::uint32_t vocab = tiny_->config().vocab_size;
    const std::size_t n = rows.size();
    std::vector<ChunkSampling> sampling;
    for (const Row& row : rows) sampling.push_back(row.sampling);
    std::vector<float> logits[2];
    std::vector<std::int32_t> argmax[2], sampled[2];
    Side* sides[2] = {&graphed_, &eager_};
    for (int k = 0; k < 2; ++k) {
      std::vector<Chunk> chunks;
      for (std::size_t c = 0; c < n; ++c) {
        chunks.push_back({sides[k]->slots[rows[c].sequence], length_[rows[c].sequence], tokens[c]});
      }
      logits[k].assign(n * vocab, NAN);
      argmax[k].assign(n, -1);
      sampled[k].assign(n, -1);
      const Status done =
          sides[k]->model->forward({ids, chunks, sides[k]->kv->arena->view(), sampling},
                                   {logits[k].data(), argmax[k].data(), sampled[k].data()});
      ASSERT_TRUE(done.ok()) << what << ": " << done.to_string();
    }
    for (std::size_t c = 0; c < n; ++c) {
      const std::string where = what + ", chunk " + std::to_string(c) + " (sequence " +
                                std::to_string(rows[c].sequence) + " at " +
                                std::to_string(length_[rows[c].sequence]) + ")";
      const std::span<const float> graph(&logits[0][c * vocab], vocab);
      const std::span<const float> eager(&logits[1][c * vocab], vocab);
      float most = 0, worst = 0;
      for (std::uint32_t i = 0; i < vocab; ++i) {
        ASSERT_TRUE(std::isfinite(graph[i]) && std::isfinite(eager[i])) << where;
        most = std::max(most, std::fabs(eager[i]));
        worst = std::max(worst, std::fabs(graph[i] - eager[i]));
      }
      EXPECT_LE(worst, kReplayTolerance * most) << where;
      ++rows_;
      if (worst == 0) ++identical_rows_;
      // The argmax equal wherever the eager top-2 margin exceeds twice the tolerance.
      std::vector<float> sorted(eager.begin(), eager.end());
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
      if (sorted[0] - sorted[1] > 2 * kReplayTolerance * most) {
        EXPECT_EQ(argmax[0][c], argmax[1][c]) << where;
      }
      for (int k = 0; k < 2; ++k) {
        const std::span<const float> row(&logits[k][c * vocab], vocab);
        const auto best =
            static_cast<std::int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
        EXPECT_EQ(argmax[k][c], best) << where << (k == 0 ? " (graph)" : " (eager)");
        EXPECT_EQ(sampled[k][c],
                  sample_token(row, rows[c].sampling.params, rows[c].sampling.counter))
            << where << (k == 0 ? " (graph)" : " (eager)");
      }
      next_[rows[c].sequence] = argmax[1][c];
      length_[rows[c].sequence] += tokens[c];
    }
  }

  // A decode step of `count` sequences starting at `first` (round robin), each fed its next
  // token; sampling varies by row.
  void decode(std::uint32_t count, std::uint32_t first, std::uint64_t counter,
              const std::string& what) {
    std::vector<Row> rows;
    std::vector<std::int32_t> ids;
    for (std::uint32_t i = 0; i < count; ++i) {
      const std::uint32_t s = (first + i) % kSequences;
      Row row{s, {}};
      row.sampling.counter = counter;
      row.sampling.params.seed = 1000 + s;
      switch ((s + counter) % 4) {
        case 0:
          break;  // greedy
        case 1:
          row.sampling.params.temperature = 1.0f;
          break;
        case 2:
          row.sampling.params.temperature = 0.8f;
          row.sampling.params.top_k = 20;
          break;
        default:
          row.sampling.params.temperature = 1.2f;
          row.sampling.params.top_p = 0.9f;
          break;
      }
      rows.push_back(row);
      ids.push_back(next_[s]);
    }
    step(rows, ids, std::vector<std::uint32_t>(count, 1), what);
  }

  std::unique_ptr<Driver> driver_;
  std::unique_ptr<testing::TinyModel> tiny_;
  Side graphed_, eager_;
  std::uint32_t length_[kSequences] = {};
  std::int32_t next_[kSequences] = {};
  int identical_rows_ = 0;
  int rows_ = 0;
};

TEST_F(ModelCudaGraphTest, ReplaysMatchEagerStepsAcrossBatchSizesAndGrowingLengths) {
  {
    const auto guard = graphed_.kv->arena->begin_capture();
    const Status captured = graphed_.model->capture_decode_graphs(options(kGraphContext));
    ASSERT_TRUE(captured.ok()) << captured.to_string();
  }
  EXPECT_EQ(graphed_.model->graph_stats().graphs, 4u);
  const GraphStats before = graphed_.model->graph_stats();
  const std::uint32_t sizes[] = {3, 5, 8, 1, 2, 7};
  int steps = 0;
  for (std::uint64_t t = 0; t < 30; ++t) {
    const std::uint32_t count = sizes[t % 6];
    decode(count, static_cast<std::uint32_t>(t * 3), t, "step " + std::to_string(t));
    if (HasFatalFailure()) return;
    ++steps;
  }
  const GraphStats after = graphed_.model->graph_stats();
  EXPECT_EQ(after.replays - before.replays, static_cast<std::uint64_t>(steps));
  EXPECT_EQ(after.eager_steps, before.eager_steps);
  EXPECT_EQ(eager_.model->graph_stats().replays, 0u);
  std::printf("%d of %d rows bit-identical to the eager step\n", identical_rows_, rows_);

  // A step with a prefill chunk runs eagerly, and decodes replay again after it.
  const std::uint32_t s = 2;
  step({Row{s, {}}}, {next_[s], 7, 9}, {3}, "prefill chunk");
  EXPECT_EQ(graphed_.model->graph_stats().replays, after.replays);
  EXPECT_EQ(graphed_.model->graph_stats().eager_steps, after.eager_steps + 1);
  decode(4, 0, 99, "decode after the prefill chunk");
  EXPECT_EQ(graphed_.model->graph_stats().replays, after.replays + 1);

  graphed_.model->release_decode_graphs();
  EXPECT_EQ(graphed_.model->graph_stats().graphs, 0u);
  decode(3, 1, 100, "after release");
  EXPECT_EQ(graphed_.model->graph_stats().replays, after.replays + 1);
}

TEST_F(ModelCudaGraphTest, AStepPastMaxLengthRunsEagerly) {
  // Sequence 7 (54 tokens) is past a bound of 40; sequence 0 (5 tokens) is not.
  ASSERT_TRUE(graphed_.model->capture_decode_graphs(options(40)).ok());
  decode(1, 0, 1, "within max_length");
  EXPECT_EQ(graphed_.model->graph_stats().replays, 1u);
  const std::uint64_t eager = graphed_.model->graph_stats().eager_steps;
  decode(2, 7, 2, "past max_length");  // sequences 7 and 0
  EXPECT_EQ(graphed_.model->graph_stats().replays, 1u);
  EXPECT_EQ(graphed_.model->graph_stats().eager_steps, eager + 1);
}

TEST_F(ModelCudaGraphTest, BadOptionsAreRefusedNamingTheValue) {
  auto refused = [&](DecodeGraphOptions o, const std::string& needle) {
    const Status status = graphed_.model->capture_decode_graphs(o);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
    EXPECT_NE(status.message().find(needle), std::string::npos) << status.message();
    EXPECT_EQ(graphed_.model->graph_stats().graphs, 0u);
  };
  DecodeGraphOptions o = options(kGraphContext);
  o.batch_sizes = {2, 1};
  refused(o, "batch_sizes[1] = 1");
  o.batch_sizes = {0};
  refused(o, "batch_sizes[0] = 0");
  o.batch_sizes = {1, 9};
  refused(o, "batch_sizes[1] = 9 is outside [1, max_chunks 8]");
  o.batch_sizes = {};
  refused(o, "batch_sizes is empty");
  o = options(0);
  refused(o, "max_length 0");
  o = options(kGraphContext + 1);
  refused(o, "max_length 257 is outside [1, max_position_embeddings 256]");
  o = options(kGraphContext);
  o.kv.head_dim = 32;
  refused(o, "head dim 32");
  // A refusal keeps no graph: a decode step runs eagerly.
  decode(2, 0, 0, "after refusals");
  EXPECT_EQ(graphed_.model->graph_stats().replays, 0u);
}

}  // namespace
}  // namespace kvvm::model
