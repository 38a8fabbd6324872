// Reasoning in a model's text, split from its answer as vLLM's reasoning parsers split it
// (--reasoning-parser qwen3 / deepseek_r1): Qwen3 and DeepSeek-R1 think inside
// <think>...</think> before they answer. What is inside is `reasoning_content`; what follows
// </think> is `content` (where the tool-call parser reads calls: the server splits reasoning
// first).
//
// The rules, for both (they differ in vLLM only in the defaults its callers pass):
// - A <think> that opens the answer (after blanks) is dropped, and so are those blanks; the
//   model writes it itself under Qwen3's template, while DeepSeek-R1's generation prompt has
//   already written it (the answer then starts inside reasoning).
// - Everything up to the first </think> is reasoning, as the model wrote it.
// - Blanks right after </think> (the template's "\n\n") are dropped, as Qwen3's template drops
//   them when it reads an answer back; the rest is content, verbatim.
// - No </think> at all: with `thinking` (the default; the answer starts in reasoning), all of
//   it is reasoning, as vLLM reads an answer cut short by max_tokens; without (Qwen3 with
//   enable_thinking false, whose prompt closed an empty <think></think>), all of it is
//   content unless it opened with <think> itself.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kvvm/base/status.h"

namespace kvvm::server {

enum class ReasoningFormat : std::uint8_t { kNone, kThinkTags };
std::string_view to_string(ReasoningFormat format);  // "none", "think_tags"
// vLLM's names: "qwen3" and "deepseek_r1" (both kThinkTags), and "none"; InvalidArgument
// naming them otherwise.
Result<ReasoningFormat> parse_reasoning_format(std::string_view name);
// kThinkTags when a chat template writes <think> and </think> (Qwen3's, DeepSeek-R1's), kNone
// otherwise.
ReasoningFormat detect_reasoning_format(std::string_view template_source);
// Whether a rendered prompt ends with a closed think block (blanks after it allowed): Qwen3's
// template with enable_thinking false writes "<think>\n\n</think>\n\n" for the model, which
// then does not think. The `thinking` argument below is the negation.
bool prompt_closes_reasoning(std::string_view prompt);

struct ReasoningSplit {
  std::string reasoning;
  std::string content;
  bool empty() const { return reasoning.empty() && content.empty(); }
};

// The whole answer at once.
ReasoningSplit split_reasoning(ReasoningFormat format, std::string_view text, bool thinking = true);

// Streamed text in, the next pieces of reasoning and content out; accumulated over a whole
// answer they equal split_reasoning() of its text. Text that may be the start of a tag (and a
// character's incomplete UTF-8) is held back until it is decided.
class ReasoningStream {
 public:
  explicit ReasoningStream(ReasoningFormat format, bool thinking = true);
  ReasoningSplit push(std::string_view text);
  ReasoningSplit finish();

 private:
  enum class State : std::uint8_t { kStart, kReasoning, kAfterEnd, kContent };
  void run(bool at_end, ReasoningSplit& out);
  void release_utf8(ReasoningSplit& out, bool at_end);

  bool thinking_;
  State state_;
  std::string text_;  // everything pushed
  std::size_t pos_ = 0;
  std::string partial_reasoning_, partial_content_;  // incomplete last characters, held
};

}  // namespace kvvm::server
