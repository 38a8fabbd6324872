// KVVM_CHECK: the one way kvvm reports a programming error (a broken precondition, a call
// on an object in a state the caller must never put it in). Errors a caller can cause with
// valid use (bad sizes from a user, exhaustion, driver failures) are Status values instead.
//
// Why abort instead of throw or log-and-continue: continuing past a broken invariant of a
// memory manager corrupts state that is read much later, far from the cause. The message
// (file:line, the condition and the explanation) goes through the log sink before aborting,
// so a replaced sink sees it too.
#pragma once

#include <string_view>

namespace kvvm {

// Logs "CHECK failed: file:line: condition: message" at kError and aborts.
[[noreturn]] void check_failed(const char* file, int line, const char* condition,
                               std::string_view message);

}  // namespace kvvm

// `message` (anything convertible to std::string_view, e.g. a std::string built on the spot)
// is evaluated only when `condition` is false.
#define KVVM_CHECK(condition, message)                                 \
  do {                                                                 \
    if (!(condition)) {                                                \
      ::kvvm::check_failed(__FILE__, __LINE__, #condition, (message)); \
    }                                                                  \
  } while (0)
