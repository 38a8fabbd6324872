// `kvvm generate` through run_cli (the binary's code path): a checkpoint
// written by the test (random weights, a byte-level tokenizer.json) and, when
// present, the committed fixtures (tests/data/models) whose expected.json holds
// transformers' greedy continuations.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "app.h"
#include "kit/cli_common.h"
#include "kvvm/engine/generate.h"
#include "kvvm/model/config.h"
#include "kvvm/model/safetensors.h"
#include "kvvm/model/weights.h"
#include "support/cli_run.h"
#include "support/safetensors_writer.h"
#include "support/test_data.h"

namespace kvvm::cli {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

using test::CliRun;
using test::contains;
using test::run;

std::string join_ids(const std::vector<std::int32_t>& ids) {
  std::string text;
  for (std::size_t i = 0; i < ids.size(); ++i) text += (i ? "," : "") + std::to_string(ids[i]);
  return text;
}

// GPT-2's byte-to-character table: printable bytes stand for themselves, the
// others are moved to U+0100 and up, so every byte is one visible character of
// the vocabulary.
std::string byte_char(int b) {
  const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
  int code = b;
  if (!printable) {
    int n = 0;
    for (int i = 0; i < b; ++i) {
      if (!((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174))) ++n;
    }
    code = 256 + n;
  }
  std::string text;
  if (code < 0x80) {
    text += static_cast<char>(code);
  } else {
    text += static_cast<char>(0xC0 | (code >> 6));
    text += static_cast<char>(0x80 | (code & 0x3F));
  }
  return text;
}

// A byte-level BPE with one token per byte (ids 0-255), a few merges, and
// ChatML's special tokens (256-258): enough for encode, decode and chat with a
// random model of 260 tokens.
Json byte_tokenizer() {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  Json added = Json::array();
  const char* specials[] = {"<|im_start|>", "<|im_end|>", "<|endoftext|>"};
  for (int i = 0; i < 3; ++i) {
    added.push_back({{"id", 256 + i},
                     {"content", specials[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"},
            {"add_prefix_space", false},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder",
           {{"type", "ByteLevel"},
            {"add_prefix_space", true},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"vocab", vocab},
            {"merges", Json::array()}}}};
}

// A checkpoint directory of a random Qwen2-shaped model over the byte
// tokenizer.
class CliGenerateCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_.architecture = "Qwen2ForCausalLM";
    spec_.vocab = 260;
    spec_.seed = 5;
    test::write_tiny_model(dir(), spec_);
    test::write_json_file(dir() / "tokenizer.json", byte_tokenizer());
    test::write_json_file(dir() / "tokenizer_config.json",
                          {{"chat_template",
                            "{% for message in messages %}{{'<|im_start|>' + message['role'] + "
                            "'\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
                            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                            "{% endif %}"}});
  }
  fs::path dir() const { return temp_ / "model"; }
  std::string dir_text() const { return dir().string(); }

  // What engine::generate gives for `prompt` with the CPU model on these
  // weights, greedy.
  std::vector<std::int32_t> direct_greedy(const std::vector<std::int32_t>& prompt,
                                          std::uint32_t max_tokens) {
    auto config = model::load_model_config(dir_text());
    EXPECT_TRUE(config.ok()) << config.status().to_string();
    auto files = model::WeightFiles::open_dir(dir_text());
    EXPECT_TRUE(files.ok()) << files.status().to_string();
    auto weights = model::bind_weights(*config, **files);
    EXPECT_TRUE(weights.ok()) << weights.status().to_string();
    auto made = model::make_cpu_model(*config, *weights, model::CpuModelOptions{});
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    engine::KvSpaceOptions options;
    options.max_slots = 1;
    auto kv = engine::KvSpace::create(*config, options);
    EXPECT_TRUE(kv.ok()) << kv.status().to_string();
    engine::GenerateRequest request;
    request.prompt = prompt;
    request.max_tokens = max_tokens;
    request.stop_ids = config->eos_token_ids;
    auto result = engine::generate(**made, **kv, request);
    EXPECT_TRUE(result.ok()) << result.status().to_string();
    return result.ok() ? result->tokens : std::vector<std::int32_t>{};
  }

  test::TempDir temp_;
  test::TinyModel spec_;
};

TEST_F(CliGenerateCheckpoint, JsonTokensEqualTheEngineOnTheSameWeights) {
  const std::vector<std::int32_t> prompt = {72, 101, 108, 108, 111};
  CliRun r = run({"generate", "--model", dir_text(), "--prompt-ids", join_ids(prompt),
                  "--max-tokens", "12", "--backend", "cpu", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const Json report = Json::parse(r.out);
  EXPECT_EQ(report["prompt_ids"].get<std::vector<std::int32_t>>(), prompt);
  const auto tokens = report["token_ids"].get<std::vector<std::int32_t>>();
  EXPECT_EQ(tokens, direct_greedy(prompt, 12));
  EXPECT_EQ(report["finish_reason"], tokens.size() == 12 ? "length" : "stop");
  for (const char* key :
       {"load_seconds", "prefill_seconds", "decode_seconds", "tokens_per_second"}) {
    EXPECT_TRUE(report["timings"].contains(key)) << key;
  }
}

// "1.23", "12.3", "123", "0.00456", "1235" (a whole number from 1000 up): at most three
// digits from the first that is not zero, or a whole number.
bool three_significant_digits(const std::string& value) {
  const std::size_t point = value.find('.');
  if (point == std::string::npos) return true;
  const std::size_t first = value.find_first_not_of("0.");
  if (first == std::string::npos) return true;
  std::size_t digits = 0;
  for (std::size_t i = first; i < value.size(); ++i) digits += value[i] != '.';
  return digits <= 3;
}

// The start and end lines give times and rates in three significant digits with their units
// ("loaded in 22.7 ms", "decode 367 tokens/s"), not a double's raw digits ("0.0227192 s").
TEST_F(CliGenerateCheckpoint, TimingsPrintInThreeSignificantDigitsWithUnits) {
  CliRun r = run({"generate", "--model", dir_text(), "--prompt-ids", "72,101,108", "--max-tokens",
                  "4", "--backend", "cpu", "--ignore-eos"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const std::string kNumber = "([0-9]+(?:\\.[0-9]+)?)";
  const std::string kUnit = " (ns|µs|ms|s)";
  std::smatch loaded;
  ASSERT_TRUE(std::regex_search(r.err, loaded, std::regex("loaded in " + kNumber + kUnit + ";")))
      << r.err;
  std::smatch done;
  ASSERT_TRUE(std::regex_search(
      r.err, done,
      std::regex("prefill " + kNumber + kUnit + ", decode " + kNumber + " tokens/s\n")))
      << r.err;
  for (const std::string& value : {loaded[1].str(), done[1].str(), done[3].str()}) {
    EXPECT_TRUE(three_significant_digits(value)) << value << " in: " << r.err;
  }
}

// A checkpoint in shards says how its load goes: into a log (the test's stream is no terminal),
// one line per shard, the last at the total.
TEST_F(CliGenerateCheckpoint, AShardedLoadPrintsALinePerShardInALog) {
  const fs::path sharded = temp_ / "sharded";
  test::write_tiny_model_shards(sharded, spec_, 3);
  fs::copy_file(dir() / "tokenizer.json", sharded / "tokenizer.json");
  CliRun r = run({"generate", "--model", sharded.string(), "--prompt-ids", "72,101", "--max-tokens",
                  "2", "--backend", "cpu", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  for (const char* shard : {"1/3", "2/3", "3/3"}) {
    EXPECT_TRUE(
        contains(r.err, std::string("kvvm generate: loading weights: ") + shard + " shards, "))
        << shard << " not in: " << r.err;
  }
  EXPECT_TRUE(contains(r.err, "(100%)")) << r.err;
  EXPECT_FALSE(contains(r.err, "\r")) << "no terminal control in a log";
}

TEST_F(CliGenerateCheckpoint, StreamedTextEqualsTheJsonText) {
  const std::vector<std::string> base = {"generate", "--model",      dir_text(), "--prompt",
                                         "Hi there", "--max-tokens", "16",       "--temperature",
                                         "0.8",      "--seed",       "3"};
  std::vector<std::string> with_json = base;
  with_json.push_back("--json");
  CliRun streamed = run(base);
  CliRun reported = run(with_json);
  ASSERT_EQ(streamed.code, kExitOk) << streamed.err;
  ASSERT_EQ(reported.code, kExitOk) << reported.err;
  const Json report = Json::parse(reported.out);
  EXPECT_EQ(streamed.out, report["text"].get<std::string>() + "\n");
  // The random model emits bytes that are no UTF-8: both forms show them as U+FFFD.
  EXPECT_TRUE(contains(streamed.out, "\xEF\xBF\xBD")) << streamed.out;
  // The prompt is the text's bytes: the byte tokenizer adds nothing.
  EXPECT_EQ(report["prompt_ids"].get<std::vector<std::int32_t>>(),
            (std::vector<std::int32_t>{72, 105, 32, 116, 104, 101, 114, 101}));
}

TEST_F(CliGenerateCheckpoint, ChatRendersTheTemplate) {
  CliRun r = run({"generate", "--model", dir_text(), "--chat", "Hi", "--system", "Be brief",
                  "--chat-template", "chatml", "--max-tokens", "2", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const auto ids = Json::parse(r.out)["prompt_ids"].get<std::vector<std::int32_t>>();
  // <|im_start|>system\nBe
  // brief<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 256);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 256), 3);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 257), 2);
  // tokenizer_config.json's own template when none is named: the same prompt.
  CliRun detected = run({"generate", "--model", dir_text(), "--chat", "Hi", "--system", "Be brief",
                         "--max-tokens", "2", "--json"});
  ASSERT_EQ(detected.code, kExitOk) << detected.err;
  EXPECT_EQ(Json::parse(detected.out)["prompt_ids"], Json(ids));
}

TEST_F(CliGenerateCheckpoint, MissingPiecesAreNamed) {
  CliRun no_dir = run({"generate", "--model", (temp_ / "absent").string(), "--prompt", "x"});
  EXPECT_EQ(no_dir.code, kExitUsage);
  EXPECT_TRUE(contains(no_dir.err, (temp_ / "absent").string())) << no_dir.err;
  EXPECT_TRUE(contains(no_dir.err, "no such directory")) << no_dir.err;

  fs::remove(dir() / "model.safetensors");
  CliRun no_weights = run({"generate", "--model", dir_text(), "--prompt", "x"});
  EXPECT_EQ(no_weights.code, kExitUsage);
  EXPECT_TRUE(contains(no_weights.err, (dir() / "model.safetensors").string())) << no_weights.err;

  fs::remove(dir() / "tokenizer.json");
  CliRun no_tokenizer = run({"generate", "--model", dir_text(), "--prompt", "x"});
  EXPECT_EQ(no_tokenizer.code, kExitUsage);
  EXPECT_TRUE(contains(no_tokenizer.err, (dir() / "tokenizer.json").string())) << no_tokenizer.err;

  fs::remove(dir() / "config.json");
  CliRun no_config = run({"generate", "--model", dir_text(), "--prompt", "x"});
  EXPECT_EQ(no_config.code, kExitUsage);
  EXPECT_TRUE(contains(no_config.err, (dir() / "config.json").string())) << no_config.err;
}

TEST_F(CliGenerateCheckpoint, BadCommandLinesAreRefused) {
  CliRun no_model = run({"generate", "--prompt", "x"});
  EXPECT_EQ(no_model.code, kExitUsage);
  EXPECT_TRUE(contains(no_model.err, "--model")) << no_model.err;

  CliRun no_prompt = run({"generate", "--model", dir_text()});
  EXPECT_EQ(no_prompt.code, kExitUsage);
  EXPECT_TRUE(contains(no_prompt.err, "--prompt")) << no_prompt.err;

  CliRun both = run({"generate", "--model", dir_text(), "--prompt", "x", "--chat", "y"});
  EXPECT_EQ(both.code, kExitUsage);

  CliRun system_alone = run({"generate", "--model", dir_text(), "--prompt", "x", "--system", "s"});
  EXPECT_EQ(system_alone.code, kExitUsage);

  CliRun bad_p = run({"generate", "--model", dir_text(), "--prompt", "x", "--top-p", "0"});
  EXPECT_EQ(bad_p.code, kExitUsage);
  EXPECT_TRUE(contains(bad_p.err, "--top-p")) << bad_p.err;

  CliRun bad_id = run({"generate", "--model", dir_text(), "--prompt-ids", "1,999"});
  EXPECT_EQ(bad_id.code, kExitUsage);
  EXPECT_TRUE(contains(bad_id.err, "999")) << bad_id.err;

  CliRun too_long = run({"generate", "--model", dir_text(), "--prompt", "hello", "--max-context",
                         "8", "--max-tokens", "4"});
  EXPECT_EQ(too_long.code, kExitUsage);
  EXPECT_TRUE(contains(too_long.err, "context of 8")) << too_long.err;

  CliRun bad_layout =
      run({"generate", "--model", dir_text(), "--prompt", "x", "--layout", "diagonal"});
  EXPECT_EQ(bad_layout.code, kExitUsage);
  EXPECT_TRUE(contains(bad_layout.err, "--layout")) << bad_layout.err;
}

TEST_F(CliGenerateCheckpoint, DefaultMaxTokensIsCutToTheContext) {
  CliRun r = run({"generate", "--model", dir_text(), "--prompt-ids", "1,2,3", "--max-context", "10",
                  "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_LE(Json::parse(r.out)["token_ids"].size(), 7u);
  EXPECT_TRUE(contains(r.err, "at most 7 tokens")) << r.err;
}

TEST(CliGenerate, HelpExplainsEveryOption) {
  CliRun r = run({"generate", "--help"});
  ASSERT_EQ(r.code, kExitOk);
  for (const char* option :
       {"--model", "--prompt", "--chat", "--system", "--chat-template", "--max-tokens",
        "--temperature", "--top-k", "--top-p", "--seed", "--backend", "--layout", "--max-context",
        "--json", "--prompt-ids", "--ignore-eos", "--no-graphs"}) {
    EXPECT_TRUE(contains(r.out, option)) << option;
  }
}

// The demo model answers "521" and then its end token; --ignore-eos generates past it.
TEST(CliGenerate, IgnoreEosGeneratesExactlyMaxTokens) {
  const std::string dir = test::demo_model_dir();
  CliRun stops = run({"generate", "--model", dir, "--backend", "cpu", "--chat", "What is 482 + 39?",
                      "--max-tokens", "6", "--json"});
  ASSERT_EQ(stops.code, kExitOk) << stops.err;
  const Json stopped = Json::parse(stops.out);
  EXPECT_EQ(stopped.at("text"), "521");
  EXPECT_EQ(stopped.at("finish_reason"), "stop");

  CliRun runs_on = run({"generate", "--model", dir, "--backend", "cpu", "--chat",
                        "What is 482 + 39?", "--max-tokens", "6", "--json", "--ignore-eos"});
  ASSERT_EQ(runs_on.code, kExitOk) << runs_on.err;
  const Json ran = Json::parse(runs_on.out);
  EXPECT_EQ(ran.at("token_ids").size(), 6u);
  EXPECT_EQ(ran.at("finish_reason"), "length");
  EXPECT_EQ(ran.at("timings").at("decode_steps"), 5);
}

// Graphs are the CUDA engine's; --no-graphs is accepted everywhere and changes no token.
TEST(CliGenerate, NoGraphsGivesTheSameAnswer) {
  const std::string dir = test::demo_model_dir();
  const std::vector<std::string> args = {"generate",          "--model",      dir, "--chat",
                                         "What is 482 + 39?", "--max-tokens", "6", "--json"};
  CliRun with = run(args);
  ASSERT_EQ(with.code, kExitOk) << with.err;
  std::vector<std::string> without = args;
  without.push_back("--no-graphs");
  CliRun eager = run(without);
  ASSERT_EQ(eager.code, kExitOk) << eager.err;
  EXPECT_EQ(Json::parse(eager.out).at("token_ids"), Json::parse(with.out).at("token_ids"));
  EXPECT_EQ(Json::parse(eager.out).at("text"), "521");
}

// Prefill only is the library's (generate() with its prompt logits); zero tokens to print is
// refused with the engine's own words.
TEST(CliGenerate, ZeroMaxTokensIsRefusedByTheEnginesCheck) {
  CliRun r = run({"generate", "--model", test::demo_model_dir(), "--backend", "cpu", "--prompt",
                  "1 + 1", "--max-tokens", "0"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_TRUE(contains(r.err, "max_tokens: 0")) << r.err;
}

// The committed fixtures: transformers' greedy continuation for each "greedy"
// entry.
class CliGenerateFixture : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = test::model_fixture_dir(GetParam());
    ASSERT_TRUE(fs::exists(fs::path(dir_) / "expected.json")) << "no fixture at " << dir_;
    std::ifstream in(fs::path(dir_) / "expected.json");
    expected_ = Json::parse(in);
    auto config = model::load_model_config(dir_);
    ASSERT_TRUE(config.ok()) << config.status().to_string();
    eos_ = config->eos_token_ids;
  }
  std::string dir_;
  Json expected_;
  std::vector<std::int32_t> eos_;
};

TEST_P(CliGenerateFixture, GreedyTokensEqualTransformers) {
  ASSERT_FALSE(expected_["greedy"].empty());
  for (const Json& entry : expected_["greedy"]) {
    const auto prompt = entry["prompt_ids"].get<std::vector<std::int32_t>>();
    const auto want = entry["tokens"].get<std::vector<std::int32_t>>();
    const auto margins = entry["margins"].get<std::vector<double>>();
    CliRun r = run({"generate", "--model", dir_, "--prompt-ids", join_ids(prompt), "--max-tokens",
                    std::to_string(want.size()), "--backend", "cpu", "--json"});
    ASSERT_EQ(r.code, kExitOk) << r.err;
    const auto got = Json::parse(r.out)["token_ids"].get<std::vector<std::int32_t>>();
    // Equal token by token until the reference's own top-2 margin is too close
    // for float32 to call; the reference does not stop at an end token,
    // generate does.
    for (std::size_t i = 0; i < want.size() && margins[i] > 1e-3; ++i) {
      if (i == got.size()) {
        EXPECT_NE(std::find(eos_.begin(), eos_.end(), want[i]), eos_.end())
            << "stopped at step " << i << " on a token that is no end token";
        break;
      }
      ASSERT_EQ(got[i], want[i]) << "step " << i << ", margin " << margins[i];
    }
  }
}

TEST_P(CliGenerateFixture, ChatPromptIdsEqualTransformers) {
  bool checked = false;
  for (const Json& entry : expected_["chat"]) {
    const Json& messages = entry["messages"];
    std::vector<std::string> args = {"generate", "--model", dir_, "--max-tokens", "1", "--json"};
    std::size_t users = 0;
    bool usable = true;
    for (const Json& m : messages) {
      const std::string role = m["role"];
      if (role == "system" && users == 0) {
        args.insert(args.end(), {"--system", m["content"].get<std::string>()});
      } else if (role == "user" && users++ == 0) {
        args.insert(args.end(), {"--chat", m["content"].get<std::string>()});
      } else {
        usable = false;  // multi-turn: beyond what --chat expresses
      }
    }
    // --chat renders with the generation prompt and the template's defaults.
    if (!entry.value("add_generation_prompt", true) || !entry.value("enable_thinking", true)) {
      usable = false;
    }
    if (!usable || users != 1) continue;
    CliRun r = run(args);
    ASSERT_EQ(r.code, kExitOk) << r.err;
    EXPECT_EQ(Json::parse(r.out)["prompt_ids"], entry["ids"]) << entry["text"];
    checked = true;
  }
  EXPECT_TRUE(checked) << "no single-turn chat entry in " << dir_;
}

TEST_P(CliGenerateFixture, StreamedTextEqualsTheJsonText) {
  const std::vector<std::string> base = {"generate",         "--model",      dir_, "--prompt",
                                         "Once upon a time", "--max-tokens", "24"};
  std::vector<std::string> with_json = base;
  with_json.push_back("--json");
  CliRun streamed = run(base);
  CliRun reported = run(with_json);
  ASSERT_EQ(streamed.code, kExitOk) << streamed.err;
  ASSERT_EQ(reported.code, kExitOk) << reported.err;
  EXPECT_EQ(streamed.out, Json::parse(reported.out)["text"].get<std::string>() + "\n");
}

TEST_P(CliGenerateFixture, PartialDirectoryIsRefusedNamingTheWeights) {
  test::TempDir temp;
  fs::copy_file(fs::path(dir_) / "config.json", temp / "config.json");
  fs::copy_file(fs::path(dir_) / "tokenizer.json", temp / "tokenizer.json");
  CliRun r = run({"generate", "--model", temp.path().string(), "--prompt", "x"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_TRUE(contains(r.err, "model.safetensors")) << r.err;
}

INSTANTIATE_TEST_SUITE_P(Models, CliGenerateFixture,
                         ::testing::Values("llama-tiny", "qwen2-tiny", "qwen3-tiny"),
                         [](const auto& param_info) {
                           std::string name = param_info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace kvvm::cli
