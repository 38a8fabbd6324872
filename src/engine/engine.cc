// Engine: creation (options, KV manager, decode graphs), the calls other threads make
// (submit, cancel, stats, retry_after) and the engine's own stepping thread.
#include "kvvm/engine/engine.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "engine_impl.h"
#include "engine_options.h"
#include "kvvm/base/log.h"

namespace kvvm::engine {

void StepTokenCounts::add(std::uint64_t step_tokens) {
  const auto bound =
      std::lower_bound(kStepTokenBounds.begin(), kStepTokenBounds.end(), step_tokens);
  ++buckets[static_cast<std::size_t>(bound - kStepTokenBounds.begin())];
  tokens += step_tokens;
}

void StepPhaseSeconds::add(const StepPhaseSeconds& other) {
  steps += other.steps;
  schedule += other.schedule;
  prepare += other.prepare;
  launch += other.launch;
  wait += other.wait;
  update += other.update;
  deliver += other.deliver;
}

StepPhaseSeconds StepPhaseSeconds::since(const StepPhaseSeconds& earlier) const {
  StepPhaseSeconds d = *this;
  d.steps -= earlier.steps;
  d.schedule -= earlier.schedule;
  d.prepare -= earlier.prepare;
  d.launch -= earlier.launch;
  d.wait -= earlier.wait;
  d.update -= earlier.update;
  d.deliver -= earlier.deliver;
  return d;
}

std::string_view to_string(RequestEnd end) {
  switch (end) {
    case RequestEnd::kStop:
      return "stop";
    case RequestEnd::kLength:
      return "length";
    case RequestEnd::kCancelled:
      return "cancelled";
    case RequestEnd::kError:
      return "error";
  }
  return "unknown";
}

Engine::Impl::Impl(model::Model& model, std::unique_ptr<KvManager> kv, EngineOptions options,
                   std::uint64_t context, std::unique_ptr<DraftProposer> draft)
    : model_(model),
      kv_(std::move(kv)),
      options_(std::move(options)),
      context_(context),
      admission_(options_),
      draft_(std::move(draft)),
      scheduler_(model_, *kv_, options_, admission_),
      runner_(model_, options_.step_tokens) {
  scheduler_.set_draft_proposer(draft_.get());
}

Status Engine::Impl::init() {
  const std::optional<SlotId> pad_slot = kv_->pad_slot();
  if (!pad_slot) return Status::Ok();
  // Graphs are an optimisation: a failed capture leaves eager steps, never a failed engine.
  std::vector<std::uint32_t> buckets = options_.graph_batch_sizes.empty()
                                           ? default_buckets(options_.max_running)
                                           : options_.graph_batch_sizes;
  KvSpace& space = kv_->space();
  Status captured;
  {
    auto guard = space.arena().begin_capture();
    captured = model_.capture_decode_graphs(
        model::DecodeGraphOptions{.batch_sizes = buckets,
                                  .kv = space.view(),
                                  .pad_slot = *pad_slot,
                                  .max_length = static_cast<std::uint32_t>(std::min<std::uint64_t>(
                                      context_, std::numeric_limits<std::uint32_t>::max()))});
  }
  if (!captured.ok()) {
    log(LogLevel::kWarning,
        "engine: decode graphs not captured, steps run eagerly: " + captured.to_string());
    kv_->release_pad_slot();
  } else {
    graphs_captured_ = true;
    scheduler_.set_graph_buckets(std::move(buckets));
  }
  MutexLock lock(mutex_);  // no other thread yet; taken so the rule has no exception
  graphs_ = model_.graph_stats();
  return Status::Ok();
}

Result<std::unique_ptr<Engine>> Engine::create(model::Model& model, KvSpace& kv,
                                               EngineOptions options) {
  if (kv.options().backend != model.backend()) {
    return Status::InvalidArgument("kv: a KV space of the " +
                                   std::string(model::to_string(kv.options().backend)) +
                                   " backend for a model of the " +
                                   std::string(model::to_string(model.backend())) + " backend");
  }
  // The model reads the KV through the arena's view: its shape must be the model's.
  const Geometry& g = kv.arena().plan().geometry;
  const model::ModelConfig& c = model.config();
  if (g.layers != c.layers || g.kv_heads != c.kv_heads || g.head_dim != c.head_dim) {
    return Status::InvalidArgument("kv: a KV space of " + std::to_string(g.layers) + " layers x " +
                                   std::to_string(g.kv_heads) + " KV heads x " +
                                   std::to_string(g.head_dim) + " for a model of " +
                                   std::to_string(c.layers) + " x " + std::to_string(c.kv_heads) +
                                   " x " + std::to_string(c.head_dim));
  }
  const bool want_graphs = options.graphs && model.backend() == model::Backend::kCuda;
  bool pad = want_graphs && kv.options().max_slots > kPadSlots;
  if (want_graphs && !pad) {
    log(LogLevel::kWarning, "engine: decode graphs off: they need a padding slot (max_slots 1)");
  }
  if (!options.graph_batch_sizes.empty()) {
    KVVM_RETURN_IF_ERROR(check_buckets(options.graph_batch_sizes, model.limits().max_chunks));
  }
  KVVM_RETURN_IF_ERROR(resolve_options(model, kv, pad, options));
  const std::uint64_t context = request_limits(model, kv).context;
  KVVM_ASSIGN_OR_RETURN(
      std::unique_ptr<KvManager> manager,
      KvManager::create(kv, KvManagerOptions{.prefix_cache = options.prefix_cache,
                                             .model_identity = cache_identity(model, kv, options),
                                             .preallocate = options.preallocate}));
  if (pad) {
    // Before any sequence: the padding slot is the first the arena hands out.
    if (Status reserved = manager->reserve_pad_slot(); !reserved.ok()) {
      log(LogLevel::kWarning,
          "engine: decode graphs off: no padding slot: " + reserved.to_string());
    }
  }
  std::unique_ptr<DraftProposer> draft;
  if (options.speculative.enabled() &&
      options.speculative.method == SpeculativeMethod::kDraftModel) {
    KVVM_ASSIGN_OR_RETURN(draft, DraftProposer::create(options.draft, model,
                                                       options.speculative.num_speculative_tokens,
                                                       options.max_running, options.graphs));
  }
  auto impl = std::make_unique<Impl>(model, std::move(manager), std::move(options), context,
                                     std::move(draft));
  KVVM_RETURN_IF_ERROR(impl->init());
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

Engine::Impl::~Impl() {
  {
    MutexLock lock(mutex_);
    stop_ = true;
    draining_ = true;
    cancel_all_ = true;
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
  // Without a thread (or if it stopped first): what is left is cancelled here, callbacks run.
  for (int i = 0; i < 2; ++i) {
    {
      MutexLock lock(mutex_);
      cancel_all_ = true;
    }
    Result<bool> more = step();
    if (!more.ok() || !*more) break;
  }
  if (graphs_captured_) model_.release_decode_graphs();
  kv_->release_pad_slot();  // nothing replays the graphs any more
}

std::unique_ptr<RequestState> Engine::Impl::make_state(EngineRequest request,
                                                       std::uint32_t index) const {
  auto r = std::make_unique<RequestState>();
  r->index = index;
  r->ends = request.stop_ids;
  if (request.use_model_eos) {
    for (const std::int32_t eos : model_.config().eos_token_ids) {
      if (std::find(r->ends.begin(), r->ends.end(), eos) == r->ends.end()) r->ends.push_back(eos);
    }
  }
  r->prompt_size = static_cast<std::uint32_t>(request.prompt.size());
  r->tokens.reserve(request.prompt.size() + request.max_tokens);
  r->tokens = request.prompt;
  r->stats.prompt_tokens = r->prompt_size;
  if (options_.tokenizer != nullptr) {
    r->text = std::make_unique<TextStream>(*options_.tokenizer, request.stop_strings,
                                           request.skip_special_tokens);
  }
  if (request.grammar) r->matcher = std::make_unique<grammar::Matcher>(request.grammar);
  r->grammar_started = request.grammar_trigger.empty();
  r->request = std::move(request);
  r->request.sampling.seed += index;  // choice i draws as n = 1 with seed + i would
  return r;
}

Result<RequestId> Engine::Impl::submit(EngineRequest request, RequestCallback callback) {
  KVVM_RETURN_IF_ERROR(validate(request));
  // The other choices copy the request; the first takes it.
  std::vector<std::unique_ptr<RequestState>> forks;
  for (std::uint32_t i = 1; i < request.n; ++i) {
    forks.push_back(make_state(request, i));
    forks.back()->callback = callback;
  }
  auto r = make_state(std::move(request), 0);
  r->forks = std::move(forks);
  r->callback = std::move(callback);
  r->submitted = now();
  for (auto& fork : r->forks) fork->submitted = r->submitted;

  RequestId id = 0;
  {
    MutexLock lock(mutex_);
    if (!lost_.ok()) return Status::Unavailable(lost_.message());
    if (draining_) return Status::Unavailable("the engine is draining: no new request");
    KVVM_RETURN_IF_ERROR(admission_.check_arrival(*r, queued_, running_count_));
    id = next_id_++;
    r->id = id;
    if (r->matcher) ++grammar_.constrained_requests;
    for (auto& fork : r->forks) fork->id = id;
    inbox_.push_back(std::move(r));
    ++queued_;
    ++submitted_;
  }
  wake_.notify_one();
  return id;
}

void Engine::Impl::cancel(RequestId id) {
  {
    MutexLock lock(mutex_);
    cancels_.push_back(id);
  }
  wake_.notify_one();
}

Clock::time_point Engine::Impl::now() const {
  return options_.clock ? options_.clock() : Clock::now();
}

double Engine::Impl::retry_after() const {
  const Clock::time_point at = now();
  std::uint64_t queued = 0;
  {
    MutexLock lock(mutex_);
    queued = queued_;
  }
  return admission_.retry_after(queued, at);
}

Status Engine::Impl::run_until_idle() {
  while (true) {
    KVVM_ASSIGN_OR_RETURN(bool more, step());
    if (!more) return Status::Ok();
  }
}

Status Engine::Impl::start() {
  MutexLock lock(mutex_);
  if (started_) return Status::FailedPrecondition("start: the engine's thread already started");
  if (draining_) return Status::FailedPrecondition("start: the engine is draining");
  started_ = true;
  worker_ = std::thread([this] { worker(); });
  return Status::Ok();
}

void Engine::Impl::worker() {
  MutexLock lock(mutex_);
  bool released = true;  // nothing kept yet
  const auto has_work = [&]() KVVM_REQUIRES(mutex_) {
    return stop_ || work_left_ || cancel_all_ || !inbox_.empty() || !cancels_.empty();
  };
  while (true) {
    if (released || options_.idle_release.count() == 0) {
      wake_.wait(lock.native(), has_work);
    } else if (!wake_.wait_for(lock.native(), options_.idle_release, has_work)) {
      // Idle for idle_release: what the finished sequences kept for reuse goes back.
      lock.unlock();
      kv_->release_idle();
      lock.lock();
      released = true;
      continue;
    }
    if (stop_ && !work_left_ && !cancel_all_ && inbox_.empty()) break;
    lock.unlock();
    Result<bool> more = step();
    if (!more.ok()) log(LogLevel::kError, "engine step: " + more.status().to_string());
    lock.lock();
    released = false;
  }
}

bool Engine::Impl::drain(std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  bool threaded = false;
  {
    MutexLock lock(mutex_);
    draining_ = true;
    threaded = worker_.joinable();
  }
  bool in_time = false;
  if (threaded) {
    MutexLock lock(mutex_);
    in_time = idle_.wait_until(lock.native(), deadline, [&]() KVVM_REQUIRES(mutex_) {
      return !work_left_ && inbox_.empty();
    });
    cancel_all_ = true;
    stop_ = true;
    lock.unlock();
    wake_.notify_all();
    worker_.join();
    return in_time;
  }
  while (Clock::now() < deadline) {
    Result<bool> more = step();
    if (!more.ok() || !*more) {
      in_time = more.ok();
      break;
    }
  }
  if (!in_time) {
    {
      MutexLock lock(mutex_);
      cancel_all_ = true;
    }
    step().status().ignore();
  }
  return in_time;
}

EngineStats Engine::Impl::stats() const {
  EngineStats s;
  const AdmissionControl::Counts admission = admission_.counts();
  {
    MutexLock lock(mutex_);
    s.submitted = submitted_;
    s.finished = published_.finished;
    s.cancelled = published_.cancelled;
    s.failed = published_.failed;
    s.refused_in_queue = published_.refused_in_queue;
    s.preemptions = published_.preemptions;
    s.steps = published_.steps;
    s.decode_only_steps = published_.decode_only_steps;
    s.step_tokens = published_.step_tokens;
    s.prompt_tokens = published_.prompt_tokens;
    s.cached_tokens = published_.cached_tokens;
    s.generated_tokens = published_.generated_tokens;
    s.spec_drafts = published_.spec_drafts;
    s.spec_draft_tokens = published_.spec_draft_tokens;
    s.spec_accepted_tokens = published_.spec_accepted_tokens;
    s.spec_draft_steps = published_.spec_draft_steps;
    s.spec_draft_refused = published_.spec_draft_refused;
    s.spec_draft_failed = published_.spec_draft_failed;
    s.running = running_count_;
    s.waiting = static_cast<std::uint32_t>(queued_);
    s.peak_running = published_.peak_running;
    s.graphs = graphs_;
    s.phases = phases_;
    s.grammar = grammar_;
    s.grammar.forced_tokens = published_.forced_tokens;
    s.context_lost = !lost_.ok();
  }
  s.refused_overloaded = admission.refused_at_arrival + s.refused_in_queue;
  s.refused_predicted_wait = admission.refused_predicted;
  s.wait_margin = admission.wait_margin;
  KvManagerStats kv = kv_->stats();
  s.kv_usage = kv.usage;
  s.prefix = kv.prefix;
  s.arena = std::move(kv.arena);
  return s;
}

Result<RequestId> Engine::submit(EngineRequest request, RequestCallback callback) {
  return impl_->submit(std::move(request), std::move(callback));
}
void Engine::cancel(RequestId id) { impl_->cancel(id); }
double Engine::retry_after() const { return impl_->retry_after(); }
Result<bool> Engine::step() { return impl_->step(); }
Status Engine::run_until_idle() { return impl_->run_until_idle(); }
Status Engine::start() { return impl_->start(); }
bool Engine::drain(std::chrono::milliseconds timeout) { return impl_->drain(timeout); }
EngineStats Engine::stats() const { return impl_->stats(); }
Status Engine::health() const { return impl_->lost(); }
const EngineOptions& Engine::options() const { return impl_->options(); }

const model::Model& Engine::model() const { return impl_->model(); }

}  // namespace kvvm::engine
