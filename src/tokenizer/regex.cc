#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/utf8.h"

namespace kvvm::tokenizer::detail {
namespace {

pcre2_code* as_code(void* code) { return static_cast<pcre2_code*>(code); }

std::string pcre2_message(int error) {
  PCRE2_UCHAR buffer[256];
  const int length = pcre2_get_error_message(error, buffer, sizeof buffer);
  if (length < 0) return "PCRE2 error " + std::to_string(error);
  return std::string(reinterpret_cast<const char*>(buffer), static_cast<std::size_t>(length));
}

struct MatchData {
  explicit MatchData(const pcre2_code* code)
      : data(pcre2_match_data_create_from_pattern(code, nullptr)) {}
  ~MatchData() { pcre2_match_data_free(data); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
  pcre2_match_data* data;
};

}  // namespace

Result<std::unique_ptr<Regex>> Regex::compile(std::string_view pattern, bool literal,
                                              std::string_view where) {
  // PCRE2_LITERAL takes no UCP (it has no classes for UCP to change). MULTILINE: Hugging Face
  // compiles the patterns with Oniguruma's Ruby syntax, where ^ and $ match at every line's
  // start and end (DeepSeek's "\s+$").
  const std::uint32_t options =
      PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error, &offset, nullptr);
  if (code == nullptr) {
    return Status::InvalidArgument(std::string(where) + ": pattern '" + std::string(pattern) +
                                   "' does not compile at offset " + std::to_string(offset) + ": " +
                                   pcre2_message(error));
  }
  // Without JIT (a platform PCRE2 has no JIT for) the interpreter gives the same matches.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Regex>(new Regex(code));
}

Regex::~Regex() { pcre2_code_free(as_code(code_)); }

std::vector<Match> Regex::find_all(std::string_view text) const {
  std::vector<Match> matches;
  const pcre2_code* code = as_code(code_);
  MatchData match(code);
  if (match.data == nullptr) return matches;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t offset = 0;
  while (offset < text.size()) {
    int rc = pcre2_match(code, subject, text.size(), offset, 0, match.data, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // The JIT's small default stack ran out: the interpreter keeps its frames on the heap.
      rc = pcre2_match(code, subject, text.size(), offset, PCRE2_NO_JIT, match.data, nullptr);
    }
    // No match, or a limit hit even so: the rest stays one unmatched stretch.
    if (rc < 0) break;
    const PCRE2_SIZE* range = pcre2_get_ovector_pointer(match.data);
    const std::size_t begin = range[0];
    const std::size_t end = range[1];
    if (end > begin) {
      matches.push_back({begin, end});
      offset = end;
    } else {
      // An empty match splits nothing: step over one character (or one stray byte).
      const std::size_t length = utf8_length(text, begin);
      offset = begin + (length == 0 ? 1 : length);
    }
  }
  return matches;
}

}  // namespace kvvm::tokenizer::detail
