// How an error travels inside the interpreter: thrown from where it is found, given the line and
// column of the innermost node that was being evaluated, and turned into a Status at the public
// boundary (template.cc). Never thrown past Template's API.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace kvvm::jinja::detail {

struct SourcePos {
  std::uint32_t line = 0;  // 1-based; 0: not known yet
  std::uint32_t column = 0;
};

struct TemplateError {
  enum class Kind { kInvalid, kExhausted, kRaised };
  Kind kind = Kind::kInvalid;
  std::string message;
  SourcePos pos;
  std::uint64_t requested = 0;  // kExhausted: what was asked for, and the bound it passed
  std::uint64_t limit = 0;
};

[[noreturn]] inline void fail(std::string message) {
  throw TemplateError{TemplateError::Kind::kInvalid, std::move(message), {}};
}
[[noreturn]] inline void fail_at(SourcePos pos, std::string message) {
  throw TemplateError{TemplateError::Kind::kInvalid, std::move(message), pos};
}

// A limit reached: "`what` exceeds `bound` (limit)", with the numbers for the Status.
[[noreturn]] inline void exhausted(std::string_view what, std::string_view bound,
                                   std::uint64_t requested, std::uint64_t limit,
                                   SourcePos pos = {}) {
  throw TemplateError{
      TemplateError::Kind::kExhausted,
      std::string(what) + " exceeds " + std::string(bound) + " (" + std::to_string(limit) + ")",
      pos, requested, limit};
}

}  // namespace kvvm::jinja::detail
