// The engine's options and requests checked: zeros filled from the model and the KV space,
// and every refusal naming the option or field, its value and the limit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvvm/engine/engine.h"

namespace kvvm::engine {

// 1, 2, 4, ... up to max_running, which is always a bucket so a full batch replays too.
std::vector<std::uint32_t> default_buckets(std::uint32_t max_running);
// Ascending, each in [1, max_chunks].
Status check_buckets(const std::vector<std::uint32_t>& buckets, std::uint32_t max_chunks);
// Fills the zeros of `o` and checks what was given. `pad`: one slot goes to the decode graphs.
Status resolve_options(const model::Model& model, const KvSpace& kv, bool pad, EngineOptions& o);
// What the prefix cache's keys fold in: the model identity, the KV element type and, for an
// fp8 cache, the model's KV scales.
std::string cache_identity(const model::Model& model, const KvSpace& kv,
                           const EngineOptions& options);

}  // namespace kvvm::engine
