// A checkpoint's load progress as `kvvm generate` and `kvvm serve` print it (the library
// reports it through WeightOptions::on_progress), as vLLM shows its shards loading: on a
// terminal one line rewritten in place, in a log one line per shard.
#pragma once

#include <chrono>
#include <iosfwd>
#include <string>
#include <string_view>

#include "kit/progress_line.h"
#include "kvvm/model/load_progress.h"

namespace kvvm::cli {

// "loading weights: 2/30 shards, 13 GiB / 130 GiB (10%), 2 GiB/s, 58.5 s left": the shards
// read, the bytes read of the total, the rate so far and the time left at that rate.
std::string load_progress_text(const model::LoadProgress& progress);

// Writes a load's progress on `err` under `command`: on a terminal at each shard's end and at
// most ten times a second between (the line cleared when the printer goes, before the start
// line); in a log one line per shard.
class LoadProgressPrinter {
 public:
  LoadProgressPrinter(std::ostream& err, std::string_view command, bool terminal);
  void operator()(const model::LoadProgress& progress);

 private:
  ProgressLine line_;
  std::string_view command_;  // a literal: "kvvm serve"
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace kvvm::cli
