// TextStream: incremental decoding with stop strings held back until they cannot match.
#include "stop_strings.h"

#include <algorithm>
#include <string_view>
#include <utility>

namespace kvvm::engine {

TextStream::TextStream(const tokenizer::Tokenizer& tokenizer, std::vector<std::string> stop_strings,
                       bool skip_special)
    // Special tokens (an end token the request chose to ignore, say) are not text, unless
    // the request reads them (a tool-call format spelled in special tokens).
    : decoder_(tokenizer, skip_special), stop_strings_(std::move(stop_strings)) {}

bool TextStream::push(std::int32_t token, std::string& out) {
  if (stopped_) return true;
  pending_ += decoder_.push(token);
  return release(out, /*final=*/false);
}

bool TextStream::finish(std::string& out) {
  if (stopped_) return true;
  pending_ += decoder_.finish();
  return release(out, /*final=*/true);
}

bool TextStream::release(std::string& out, bool final) {
  // The earliest stop string wins: nothing after its start is ever emitted.
  std::size_t cut = std::string::npos;
  for (const std::string& stop : stop_strings_) {
    if (!stop.empty()) cut = std::min(cut, pending_.find(stop));
  }
  if (cut != std::string::npos) {
    out.append(pending_, 0, cut);
    pending_.clear();
    stopped_ = true;
    return true;
  }
  // Hold back the longest tail of the pending text that a stop string starts with: the next
  // token may complete it. Stop strings are whole UTF-8, so the tail starts on a character.
  std::size_t hold = 0;
  if (!final) {
    const std::string_view text(pending_);
    for (const std::string& stop : stop_strings_) {
      if (stop.empty()) continue;  // refused at submit; never a hold of size_t(-1)
      const std::size_t longest = std::min(stop.size() - 1, text.size());
      for (std::size_t n = longest; n > hold; --n) {
        if (text.substr(text.size() - n) == std::string_view(stop).substr(0, n)) {
          hold = n;
          break;
        }
      }
    }
  }
  out.append(pending_, 0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return false;
}

}  // namespace kvvm::engine
