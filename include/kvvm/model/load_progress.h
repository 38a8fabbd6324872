// How far a checkpoint's load has gone, for a progress display. The library reports and the
// caller prints (nothing under src/ writes to a terminal): a 70B checkpoint is 140 GB in dozens
// of shards, minutes of reading that would otherwise pass in silence.
#pragma once

#include <cstdint>
#include <functional>

namespace kvvm::model {

struct LoadProgress {
  std::uint32_t shards_done = 0;  // shards whose every tensor the model reads has been read
  std::uint32_t shards = 0;       // shards holding a tensor the model reads
  std::uint64_t bytes = 0;        // checkpoint bytes read so far, of the tensors the model reads
  std::uint64_t total_bytes = 0;  // of every tensor the model reads
  double seconds = 0;             // since the load began
  bool shard_done = false;        // this call finishes shard number `shards_done`
};

// Called on the loading thread after each tensor is read (hundreds of calls for a 70B model),
// with `bytes` growing to `total_bytes`; the call that finishes a shard says so, the last one
// finishing the last shard. Never called for dummy weights: no file is read.
using LoadProgressCallback = std::function<void(const LoadProgress&)>;

}  // namespace kvvm::model
