// The automatic prefix cache in `kvvm simulate`: the multi-turn chat generator (each turn resends
// the whole conversation; a tenant's system prompt is the same ids in each of its conversations),
// the vLLM-style paged-16+cache baseline's hit accounting on a hand-made trace, kvvm+cache's hits
// on the same trace (llama-3-8b on a 2 MiB granule: windows of exactly 16 tokens, as the
// baseline's blocks), tenant isolation by salt in both, and the closed-loop scheduler.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "kvvm/kv/geometry.h"
#include "kvvm/kv/layout.h"
#include "kvvm/model/kv_config.h"
#include "kvvm/vmm/host_driver.h"
#include "sim/arena_model.h"
#include "sim/baselines.h"
#include "sim/replay_scheduler.h"
#include "sim/trace.h"

namespace kvvm::cli {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

TraceRequest request_of(std::uint64_t prompt, std::shared_ptr<const std::vector<TokenId>> ids,
                        std::uint64_t salt) {
  TraceRequest request;
  request.prompt_tokens = prompt;
  request.output_tokens = 1;
  request.ids = std::move(ids);
  request.salt = salt;
  return request;
}

ChatGeneratorOptions chat_of(std::uint64_t conversations, std::uint32_t turns, double think_s) {
  ChatGeneratorOptions chat;
  chat.conversations = conversations;
  chat.turns = turns;
  chat.think_s = think_s;
  return chat;
}

std::vector<TokenId> prompt_ids(const TraceRequest& request) {
  return {request.ids->begin(),
          request.ids->begin() + static_cast<std::ptrdiff_t>(request.prompt_tokens)};
}

TraceGeneratorOptions chat_generator() {
  TraceGeneratorOptions options;
  options.rate = 2;
  options.tenants = 3;
  options.system_prompt_tokens = 40;
  options.prompt_mu = lognormal_mu(30, 0.5);
  options.prompt_sigma = 0.5;
  options.output_mu = lognormal_mu(20, 0.5);
  options.output_sigma = 0.5;
  options.max_context = 2048;
  options.seed = 7;
  return options;
}

TEST(SimulateChatTrace, EachTurnResendsTheConversationAndTenantsShareTheirSystemPrompt) {
  const ChatGeneratorOptions chat = chat_of(20, 4, 2);
  const Result<Trace> trace = generate_chat_trace(chat_generator(), chat);
  ASSERT_TRUE(trace.ok()) << trace.status().to_string();
  ASSERT_EQ(trace->requests.size(), 80u);  // nothing near the max context
  std::vector<std::vector<TokenId>> system(3);
  std::size_t first_turns = 0;
  for (std::size_t i = 0; i < trace->requests.size(); ++i) {
    const TraceRequest& request = trace->requests[i];
    ASSERT_TRUE(request.ids);
    ASSERT_GE(request.ids->size(), request.prompt_tokens + request.output_tokens);
    ASSERT_GE(request.salt, 1u);
    const std::vector<TokenId> ids = prompt_ids(request);
    // The tenant's system prompt: the same ids within a tenant.
    std::vector<TokenId>& tenant = system[request.salt - 1];
    const std::vector<TokenId> head(ids.begin(), ids.begin() + 40);
    if (tenant.empty()) tenant = head;
    EXPECT_EQ(head, tenant) << "request " << i;
    if (request.follows < 0) {
      ++first_turns;
      continue;
    }
    // Turn k's prompt starts with turn k-1's prompt and reply, then a new user message.
    const auto previous_index = static_cast<std::size_t>(request.follows);
    ASSERT_LT(previous_index, i);
    const TraceRequest& previous = trace->requests[previous_index];
    const std::uint64_t resent = previous.prompt_tokens + previous.output_tokens;
    ASSERT_GT(request.prompt_tokens, resent);
    EXPECT_TRUE(std::equal(previous.ids->begin(),
                           previous.ids->begin() + static_cast<std::ptrdiff_t>(resent),
                           ids.begin()));
    EXPECT_EQ(request.salt, previous.salt);
    EXPECT_GT(request.arrival_s, previous.arrival_s);
  }
  EXPECT_EQ(first_turns, 20u);
  // Different tenants, different system prompts.
  EXPECT_NE(system[0], system[1]);
  EXPECT_NE(system[1], system[2]);

  // Seeded: the same seed, the same ids; another seed, others.
  const Result<Trace> again = generate_chat_trace(chat_generator(), chat);
  ASSERT_TRUE(again.ok());
  for (std::size_t i = 0; i < trace->requests.size(); ++i) {
    EXPECT_EQ(prompt_ids(trace->requests[i]), prompt_ids(again->requests[i]));
    EXPECT_EQ(trace->requests[i].follows, again->requests[i].follows);
  }
  TraceGeneratorOptions other = chat_generator();
  other.seed = 8;
  const Result<Trace> different = generate_chat_trace(other, chat);
  ASSERT_TRUE(different.ok());
  EXPECT_NE(prompt_ids(trace->requests[0]), prompt_ids(different->requests[0]));
}

TEST(SimulateChatTrace, RefusesWhatMakesNoSense) {
  EXPECT_FALSE(generate_chat_trace(chat_generator(), chat_of(0, 8, 5)).ok());
  EXPECT_FALSE(generate_chat_trace(chat_generator(), chat_of(1, 0, 5)).ok());
  EXPECT_FALSE(generate_chat_trace(chat_generator(), chat_of(1, 8, -1)).ok());
}

// The hand-made trace: A (40 tokens, tenant 1, one output token); B resends A's 40 tokens plus
// 10 (tenant 1); C is B under tenant 2; D is A's first 32 tokens (tenant 1).
struct HandMade {
  std::shared_ptr<std::vector<TokenId>> stream = std::make_shared<std::vector<TokenId>>();
  TraceRequest a, b, c, d;
  HandMade() {
    for (TokenId i = 0; i < 64; ++i) stream->push_back(5000 + i * 7);
    a = request_of(40, stream, 1);
    b = request_of(50, stream, 1);
    c = b;
    c.salt = 2;
    d = request_of(32, stream, 1);
  }
};

// Replays A (admit, grow by its output token, release), then B, C and D one after the other,
// each admitted and released; returns the hits after each.
std::vector<std::uint64_t> replay(MemoryModel& model, const HandMade& trace) {
  std::vector<std::uint64_t> hits;
  const auto run = [&](std::size_t seq, const TraceRequest& request) {
    const Result<bool> admitted = model.admit(seq, request, request.prompt_tokens);
    EXPECT_TRUE(admitted.ok() && *admitted) << model.name() << " request " << seq;
    const Result<bool> grown = model.grow(seq, request.prompt_tokens + 1);
    EXPECT_TRUE(grown.ok() && *grown) << model.name() << " request " << seq;
    EXPECT_TRUE(model.release(seq).ok());
    hits.push_back(model.cache().hits);
  };
  run(0, trace.a);
  run(1, trace.b);
  run(2, trace.c);
  run(3, trace.d);
  return hits;
}

TEST(SimulatePrefixCache, PagedCacheCountsVllmHits) {
  const HandMade trace;
  PagedCacheModel model(64 * 16 * 1024, kPagedBlockTokens, 1024);
  EXPECT_EQ(model.name(), "paged-16+cache");
  const std::vector<std::uint64_t> hits = replay(model, trace);
  // A: nothing cached. B: A's two full blocks (its third held tokens 32..40, not full).
  // C: another salt, nothing. D: 32 tokens, but the last must be computed: one block.
  EXPECT_EQ(hits, (std::vector<std::uint64_t>{0, 32, 32, 48}));
  const CacheFigures figures = model.cache();
  EXPECT_EQ(figures.queries, 40u + 50 + 50 + 32);
  EXPECT_TRUE(figures.enabled);
  EXPECT_EQ(figures.saved_bytes(), 48u * 1024);
}

TEST(SimulatePrefixCache, PagedCacheEvictsTheLeastRecentlyFreedBlockWhenFull) {
  // Four blocks: A takes three (two cached) and is released, last block first; E (other ids)
  // takes the never-used block, then A's tail (no hash: not full), so A's cached blocks stay.
  const HandMade trace;
  PagedCacheModel model(4 * 16 * 1024, kPagedBlockTokens, 1024);
  ASSERT_TRUE(*model.admit(0, trace.a, 40));
  ASSERT_TRUE(model.release(0).ok());
  auto other = std::make_shared<std::vector<TokenId>>(64, 9);
  const TraceRequest e = request_of(20, other, 1);
  ASSERT_TRUE(*model.admit(1, e, 20));     // two blocks: the never-used one and A's tail
  EXPECT_EQ(model.cache().evictions, 0u);  // A's tail held no full block's hash
  ASSERT_TRUE(model.release(1).ok());
  // A's two cached blocks are still there: B hits them, and needs only two new blocks.
  ASSERT_TRUE(*model.admit(2, trace.b, 50));
  EXPECT_EQ(model.cache().hits, 32u);
  ASSERT_TRUE(model.release(2).ok());
  // Four blocks without a hit (64 ids of another stream) evict every cached one.
  const TraceRequest f = request_of(64, other, 3);
  ASSERT_TRUE(*model.admit(3, f, 64));
  EXPECT_FALSE(*model.admit(4, trace.d, 32));  // no room: all four in use
  EXPECT_GE(model.cache().evictions, 3u);
}

TEST(SimulatePrefixCache, PagedCacheEvictsTheLeastRecentlyUsedTenantFirstAndNeverAHeldBlock) {
  // Eight blocks. Tenant 1's two-block prompt runs and is released, then tenant 2's (the same
  // ids: only the salt tells them apart); both stay cached, in free blocks.
  auto stream = std::make_shared<std::vector<TokenId>>();
  for (TokenId i = 0; i < 200; ++i) stream->push_back(100 + i);
  auto unique = std::make_shared<std::vector<TokenId>>(200, 7);
  PagedCacheModel model(8 * 16 * 1024, kPagedBlockTokens, 1024);
  const TraceRequest first = request_of(33, stream, 1), second = request_of(33, stream, 2);
  ASSERT_TRUE(*model.admit(0, first, 33));  // three blocks, two of them full
  ASSERT_TRUE(model.release(0).ok());
  ASSERT_TRUE(*model.admit(1, second, 33));
  EXPECT_EQ(model.cache().hits, 0u);  // another tenant's blocks are not its own
  ASSERT_TRUE(model.release(1).ok());
  EXPECT_EQ(model.cache().published, 4u);
  // Six blocks under pressure come from the free queue's head: the two never used, tenant 1's
  // tail (no hash) and its two cached blocks (the least recently used), tenant 2's tail;
  // tenant 2's cached blocks stay.
  ASSERT_TRUE(*model.admit(2, request_of(96, unique, 3), 96));
  EXPECT_EQ(model.cache().evictions, 2u);
  ASSERT_TRUE(model.release(2).ok());
  ASSERT_TRUE(*model.admit(3, second, 33));
  EXPECT_EQ(model.cache().hits, 32u);  // tenant 2 still hits both of its blocks
  ASSERT_TRUE(*model.admit(4, first, 33));
  EXPECT_EQ(model.cache().hits, 32u);  // tenant 1's were evicted
  // Tenant 2's request holds its blocks: a request needing every other block is refused
  // rather than evicting them, and tenant 2 hits them again.
  ASSERT_TRUE(model.release(4).ok());
  EXPECT_FALSE(*model.admit(5, request_of(7 * 16, unique, 3), 7 * 16));
  ASSERT_TRUE(*model.admit(6, second, 33));
  EXPECT_EQ(model.cache().hits, 64u);
}

TEST(SimulatePrefixCache, KvvmHitsMatchTheBaselineWithinAWindowAndSaltsIsolate) {
  const Geometry geometry = *model::builtin_geometry("llama-3-8b");
  ASSERT_EQ(geometry.bytes_per_token(), 128u * 1024);
  HostDriverOptions host;
  host.granule = 2 * kMiB;
  host.populate = false;
  auto driver = make_host_driver(host);
  ASSERT_TRUE(driver.ok()) << driver.status().to_string();
  const LayoutPlan plan = *plan_layout(geometry, Layout::kTokenMajor, 2 * kMiB, 256);
  ArenaModelOptions options;
  options.plan = plan;
  options.budget = 64 * kMiB;
  options.max_slots = 8;
  options.pool_bytes = 0;
  options.prefix_cache = true;
  Result<std::unique_ptr<ArenaModel>> kvvm = ArenaModel::create(**driver, options);
  ASSERT_TRUE(kvvm.ok()) << kvvm.status().to_string();
  EXPECT_EQ((*kvvm)->name(), "kvvm+cache");
  const HandMade trace;
  const std::vector<std::uint64_t> kvvm_hits = replay(**kvvm, trace);
  PagedCacheModel paged(64 * kMiB, kPagedBlockTokens, geometry.bytes_per_token());
  const std::vector<std::uint64_t> paged_hits = replay(paged, trace);
  // Windows are 16 tokens here, as blocks: the same hits, exactly.
  EXPECT_EQ(kvvm_hits, paged_hits);
  EXPECT_EQ(kvvm_hits, (std::vector<std::uint64_t>{0, 32, 32, 48}));
  EXPECT_EQ((*kvvm)->cache().queries, paged.cache().queries);
  EXPECT_GT((*kvvm)->cache().published, 0u);
}

TEST(SimulatePrefixCache, ClosedLoopTurnsArriveAfterThePreviousOneCompleted) {
  // Two turns of one conversation: the second arrives think time after the first completed.
  auto stream = std::make_shared<std::vector<TokenId>>(200, 3);
  Trace trace;
  trace.requests.push_back(request_of(20, stream, 1));
  trace.requests.back().output_tokens = 10;
  trace.requests.push_back(request_of(40, stream, 1));
  trace.requests.back().arrival_s = 1;
  trace.requests.back().output_tokens = 5;
  trace.requests.back().follows = 0;
  trace.requests.back().think_s = 1;
  PagedCacheModel model(100 * 16 * 1024, kPagedBlockTokens, 1024);
  const Result<RunSummary> run = run_schedule(trace, model, SchedulerOptions{0.1, 30, 1024});
  ASSERT_TRUE(run.ok()) << run.status().to_string();
  EXPECT_EQ(run->completed, 2u);
  // Turn 1: admitted at step 0, grows to 30 tokens at step 10 and completes; turn 2 arrives
  // 1 s (10 steps) later, at step 20, and completes 5 steps after: 26 steps in all.
  EXPECT_EQ(run->steps, 26u);
  // Turn 2 hits turn 1's first (30 - 1) / 16 = 1 full block... of 30 written tokens, 1 block.
  EXPECT_EQ(run->cache.hits, 16u);

  // A rejected first turn abandons the rest of its conversation.
  PagedCacheModel tiny(1 * 16 * 1024, kPagedBlockTokens, 1024);
  const Result<RunSummary> rejected = run_schedule(trace, tiny, SchedulerOptions{0.1, 30, 1024});
  ASSERT_TRUE(rejected.ok());
  EXPECT_EQ(rejected->rejected, 1u);
  EXPECT_EQ(rejected->abandoned, 1u);
}

}  // namespace
}  // namespace kvvm::cli
