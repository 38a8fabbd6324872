// Logit transforms before a draw (penalties, logit_bias, bans), on the CPU: adjusted_logit
// against the formula in double; the CPU model's step with adjustments equals the same step
// without them transformed on the host (the draw, the logits returned, the log-probabilities);
// the engine builds each draw's entries from the request's tokens (counts, the prompt, biases,
// the end tokens banned before min_tokens) and its answers follow them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/logit_transforms.h"
#include "kvvm/engine/engine.h"
#include "kvvm/model/model.h"
#include "kvvm/model/sampling.h"
#include "support/engine_harness.h"
#include "support/model_rig.h"

namespace kvvm::model::logit_adjust_test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

double reference(double l, double presence, double frequency, double repetition,
                 const LogitAdjustment& a) {
  l += a.bias;
  if (repetition != 1 && (a.count > 0 || a.in_prompt != 0))
    l = l > 0 ? l / repetition : l * repetition;
  return l - frequency * a.count - (a.count > 0 ? presence : 0.0);
}

TEST(LogitAdjust, FollowsTheFormulaAndLeavesOtherTokensAlone) {
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.repetition_penalty = 1.3f;
  std::vector<float> logits = {2.0f, -2.0f, 1.0f, 0.5f, -1.0f, 3.0f};
  const std::vector<float> raw = logits;
  const std::vector<LogitAdjustment> entries = {
      {.id = 0, .count = 2},                 // output twice: repetition then both penalties
      {.id = 1, .in_prompt = 1},             // prompt only, negative: scaled up
      {.id = 3, .bias = 4.0f},               // bias only: not seen, no penalty
      {.id = 4, .count = 1, .bias = -kInf},  // a ban stays a ban
      {.id = 5, .count = 0, .in_prompt = 1, .bias = -1.0f}};
  adjust_logits(logits, p, entries);
  EXPECT_EQ(logits[2], raw[2]);
  for (const LogitAdjustment& a : entries) {
    const double want = reference(raw[a.id], 0.5, 0.25, 1.3, a);
    if (std::isinf(want)) {
      EXPECT_EQ(logits[a.id], -kInf) << "id " << a.id;
    } else {
      EXPECT_NEAR(logits[a.id], want, 1e-6) << "id " << a.id;
    }
  }
  // Neutral parameters: only the biases act.
  std::vector<float> neutral = raw;
  adjust_logits(neutral, SamplingParams{}, entries);
  EXPECT_EQ(neutral[0], raw[0]);
  EXPECT_EQ(neutral[3], raw[3] + 4.0f);
}

TEST(LogitAdjust, BadPenaltiesAreRefusedByName) {
  SamplingParams p;
  p.repetition_penalty = 0;
  EXPECT_TRUE(check_sampling(p).message().starts_with("repetition_penalty"))
      << check_sampling(p).message();
  p = SamplingParams{};
  p.presence_penalty = NAN;
  EXPECT_TRUE(check_sampling(p).message().starts_with("presence_penalty"));
  p = SamplingParams{};
  p.frequency_penalty = kInf;
  EXPECT_TRUE(check_sampling(p).message().starts_with("frequency_penalty"));
}

// One step of two chunks of the rig's model; the second chunk's draw is transformed.
struct Stepped {
  std::vector<float> logits;
  std::vector<std::int32_t> sampled;
  std::vector<RowLogprobs> logprobs;
  Status status;
};

Stepped step(testing::ModelRig& rig, std::vector<testing::Sequence>& seqs,
             const std::vector<ChunkSampling>& sampling,
             const std::vector<LogitAdjustment>& adjustments) {
  std::vector<Chunk> chunks;
  std::vector<std::int32_t> ids;
  for (testing::Sequence& s : seqs) {
    chunks.push_back({s.slot, 0, static_cast<std::uint32_t>(s.tokens.size())});
    ids.insert(ids.end(), s.tokens.begin(), s.tokens.end());
  }
  StepBatch batch{ids, chunks, rig.arena().view(), sampling};
  batch.adjustments = adjustments;
  const std::uint32_t vocab = rig.model().config().vocab_size;
  Stepped r;
  r.logits.assign(chunks.size() * vocab, NAN);
  r.sampled.assign(chunks.size(), -1);
  r.logprobs.resize(logprob_row_count(batch));
  r.status =
      rig.model().forward(batch, {r.logits.data(), nullptr, r.sampled.data(), r.logprobs.data()});
  return r;
}

TEST(ModelCpuLogitAdjust, TheStepDrawsFromTheTransformedLogits) {
  testing::ModelRig rig(testing::tiny_config(), TensorDType::kF32, Layout::kTokenMajor);
  ASSERT_TRUE(rig.ready());
  std::vector<testing::Sequence> seqs = {rig.admit(9, 1), rig.admit(11, 2)};
  const std::uint32_t vocab = rig.model().config().vocab_size;
  std::vector<ChunkSampling> sampling(2);
  for (ChunkSampling& s : sampling) s.logprob_rows = LogprobRows::kLast;
  const Stepped plain = step(rig, seqs, sampling, {});
  ASSERT_TRUE(plain.status.ok()) << plain.status.to_string();
  // Ban the second chunk's greedy token, lift a far one by +100, penalise a few seen ones.
  const std::int32_t greedy = plain.sampled[1];
  const std::int32_t lifted =
      (greedy + static_cast<std::int32_t>(vocab) / 2) % static_cast<std::int32_t>(vocab);
  std::vector<LogitAdjustment> entries = {{.id = greedy, .bias = -kInf},
                                          {.id = lifted, .bias = 100.0f}};
  std::sort(entries.begin(), entries.end(), [](auto& a, auto& b) { return a.id < b.id; });
  sampling[1].params.presence_penalty = 0.7f;
  sampling[1].params.repetition_penalty = 1.2f;
  sampling[1].adjust_begin = 0;
  sampling[1].adjust_count = static_cast<std::uint32_t>(entries.size());
  for (auto& s : seqs) s.written = 0;
  const Stepped biased = step(rig, seqs, sampling, entries);
  ASSERT_TRUE(biased.status.ok()) << biased.status.to_string();
  EXPECT_EQ(biased.sampled[0], plain.sampled[0]);  // the other chunk untouched
  EXPECT_EQ(biased.sampled[1], lifted);
  std::vector<float> want(plain.logits.begin() + vocab, plain.logits.end());
  adjust_logits(want, sampling[1].params, entries);
  for (std::uint32_t v = 0; v < vocab; ++v) {
    ASSERT_EQ(biased.logits[vocab + v], want[v]) << "id " << v;
  }
  // Log-probabilities read the transformed row: the ban scores -inf, the lift nearly 0.
  EXPECT_EQ(biased.logprobs[1].target, lifted);
  EXPECT_NEAR(biased.logprobs[1].logprob, 0.0f, 1e-3);
  // A bad entry is refused, naming it.
  std::vector<LogitAdjustment> unsorted = {entries[1], entries[0]};
  const Stepped refused = step(rig, seqs, sampling, unsorted);
  EXPECT_EQ(refused.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status.message().find("adjustments[1].id"), std::string::npos)
      << refused.status.message();
}

engine::RequestState request_with(std::vector<std::int32_t> prompt,
                                  std::vector<std::int32_t> output) {
  engine::RequestState r;
  r.prompt_size = static_cast<std::uint32_t>(prompt.size());
  r.tokens = prompt;
  r.tokens.insert(r.tokens.end(), output.begin(), output.end());
  r.generated = static_cast<std::uint32_t>(output.size());
  r.request.prompt = std::move(prompt);
  return r;
}

TEST(EngineLogitTransforms, EntriesCountTheOutputMarkThePromptAndBanEndsBeforeMinTokens) {
  engine::RequestState r = request_with({5, 9, 5}, {9, 7, 9, 9});
  std::vector<LogitAdjustment> out, scratch;
  EXPECT_FALSE(engine::has_logit_transforms(r));
  r.request.sampling.frequency_penalty = 0.1f;
  r.request.sampling.repetition_penalty = 1.1f;
  r.request.logit_bias = {{7, 2.0f}, {11, -3.0f}};
  r.request.min_tokens = 6;
  r.ends = {2, 11};
  ASSERT_TRUE(engine::has_logit_transforms(r));
  engine::append_logit_transforms(r, out, scratch);
  EXPECT_LE(out.size(), engine::logit_transform_bound(r, 100));
  const auto find = [&](std::int32_t id) {
    for (const auto& a : out) {
      if (a.id == id) return a;
    }
    return LogitAdjustment{.id = -1};
  };
  for (std::size_t i = 1; i < out.size(); ++i) EXPECT_LT(out[i - 1].id, out[i].id);
  EXPECT_EQ(find(5).count, 0u);
  EXPECT_EQ(find(5).in_prompt, 1u);
  EXPECT_EQ(find(9).count, 3u);
  EXPECT_EQ(find(9).in_prompt, 1u);
  EXPECT_EQ(find(7).count, 1u);
  EXPECT_EQ(find(7).bias, 2.0f);
  EXPECT_EQ(find(2).bias, -kInf);   // an end token, before min_tokens
  EXPECT_EQ(find(11).bias, -kInf);  // banned and biased: still banned
  // At min_tokens the ends may be drawn again.
  r.generated = 6;
  out.clear();
  engine::append_logit_transforms(r, out, scratch);
  EXPECT_EQ(find(2).id, -1);
  EXPECT_EQ(find(11).bias, -3.0f);
}

TEST(EngineLogitTransforms, AnswersFollowBiasAndMinTokens) {
  auto& fixture = engine::testing::llama();
  auto kv = engine::testing::make_kv(fixture.config, 4);
  auto made = engine::Engine::create(*fixture.model, *kv, engine::testing::no_cache());
  ASSERT_TRUE(made.ok());
  engine::Engine& engine = **made;
  const std::vector<std::int32_t> prompt = engine::testing::rig_prompt(12, 21);
  const auto run = [&](engine::EngineRequest request) {
    engine::testing::Outcome o;
    auto id = engine.submit(std::move(request),
                            [&](const engine::RequestEvent& e) { engine::testing::record(o, e); });
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    EXPECT_TRUE(engine.run_until_idle().ok());
    return o;
  };
  engine::EngineRequest plain = engine::testing::greedy_request(prompt, 6);
  const engine::testing::Outcome base = run(plain);
  ASSERT_EQ(base.tokens.size(), 6u);
  // A +100 bias on a token makes greedy decoding choose it every time.
  engine::EngineRequest lifted = plain;
  lifted.logit_bias = {{123, 100.0f}};
  EXPECT_EQ(run(lifted).tokens, std::vector<std::int32_t>(6, 123));
  // The greedy first token as a stop id ends at once; with min_tokens 3 it cannot before 3.
  engine::EngineRequest stopping = plain;
  stopping.stop_ids = {base.tokens[0]};
  EXPECT_EQ(run(stopping).tokens.size(), 0u);
  stopping.min_tokens = 3;
  const engine::testing::Outcome held = run(stopping);
  ASSERT_GE(held.tokens.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_NE(held.tokens[i], base.tokens[0]) << "token " << i;
  made->reset();
  engine::testing::expect_clean(*kv);
}

}  // namespace
}  // namespace kvvm::model::logit_adjust_test
