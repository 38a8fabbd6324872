// A long run of `kvvm serve` on the host backend with a KV budget the prefix cache fills within
// the first few hundred requests, so from then on every admission reclaims. The server must
// not slow down as it runs (the CPU time of its last blocks of 1,000 requests against its first),
// its resident memory must stay flat after warm-up, every request must be answered, and once
// drained the KV ledger is back at zero. A reclaim that cost time in proportion to the cache
// (a scan of every entry per victim) made such a server slow down several times over.
//
// 10,000 requests in the release build, in blocks of 1,000 (the cache is full from the first
// block on, so the last five blocks compare a full cache with the first five); 1,000 in blocks
// of 500 under a sanitizer, where the run looks for memory errors and races and its timing says
// nothing (so only the release build compares times). Each request asks for one token and each
// engine step runs one request: what is measured is admission, reclaim and publication, at a step
// cost that does not depend on how the clients' requests happened to batch (with batches, the CPU a
// request cost switched between two levels 45 % apart within one run). 16 clients keep the queue
// full.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/engine_harness.h"
#include "support/sanitizer.h"
#include "support/server_rig.h"
#include "support/test_data.h"

namespace kvvm::server {
namespace {

using nlohmann::json;
using testing::post_json;
using testing::RigOptions;
using testing::ServerRig;
using Clock = std::chrono::steady_clock;

constexpr bool kSanitized = test::kUnderAddressSanitizer || test::kUnderThreadSanitizer;
constexpr int kRequests = kSanitized ? 1000 : 10000;
constexpr int kBlock = kSanitized ? 500 : 1000;
constexpr int kClients = 16;

// CPU seconds this process has spent, all its threads: a block's work, whatever else the
// machine runs (CTest runs another test beside this one).
double cpu_seconds() {
  timespec now{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

// Resident bytes of this process (/proc/self/statm's second field, in pages).
std::uint64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::uint64_t size = 0;
  std::uint64_t resident = 0;
  statm >> size >> resident;
  return resident * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

// Request i's prompt: two numbers drawn from i, so nearly every prompt differs from its
// second token on and publishes windows nobody else has (the demo model's KV is 4 KiB a token,
// one host page: a window per token).
std::string prompt_of(int i) {
  std::uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(i + 1);
  std::string prompt;
  for (int term = 0; term < 2; ++term) {
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ull;
    prompt += (term == 0 ? "" : " + ") + std::to_string(x % 1000);
  }
  return prompt + " =";
}

TEST(ServerSoak, TimeAndMemoryStayFlatAsThePrefixCacheFillsAndReclaims) {
  RigOptions rig_options;
  rig_options.slots = kClients;
  rig_options.engine.max_running = 1;  // one request a step (see the top)
  // 16 MiB: 4,096 windows of 4 KiB, full after ~500 requests of ~8 new tokens each.
  rig_options.budget_bytes = std::uint64_t{16} << 20;
  auto rig = ServerRig::make(test::demo_model_dir(), ServerOptions{}, rig_options);
  ASSERT_NE(rig, nullptr);

  std::atomic<int> next{0};
  std::atomic<int> failed{0};
  std::atomic<int> done{0};
  std::vector<Clock::duration> block_time;
  std::vector<double> block_cpu;
  std::vector<std::uint64_t> block_rss;
  std::string first_failure;
  std::mutex failure_mutex;
  const auto client_loop = [&] {
    auto client = rig->client(std::chrono::seconds(30));
    client.set_keep_alive(true);
    for (int i = next++; i < kRequests; i = next++) {
      const json body = {
          {"model", "test-model"}, {"prompt", prompt_of(i)}, {"max_tokens", 1}, {"temperature", 0}};
      const auto response = post_json(client, "/v1/completions", body.dump());
      if (!response || response->status != 200) {
        if (failed++ == 0) {
          std::lock_guard lock(failure_mutex);
          first_failure = response ? std::to_string(response->status) + " " + response->body
                                   : "no response: " + httplib::to_string(response.error());
        }
      }
      ++done;
    }
  };

  // The main thread samples each block's end: time and resident memory.
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) clients.emplace_back(client_loop);
  Clock::time_point block_start = start;
  double block_cpu_start = cpu_seconds();
  for (int block = 1; block <= kRequests / kBlock; ++block) {
    while (done.load() < block * kBlock) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const Clock::time_point now = Clock::now();
    block_time.push_back(now - block_start);
    const double cpu = cpu_seconds();
    block_cpu.push_back(cpu - block_cpu_start);
    block_cpu_start = cpu;
    block_rss.push_back(resident_bytes());
    block_start = now;
  }
  for (std::thread& client : clients) client.join();

  const auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  std::cout << "soak: " << kRequests << " requests in " << seconds(Clock::now() - start)
            << " s; per " << kBlock << ":";
  for (std::size_t b = 0; b < block_time.size(); ++b) {
    std::cout << " " << seconds(block_time[b]) << " s, " << block_cpu[b] << " CPU s ("
              << (block_rss[b] >> 20) << " MiB)";
  }
  const PrefixCacheStats cache = rig->engine().stats().prefix;
  std::cout << "; prefix cache: " << cache.entries << " entries, " << cache.evictions
            << " evictions" << std::endl;

  EXPECT_EQ(failed.load(), 0) << first_failure;
  // The cache was full and reclaiming for most of the run.
  EXPECT_GT(cache.evictions, static_cast<std::uint64_t>(kRequests));
  // Resident memory after warm-up (the first block) grows by at most 16 MiB: the KV is
  // bounded by the budget, so growth beyond allocator noise is a leak. Not under
  // AddressSanitizer, whose quarantine holds 256 MiB of freed memory back and fills at the
  // pace the run frees (seen: 481 MiB after the first thousand, 614 MiB after the second);
  // its LeakSanitizer reports a leak at exit instead.
  if (!test::kUnderAddressSanitizer) {
    EXPECT_LE(block_rss.back(), block_rss.front() + (std::uint64_t{16} << 20))
        << (block_rss.front() >> 20) << " MiB after the first block, " << (block_rss.back() >> 20)
        << " MiB at the end";
  }
  if (!kSanitized) {
    // The median of the last five blocks against the median of the first five: one block alone
    // took from 5.2 to 6.8 CPU s in one run on an idle machine. CPU time, not wall time, and the
    // test runs alone (tests/CMakeLists.txt): how busy the machine is changes both. The bound
    // is 1.5: the same binary on the idle 2-core machine ran either about 4.4 or about 6.0 CPU s
    // per 1,000 (the 16 clients' and the server's threads sharing two cores settle in one of
    // two modes) and switched between them within a run, both ways; the regression this guards
    // against, a reclaim that scans the cache, made the server several times slower.
    const auto median_of = [](std::vector<double> values) {
      std::sort(values.begin(), values.end());
      return values[values.size() / 2];
    };
    const std::vector<double> first(block_cpu.begin(), block_cpu.begin() + 5);
    const std::vector<double> last(block_cpu.end() - 5, block_cpu.end());
    EXPECT_LE(median_of(last), 1.5 * median_of(first))
        << "the median CPU time of the last five blocks of 1,000 requests against the first five";
  }

  EXPECT_TRUE(rig->shut_down());
  rig->end_engine();
  engine::testing::expect_clean(rig->kv(), "after the soak");
}

}  // namespace
}  // namespace kvvm::server
