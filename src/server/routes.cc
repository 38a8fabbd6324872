#include "routes.h"

#include <cctype>
#include <chrono>
#include <regex>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "api_error.h"
#include "completion_handler.h"
#include "kvvm/base/dtype.h"
#include "kvvm/base/log.h"
#include "kvvm/grammar/vocabulary.h"
#include "kvvm/kv/layout.h"
#include "openai_response.h"
#include "reasoning_parser.h"
#include "structured_output.h"
#include "tool_call_parser.h"

namespace kvvm::server {
namespace {

constexpr const char* kJson = "application/json";

// The key of "Authorization: Bearer KEY" (the scheme's case is free); empty when absent.
std::string bearer_key(const httplib::Request& req) {
  const std::string value = req.get_header_value("Authorization");
  constexpr std::string_view kScheme = "bearer ";
  if (value.size() <= kScheme.size()) return "";
  for (std::size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(value[i])) != kScheme[i]) return "";
  }
  std::string_view key = std::string_view(value).substr(kScheme.size());
  while (!key.empty() && (key.front() == ' ' || key.front() == '\t')) key.remove_prefix(1);
  while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.remove_suffix(1);
  return std::string(key);
}

// "/a, /b and /c": every path of the table, for the 404 answer.
std::string served_paths() {
  const std::span<const Route> routes = Routes::table();
  std::string paths;
  for (std::size_t i = 0; i < routes.size(); ++i) {
    if (i > 0) paths += i + 1 == routes.size() ? " and " : ", ";
    paths += routes[i].path;
  }
  return paths;
}

// Anything no route serves: 405 on a known path, 404 on an unknown one, in OpenAI's shape.
void answer_unrouted(const httplib::Request& req, httplib::Response& res) {
  if (const Route* route = Routes::find(req.path)) {
    const std::string method(method_name(route->method));
    res.set_header("Allow", method);
    reply_error(res, error_of(405, "invalid_request_error",
                              "method " + req.method + " is not allowed on " + req.path + " (use " +
                                  method + ")",
                              "method_not_allowed"));
    return;
  }
  static const std::string kServed = served_paths();
  reply_error(
      res, error_of(404, "not_found_error",
                    "no such path: " + req.path + " (kvvm serves " + kServed + ")", "not_found"));
}

}  // namespace

std::string_view method_name(Method method) {
  switch (method) {
    case Method::kGet:
      return "GET";
    case Method::kPost:
      return "POST";
  }
  return "GET";
}

std::span<const Route> Routes::table() {
  static constexpr Route kRoutes[] = {
      {"/v1/completions", Method::kPost, true, &Routes::completions},
      {"/v1/chat/completions", Method::kPost, true, &Routes::chat_completions},
      {"/v1/models", Method::kGet, false, &Routes::models},
      // A model id may hold slashes ("Qwen/Qwen2.5-0.5B"): the rest of the path is the id.
      {"/v1/models/{model}", Method::kGet, false, &Routes::model, R"(/v1/models/(.+))"},
      // vLLM's: the prompt ids a completion would see, and text for ids.
      {"/tokenize", Method::kPost, false, &Routes::tokenize},
      {"/detokenize", Method::kPost, false, &Routes::detokenize},
      {"/health", Method::kGet, false, &Routes::health},
      {"/metrics", Method::kGet, false, &Routes::metrics},
  };
  return kRoutes;
}

const Route* Routes::find(std::string_view path) {
  for (const Route& route : table()) {
    if (path == route.path) return &route;
  }
  // Compiled once: find() runs for every answer counted (a stream of unknown paths too).
  static const std::vector<std::regex> patterns = [] {
    std::vector<std::regex> compiled;
    for (const Route& route : table()) compiled.emplace_back(std::string(route.pattern));
    return compiled;
  }();
  const std::span<const Route> routes = table();
  for (std::size_t i = 0; i < routes.size(); ++i) {
    if (routes[i].pattern.empty()) continue;
    if (std::regex_match(path.begin(), path.end(), patterns[i])) return &routes[i];
  }
  return nullptr;
}

Routes::Routes(ServerDeps deps, const ServerOptions& options) : deps_(deps), options_(options) {
  created_ = std::chrono::duration_cast<std::chrono::seconds>(
                 std::chrono::system_clock::now().time_since_epoch())
                 .count();
  context_tokens_ = static_cast<std::uint32_t>(deps_.kv->options().max_context);
  parse_context_.tokenizer = deps_.tokenizer;
  parse_context_.chat_renderer = options_.chat_renderer ? &*options_.chat_renderer : nullptr;
  // How answers are read: the named parser (checked by Server::create), else what the
  // template's text shows.
  const std::string_view source =
      options_.chat_renderer ? std::string_view(options_.chat_renderer->source()) : "";
  if (!options_.tool_call_parser.empty()) {
    parse_context_.tool_call_format = parse_tool_call_format(options_.tool_call_parser).value();
  } else {
    parse_context_.tool_call_format = detect_tool_call_format(source);
  }
  if (options_.reasoning_parser.empty()) {
    parse_context_.reasoning = detect_reasoning_format(source);
  } else {
    parse_context_.reasoning = parse_reasoning_format(options_.reasoning_parser).value();
  }
  parse_context_.model_name = options_.model_name;
  parse_context_.context_tokens = context_tokens_;
  parse_context_.vocab_size = deps_.config->vocab_size;
  parse_context_.default_max_tokens = options_.default_max_tokens;
  parse_context_.max_n = options_.max_n;
  // Built once per server: every constrained request's grammar is compiled against it.
  Result<std::shared_ptr<const grammar::Vocabulary>> vocabulary =
      grammar::Vocabulary::from_tokenizer(*deps_.tokenizer, deps_.config->eos_token_ids);
  if (vocabulary.ok()) {
    grammar::GrammarCacheOptions cache_options;
    cache_options.entries = options_.grammar_cache_entries;
    grammar_cache_ =
        std::make_unique<grammar::GrammarCache>(std::move(vocabulary).value(), cache_options);
  } else {
    grammar_unavailable_ = vocabulary.status();
    log(LogLevel::kWarning,
        "server: structured output is unavailable (requests asking for it "
        "get 400): " +
            grammar_unavailable_.message());
  }
}

void Routes::install(httplib::Server& http) {
  for (const Route& route : table()) {
    auto handler = [this, &route](const httplib::Request& req, httplib::Response& res) {
      if (route.generation) {
        if (Status lost = deps_.engine->health(); !lost.ok()) {
          reply_error(res, lost_context_error(lost.message()));
          return;
        }
      }
      if (route.generation && draining_) {
        // Retry-After: when the work in hand should be done (the engine's estimate), so a
        // client or a balancer knows when to look again, here or at another replica.
        ApiError draining = error_of(503, "unavailable_error",
                                     "the server is draining: it finishes the requests it has "
                                     "and takes no new ones",
                                     "draining");
        draining.retry_after_seconds = deps_.engine->retry_after();
        reply_error(res, draining);
        return;
      }
      (this->*route.handle)(req, res);
    };
    const std::string path(route.pattern.empty() ? route.path : route.pattern);
    switch (route.method) {
      case Method::kGet:
        http.Get(path, std::move(handler));
        break;
      case Method::kPost:
        http.Post(path, std::move(handler));
        break;
    }
  }
  http.Get(".*", answer_unrouted);
  http.Post(".*", answer_unrouted);
  http.Put(".*", answer_unrouted);
  http.Patch(".*", answer_unrouted);
  http.Delete(".*", answer_unrouted);
  http.Options(".*", answer_unrouted);
  // Counted before the answer is written (httplib runs this handler just ahead of the status
  // line), so a client that reads /metrics right after an answer sees it counted. Every
  // answer carries an x-request-id, as OpenAI's do (its SDK reports it with each error).
  http.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.has_header("x-request-id")) res.set_header("x-request-id", random_id("req_"));
    count(req, res);
  });
}

void Routes::completions(const httplib::Request& req, httplib::Response& res) {
  generate(Endpoint::kCompletions, req, res);
}

void Routes::chat_completions(const httplib::Request& req, httplib::Response& res) {
  generate(Endpoint::kChat, req, res);
}

void Routes::models(const httplib::Request& req, httplib::Response& res) {
  if (!authorized(req, res)) return;
  const nlohmann::json body = models_body(options_.model_name, created_, context_tokens_,
                                          model::to_string(deps_.config->weight_quant));
  res.set_content(dump_json(body), kJson);
}

void Routes::model(const httplib::Request& req, httplib::Response& res) {
  if (!authorized(req, res)) return;
  const std::string id = req.matches.size() > 1 ? req.matches[1].str() : std::string();
  if (id != options_.model_name) {
    ApiError missing = error_of(
        404, "invalid_request_error",
        "model: '" + id + "' does not exist; this server serves '" + options_.model_name + "'",
        "model_not_found");
    missing.param = "model";
    reply_error(res, missing);
    return;
  }
  res.set_content(dump_json(model_body(options_.model_name, created_, context_tokens_,
                                       model::to_string(deps_.config->weight_quant))),
                  kJson);
}

void Routes::tokenize(const httplib::Request& req, httplib::Response& res) {
  if (!authorized(req, res)) return;
  std::variant<TokenizeRequest, ApiError> parsed = parse_tokenize(req.body, parse_context_);
  if (auto* error = std::get_if<ApiError>(&parsed)) {
    reply_error(res, *error);
    return;
  }
  const TokenizeRequest& request = std::get<TokenizeRequest>(parsed);
  note_ignored(request.ignored);
  const nlohmann::json body = {{"count", request.tokens.size()},
                               {"max_model_len", context_tokens_},
                               {"tokens", request.tokens},
                               {"token_strs", nullptr}};
  res.set_content(dump_json(body), kJson);
}

void Routes::detokenize(const httplib::Request& req, httplib::Response& res) {
  if (!authorized(req, res)) return;
  std::variant<DetokenizeRequest, ApiError> parsed = parse_detokenize(req.body, parse_context_);
  if (auto* error = std::get_if<ApiError>(&parsed)) {
    reply_error(res, *error);
    return;
  }
  const DetokenizeRequest& request = std::get<DetokenizeRequest>(parsed);
  note_ignored(request.ignored);
  const nlohmann::json body = {{"prompt", deps_.tokenizer->decode(request.tokens)}};
  res.set_content(dump_json(body), kJson);
}

void Routes::note_ignored(const std::vector<std::string>& fields) {
  for (const std::string& field : fields) {
    if (const std::optional<std::string> first = metrics_.count_ignored_field(field)) {
      log(LogLevel::kWarning, "server: ignored the request field '" + *first +
                                  "', which kvvm does not know (said once per name; every "
                                  "occurrence is counted in kvvm_ignored_fields_total)");
    }
  }
}

// A probe: no key needed.
void Routes::health(const httplib::Request&, httplib::Response& res) {
  if (Status lost = deps_.engine->health(); !lost.ok()) {
    res.status = 503;
    res.set_content(dump_json({{"status", "device_lost"}, {"error", lost.message()}}), kJson);
    return;
  }
  res.status = draining_ ? 503 : 200;
  res.set_content(draining_ ? R"({"status":"draining"})" : R"({"status":"ok"})", kJson);
}

// A probe: no key needed.
void Routes::metrics(const httplib::Request&, httplib::Response& res) {
  ServerMetrics::Inputs inputs;
  inputs.model_name = options_.model_name;
  inputs.engine = deps_.engine->stats();
  inputs.driver = deps_.kv->driver().counts();
  inputs.tier = deps_.kv->governor().stats(deps_.kv->arena().tier());
  inputs.weights = deps_.engine->model().weight_stats();
  inputs.draining = draining_;
  if (grammar_cache_) inputs.grammar_cache = grammar_cache_->stats();
  const LayoutPlan& plan = deps_.kv->arena().plan();
  const engine::EngineOptions& engine_options = deps_.engine->options();
  inputs.cache.layout = std::string(to_string(plan.layout));
  inputs.cache.cache_dtype = std::string(to_string(plan.geometry.dtype));
  inputs.cache.quantization = std::string(model::to_string(deps_.config->weight_quant));
  inputs.cache.granule_bytes = plan.granule;
  inputs.cache.num_slots = deps_.kv->options().max_slots;
  inputs.cache.max_context = plan.max_context;
  inputs.cache.prefix_caching = engine_options.prefix_cache && !engine_options.preallocate;
  inputs.cache.blocks = cache_blocks(plan, inputs.tier.limit);
  inputs.unix_time =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  res.set_content(metrics_.render(inputs), "text/plain; version=0.0.4; charset=utf-8");
}

void Routes::generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
  const std::optional<std::uint64_t> tenant = tenant_of(req, res);
  if (!tenant) return;
  std::variant<ApiRequest, ApiError> parsed = parse_request(endpoint, req.body, parse_context_);
  if (auto* error = std::get_if<ApiError>(&parsed)) {
    reply_error(res, *error);
    return;
  }
  ApiRequest& request = std::get<ApiRequest>(parsed);
  note_ignored(request.ignored);
  // Compiled here, on the HTTP thread: the engine's step only walks the compiled grammar.
  if (request.constraint) {
    if (!grammar_cache_) {
      reply_error(res, unsupported(request.constraint->field,
                                   "structured output (this model's vocabulary: " +
                                       grammar_unavailable_.message() + ")"));
      return;
    }
    auto compiled = compile_constraint(*grammar_cache_, *request.constraint);
    if (auto* error = std::get_if<ApiError>(&compiled)) {
      reply_error(res, *error);
      return;
    }
    request.engine.grammar = std::get<0>(std::move(compiled));
  }
  request.engine.tenant = *tenant;
  answer_completion(
      CompletionContext{deps_.engine, &metrics_, deps_.tokenizer, &streams_in_flight_},
      std::move(request), res);
}

std::optional<std::uint64_t> Routes::tenant_of(const httplib::Request& req,
                                               httplib::Response& res) {
  if (options_.api_keys.empty()) return 0;
  const std::string key = bearer_key(req);
  if (key.empty()) {
    reply_error(res, error_of(401, "authentication_error",
                              "missing API key: send the header 'Authorization: Bearer KEY'",
                              "invalid_api_key"));
    return std::nullopt;
  }
  std::optional<std::uint64_t> tenant = options_.api_keys.tenant(key);
  if (!tenant) {
    reply_error(res, error_of(401, "authentication_error",
                              "unknown API key (the key is not "
                              "in the server's key file)",
                              "invalid_api_key"));
  }
  return tenant;
}

bool Routes::authorized(const httplib::Request& req, httplib::Response& res) {
  return tenant_of(req, res).has_value();
}

// Every answer, by route and status; refusals by reason. A path no route serves is labelled
// "other", so a client cannot grow the label set.
void Routes::count(const httplib::Request& req, const httplib::Response& res) {
  const Route* route = find(req.path);
  metrics_.count_response(route != nullptr ? route->path : "other", res.status);
  switch (res.status) {
    case 401:
      metrics_.count_refusal("unauthorized");
      break;
    case 413:
      metrics_.count_refusal("too_large");
      break;
    case 429:
      metrics_.count_refusal("overloaded");
      break;
    case 503:
      if (route != nullptr && route->generation) metrics_.count_refusal("draining");
      break;
    default:
      if (res.status >= 400 && res.status < 500) metrics_.count_refusal("invalid");
  }
}

}  // namespace kvvm::server
