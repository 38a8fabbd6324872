// check_request_limits: one check of a request's limits behind every front end. The same
// mistake through generate(), Engine::submit and the server's parsing gives the same message,
// and the context is the smaller of the KV space's and the model's.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "kvvm/engine/engine.h"
#include "kvvm/engine/generate.h"
#include "kvvm/tokenizer/tokenizer.h"
#include "server/openai_request.h"
#include "support/fake_model_config.h"
#include "support/test_data.h"

namespace kvvm::engine::request_limits_test {
namespace {

constexpr std::uint32_t kVocab = testing::kFakeVocab;
using testing::fake_model_config;

// Every logit equal: the sampler alone decides. A refused request never reaches it.
class FlatModel : public model::Model {
 public:
  explicit FlatModel(std::uint32_t max_positions)
      : Model(fake_model_config(max_positions), model::ModelLimits{8, 4}) {}
  model::Backend backend() const override { return model::Backend::kCpu; }
  Status forward(const model::StepBatch& batch, const model::StepOutput& out) override {
    ++steps_;
    const std::vector<float> row(kVocab, 1.0f);
    for (std::size_t c = 0; c < batch.chunks.size(); ++c) {
      if (out.logits != nullptr) std::copy(row.begin(), row.end(), out.logits + c * kVocab);
      if (out.sampled != nullptr) {
        out.sampled[c] = sample_token(row, batch.sampling[c].params, batch.sampling[c].counter);
      }
    }
    return Status::Ok();
  }
  int steps_ = 0;
};

class RequestLimitsTest : public ::testing::Test {
 protected:
  // The space holds 24 tokens; the model's positions, 64 unless told.
  void make(std::uint32_t max_positions = 64, std::uint64_t max_context = 24) {
    KvSpaceOptions options;
    options.max_context = max_context;
    options.max_slots = 2;
    auto space = KvSpace::create(fake_model_config(max_positions), options);
    ASSERT_TRUE(space.ok()) << space.status().to_string();
    space_ = std::move(space).value();
    model_ = std::make_unique<FlatModel>(max_positions);
  }
  void SetUp() override { make(); }

  // The message generate() refuses `request` with ("" when it runs).
  std::string through_generate(const EngineRequest& r) {
    GenerateRequest request;
    request.prompt = r.prompt;
    request.max_tokens = r.max_tokens;
    request.sampling = r.sampling;
    request.stop_ids = r.stop_ids;
    request.keep_prompt_logits = r.keep_prompt_logits;
    auto result = generate(*model_, *space_, request);
    return result.ok() ? "" : result.status().message();
  }
  // The message Engine::submit refuses it with ("" when it is queued).
  std::string through_submit(const EngineRequest& r) {
    EngineOptions options;
    options.prefix_cache = false;
    auto engine = Engine::create(*model_, *space_, options);
    EXPECT_TRUE(engine.ok()) << engine.status().to_string();
    if (!engine.ok()) return "no engine";
    auto id = (*engine)->submit(r, {});
    if (!id.ok()) {
      EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument) << id.status().to_string();
      return id.status().message();
    }
    EXPECT_TRUE((*engine)->run_until_idle().ok());
    return "";
  }
  std::string directly(const EngineRequest& r) const {
    const Status status = check_request_limits(r, request_limits(*model_, *space_));
    return status.ok() ? "" : status.message();
  }

  static EngineRequest valid() {
    EngineRequest r;
    r.prompt = {1, 2, 3, 4};
    r.max_tokens = 4;
    r.use_model_eos = false;
    return r;
  }

  std::unique_ptr<KvSpace> space_;
  std::unique_ptr<FlatModel> model_;
};

struct Mistake {
  const char* what;
  EngineRequest request;
  const char* field;  // the message begins with it
};

std::vector<Mistake> mistakes() {
  std::vector<Mistake> all;
  const auto add = [&](const char* what, const char* field, auto&& edit) {
    EngineRequest r;
    r.prompt = {1, 2, 3, 4};
    r.max_tokens = 4;
    r.use_model_eos = false;
    edit(r);
    all.push_back(Mistake{what, std::move(r), field});
  };
  add("empty prompt", "prompt", [](EngineRequest& r) { r.prompt.clear(); });
  add("id past the vocabulary", "prompt[2]", [](EngineRequest& r) { r.prompt[2] = kVocab; });
  add("negative id", "prompt[0]", [](EngineRequest& r) { r.prompt[0] = -1; });
  add("zero max_tokens", "max_tokens", [](EngineRequest& r) { r.max_tokens = 0; });
  add("past the context", "max_tokens", [](EngineRequest& r) { r.max_tokens = 21; });
  add("prompt alone past it", "max_tokens", [](EngineRequest& r) {
    r.prompt.assign(30, 1);
    r.max_tokens = 1;
  });
  add("negative temperature", "temperature", [](EngineRequest& r) { r.sampling.temperature = -1; });
  add("top_p 0", "top_p", [](EngineRequest& r) { r.sampling.top_p = 0; });
  add("stop id past the vocabulary", "stop_ids[1]", [](EngineRequest& r) {
    r.stop_ids = {3, 1000};
  });
  return all;
}

TEST_F(RequestLimitsTest, TheSameMistakeGetsTheSameMessageFromGenerateAndSubmit) {
  for (const Mistake& m : mistakes()) {
    const std::string direct = directly(m.request);
    ASSERT_FALSE(direct.empty()) << m.what;
    EXPECT_EQ(direct.rfind(m.field, 0), 0u) << m.what << ": " << direct;
    EXPECT_EQ(through_generate(m.request), direct) << m.what;
    EXPECT_EQ(through_submit(m.request), direct) << m.what;
  }
  EXPECT_EQ(model_->steps_, 0);  // nothing refused ever ran
  EXPECT_EQ(space_->arena().stats().admissions, 0u);
}

TEST_F(RequestLimitsTest, ContextMessageNamesTheNumbersAndTheRoomLeft) {
  EngineRequest r = valid();
  r.max_tokens = 21;
  EXPECT_EQ(directly(r),
            "max_tokens: 21 + the prompt's 4 tokens = 25 tokens exceed the context of 24 tokens "
            "(at most 20 after this prompt)");
  // Exactly the context: accepted everywhere.
  r.max_tokens = 20;
  EXPECT_EQ(directly(r), "");
  EXPECT_EQ(through_generate(r), "");
  EXPECT_EQ(through_submit(r), "");
}

TEST_F(RequestLimitsTest, ZeroTokensIsAPrefillOnlyWhenThePromptLogitsAreKept) {
  EngineRequest r = valid();
  r.max_tokens = 0;
  EXPECT_NE(directly(r), "");
  r.keep_prompt_logits = true;
  EXPECT_EQ(directly(r), "");
  EXPECT_EQ(through_generate(r), "");
  EXPECT_EQ(through_submit(r), "");
  // A prompt that fills the context exactly still prefills.
  r.prompt.assign(24, 1);
  EXPECT_EQ(directly(r), "");
}

TEST_F(RequestLimitsTest, TheModelsPositionsBoundTheContextToo) {
  make(/*max_positions=*/10, /*max_context=*/24);
  EXPECT_EQ(request_limits(*model_, *space_).context, 10u);
  EngineRequest r = valid();
  r.max_tokens = 7;
  const std::string direct = directly(r);
  EXPECT_NE(direct.find("context of 10 tokens"), std::string::npos) << direct;
  EXPECT_EQ(through_generate(r), direct);
  EXPECT_EQ(through_submit(r), direct);
  // No positions in the config: the space's context alone.
  make(/*max_positions=*/0, /*max_context=*/24);
  EXPECT_EQ(request_limits(*model_, *space_).context, 24u);
}

// The server's parsing uses the same check for max_tokens against the context: the same
// message as Engine::submit gives.
TEST_F(RequestLimitsTest, TheServerSaysWhatTheEngineSays) {
  auto tok = tokenizer::Tokenizer::load(test::demo_model_dir() + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  server::ParseContext context;
  context.tokenizer = tok->get();
  context.model_name = "m";
  context.context_tokens = 24;
  context.vocab_size = kVocab;
  context.default_max_tokens = 4;
  EngineRequest r = valid();
  r.max_tokens = 21;
  const std::string engine_says = through_submit(r);
  ASSERT_EQ(engine_says.rfind("max_tokens: ", 0), 0u) << engine_says;
  const auto parsed =
      server::parse_request(server::Endpoint::kCompletions,
                            R"({"model": "m", "prompt": [1, 2, 3, 4], "max_tokens": 21})", context);
  const auto* error = std::get_if<server::ApiError>(&parsed);
  ASSERT_NE(error, nullptr);
  EXPECT_EQ(error->param, "max_tokens");
  EXPECT_EQ(error->message, engine_says);
}

}  // namespace
}  // namespace kvvm::engine::request_limits_test
