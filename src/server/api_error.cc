#include "api_error.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

namespace kvvm::server {

ApiError error_of(int status, std::string type, std::string message, std::string code) {
  ApiError error;
  error.status = status;
  error.type = std::move(type);
  error.message = std::move(message);
  error.code = std::move(code);
  return error;
}

ApiError bad_field(std::string_view param, std::string_view what) {
  ApiError error;
  error.status = 400;
  error.type = "invalid_request_error";
  error.param = std::string(param);
  error.message = std::string(param) + ": " + std::string(what);
  return error;
}

ApiError lost_context_error(std::string_view lost) {
  // A restart takes the model's load, unknown here: soon enough to come back, not a hammering.
  constexpr double kRetryAfterSeconds = 10;
  ApiError error = error_of(503, "unavailable_error", std::string(lost), "device_lost");
  error.retry_after_seconds = kRetryAfterSeconds;
  return error;
}

std::string error_body(const ApiError& error) {
  nlohmann::json inner = {{"message", error.message}, {"type", error.type}};
  inner["param"] = error.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(error.param);
  inner["code"] = error.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(error.code);
  const nlohmann::json body = {{"error", std::move(inner)}};
  // A message may quote bytes the client sent: never throw on invalid UTF-8.
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string retry_after_header(double seconds) {
  // NaN, negatives and anything under a second all say "1"; a day bounds a runaway estimate.
  constexpr double kMaxSeconds = 86400;
  if (!(seconds > 1)) return "1";
  if (seconds > kMaxSeconds) seconds = kMaxSeconds;
  return std::to_string(static_cast<long long>(std::ceil(seconds)));
}

}  // namespace kvvm::server
