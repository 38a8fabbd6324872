// The embedded demo model (models/kvvm-adder): kvvm's greedy answers to the held-out addition
// prompts equal Hugging Face's, token for token, on the CPU path (against HF in float32) and
// on the CUDA path (against HF in bf16 on CUDA, skipped without a GPU). The accuracy of both
// is recorded as a test property. Under ThreadSanitizer (~20x on arithmetic) every fourth
// prompt: the threads and their hand-offs are the same for each.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvvm/engine/generate.h"
#include "kvvm/engine/kv_space.h"
#include "kvvm/model/config.h"
#include "kvvm/model/model.h"
#include "kvvm/model/safetensors.h"
#include "kvvm/model/weights.h"
#include "kvvm/tokenizer/tokenizer.h"
#include "kvvm/vmm/cuda_driver.h"
#include "support/sanitizer.h"
#include "support/test_data.h"

namespace kvvm {
namespace {

struct Answers {
  std::size_t prompts = 0;
  std::size_t equal_to_hf = 0;
  std::size_t correct = 0;
};

Answers run_demo(model::Backend backend, const char* reference_key) {
  const std::string dir = test::demo_model_dir();
  std::ifstream file(dir + "/eval.json");
  EXPECT_TRUE(file.good()) << dir << "/eval.json";
  const nlohmann::json eval = nlohmann::json::parse(file);

  Result<model::ModelConfig> config = model::load_model_config(dir);
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  Result<std::unique_ptr<model::WeightFiles>> files = model::WeightFiles::open_dir(dir);
  EXPECT_TRUE(files.ok()) << files.status().to_string();
  Result<model::ModelWeights> weights = model::bind_weights(*config, **files);
  EXPECT_TRUE(weights.ok()) << weights.status().to_string();
  Result<std::unique_ptr<model::Model>> model =
      backend == model::Backend::kCpu
          ? model::make_cpu_model(*config, *weights, model::CpuModelOptions{})
          : model::make_cuda_model(*config, *weights, model::CudaModelOptions{});
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  Result<std::unique_ptr<tokenizer::Tokenizer>> tok =
      tokenizer::Tokenizer::load(dir + "/tokenizer.json");
  EXPECT_TRUE(tok.ok()) << tok.status().to_string();
  engine::KvSpaceOptions kv_options;
  kv_options.backend = backend;
  kv_options.max_slots = 2;
  kv_options.max_context = 128;
  Result<std::unique_ptr<engine::KvSpace>> kv = engine::KvSpace::create(*config, kv_options);
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  Answers answers;
  if (!config.ok() || !files.ok() || !weights.ok() || !model.ok() || !tok.ok() || !kv.ok()) {
    return answers;
  }

  constexpr std::size_t kStride = test::kUnderThreadSanitizer ? 4 : 1;
  const nlohmann::json& entries = eval.at(reference_key);
  for (std::size_t i = 0; i < entries.size(); i += kStride) {
    const nlohmann::json& entry = entries[i];
    engine::GenerateRequest request;
    request.prompt = entry.at("prompt_ids").get<std::vector<std::int32_t>>();
    request.max_tokens = 8;
    request.stop_ids = config->eos_token_ids;
    Result<engine::GenerateResult> result = engine::generate(**model, **kv, request);
    EXPECT_TRUE(result.ok()) << result.status().to_string();
    if (!result.ok()) continue;
    const auto expected = entry.at("answer_ids").get<std::vector<std::int32_t>>();
    const std::string text = (*tok)->decode(result->tokens);
    const int a = entry.at("a").get<int>();
    const int b = entry.at("b").get<int>();
    ++answers.prompts;
    answers.equal_to_hf += result->tokens == expected;
    answers.correct += text == std::to_string(a + b);
    EXPECT_EQ(result->tokens, expected)
        << a << " + " << b << ": kvvm answered \"" << text << "\", HF \""
        << entry.at("answer").get<std::string>() << "\"";
  }
  const auto held_out = eval.at("held_out").get<std::size_t>();
  EXPECT_EQ(answers.prompts, (held_out + kStride - 1) / kStride);
  return answers;
}

TEST(DemoModel, CpuAnswersEqualHuggingFaceFloat32OnEveryHeldOutPrompt) {
  const Answers answers = run_demo(model::Backend::kCpu, "fp32_cpu");
  EXPECT_EQ(answers.equal_to_hf, answers.prompts);
  RecordProperty("accuracy_percent", std::to_string(100.0 * static_cast<double>(answers.correct) /
                                                    static_cast<double>(answers.prompts)));
  std::cout << "kvvm-adder on CPU: " << answers.correct << " / " << answers.prompts << " correct, "
            << answers.equal_to_hf << " equal to HF\n";
}

TEST(DemoModel, CudaAnswersEqualHuggingFaceBf16OnEveryHeldOutPrompt) {
  if (!cuda_available()) GTEST_SKIP() << "no usable CUDA device";
  const Answers answers = run_demo(model::Backend::kCuda, "bf16_cuda");
  EXPECT_EQ(answers.equal_to_hf, answers.prompts);
  std::cout << "kvvm-adder on CUDA: " << answers.correct << " / " << answers.prompts << " correct, "
            << answers.equal_to_hf << " equal to HF\n";
}

}  // namespace
}  // namespace kvvm
