// Logit transforms on the device (penalties, logit_bias, bans). The kernel (logit_adjust_cuda,
// include/kvvm/kernels/model_kernels.h) against the CPU's adjust_logits on the same floats, bit for
// bit: random rows of a 152064 and a 1000 vocabulary, each with its own penalties (repetition
// below, at and above 1, negative presence), random entries (counts up to 10^6 so the frequency
// term rounds, tokens seen only in the prompt, biases of +100, -inf and random), a row listing
// every id, rows with no entries left as they were, NaN logits, zeros, and ranges laid out out of
// row order. Then the CUDA model: a decode step whose transforms make greedy sampling pick a token
// biased by +100 and avoid a banned one, with the logits returned equal to the same step's raw
// logits transformed on the host; the same through a captured graph's replay (padding row
// included), followed by a replay without transforms that gives the raw logits back; and a step
// that asks for the argmax only. Token masks (structured output) the same way: a masked step's
// draws stay inside their masks and its logits are the raw ones with -inf outside, eagerly and
// through a replay, and an unmasked replay after it gives the raw step back. Skipped without a
// GPU; the refusals are checked everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
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
#if defined(KVVM_HAS_CUDA_KERNELS)
#include <cuda_runtime.h>

#include "kvvm/vmm/cuda_driver.h"
#include "support/attention_support.h"
#include "support/cuda_device.h"
#include "support/device_buffer.h"
#include "support/tiny_model.h"
#endif

namespace kvvm::model::logit_adjust_cuda_test {
namespace {

static_assert(sizeof(LogitAdjustEntry) == sizeof(LogitAdjustment),
              "the test uploads LogitAdjustments as the kernel's entries");

TEST(LogitAdjustKernelChecks, MalformedCallsAreRefused) {
#if !defined(KVVM_HAS_CUDA_KERNELS)
  EXPECT_EQ(logit_adjust_cuda(LogitAdjustParams{}, nullptr).code(), StatusCode::kUnavailable);
#else
  EXPECT_TRUE(logit_adjust_cuda(LogitAdjustParams{}, nullptr).ok());  // zero rows: no launch
  float logits[4] = {};
  LogitAdjustRow row;
  LogitAdjustEntry entry{};
  LogitAdjustParams p{
      .rows = 1, .vocab = 0, .logits = logits, .rows_params = &row, .entries = &entry};
  Status refused = logit_adjust_cuda(p, nullptr);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("vocab is 0"), std::string::npos) << refused.to_string();
  p.vocab = 4;
  p.entries = nullptr;
  refused = logit_adjust_cuda(p, nullptr);
  EXPECT_NE(refused.message().find("entries is null"), std::string::npos) << refused.to_string();
#endif
}

#if defined(KVVM_HAS_CUDA_KERNELS)

bool have_device() { return testing::have_cuda_device(); }

LogitAdjustRow row_of(const SamplingParams& params, std::uint32_t begin, std::uint32_t count) {
  return {.presence_penalty = params.presence_penalty,
          .frequency_penalty = params.frequency_penalty,
          .repetition_penalty = params.repetition_penalty,
          .begin = begin,
          .count = count};
}

// Equal bits, or both NaN (the device's NaN need not carry the host's payload).
bool same_float(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b) ||
         (std::isnan(a) && std::isnan(b));
}

// One row of the kernel test: its logits, penalties and entries (ids ascending, distinct).
struct KernelRow {
  std::vector<float> logits;
  SamplingParams params;
  std::vector<LogitAdjustment> entries;
  std::string kind;
};

std::vector<LogitAdjustment> random_entries(std::mt19937_64& random, std::uint32_t vocab,
                                            double density) {
  std::bernoulli_distribution listed(density), in_prompt(0.4), seen(0.6), rare(0.05);
  std::uniform_int_distribution<std::uint32_t> small(1, 9), large(1000, 1000000);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<LogitAdjustment> entries;
  for (std::uint32_t id = 0; id < vocab; ++id) {
    if (!listed(random)) continue;
    LogitAdjustment a;
    a.id = static_cast<std::int32_t>(id);
    a.count = seen(random) ? (rare(random) ? large(random) : small(random)) : 0;
    a.in_prompt = in_prompt(random) ? 1 : 0;
    const std::uint32_t kind = static_cast<std::uint32_t>(random() % 10);
    a.bias = kind == 0 ? -INFINITY : kind == 1 ? 100.0f : kind < 5 ? normal(random) : 0.0f;
    entries.push_back(a);
  }
  return entries;
}

class LogitAdjustKernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(LogitAdjustKernelTest, MatchesAdjustLogitsBitForBit) {
  std::mt19937_64 random(41);
  for (const std::uint32_t vocab : {152064u, 1000u}) {
    std::normal_distribution<float> normal(0.0f, 4.0f);
    auto random_row = [&] {
      std::vector<float> row(vocab);
      for (float& l : row) l = normal(random);
      // Zeros of both signs and NaN at a few ids the entries are likely to list.
      for (std::uint32_t i = 0; i < vocab; i += 97) row[i] = i % 3 == 0 ? 0.0f : -0.0f;
      for (std::uint32_t i = 5; i < vocab; i += 401) row[i] = NAN;
      return row;
    };
    auto params = [](float presence, float frequency, float repetition) {
      SamplingParams p;
      p.presence_penalty = presence;
      p.frequency_penalty = frequency;
      p.repetition_penalty = repetition;
      return p;
    };
    std::vector<KernelRow> rows;
    rows.push_back({random_row(), params(0.5f, 0.3f, 1.3f), random_entries(random, vocab, 0.02),
                    "all three penalties"});
    rows.push_back({random_row(), params(0.0f, 0.0f, 1.0f), {}, "none"});
    rows.push_back({random_row(), params(-0.7f, 0.11f, 0.8f), random_entries(random, vocab, 0.3),
                    "repetition below 1, negative presence"});
    rows.push_back({random_row(), params(0.0f, 0.0f, 1.0f), random_entries(random, vocab, 0.01),
                    "biases only"});
    rows.push_back({random_row(), params(1.9f, 0.0f, 1.0f), {}, "penalties but no entries"});
    rows.push_back({random_row(), params(0.2f, 1.7f, 1.05f), random_entries(random, vocab, 1.0),
                    "every id listed"});
    rows.push_back({random_row(), params(0.1f, 0.37f, 2.5f), random_entries(random, vocab, 0.05),
                    "strong repetition"});
    // The rows' ranges laid out last row first, so each row must read its own begin.
    std::vector<LogitAdjustment> entries;
    std::vector<LogitAdjustRow> row_params(rows.size());
    for (std::size_t r = rows.size(); r-- > 0;) {
      const auto begin = static_cast<std::uint32_t>(entries.size());
      entries.insert(entries.end(), rows[r].entries.begin(), rows[r].entries.end());
      row_params[r] =
          row_of(rows[r].params, begin, static_cast<std::uint32_t>(rows[r].entries.size()));
    }
    std::vector<float> logits;
    for (const KernelRow& row : rows)
      logits.insert(logits.end(), row.logits.begin(), row.logits.end());
    testing::DeviceBuffer d_logits(logits), d_rows(row_params), d_entries(entries);
    LogitAdjustParams p;
    p.rows = static_cast<std::uint32_t>(rows.size());
    p.vocab = vocab;
    p.logits = static_cast<float*>(d_logits.get());
    p.rows_params = static_cast<const LogitAdjustRow*>(d_rows.get());
    p.entries = static_cast<const LogitAdjustEntry*>(d_entries.get());
    const Status launched = logit_adjust_cuda(p, nullptr);
    ASSERT_TRUE(launched.ok()) << launched.to_string();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<std::uint8_t> bytes = d_logits.download();
    std::vector<float> out(logits.size());
    std::memcpy(out.data(), bytes.data(), bytes.size());
    for (std::size_t r = 0; r < rows.size(); ++r) {
      std::vector<float> want = rows[r].logits;
      adjust_logits(want, rows[r].params, rows[r].entries);
      const std::string where = "vocab " + std::to_string(vocab) + ", " + rows[r].kind;
      std::size_t wrong = 0, changed = 0;
      for (std::uint32_t i = 0; i < vocab; ++i) {
        const float got = out[r * vocab + i];
        changed += same_float(want[i], rows[r].logits[i]) ? 0 : 1;
        if (same_float(got, want[i])) continue;
        if (wrong++ < 5) {
          ADD_FAILURE() << where << ": id " << i << " is " << got << ", adjust_logits gives "
                        << want[i] << " (from " << rows[r].logits[i] << ")";
        }
      }
      EXPECT_EQ(wrong, 0u) << where;
      if (!rows[r].entries.empty()) {
        EXPECT_GT(changed, 0u) << where << ": nothing to compare";
      }
    }
  }
}

TEST_F(LogitAdjustKernelTest, IdsOutsideTheVocabularyAreSkipped) {
  const std::vector<float> logits = {1.0f, -2.0f, 3.0f};
  const std::vector<LogitAdjustment> entries = {
      {.id = -1, .count = 1, .in_prompt = 0, .bias = 5.0f},
      {.id = 1, .count = 0, .in_prompt = 0, .bias = 5.0f},
      {.id = 3, .count = 1, .in_prompt = 0, .bias = 5.0f}};
  const std::vector<LogitAdjustRow> rows = {row_of(SamplingParams{}, 0, 3)};
  testing::DeviceBuffer d_logits(logits), d_rows(rows), d_entries(entries);
  LogitAdjustParams p{.rows = 1,
                      .vocab = 3,
                      .logits = static_cast<float*>(d_logits.get()),
                      .rows_params = static_cast<const LogitAdjustRow*>(d_rows.get()),
                      .entries = static_cast<const LogitAdjustEntry*>(d_entries.get())};
  ASSERT_TRUE(logit_adjust_cuda(p, nullptr).ok());
  const std::vector<std::uint8_t> bytes = d_logits.download();
  std::vector<float> out(3);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  EXPECT_EQ(out, (std::vector<float>{1.0f, 3.0f, 3.0f}));
}

// The CUDA model: a tiny Qwen2-like model (head dim 64, bf16) on a token-major arena.
ModelConfig cuda_config() { return testing::tiny_cuda_config(256); }

TEST(LogitAdjustModelChecks, ALimitBelowTheVocabularyIsRefused) {
  const testing::TinyModel tiny(cuda_config(), TensorDType::kBf16, 3);
  CudaModelOptions options;
  options.limits.max_logit_adjustments = 299;
  auto made = make_cuda_model(tiny.config(), tiny.weights(), options);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find("max_logit_adjustments"), std::string::npos)
      << made.status().to_string();
}

constexpr std::uint32_t kSlots = 5;
constexpr std::uint32_t kChunks = 3;

// What a step returns for its chunks.
struct StepOut {
  std::vector<float> logits;
  std::vector<std::int32_t> argmax;
  std::vector<std::int32_t> sampled;
};

std::int32_t greedy(std::span<const float> logits) { return sample_token(logits, {}, 0); }

class ModelCudaLogitAdjustTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto driver = make_cuda_driver();
    if (!driver.ok()) GTEST_SKIP() << "no CUDA device: " << driver.status().to_string();
    driver_ = std::move(driver).value();
    tiny_ = std::make_unique<testing::TinyModel>(cuda_config(), TensorDType::kBf16, 17);
    CudaModelOptions options;
    options.limits = {.max_step_tokens = 256, .max_chunks = 4};
    auto made = make_cuda_model(tiny_->config(), tiny_->weights(), options);
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
    // Three prompts prefilled; every later step decodes one token after each, at the same
    // positions with the same tokens, so it rewrites the same K / V.
    std::vector<Chunk> chunks;
    std::vector<std::int32_t> ids;
    for (std::uint32_t c = 0; c < kChunks; ++c) {
      for (std::uint32_t i = 0; i < kLengths[c]; ++i) {
        ids.push_back(static_cast<std::int32_t>((c * 53 + i * 13 + i * i) % 300));
      }
      chunks.push_back({slots_[c], 0, kLengths[c]});
      decode_.push_back({slots_[c], kLengths[c], 1});
    }
    (void)step(chunks, ids, std::vector<ChunkSampling>(kChunks), {});
  }

  using Out = StepOut;

  Out step(const std::vector<Chunk>& chunks, const std::vector<std::int32_t>& ids,
           const std::vector<ChunkSampling>& sampling,
           const std::vector<LogitAdjustment>& adjustments, bool draw = true) {
    StepBatch batch{ids, chunks, kv_->arena->view(), sampling};
    batch.adjustments = adjustments;
    batch.token_masks = masks_;
    Out out;
    out.logits.assign(chunks.size() * vocab(), NAN);
    out.argmax.assign(chunks.size(), -1);
    out.sampled.assign(chunks.size(), -1);
    const Status done = model_->forward(
        batch, {out.logits.data(), out.argmax.data(), draw ? out.sampled.data() : nullptr});
    EXPECT_TRUE(done.ok()) << done.to_string();
    return out;
  }

  Out decode(const std::vector<ChunkSampling>& sampling,
             const std::vector<LogitAdjustment>& adjustments, bool draw = true) {
    return step(decode_, kNext, sampling, adjustments, draw);
  }

  std::uint32_t vocab() const { return tiny_->config().vocab_size; }
  std::span<const float> row(const Out& out, std::size_t c) const {
    return {&out.logits[c * vocab()], vocab()};
  }

  // The raw step's logits, transformed on the host as each chunk asks.
  std::vector<float> expected(const Out& raw, const std::vector<ChunkSampling>& sampling,
                              const std::vector<LogitAdjustment>& adjustments) const {
    std::vector<float> want = raw.logits;
    for (std::size_t c = 0; c < sampling.size(); ++c) {
      const ChunkSampling& s = sampling[c];
      adjust_logits(
          std::span<float>(&want[c * vocab()], vocab()), s.params,
          std::span<const LogitAdjustment>(adjustments).subspan(s.adjust_begin, s.adjust_count));
    }
    return want;
  }

  // Same arithmetic on the same floats: within 1e-6 relative (-inf and NaN where expected).
  void expect_logits(const Out& got, const std::vector<float>& want, const std::string& where) {
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const float g = got.logits[i], w = want[i];
      const bool ok = g == w || (std::isnan(g) && std::isnan(w)) ||
                      (std::isfinite(w) && std::fabs(g - w) <= 1e-6 * std::fabs(w));
      if (ok) continue;
      if (wrong++ < 5) {
        ADD_FAILURE() << where << ": chunk " << i / vocab() << ", id " << i % vocab() << " is " << g
                      << ", want " << w;
      }
    }
    EXPECT_EQ(wrong, 0u) << where;
  }

  static constexpr std::uint32_t kLengths[kChunks] = {7, 15, 30};
  const std::vector<std::int32_t> kNext = {17, 42, 299};
  std::unique_ptr<Driver> driver_;
  std::unique_ptr<testing::TinyModel> tiny_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<testing::KvArena> kv_;
  std::vector<SlotId> slots_;
  std::vector<Chunk> decode_;
  std::vector<std::uint32_t> masks_;  // the next steps' token masks
};

// Chunk 0: greedy, +100 on the token nearest 50 below its greedy one (this model's logits
// spread over more than 100, so its least likely token would stay behind). Chunk 1: greedy, its
// greedy token banned, with penalties on a few seen tokens. Chunk 2: sampled at temperature 0.8,
// penalties on every even id, the entries placed before chunk 1's.
struct Transforms {
  std::vector<ChunkSampling> sampling;
  std::vector<LogitAdjustment> adjustments;
  std::int32_t boosted = -1;
  std::int32_t banned = -1;
};

Transforms transforms_for(std::span<const float> row0, std::span<const float> row1,
                          std::uint32_t vocab) {
  Transforms t;
  t.sampling.resize(kChunks);
  const std::int32_t first = greedy(row0);
  const float aim = row0[static_cast<std::size_t>(first)] - 50.0f;
  for (std::size_t id = 0; id < row0.size(); ++id) {
    if (static_cast<std::int32_t>(id) == first) continue;
    if (t.boosted < 0 ||
        std::fabs(row0[id] - aim) < std::fabs(row0[static_cast<std::size_t>(t.boosted)] - aim)) {
      t.boosted = static_cast<std::int32_t>(id);
    }
  }
  t.banned = greedy(row1);
  t.adjustments.push_back({.id = t.boosted, .count = 0, .in_prompt = 0, .bias = 100.0f});
  t.sampling[0].adjust_begin = 0;
  t.sampling[0].adjust_count = 1;
  // Chunk 2's entries next, then chunk 1's.
  t.sampling[2].params.temperature = 0.8f;
  t.sampling[2].params.seed = 7;
  t.sampling[2].counter = 3;
  t.sampling[2].params.presence_penalty = 0.4f;
  t.sampling[2].params.frequency_penalty = 0.25f;
  t.sampling[2].params.repetition_penalty = 1.2f;
  t.sampling[2].adjust_begin = static_cast<std::uint32_t>(t.adjustments.size());
  for (std::uint32_t id = 0; id < vocab; id += 2) {
    t.adjustments.push_back({.id = static_cast<std::int32_t>(id),
                             .count = id % 3,
                             .in_prompt = (id / 2) % 2,
                             .bias = id % 10 == 0 ? -1.5f : 0.0f});
  }
  t.sampling[2].adjust_count =
      static_cast<std::uint32_t>(t.adjustments.size()) - t.sampling[2].adjust_begin;
  t.sampling[1].params.presence_penalty = 0.6f;
  t.sampling[1].params.frequency_penalty = 0.1f;
  t.sampling[1].params.repetition_penalty = 1.5f;
  t.sampling[1].adjust_begin = static_cast<std::uint32_t>(t.adjustments.size());
  std::vector<LogitAdjustment> chunk1 = {
      {.id = t.banned, .count = 0, .in_prompt = 0, .bias = -INFINITY}};
  for (const std::int32_t id : {3, 42, 120, 250}) {
    if (id != t.banned) chunk1.push_back({.id = id, .count = 2, .in_prompt = 1, .bias = 0.0f});
  }
  std::sort(chunk1.begin(), chunk1.end(),
            [](const LogitAdjustment& a, const LogitAdjustment& b) { return a.id < b.id; });
  t.adjustments.insert(t.adjustments.end(), chunk1.begin(), chunk1.end());
  t.sampling[1].adjust_count = static_cast<std::uint32_t>(chunk1.size());
  return t;
}

// The greedy picks and the draws of a transformed step read its transformed rows.
void expect_transformed(const StepOut& got, const Transforms& t, std::uint32_t vocab,
                        const std::string& where) {
  auto row = [vocab](const StepOut& out, std::size_t c) {
    return std::span<const float>(&out.logits[c * vocab], vocab);
  };
  EXPECT_EQ(got.sampled[0], t.boosted) << where << ": +100 did not win";
  EXPECT_EQ(got.argmax[0], t.boosted) << where;
  EXPECT_NE(got.sampled[1], t.banned) << where << ": a banned token was drawn";
  EXPECT_EQ(row(got, 1)[static_cast<std::size_t>(t.banned)], -INFINITY) << where;
  for (std::size_t c = 0; c < kChunks; ++c) {
    EXPECT_EQ(got.argmax[c], greedy(row(got, c))) << where << ", chunk " << c;
    EXPECT_EQ(got.sampled[c],
              sample_token(row(got, c), t.sampling[c].params, t.sampling[c].counter))
        << where << ", chunk " << c;
  }
}

TEST_F(ModelCudaLogitAdjustTest, TransformsActBeforeTheDrawEagerAndInAGraph) {
  const std::vector<ChunkSampling> plain(kChunks);
  const Out raw = decode(plain, {});
  const Transforms t = transforms_for(row(raw, 0), row(raw, 1), vocab());
  const float highest = *std::max_element(row(raw, 0).begin(), row(raw, 0).end());
  ASSERT_GT(row(raw, 0)[static_cast<std::size_t>(t.boosted)] + 100.0f, highest)
      << "the fixture's logits spread over more than the +100 bias";
  ASSERT_NE(raw.sampled[0], t.boosted);
  ASSERT_EQ(raw.sampled[1], t.banned);
  // The raw twin of the transformed step: the same sampling without entries.
  std::vector<ChunkSampling> untransformed = t.sampling;
  for (ChunkSampling& s : untransformed) s.adjust_begin = s.adjust_count = 0;
  const Out raw_eager = decode(untransformed, {});
  const Out eager = decode(t.sampling, t.adjustments);
  EXPECT_EQ(model_->graph_stats().replays, 0u);
  expect_logits(eager, expected(raw_eager, t.sampling, t.adjustments), "eager");
  expect_transformed(eager, t, vocab(), "eager");
  // The argmax alone (no draw): the transforms still apply, as on the CPU.
  const Out argmax_only = decode(t.sampling, t.adjustments, false);
  expect_logits(argmax_only, expected(raw_eager, t.sampling, t.adjustments), "argmax only");
  EXPECT_EQ(argmax_only.argmax[0], t.boosted);
  EXPECT_NE(argmax_only.argmax[1], t.banned);

  // A graph of 4 rows: the step's 3 and a padding row.
  DecodeGraphOptions options;
  options.batch_sizes = {1, 4};
  options.kv = kv_->arena->view();
  options.pad_slot = slots_[kSlots - 1];
  options.max_length = 128;
  const Status captured = model_->capture_decode_graphs(options);
  ASSERT_TRUE(captured.ok()) << captured.to_string();
  const Out raw_graph = decode(untransformed, {});
  const Out graph = decode(t.sampling, t.adjustments);
  // And without transforms again: nothing of the last replay's rows or entries stays.
  const Out raw_again = decode(untransformed, {});
  EXPECT_EQ(model_->graph_stats().replays, 3u);
  expect_logits(graph, expected(raw_graph, t.sampling, t.adjustments), "graph");
  expect_transformed(graph, t, vocab(), "graph");
  expect_logits(raw_again, raw_graph.logits, "graph without transforms after one with");
  EXPECT_EQ(raw_again.sampled, raw_graph.sampled);
  model_->release_decode_graphs();
}

// Rows of 300-token masks: row 0 allows every 7th id, row 1 ids 100 to 139.
std::vector<std::uint32_t> two_masks(std::uint32_t vocab) {
  const std::size_t words = token_mask_words(vocab);
  std::vector<std::uint32_t> masks(2 * words, 0);
  for (std::uint32_t t = 0; t < vocab; ++t) {
    if (t % 7 == 0) masks[t >> 5] |= 1u << (t & 31);
    if (t >= 100 && t < 140) masks[words + (t >> 5)] |= 1u << (t & 31);
  }
  return masks;
}

void expect_masked(const StepOut& got, const StepOut& raw, const std::vector<std::uint32_t>& masks,
                   std::uint32_t vocab, const std::string& where) {
  const std::size_t words = token_mask_words(vocab);
  // Chunk 0 takes mask row 1, chunk 2 row 0, chunk 1 none.
  const std::int32_t rows[kChunks] = {1, -1, 0};
  for (std::size_t c = 0; c < kChunks; ++c) {
    for (std::uint32_t t = 0; t < vocab; ++t) {
      const bool on = rows[c] < 0 || ((masks[rows[c] * words + (t >> 5)] >> (t & 31)) & 1) != 0;
      const float want = on ? raw.logits[c * vocab + t] : -INFINITY;
      ASSERT_EQ(got.logits[c * vocab + t], want) << where << ", chunk " << c << ", id " << t;
    }
    const std::int32_t drawn = got.sampled[c];
    if (rows[c] >= 0) {
      EXPECT_TRUE((masks[rows[c] * words + (drawn >> 5)] >> (drawn & 31)) & 1)
          << where << ": chunk " << c << " drew " << drawn << " outside its mask";
      EXPECT_EQ(got.argmax[c], greedy(std::span<const float>(&got.logits[c * vocab], vocab)));
    } else {
      EXPECT_EQ(drawn, raw.sampled[c]) << where << ": the unmasked chunk changed";
    }
  }
}

TEST_F(ModelCudaLogitAdjustTest, TokenMasksActBeforeTheDrawEagerAndInAGraph) {
  std::vector<ChunkSampling> sampling(kChunks);
  for (std::size_t c = 0; c < kChunks; ++c) {
    sampling[c].params.temperature = 1.0f;
    sampling[c].params.seed = 11 + c;
    sampling[c].counter = 5;
  }
  const Out raw = decode(sampling, {});
  std::vector<ChunkSampling> masked_sampling = sampling;
  masked_sampling[0].mask_row = 1;
  masked_sampling[2].mask_row = 0;
  const std::vector<std::uint32_t> masks = two_masks(vocab());
  masks_ = masks;
  const Out eager = decode(masked_sampling, {});
  EXPECT_EQ(model_->graph_stats().replays, 0u);
  expect_masked(eager, raw, masks, vocab(), "eager");

  DecodeGraphOptions options;
  options.batch_sizes = {1, 4};
  options.kv = kv_->arena->view();
  options.pad_slot = slots_[kSlots - 1];
  options.max_length = 128;
  const Status captured = model_->capture_decode_graphs(options);
  ASSERT_TRUE(captured.ok()) << captured.to_string();
  masks_.clear();
  const Out raw_graph = decode(sampling, {});
  masks_ = masks;
  const Out graph = decode(masked_sampling, {});
  masks_.clear();
  const Out raw_again = decode(sampling, {});
  EXPECT_EQ(model_->graph_stats().replays, 3u);
  expect_masked(graph, raw_graph, masks, vocab(), "graph");
  expect_logits(raw_again, raw_graph.logits, "graph without masks after one with");
  EXPECT_EQ(raw_again.sampled, raw_graph.sampled);
  model_->release_decode_graphs();
}

#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace
}  // namespace kvvm::model::logit_adjust_cuda_test
