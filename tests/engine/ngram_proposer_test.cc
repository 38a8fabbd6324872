// The n-gram proposer against vLLM's semantics: worked cases (no match, a match at the start, the
// longest n first, the earliest occurrence among equals, a proposal cut by the sequence's end),
// the options refused by name, and a rapidcheck property against the definition computed n by n
// and place by place over short sequences of a small alphabet (so matches are frequent).
#include "engine/ngram_proposer.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kvvm::engine {
namespace {

NgramOptions ngram_options(std::uint32_t k, std::uint32_t min, std::uint32_t max) {
  return NgramOptions{
      .num_speculative_tokens = k, .prompt_lookup_min = min, .prompt_lookup_max = max};
}

std::vector<std::int32_t> ngram_propose(const std::vector<std::int32_t>& tokens,
                                        const NgramOptions& options) {
  std::vector<std::int32_t> out(options.num_speculative_tokens, -1);
  out.resize(propose_ngram(tokens, options, out));
  return out;
}

// The definition, directly: the longest n in [min, max] whose last n tokens occur earlier (ending
// before the last token), its first occurrence, and the up to k tokens after it.
std::vector<std::int32_t> ngram_reference(const std::vector<std::int32_t>& tokens,
                                          const NgramOptions& options) {
  const std::size_t len = tokens.size();
  for (std::size_t n = options.prompt_lookup_max; n >= options.prompt_lookup_min; --n) {
    if (n + 1 > len) continue;
    for (std::size_t s = 0; s + n < len; ++s) {
      bool equal = true;
      for (std::size_t j = 0; j < n && equal; ++j) equal = tokens[s + j] == tokens[len - n + j];
      if (!equal) continue;
      const std::size_t end = std::min(len, s + n + options.num_speculative_tokens);
      return std::vector<std::int32_t>(tokens.begin() + static_cast<std::ptrdiff_t>(s + n),
                                       tokens.begin() + static_cast<std::ptrdiff_t>(end));
    }
  }
  return {};
}

using NgramTokens = std::vector<std::int32_t>;

TEST(NgramProposer, NoMatchProposesNothing) {
  EXPECT_TRUE(ngram_propose({1, 2, 3, 4, 5}, ngram_options(4, 1, 3)).empty());
  EXPECT_TRUE(ngram_propose({}, ngram_options(4, 1, 3)).empty());
  EXPECT_TRUE(ngram_propose({7}, ngram_options(4, 1, 3)).empty());
  // "1 2" recurs but min is 3: too short to count.
  EXPECT_TRUE(ngram_propose({1, 2, 9, 8, 1, 2}, ngram_options(4, 3, 5)).empty());
}

TEST(NgramProposer, VllmsWorkedExample) {
  // vLLM's docstring: [1 2 3 4 2 3], min 2, max 3, k 4: "4 2 3" does not recur, "2 3" does at
  // the start; three tokens follow it.
  EXPECT_EQ(ngram_propose({1, 2, 3, 4, 2, 3}, ngram_options(4, 2, 3)), (NgramTokens{4, 2, 3}));
}

TEST(NgramProposer, MatchAtTheStart) {
  EXPECT_EQ(ngram_propose({7, 8, 9, 1, 2, 7, 8}, ngram_options(3, 2, 2)), (NgramTokens{9, 1, 2}));
}

TEST(NgramProposer, TheLongestNWinsOverAShorterLaterMatch) {
  // "1 2 3" recurs at the start (then 9); only "2 3" recurs later (then 8).
  const NgramTokens tokens = {1, 2, 3, 9, 5, 2, 3, 8, 1, 2, 3};
  EXPECT_EQ(ngram_propose(tokens, ngram_options(2, 1, 3)), (NgramTokens{9, 5}));
  // Capped at n = 2, "2 3" first occurs at position 1, also followed by 9.
  EXPECT_EQ(ngram_propose(tokens, ngram_options(2, 1, 2)), (NgramTokens{9, 5}));
  // And over a shorter earlier one: "2 3" (then 8) beats the first "3" (then 6).
  EXPECT_EQ(ngram_propose({5, 3, 6, 2, 3, 8, 2, 3}, ngram_options(1, 1, 2)), (NgramTokens{8}));
}

TEST(NgramProposer, TheFirstOccurrenceWinsAmongEquals) {
  // "4 5" occurs at 0 (then 1) and at 3 (then 2): vLLM takes the earliest, not the most recent.
  EXPECT_EQ(ngram_propose({4, 5, 1, 4, 5, 2, 4, 5}, ngram_options(1, 2, 2)), (NgramTokens{1}));
  // A match is measured up to max only: with max 2 the early "4 5" (then 7) beats the later
  // occurrence whose match runs to 5 tokens (then 9); with max 5 the longer one wins.
  const NgramTokens tokens = {4, 5, 7, 1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 5};
  EXPECT_EQ(ngram_propose(tokens, ngram_options(1, 1, 2)), (NgramTokens{7}));
  EXPECT_EQ(ngram_propose(tokens, ngram_options(1, 1, 5)), (NgramTokens{9}));
}

TEST(NgramProposer, TheSequenceEndCutsTheProposal) {
  EXPECT_EQ(ngram_propose({1, 2, 1, 2}, ngram_options(5, 2, 2)), (NgramTokens{1, 2}));
  // An occurrence may overlap the suffix: "3 3" first at 0, followed by the last two 3s.
  EXPECT_EQ(ngram_propose({3, 3, 3, 3}, ngram_options(5, 2, 2)), (NgramTokens{3, 3}));
  // A shorter `out` caps it too (the room left in the context).
  std::vector<std::int32_t> out(2, -1);
  EXPECT_EQ(propose_ngram(NgramTokens{1, 2, 3, 4, 5, 1, 2}, ngram_options(5, 2, 2), out), 2u);
  EXPECT_EQ(out, (NgramTokens{3, 4}));
}

TEST(NgramProposer, MinEqualToMax) {
  const NgramTokens tokens = {1, 2, 3, 6, 7, 2, 3, 8, 1, 2, 3};
  EXPECT_EQ(ngram_propose(tokens, ngram_options(2, 3, 3)), (NgramTokens{6, 7}));
  EXPECT_EQ(ngram_propose(tokens, ngram_options(2, 2, 2)), (NgramTokens{6, 7}));
  EXPECT_TRUE(ngram_propose(tokens, ngram_options(2, 4, 4)).empty());
}

TEST(NgramProposer, ALongRepetitiveContextIsOneLinearPass) {
  // 32k equal tokens, max 1024: the earliest occurrence of the last 1024 starts at 0.
  const NgramTokens tokens(32768, 42);
  EXPECT_EQ(ngram_propose(tokens, ngram_options(8, 1, 1024)), NgramTokens(8, 42));
  // A period-3 context with a different last token: only n = 1 matches, first at position 2.
  NgramTokens periodic;
  for (int i = 0; i < 30000; ++i) periodic.push_back(i % 3);
  periodic.push_back(2);
  EXPECT_EQ(ngram_propose(periodic, ngram_options(3, 1, 1024)), (NgramTokens{0, 1, 2}));
}

void ngram_expect_refused(const NgramOptions& options, const std::string& named) {
  const Status status = check_ngram_options(options);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << named;
  EXPECT_NE(status.message().find(named), std::string::npos) << status.to_string();
}

TEST(NgramProposer, BadOptionsAreRefusedByName) {
  EXPECT_TRUE(check_ngram_options(ngram_options(5, 5, 5)).ok());
  EXPECT_TRUE(check_ngram_options(ngram_options(64, 1, 1024)).ok());
  EXPECT_FALSE(check_ngram_options(NgramOptions{}).ok()) << "k is required, as in vLLM";
  ngram_expect_refused(ngram_options(0, 2, 3), "num_speculative_tokens 0");
  ngram_expect_refused(ngram_options(65, 2, 3), "num_speculative_tokens 65");
  ngram_expect_refused(ngram_options(4, 0, 3), "prompt_lookup_min 0");
  ngram_expect_refused(ngram_options(4, 1, 1025), "prompt_lookup_max 1025");
  ngram_expect_refused(ngram_options(4, 4, 3), "prompt_lookup_min 4 > prompt_lookup_max 3");
}

RC_GTEST_PROP(NgramProposerProperty, MatchesTheDefinition, ()) {
  const auto vocab = *rc::gen::inRange<std::int32_t>(1, 4);
  const auto tokens = *rc::gen::container<std::vector<std::int32_t>>(
      *rc::gen::inRange<std::size_t>(0, 40), rc::gen::inRange<std::int32_t>(0, vocab));
  const auto max = *rc::gen::inRange<std::uint32_t>(1, 12);
  const auto min = *rc::gen::inRange<std::uint32_t>(1, max + 1);
  const auto k = *rc::gen::inRange<std::uint32_t>(1, 8);
  const NgramOptions options = ngram_options(k, min, max);
  RC_ASSERT(check_ngram_options(options).ok());
  RC_ASSERT(ngram_propose(tokens, options) == ngram_reference(tokens, options));
}

}  // namespace
}  // namespace kvvm::engine
