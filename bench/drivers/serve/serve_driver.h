// The open-loop driver of `kvvm bench serve`: every request is issued at its arrival time
// whatever the server's progress (a thread per request in flight, started on time), so a
// server past saturation shows its queueing in the latencies instead of slowing the load down.
// The one exception is --concurrency-limit: with a limit, a request waits for a free slot
// before it is issued (a closed bound the user asked for), and its issue lag says so.
//
// Every wait is bounded: issuing stops at the last arrival or at --duration, whichever comes
// first; the requests still in flight then get --timeout seconds more (counted from the end of
// --duration when one is given), and are cancelled (their connections closed) after that.
// Each read or write also gives up after --timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/drivers/serve/serve_client.h"

namespace kvvm::cli {

struct PlannedRequest {
  double arrival_s = 0;  // from the run's start
  std::string body;      // the JSON body
};

struct DriverSettings {
  ClientSettings client;
  std::string path;   // e.g. "/v1/completions"
  bool chat = false;  // the chat endpoint's content rule (bench/drivers/serve/serve_client.h)
  std::optional<double> duration_s;     // stop issuing after this
  double grace_s = 60;                  // in-flight requests' wait once issuing stopped
  std::uint32_t concurrency_limit = 0;  // 0: none (pure open loop)
};

struct IssuedRequest {
  bool sent = false;    // false: not issued (--duration ended first)
  double issued_s = 0;  // from the run's start
  double ended_s = 0;   // when its response ended
  StreamOutcome outcome;
  // Seconds from issue, when the outcome has them.
  std::optional<double> ttft_s, last_token_s;
};

struct DriverRun {
  std::vector<IssuedRequest> requests;  // in the plan's order
  Clock::time_point start;
  double issue_stopped_s = 0;  // when the last request was issued or issuing stopped
  double finished_s = 0;       // when the last in-flight request ended or was cancelled
};

// Runs `plan` (arrivals not decreasing) against the server; see the top of the file.
DriverRun run_open_loop(const std::vector<PlannedRequest>& plan, const DriverSettings& settings);

}  // namespace kvvm::cli
