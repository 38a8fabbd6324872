// generate() against a fake model that records what it was asked to compute: prompt
// chunking, decode positions, stop conditions, and the slot given back on every path.
#include "kvvm/engine/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "support/fake_model_config.h"

namespace kvvm::engine {
namespace {

constexpr std::uint32_t kVocab = testing::kFakeVocab;
using testing::fake_model_config;

struct SeenChunk {
  model::Chunk chunk;
  std::vector<std::int32_t> ids;
  bool wanted_logits = false;
  bool wanted_sampled = false;
  std::uint64_t committed_tokens = 0;  // the slot's live length in the arena when it ran
};

// Its next token is the last token it saw plus one (mod the vocabulary), a one-hot row; or,
// with `flat`, every logit equal, so only the sampler decides.
class FakeModel : public model::Model {
 public:
  FakeModel(Arena& arena, model::ModelLimits limits)
      : Model(fake_model_config(), limits), arena_(arena) {}
  model::Backend backend() const override { return model::Backend::kCpu; }

  Status forward(const model::StepBatch& batch, const model::StepOutput& out) override {
    ++calls_;
    if (calls_ == fail_at_call_) return Status::Internal("fake forward failed on purpose");
    EXPECT_EQ(batch.chunks.size(), 1u);
    const model::Chunk& chunk = batch.chunks[0];
    EXPECT_EQ(batch.token_ids.size(), chunk.tokens);
    seen_.push_back(SeenChunk{chunk,
                              {batch.token_ids.begin(), batch.token_ids.end()},
                              out.logits != nullptr,
                              out.sampled != nullptr,
                              arena_.tokens(chunk.slot)});
    std::vector<float> row(kVocab);
    const std::int32_t next = (batch.token_ids.back() + 1) % static_cast<std::int32_t>(kVocab);
    for (std::uint32_t i = 0; i < kVocab; ++i) {
      row[i] = flat_ ? 1.0f : (static_cast<std::int32_t>(i) == next ? 5.0f : 0.0f);
    }
    if (out.logits != nullptr) std::copy(row.begin(), row.end(), out.logits);
    // The engine draws in the step, as the real models do: the request's parameters and its
    // output index as the counter.
    if (out.sampled != nullptr) {
      EXPECT_EQ(batch.sampling.size(), 1u);
      out.sampled[0] = sample_token(row, batch.sampling[0].params, batch.sampling[0].counter);
    }
    return Status::Ok();
  }

  std::vector<SeenChunk> seen_;
  int calls_ = 0;
  int fail_at_call_ = 0;  // 1-based; 0: never
  bool flat_ = false;

 private:
  Arena& arena_;
};

class GenerateTest : public ::testing::Test {
 protected:
  void SetUp() override { make_space(64); }
  void make_space(std::uint64_t max_context) {
    model_.reset();
    space_.reset();
    KvSpaceOptions options;
    options.max_context = max_context;
    options.max_slots = 2;
    auto space = KvSpace::create(fake_model_config(), options);
    ASSERT_TRUE(space.ok()) << space.status().to_string();
    space_ = std::move(space).value();
    model_ = std::make_unique<FakeModel>(space_->arena(), model::ModelLimits{4, 8});
  }
  void TearDown() override { expect_released(); }
  void expect_released() {
    if (!space_) return;
    const ArenaStats stats = space_->arena().stats();
    EXPECT_EQ(stats.active_slots, 0u);
  }

  static std::vector<std::int32_t> iota(std::int32_t n) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
    for (std::int32_t i = 0; i < n; ++i) ids[static_cast<std::size_t>(i)] = i;
    return ids;
  }

  std::unique_ptr<KvSpace> space_;
  std::unique_ptr<FakeModel> model_;
};

TEST_F(GenerateTest, PrefillsInChunksThenDecodesAtTheNextPositions) {
  GenerateRequest request;
  request.prompt = iota(10);
  request.prefill_chunk = 3;
  request.max_tokens = 4;
  auto result = generate(*model_, *space_, request);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ(result->tokens, (std::vector<std::int32_t>{10, 11, 12, 13}));
  EXPECT_EQ(result->finish, FinishReason::kLength);

  const std::vector<std::uint32_t> starts = {0, 3, 6, 9, 10, 11, 12};
  const std::vector<std::uint32_t> counts = {3, 3, 3, 1, 1, 1, 1};
  ASSERT_EQ(model_->seen_.size(), starts.size());
  for (std::size_t i = 0; i < starts.size(); ++i) {
    const SeenChunk& seen = model_->seen_[i];
    EXPECT_EQ(seen.chunk.start, starts[i]) << i;
    EXPECT_EQ(seen.chunk.tokens, counts[i]) << i;
    // The arena covered the chunk before it ran.
    EXPECT_GE(seen.committed_tokens, seen.chunk.start + seen.chunk.tokens) << i;
  }
  // Prompt chunks carry the prompt's ids; decode steps feed back the previous token.
  EXPECT_EQ(model_->seen_[1].ids, (std::vector<std::int32_t>{3, 4, 5}));
  EXPECT_EQ(model_->seen_[3].ids, (std::vector<std::int32_t>{9}));
  EXPECT_EQ(model_->seen_[4].ids, (std::vector<std::int32_t>{10}));
  EXPECT_EQ(model_->seen_[6].ids, (std::vector<std::int32_t>{12}));
  // The engine draws inside every step (a mid-prompt chunk's draw is dropped) and asks for
  // no logits unless the prompt's are kept.
  for (const SeenChunk& seen : model_->seen_) {
    EXPECT_TRUE(seen.wanted_sampled);
    EXPECT_FALSE(seen.wanted_logits);
  }
  EXPECT_EQ(result->timings.decode_steps, 3u);
  EXPECT_GE(result->timings.prefill_seconds, 0.0);
}

TEST_F(GenerateTest, ChunksDefaultToTheModelsStepLimit) {
  GenerateRequest request;
  request.prompt = iota(10);
  request.max_tokens = 1;
  ASSERT_TRUE(generate(*model_, *space_, request).ok());
  ASSERT_EQ(model_->seen_.size(), 3u);  // step limit 4: [0, 4), [4, 8), [8, 10)
  EXPECT_EQ(model_->seen_[1].chunk.start, 4u);
  EXPECT_EQ(model_->seen_[2].chunk.tokens, 2u);

  // A chunk asked larger than the step limit is cut to it.
  model_->seen_.clear();
  request.prefill_chunk = 100;
  ASSERT_TRUE(generate(*model_, *space_, request).ok());
  EXPECT_EQ(model_->seen_.size(), 3u);
}

TEST_F(GenerateTest, StopIdEndsGenerationAndIsNotEmitted) {
  GenerateRequest request;
  request.prompt = iota(3);
  request.max_tokens = 10;
  request.stop_ids = {1, 6};
  std::vector<std::int32_t> streamed;
  auto result = generate(*model_, *space_, request, [&](std::int32_t token) {
    streamed.push_back(token);
    return true;
  });
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ(result->tokens, (std::vector<std::int32_t>{3, 4, 5}));
  EXPECT_EQ(streamed, result->tokens);
  EXPECT_EQ(result->finish, FinishReason::kStop);
}

TEST_F(GenerateTest, CallbackReturningFalseStops) {
  GenerateRequest request;
  request.prompt = iota(3);
  request.max_tokens = 10;
  int calls = 0;
  auto result = generate(*model_, *space_, request, [&](std::int32_t) { return ++calls < 2; });
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->tokens, (std::vector<std::int32_t>{3, 4}));
  EXPECT_EQ(result->finish, FinishReason::kStop);
  EXPECT_EQ(model_->seen_.size(), 2u);  // the prompt, then one decode step for token 4
}

TEST_F(GenerateTest, ZeroMaxTokensPrefillsOnlyAndKeepsThePromptLogits) {
  GenerateRequest request;
  request.prompt = iota(5);
  request.max_tokens = 0;
  request.keep_prompt_logits = true;
  auto result = generate(*model_, *space_, request);
  ASSERT_TRUE(result.ok());
  EXPECT_TRUE(result->tokens.empty());
  ASSERT_EQ(result->prompt_logits.size(), kVocab);
  EXPECT_EQ(result->prompt_logits[5], 5.0f);
  EXPECT_EQ(result->prompt_logits[4], 0.0f);
  EXPECT_EQ(model_->seen_.size(), 2u);  // two prefill chunks, no decode
  EXPECT_FALSE(model_->seen_[0].wanted_logits);
  EXPECT_TRUE(model_->seen_[1].wanted_logits);  // only the step that ends the prompt
  EXPECT_EQ(result->timings.decode_steps, 0u);
  EXPECT_EQ(result->finish, FinishReason::kLength);
  // Zero tokens without the logits would answer nothing: refused, naming max_tokens.
  request.keep_prompt_logits = false;
  result = generate(*model_, *space_, request);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("max_tokens: 0"), std::string::npos)
      << result.status().message();
}

TEST_F(GenerateTest, PromptLogitsAreKeptBesideGeneratedTokens) {
  GenerateRequest request;
  request.prompt = iota(6);
  request.max_tokens = 3;
  request.keep_prompt_logits = true;
  auto result = generate(*model_, *space_, request);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ(result->tokens, (std::vector<std::int32_t>{6, 7, 8}));
  ASSERT_EQ(result->prompt_logits.size(), kVocab);
  EXPECT_EQ(result->prompt_logits[6], 5.0f);
  // The decode steps ask for none.
  ASSERT_EQ(model_->seen_.size(), 4u);
  EXPECT_TRUE(model_->seen_[1].wanted_logits);
  EXPECT_FALSE(model_->seen_[2].wanted_logits);
  EXPECT_FALSE(model_->seen_[3].wanted_logits);
}

TEST_F(GenerateTest, TheNthTokenIsDrawnWithCounterN) {
  model_->flat_ = true;
  GenerateRequest request;
  request.prompt = iota(2);
  request.max_tokens = 24;
  request.sampling.temperature = 1.0f;
  request.sampling.seed = 1234;
  auto result = generate(*model_, *space_, request);
  ASSERT_TRUE(result.ok());
  const std::vector<float> flat(kVocab, 1.0f);
  ASSERT_EQ(result->tokens.size(), 24u);
  for (std::size_t n = 0; n < result->tokens.size(); ++n) {
    EXPECT_EQ(result->tokens[n], sample_token(flat, request.sampling, n)) << n;
  }
}

TEST_F(GenerateTest, SlotIsReleasedWhenForwardFailsMidPrefill) {
  model_->fail_at_call_ = 2;
  GenerateRequest request;
  request.prompt = iota(10);
  request.prefill_chunk = 3;
  request.max_tokens = 4;
  auto result = generate(*model_, *space_, request);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInternal);
  // The engine names the failed step (its second prompt chunk of 3 tokens).
  EXPECT_NE(result.status().message().find("model step of 1 chunks, 3 tokens"), std::string::npos)
      << result.status().message();
  expect_released();
  // And the arena admits again: nothing is left held.
  model_->fail_at_call_ = 0;
  EXPECT_TRUE(generate(*model_, *space_, request).ok());
}

TEST_F(GenerateTest, SlotIsReleasedWhenForwardFailsMidDecode) {
  model_->fail_at_call_ = 3;
  GenerateRequest request;
  request.prompt = iota(4);
  request.max_tokens = 8;
  std::vector<std::int32_t> streamed;
  auto result = generate(*model_, *space_, request, [&](std::int32_t token) {
    streamed.push_back(token);
    return true;
  });
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("model step of 1 chunks, 1 tokens"), std::string::npos)
      << result.status().message();
  EXPECT_EQ(streamed, (std::vector<std::int32_t>{4, 5}));
  expect_released();
}

TEST_F(GenerateTest, PromptBeyondTheContextIsRefusedNamingBothNumbers) {
  make_space(16);
  GenerateRequest request;
  request.prompt = iota(12);
  request.max_tokens = 5;
  auto result = generate(*model_, *space_, request);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("12 tokens"), std::string::npos)
      << result.status().message();
  EXPECT_NE(result.status().message().find("16"), std::string::npos);
  EXPECT_TRUE(model_->seen_.empty());
  EXPECT_EQ(space_->arena().stats().admissions, 0u);
  // Exactly the context fits.
  request.max_tokens = 4;
  EXPECT_TRUE(generate(*model_, *space_, request).ok());
}

TEST_F(GenerateTest, EmptyPromptAndBadSamplingAreRefused) {
  GenerateRequest request;
  auto result = generate(*model_, *space_, request);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("prompt"), std::string::npos);
  request.prompt = iota(3);
  request.sampling.top_p = 0;
  result = generate(*model_, *space_, request);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("top_p"), std::string::npos);
  EXPECT_EQ(space_->arena().stats().admissions, 0u);
}

TEST(KvSpace, GeometryAndContextComeFromTheConfig) {
  KvSpaceOptions options;
  auto space = KvSpace::create(fake_model_config(128), options);
  ASSERT_TRUE(space.ok()) << space.status().to_string();
  const LayoutPlan& plan = (*space)->arena().plan();
  EXPECT_EQ(plan.max_context, 128u);
  EXPECT_EQ(plan.geometry.dtype, DType::kFp32);  // the CPU model's
  EXPECT_EQ(plan.geometry.head_dim, 4u);
  EXPECT_EQ((*space)->options().budget_bytes, std::uint64_t{1} << 30);
  EXPECT_EQ((*space)->governor().stats(0).limit, std::uint64_t{1} << 30);
}

TEST(KvSpace, BadOptionsAreRefusedByName) {
  KvSpaceOptions options;
  options.host_granule = 12345;  // not a multiple of the page size
  auto space = KvSpace::create(fake_model_config(), options);
  ASSERT_FALSE(space.ok());
  EXPECT_NE(space.status().message().find("host_granule"), std::string::npos)
      << space.status().message();
  auto no_context = KvSpace::create(fake_model_config(0), KvSpaceOptions{});
  ASSERT_FALSE(no_context.ok());
  EXPECT_NE(no_context.status().message().find("max_context"), std::string::npos);
}

}  // namespace
}  // namespace kvvm::engine
