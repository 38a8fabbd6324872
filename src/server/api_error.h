// An HTTP error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
//
// Types: "invalid_request_error" (400, 404 of a model, 413), "authentication_error" (401),
// "not_found_error" (404 of a path), "resource_limit_error" (429, with Retry-After: the
// seed server's kind), "unavailable_error" (503 while draining, or once the GPU context was
// lost), "server_error" (500: only for what the server itself broke, never for anything a
// client sent).
#pragma once

#include <string>
#include <string_view>

namespace kvvm::server {

struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // the request field at fault ("messages[1].role"); empty: null
  std::string code;   // a short machine-readable reason; empty: null
  // 429 and 503: the Retry-After header, in whole seconds rounded up (at least 1).
  double retry_after_seconds = 0;
};

// An error of any status; `code` empty: null.
ApiError error_of(int status, std::string type, std::string message, std::string code = {});

// 400 naming the field: message "FIELD: WHAT" (the caller writes WHAT).
ApiError bad_field(std::string_view param, std::string_view what);

// 503 "device_lost": the GPU context is gone (`lost` says how); the process exits so that a
// supervisor restarts it, and Retry-After (10 s) sends the client back when that is likely
// done (or to another replica at once).
ApiError lost_context_error(std::string_view lost);

// The response body (JSON text, UTF-8 safe: invalid bytes in a message are replaced).
std::string error_body(const ApiError& error);

// The Retry-After header's value for `seconds`: ceil, at least 1.
std::string retry_after_header(double seconds);

}  // namespace kvvm::server
