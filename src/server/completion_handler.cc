#include "completion_handler.h"

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "api_error.h"
#include "kvvm/vmm/driver.h"
#include "logprobs_json.h"
#include "openai_response.h"
#include "request_stream.h"

namespace kvvm::server {
namespace {

using engine::RequestEnd;

// Every wait on the engine is this long at most; the loops around it re-check. The engine
// guarantees a last event for every submitted request (a drain cancels what is left), so the
// loops end.
constexpr std::chrono::milliseconds kWaitSlice{200};

// 429: the server's words, then the engine's reason without its own "overloaded: ", so the
// word is said once.
ApiError overloaded_error(const Status& status, double retry_after) {
  constexpr std::string_view kEngineSays = "overloaded: ";
  std::string_view reason = status.message();
  if (reason.starts_with(kEngineSays)) reason.remove_prefix(kEngineSays.size());
  ApiError error = error_of(429, "resource_limit_error",
                            "the server is overloaded: " + std::string(reason), "overloaded");
  error.retry_after_seconds = retry_after;
  return error;
}

// A refused submit: the engine's status as an HTTP answer.
ApiError submit_error(const Status& status, double retry_after) {
  switch (status.code()) {
    case StatusCode::kResourceExhausted:
      return overloaded_error(status, retry_after);
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

// A choice that ended without an answer (kError, kCancelled).
ApiError end_error(const ChoiceUpdate& update) {
  if (update.end == RequestEnd::kError && update.retry_after_seconds > 0) {
    return overloaded_error(update.error, update.retry_after_seconds);
  }
  if (update.end == RequestEnd::kError && context_lost(update.error)) {
    return lost_context_error(update.error.message());
  }
  if (update.end == RequestEnd::kCancelled) {
    return error_of(503, "unavailable_error",
                    "the request was cancelled: the server is shutting down", "cancelled");
  }
  // Whatever a client sent was checked before submit: a failure now is the server's own.
  return error_of(500, "server_error", "generation failed: " + update.error.to_string(), "");
}

bool succeeded(RequestEnd end) { return end == RequestEnd::kStop || end == RequestEnd::kLength; }

// The first choice of `update` that ended without an answer; null when none.
const ChoiceUpdate* failed_choice(const StreamUpdate& update) {
  for (const ChoiceUpdate& choice : update.choices) {
    if (choice.finished && !succeeded(choice.end)) return &choice;
  }
  return nullptr;
}

// Appends `more` (taken later) to `into`, choice by choice.
void merge(StreamUpdate& into, StreamUpdate more) {
  if (into.choices.size() < more.choices.size()) into.choices.resize(more.choices.size());
  for (std::size_t i = 0; i < more.choices.size(); ++i) {
    ChoiceUpdate& to = into.choices[i];
    ChoiceUpdate& from = more.choices[i];
    to.text += from.text;
    to.ids.insert(to.ids.end(), from.ids.begin(), from.ids.end());
    to.logprobs.insert(to.logprobs.end(), from.logprobs.begin(), from.logprobs.end());
    if (!from.prompt_logprobs.empty()) to.prompt_logprobs = std::move(from.prompt_logprobs);
    if (from.finished) {
      to.finished = true;
      to.end = from.end;
      to.error = std::move(from.error);
      to.retry_after_seconds = from.retry_after_seconds;
      to.stats = from.stats;
    }
  }
  into.finished = into.finished || more.finished;
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

// What the answer needs besides the engine's events: the prompts (echo), what was asked.
struct AnswerShape {
  Endpoint endpoint = Endpoint::kCompletions;
  std::uint32_t n = 1;
  bool echo = false;
  bool logprobs = false;
  std::vector<std::vector<std::int32_t>> prompts;  // kept for echo only
  std::vector<std::string> prompt_texts;           // kept for echo only
  const tokenizer::Tokenizer* tokenizer = nullptr;
  AnswerParsing parsing;  // chat: reasoning and tool calls read out of the text
};

// Call ids as the family's template takes them back in the next turn.
ToolCallIds call_ids_of(const AnswerParsing& parsing) {
  return parsing.tool_calls ? random_tool_call_ids(*parsing.tool_calls) : random_tool_call_ids();
}

// One request's usage: each prompt once, every choice's tokens.
engine::RequestStats combined_stats(const StreamUpdate& all, std::uint32_t n) {
  engine::RequestStats total;
  for (std::size_t i = 0; i < all.choices.size(); ++i) {
    const engine::RequestStats& s = all.choices[i].stats;
    if (i == 0) total = s;  // times: the first choice's
    if (i != 0 && i % n == 0) {
      total.prompt_tokens += s.prompt_tokens;
      total.cached_tokens += s.cached_tokens;
    }
    if (i != 0) total.generated_tokens += s.generated_tokens;
  }
  return total;
}

// The log-probabilities of `choice`'s tokens (its echoed prompt first when `with_prompt`),
// in the endpoint's shape; null when not asked. `offset`: the text before the first token.
nlohmann::json choice_logprobs(const AnswerShape& shape, std::uint32_t index,
                               const ChoiceUpdate& choice, bool with_prompt, std::size_t offset) {
  if (!shape.logprobs || shape.tokenizer == nullptr) return nullptr;
  std::vector<ScoredToken> scored;
  if (with_prompt && shape.echo) {
    const std::vector<std::int32_t>& prompt = shape.prompts[index / shape.n];
    for (std::size_t i = 0; i < prompt.size(); ++i) {
      const model::RowLogprobs* row =
          i > 0 && i - 1 < choice.prompt_logprobs.size() ? &choice.prompt_logprobs[i - 1] : nullptr;
      scored.push_back(ScoredToken{.id = prompt[i], .row = row});
    }
  }
  for (std::size_t i = 0; i < choice.ids.size(); ++i) {
    scored.push_back(ScoredToken{
        .id = choice.ids[i], .row = i < choice.logprobs.size() ? &choice.logprobs[i] : nullptr});
  }
  return shape.endpoint == Endpoint::kChat ? chat_logprobs(*shape.tokenizer, scored)
                                           : completion_logprobs(*shape.tokenizer, scored, offset);
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

void cancel_all(engine::Engine& engine, const std::vector<engine::RequestId>& ids) {
  for (const engine::RequestId id : ids) engine.cancel(id);
}

// What the SSE provider carries from one call to the next.
struct StreamState {
  std::unique_ptr<InFlight> in_flight;  // until the provider is destroyed with the response
  CompletionContext context;
  std::shared_ptr<RequestStream> stream;
  std::vector<engine::RequestId> ids;
  AnswerShape shape;
  ResponseHead head;
  bool include_usage = false;
  std::vector<bool> started;          // per choice: its first chunk went out
  std::vector<std::size_t> sent;      // per choice: text bytes sent (text_offset's origin)
  std::vector<AnswerStream> answers;  // per choice, with AnswerShape::parsing
  bool done = false;
  StreamUpdate pending;  // taken before the status line was sent
  StreamUpdate all;      // every finish so far: the usage and the metrics at the end
};

// The SSE text for `update`; marks the state done once every choice has ended.
// As OpenAI's: the role in a choice's first chunk, its finish reason in its last content chunk
// (or, when the end brings no text, in a chunk of its own with an empty delta), the usage chunk
// only when asked for, [DONE] last.
std::string sse_text(StreamState& state, StreamUpdate& update) {
  std::string out;
  if (const ChoiceUpdate* failed = failed_choice(update)) {
    // The status line has gone: the failure travels as an error event, as vLLM sends one.
    state.done = true;
    cancel_all(*state.context.engine, state.ids);
    out += "data: " + error_body(end_error(*failed)) + "\n\n";
    out += kSseDone;
    return out;
  }
  for (std::uint32_t i = 0; i < update.choices.size(); ++i) {
    ChoiceUpdate& choice = update.choices[i];
    const bool first = !state.started[i];
    // The echo leads the choice's first chunk once its first event has come (it brings the
    // prompt's log-probabilities).
    const bool echoing = first && state.shape.echo && !choice.empty();
    const bool scored = state.shape.logprobs && (!choice.ids.empty() || echoing);
    AssistantDelta delta;
    const bool read = !state.answers.empty();
    if (read) {
      delta = state.answers[i].push(choice.text);
      if (choice.finished) delta.append(state.answers[i].finish());
      if (delta.empty() && !scored && !choice.finished) continue;
    } else if (choice.text.empty() && !scored && !echoing && !choice.finished) {
      continue;
    }
    std::string text = choice.text;
    if (echoing) text = state.shape.prompt_texts[i / state.shape.n] + text;
    ChoiceText piece;
    piece.index = i;
    piece.text = text;
    if (read) piece.delta = &delta;
    if (choice.finished) {
      piece.finish = finish_reason(choice.end, read && state.answers[i].called());
    }
    piece.logprobs = choice_logprobs(state.shape, i, choice, echoing, state.sent[i]);
    // The finish rides with the choice's last text, or alone with an empty delta.
    out += sse_event(stream_chunk(state.head, piece, first, state.include_usage));
    state.started[i] = true;
    state.sent[i] += text.size();
  }
  merge(state.all, std::move(update));
  if (!state.all.finished) return out;
  state.done = true;
  const engine::RequestStats stats = combined_stats(state.all, state.shape.n);
  if (state.include_usage) out += sse_event(usage_chunk(state.head, usage_of(stats)));
  state.context.metrics->observe_finished(stats, state.all.choices.front().end,
                                          state.stream->inter_token_seconds(), state.shape.n);
  out += kSseDone;
  return out;
}

void stream_answer(const CompletionContext& context, const ApiRequest& request, AnswerShape shape,
                   std::shared_ptr<RequestStream> stream, std::vector<engine::RequestId> ids,
                   httplib::Response& res) {
  auto in_flight = std::make_unique<InFlight>(context.streams_in_flight);
  // Wait for the first event before any status is sent: a refusal in the queue must still be
  // an HTTP error.
  StreamUpdate first;
  while (first.empty()) first = stream->take(kWaitSlice);
  if (const ChoiceUpdate* failed = failed_choice(first)) {
    cancel_all(*context.engine, ids);
    reply_error(res, end_error(*failed));
    return;
  }
  auto state = std::make_shared<StreamState>();
  state->in_flight = std::move(in_flight);
  state->context = context;
  state->stream = std::move(stream);
  state->ids = std::move(ids);
  state->head = head_of(request);
  state->include_usage = request.include_usage;
  state->started.assign(first.choices.size(), false);
  state->sent.assign(first.choices.size(), 0);
  if (shape.endpoint == Endpoint::kChat && shape.parsing.any()) {
    for (std::size_t i = 0; i < first.choices.size(); ++i) {
      state->answers.emplace_back(shape.parsing, call_ids_of(shape.parsing));
    }
  }
  state->shape = std::move(shape);
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
          // The client went away: free its sequences at the engine's next step.
          cancel_all(*state->context.engine, state->ids);
          return false;
        }
        if (state->done) sink.done();
        return true;
      },
      [state](bool success) {
        // The connection failed before the stream's end (a write, or the status line).
        if (!success && !state->done) cancel_all(*state->context.engine, state->ids);
      });
}

void whole_answer(const CompletionContext& context, const ApiRequest& request,
                  const AnswerShape& shape, const std::shared_ptr<RequestStream>& stream,
                  const std::vector<engine::RequestId>& ids, httplib::Response& res) {
  StreamUpdate all;
  while (!all.finished) {
    merge(all, stream->take(kWaitSlice));
    // One choice failed: the answer is its error; the others need not run on.
    if (failed_choice(all) != nullptr) break;
  }
  if (const ChoiceUpdate* failed = failed_choice(all)) {
    cancel_all(*context.engine, ids);
    reply_error(res, end_error(*failed));
    return;
  }
  const engine::RequestStats stats = combined_stats(all, shape.n);
  context.metrics->observe_finished(stats, all.choices.front().end, stream->inter_token_seconds(),
                                    shape.n);
  std::vector<std::string> texts(all.choices.size());
  std::vector<ChoiceText> choices(all.choices.size());
  const bool read = shape.endpoint == Endpoint::kChat && shape.parsing.any();
  std::vector<AssistantMessage> messages(read ? all.choices.size() : 0);
  const ToolCallIds call_ids = call_ids_of(shape.parsing);
  for (std::uint32_t i = 0; i < all.choices.size(); ++i) {
    const ChoiceUpdate& choice = all.choices[i];
    texts[i] = shape.echo ? shape.prompt_texts[i / shape.n] + choice.text : choice.text;
    if (read) messages[i] = read_answer(shape.parsing, choice.text, call_ids);
    choices[i] = ChoiceText{.index = i,
                            .text = texts[i],
                            .finish = finish_reason(choice.end, read && !messages[i].calls.empty()),
                            .logprobs = choice_logprobs(shape, i, choice, true, 0),
                            .message = read ? &messages[i] : nullptr};
  }
  const nlohmann::json body = completion_body(head_of(request), choices, usage_of(stats));
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
  AnswerShape shape;
  shape.endpoint = request.endpoint;
  shape.n = request.engine.n;
  shape.echo = request.echo;
  shape.logprobs = request.engine.logprobs.has_value();
  shape.tokenizer = context.tokenizer;
  shape.parsing = request.parsing;
  std::vector<std::vector<std::int32_t>> prompts;
  prompts.reserve(1 + request.more_prompts.size());
  prompts.push_back(request.engine.prompt);
  for (auto& more : request.more_prompts) prompts.push_back(std::move(more));
  request.more_prompts.clear();
  if (shape.echo && context.tokenizer != nullptr) {
    for (const auto& prompt : prompts)
      shape.prompt_texts.push_back(context.tokenizer->decode(prompt));
  } else if (shape.echo) {
    shape.prompt_texts.assign(prompts.size(), "");
  }

  std::shared_ptr<RequestStream> stream =
      RequestStream::make(static_cast<std::uint32_t>(prompts.size()) * shape.n);
  std::vector<engine::RequestId> ids;
  for (std::size_t k = 0; k < prompts.size(); ++k) {
    engine::EngineRequest one = request.engine;
    one.prompt = prompts[k];
    Result<engine::RequestId> id = context.engine->submit(
        std::move(one), stream->callback(static_cast<std::uint32_t>(k) * shape.n));
    if (!id.ok()) {
      // All or nothing: the prompts already queued are withdrawn.
      cancel_all(*context.engine, ids);
      reply_error(res, submit_error(id.status(), context.engine->retry_after()));
      return;
    }
    ids.push_back(*id);
  }
  if (shape.echo) shape.prompts = std::move(prompts);
  if (request.stream) {
    stream_answer(context, request, std::move(shape), std::move(stream), std::move(ids), res);
  } else {
    whole_answer(context, request, shape, stream, ids, res);
  }
}

}  // namespace kvvm::server
