// LoadTracker: counts a checkpoint's bytes as the loaders read its tensors and tells
// WeightOptions::on_progress (kvvm/model/load_progress.h) how far the load has gone, shard by
// shard. One for both backends, so the CPU and the CUDA loads report alike.
#pragma once

#include <chrono>
#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kvvm/model/load_progress.h"
#include "kvvm/model/safetensors.h"
#include "model/weights/weight_tensors.h"

namespace kvvm::model::detail {

class LoadTracker {
 public:
  // The bytes of every view `tensors` read (each view once: a source, a quantized projection's
  // scales), by shard. `callback` empty, or dummy tensors (no view): nothing is told.
  LoadTracker(const std::vector<WeightTensor>& tensors, LoadProgressCallback callback,
              std::chrono::steady_clock::time_point started);

  // After `tensor` has been read: its views counted, the callback told (once for each shard
  // this finishes, else once).
  void read(const WeightTensor& tensor);

 private:
  // Counts `view` once; true when it finishes its shard.
  bool count(const TensorView* view);
  void tell(bool shard_done);

  LoadProgressCallback callback_;
  std::chrono::steady_clock::time_point started_;
  std::unordered_map<std::uint32_t, std::uint64_t> left_;  // unread bytes of each unfinished shard
  std::unordered_set<const TensorView*> read_;
  LoadProgress progress_;
};

}  // namespace kvvm::model::detail
