#include "bench/drivers/serve/serve_client.h"

#include <httplib.h>

#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>
#include <utility>

#include "base/json_reader.h"

namespace kvvm::cli {
namespace {

std::chrono::microseconds to_micros(double seconds) {
  return std::chrono::microseconds(static_cast<std::int64_t>(seconds * 1e6));
}

std::unique_ptr<httplib::Client> make_client(const ClientSettings& settings) {
  auto client = std::make_unique<httplib::Client>(settings.url.scheme + "://" + settings.url.host +
                                                  ":" + std::to_string(settings.url.port));
  client->set_connection_timeout(to_micros(settings.connect_s));
  client->set_read_timeout(to_micros(settings.timeout_s));
  client->set_write_timeout(to_micros(settings.timeout_s));
  // One request per connection: a cancelled or broken stream leaves nothing to reuse.
  client->set_keep_alive(false);
  if (!settings.api_key.empty()) client->set_bearer_token_auth(settings.api_key);
  return client;
}

std::string connection_error(const ClientSettings& settings, httplib::Error error) {
  return "cannot reach " + settings.url.text + ": " + httplib::to_string(error);
}

// The first bytes of an error body, on one line, for the report.
std::string body_excerpt(const std::string& body) {
  std::string text = body.substr(0, 200);
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

}  // namespace

Result<ServeUrl> parse_serve_url(std::string_view url) {
  ServeUrl parsed;
  parsed.text = std::string(url);
  std::string_view rest;
  if (url.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else if (url.rfind("https://", 0) == 0) {
    parsed.scheme = "https";
    parsed.port = 443;
    rest = url.substr(8);
  } else {
    return Status::InvalidArgument("--url '" + parsed.text +
                                   "' must start with http:// or https:// (e.g. "
                                   "http://127.0.0.1:8000)");
  }
  const std::size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? "" : rest.substr(slash);
  if (authority.find('@') != std::string_view::npos || authority.find('[') == 0) {
    return Status::InvalidArgument("--url " + parsed.text +
                                   ": give http://HOST[:PORT] (no user info, no IPv6 literal)");
  }
  const std::size_t colon = authority.rfind(':');
  std::string_view host = authority.substr(0, colon);
  if (colon != std::string_view::npos) {
    std::string_view port_text = authority.substr(colon + 1);
    unsigned port = 0;
    const auto [end, ec] =
        std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (port_text.empty() || ec != std::errc() || end != port_text.data() + port_text.size() ||
        port == 0 || port > 65535) {
      return Status::InvalidArgument("--url " + parsed.text + ": port '" + std::string(port_text) +
                                     "' must be a number in [1, 65535]");
    }
    parsed.port = static_cast<int>(port);
  }
  if (host.empty()) return Status::InvalidArgument("--url " + parsed.text + ": no host");
  parsed.host = std::string(host);
  const std::size_t query = path.find_first_of("?#");
  if (query != std::string_view::npos) {
    return Status::InvalidArgument("--url " + parsed.text + ": no query or fragment, please");
  }
  std::string prefix(path);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  // "http://host:8000/v1" is how OpenAI clients spell the base URL: the paths add "/v1".
  if (prefix.size() >= 3 && prefix.compare(prefix.size() - 3, 3, "/v1") == 0) {
    prefix.resize(prefix.size() - 3);
  }
  parsed.prefix = prefix;
  return parsed;
}

SseParser::SseParser(std::function<bool(const std::string&)> on_data)
    : on_data_(std::move(on_data)) {}

bool SseParser::feed(std::string_view bytes) {
  while (!failed_ && !bytes.empty()) {
    const std::size_t newline = bytes.find('\n');
    if (newline == std::string_view::npos) {
      if (pending_.size() + bytes.size() > kMaxSseLineBytes) {
        failed_ = true;
        break;
      }
      pending_.append(bytes);
      break;
    }
    std::string_view piece = bytes.substr(0, newline);
    bytes.remove_prefix(newline + 1);
    bool ok = false;
    if (pending_.empty()) {
      ok = line(piece);
    } else {
      if (pending_.size() + piece.size() > kMaxSseLineBytes) {
        failed_ = true;
        break;
      }
      pending_.append(piece);
      std::string whole = std::move(pending_);
      pending_.clear();
      ok = line(whole);
    }
    if (!ok) failed_ = true;
  }
  return !failed_;
}

bool SseParser::finish() {
  if (failed_) return false;
  if (!pending_.empty()) {
    std::string whole = std::move(pending_);
    pending_.clear();
    if (!line(whole)) return false;
  }
  return line("");
}

bool SseParser::line(std::string_view text) {
  if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
  if (text.empty()) {  // the blank line that ends an event
    if (!has_data_) return true;
    has_data_ = false;
    std::string data = std::move(data_);
    data_.clear();
    return on_data_(data);
  }
  if (text.front() == ':') return true;  // a comment (keep-alive)
  const std::size_t colon = text.find(':');
  std::string_view field = text.substr(0, colon);
  if (field != "data") return true;
  std::string_view value = colon == std::string_view::npos ? "" : text.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (data_.size() + value.size() + 1 > kMaxSseLineBytes) return false;
  if (has_data_) data_.push_back('\n');
  data_.append(value);
  has_data_ = true;
  return true;
}

const char* to_string(OutcomeKind kind) {
  switch (kind) {
    case OutcomeKind::kCompleted:
      return "completed";
    case OutcomeKind::kRejected:
      return "rejected";
    case OutcomeKind::kHttpError:
      return "http error";
    case OutcomeKind::kConnection:
      return "connection";
    case OutcomeKind::kStream:
      return "stream";
    case OutcomeKind::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

std::optional<double> parse_retry_after(std::string_view value) {
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
  if (value.empty()) return std::nullopt;
  for (char c : value) {
    if ((c < '0' || c > '9') && c != '.') return std::nullopt;  // no sign, exponent or date
  }
  double seconds = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), seconds);
  if (ec != std::errc() || end != value.data() + value.size() || !std::isfinite(seconds) ||
      seconds > kMaxRetryAfterSeconds) {
    return std::nullopt;
  }
  return seconds;
}

StreamingCall::StreamingCall(const ClientSettings& settings, std::string path, std::string body,
                             bool chat)
    : client_(make_client(settings)), path_(std::move(path)), body_(std::move(body)), chat_(chat) {}

StreamingCall::~StreamingCall() = default;

void StreamingCall::cancel() {
  cancelled_.store(true);
  // Shuts the socket down under a read in progress; before the connection exists it does
  // nothing, which is why the driver calls it until run() returns.
  client_->stop();
}

bool StreamingCall::on_event(const std::string& data, StreamOutcome& outcome) {
  if (data == "[DONE]") {
    done_ = true;
    return true;
  }
  if (done_) {
    outcome.error = "data after [DONE]";
    return false;
  }
  JsonLimits limits;
  limits.max_bytes = kMaxSseLineBytes;
  Result<nlohmann::json> read = read_json(data, limits, "an SSE event");
  if (!read.ok()) {
    outcome.error = read.status().message();
    return false;
  }
  const nlohmann::json& event = *read;
  if (!event.is_object()) {
    outcome.error = "an SSE event is not a JSON object: " + body_excerpt(data);
    return false;
  }
  if (event.contains("error")) {
    const nlohmann::json& error = event["error"];
    outcome.error = "error event: " +
                    (error.is_object() && error.contains("message") && error["message"].is_string()
                         ? error["message"].get<std::string>()
                         : body_excerpt(data));
    return false;
  }
  const auto it = event.find("choices");
  if (it != event.end() && it->is_array() && !it->empty() && (*it)[0].is_object()) {
    const nlohmann::json& choice = (*it)[0];
    bool content = false;
    if (chat_) {
      const auto delta = choice.find("delta");
      if (delta != choice.end() && delta->is_object()) {
        const auto text = delta->find("content");
        content = text != delta->end() && text->is_string() && !text->get<std::string>().empty();
      }
    } else {
      const auto text = choice.find("text");
      content = text != choice.end() && text->is_string();
    }
    if (content) {
      const Clock::time_point now = Clock::now();
      if (!outcome.first_token) outcome.first_token = now;
      outcome.last_token = now;
      ++outcome.content_chunks;
    }
  }
  const auto usage = event.find("usage");
  if (usage != event.end() && usage->is_object()) {
    const auto completion = usage->find("completion_tokens");
    if (completion != usage->end() && completion->is_number_unsigned()) {
      outcome.usage = true;
      outcome.output_tokens = completion->get<std::uint64_t>();
    }
    const auto prompt = usage->find("prompt_tokens");
    if (prompt != usage->end() && prompt->is_number_unsigned()) {
      outcome.prompt_tokens = prompt->get<std::uint64_t>();
    }
  }
  return true;
}

StreamOutcome StreamingCall::run() {
  StreamOutcome outcome;
  std::string error_body;
  bool stream_broke = false;
  SseParser parser([&](const std::string& data) {
    if (!on_event(data, outcome)) {
      stream_broke = true;
      return false;
    }
    return true;
  });

  httplib::Request request;
  request.method = "POST";
  request.path = path_;
  request.body = body_;
  request.headers = {{"Content-Type", "application/json"}, {"Accept", "text/event-stream"}};
  request.response_handler = [&](const httplib::Response& response) {
    outcome.status = response.status;
    if (response.status == 429 && response.has_header("Retry-After")) {
      outcome.retry_after_s = parse_retry_after(response.get_header_value("Retry-After"));
    }
    return !cancelled_.load();
  };
  request.content_receiver = [&](const char* data, std::size_t size, std::uint64_t, std::uint64_t) {
    if (cancelled_.load()) return false;
    if (outcome.status != 200) {
      if (error_body.size() < kMaxErrorBodyBytes) {
        error_body.append(data, std::min(size, kMaxErrorBodyBytes - error_body.size()));
      }
      return true;
    }
    if (!parser.feed(std::string_view(data, size))) {
      if (!stream_broke)
        outcome.error = "an SSE line over " + std::to_string(kMaxSseLineBytes) + " bytes";
      stream_broke = true;
      return false;
    }
    return true;
  };

  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  bool sent = false;
  if (!cancelled_.load()) sent = client_->send(request, response, error);
  outcome.end = Clock::now();
  if (cancelled_.load()) {
    outcome.kind = OutcomeKind::kCancelled;
    outcome.error = "cancelled by the bench";
    return outcome;
  }
  if (!outcome.usage) outcome.output_tokens = outcome.content_chunks;
  if (outcome.status == 0) {
    outcome.kind = OutcomeKind::kConnection;
    outcome.error = httplib::to_string(error);
    return outcome;
  }
  if (outcome.status != 200) {
    if (outcome.status == 429 && outcome.retry_after_s) {
      outcome.kind = OutcomeKind::kRejected;
      return outcome;
    }
    outcome.kind = OutcomeKind::kHttpError;
    outcome.error = "HTTP " + std::to_string(outcome.status) +
                    (outcome.status == 429 ? " without a valid Retry-After" : "") + ": " +
                    body_excerpt(error_body);
    return outcome;
  }
  if (!stream_broke && sent && !parser.finish()) stream_broke = true;
  if (stream_broke || !sent || !done_) {
    outcome.kind = OutcomeKind::kStream;
    if (outcome.error.empty()) {
      outcome.error = !sent ? "the stream broke: " + httplib::to_string(error)
                            : "the stream ended without data: [DONE]";
    }
    return outcome;
  }
  outcome.kind = OutcomeKind::kCompleted;
  return outcome;
}

Result<std::vector<std::string>> list_models(const ClientSettings& settings) {
  std::unique_ptr<httplib::Client> client = make_client(settings);
  httplib::Result result = client->Get(settings.url.prefix + "/v1/models");
  if (!result) return Status::Unavailable(connection_error(settings, result.error()));
  const std::string where = "GET " + settings.url.text + settings.url.prefix + "/v1/models";
  if (result->status != 200) {
    return Status::FailedPrecondition(where + " answered HTTP " + std::to_string(result->status) +
                                      ": " + body_excerpt(result->body));
  }
  Result<nlohmann::json> read = read_json(result->body, {}, where);
  if (!read.ok()) return Status::FailedPrecondition(read.status().message());
  std::vector<std::string> ids;
  const nlohmann::json& body = *read;
  if (body.is_object() && body.contains("data") && body["data"].is_array()) {
    for (const nlohmann::json& model : body["data"]) {
      if (model.is_object() && model.contains("id") && model["id"].is_string()) {
        ids.push_back(model["id"].get<std::string>());
      }
    }
  }
  if (ids.empty()) {
    return Status::FailedPrecondition(where + " lists no model ({\"data\": [{\"id\": ...}]}): " +
                                      body_excerpt(result->body) + "; give --model");
  }
  return ids;
}

}  // namespace kvvm::cli
