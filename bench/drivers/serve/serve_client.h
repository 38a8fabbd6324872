// The HTTP side of `kvvm bench serve`: one streamed OpenAI request (POST, Server-Sent Events
// read as they arrive, timed), GET /v1/models, and the SSE framing they need. Works against
// any OpenAI-compatible server (kvvm serve, vLLM, the HF wrapper in scripts/): only
// `choices[0].text` (completions) or `choices[0].delta.content` (chat), `usage` and
// `data: [DONE]` are read.
//
// Timing: the time to first token is the first content chunk (completions: any chunk whose
// first choice has a "text" string, even an empty one, since a token may decode to part of a
// UTF-8 character; chat: a non-empty delta.content, since chat servers open with an empty
// role chunk); the last content chunk ends the decode. Output tokens are the usage chunk's
// completion_tokens; without one (a server that ignores stream_options) the content chunks
// are counted instead and the outcome says so.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/base/status.h"

namespace httplib {
class Client;
}  // namespace httplib

namespace kvvm::cli {

using Clock = std::chrono::steady_clock;

// Bounds on what a server sends back: an SSE line, and the part of an error body kept for the
// report (the rest is read and dropped).
inline constexpr std::size_t kMaxSseLineBytes = std::size_t{1} << 20;
inline constexpr std::size_t kMaxErrorBodyBytes = 4096;
// A Retry-After past a day is not a server asking to retry: it is refused as malformed.
inline constexpr double kMaxRetryAfterSeconds = 86400;

// "http[s]://host[:port][/prefix]": the prefix (without a trailing "/" or "/v1") goes before
// every "/v1/..." path.
struct ServeUrl {
  std::string scheme = "http";
  std::string host;
  int port = 80;
  std::string prefix;  // "" or "/something"
  std::string text;    // as given, for messages
};
Result<ServeUrl> parse_serve_url(std::string_view url);

struct ClientSettings {
  ServeUrl url;
  std::string api_key;    // empty: no Authorization header
  double timeout_s = 60;  // the longest wait for one read or write
  double connect_s = 10;  // the longest wait to connect
};

// Splits a byte stream into Server-Sent Events: `on_data` gets each event's data lines joined
// with "\n" (events without data are skipped); comment lines (":...") and other fields are
// ignored. A line past kMaxSseLineBytes makes feed() return false (and stick).
class SseParser {
 public:
  explicit SseParser(std::function<bool(const std::string&)> on_data);
  // False when a line was too long or on_data returned false (stop reading).
  bool feed(std::string_view bytes);
  // Dispatches an event left without its blank line at the end of the stream.
  bool finish();

 private:
  bool line(std::string_view text);
  std::function<bool(const std::string&)> on_data_;
  std::string pending_;  // a partial line
  std::string data_;     // the event being read
  bool has_data_ = false;
  bool failed_ = false;
};

enum class OutcomeKind : std::uint8_t {
  kCompleted,   // 200, the stream ended with [DONE]
  kRejected,    // 429 with a valid Retry-After
  kHttpError,   // any other status, or a 429 without a valid Retry-After
  kConnection,  // no HTTP response: refused, reset, timed out
  kStream,      // 200 but the stream broke: an error event, bad JSON, no [DONE], a read timeout
  kCancelled,   // closed by the bench (--duration's grace ran out)
};
const char* to_string(OutcomeKind kind);

struct StreamOutcome {
  OutcomeKind kind = OutcomeKind::kConnection;
  int status = 0;                       // 0: no response
  std::optional<double> retry_after_s;  // a 429's valid Retry-After
  std::string error;                    // what went wrong, for the report
  std::optional<Clock::time_point> first_token, last_token;
  Clock::time_point end{};
  std::uint64_t content_chunks = 0;
  std::uint64_t output_tokens = 0;  // usage.completion_tokens, else content_chunks
  std::uint64_t prompt_tokens = 0;  // usage.prompt_tokens (0 without usage)
  bool usage = false;               // a usage chunk arrived
};

// Retry-After as delay-seconds (RFC 9110: a non-negative decimal integer; a fraction is
// accepted too, as some servers send one); nullopt for anything else (an HTTP date included).
std::optional<double> parse_retry_after(std::string_view value);

// One streamed request; cancel() may be called from any thread, any number of times, before,
// during or after run().
class StreamingCall {
 public:
  StreamingCall(const ClientSettings& settings, std::string path, std::string body, bool chat);
  ~StreamingCall();
  StreamingCall(const StreamingCall&) = delete;
  StreamingCall& operator=(const StreamingCall&) = delete;

  // Sends the request and reads the stream to its end (blocking).
  StreamOutcome run();
  // Closes the connection under run(), which then returns kCancelled.
  void cancel();

 private:
  bool on_event(const std::string& data, StreamOutcome& outcome);
  std::unique_ptr<httplib::Client> client_;
  std::string path_, body_;
  bool chat_ = false;
  std::atomic<bool> cancelled_{false};
  bool done_ = false;  // [DONE] seen (run()'s thread only)
};

// The model ids of GET {prefix}/v1/models, in the server's order. Unavailable (naming the URL
// and the error) when the server cannot be reached; FailedPrecondition for a status other than
// 200 or a body without {"data": [{"id": ...}]}.
Result<std::vector<std::string>> list_models(const ClientSettings& settings);

}  // namespace kvvm::cli
