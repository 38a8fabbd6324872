// Status and Result<T>: every fallible kvvm call returns one of these.
//
// Why not exceptions: the callers are schedulers that must turn "out of memory" into
// backpressure (queue, preempt, HTTP 429), so exhaustion is a value with numbers in it, and
// a driver failure names the driver call and its error so an operator can act on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "kvvm/base/check.h"

namespace kvvm {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the caller asked for something malformed; nothing changed
  kResourceExhausted,   // out of budget or memory; carries requested / available / limit
  kDriverError,         // a driver call failed; carries the call and the driver's error name
  kFailedPrecondition,  // the object is not in a state that allows the call
  kUnavailable,         // not possible now (no GPU, graph capture in progress); may be later
  kNotFound,            // a file, tensor or entry that was asked for does not exist
  kInternal,            // a broken invariant inside kvvm
};

std::string_view to_string(StatusCode code);

// Numbers behind a ResourceExhausted status, in bytes.
struct Exhaustion {
  std::uint64_t requested = 0;
  std::uint64_t available = 0;
  std::uint64_t limit = 0;
};

// What a failed driver call said.
struct DriverFailure {
  std::string call;        // e.g. "cuMemMap", "mmap"
  std::string error_name;  // e.g. "CUDA_ERROR_OUT_OF_MEMORY", "ENOMEM"
  int error_code = 0;
};

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string message);
  static Status ResourceExhausted(std::string message, Exhaustion numbers);
  static Status DriverError(std::string message, DriverFailure failure);
  static Status FailedPrecondition(std::string message);
  static Status Unavailable(std::string message);
  static Status NotFound(std::string message);
  static Status Internal(std::string message);

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  const std::optional<Exhaustion>& exhaustion() const { return exhaustion_; }
  const std::optional<DriverFailure>& driver_failure() const { return driver_failure_; }

  // "RESOURCE_EXHAUSTED: <message>": for logs and test failure output.
  std::string to_string() const;

  // Returns a copy whose message is prefixed with `context + ": "`; numbers are kept.
  Status with_context(std::string_view context) const;

  // Explicitly discards a status where ignoring it is the decision (destructors, best-effort
  // cleanup). The one way a Status is dropped; `(void)` is for other [[nodiscard]] values.
  void ignore() const {}

 private:
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  std::optional<Exhaustion> exhaustion_;
  std::optional<DriverFailure> driver_failure_;
};

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : state_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(state_).ok()) {
      state_ = Status::Internal("Result constructed from an OK status without a value");
    }
  }

  bool ok() const { return std::holds_alternative<T>(state_); }
  // REQUIRES: !ok() for a meaningful status; returns OK when a value is held.
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(state_); }

  // REQUIRES: ok(). Breaking this is a programming error: KVVM_CHECK names the status.
  T& value() & {
    check_ok();
    return std::get<T>(state_);
  }
  const T& value() const& {
    check_ok();
    return std::get<T>(state_);
  }
  T&& value() && {
    check_ok();
    return std::get<T>(std::move(state_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

 private:
  void check_ok() const {
    KVVM_CHECK(ok(), "value() of a Result that holds " + std::get<Status>(state_).to_string());
  }

  std::variant<T, Status> state_;
};

}  // namespace kvvm

// Propagates a non-OK Status to the caller.
#define KVVM_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::kvvm::Status kvvm_status_ = (expr);        \
    if (!kvvm_status_.ok()) return kvvm_status_; \
  } while (0)

// Declares or assigns `lhs` from a Result's value, or returns its status to the caller:
//   KVVM_ASSIGN_OR_RETURN(SlotId slot, arena.admit(tokens));
//   KVVM_ASSIGN_OR_RETURN(auto engine, Engine::create(model, kv, options));
// The Result is a temporary named after the line, so several may share a scope.
#define KVVM_ASSIGN_OR_RETURN(lhs, rexpr) \
  KVVM_ASSIGN_OR_RETURN_IMPL_(KVVM_STATUS_CONCAT_(kvvm_result_, __LINE__), lhs, rexpr)
#define KVVM_ASSIGN_OR_RETURN_IMPL_(result, lhs, rexpr) \
  auto result = (rexpr);                                \
  if (!result.ok()) return std::move(result).status();  \
  lhs = std::move(result).value()
#define KVVM_STATUS_CONCAT_(a, b) KVVM_STATUS_CONCAT_INNER_(a, b)
#define KVVM_STATUS_CONCAT_INNER_(a, b) a##b
