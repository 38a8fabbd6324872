#include "kvvm/base/status.h"

namespace kvvm {

std::string_view to_string(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case StatusCode::kDriverError:
      return "DRIVER_ERROR";
    case StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kInternal:
      return "INTERNAL";
  }
  return "UNKNOWN";
}

Status Status::NotFound(std::string message) {
  return Status(StatusCode::kNotFound, std::move(message));
}

Status Status::InvalidArgument(std::string message) {
  return Status(StatusCode::kInvalidArgument, std::move(message));
}

Status Status::ResourceExhausted(std::string message, Exhaustion numbers) {
  Status status(StatusCode::kResourceExhausted, std::move(message));
  status.exhaustion_ = numbers;
  return status;
}

Status Status::DriverError(std::string message, DriverFailure failure) {
  Status status(StatusCode::kDriverError, std::move(message));
  status.driver_failure_ = std::move(failure);
  return status;
}

Status Status::FailedPrecondition(std::string message) {
  return Status(StatusCode::kFailedPrecondition, std::move(message));
}

Status Status::Unavailable(std::string message) {
  return Status(StatusCode::kUnavailable, std::move(message));
}

Status Status::Internal(std::string message) {
  return Status(StatusCode::kInternal, std::move(message));
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  std::string text(kvvm::to_string(code_));
  text += ": ";
  text += message_;
  return text;
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  Status copy = *this;
  copy.message_ = std::string(context) + ": " + message_;
  return copy;
}

}  // namespace kvvm
