// The server's routes, written once: Routes::table() lists every path with its method, its
// handler and whether it generates. The registrations, the 404 and 405 answers, the 503 while
// draining and the metrics' endpoint labels are all read from it, so a route added there is
// served, listed, counted and tested with nothing else to change.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/grammar/constraint.h"
#include "kvvm/grammar/grammar_cache.h"
#include "kvvm/server/server.h"
#include "metrics.h"
#include "openai_request.h"

namespace kvvm::server {

class Routes;

enum class Method : std::uint8_t { kGet, kPost };
std::string_view method_name(Method method);  // "GET", "POST"

struct Route {
  // Each path once: a wrong method's 405 names this route's method. A path with a
  // parameter is written with braces ("/v1/models/{model}") and served by `pattern`.
  std::string_view path;
  Method method;
  // Generation answers 503 while the server drains (a "draining" refusal in the metrics);
  // the probes and the model list go on answering.
  bool generation;
  void (Routes::*handle)(const httplib::Request&, httplib::Response&);
  // The regular expression httplib matches (its first group is the parameter); empty: `path`.
  std::string_view pattern = {};
};

// The handlers of the routes and what they share: the parse context, the grammar cache, the
// metrics, the drain flag and the count of streams in flight. Thread-safe once installed.
class Routes {
 public:
  // `options` outlives the routes.
  Routes(ServerDeps deps, const ServerOptions& options);

  // Every route, in the order httplib tries them.
  static std::span<const Route> table();
  // The route serving `path` (any method); nullptr when none does.
  static const Route* find(std::string_view path);

  // Registers every route of table(), the 404 / 405 answer for anything else, and the count
  // of every answer.
  void install(httplib::Server& http);

  void begin_drain() { draining_ = true; }
  bool draining() const { return draining_.load(); }
  int streams_in_flight() const { return streams_in_flight_.load(); }

 private:
  void completions(const httplib::Request& req, httplib::Response& res);
  void chat_completions(const httplib::Request& req, httplib::Response& res);
  void models(const httplib::Request& req, httplib::Response& res);
  void model(const httplib::Request& req, httplib::Response& res);
  void tokenize(const httplib::Request& req, httplib::Response& res);
  void detokenize(const httplib::Request& req, httplib::Response& res);
  // Logs each ignored field name once and counts every one (kvvm_ignored_fields_total).
  void note_ignored(const std::vector<std::string>& fields);
  void health(const httplib::Request& req, httplib::Response& res);
  void metrics(const httplib::Request& req, httplib::Response& res);

  void generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
  // The tenant of the request's key (0 when no keys are configured); nullopt: answered 401.
  std::optional<std::uint64_t> tenant_of(const httplib::Request& req, httplib::Response& res);
  bool authorized(const httplib::Request& req, httplib::Response& res);
  void count(const httplib::Request& req, const httplib::Response& res);

  ServerDeps deps_;
  const ServerOptions& options_;
  ParseContext parse_context_;
  std::uint32_t context_tokens_ = 0;
  std::int64_t created_ = 0;
  ServerMetrics metrics_;
  // Structured output's compiled grammars; null when the vocabulary could not be built (why in
  // grammar_unavailable_), and every constrained request is refused saying so.
  std::unique_ptr<grammar::GrammarCache> grammar_cache_;
  Status grammar_unavailable_;
  std::atomic<bool> draining_{false};
  std::atomic<int> streams_in_flight_{0};
};

}  // namespace kvvm::server
