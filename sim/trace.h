// Request traces for `kvvm simulate`: a seeded generator and a JSONL reader.
//
// A request arrives at a time in seconds with a prompt of some tokens and asks for some output
// tokens; it may declare that its first `prefix_tokens` tokens are a prefix shared by every
// request of its prefix group (a tenant's system prompt), which is what kvvm maps once.
//
// The generator draws (why these shapes: they are what serving benchmarks use):
//   - arrivals: a Poisson process of `rate` requests per second (exponential gaps);
//   - user prompt and output lengths: log-normal, ShareGPT-like. The defaults match the means
//     the vLLM paper reports for ShareGPT (Kwon et al., SOSP 2023, section 6.1 / figure 11:
//     161.31 input and 337.99 output tokens per request) with sigma chosen by us for a heavy
//     right tail (1.0 for prompts, 0.8 for outputs; not fitted): mu = ln(mean) - sigma^2 / 2;
//   - tenants: each request picks one of `tenants` uniformly; its prompt is the tenant's
//     system prompt (`system_prompt_tokens`) followed by the user prompt.
// Lengths are clamped so system + user + output <= max context: the user prompt first (so at
// least one output token fits), then the output. Every draw comes from std::mt19937_64 (whose
// output the standard fixes) through our own transforms, so a seed gives the same trace with
// every standard library.
//
// The JSONL format: one object per line; blank lines are skipped.
//   {"arrival": 0.25, "prompt_tokens": 812, "output_tokens": 120,
//    "prefix_group": "tenant-a", "prefix_tokens": 512}
// "arrival" (seconds, >= 0) and "output_tokens" (>= 1) are required; the prompt is either
// "prompt_tokens" (>= 1) or "prompt" (an array of token ids; only its length is used: the
// simulation never writes KV bytes); "prefix_group" (a string) and "prefix_tokens"
// (1 <= P <= the prompt) come together or not at all. Any other key is an error (a typo must not
// silently turn sharing off). prompt + output must fit in the max context. Arrivals must not
// decrease from one line to the next (a trace is a log in time order; an earlier arrival is a
// corrupt or shuffled file) and stay within kMaxArrivalSeconds. Each line is read through the
// bounded JSON reader (kMaxTraceLineBytes, 64 levels deep, UTF-8). A malformed line is reported
// as "FILE:LINE: what is wrong" and skipped; the rest still run. Requests are replayed in
// arrival order (ties keep file order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/kv/prefix/prefix_cache.h"  // TokenId

namespace kvvm::cli {

inline constexpr int kNoPrefixGroup = -1;

// Bounds on a trace, read or generated; what is past them is refused with the bound named.
// About 116 days: any replay or benchmark is far shorter, and a time like 1e308 s would make
// the simulated clock meaningless (everything "arrives" after the last event).
inline constexpr double kMaxArrivalSeconds = 1e7;
// 2^30 tokens of context: over 100 times the longest context windows published.
inline constexpr std::uint64_t kMaxContextTokens = std::uint64_t{1} << 30;
// Requests in one trace (about 10 GiB of request records): a guard against a typo such as
// --rate 1e12 or a runaway file filling memory.
inline constexpr std::uint64_t kMaxTraceRequests = 50'000'000;
// Prefix groups (tenants) in one trace, and the length of a group's name.
inline constexpr std::uint64_t kMaxPrefixGroups = 65536;
inline constexpr std::size_t kMaxPrefixGroupNameBytes = 256;
// One JSONL line: room for a prompt of about two million token ids.
inline constexpr std::size_t kMaxTraceLineBytes = std::size_t{16} << 20;
// Turns of one generated conversation.
inline constexpr std::uint32_t kMaxTurns = 10000;

struct TraceRequest {
  double arrival_s = 0;
  std::uint64_t prompt_tokens = 0;  // the system prompt included
  std::uint64_t output_tokens = 0;
  int prefix_group = kNoPrefixGroup;  // index into Trace::groups
  std::uint64_t prefix_tokens = 0;    // 0 without a group
  // Token ids, for the prefix-cache models: the prompt is ids[0, prompt_tokens) and the
  // generated tokens are ids[prompt_tokens, prompt_tokens + output_tokens) where present (a
  // multi-turn conversation's turns share one stream: the next turn resends this one's
  // reply). Null: synthesize_ids() makes them up.
  std::shared_ptr<const std::vector<TokenId>> ids = nullptr;
  std::uint64_t salt = 0;  // the tenant: caches never share across salts
  // Closed loop (multi-turn): the request whose completion this one waits for (index into
  // Trace::requests, earlier), then think_s more seconds; -1: arrives at arrival_s.
  std::int64_t follows = -1;
  double think_s = 0;
};

struct Trace {
  std::vector<TraceRequest> requests;  // by arrival time
  std::vector<std::string> groups;     // prefix group names
  // Lines that were skipped, each "FILE:LINE: what is wrong" (JSONL only).
  std::vector<std::string> errors;
  std::uint64_t lines_read = 0;  // non-blank lines
};

// ShareGPT-like log-normal defaults (see the top of this file).
inline constexpr double kShareGptPromptMean = 161.31;
inline constexpr double kShareGptOutputMean = 337.99;
inline constexpr double kDefaultPromptSigma = 1.0;
inline constexpr double kDefaultOutputSigma = 0.8;
// mu = ln(mean) - sigma^2 / 2.
double lognormal_mu(double mean, double sigma);

struct TraceGeneratorOptions {
  std::uint64_t requests = 3000;     // when duration_s is unset
  std::optional<double> duration_s;  // arrivals in [0, duration) instead of a count
  double rate = 30;                  // requests per second
  std::uint32_t tenants = 4;         // 0: no shared system prompt
  std::uint64_t system_prompt_tokens = 512;
  double prompt_mu = lognormal_mu(kShareGptPromptMean, kDefaultPromptSigma);
  double prompt_sigma = kDefaultPromptSigma;
  double output_mu = lognormal_mu(kShareGptOutputMean, kDefaultOutputSigma);
  double output_sigma = kDefaultOutputSigma;
  std::uint64_t max_context = 8192;  // tokens; prompt + output never exceed it
  std::uint64_t seed = 1;
};

// InvalidArgument (naming the option) for a rate <= 0, no requests, a negative sigma, a
// system prompt that leaves no room for one user token and one output token in max context,
// or any number past the bounds above (requests, duration, tenants, max context, and an
// arrival past kMaxArrivalSeconds at the given rate).
Result<Trace> generate_trace(const TraceGeneratorOptions& options);

// The multi-turn chat generator (`--conversations`): conversations arrive as a Poisson process
// of `rate` per second; each belongs to one of `tenants` (uniform), whose system prompt (the
// same ids for every conversation of the tenant) starts it. Turn k's prompt is the system
// prompt, every earlier user message and assistant reply, and the new user message (what a
// chat template resends); user messages and replies are log-normal (prompt_mu/sigma,
// output_mu/sigma) with random ids. Turn k+1 is sent think time (exponential, mean think_s)
// after turn k completed (closed loop, see sim/replay_scheduler.h); a conversation ends early when
// its next turn would not fit in max context. Salt = tenant + 1.
struct ChatGeneratorOptions {
  std::uint64_t conversations = 0;
  std::uint32_t turns = 8;
  double think_s = 5;
};
Result<Trace> generate_chat_trace(const TraceGeneratorOptions& options,
                                  const ChatGeneratorOptions& chat);

// Gives every request without ids some: a prefix group's first prefix_tokens are the same ids
// in every request of the group (so automatic detection finds what --prefix-group declares),
// the rest are unique to the request; the salt becomes the group + 1 when it was 0.
void synthesize_ids(Trace& trace);

// Reads a JSONL trace from `in`; `name` is what error lines start with. Malformed lines go to
// Trace::errors (the rest are kept). InvalidArgument when max_context is 0 or past
// kMaxContextTokens, or the trace holds more than kMaxTraceRequests requests.
Result<Trace> read_jsonl_trace(std::istream& in, const std::string& name,
                               std::uint64_t max_context);

// Writes a trace in the JSONL format above (the generator's output can be replayed or edited).
// Token ids, salts and a multi-turn trace's closed loop are not written: its replay is open
// loop (turns at their lower-bound arrival times) with made-up ids.
void write_jsonl_trace(const Trace& trace, std::ostream& out);

}  // namespace kvvm::cli
