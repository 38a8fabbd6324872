// The checks on a safetensors file's bytes, apart from how they were read (mmap in
// safetensors.cc): a test or a fuzzer can hand it any buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/model/safetensors.h"

namespace kvvm::model::detail {

// The header length itself is bounded: real headers are a few hundred KiB at most (one entry
// per tensor), so 100 MB is a corrupt or hostile length.
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

// "BF16" -> kBf16, ...; std::nullopt for a spelling the format does not define.
std::optional<TensorDType> parse_tensor_dtype(std::string_view name);

// Parses and checks the whole file `bytes` (the 8-byte length, the JSON header, the data
// section): every tensor's dtype known, its shape's byte size equal to its range, and its
// range inside the data section without overlapping another. The views point into `bytes`
// and come back sorted by name. Errors start with `origin` and name the tensor.
Result<std::vector<TensorView>> parse_safetensors(const std::byte* bytes, std::uint64_t size,
                                                  const std::string& origin);

}  // namespace kvvm::model::detail
