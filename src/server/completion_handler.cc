#include "completion_handler.h"

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "api_error.h"
#include "openai_response.h"
#include "request_stream.h"

namespace kvvm::server {
namespace {

using engine::RequestEnd;

// Every wait on the engine is this long at most; the loops around it re-check. The engine
// guarantees a last event for every submitted request (a drain cancels what is left), so the
// loops end.
constexpr std::chrono::milliseconds kWaitSlice{200};

// A refused submit: the engine's status as an HTTP answer.
ApiError submit_error(const Status& status, double retry_after) {
  switch (status.code()) {
    case StatusCode::kResourceExhausted: {
      ApiError error = error_of(429, "resource_limit_error",
                                "the server is overloaded: " + status.message(), "overloaded");
      error.retry_after_seconds = retry_after;
      return error;
    }
    case StatusCode::kInvalidArgument:
      return error_of(400, "invalid_request_error", status.message(), "");
    case StatusCode::kUnavailable:
      return error_of(503, "unavailable_error",
                      "the server is not accepting requests: " + status.message(), "draining");
    default:
      return error_of(500, "server_error", "the engine refused the request: " + status.to_string(),
                      "");
  }
}

// A request that ended without an answer (kError, kCancelled).
ApiError end_error(const StreamUpdate& update) {
  if (update.end == RequestEnd::kError && update.retry_after_seconds > 0) {
    ApiError error = error_of(429, "resource_limit_error",
                              "the server is overloaded: " + update.error.message(), "overloaded");
    error.retry_after_seconds = update.retry_after_seconds;
    return error;
  }
  if (update.end == RequestEnd::kCancelled) {
    return error_of(503, "unavailable_error",
                    "the request was cancelled: the server is shutting down", "cancelled");
  }
  // Whatever a client sent was checked before submit: a failure now is the server's own.
  return error_of(500, "server_error", "generation failed: " + update.error.to_string(), "");
}

bool succeeded(RequestEnd end) { return end == RequestEnd::kStop || end == RequestEnd::kLength; }

// Appends `more` (taken later) to `into`.
void merge(StreamUpdate& into, StreamUpdate more) {
  into.text += more.text;
  into.tokens += more.tokens;
  if (more.finished) {
    into.finished = true;
    into.end = more.end;
    into.error = std::move(more.error);
    into.retry_after_seconds = more.retry_after_seconds;
    into.stats = more.stats;
  }
}

ResponseHead head_of(const ApiRequest& request) {
  ResponseHead head;
  head.endpoint = request.endpoint;
  head.id = response_id(request.endpoint);
  head.created = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  head.model = request.model;
  return head;
}

// Counts a streamed answer in flight for as long as it lives.
class InFlight {
 public:
  explicit InFlight(std::atomic<int>* count) : count_(count) {
    if (count_ != nullptr) ++*count_;
  }
  ~InFlight() {
    if (count_ != nullptr) --*count_;
  }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  std::atomic<int>* count_;
};

// What the SSE provider carries from one call to the next.
struct StreamState {
  std::unique_ptr<InFlight> in_flight;  // until the provider is destroyed with the response
  CompletionContext context;
  std::shared_ptr<RequestStream> stream;
  engine::RequestId id = 0;
  ResponseHead head;
  bool include_usage = false;
  bool first = true;
  bool done = false;
  StreamUpdate pending;  // taken before the status line was sent
};

// The SSE text for `update`; marks the state done at the finish.
// As OpenAI's: the role in the first chunk, the finish reason in the last content chunk (or,
// when the end brings no text, in a chunk of its own with an empty delta), the usage chunk
// only when asked for, [DONE] last.
std::string sse_text(StreamState& state, const StreamUpdate& update) {
  std::string out;
  const bool finishes_here = update.finished && succeeded(update.end);
  if (!update.text.empty()) {
    std::optional<std::string_view> finish;
    if (finishes_here) finish = finish_reason(update.end);
    out +=
        sse_event(stream_chunk(state.head, update.text, state.first, finish, state.include_usage));
    state.first = false;
  }
  if (!update.finished) return out;
  state.done = true;
  if (finishes_here) {
    if (update.text.empty()) {
      out += sse_event(stream_chunk(state.head, "", state.first, finish_reason(update.end),
                                    state.include_usage));
    }
    if (state.include_usage) out += sse_event(usage_chunk(state.head, usage_of(update.stats)));
    state.context.metrics->observe_finished(update.stats, update.end,
                                            state.stream->inter_token_seconds());
  } else {
    // The status line has gone: the failure travels as an error event, as vLLM sends one.
    out += "data: " + error_body(end_error(update)) + "\n\n";
  }
  out += kSseDone;
  return out;
}

void stream_answer(const CompletionContext& context, const ApiRequest& request,
                   std::shared_ptr<RequestStream> stream, engine::RequestId id,
                   httplib::Response& res) {
  auto in_flight = std::make_unique<InFlight>(context.streams_in_flight);
  // Wait for the first event before any status is sent: a refusal in the queue must still be
  // an HTTP error.
  StreamUpdate first;
  while (first.empty()) first = stream->take(kWaitSlice);
  if (first.finished && !succeeded(first.end)) {
    reply_error(res, end_error(first));
    return;
  }
  auto state = std::make_shared<StreamState>();
  state->in_flight = std::move(in_flight);
  state->context = context;
  state->stream = std::move(stream);
  state->id = id;
  state->head = head_of(request);
  state->include_usage = request.include_usage;
  state->pending = std::move(first);

  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [state](std::size_t /*offset*/, httplib::DataSink& sink) {
        if (state->done) {
          sink.done();
          return true;
        }
        StreamUpdate update = state->pending.empty() ? state->stream->take(kWaitSlice)
                                                     : std::exchange(state->pending, {});
        // Nothing yet: the library calls again (each call waits kWaitSlice at most).
        if (update.empty()) return true;
        const std::string text = sse_text(*state, update);
        if (!text.empty() && !sink.write(text.data(), text.size())) {
          // The client went away: free its sequence at the engine's next step.
          state->context.engine->cancel(state->id);
          return false;
        }
        if (state->done) sink.done();
        return true;
      },
      [state](bool success) {
        // The connection failed before the stream's end (a write, or the status line).
        if (!success && !state->done) state->context.engine->cancel(state->id);
      });
}

void whole_answer(const CompletionContext& context, const ApiRequest& request,
                  const std::shared_ptr<RequestStream>& stream, httplib::Response& res) {
  StreamUpdate all;
  while (!all.finished) merge(all, stream->take(kWaitSlice));
  if (!succeeded(all.end)) {
    reply_error(res, end_error(all));
    return;
  }
  context.metrics->observe_finished(all.stats, all.end, stream->inter_token_seconds());
  const nlohmann::json body =
      completion_body(head_of(request), all.text, finish_reason(all.end), usage_of(all.stats));
  res.status = 200;
  res.set_content(dump_json(body), "application/json");
}

}  // namespace

void reply_error(httplib::Response& res, const ApiError& error) {
  res.status = error.status;
  if (error.status == 429 || error.status == 503) {
    res.set_header("Retry-After", retry_after_header(error.retry_after_seconds));
  }
  res.set_content(error_body(error), "application/json");
}

void answer_completion(const CompletionContext& context, ApiRequest request,
                       httplib::Response& res) {
  std::shared_ptr<RequestStream> stream = RequestStream::make();
  Result<engine::RequestId> id =
      context.engine->submit(std::move(request.engine), stream->callback());
  if (!id.ok()) {
    reply_error(res, submit_error(id.status(), context.engine->retry_after()));
    return;
  }
  if (request.stream) {
    stream_answer(context, request, std::move(stream), *id, res);
  } else {
    whole_answer(context, request, stream, res);
  }
}

}  // namespace kvvm::server
