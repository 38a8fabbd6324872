#include "sim/trace.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <istream>
#include <map>
#include <nlohmann/json.hpp>
#include <numbers>
#include <ostream>
#include <random>
#include <string_view>

#include "base/json_reader.h"
#include "kit/text_table.h"

namespace kvvm::cli {
namespace {

// A number as short as it round-trips, whole numbers below 1e15 in full: "10000000", "0.25",
// "1e-09", "1e+308".
std::string seconds(double value) {
  char buffer[64];
  const bool whole = std::trunc(value) == value && std::fabs(value) < 1e15;
  const auto written =
      whole ? std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::fixed)
            : std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, written.ptr);
}

// Our own transforms over mt19937_64, whose output sequence the standard fixes (the standard
// library's distributions are implementation-defined, so they would change a seed's trace).
class Draw {
 public:
  explicit Draw(std::uint64_t seed) : engine_(seed) {}
  // Uniform in (0, 1]: 53 random bits, never 0 (the logarithms below need that).
  double uniform() {
    return (static_cast<double>(engine_() >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  }
  double exponential(double rate) { return -std::log(uniform()) / rate; }
  // Box-Muller; the second value of each pair is dropped to keep the stream simple.
  double normal() {
    return std::sqrt(-2.0 * std::log(uniform())) * std::cos(2.0 * std::numbers::pi * uniform());
  }
  std::uint64_t lognormal_tokens(double mu, double sigma) {
    const double value = std::exp(mu + sigma * normal());
    // At least one token; anything past 2^40 is clamped by max context anyway.
    return static_cast<std::uint64_t>(std::clamp(std::round(value), 1.0, 1099511627776.0));
  }
  std::uint64_t below(std::uint64_t n) { return engine_() % n; }

 private:
  std::mt19937_64 engine_;
};

const char* type_name(const nlohmann::json& value) {
  // nlohmann stores a whole number past 2^64 - 1 as a double.
  if (value.is_number_float()) {
    const double number = value.get<double>();
    return std::trunc(number) == number ? "a number out of range" : "a fractional number";
  }
  if (value.is_number_integer() && !value.is_number_unsigned()) return "a negative number";
  return value.type_name();
}

// A whole number of tokens >= minimum, or the reason it is not.
std::optional<std::string> check_tokens(const nlohmann::json& value, std::string_view key,
                                        std::uint64_t minimum, std::uint64_t& out) {
  if (!value.is_number_unsigned()) {
    return "\"" + std::string(key) + "\" must be a whole number of tokens, got " +
           type_name(value) + " (" + value.dump() + ")";
  }
  out = value.get<std::uint64_t>();
  if (out < minimum) {
    return "\"" + std::string(key) + "\" must be at least " + str(minimum) + ", got " + str(out);
  }
  return std::nullopt;
}

// One line's request, or the reason it is malformed. `previous_arrival` is the arrival of the
// last accepted line (`previous_line`; 0 before the first).
std::optional<std::string> parse_line(const std::string& line, std::uint64_t max_context,
                                      double previous_arrival, std::uint64_t previous_line,
                                      std::map<std::string, int>& group_ids, Trace& trace,
                                      TraceRequest& request) {
  JsonLimits limits;
  limits.max_bytes = kMaxTraceLineBytes;
  Result<nlohmann::json> read = read_json(line, limits);
  if (!read.ok()) return read.status().message();
  const nlohmann::json& object = *read;
  if (!object.is_object()) {
    return std::string("expected a JSON object, got ") + type_name(object);
  }
  static const char* const kKeys[] = {"arrival",       "prompt_tokens", "prompt",
                                      "output_tokens", "prefix_group",  "prefix_tokens"};
  for (const auto& [key, value] : object.items()) {
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys)) {
      return "unknown key \"" + key +
             "\" (known: arrival, prompt_tokens or prompt, output_tokens, prefix_group, "
             "prefix_tokens)";
    }
  }
  if (!object.contains("arrival")) return "missing \"arrival\" (seconds)";
  const nlohmann::json& arrival = object["arrival"];
  if (!arrival.is_number() || !std::isfinite(arrival.get<double>()) || arrival.get<double>() < 0) {
    return "\"arrival\" must be a number of seconds >= 0, got " + arrival.dump();
  }
  request.arrival_s = arrival.get<double>();
  if (request.arrival_s > kMaxArrivalSeconds) {
    return "\"arrival\" " + arrival.dump() + " is past the bound of " +
           seconds(kMaxArrivalSeconds) + " seconds (about 116 days)";
  }
  if (request.arrival_s < previous_arrival) {
    return "\"arrival\" " + arrival.dump() + " is earlier than " + seconds(previous_arrival) +
           " on line " + str(previous_line) + ": arrivals must not decrease";
  }

  const bool has_count = object.contains("prompt_tokens");
  const bool has_ids = object.contains("prompt");
  if (has_count == has_ids) {
    return has_count ? "give \"prompt_tokens\" or \"prompt\", not both"
                     : "missing \"prompt_tokens\" (or \"prompt\", an array of token ids)";
  }
  if (has_count) {
    if (auto why = check_tokens(object["prompt_tokens"], "prompt_tokens", 1, request.prompt_tokens))
      return why;
  } else {
    const nlohmann::json& ids = object["prompt"];
    if (!ids.is_array())
      return std::string("\"prompt\" must be an array of token ids, got ") + type_name(ids);
    if (ids.empty()) return "\"prompt\" is empty: a request has at least one prompt token";
    auto kept = std::make_shared<std::vector<TokenId>>();
    kept->reserve(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (!ids[i].is_number_unsigned() || ids[i].get<std::uint64_t>() > 0xffffffffu) {
        return "\"prompt\"[" + str(i) + "] must be a token id (a whole number in [0, 2^32)), got " +
               ids[i].dump();
      }
      kept->push_back(static_cast<TokenId>(ids[i].get<std::uint64_t>()));
    }
    request.prompt_tokens = ids.size();
    request.ids = std::move(kept);
  }
  if (!object.contains("output_tokens")) return "missing \"output_tokens\"";
  if (auto why = check_tokens(object["output_tokens"], "output_tokens", 1, request.output_tokens))
    return why;
  if (request.prompt_tokens > max_context || request.output_tokens > max_context ||
      request.prompt_tokens + request.output_tokens > max_context) {
    return "prompt " + str(request.prompt_tokens) + " + output " + str(request.output_tokens) +
           " tokens exceed the max context of " + str(max_context) + " tokens";
  }
  const bool has_group = object.contains("prefix_group");
  const bool has_prefix = object.contains("prefix_tokens");
  if (has_group != has_prefix) {
    return has_group ? "\"prefix_group\" without \"prefix_tokens\""
                     : "\"prefix_tokens\" without \"prefix_group\"";
  }
  if (has_group) {
    const nlohmann::json& group = object["prefix_group"];
    if (!group.is_string() || group.get<std::string>().empty()) {
      return "\"prefix_group\" must be a non-empty string, got " + group.dump();
    }
    if (group.get<std::string>().size() > kMaxPrefixGroupNameBytes) {
      return "\"prefix_group\" is " + str(group.get<std::string>().size()) +
             " bytes long, over the bound of " + str(kMaxPrefixGroupNameBytes);
    }
    if (auto why = check_tokens(object["prefix_tokens"], "prefix_tokens", 1, request.prefix_tokens))
      return why;
    if (request.prefix_tokens > request.prompt_tokens) {
      return "\"prefix_tokens\" " + str(request.prefix_tokens) + " is longer than the prompt (" +
             str(request.prompt_tokens) + " tokens)";
    }
    const std::string name = group.get<std::string>();
    if (!group_ids.contains(name) && trace.groups.size() >= kMaxPrefixGroups) {
      return "\"prefix_group\" \"" + name + "\" would be group " + str(trace.groups.size() + 1) +
             ", over the bound of " + str(kMaxPrefixGroups) + " prefix groups (tenants)";
    }
    auto [it, inserted] = group_ids.emplace(name, static_cast<int>(trace.groups.size()));
    if (inserted) trace.groups.push_back(name);
    request.prefix_group = it->second;
    request.salt = static_cast<std::uint64_t>(it->second) + 1;
  }
  return std::nullopt;
}

// What both generators require of the length distributions and the system prompt.
Status check_lengths(const TraceGeneratorOptions& options) {
  if (!(options.prompt_sigma >= 0) || !(options.output_sigma >= 0) ||
      !std::isfinite(options.prompt_mu) || !std::isfinite(options.output_mu)) {
    return Status::InvalidArgument("log-normal parameters must be finite with sigma >= 0");
  }
  if (options.max_context > kMaxContextTokens) {
    return Status::InvalidArgument("--max-context " + str(options.max_context) +
                                   " is over the bound of " + str(kMaxContextTokens) + " tokens");
  }
  if (options.tenants > kMaxPrefixGroups) {
    return Status::InvalidArgument("--tenants " + str(options.tenants) + " is over the bound of " +
                                   str(kMaxPrefixGroups));
  }
  const std::uint64_t system = options.tenants == 0 ? 0 : options.system_prompt_tokens;
  if (options.max_context < 2 || system > options.max_context - 2) {
    return Status::InvalidArgument("--system-prompt-tokens " + str(system) +
                                   " leaves no room in --max-context " + str(options.max_context) +
                                   " for one user token and one output token");
  }
  return Status::Ok();
}

// The refusal for a generated arrival past kMaxArrivalSeconds: the rate is what put it there.
Status arrival_past_bound(double rate, std::string_view what, std::uint64_t index, double at) {
  return Status::InvalidArgument("--rate " + seconds(rate) + " puts " + std::string(what) + " " +
                                 str(index + 1) + " at " + seconds(at) + " s, past the bound of " +
                                 seconds(kMaxArrivalSeconds) + " s (about 116 days)");
}

// A line of at most `limit` bytes (the newline dropped) into `line`; the rest of a longer line
// is skipped without being stored. False at the end of the input.
bool read_bounded_line(std::istream& in, std::string& line, std::size_t limit, bool& too_long) {
  line.clear();
  too_long = false;
  std::streambuf* buffer = in.rdbuf();
  if (buffer == nullptr || !in.good()) return false;
  bool any = false;
  for (int c = buffer->sbumpc(); c != std::char_traits<char>::eof(); c = buffer->sbumpc()) {
    any = true;
    if (c == '\n') return true;
    if (line.size() < limit) {
      line.push_back(static_cast<char>(c));
    } else {
      too_long = true;
    }
  }
  in.setstate(std::ios::eofbit);
  return any;
}

}  // namespace

double lognormal_mu(double mean, double sigma) { return std::log(mean) - sigma * sigma / 2; }

Result<Trace> generate_trace(const TraceGeneratorOptions& options) {
  if (!(options.rate > 0) || !std::isfinite(options.rate)) {
    return Status::InvalidArgument("--rate must be a positive number of requests per second, got " +
                                   number(options.rate));
  }
  if (options.duration_s ? !(*options.duration_s > 0) : options.requests == 0) {
    return Status::InvalidArgument(options.duration_s
                                       ? "--duration must be a positive number of seconds"
                                       : "--requests must be at least 1, got 0");
  }
  if (options.duration_s && *options.duration_s > kMaxArrivalSeconds) {
    return Status::InvalidArgument("--duration " + seconds(*options.duration_s) +
                                   " s is over the bound of " + seconds(kMaxArrivalSeconds) +
                                   " s (about 116 days)");
  }
  if (options.duration_s &&
      options.rate * *options.duration_s > static_cast<double>(kMaxTraceRequests)) {
    return Status::InvalidArgument("--rate " + seconds(options.rate) + " for --duration " +
                                   seconds(*options.duration_s) + " s makes about " +
                                   seconds(options.rate * *options.duration_s) +
                                   " requests, over the bound of " + str(kMaxTraceRequests));
  }
  if (!options.duration_s && options.requests > kMaxTraceRequests) {
    return Status::InvalidArgument("--requests " + str(options.requests) +
                                   " is over the bound of " + str(kMaxTraceRequests));
  }
  KVVM_RETURN_IF_ERROR(check_lengths(options));
  const std::uint64_t system = options.tenants == 0 ? 0 : options.system_prompt_tokens;
  Trace trace;
  for (std::uint32_t t = 0; t < options.tenants; ++t) {
    trace.groups.push_back("tenant-" + std::to_string(t));
  }
  Draw draw(options.seed);
  double now = 0;
  // A duration of d seconds at rate r holds about r * d requests (checked above); the cap only
  // stops a draw far above that mean.
  for (std::uint64_t i = 0; i < kMaxTraceRequests; ++i) {
    if (!options.duration_s && i == options.requests) break;
    now += draw.exponential(options.rate);
    if (options.duration_s && now >= *options.duration_s) break;
    if (now > kMaxArrivalSeconds) return arrival_past_bound(options.rate, "request", i, now);
    TraceRequest request;
    request.arrival_s = now;
    std::uint64_t user = draw.lognormal_tokens(options.prompt_mu, options.prompt_sigma);
    std::uint64_t output = draw.lognormal_tokens(options.output_mu, options.output_sigma);
    user = std::min(user, options.max_context - system - 1);
    output = std::min(output, options.max_context - system - user);
    request.prompt_tokens = system + user;
    request.output_tokens = output;
    if (options.tenants > 0) {
      request.prefix_group = static_cast<int>(draw.below(options.tenants));
      request.prefix_tokens = system;
      request.salt = static_cast<std::uint64_t>(request.prefix_group) + 1;
      if (system == 0) request.prefix_group = kNoPrefixGroup;
    }
    trace.requests.push_back(request);
  }
  return trace;
}

Result<Trace> generate_chat_trace(const TraceGeneratorOptions& options,
                                  const ChatGeneratorOptions& chat) {
  if (!(options.rate > 0) || !std::isfinite(options.rate)) {
    return Status::InvalidArgument(
        "--rate must be a positive number of conversations per second, got " +
        number(options.rate));
  }
  if (chat.conversations == 0 || chat.turns == 0) {
    return Status::InvalidArgument("--conversations and --turns must be at least 1");
  }
  if (!(chat.think_s >= 0) || !std::isfinite(chat.think_s)) {
    return Status::InvalidArgument("--think-s must be >= 0 seconds");
  }
  if (chat.think_s > kMaxArrivalSeconds) {
    return Status::InvalidArgument("--think-s " + seconds(chat.think_s) + " is over the bound of " +
                                   seconds(kMaxArrivalSeconds) + " seconds");
  }
  if (chat.turns > kMaxTurns) {
    return Status::InvalidArgument("--turns " + str(chat.turns) + " is over the bound of " +
                                   str(kMaxTurns));
  }
  if (chat.conversations > kMaxTraceRequests / chat.turns) {
    return Status::InvalidArgument("--conversations " + str(chat.conversations) + " of " +
                                   str(chat.turns) + " turns is over the bound of " +
                                   str(kMaxTraceRequests) + " requests");
  }
  KVVM_RETURN_IF_ERROR(check_lengths(options));
  const std::uint32_t tenants = std::max<std::uint32_t>(options.tenants, 1);
  const std::uint64_t system = options.tenants == 0 ? 0 : options.system_prompt_tokens;
  Trace trace;
  Draw draw(options.seed);
  // Ids in [1000, 128000): a vocabulary of a llama-3 size, clear of special tokens. Random
  // ids never collide into a false shared prefix longer than a token or two.
  const auto random_ids = [&draw](std::vector<TokenId>& into, std::uint64_t count) {
    for (std::uint64_t i = 0; i < count; ++i) {
      into.push_back(static_cast<TokenId>(1000 + draw.below(127000)));
    }
  };
  std::vector<std::vector<TokenId>> system_ids(tenants);
  for (std::uint32_t t = 0; t < tenants; ++t) {
    random_ids(system_ids[t], system);
    if (options.tenants > 0) trace.groups.push_back("tenant-" + std::to_string(t));
  }
  struct Turn {
    TraceRequest request;
    std::uint64_t conversation = 0;
  };
  std::vector<Turn> turns;
  double now = 0;
  for (std::uint64_t c = 0; c < chat.conversations; ++c) {
    now += draw.exponential(options.rate);
    if (now > kMaxArrivalSeconds) return arrival_past_bound(options.rate, "conversation", c, now);
    const auto tenant = static_cast<std::uint32_t>(draw.below(tenants));
    auto stream = std::make_shared<std::vector<TokenId>>(system_ids[tenant]);
    double arrival = now;
    for (std::uint32_t k = 0; k < chat.turns; ++k) {
      const std::uint64_t used = stream->size();
      if (used + 2 > options.max_context) break;  // no room for one user and one output token
      std::uint64_t user = draw.lognormal_tokens(options.prompt_mu, options.prompt_sigma);
      std::uint64_t output = draw.lognormal_tokens(options.output_mu, options.output_sigma);
      user = std::min(user, options.max_context - used - 1);
      output = std::min(output, options.max_context - used - user);
      random_ids(*stream, user + output);
      TraceRequest request;
      // Closed loop: the scheduler sends it think time after the previous turn completed;
      // arrival_s is only a lower bound (the previous arrival plus the think time).
      if (k > 0) {
        request.think_s = draw.exponential(1.0 / std::max(chat.think_s, 1e-9));
        if (chat.think_s == 0) request.think_s = 0;
        arrival += request.think_s;
        if (arrival > kMaxArrivalSeconds) {
          return Status::InvalidArgument("--think-s " + seconds(chat.think_s) + " puts turn " +
                                         str(k + 1) + " of conversation " + str(c + 1) + " at " +
                                         seconds(arrival) + " s, past the bound of " +
                                         seconds(kMaxArrivalSeconds) + " s (about 116 days)");
        }
        request.follows = 0;  // set below, once sorted
      }
      request.arrival_s = arrival;
      request.prompt_tokens = used + user;
      request.output_tokens = output;
      if (options.tenants > 0 && system > 0) {
        request.prefix_group = static_cast<int>(tenant);
        request.prefix_tokens = system;
      }
      request.salt = tenant + 1;
      request.ids = stream;
      turns.push_back({request, c});
    }
  }
  std::stable_sort(turns.begin(), turns.end(), [](const Turn& a, const Turn& b) {
    return a.request.arrival_s < b.request.arrival_s;
  });
  // A turn's predecessor is the previous turn of its conversation: earlier in arrival order.
  std::map<std::uint64_t, std::int64_t> last_turn;
  for (const Turn& turn : turns) {
    TraceRequest request = turn.request;
    auto it = last_turn.find(turn.conversation);
    request.follows = it == last_turn.end() ? -1 : it->second;
    last_turn[turn.conversation] = static_cast<std::int64_t>(trace.requests.size());
    trace.requests.push_back(std::move(request));
  }
  return trace;
}

void synthesize_ids(Trace& trace) {
  // splitmix64: a good spread from (group or request, position), no state.
  const auto mix = [](std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  for (std::size_t r = 0; r < trace.requests.size(); ++r) {
    TraceRequest& request = trace.requests[r];
    if (request.salt == 0 && request.prefix_group != kNoPrefixGroup) {
      request.salt = static_cast<std::uint64_t>(request.prefix_group) + 1;
    }
    const std::uint64_t total = request.prompt_tokens + request.output_tokens;
    if (request.ids && request.ids->size() >= total) continue;
    auto ids = std::make_shared<std::vector<TokenId>>();
    if (request.ids) *ids = *request.ids;
    for (std::uint64_t i = ids->size(); i < total; ++i) {
      const bool shared = request.prefix_group != kNoPrefixGroup && i < request.prefix_tokens;
      const std::uint64_t owner =
          shared ? static_cast<std::uint64_t>(request.prefix_group) : (std::uint64_t{1} << 40) + r;
      ids->push_back(static_cast<TokenId>(mix(mix(owner) ^ i)));
    }
    request.ids = std::move(ids);
  }
}

Result<Trace> read_jsonl_trace(std::istream& in, const std::string& name,
                               std::uint64_t max_context) {
  if (max_context == 0) return Status::InvalidArgument("max context must be at least 1 token");
  if (max_context > kMaxContextTokens) {
    return Status::InvalidArgument("max context " + str(max_context) + " is over the bound of " +
                                   str(kMaxContextTokens) + " tokens");
  }
  Trace trace;
  std::map<std::string, int> group_ids;
  std::string line;
  bool too_long = false;
  double previous_arrival = 0;
  std::uint64_t previous_line = 0;
  // libstdc++ throws from a read that failed (EISDIR, EIO) rather than setting badbit.
  const auto read_line = [&](std::uint64_t number) -> Result<bool> {
    try {
      errno = 0;
      return read_bounded_line(in, line, kMaxTraceLineBytes, too_long);
    } catch (const std::ios_base::failure&) {
      return Status::InvalidArgument(name + ":" + str(number) + ": reading failed" +
                                     (errno != 0 ? std::string(": ") + std::strerror(errno) : ""));
    }
  };
  for (std::uint64_t number = 1;; ++number) {
    KVVM_ASSIGN_OR_RETURN(bool more, read_line(number));
    if (!more) break;
    const std::string at = name + ":" + str(number) + ": ";
    if (too_long) {
      ++trace.lines_read;
      trace.errors.push_back(at + "line longer than the bound of " + str(kMaxTraceLineBytes) +
                             " bytes");
      continue;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    ++trace.lines_read;
    TraceRequest request;
    if (auto why = parse_line(line, max_context, previous_arrival, previous_line, group_ids, trace,
                              request)) {
      trace.errors.push_back(at + *why);
      continue;
    }
    if (trace.requests.size() == kMaxTraceRequests) {
      return Status::InvalidArgument(at + "more than " + str(kMaxTraceRequests) +
                                     " requests, the bound of one trace");
    }
    previous_arrival = request.arrival_s;
    previous_line = number;
    trace.requests.push_back(request);
  }
  return trace;  // in arrival order: arrivals were refused when they decreased
}

void write_jsonl_trace(const Trace& trace, std::ostream& out) {
  for (const TraceRequest& request : trace.requests) {
    nlohmann::ordered_json line = {{"arrival", request.arrival_s},
                                   {"prompt_tokens", request.prompt_tokens},
                                   {"output_tokens", request.output_tokens}};
    if (request.prefix_group != kNoPrefixGroup) {
      line["prefix_group"] = trace.groups[static_cast<std::size_t>(request.prefix_group)];
      line["prefix_tokens"] = request.prefix_tokens;
    }
    out << line.dump() << "\n";
  }
  // Flushed here so the caller's check of the stream sees a write that failed (a full disk),
  // rather than the buffer failing unseen when the file is closed.
  out.flush();
}

}  // namespace kvvm::cli
