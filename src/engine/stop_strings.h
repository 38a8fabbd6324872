// TextStream: a request's generated text as it streams, with its stop strings. Tokens are
// decoded incrementally (whole UTF-8 characters only); text that could still become the start
// of a stop string is held back, and when a stop string appears the text before it is the
// last that is emitted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvvm/tokenizer/tokenizer.h"

namespace kvvm::engine {

class TextStream {
 public:
  TextStream(const tokenizer::Tokenizer& tokenizer, std::vector<std::string> stop_strings,
             bool skip_special = true);

  // Decodes one more token; appends the text now safe to emit to `out`. Returns true when a
  // stop string appeared (the text before it was appended; nothing after it ever will be).
  bool push(std::int32_t token, std::string& out);
  // The stream ends without a stop string so far: appends what was held back, cut before a
  // stop string if the held text completes one. Returns whether one did.
  bool finish(std::string& out);

 private:
  // Moves what is safe out of pending_ into `out`; true when a stop string matched.
  bool release(std::string& out, bool final);

  tokenizer::StreamDecoder decoder_;
  std::vector<std::string> stop_strings_;
  std::string pending_;  // decoded, not yet emitted
  bool stopped_ = false;
};

}  // namespace kvvm::engine
