#include "model/weights/load_tracker.h"

#include <utility>

namespace kvvm::model::detail {

LoadTracker::LoadTracker(const std::vector<WeightTensor>& tensors, LoadProgressCallback callback,
                         std::chrono::steady_clock::time_point started)
    : callback_(std::move(callback)), started_(started) {
  if (!callback_) return;
  std::unordered_set<const TensorView*> seen;
  for (const WeightTensor& t : tensors) {
    for (const TensorView* view : {t.source, t.scale_source}) {
      if (view == nullptr || !seen.insert(view).second) continue;
      left_[view->file] += view->bytes;
      progress_.total_bytes += view->bytes;
    }
  }
  progress_.shards = static_cast<std::uint32_t>(left_.size());
}

void LoadTracker::read(const WeightTensor& tensor) {
  if (!callback_ || progress_.shards == 0) return;
  bool told = false;
  for (const TensorView* view : {tensor.source, tensor.scale_source}) {
    if (count(view)) {
      tell(true);
      told = true;
    }
  }
  if (!told) tell(false);
}

bool LoadTracker::count(const TensorView* view) {
  if (view == nullptr || !read_.insert(view).second) return false;
  progress_.bytes += view->bytes;
  const auto left = left_.find(view->file);
  if (left == left_.end()) return false;  // an empty tensor of a shard already finished
  left->second -= view->bytes;
  if (left->second != 0) return false;
  left_.erase(left);
  return true;
}

void LoadTracker::tell(bool shard_done) {
  if (shard_done) ++progress_.shards_done;
  progress_.shard_done = shard_done;
  progress_.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  callback_(progress_);
}

}  // namespace kvvm::model::detail
