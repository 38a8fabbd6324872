// Engine: many requests through one model and one KV space at once (docs/ARCHITECTURE.md
// "Batched engine").
//
// Continuous batching: every step packs the decode tokens of running sequences first, then
// prefill chunks of admitted ones, up to a token budget, and runs them as one model step.
// Admission goes through the KV manager (kv_manager.h): the prefix cache when on (per-tenant
// salt: only the prompt tokens not already cached are computed) and the arena under the
// governor; a refusal leaves the request queued. The queue is bounded by count and by wait: past
// either, a request is refused as overloaded with an estimate of when to retry. When a running
// sequence cannot grow even after reclaim, the newest running sequence is preempted: its KV is
// released and it is requeued to be recomputed from its prompt and the tokens it already produced
// (the counter-based sampler draws the same numbers again), so no answer is ever cut short.
//
// Decode-only steps replay CUDA graphs (one per batch-size bucket, captured at start under
// the arena's capture guard); every commit happens before the replay, so one graph serves
// every length. Graphs off (or the CPU backend) gives the same tokens.
//
// Threading: submit(), cancel(), stats() and retry_after() may be called from any thread.
// Steps run on one thread: the caller's (step(), run_until_idle(): tests, `kvvm generate`)
// or the engine's own after start() (the server). Callbacks run on the stepping thread, one
// request's events in order; a callback must not call step() (it may call submit / cancel).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/engine/generate.h"
#include "kvvm/engine/kv_space.h"
#include "kvvm/engine/speculative.h"
#include "kvvm/grammar/compiled_grammar.h"
#include "kvvm/kv/prefix/prefix_cache.h"
#include "kvvm/model/model.h"
#include "kvvm/tokenizer/tokenizer.h"

namespace kvvm::engine {

using RequestId = std::uint64_t;

// DRY ("don't repeat yourself", llama.cpp's and text-generation-webui's sampler): a token that
// would extend a repetition of the context (prompt and output) by one is penalized by
// multiplier * base ^ (L - allowed_length), L the repetition's length, where L >=
// allowed_length; no repetition runs across a breaker token (src/engine/dry_penalty.h).
struct DryPenalty {
  float multiplier = 0;                // 0: off
  float base = 1.75f;                  // > 1
  std::uint32_t allowed_length = 2;    // repetitions this long are free
  std::uint32_t last_n = 0;            // the context's last tokens searched; 0: all of them
  std::vector<std::int32_t> breakers;  // token ids, ascending
};

struct EngineRequest {
  std::vector<std::int32_t> prompt;  // non-empty, ids inside the vocabulary
  std::uint32_t max_tokens = 128;    // >= 1; 0 only with keep_prompt_logits: prefill only
  SamplingParams sampling;
  // End tokens (not emitted). Empty with use_model_eos: the config's eos ids.
  std::vector<std::int32_t> stop_ids;
  bool use_model_eos = true;  // false: only stop_ids end it (ignore_eos)
  // Text that ends generation when it appears in the output (not emitted, nor anything
  // after it). Needs EngineOptions::tokenizer.
  std::vector<std::string> stop_strings;
  std::uint64_t tenant = 0;  // the prefix cache's salt: tenants never share KV
  // The logits at the prompt's last position, in the last event (RequestEvent::prompt_logits):
  // scoring a prompt, and generate()'s prefill-only requests.
  bool keep_prompt_logits = false;
  // Sequences generated from the prompt (OpenAI's n): one prefill, then the other n - 1 fork
  // the first's KV at the prompt's end (copy-on-write, the boundary window copied) and each
  // draws with seed + its index, so choice i is what n = 1 with seed + i gives. A fork that
  // finds no room, or no running place, admits as a request of its own (the prefix cache
  // shares what it can): the same tokens either way.
  std::uint32_t n = 1;
  // Log-probabilities of every generated token (RequestEvent::logprobs) with this many
  // alternatives, at most model::kMaxTopLogprobs; nullopt: none.
  std::optional<std::uint32_t> logprobs;
  // The log-probability of every prompt token after the first, with `logprobs` alternatives,
  // in the choice's first event (RequestEvent::prompt_logprobs). The prompt is computed whole
  // (the prefix cache is not read for it): cached tokens have no logits.
  bool prompt_logprobs = false;
  // Added to the logits of these ids before every draw (OpenAI's logit_bias; -inf bans).
  std::vector<std::pair<std::int32_t, float>> logit_bias;
  DryPenalty dry;  // applied as a bias on the tokens it penalizes, with logit_bias
  // The end tokens (stop_ids and the model's eos) cannot be drawn before this many tokens
  // (stop strings still end it).
  std::uint32_t min_tokens = 0;
  // The output must match this grammar (structured output): every draw is masked to the tokens
  // it allows, an end token only where it has matched; the request stops (kStop) once nothing
  // but an end may follow. Compiled over the engine's tokenizer's vocabulary (EngineOptions::
  // tokenizer), off the step thread (kvvm/grammar/constraint.h's GrammarCache); each choice of
  // n has its own matcher.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  // With `grammar`: the grammar applies only after the output first contains this text (a
  // tool call's opening tag under tool_choice auto: free text until the model opens a call,
  // then the call must parse); it matches what follows the trigger. Empty: from the start.
  // Needs the engine's tokenizer.
  std::string grammar_trigger;
  // The output's text leaves special tokens out (an end token the request chose to ignore,
  // say); false writes them (Mistral's [TOOL_CALLS], which its tool-call parser reads).
  bool skip_special_tokens = true;
  // With EngineOptions::speculative on: false opts this request out (it decodes a token a step).
  bool speculate = true;
};

// What a request may ask of one model over one KV space.
struct RequestLimits {
  std::uint64_t context = 0;     // prompt + max_tokens at most
  std::uint32_t vocab_size = 0;  // every id below it
};
// The context is the smaller of the space's max_context and the model's
// max_position_embeddings (when the config gives one): never a truncation.
RequestLimits request_limits(const model::Model& model, const KvSpace& kv);

// The one check of a request's limits, for every front end (Engine::submit, generate(), the
// server's parsing), so the same mistake gets the same message: a non-empty prompt, ids
// inside the vocabulary (prompt and stop_ids), max_tokens >= 1 (0 only with
// keep_prompt_logits or prompt_logprobs, and then n = 1), prompt + max_tokens within the
// context, the sampling parameters, n >= 1, logprobs <= model::kMaxTopLogprobs, logit_bias ids
// inside the vocabulary with biases not NaN, min_tokens <= max_tokens.
// InvalidArgument naming the field first, then the value and the limit.
Status check_request_limits(const EngineRequest& request, const RequestLimits& limits);

// kError covers refusals after submit (overloaded in the queue, a fault); kCancelled, cancel().
enum class RequestEnd : std::uint8_t { kStop, kLength, kCancelled, kError };
std::string_view to_string(RequestEnd end);

struct RequestStats {
  std::uint32_t prompt_tokens = 0;
  std::uint32_t cached_tokens = 0;  // prompt tokens found in the prefix cache (last admission)
  std::uint32_t generated_tokens = 0;
  std::uint32_t forced_tokens = 0;  // of those, a grammar's forced runs (not drawn)
  std::uint32_t preemptions = 0;
  double queue_seconds = 0;          // submit to first admission
  double time_to_first_token = 0;    // submit to the first generated token, seconds
  double time_per_output_token = 0;  // mean gap after the first token, seconds (0: one token)
  double total_seconds = 0;          // submit to finish
};

// One callback per step that produced something for one of the request's choices, and a last
// one per choice with finished set (a request of n choices ends after n of them). Spans and
// views are valid during the callback only.
struct RequestEvent {
  RequestId id = 0;
  std::uint32_t index = 0;               // the choice, in [0, n)
  std::span<const std::int32_t> tokens;  // new tokens (end tokens and stop strings excluded)
  // New text (with a tokenizer): UTF-8 complete, held back while it may be the start of a
  // stop string.
  std::string_view text;
  bool finished = false;
  RequestEnd end = RequestEnd::kLength;  // when finished
  Status error;                          // when end == kError
  double retry_after_seconds = 0;        // when refused as overloaded
  const RequestStats* stats = nullptr;   // when finished
  // When finished and asked (keep_prompt_logits): [vocab_size] at the prompt's last position.
  std::span<const float> prompt_logits;
  // With EngineRequest::logprobs: one per token in `tokens`.
  std::span<const model::RowLogprobs> logprobs;
  // With EngineRequest::prompt_logprobs, in the choice's first event: the prompt's tokens
  // 1 .. size - 1, each scored given the tokens before it.
  std::span<const model::RowLogprobs> prompt_logprobs;
};
using RequestCallback = std::function<void(const RequestEvent&)>;

struct EngineOptions {
  // Sequences in a step; 0: min(model max_chunks, step_tokens, the space's sequences): its
  // KvSpaceOptions::sequences when set, else its slots less the decode graphs' padding slot
  // when they are captured.
  std::uint32_t max_running = 0;
  std::uint32_t step_tokens = 0;    // token budget of a step; 0: the model's max_step_tokens
  std::uint32_t prefill_chunk = 0;  // tokens of one prefill chunk at most; 0: step_tokens
  // Prefill tokens of a step that also decodes, at most (every prefill chunk together), so
  // new prompts stretch a running answer's time per token by a bounded amount; 0: no bound
  // but step_tokens. At most step_tokens. Steps without a decode are not bounded.
  std::uint32_t max_prefill_tokens_while_decoding = 0;
  // A time-per-output-token target for the steps that decode (0: none): the engine fits each
  // step's time as a fixed part plus a part per token over the steps it ran (its clock, plan
  // to delivery) and bounds a decoding step's prefill tokens to what the target leaves after
  // its decode tokens, at least kTpotPrefillFloor so prompts still advance; within
  // max_prefill_tokens_while_decoding when that is set too. No bound until the fit has seen
  // steps of two sizes.
  std::chrono::microseconds tpot_target{0};
  // A time-to-first-token target (0: none) that raises the share tpot_target leaves a decoding
  // step when the prompts still without their first token (the running ones, then the line,
  // the first 64) would otherwise miss submit + ttft_target: the step takes the smallest share
  // at which each of them that can still make it does, by the same fitted step time (one
  // already late, or one that could not make it even at the whole bound, is left out); within
  // max_prefill_tokens_while_decoding and step_tokens. Without tpot_target a decoding step
  // already takes all it may, and this changes nothing; no raise before the fit either.
  std::chrono::microseconds ttft_target{0};
  std::uint32_t max_queue = 256;  // waiting requests; a submit beyond is refused (overloaded)
  // Still waiting longer once a step has admitted what it could: refused (overloaded); 0: no
  // limit. A preempted request is never refused.
  std::chrono::milliseconds max_queue_wait{30000};
  // A submit whose predicted wait (the requests queued ahead of it over the measured admission
  // rate) exceeds max_queue_wait is refused at once (overloaded) instead of after waiting that
  // long. The prediction is first multiplied by how far recent ones fell short of the waits
  // that followed (the largest waited / predicted of the last 32 admissions, a prediction under
  // a quarter of the bound counted as that quarter; 1 to 8), so a request accepted is rarely
  // refused later. Nothing is predicted before two admissions have measured a rate.
  bool refuse_predicted_wait = true;
  // With refuse_predicted_wait: the prediction is the larger of that rate's and a forecast
  // played out from the work left (docs/ARCHITECTURE.md "Refusal at arrival"): each running
  // answer frees its place after its prompt's chunks and the tokens it is expected to generate
  // still (learned from the answers that ended: those that ran to their max_tokens, and how
  // long those that stopped went on), each request in line then holds the first place to free,
  // and a step takes the measured step period. It sees a wave of long answers holding every
  // place before any admission is late. Nothing is forecast before 8 answers have ended.
  bool wait_forecast = true;
  // With the engine's own thread (start()): once nothing has run or waited for this long,
  // what finished slots keep mapped for reuse and the pool's spare handles go back to the
  // budget (KvManager::release_idle), so an idle server holds only its prefix cache; 0: never.
  // Reuse is then paid once by the next admission (a map per window).
  std::chrono::milliseconds idle_release{30000};
  bool prefix_cache = true;
  // A constrained request's forced runs (where its grammar allows one continuation only, up to
  // its next choice) are taken without drawing, as the tokenizer tokenises them (the last piece
  // left to the draw, where it may merge with what follows): fewer steps for JSON's keys and
  // punctuation. Needs the tokenizer; never for a request asking for log-probabilities.
  bool jump_forward = true;
  SpeculativeOptions speculative;  // off unless num_speculative_tokens > 0
  // With speculative.method kDraftModel: the draft and its KV space (speculative.h).
  DraftModel draft;
  std::string model_identity;  // folded into cache keys; empty: the config's architecture
  bool graphs = true;          // CUDA: decode steps replay captured graphs
  std::vector<std::uint32_t> graph_batch_sizes;  // empty: 1, 2, 4, 8, 16, 32, ... max_running
  // Every admitted sequence commits max_context tokens at once and keeps them until it ends
  // (no growth, nothing reclaimable, no prefix cache: prefix_cache is turned off): the
  // preallocated-KV baseline (same engine, same kernels) that the arena is compared against.
  bool preallocate = false;
  const tokenizer::Tokenizer* tokenizer = nullptr;  // text and stop strings; outlives the engine
  // The scheduler's clock (submit and admission times, queue waits, the admission rate, the
  // request stats); empty: std::chrono::steady_clock::now. Tests step a fake one.
  std::function<std::chrono::steady_clock::time_point()> clock;
};

// The fewest prefill tokens EngineOptions::tpot_target leaves a decoding step.
inline constexpr std::uint32_t kTpotPrefillFloor = 16;

// Steps by the tokens they computed, as vLLM's vllm:iteration_tokens_total buckets them: a step
// of n tokens counts in the first bucket whose bound is >= n, else in the last.
inline constexpr std::array<std::uint64_t, 13> kStepTokenBounds = {
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
struct StepTokenCounts {
  std::array<std::uint64_t, kStepTokenBounds.size() + 1> buckets{};  // per bucket, not cumulative
  std::uint64_t tokens = 0;                                          // over every step
  void add(std::uint64_t step_tokens);
};

// Constrained draws by the time their mask took on the host (seconds): a draw counts in the
// first bucket whose bound is >= its time, else in the last.
inline constexpr std::array<double, 9> kMaskSecondsBounds = {5e-6,   1e-5, 2.5e-5, 5e-5, 1e-4,
                                                             2.5e-4, 1e-3, 1e-2,   1e-1};
struct GrammarStats {
  std::uint64_t constrained_requests = 0;  // submitted with EngineRequest::grammar
  std::uint64_t masks = 0;                 // masked draws
  std::uint64_t forced_tokens = 0;         // taken without a draw (EngineOptions::jump_forward)
  double mask_seconds = 0;                 // their host time, summed
  std::array<std::uint64_t, kMaskSecondsBounds.size() + 1> mask_buckets{};  // not cumulative
};

// Where the stepping thread's time went, summed over the steps that ran the model (seconds of
// the steady clock). What the device computes while the host launches is inside `launch`; the
// host's own work that leaves the device idle is schedule + prepare + update + deliver (and
// what the model does after its wait).
struct StepPhaseSeconds {
  std::uint64_t steps = 0;
  double schedule = 0;  // the scheduler's plan: admissions, KV commits, preemptions
  double prepare = 0;   // the runner's batch: ids, chunks, sampling, logit transforms, masks
  double launch = 0;    // the model's forward but its wait (CUDA: staging and launches)
  double wait = 0;      // the forward's wait for the device (Model::forward_waits)
  double update = 0;    // the draws applied: stops, stop strings, detokenization, forks
  double deliver = 0;   // counters published, the events' callbacks
  void add(const StepPhaseSeconds& other);
  // These less `earlier` (the same engine's, taken before): the phases of the steps between.
  StepPhaseSeconds since(const StepPhaseSeconds& earlier) const;
};

struct EngineStats {
  // Ended requests: finished (stop or length), cancelled, failed (kError, refusals in the
  // queue included).
  std::uint64_t submitted = 0, finished = 0, cancelled = 0, failed = 0;
  std::uint64_t refused_overloaded = 0;  // at submit and in the queue
  // Of those: at submit for their predicted wait (refuse_predicted_wait), and in the queue
  // past max_queue_wait (the backstop).
  std::uint64_t refused_predicted_wait = 0, refused_in_queue = 0;
  // What the predicted waits are multiplied by before the bound (refuse_predicted_wait): how
  // far recent predictions fell short of the waits that followed, 1 to 8.
  double wait_margin = 1;
  std::uint64_t preemptions = 0;
  std::uint64_t steps = 0, decode_only_steps = 0;
  StepTokenCounts step_tokens;  // the steps that ran, by their tokens
  std::uint64_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
  // Speculative decoding: the verifications (a sequence's step with proposals), the tokens
  // proposed and those kept (vLLM's spec_decode num_drafts, num_draft_tokens and
  // num_accepted_tokens).
  std::uint64_t spec_drafts = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0;
  // With a draft model: its forwards, and the times a sequence went without proposals because
  // the draft's KV was refused or a draft forward failed (it then decoded a token a step).
  std::uint64_t spec_draft_steps = 0, spec_draft_refused = 0, spec_draft_failed = 0;
  std::uint32_t running = 0, waiting = 0;
  std::uint32_t peak_running = 0;
  double kv_usage = 0;        // kv_usage() of kv_manager.h: the KV in use / the budget
  bool context_lost = false;  // health() is not OK
  PrefixCacheStats prefix;
  GrammarStats grammar;
  model::GraphStats graphs;
  StepPhaseSeconds phases;
  ArenaStats arena;
};

class Engine {
 public:
  // Captures the decode graphs when asked and possible. InvalidArgument naming the option.
  // REQUIRES: model and kv outlive the engine; nothing else uses the kv's arena.
  static Result<std::unique_ptr<Engine>> create(model::Model& model, KvSpace& kv,
                                                EngineOptions options);
  ~Engine();  // stops the thread, cancels what is left (callbacks run), releases every slot
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. InvalidArgument naming the field: check_request_limits, and stop
  // strings without a tokenizer; ResourceExhausted "overloaded" with retry_after() filled when
  // the queue is full or its predicted wait exceeds max_queue_wait; Unavailable while
  // draining or once the GPU context was lost (health()). The callback is not called for a
  // refused
  // submit.
  Result<RequestId> submit(EngineRequest request, RequestCallback callback);
  // The request ends (RequestEnd::kCancelled) at the next step; unknown or finished ids are
  // ignored.
  void cancel(RequestId id);

  // Seconds until a refused request is likely to be admitted: the queue ahead of it at the
  // recent admission rate (at least 1).
  double retry_after() const;

  // One scheduling step (admit, preempt if needed, run the model once, deliver events).
  // Returns whether anything is left to do. An error is a broken engine (every request has
  // been ended with it).
  Result<bool> step();
  Status run_until_idle();

  // The engine's own stepping thread (for servers): start() once; drain() stops accepting
  // new requests, waits up to `timeout` for the running and queued ones, cancels the rest
  // and stops the thread; it returns whether everything finished in time.
  Status start();
  bool drain(std::chrono::milliseconds timeout);

  EngineStats stats() const;
  // OK, or why the engine serves no more: the GPU context was lost (a sticky CUDA error,
  // context_lost() of kvvm/vmm/driver.h). Then every request it held ended with that error, and
  // submit() answers Unavailable; only a new process serves again.
  Status health() const;
  const EngineOptions& options() const;
  // The model it steps (its weight_stats() are safe to read from any thread).
  const model::Model& model() const;

 private:
  class Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvvm::engine
