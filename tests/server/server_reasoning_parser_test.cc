// The reasoning splitter (<think>...</think>, vLLM's qwen3 / deepseek_r1 parsers): fixtures of
// whole answers, and the same answers streamed in every split, accumulated equal to the whole.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "server/reasoning_parser.h"

namespace kvvm::server::reasoning_parser_test {
namespace {

struct Fixture {
  const char* label;
  ReasoningFormat format;
  bool thinking;
  std::string text;
  std::string reasoning;
  std::string content;
};

std::vector<Fixture> fixtures() {
  const auto T = ReasoningFormat::kThinkTags;
  return {
      {"qwen3 think then answer", T, true, "<think>\nAdd them: 4.\n</think>\n\nThe sum is 4.",
       "\nAdd them: 4.\n", "The sum is 4."},
      {"r1 prompt opened think", T, true, "Add them: 4.\n</think>\n\nThe sum is 4.",
       "Add them: 4.\n", "The sum is 4."},
      {"blanks before think", T, true, "\n\n<think>x</think>y", "x", "y"},
      {"no close: truncated reasoning", T, true, "<think>\nStill thinking ab",
       "\nStill thinking ab", ""},
      {"no tags, thinking", T, true, "just words", "just words", ""},
      {"no tags, not thinking", T, false, "\n\nJust the answer.", "", "\n\nJust the answer."},
      {"not thinking but the model thinks", T, false, "<think>hmm</think>ok", "hmm", "ok"},
      {"empty reasoning", T, true, "<think>\n\n</think>\n\nHi", "\n\n", "Hi"},
      {"second think tags stay content", T, true, "<think>a</think>b<think>c</think>", "a",
       "b<think>c</think>"},
      {"tag-like text in reasoning", T, true, "<think>a </thin b </ c</think> d", "a </thin b </ c",
       "d"},
      {"answer of blanks after reasoning", T, true, "<think>r</think>\n\n", "r", ""},
      {"unicode", T, true, "<think>Zürich 😀</think>東京 😀", "Zürich 😀", "東京 😀"},
      {"no format", ReasoningFormat::kNone, true, "<think>a</think>b", "", "<think>a</think>b"},
      {"empty", T, true, "", "", ""},
  };
}

ReasoningSplit stream(const Fixture& f, const std::vector<std::size_t>& cuts) {
  ReasoningStream parser(f.format, f.thinking);
  ReasoningSplit sum;
  const auto add = [&sum](const ReasoningSplit& piece) {
    sum.reasoning += piece.reasoning;
    sum.content += piece.content;
  };
  std::size_t at = 0;
  for (std::size_t cut : cuts) {
    add(parser.push(std::string_view(f.text).substr(at, cut - at)));
    at = cut;
  }
  add(parser.push(std::string_view(f.text).substr(at)));
  add(parser.finish());
  return sum;
}

TEST(ReasoningParser, FixturesSplitAsExpected) {
  for (const Fixture& f : fixtures()) {
    const ReasoningSplit got = split_reasoning(f.format, f.text, f.thinking);
    EXPECT_EQ(got.reasoning, f.reasoning) << f.label;
    EXPECT_EQ(got.content, f.content) << f.label;
  }
}

TEST(ReasoningParser, EverySplitStreamsToTheWholeSplit) {
  for (const Fixture& f : fixtures()) {
    std::vector<std::vector<std::size_t>> splits;
    std::vector<std::size_t> bytes;
    for (std::size_t i = 1; i < f.text.size(); ++i) bytes.push_back(i);
    splits.push_back(bytes);
    for (std::size_t cut = 0; cut <= f.text.size(); ++cut) splits.push_back({cut});
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
      std::mt19937_64 rng(seed);
      std::vector<std::size_t> cuts;
      for (std::size_t at = 0;;) {
        at += 1 + rng() % 5;
        if (at >= f.text.size()) break;
        cuts.push_back(at);
      }
      splits.push_back(cuts);
    }
    for (std::size_t i = 0; i < splits.size(); ++i) {
      const ReasoningSplit got = stream(f, splits[i]);
      EXPECT_EQ(got.reasoning, f.reasoning) << f.label << " split " << i;
      EXPECT_EQ(got.content, f.content) << f.label << " split " << i;
    }
  }
}

TEST(ReasoningParser, RandomTextsStreamTheSameInEverySplit) {
  const std::vector<std::string> pieces = {"<think>", "</think>", "<think", "</th", "<",
                                           "\n",      " ",        "a",      "é",    "😀"};
  std::mt19937_64 rng(77);
  for (int i = 0; i < 400; ++i) {
    Fixture f{"random", ReasoningFormat::kThinkTags, i % 2 == 0, "", "", ""};
    for (std::size_t n = 1 + rng() % 10; n > 0; --n) f.text += pieces[rng() % pieces.size()];
    const ReasoningSplit whole = split_reasoning(f.format, f.text, f.thinking);
    std::vector<std::size_t> bytes;
    for (std::size_t k = 1; k < f.text.size(); ++k) bytes.push_back(k);
    const ReasoningSplit got = stream(f, bytes);
    EXPECT_EQ(got.reasoning, whole.reasoning) << f.text;
    EXPECT_EQ(got.content, whole.content) << f.text;
    if (HasFailure()) return;
  }
}

TEST(ReasoningParser, ReasoningStreamsAsItComes) {
  ReasoningStream parser(ReasoningFormat::kThinkTags);
  EXPECT_TRUE(parser.push("<thi").empty());
  EXPECT_TRUE(parser.push("nk>").empty());
  EXPECT_EQ(parser.push("Let me").reasoning, "Let me");
  const ReasoningSplit held = parser.push(" see</th");
  EXPECT_EQ(held.reasoning, " see");
  EXPECT_EQ(held.content, "");
  const ReasoningSplit end = parser.push("ink>\n\nOK");
  EXPECT_EQ(end.reasoning, "");
  EXPECT_EQ(end.content, "OK");
  // A character cut in two waits for its last byte.
  const std::string smile = "😀";
  EXPECT_TRUE(parser.push(smile.substr(0, 2)).empty());
  EXPECT_EQ(parser.push(smile.substr(2)).content, smile);
  EXPECT_TRUE(parser.finish().empty());
}

TEST(ReasoningParser, NamesTemplatesAndPrompts) {
  EXPECT_EQ(*parse_reasoning_format("qwen3"), ReasoningFormat::kThinkTags);
  EXPECT_EQ(*parse_reasoning_format("deepseek_r1"), ReasoningFormat::kThinkTags);
  EXPECT_EQ(*parse_reasoning_format("none"), ReasoningFormat::kNone);
  EXPECT_FALSE(parse_reasoning_format("granite").ok());
  // Qwen3's template (its generation prompt and how it reads answers back); Qwen2.5's has none.
  EXPECT_EQ(detect_reasoning_format(
                "{%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}"
                "{%- if enable_thinking is defined and enable_thinking is false %}"
                "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"),
            ReasoningFormat::kThinkTags);
  EXPECT_EQ(detect_reasoning_format("{{- '<|im_start|>assistant\\n' }}"), ReasoningFormat::kNone);
  EXPECT_TRUE(prompt_closes_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_closes_reasoning("<|im_start|>assistant\n"));
  EXPECT_FALSE(prompt_closes_reasoning("<｜Assistant｜><think>\n"));
}

}  // namespace
}  // namespace kvvm::server::reasoning_parser_test
