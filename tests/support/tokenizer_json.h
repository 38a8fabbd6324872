// Small hand-made tokenizer.json documents for the tokenizer tests: a byte-level BPE whose
// vocabulary holds the 256 byte characters (ids 0..255 in byte order) and then the tokens a
// test names (ids from 256 on), with the pre-tokenizer, normalizer, added tokens and
// post-processor a test chooses.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "kvvm/tokenizer/tokenizer.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/regex.h"

namespace kvvm::test {

inline constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The byte-level spelling of raw bytes ("a b" -> "aĠb").
inline std::string spell(const std::string& bytes) {
  return tokenizer::detail::bytes_to_byte_level(bytes);
}

inline nlohmann::json split_pre_tokenizer(const std::string& pattern) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{"Regex", pattern}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"},
             {"add_prefix_space", false},
             {"trim_offsets", true},
             {"use_regex", false}}}}};
}

inline nlohmann::json added_token(int id, const std::string& content, bool special = true) {
  return {{"id", id},        {"content", content},     {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", !special}, {"special", special}};
}

struct TokenizerSpec {
  std::vector<std::string> tokens;  // raw bytes of the tokens after the 256 byte tokens
  std::vector<std::pair<std::string, std::string>> merges;  // raw bytes of each side
  nlohmann::json pre_tokenizer = split_pre_tokenizer(kLlama3Pattern);
  nlohmann::json normalizer = nullptr;
  nlohmann::json added_tokens = nlohmann::json::array();
  nlohmann::json post_processor = nullptr;
  bool ignore_merges = false;
  bool pair_merges = false;  // merges as [left, right] rather than "left right"
};

inline nlohmann::json tokenizer_json(const TokenizerSpec& spec) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int byte = 0; byte < 256; ++byte)
    vocab[spell(std::string(1, static_cast<char>(byte)))] = byte;
  int next = 256;
  for (const std::string& token : spec.tokens) vocab[spell(token)] = next++;
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [left, right] : spec.merges) {
    if (spec.pair_merges) {
      merges.push_back({spell(left), spell(right)});
    } else {
      merges.push_back(spell(left) + " " + spell(right));
    }
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", spec.added_tokens},
          {"normalizer", spec.normalizer},
          {"pre_tokenizer", spec.pre_tokenizer},
          {"post_processor", spec.post_processor},
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
            {"ignore_merges", spec.ignore_merges},
            {"vocab", vocab},
            {"merges", merges}}}};
}

// The tokenizer `spec` describes, parsed; a parse failure is a test failure (and null).
inline std::unique_ptr<tokenizer::Tokenizer> make_tokenizer(const TokenizerSpec& spec) {
  Result<std::unique_ptr<tokenizer::Tokenizer>> parsed =
      tokenizer::Tokenizer::parse(tokenizer_json(spec).dump(), "test.json");
  EXPECT_TRUE(parsed.ok()) << parsed.status().to_string();
  return parsed.ok() ? std::move(*parsed) : nullptr;
}

}  // namespace kvvm::test
