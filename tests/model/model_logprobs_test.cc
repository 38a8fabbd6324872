// Log-probabilities computed inside a step (StepOutput::logprobs), on the CPU: row_logprobs
// against a float64 log-softmax (support/logprob_reference.h; random rows, temperatures, ties, NaN,
// a row shorter than the alternatives asked); the CPU model's kLast rows against row_logprobs of
// the step's own logits and sampled tokens; its kAll rows (a prompt in two chunks, the first ending
// with a last_target instead of a draw, packed beside other chunks, longer than max_chunks so the
// rows run in several blocks) against the last-row logits of the same tokens fed one by one on
// another slot; the refusals, naming the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvvm/model/model.h"
#include "kvvm/model/sampling.h"
#include "support/logprob_reference.h"
#include "support/model_rig.h"

namespace kvvm::model {
namespace {

using testing::ModelRig;
using testing::Sequence;

using testing::expect_logprobs;

// The tests below check to 1e-5 the rows written by row_logprobs (in double, stored as float).
void expect_row(const RowLogprobs& got, std::span<const float> logits, float temperature,
                std::int32_t target, std::uint32_t top, double tolerance,
                const std::string& where) {
  expect_logprobs(got, logits, temperature, target, top, tolerance, where);
}

RowLogprobs cpu_row(std::span<const float> logits, float temperature, std::int32_t target,
                    std::uint32_t top) {
  RowLogprobs row;
  row.target = target;
  row_logprobs(logits, temperature, target, top, &row.logprob, row.top_ids.data(),
               row.top_logprobs.data());
  while (row.top < top && row.top_ids[row.top] >= 0) ++row.top;
  return row;
}

TEST(RowLogprobs, MatchAFloat64LogSoftmax) {
  std::mt19937_64 random(17);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (const std::size_t vocab : {1u, 7u, 1000u, 152064u}) {
    std::vector<float> logits(vocab);
    for (float& l : logits) l = normal(random);
    // A full vocabulary's row costs a second under the sanitizers: the small rows take every
    // combination, the full one a temperature of each kind (none, below 1, above 1).
    const bool full = vocab > 1000;
    for (const float temperature : {0.0f, 0.3f, 1.0f, 1.7f}) {
      if (full && temperature == 1.0f) continue;
      for (const std::uint32_t top : {0u, 1u, 5u, kMaxTopLogprobs}) {
        if (full && top != 0u && top != kMaxTopLogprobs) continue;
        const auto target = static_cast<std::int32_t>(random() % vocab);
        const std::string where = "vocab " + std::to_string(vocab) + ", T " +
                                  std::to_string(temperature) + ", top " + std::to_string(top);
        expect_row(cpu_row(logits, temperature, target, top), logits, temperature, target, top,
                   1e-5, where);
      }
    }
  }
}

TEST(RowLogprobs, TiesListTheLowerIdFirst) {
  // 50 equal logits: the first ids, each -log(50).
  std::vector<float> flat(50, 2.5f);
  RowLogprobs row = cpu_row(flat, 0.0f, 49, 5);
  ASSERT_EQ(row.top, 5u);
  for (std::uint32_t j = 0; j < 5; ++j) {
    EXPECT_EQ(row.top_ids[j], static_cast<std::int32_t>(j));
    EXPECT_NEAR(row.top_logprobs[j], -std::log(50.0), 1e-6);
  }
  // Ties across the cut, in an order the ids do not follow: 3 > {9, 1, 5 equal} > rest.
  std::vector<float> mixed(12, -1.0f);
  mixed[3] = 4.0f;
  for (const std::size_t i : {9u, 1u, 5u}) mixed[i] = 2.0f;
  mixed[7] = 2.0f - 1e-6f;
  row = cpu_row(mixed, 0.5f, 7, 4);
  ASSERT_EQ(row.top, 4u);
  EXPECT_EQ(row.top_ids[0], 3);
  EXPECT_EQ(row.top_ids[1], 1);
  EXPECT_EQ(row.top_ids[2], 5);
  EXPECT_EQ(row.top_ids[3], 9);
  expect_row(row, mixed, 0.5f, 7, 4, 1e-5, "mixed ties");
}

TEST(RowLogprobs, NanIsLeftOutAndShortRowsListWhatTheyHave) {
  const std::vector<float> logits = {1.0f, NAN, 3.0f};
  const RowLogprobs row = cpu_row(logits, 0.0f, 1, 5);
  EXPECT_TRUE(std::isnan(row.logprob));  // the target's logit is NaN
  ASSERT_EQ(row.top, 2u);
  EXPECT_EQ(row.top_ids[0], 2);
  EXPECT_EQ(row.top_ids[1], 0);
  EXPECT_NEAR(row.top_logprobs[0], -std::log1p(std::exp(-2.0)), 1e-6);
  expect_row(cpu_row(logits, 0.0f, 0, 5), logits, 0.0f, 0, 5, 1e-5, "with NaN");
  EXPECT_TRUE(std::isnan(cpu_row(logits, 0.0f, 3, 1).logprob));  // outside the vocabulary
}

TEST(RowLogprobs, CountFollowsTheBatch) {
  const std::vector<std::int32_t> ids(12, 0);
  const std::vector<Chunk> chunks = {{0, 0, 5}, {1, 0, 1}, {2, 0, 6}};
  std::vector<ChunkSampling> sampling(3);
  EXPECT_EQ(logprob_row_count({ids, chunks, {}, sampling}), 0u);
  EXPECT_EQ(logprob_row_count({ids, chunks, {}, {}}), 0u);
  sampling[0].logprob_rows = LogprobRows::kAll;
  sampling[1].logprob_rows = LogprobRows::kLast;
  sampling[2].logprob_rows = LogprobRows::kLast;
  EXPECT_EQ(logprob_row_count({ids, chunks, {}, sampling}), 7u);
  sampling[2].logprob_rows = LogprobRows::kAll;
  EXPECT_EQ(logprob_row_count({ids, chunks, {}, sampling}), 12u);
}

// One step of the rig's model with sampling and log-probabilities; returns the logits.
struct StepResult {
  std::vector<float> logits;
  std::vector<std::int32_t> sampled;
  std::vector<RowLogprobs> logprobs;
};

StepResult run(ModelRig& rig, std::vector<Sequence*> parts,
               const std::vector<std::uint32_t>& counts,
               const std::vector<ChunkSampling>& sampling) {
  std::vector<Chunk> chunks;
  std::vector<std::int32_t> ids;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    Sequence& s = *parts[i];
    chunks.push_back({s.slot, s.written, counts[i]});
    ids.insert(ids.end(), s.tokens.begin() + s.written, s.tokens.begin() + s.written + counts[i]);
    s.written += counts[i];
  }
  const StepBatch batch{ids, chunks, rig.arena().view(), sampling};
  const std::uint32_t vocab = rig.model().config().vocab_size;
  StepResult r;
  r.logits.assign(chunks.size() * vocab, NAN);
  r.sampled.assign(chunks.size(), -1);
  RowLogprobs poison;
  poison.logprob = NAN;
  poison.top = 99;
  r.logprobs.assign(logprob_row_count(batch), poison);
  const Status status =
      rig.model().forward(batch, {r.logits.data(), nullptr, r.sampled.data(), r.logprobs.data()});
  EXPECT_TRUE(status.ok()) << status.to_string();
  return r;
}

ChunkSampling asking(LogprobRows rows, std::uint32_t top, float temperature, std::uint64_t seed) {
  ChunkSampling s;
  s.params.temperature = temperature;
  s.params.seed = seed;
  s.params.top_k = temperature > 0 ? 10 : 0;  // truncations leave log-probabilities alone
  s.counter = seed * 3;
  s.logprob_rows = rows;
  s.top_logprobs = top;
  return s;
}

TEST(ModelCpuLogprobs, LastRowsAreTheStepsLogitsScoringTheDrawnToken) {
  ModelRig rig(testing::tiny_config(), TensorDType::kF32, Layout::kTokenMajor);
  ASSERT_TRUE(rig.ready());
  Sequence a = rig.admit(40, 1), b = rig.admit(40, 2), c = rig.admit(40, 3);
  const std::vector<ChunkSampling> sampling = {asking(LogprobRows::kLast, 5, 0.0f, 1),
                                               asking(LogprobRows::kNone, 5, 1.0f, 2),
                                               asking(LogprobRows::kLast, 20, 0.8f, 3)};
  const std::uint32_t vocab = rig.model().config().vocab_size;
  for (int step = 0; step < 3; ++step) {
    const std::vector<std::uint32_t> counts =
        step == 0 ? std::vector<std::uint32_t>{17, 9, 12} : std::vector<std::uint32_t>{1, 1, 1};
    const StepResult r = run(rig, {&a, &b, &c}, counts, sampling);
    ASSERT_EQ(r.logprobs.size(), 2u);
    const std::size_t chunk_of[] = {0, 2};
    for (std::size_t k = 0; k < 2; ++k) {
      const std::size_t ch = chunk_of[k];
      const std::span<const float> logits(&r.logits[ch * vocab], vocab);
      const float t = sampling[ch].params.temperature;
      const std::string where = "step " + std::to_string(step) + ", chunk " + std::to_string(ch);
      EXPECT_EQ(r.logprobs[k].target, r.sampled[ch]) << where;
      expect_row(r.logprobs[k], logits, t, r.sampled[ch], sampling[ch].top_logprobs, 1e-5, where);
    }
  }
}

TEST(ModelCpuLogprobs, AllRowsEqualThePromptFedTokenByToken) {
  ModelRig rig(testing::tiny_config(), TensorDType::kF32, Layout::kHeadMajor);
  ASSERT_TRUE(rig.ready());
  constexpr std::uint32_t kPrompt = 60;  // 7 blocks of the rig's max_chunks = 8 rows
  Sequence prompt = rig.admit(kPrompt, 4), other = rig.admit(30, 5);
  Sequence prefix = rig.admit(kPrompt, 4);  // the same tokens (same seed), fed one by one
  ASSERT_EQ(prompt.tokens, prefix.tokens);
  const std::uint32_t vocab = rig.model().config().vocab_size;
  for (const float temperature : {0.0f, 0.7f}) {
    SCOPED_TRACE("temperature " + std::to_string(temperature));
    prompt.written = other.written = prefix.written = 0;
    const ChunkSampling all = asking(LogprobRows::kAll, 3, temperature, 6);
    // The prompt in two chunks, the first packed after another sequence's kAll chunk (its last
    // row scoring the next prompt token, not a draw) and the second beside a decode token
    // that asks for its last row only.
    ChunkSampling cut = all;
    cut.last_target = prompt.tokens[41];
    const StepResult first =
        run(rig, {&other, &prompt}, {20, 41}, {asking(LogprobRows::kAll, 2, 1.0f, 7), cut});
    const StepResult second = run(rig, {&prompt, &other}, {kPrompt - 41, 1},
                                  {all, asking(LogprobRows::kLast, 4, 0.0f, 8)});
    ASSERT_EQ(first.logprobs.size(), 20u + 41u);
    ASSERT_EQ(second.logprobs.size(), kPrompt - 41 + 1);
    std::vector<RowLogprobs> rows(first.logprobs.begin() + 20, first.logprobs.end());
    rows.insert(rows.end(), second.logprobs.begin(), second.logprobs.end() - 1);

    for (std::uint32_t j = 0; j < kPrompt; ++j) {
      const StepResult alone = run(rig, {&prefix}, {1}, {asking(LogprobRows::kNone, 0, 0, 0)});
      const std::span<const float> logits(alone.logits.data(), vocab);
      // The prompt's last row scores the token drawn after it.
      const std::int32_t target = j + 1 == kPrompt ? second.sampled[0] : prompt.tokens[j + 1];
      expect_row(rows[j], logits, temperature, target, 3, 1e-4, "prompt row " + std::to_string(j));
    }
    // The other sequence's rows: its kAll chunk of 20, then its decode's last row.
    EXPECT_EQ(first.logprobs[0].target, other.tokens[1]);
    EXPECT_EQ(first.logprobs[19].target, first.sampled[0]);
    EXPECT_EQ(first.logprobs[19].top, 2u);
    EXPECT_EQ(second.logprobs.back().target, second.sampled[1]);
    expect_row(second.logprobs.back(), std::span<const float>(&second.logits[vocab], vocab), 0.0f,
               second.sampled[1], 4, 1e-5, "decode row");
  }
}

TEST(ModelCpuLogprobs, RefusalsNameTheFieldAndWriteNothing) {
  ModelRig rig(testing::tiny_config(), TensorDType::kF32, Layout::kTokenMajor);
  ASSERT_TRUE(rig.ready());
  Sequence s = rig.admit(8, 9);
  const std::vector<Chunk> chunks = {{s.slot, 0, 8}};
  const std::span<const std::int32_t> ids(s.tokens.data(), 8);
  const std::uint32_t vocab = rig.model().config().vocab_size;
  std::vector<float> logits(vocab, NAN);
  std::int32_t sampled = -1;
  std::vector<RowLogprobs> rows(8);
  auto last_target = [](std::int32_t target) {
    ChunkSampling cut = asking(LogprobRows::kLast, 2, 0.0f, 1);
    cut.last_target = target;
    return cut;
  };
  struct Refusal {
    ChunkSampling sampling;
    bool sampled, logprobs;
    const char* field;
  };
  const Refusal cases[] = {
      {asking(LogprobRows::kLast, kMaxTopLogprobs + 1, 0.0f, 1), true, true, "top_logprobs"},
      {asking(LogprobRows::kNone, 99, 0.0f, 1), true, true, "top_logprobs"},
      {asking(LogprobRows::kAll, 2, 0.0f, 1), true, false, "out.logprobs"},
      {asking(LogprobRows::kLast, 2, 0.0f, 1), false, true, "out.sampled"},
      {last_target(static_cast<std::int32_t>(vocab)), true, true, "last_target"},
      {last_target(-2), true, true, "last_target"},
  };
  for (const Refusal& c : cases) {
    const std::vector<ChunkSampling> sampling = {c.sampling};
    const Status status =
        rig.model().forward({ids, chunks, rig.arena().view(), sampling},
                            {logits.data(), nullptr, c.sampled ? &sampled : nullptr,
                             c.logprobs ? rows.data() : nullptr});
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(status.message().find(c.field), std::string::npos) << status.to_string();
    EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](float l) { return std::isnan(l); }))
        << c.field;
    EXPECT_EQ(sampled, -1) << c.field;
    EXPECT_EQ(rows[0].target, -1) << c.field;
  }
  // Log-probabilities not asked: out.logprobs may be null, and a non-null one is not written.
  const std::vector<ChunkSampling> none = {asking(LogprobRows::kNone, 3, 0.0f, 1)};
  EXPECT_TRUE(rig.model()
                  .forward({ids, chunks, rig.arena().view(), none},
                           {logits.data(), nullptr, &sampled, rows.data()})
                  .ok());
  EXPECT_EQ(rows[0].target, -1);
}

}  // namespace
}  // namespace kvvm::model
