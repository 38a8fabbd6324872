// Non-byte-level BPE as Llama-2 and Mistral ship it, on hand-made files: Metaspace's schemes and
// Llama-2's legacy normalizer (Prepend + Replace) through whole encodes, byte fallback to
// <0xNN> tokens, the unk token (fused or not), the decoders (Metaspace, Replace + ByteFallback +
// Fuse + Strip, none: a space between tokens) with streaming equal to decoding, empty text,
// and the decoder chains refused by name.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvvm/tokenizer/tokenizer.h"

namespace kvvm::tokenizer::metaspace_test {
namespace {

using Ids = std::vector<TokenId>;
using nlohmann::json;

constexpr const char* kMark = "\u2581";
constexpr TokenId kUnk = 0, kBos = 1, kEos = 2;
TokenId byte_id(unsigned char byte) { return 3 + byte; }

// Llama's layout: <unk> <s> </s>, <0x00>..<0xFF> (ids 3..258), then `tokens` from 259 on.
struct Spec {
  std::vector<std::string> tokens = {kMark, "h",   "e",           "l",       "o",
                                     "w",   "r",   "d",           "\u2581h", "\u2581he",
                                     "ll",  "llo", "\u2581hello", "\u2581w"};
  std::vector<std::pair<std::string, std::string>> merges = {
      {kMark, "h"}, {"\u2581h", "e"}, {"l", "l"}, {"ll", "o"}, {"\u2581he", "llo"}, {kMark, "w"}};
  json normalizer = nullptr;
  json pre_tokenizer = {
      {"type", "Metaspace"}, {"replacement", kMark}, {"prepend_scheme", "first"}, {"split", false}};
  json decoder = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "Replace"}, {"pattern", {{"String", kMark}}}, {"content", " "}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  json post_processor = {{"type", "TemplateProcessing"},
                         {"single",
                          {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {kBos}}}}}}};
  bool byte_fallback = true;
  bool fuse_unk = true;
  bool byte_tokens = true;  // the <0xNN> tokens in the vocab
};

TokenId id_of(const Spec& spec, const std::string& token) {
  for (std::size_t i = 0; i < spec.tokens.size(); ++i) {
    if (spec.tokens[i] == token) return static_cast<TokenId>(259 + i);
  }
  return -1;
}

std::unique_ptr<Tokenizer> make(const Spec& spec) {
  json vocab = {{"<unk>", kUnk}, {"<s>", kBos}, {"</s>", kEos}};
  if (spec.byte_tokens) {
    for (int byte = 0; byte < 256; ++byte) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", byte);
      vocab[name] = byte_id(static_cast<unsigned char>(byte));
    }
  }
  for (std::size_t i = 0; i < spec.tokens.size(); ++i) vocab[spec.tokens[i]] = 259 + i;
  json merges = json::array();
  for (const auto& [left, right] : spec.merges) merges.push_back({left, right});
  json added = json::array();
  for (const auto& [content, id] : {std::pair{"<unk>", kUnk}, {"<s>", kBos}, {"</s>", kEos}}) {
    added.push_back({{"id", id},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  const json file = {{"version", "1.0"},
                     {"truncation", nullptr},
                     {"padding", nullptr},
                     {"added_tokens", added},
                     {"normalizer", spec.normalizer},
                     {"pre_tokenizer", spec.pre_tokenizer},
                     {"post_processor", spec.post_processor},
                     {"decoder", spec.decoder},
                     {"model",
                      {{"type", "BPE"},
                       {"dropout", nullptr},
                       {"unk_token", "<unk>"},
                       {"continuing_subword_prefix", nullptr},
                       {"end_of_word_suffix", nullptr},
                       {"fuse_unk", spec.fuse_unk},
                       {"byte_fallback", spec.byte_fallback},
                       {"ignore_merges", false},
                       {"vocab", vocab},
                       {"merges", merges}}}};
  Result<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::parse(file.dump(), "llama.json");
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  return tokenizer.ok() ? std::move(*tokenizer) : nullptr;
}

std::string stream(const Tokenizer& tokenizer, const Ids& ids, bool skip_special) {
  StreamDecoder decoder(tokenizer, skip_special);
  std::string out;
  for (const TokenId id : ids) out += decoder.push(id);
  return out + decoder.finish();
}

TEST(TokenizerMetaspace, FirstSchemePrependsWhereTheInputBeginsOnly) {
  const Spec spec;
  auto tokenizer = make(spec);
  const TokenId hello = id_of(spec, "\u2581hello");
  const TokenId w = id_of(spec, "\u2581w");
  EXPECT_EQ(tokenizer->encode("hello"), (Ids{hello}));
  EXPECT_EQ(tokenizer->encode("hello", true), (Ids{kBos, hello}));
  EXPECT_EQ(tokenizer->encode("hello w"), (Ids{hello, w}));
  // After an added token the text no longer begins the input: no mark before "hello".
  const Ids after = tokenizer->encode("<s>hello");
  ASSERT_FALSE(after.empty());
  EXPECT_EQ(after.front(), kBos);
  EXPECT_EQ(after.at(1), id_of(spec, "h"));
  EXPECT_EQ(tokenizer->encode("<s> hello"), (Ids{kBos, hello}));
}

TEST(TokenizerMetaspace, AlwaysSchemePrependsAfterAddedTokensToo) {
  Spec spec;
  spec.pre_tokenizer["prepend_scheme"] = "always";
  auto tokenizer = make(spec);
  EXPECT_EQ(tokenizer->encode("<s>hello"), (Ids{kBos, id_of(spec, "\u2581hello")}));
}

TEST(TokenizerMetaspace, LegacyPrependAndReplaceNormalizerEncodesAsTheAlwaysScheme) {
  Spec spec;
  spec.normalizer = {{"type", "Sequence"},
                     {"normalizers",
                      {{{"type", "Prepend"}, {"prepend", kMark}},
                       {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMark}}}}};
  spec.pre_tokenizer = nullptr;
  auto tokenizer = make(spec);
  const TokenId hello = id_of(spec, "\u2581hello");
  EXPECT_EQ(tokenizer->encode("hello w"), (Ids{hello, id_of(spec, "\u2581w")}));
  EXPECT_EQ(tokenizer->encode("<s>hello"), (Ids{kBos, hello}));  // each stretch gets its mark
  EXPECT_EQ(tokenizer->encode(""), Ids{});                       // and an empty one none
}

TEST(TokenizerMetaspace, MissingCharactersFallBackToTheirBytes) {
  const Spec spec;
  auto tokenizer = make(spec);
  // U+65E5 is E6 97 A5; the mark before it is in the vocab.
  EXPECT_EQ(tokenizer->encode("\u65e5"),
            (Ids{id_of(spec, kMark), byte_id(0xE6), byte_id(0x97), byte_id(0xA5)}));
  // A byte that is not UTF-8 falls back the same way.
  EXPECT_EQ(tokenizer->encode("h\xFF"), (Ids{id_of(spec, "\u2581h"), byte_id(0xFF)}));
}

TEST(TokenizerMetaspace, WithoutByteFallbackAnUnknownRunIsOneUnkOrOneEach) {
  Spec spec;
  spec.byte_fallback = false;
  auto fused = make(spec);
  const TokenId h = id_of(spec, "\u2581h");
  EXPECT_EQ(fused->encode("h\u65e5\u672cl"), (Ids{h, kUnk, id_of(spec, "l")}));
  spec.fuse_unk = false;
  auto separate = make(spec);
  EXPECT_EQ(separate->encode("h\u65e5\u672cl"), (Ids{h, kUnk, kUnk, id_of(spec, "l")}));
  // A character whose byte tokens are missing becomes unk even with byte_fallback on.
  spec.byte_fallback = true;
  spec.fuse_unk = true;
  spec.byte_tokens = false;
  auto no_bytes = make(spec);
  EXPECT_EQ(no_bytes->encode("h\u65e5"), (Ids{h, kUnk}));
}

TEST(TokenizerMetaspace, LlamaDecoderStripsTheFirstSpaceAndJoinsByteTokens) {
  const Spec spec;
  auto tokenizer = make(spec);
  const Ids ids = tokenizer->encode("hello w\u65e5", true);
  EXPECT_EQ(tokenizer->decode(ids), "<s> hello w\u65e5");
  EXPECT_EQ(tokenizer->decode(ids, true), "hello w\u65e5");
  EXPECT_EQ(stream(*tokenizer, ids, false), tokenizer->decode(ids));
  EXPECT_EQ(stream(*tokenizer, ids, true), tokenizer->decode(ids, true));
  // Only the whole text's first space goes, and only one.
  const TokenId mark = id_of(spec, kMark);
  EXPECT_EQ(tokenizer->decode(Ids{mark, mark, id_of(spec, "h")}), " h");
  EXPECT_EQ(stream(*tokenizer, Ids{mark, mark, id_of(spec, "h")}, false), " h");
  EXPECT_EQ(tokenizer->decode(Ids{byte_id(' '), id_of(spec, "h")}), "h");
}

TEST(TokenizerMetaspace, MetaspaceDecoderDropsTheFirstTokensMarksUnlessNever) {
  Spec spec;
  spec.pre_tokenizer["prepend_scheme"] = "always";
  spec.decoder = {{"type", "Metaspace"}, {"replacement", kMark}, {"prepend_scheme", "always"}};
  auto always = make(spec);
  const TokenId hello = id_of(spec, "\u2581hello");
  const TokenId w = id_of(spec, "\u2581w");
  EXPECT_EQ(always->decode(Ids{hello, w}), "hello w");
  EXPECT_EQ(always->decode(Ids{kBos, hello, w}), "<s> hello w");
  EXPECT_EQ(always->decode(Ids{kBos, hello, w}, true), "hello w");  // skipped: not first
  EXPECT_EQ(stream(*always, Ids{kBos, hello, w}, true), "hello w");
  spec.decoder["prepend_scheme"] = "never";
  auto never = make(spec);
  EXPECT_EQ(never->decode(Ids{hello, w}), " hello w");
}

TEST(TokenizerMetaspace, NoDecoderJoinsTokensWithASpace) {
  Spec spec;
  spec.decoder = nullptr;
  auto tokenizer = make(spec);
  const Ids ids{kBos, id_of(spec, "\u2581hello"), id_of(spec, "ll")};
  EXPECT_EQ(tokenizer->decode(ids), "<s> \u2581hello ll");
  EXPECT_EQ(tokenizer->decode(ids, true), "\u2581hello ll");
  EXPECT_EQ(stream(*tokenizer, ids, true), "\u2581hello ll");
}

TEST(TokenizerMetaspace, EmptyTextIsNoIdsOrThePostProcessorsOnly) {
  const Spec spec;
  auto tokenizer = make(spec);
  EXPECT_EQ(tokenizer->encode(""), Ids{});
  EXPECT_EQ(tokenizer->encode("", true), (Ids{kBos}));
  EXPECT_EQ(tokenizer->decode(Ids{}), "");
  Spec plain = spec;
  plain.post_processor = nullptr;
  EXPECT_EQ(make(plain)->encode("", true), Ids{});
}

// The message of a one-token file with `decoder`, which must be refused.
std::string refusal(const json& decoder) {
  Result<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::parse(
      json({{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", json::array()}}},
            {"decoder", decoder}})
          .dump(),
      "bad.json");
  EXPECT_FALSE(tokenizer.ok());
  return tokenizer.ok() ? "" : tokenizer.status().message();
}

TEST(TokenizerMetaspace, DecoderChainsThatCannotGoTokenByTokenAreRefusedByName) {
  const json fuse = {{"type", "Fuse"}};
  const json metaspace = {{"type", "Metaspace"}, {"replacement", kMark}};
  const json strip_stop = {{"type", "Strip"}, {"content", " "}, {"start", 0}, {"stop", 1}};
  const json replace_two = {{"type", "Replace"}, {"pattern", {{"String", "ab"}}}, {"content", " "}};
  const auto sequence = [](json a, json b) {
    return json{{"type", "Sequence"}, {"decoders", {a, b}}};
  };
  std::string message = refusal(sequence(fuse, metaspace));
  EXPECT_NE(message.find("decoder.decoders[1]"), std::string::npos) << message;
  EXPECT_NE(message.find("'Metaspace' after the tokens are fused"), std::string::npos) << message;
  EXPECT_NE(refusal(sequence(fuse, strip_stop)).find("decoder.decoders[1]"), std::string::npos);
  EXPECT_NE(refusal(sequence(fuse, replace_two)).find("'Replace' after"), std::string::npos);
  EXPECT_NE(refusal(sequence({{"type", "ByteLevel"}}, {{"type", "ByteFallback"}}))
                .find("'ByteFallback' after"),
            std::string::npos);
  EXPECT_NE(refusal({{"type", "BPEDecoder"}}).find("'BPEDecoder' is not implemented"),
            std::string::npos);
  EXPECT_NE(refusal({{"type", "Strip"}, {"content", "ab"}}).find("decoder.content"),
            std::string::npos);
}

}  // namespace
}  // namespace kvvm::tokenizer::metaspace_test
